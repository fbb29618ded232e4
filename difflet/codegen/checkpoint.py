"""Checkpoints: materialize a seeded random diffusers-format directory from the IR, and load components.

Invariants:
- A materialized checkpoint is an ordinary diffusers directory (model_index.json, one subfolder
  per component, tokenizers, scheduler): it is loaded by exactly the code that loads real weights,
  and `diffusers.<Pipeline>.from_pretrained(dir)` loads it.
- The same module configs + seed give the same weights (each component is seeded on its own, so
  component order does not matter).
- `load_component` never returns a model whose config disagrees with the IR's inline config.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from difflet.errors import DiffletError
from difflet.codegen.declarations import declaration
from difflet.codegen.tiny_tokenizers import special_ids, word_level_tokenizer
from difflet.families import FAMILIES, pipeline_class, programs
from difflet.frontend import classes
from difflet.frontend.checkpoint_config import same_value
from difflet.ir.nodes import Attrs, Module, Node, Op, thaw

# Bump when materialize_checkpoint writes something different for the same inputs (store key).
MATERIALIZE_VERSION = 3

def resolve_class(qualified: str, where: Any = None) -> type:
    """`diffusers.<Class>` (or `transformers.<Class>`) -> the class; a clear DiffletError when it is not there."""
    try:
        return classes.resolve_class(qualified)
    except classes.ClassError as err:
        raise DiffletError(f"cannot import class {qualified!r}: {err}", where=where) from None


def _library(qualified: str) -> str:
    return qualified.split(".", 1)[0]


def _scheduler_attrs(module: Module) -> Attrs | None:
    for sched in module.find(Op.SCHEDULE):
        for step in sched.body:
            if "scheduler" in step.attrs:
                return step.attrs["scheduler"]
    return None


def checkpoint_key(module: Module, seed: int) -> str:
    """Hex digest of everything that determines a random checkpoint: classes, configs, tokenizers, scheduler, seed, library versions."""
    import diffusers
    import torch
    import transformers

    parts: list[Any] = [MATERIALIZE_VERSION, seed, torch.__version__, diffusers.__version__, transformers.__version__]
    family = module.attrs.get("family")
    if family in FAMILIES:  # a family's declarations can change what is materialized
        parts.append(hashlib.sha256(Path(programs(family).__file__).read_bytes()).hexdigest())
    for comp in module.components():
        parts.append([comp.name, comp.attrs.get("class"), comp.attrs.get("subfolder"),
                      thaw(comp.attrs.get("config")), thaw(comp.attrs.get("tokenizer"))])
    parts.append(thaw(_scheduler_attrs(module)))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _build_random(comp: Node, seed: int):
    import torch

    if "config" not in comp.attrs:
        raise DiffletError(f"component {comp.name!r} takes its config from the checkpoint; "
                           "random weights need an inline config", where=comp.loc)
    cls = resolve_class(comp.attrs["class"], comp.loc)
    config = comp.attrs["config"].to_python()
    torch.manual_seed(seed)
    build = declaration(comp.attrs["class"]).build_random  # the class's family may build it itself
    if build is not None:
        return build(comp, config)
    if _library(comp.attrs["class"]) == "transformers":
        return cls(cls.config_class(**config))
    return cls.from_config(config)


def materialize_checkpoint(module: Module, seed: int, dest: str | os.PathLike) -> Path:
    """Write a diffusers-format checkpoint of `module`'s components with weights seeded by `seed`.

    Writes into `dest` (created); returns it. Overwrites files that are already there.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {}
    family = module.attrs.get("family")
    written: dict[str, Node] = {}  # subfolder -> the component that wrote it
    for i, comp in enumerate(module.components()):
        sub = comp.attrs.get("subfolder", comp.name)
        cls = comp.attrs["class"]
        if sub in written:  # a second entry of one model (a VAE's encoder beside its decoder)
            first = written[sub]
            if (first.attrs["class"], thaw(first.attrs.get("config"))) != (cls, thaw(comp.attrs.get("config"))):
                raise DiffletError(f"components {first.name!r} and {comp.name!r} both read {sub!r} but "
                                   "declare different classes or configs", where=comp.loc)
            continue
        written[sub] = comp
        model = _build_random(comp, seed * 1000 + i)
        model.save_pretrained(str(dest / sub), safe_serialization=True)
        index[sub] = [_library(cls), cls.rpartition(".")[2]]
        extras = declaration(cls).write_extras  # e.g. a vision encoder's image processor folder
        if extras is not None:
            index.update(extras(comp, comp.attrs["config"].to_python(), dest))
        tok = comp.attrs.get("tokenizer")
        if tok is not None:
            config = comp.attrs["config"].to_python()
            tsub = tok.get("subfolder", "tokenizer")
            write = declaration(cls).write_tokenizer
            if write is not None:
                write(comp, config, tok, dest / tsub)
            else:
                word_level_tokenizer(config["vocab_size"], special_ids(config),
                                      clip_style="CLIP" in cls, max_length=tok["max_length"],
                                      dest=dest / tsub)
            tcls = tok.get("class", "transformers.PreTrainedTokenizerFast")
            index[tsub] = [_library(tcls), tcls.rpartition(".")[2]]
    sched = _scheduler_attrs(module)
    if sched is not None:
        cls = resolve_class(sched["class"])
        cls.from_config(sched["config"].to_python()).save_pretrained(str(dest / "scheduler"))
        index["scheduler"] = [_library(sched["class"]), sched["class"].rpartition(".")[2]]
    pipeline = module.attrs.get("pipeline") or pipeline_class(family)
    import diffusers

    head = {"_class_name": pipeline or "DiffusionPipeline", "_diffusers_version": diffusers.__version__}
    extras = getattr(programs(family), "INDEX_EXTRAS", {}) if family in FAMILIES else {}
    if family in FAMILIES and hasattr(programs(family), "index_config"):  # the pipeline's registered config
        head.update(programs(family).index_config(module))
    for name, entry in extras.items():  # an absent-component entry ([None, None]) never hides a written one
        if entry[0] is not None or name not in index:
            index[name] = entry
    (dest / "model_index.json").write_text(json.dumps({**head, **dict(sorted(index.items()))}, indent=2))
    return dest


def load_component(node: Node, ckpt_dir: str | os.PathLike):
    """`Class.from_pretrained(ckpt_dir, subfolder=...)` in the node's dtype, in eval mode.

    Raises DiffletError naming the path when the subfolder is missing, cannot be loaded, or its
    config disagrees with the IR's inline config on any key the IR states.
    """
    import torch

    path = Path(ckpt_dir) / node.attrs.get("subfolder", node.name)
    if not (path / "config.json").is_file():
        raise DiffletError(f"no checkpoint for component {node.name!r} (missing config.json)", where=path)
    stated = node.attrs.get("config")
    try:
        on_disk = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise DiffletError(f"config.json is not valid JSON: {err}", where=path / "config.json") from None
    if stated is not None:  # before loading weights: a size mismatch would hide the real cause
        _check_config(node, stated, lambda key: on_disk.get(key, _ABSENT), path)
    cls = resolve_class(node.attrs["class"], node.loc)
    dtype = getattr(torch, node.attrs.get("dtype", "float32"))
    kwargs = {"dtype": dtype} if _library(node.attrs["class"]) == "transformers" else {"torch_dtype": dtype}
    try:
        model = cls.from_pretrained(str(Path(ckpt_dir)), subfolder=path.name, **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError) as err:
        raise DiffletError(f"cannot load {node.attrs['class']} for component {node.name!r}: {err}",
                           where=path) from None
    if stated is not None:  # keys config.json leaves to class defaults are checked on the instance
        cfg = model.config
        _check_config(node, stated, lambda key: cfg.get(key, None) if isinstance(cfg, dict)
                      else getattr(cfg, key, None), path)
    return model.eval()


_ABSENT = object()


def _check_config(node: Node, stated: Attrs, lookup, path: Path) -> None:
    for key, want in stated.to_python().items():
        have = lookup(key)
        if have is not _ABSENT and not same_value(have, want):
            raise DiffletError(f"checkpoint config disagrees with the IR for component {node.name!r}: "
                               f"{key} is {have!r} in the checkpoint, {want!r} in the IR (a description "
                               "with `config from checkpoint` takes it: `difflet lower --weights DIR`)",
                               where=path / "config.json")


def resolve_weights(module: Module, spec: str, store_root: str | os.PathLike | None = None) -> Path:
    """`--weights` -> a checkpoint directory: `random:SEED` is materialized once under the store
    (keyed by the module's configs + seed); `hf:ORG/NAME` is the local Hugging Face cache's
    snapshot (offline); anything else must be an existing directory."""
    from difflet.codegen.store import Store
    from difflet.ir.buckets import views

    module = views(module)[0][1]  # a bucketed module's sizes share every checkpoint tensor
    if spec.startswith("random:"):
        try:
            seed = int(spec.split(":", 1)[1])
        except ValueError:
            raise DiffletError(f"--weights random:SEED needs an integer seed, got {spec!r}",
                               where="--weights") from None
        store = Store(store_root)
        path, _ = store.get_or_create("checkpoints", checkpoint_key(module, seed),
                                      lambda tmp: materialize_checkpoint(module, seed, tmp),
                                      directory=True)
        return path
    if spec.startswith("hf:"):
        from difflet.frontend.hub import hub_snapshot

        return hub_snapshot(spec)
    path = Path(spec)
    if not (path / "model_index.json").is_file() and not path.is_dir():
        raise DiffletError("weights directory does not exist (expected a diffusers-format "
                           "checkpoint or random:SEED)", where=path)
    return path
