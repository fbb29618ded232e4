"""LoRA adapters as new weight values for the same programs: read once, merged on switch, never compiled.

An adapter file is read the way diffusers reads it: the family's pipeline class (the registry's
`pipeline_class`) converts it (`lora_state_dict`: diffusers/PEFT, kohya and the FLUX community
formats), and the component's own `load_lora_adapter` builds PEFT's LoRA layers, on a model of the
component's config on the meta device, so only the adapter's factors are ever in memory. The deltas
are PEFT's (`LoraLayer.get_delta_weight`: rank, alpha, rank/alpha patterns, rsLoRA).

Invariants:
- A program's weights change only through its loaded runner's `replace_weights` (a partial constant
  update, codegen/inductor.py); the cache key, the program files and the compile count never change.
- Memory: the adapters' factors only. A switch overwrites each adapted weight in place with its
  merge, one weight at a time, from the checkpoint value the weights file holds (page-cached).
- Weights served under adapter A at scale s are exactly `cast(base.float() + s * delta_A)`, made
  from the base weights each time (never by adding to the last merge), so switching is exact.
- A file that does not convert, carries keys of a component no adapter can reach here (text
  encoders), or names a layer the component lacks is refused at load, naming the file and the
  first bad key.
"""
from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node
from difflet.runtime.validate import ADAPTER_NAME


@dataclass
class Adapter:
    """One adapter: component name -> {the component's weight FQN -> its PEFT LoRA layer}; only the
    low-rank factors are held, a dense delta exists only while a switch merges it."""

    name: str
    path: Path
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_scale: float = 1.0

    def delta(self, component: str, key: str) -> torch.Tensor | None:
        """The float32 delta of weight `key` (PEFT's `get_delta_weight`), None if not adapted."""
        layer = self.layers.get(component, {}).get(key)
        if layer is None:
            return None
        with torch.no_grad():
            return layer.get_delta_weight("difflet").float()

    @property
    def nbytes(self) -> int:
        """Bytes of the adapter's factors (what loading it costs)."""
        return sum(p.numel() * p.element_size() for layers in self.layers.values() for layer in layers.values()
                   for d in (layer.lora_A, layer.lora_B) for p in d["difflet"].parameters())


def _pipeline_class(module: Module):
    import diffusers

    from difflet.families import pipeline_class

    name = module.attrs.get("pipeline") or pipeline_class(str(module.attrs.get("family", "")))
    cls = getattr(diffusers, name or "", None)
    if cls is None or not hasattr(cls, "lora_state_dict"):
        raise DiffletError(f"the {module.attrs.get('family')!r} family's pipeline ({name}) has no LoRA loader in "
                           "diffusers", where="--lora")
    return cls


def _read_state_dict(cls, path: Path):
    """(state dict, network alphas, metadata) as `cls.load_lora_weights` reads them."""
    params = inspect.signature(cls.lora_state_dict).parameters
    kwargs = {"return_lora_metadata": True}
    if "return_alphas" in params:
        kwargs["return_alphas"] = True
    try:
        out = cls.lora_state_dict(str(path), **kwargs)
    except Exception as err:  # diffusers raises ValueError/KeyError/OSError/SafetensorError for bad files
        raise DiffletError(f"not a LoRA file diffusers' {cls.__name__} reads: {_first_line(err)}",
                           where=path) from None
    state_dict, alphas, metadata = out if len(out) == 3 else (out[0], None, out[1])
    return state_dict, alphas, metadata


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _component_of(module: Module, prefix: str) -> Node | None:
    """The component loaded from checkpoint folder `prefix` (diffusers' LoRA key prefix)."""
    return next((c for c in module.components() if c.attrs.get("subfolder", c.name) == prefix), None)


def _meta_model(node: Node):
    from difflet.codegen.checkpoint import resolve_class

    cls = resolve_class(str(node.attrs["class"]), node.loc)
    with torch.device("meta"):
        return cls.from_config(node.attrs["config"].to_python())


def _layers(node: Node, state_dict: dict, alphas, metadata, prefix: str, path: Path) -> dict[str, Any]:
    """PEFT's LoRA layer of every weight the adapter holds for component `node` (keys: weight FQNs),
    its factors loaded on the host."""
    from diffusers.utils import convert_unet_state_dict_to_peft
    from peft import set_peft_model_state_dict
    from peft.tuners.lora import LoraLayer

    model = _meta_model(node)
    if not hasattr(model, "load_lora_adapter"):
        raise DiffletError(f"{node.attrs['class']} takes no LoRA adapter in diffusers", where=path)
    try:  # builds PEFT's layers (the config: ranks, alphas, patterns) on the meta model
        with warnings.catch_warnings():  # PEFT warns of config/keys mismatches; the keys are checked below
            warnings.simplefilter("ignore")
            model.load_lora_adapter(state_dict, network_alphas=alphas, metadata=metadata, prefix=prefix,
                                    adapter_name="difflet", low_cpu_mem_usage=True)
    except Exception as err:
        raise DiffletError(f"{node.name}: the adapter does not fit the model: {_first_line(err)}", where=path) from None
    layers = {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer) and "difflet" in m.lora_A}
    for name, layer in layers.items():
        if not isinstance(layer.get_base_layer(), torch.nn.Linear) or layer.use_dora.get("difflet"):
            raise DiffletError(f"{name}: only LoRA on linear layers is served (not DoRA or convolutions)", where=path)
        for factor in (layer.lora_A["difflet"], layer.lora_B["difflet"]):
            factor.to_empty(device="cpu")
            for p in factor.parameters():  # a targeted layer the file holds no factors of adds 0, as in PEFT
                torch.nn.init.zeros_(p)
    # the factors' values, keyed as diffusers' load_lora_adapter keys them for PEFT
    own = {k.removeprefix(f"{prefix}."): v for k, v in state_dict.items() if k.startswith(f"{prefix}.")}
    if own and "lora_A" not in next(iter(own)):
        own = convert_unet_state_dict_to_peft(own)
    result = set_peft_model_state_dict(model, own, "difflet")
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "difflet" in k or "lora" in k]
    if unexpected:
        raise DiffletError(f"key {prefix}.{unexpected[0]} matches no layer of {node.name}", where=path)
    return {f"{name}.weight": layer for name, layer in layers.items()}


def read_adapter(name: str, path: str | os.PathLike, module: Module, scale: float = 1.0) -> Adapter:
    """The adapter file at `path` for `module`'s components (see module invariants)."""
    if not ADAPTER_NAME.match(name):
        raise DiffletError(f"adapter name {name!r}: use 1-64 letters, digits, '_', '-' or '.'", where="--lora")
    path = Path(path)
    if not path.exists():
        raise DiffletError("LoRA file does not exist", where=path)
    cls = _pipeline_class(module)
    state_dict, alphas, metadata = _read_state_dict(cls, path)
    if not state_dict:
        raise DiffletError("the file holds no LoRA weights", where=path)
    prefixes = sorted({k.split(".", 1)[0] for k in state_dict})
    adapter = Adapter(name, path, default_scale=float(scale))
    for prefix in prefixes:
        node = _component_of(module, prefix)
        first = next(k for k in state_dict if k.startswith(f"{prefix}."))
        if node is None or node.attrs.get("role") != "denoiser":
            what = "a text encoder's" if node is not None else "no served component's"
            raise DiffletError(f"key {first} is {what} weight; only the denoiser's LoRA layers are served",
                               where=path)
        adapter.layers[node.name] = _layers(node, state_dict, alphas, metadata, prefix, path)
        if not adapter.layers[node.name]:
            raise DiffletError(f"key {first} converts to no LoRA layer of {node.name}", where=path)
    return adapter


class _EagerWeights:
    """An uncompiled program module's parameters under the compiled runners' weight interface
    (the checkpoint values of the weights an adapter may touch are copied once: no file holds them)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._base: dict[str, torch.Tensor] = {}

    def weight_names(self) -> list[str]:
        return list(self.module.state_dict(keep_vars=True))

    def read_base(self, name: str) -> torch.Tensor:
        if name not in self._base:
            self._base[name] = self.module.state_dict()[name].clone()
        return self._base[name]

    def replace_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        state = self.module.state_dict()
        with torch.no_grad():
            for k, v in tensors.items():
                state[k].copy_(v)


def _weight_holders(program) -> list:
    """What holds `program`'s weights: its compiled runner(s), or its module when eager; a program
    whose weights live elsewhere (rank workers, a device runtime) is refused."""
    from difflet.codegen.branches import BranchRunner

    runner = getattr(program, "_runner", program)
    if isinstance(runner, BranchRunner):
        return [h for r in runner.runners.values() for h in _weight_holders(r)]
    if hasattr(runner, "replace_weights"):
        return [runner]
    if isinstance(runner, torch.nn.Module):
        return [_EagerWeights(runner)]
    raise DiffletError(f"program {getattr(program, 'name', '?')!r} ({type(runner).__name__}) cannot take LoRA weights: "
                       "adapters are served on unsplit programs of the inductor backend (split, cfg2, "
                       "block-mode and neuron programs: not built yet)", where="--lora")


def _fqns(names: list[str], keys: list[str], partial: bool) -> dict[str, str] | None:
    """Component weight key -> program constant FQN under the one prefix that maps every key (the
    keys present under the first prefix that maps any, when `partial`: a probe holds a few blocks)."""
    have = set(names)
    for key in keys[:1] if not partial else keys:
        for name in names:
            if name == key or name.endswith("." + key):
                prefix = name[: len(name) - len(key)]
                found = {k: prefix + k for k in keys if prefix + k in have}
                if partial or len(found) == len(keys):
                    return found
    return {} if partial else None


@dataclass
class _Target:
    component: str
    holder: object
    fqn: dict[str, str]  # component weight key -> program constant FQN


class LoraSwitch:
    """The adapters a runner serves and the one it serves now: `serving(lora)` holds a request's
    adapter (`NAME:SCALE`, "" = base) while it runs; requests of another adapter wait, so
    requests with different adapters never share a batched call and weights never change under
    a running request."""

    def __init__(self, adapters: list[Adapter], programs: list[tuple[str, object]],
                 probe: tuple[str, object] | None = None) -> None:
        """`programs`: (component name, program) of every loaded program that may hold its weights;
        `probe`: (its denoiser's name, the step-cache probe), which holds some of them."""
        import threading

        self.adapters = {a.name: a for a in adapters}
        self._targets: list[_Target] = []
        for comp in sorted({c for a in adapters for c in a.layers}):
            keys = sorted({k for a in adapters for k in a.layers.get(comp, {})})
            owned = [(p, False) for n, p in programs if n == comp]
            owned += [(probe[1].program, True)] if probe is not None and probe[0] == comp else []
            for program, partial in owned:
                for holder in _weight_holders(program):
                    fqn = _fqns(holder.weight_names(), keys, partial)
                    if fqn is None:
                        raise DiffletError(f"the adapters' layer {keys[0]} is not a weight of the compiled "
                                           f"{comp!r} program", where="--lora")
                    if fqn:
                        for name in fqn.values():  # the eager holder copies the checkpoint values now
                            holder.read_base(name)
                        self._targets.append(_Target(comp, holder, fqn))
        self.current = ""
        self._running = 0
        self._cond = threading.Condition()

    def _apply(self, lora: str) -> None:
        name, _, scale = lora.partition(":")
        adapter = self.adapters.get(name)
        for t in self._targets:
            for key, fqn in t.fqn.items():  # one weight at a time: the peak is one weight's float32 copy
                base = t.holder.read_base(fqn)
                delta = adapter.delta(t.component, key) if adapter is not None else None
                merged = base if delta is None else (base.float() + float(scale) * delta).to(base.dtype)
                t.holder.replace_weights({fqn: merged.contiguous()})
        self.current = lora

    def restore(self) -> None:
        """The base weights back in every program, once no request runs."""
        with self._cond:
            while self._running:
                self._cond.wait()
            self._apply("")

    def serving(self, lora: str):
        """Context manager: the programs serve `lora` until it exits (see the class docstring)."""
        import contextlib

        @contextlib.contextmanager
        def hold():
            with self._cond:
                while self._running and self.current != lora:
                    self._cond.wait()
                if self.current != lora:
                    self._apply(lora)
                self._running += 1
            try:
                yield
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

        return hold()

