"""The `inductor` backend: torch.export + AOTInductor packages without weights inside.

Invariants:
- A store entry (one directory per cache key) holds `program.pt2` (compiled with
  `aot_inductor.package_constants_in_so=False`, so it contains no weights: the cache key excludes
  weights and one program serves every checkpoint of the same config) and `constants.safetensors`
  (graph-made tensor constants that are part of the program, not of any checkpoint).
- A program's weights are exactly its constant FQNs (`get_constant_fqns()`); loading checks the
  update is full, so a program never runs with a missing weight.
- A program is compiled for one torch device (the target's: cpu or cuda) and bound to its
  constants on that device, user-managed: the program reads the very tensors the loader keeps,
  one copy of each weight (on CPU the file's own; on a device the one copy made there). The host
  stays on the CPU: a device program's runner moves its inputs there and its outputs back.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from difflet.codegen.build import example_inputs
from difflet.codegen.program_module import ProgramModule
from difflet.errors import DiffletError
from difflet.ir.nodes import Node

PROGRAM_FILE = "program.pt2"
CONSTANTS_FILE = "constants.safetensors"
FQNS_FILE = "constants.json"
# always_keep_tensor_constants: inductor otherwise inlines small tensors (a VAE's 3-element conv_out
# bias, 0-d tensors) into the generated code, so a program would carry one checkpoint's values
# emulate_precision_casts: keep eager's rounding to bf16/fp16 between fused ops (inductor otherwise
# drops each downcast-upcast pair); measured on the real-size Wan 1.3B transformer program against
# diffusers eager: cos 0.99985 without, 0.999989 with (SDPA math vs fused kernel: 0.999989), same speed
INDUCTOR_CONFIGS = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True,
                    "emulate_precision_casts": True}


def module_tensors(pm: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by FQN, tied ones under each of their names."""
    named = dict(pm.named_parameters(remove_duplicate=False))
    named.update(pm.named_buffers(remove_duplicate=False))
    return {k: v.detach() for k, v in named.items()}


def export_program(node: Node, pm: torch.nn.Module, inputs: tuple | None = None) -> torch.export.ExportedProgram:
    """The exported graph codegen compiles (also what `difflet check` inspects)."""
    with torch.no_grad():
        return torch.export.export(pm, example_inputs(node) if inputs is None else inputs, strict=False)


def aoti_package(ep: torch.export.ExportedProgram, package: Path) -> None:
    """AOT-compile `ep` into the package file `package`, building in a private directory.

    `aoti_compile_and_package` builds in inductor's shared cache directory under a key of the
    generated code and zips those files after releasing its lock: two processes compiling the
    same code (the ranks of one TP layout) overwrite each other's files while one zips them.
    """
    import tempfile

    from torch._inductor.package import package_aoti

    args, kwargs = ep.example_inputs
    with tempfile.TemporaryDirectory(prefix="difflet-aoti-") as build:
        options = {**INDUCTOR_CONFIGS, "aot_inductor.package": True, "aot_inductor.output_path": build}
        files = torch._inductor.aot_compile(ep.module(check_guards=False), args, kwargs, options=options)
        package_aoti(str(package), files)


def require_device(device: str) -> None:
    """DiffletError unless this process can compile and run programs on `device`."""
    if device == "cuda" and not torch.cuda.is_available():
        raise DiffletError(f"the target's device is cuda, and torch {torch.__version__} sees no CUDA device "
                           "here (torch.cuda.is_available() is False)", where="target")


def _module_device(pm: torch.nn.Module) -> torch.device:
    first = next(iter(module_tensors(pm).values()), None)
    return first.device if first is not None else torch.device("cpu")


def compile_entry(node: Node, pm: ProgramModule, dest: Path, device: str = "cpu") -> None:
    """Export and AOT-compile `pm` for `device` into the store entry directory `dest` (see module
    invariants). A module elsewhere is moved to `device` to be traced and moved back after."""
    from safetensors.torch import save_file
    from torch._inductor.package import load_package

    home = _module_device(pm)
    moved = home.type != torch.device(device).type
    try:
        if moved:
            pm.to(device)
        ep = export_program(node, pm, tuple(t.to(device) for t in example_inputs(node)))
        aoti_package(ep, dest / PROGRAM_FILE)
    finally:
        if moved:
            pm.to(home)
    fqns = list(load_package(str(dest / PROGRAM_FILE)).get_constant_fqns())
    known = module_tensors(pm)
    graph_made = {k: v.detach().cpu().contiguous().clone() for k, v in ep.constants.items()
                  if k in fqns and k not in known and isinstance(v, torch.Tensor)}
    missing = [k for k in fqns if k not in known and k not in graph_made]
    if missing:
        raise DiffletError(f"compiled program of {node.name!r} needs constants the module does not have: "
                           f"{missing[:5]}", where=node.loc)
    save_file(graph_made, str(dest / CONSTANTS_FILE))
    (dest / FQNS_FILE).write_text(json.dumps(fqns))


def program_weights(pm: ProgramModule, entry: Path) -> dict[str, torch.Tensor]:
    """The constants the entry's program loads, taken from `pm` (the checkpoint) and the entry."""
    from safetensors.torch import load_file

    fqns = json.loads((entry / FQNS_FILE).read_text())
    known = module_tensors(pm)
    graph_made = load_file(str(entry / CONSTANTS_FILE))
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k in fqns:
        t = known[k] if k in known else graph_made[k]
        # safetensors refuses shared storage: tied weights are written once per name.
        ptr = t.untyped_storage().data_ptr() if t.numel() else -1
        out[k] = t.contiguous().clone() if ptr in seen else t.contiguous()
        seen.add(ptr)
    return out


def load_program_weights(weights_path: Path, fqns: list[str]) -> dict:
    """The constants a compiled program needs, read from its safetensors file.

    Raises DiffletError naming the file when it is unreadable or lacks one of `fqns`.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = load_file(str(weights_path))
    except (SafetensorError, OSError) as err:
        raise DiffletError(f"cannot read weights: {err}", where=weights_path) from None
    missing = sorted(set(fqns) - set(weights))
    if missing:
        raise DiffletError(f"weights lack {len(missing)} constants the program needs, e.g. {missing[:3]}",
                           where=weights_path)
    return {k: weights[k] for k in fqns}


def program_constants(fqns: list[str], weights_path: Path, constants_path: Path | None = None,
                      shared: dict | None = None) -> dict:
    """The tensors a program's constants `fqns` take: from its weights file, or (with
    `constants_path`, a program sharing its weights file) from `shared`'s one load of that file
    (path -> tensors) and its own graph-made constants."""
    if constants_path is None:
        return load_program_weights(weights_path, fqns)
    from safetensors.torch import load_file

    cache = shared if shared is not None else {}
    if weights_path not in cache:
        cache[weights_path] = load_file(str(weights_path))
    own = load_program_weights(constants_path, [k for k in fqns if k not in cache[weights_path]])
    return {k: cache[weights_path][k] if k in cache[weights_path] else own[k] for k in fqns}


def program_device(metadata: dict) -> torch.device:
    """The device a loaded package's program runs on (AOTInductor records it when compiling)."""
    return torch.device(metadata.get("AOTI_DEVICE_KEY", "cpu"))


def attach_constants(load, metadata: dict, constants: dict) -> dict:
    """Bind a program to its full constants through `load(constants, user_managed)`, user-managed:
    the program points at the returned tensors (`constants` itself on CPU; each tensor not yet on
    the program's device copied there once), which must live as long as the program. No torch
    loader copy on any device (`allow_h2d_copy`, which would copy, is also absent in torch 2.11)."""
    device = program_device(metadata)
    placed = {k: v if v.device.type == device.type else v.to(device) for k, v in constants.items()}
    load(placed, True)
    return placed


class CompiledRunner:
    """A loaded AOTInductor package with its weights: `runner(*tensors) -> tuple[Tensor, ...]`.

    A bucket program (`constants_path` given) takes its checkpoint tensors from `shared`, a
    path -> tensors cache that every size of the component shares. The program keeps pointers to
    the loaded tensors (user-managed constants), so each weight is in memory once, at load too (on
    a device: once there). A device program is called with host tensors and returns host tensors.
    """

    def __init__(self, program_path: Path, weights_path: Path, constants_path: Path | None = None,
                 shared: dict | None = None) -> None:
        from torch._inductor.package import load_package

        self._weights_path = weights_path

        try:
            self._model = load_package(str(program_path))
        except Exception as err:  # the loader raises bare RuntimeErrors from C++
            raise DiffletError(f"cannot load compiled program: {err}", where=program_path) from None
        self._constants = program_constants(list(self._model.get_constant_fqns()), weights_path,
                                            constants_path, shared)
        metadata = self._model.get_metadata()
        self._device = program_device(metadata)
        self._constants = attach_constants(
            lambda c, user_managed: self._model.load_constants(c, check_full_update=True, user_managed=user_managed),
            metadata, self._constants)

    def weight_names(self) -> list[str]:
        return list(self._model.get_constant_fqns())

    def read_base(self, name: str) -> torch.Tensor:
        """Constant `name`'s value as the weights file holds it (the checkpoint's, never a replacement)."""
        from safetensors import safe_open

        with safe_open(str(self._weights_path), framework="pt") as f:
            return f.get_tensor(name)

    def replace_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """New values (same shapes and dtypes) for constants `tensors`; the program is unchanged
        (LoRA: difflet/runtime/lora.py). The program reads the bound tensors themselves
        (user-managed), so they are overwritten in place: no second copy of any weight."""
        for k, v in tensors.items():
            self._constants[k].copy_(v)

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._device.type != "cpu":  # the host's tensors in, the host's tensors out
            out = self._model(*(t.to(self._device, non_blocking=True) for t in tensors))
            out = out if isinstance(out, (list, tuple)) else (out,)
            return tuple(t.cpu() for t in out)
        out = self._model(*tensors)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)
