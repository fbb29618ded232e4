"""The memory model's weight figures (difflet/passes/memory.py, the per-rank estimate the planner
judges legality by) against what the loaded programs actually hold.

Oracle: the tensors each loaded program points at (the inductor runner keeps the constants it
loaded alive, user-managed: on CPU they are the program's weights, in memory once), summed over
distinct storages, split by the diffusers/transformers class's own `named_parameters()` (built
from the same checkpoint, outside Difflet) into parameters and the rest (buffers such as position
ids, RoPE tables). The estimate counts parameters only, of the whole class, so per component:

- held parameters <= estimate: a program cannot hold a parameter its class does not have;
- estimate <= FACTOR x held parameters. The factor is what the class has and the program never
  reads: the denoiser's last block's text-stream output (Qwen-Image: dead after the last block,
  11% of the tiny model, 1/60 of a block's text half at real size), hence 1.15; for encoders and
  decoders the whole class is counted while codegen compiles one entry point: a VAE's encoder
  beside the decode program (held 0.53-0.75 of the estimate on the tiny models), Qwen2.5-VL's
  vision tower and lm_head beside its text model (0.43), Gemma 3's vision tower (0.75), hence 2.5.
- what the programs hold beyond parameters is a buffer of the class or a table Difflet's wrapper
  precomputes (`difflet_*`): the only memory the estimate leaves out (tiny Wan: its 1024-position
  RoPE tables are 46% of the denoiser; at real size they are 1 MiB beside 14.3 B parameters).
The split (tp2) case checks the per-rank formula (blocks' linears / tp + the rest replicated) on
each rank's program. A fresh process's RSS growth is checked against the whole per-core estimate
(weights, activations and the runtime reserve, which covers the loaded program code: ~90 MB).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from oracle_util import compile_art, planned_tiny, random_checkpoint

REPO = Path(__file__).resolve().parent.parent
FAMILIES = ("flux-tiny", "qwen-image-tiny", "wan2.1-tiny", "hunyuan-video-tiny", "ltx2-tiny")
FACTOR = {"denoiser": 1.15, "encoder": 2.5, "decoder": 2.5}


def _estimate(module) -> dict[str, int]:
    """component -> the planner's weight bytes per core (cpu target, as the tests plan)."""
    from difflet.passes import memory
    from difflet.passes.targets import load_target

    return {c: n for c, what, n in memory.estimate(module, load_target("cpu")).items if what.startswith("weights")}


def _named(name: str, names: set[str]) -> bool:
    """Whether a program constant is one of `names` of the class: the wrapper holds the class (or
    the submodule it runs) under its own prefix, so the dotted paths agree on their tail."""
    return any(n == name or n.endswith("." + name) or name.endswith("." + n) for n in names)


def _held(constants: dict, params: set[str]) -> tuple[int, int, list[str]]:
    """(parameter bytes, other bytes, other names) of one program's constants, by distinct storage
    (a tied weight is one storage under two names: a parameter if either name is one)."""
    seen: dict[int, list] = {}
    for name, t in constants.items():
        storage = t.untyped_storage()
        entry = seen.setdefault(storage.data_ptr(), [storage.nbytes(), False, name])
        entry[1] = entry[1] or _named(name, params)
    param = sum(n for n, p, _ in seen.values() if p)
    return param, sum(n for n, p, _ in seen.values() if not p), sorted(name for _, p, name in seen.values() if not p)


def _class(comp, ckpt) -> tuple[set[str], set[str], dict[str, tuple]]:
    """(parameter names, buffer names, parameter shapes) of the component's diffusers/transformers
    class, loaded from the checkpoint (tied weights under every name)."""
    from difflet.codegen.checkpoint import load_component

    model = load_component(comp, ckpt)
    params = dict(model.named_parameters(remove_duplicate=False))
    return set(params), {n for n, _ in model.named_buffers(remove_duplicate=False)}, \
        {n: tuple(p.shape) for n, p in params.items()}


def _check(what: str, comp, est: int, held: int, other: list[str], buffers: set[str], allowance: int = 0) -> None:
    factor = FACTOR[comp.attrs["role"]]
    print(f"{what} {comp.name}: estimate {est} B, held parameters {held} B ({held / est:.2f}), "
          f"not in the estimate: {other}")
    assert held <= est + allowance, f"{what} {comp.name}: holds {held} B of parameters, the estimate counts {est}"
    assert est <= factor * held, f"{what} {comp.name}: estimate {est} B > {factor} x held {held} B"
    unknown = [n for n in other if not _named(n, buffers) and "difflet_" not in n]
    assert not unknown, f"{what} {comp.name}: holds tensors that are neither parameters nor buffers: {unknown}"


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    module = planned_tiny(REPO / "models" / f"{request.param}.dsl")
    ckpt = random_checkpoint(module)
    return request.param, module, ckpt, compile_art(module, ckpt, tmp_path_factory.mktemp(request.param))


def test_weights_estimate_bounds_what_each_loaded_program_holds(tiny):
    from difflet.codegen.artifacts import load_artifacts

    name, module, ckpt, art = tiny
    est, loaded = _estimate(module), load_artifacts(art)
    assert sorted(loaded.programs) == sorted(est)
    for comp in module.components():
        params, buffers, _ = _class(comp, ckpt)
        held, _, other = _held(loaded.programs[comp.name]._runner._constants, params)
        _check(name, comp, est[comp.name], held, other, buffers)


@pytest.mark.slow  # compiles flux-tiny's transformer as two tp2 rank programs (once, into the store)
def test_tp2_weights_estimate_per_rank(tmp_path):
    from difflet.codegen.backends import load_runner
    from difflet.codegen.manifest import read_manifest
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(REPO / "models" / "flux-tiny.dsl")), parallel="tp2", target="cpu",
                      backend="inductor")
    ckpt = random_checkpoint(module)
    art = compile_art(module, ckpt, tmp_path / "art")
    est, manifest = _estimate(module), read_manifest(art)
    comp = module.component("transformer")
    entry = manifest.components["transformer"]
    assert entry.world == 2 and len(entry.ranks) == 2
    params, buffers, shapes = _class(comp, ckpt)
    whole = sum(math.prod(s) for s in shapes.values()) * 4  # float32, tied weights absent here
    for rank, files in enumerate(entry.ranks):
        constants = load_runner(manifest.backend, art / files.program.path, art / files.weights.path)._constants
        held, _, other = _held(constants, params)
        # The estimate divides every block linear by tp, biases included, but a row-parallel
        # linear's bias is replicated (added once, after the all-reduce): each rank holds half of
        # those biases more (flux-tiny: 384 B; FLUX at real size about 0.35 MB per core).
        full_biases = sum(t.numel() * t.element_size() for n, t in constants.items()
                          if n.endswith(".bias") and "blocks." in n
                          and tuple(t.shape) == shapes.get(n.removeprefix("model.")))
        _check(f"flux-tiny tp2 rank {rank}", comp, est["transformer"], held, other, buffers,
               allowance=full_biases // 2)
        assert held < 0.75 * whole  # the rank holds its shard: about half the blocks' linears


_RSS = """
import json, sys
import psutil, torch
from difflet.codegen.artifacts import load_artifacts
proc = psutil.Process()
before = proc.memory_info().rss
art = load_artifacts(sys.argv[1])
print(json.dumps({"growth": proc.memory_info().rss - before}))
"""


@pytest.mark.slow  # one fresh interpreter per family
def test_model_process_rss_growth_is_within_the_whole_estimate(tiny):
    from difflet.passes import memory
    from difflet.passes.targets import load_target

    name, module, _, art = tiny
    out = subprocess.run([sys.executable, "-c", _RSS, str(art)], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    growth = json.loads(out.stdout.strip().splitlines()[-1])["growth"]
    est = memory.estimate(module, load_target("cpu"))
    weights = sum(_estimate(module).values())
    print(f"{name}: RSS growth at load {growth / 2**20:.1f} MiB, estimate {est.total / 2**20:.1f} MiB "
          f"(weights {weights / 2**20:.2f} MiB)")
    assert weights < growth <= est.total
