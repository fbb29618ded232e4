"""Resolving the DSL's diffusers/transformers class names and counting parameters on meta.

Invariants:
- torch/diffusers/transformers are imported lazily, only when a name is resolved or counted.
- Counting instantiates the class on the meta device: no weights, no memory, a few seconds for
  the largest models; results are cached per (class, config) for the life of the process.
- "Repeated blocks" are top-most `nn.ModuleList`s named `block`/`blocks`/`layers`/`*_blocks`/
  `*_layers` whose children share one class and hold nn.Linear modules; tensor parallelism
  splits the linears inside them and replicates everything else.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, NamedTuple

from difflet.ir.nodes import Attrs

ROOTS = ("diffusers", "transformers")


class ClassError(Exception):
    """A class name that does not resolve; lowering turns it into a located DiffletError."""


class ParamCounts(NamedTuple):
    params: int
    params_blocks_linear: int
    num_blocks: int


def resolve_class(qualname: str) -> type:
    """`diffusers.X` / `transformers.X` (or a deeper module path) -> the class object."""
    root, _, rest = qualname.partition(".")
    if root not in ROOTS:
        raise ClassError(f"unknown class {qualname!r}: classes must be diffusers.X or transformers.X")
    module_name, _, attr = qualname.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ClassError(f"unknown class {qualname!r}: no module {module_name!r}") from None
    try:
        found = getattr(module, attr)
    except Exception:  # lazy modules raise AttributeError, RuntimeError or ImportError
        raise ClassError(f"unknown class {qualname!r}: {module_name} has no attribute {attr!r}") from None
    if not isinstance(found, type):
        raise ClassError(f"{qualname!r} is not a class")
    return found


def _is_diffusers_model(cls: type) -> bool:
    return hasattr(cls, "from_config") and hasattr(cls, "config_name")


def config_keys(cls: type) -> frozenset[str] | None:
    """The config parameters `cls` accepts, or None when it accepts any key.

    diffusers' from_config silently drops keys that are not __init__ parameters, so those are
    checked; transformers configs keep every keyword as an attribute, so any key is accepted.
    """
    import inspect

    if not _is_diffusers_model(cls):
        return None
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params) - {"self"}


def _instantiate_meta(cls: type, config: dict[str, Any]):
    import torch

    with torch.device("meta"):
        if _is_diffusers_model(cls):
            return cls.from_config(config)
        config_class = getattr(cls, "config_class", None)
        if config_class is None:
            raise ClassError(f"{cls.__module__}.{cls.__name__} is neither a diffusers model "
                             "nor a transformers model")
        return cls(config_class(**config))


def _is_block_list_name(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("block", "blocks", "layers") or leaf.endswith(("_blocks", "_layers"))


def _count(module) -> ParamCounts:
    import torch.nn as nn

    total = sum(p.numel() for p in module.parameters())
    linear, blocks = 0, 0
    taken: list[str] = []
    for name, sub in module.named_modules():
        if not isinstance(sub, nn.ModuleList) or not _is_block_list_name(name) or len(sub) == 0:
            continue
        if any(name.startswith(t + ".") for t in taken):
            continue  # nested list inside an already-counted block list
        if len({type(b) for b in sub}) != 1:
            continue
        in_list = sum(m.weight.numel() + (m.bias.numel() if m.bias is not None else 0)
                      for m in sub.modules() if isinstance(m, nn.Linear))
        if in_list == 0:
            continue
        taken.append(name)
        linear += in_list
        blocks += len(sub)
    return ParamCounts(total, linear, blocks)


@functools.lru_cache(maxsize=None)
def count_params(qualname: str, config: Attrs) -> ParamCounts:
    """Parameter counts of `qualname` built from `config` on the meta device (cached)."""
    cls = resolve_class(qualname)
    try:
        model = _instantiate_meta(cls, config.to_python())
    except ClassError:
        raise
    except Exception as err:  # the class rejected this config: report it, located by the caller
        raise ClassError(f"cannot build {qualname} from this config: {type(err).__name__}: {err}") from None
    return _count(model)
