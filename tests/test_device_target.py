"""Programs for a CUDA device (`--target cuda`): the cache key, the planner's verdict, codegen's
refusal on a machine without one, and the loader binding constants on the program's device.

Oracles: the CPU plan of the same description (its keys and key inputs, which the device part
must leave alone), torch's own report of each tensor's device and identity, and the error texts.
No CUDA device here: compiling and serving on one is bench/device_check.sh's check.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from difflet.codegen.inductor import attach_constants
from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.passes import built
from difflet.passes.backend_facts import BACKENDS
from difflet.passes.cache_key import explain
from difflet.passes.pipeline import optimize

REPO = Path(__file__).resolve().parent.parent
FLUX = str(REPO / "models" / "flux-tiny.dsl")
FLUX4 = str(REPO / "models" / "flux-tiny4.dsl")


def _keys(m) -> dict[str, str]:
    return {c.name: c.attrs["cache_key"] for c in m.components()}


def test_a_cuda_program_never_answers_a_cpu_key_and_cpu_keys_have_no_device_part():
    cpu, cuda = (optimize(lower_file(FLUX), "tp1", target=t) for t in ("cpu", "cuda"))
    assert _keys(cpu).keys() == _keys(cuda).keys()
    assert all(_keys(cpu)[name] != _keys(cuda)[name] for name in _keys(cpu))
    cpu_inputs, cuda_inputs = json.loads(explain(cpu)), json.loads(explain(cuda))
    for name, entry in cuda_inputs.items():
        inputs = dict(entry["inputs"])
        assert inputs.pop("device") == "cuda"
        assert inputs == cpu_inputs[name]["inputs"], name  # the device is the only difference
        assert "device" not in cpu_inputs[name]["inputs"]
    assert BACKENDS["inductor"].key_part("cpu") == {}


def test_split_layouts_for_cuda_are_not_built_and_say_why():
    planned = optimize(lower_file(FLUX4), "tp2", target="cuda")
    why = dict(built.reasons(planned, "inductor"))
    assert why["transformer"] == ("split programs for cuda devices (one rank per device, NCCL) are not "
                                  "built yet: CPU ranks only")
    assert built.reasons(optimize(lower_file(FLUX4), "tp2", target="cpu"), "inductor") == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: codegen compiles for it")
def test_codegen_for_cuda_without_a_device_fails_before_writing_anything(tmp_path):
    from difflet.codegen.driver import codegen

    planned = optimize(lower_file(FLUX), "tp1", target="cuda")
    with pytest.raises(DiffletError, match=r"the target's device is cuda, and torch .* sees no CUDA device") as err:
        codegen(planned, "random:0", tmp_path / "art", store=tmp_path / "store", log=lambda *a: None)
    assert err.value.where == "target"
    assert not (tmp_path / "art").exists() and not (tmp_path / "store").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the demo runs on it")
def test_demo_for_cuda_without_a_device_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "difflet.cli", "demo", "--model", "flux-tiny", "--target", "cuda",
                           "--store", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("error: target: the target's device is cuda"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_constants_are_bound_where_the_program_runs_copying_only_what_is_elsewhere():
    # torch's meta device stands in for an accelerator: tensors move to it without hardware
    loads = []
    here, there = torch.ones(2), torch.ones(3, device="meta")
    placed = attach_constants(lambda c, user_managed: loads.append((c, user_managed)),
                              {"AOTI_DEVICE_KEY": "meta"}, {"a": here, "b": there})
    assert placed["b"] is there and placed["a"].device.type == "meta" and placed["a"].shape == (2,)
    assert loads == [(placed, True)]  # user-managed: the program reads the returned tensors
    on_cpu = attach_constants(lambda c, user_managed: loads.append((c, user_managed)), {"AOTI_DEVICE_KEY": "cpu"},
                              {"a": here})
    assert on_cpu["a"] is here  # a CPU program points at the loaded (mmap'd) tensor itself
