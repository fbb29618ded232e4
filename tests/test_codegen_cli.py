"""`difflet codegen` on the command line: refusals exit 2 with one clear line; the store compiles once."""
import subprocess
import sys
import threading

import pytest

from difflet.codegen.store import Store


def _difflet(*args):
    return subprocess.run([sys.executable, "-m", "difflet.cli", *args], capture_output=True, text=True)


def test_neuron_backend_without_the_sdk_fails_clearly(tmp_path):
    r = _difflet("codegen", str(tmp_path / "m.ir"), "--backend", "neuron", "--weights", "random:0",
                 "-o", str(tmp_path / "art"))
    assert r.returncode == 2
    assert r.stderr.startswith("error: --backend: backend 'neuron' needs the Neuron SDK")
    assert "pip.repos.neuron.amazonaws.com" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "art").exists()


def test_pipeline_level_ir_is_refused_with_a_hint(tmp_path):
    from difflet.frontend.lower import lower_file
    from difflet.ir.binary import save

    from conftest import FLUX_TINY_DSL

    save(lower_file(str(FLUX_TINY_DSL)), tmp_path / "m.ir")
    r = _difflet("codegen", str(tmp_path / "m.ir"), "--weights", "random:0", "-o", str(tmp_path / "art"),
                 "--store", str(tmp_path / "store"))
    assert r.returncode == 2
    assert "codegen needs planned IR" in r.stderr and "difflet opt" in r.stderr
    assert r.stderr.startswith(f"error: {FLUX_TINY_DSL}:") and "Traceback" not in r.stderr


@pytest.mark.parametrize("stale", ["difflet_version", "compiler_version"])
def test_ir_planned_under_another_toolchain_is_refused_before_any_work(tmp_path, stale):
    """Keys hash the Difflet program sources and the compiler's versions (passes/cache_key.py): a
    program compiled under an IR's stale key would later answer for what this toolchain builds."""
    from difflet.frontend.lower import lower_file
    from difflet.ir.binary import save
    from difflet.passes.cache_key import compiler_version, difflet_version
    from difflet.passes.pipeline import optimize

    from conftest import FLUX_TINY_DSL

    pinned = {"difflet_version": difflet_version(), "compiler_version": compiler_version("inductor")}
    pinned[stale] = "torch==0.0.1-elsewhere" if stale == "compiler_version" else "0.0.1+src.elsewhere"
    save(optimize(lower_file(str(FLUX_TINY_DSL)), parallel="tp1", **pinned), tmp_path / "m.ir")
    r = _difflet("codegen", str(tmp_path / "m.ir"), "--weights", "random:0", "-o", str(tmp_path / "art"),
                 "--store", str(tmp_path / "store"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    what = "toolchain torch==0.0.1-elsewhere" if stale == "compiler_version" else "difflet 0.0.1+src.elsewhere"
    assert f"planned under another {what} (here " in r.stderr and "run `difflet opt`" in r.stderr
    assert not (tmp_path / "art").exists() and not (tmp_path / "store").exists()


def test_missing_weights_option_is_a_usage_error(tmp_path):
    r = _difflet("codegen", str(tmp_path / "m.ir"), "-o", str(tmp_path / "art"))
    assert r.returncode == 2 and "--weights" in r.stderr


def test_concurrent_producers_of_one_key_produce_once(tmp_path):
    store, calls, start = Store(tmp_path), [], threading.Barrier(4)
    results = []

    def produce(tmp):
        calls.append(1)
        tmp.write_text("program")

    def worker():
        start.wait()
        results.append(store.get_or_create("inductor", "ab" * 32, produce, suffix=".pt2"))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sum(created for _, created in results) == 1
    assert {p for p, _ in results} == {store.path("inductor", "ab" * 32, ".pt2")}
    assert store.path("inductor", "ab" * 32, ".pt2").read_text() == "program"


def test_a_failed_producer_publishes_nothing(tmp_path):
    store = Store(tmp_path)

    def produce(tmp):
        tmp.write_text("half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        store.get_or_create("inductor", "cd" * 32, produce)
    assert not store.has("inductor", "cd" * 32)
    assert [p.name for p in store.path("inductor", "cd" * 32).parent.iterdir()] == [f".{'cd' * 32}.lock"]


def test_codegen_prints_one_line_per_program_unless_verbose(flux_tiny_module, flux_tiny_art, difflet_test_store,
                                                           tmp_path):
    """From a filled store (flux_tiny_art compiled every program): exactly one line per component
    (name, reused, seconds, key) and the summary; no library warnings or weight-loading bars.
    With --verbose the libraries' own output (transformers' "Loading weights" bars) comes back."""
    import re

    from difflet.ir.binary import save

    save(flux_tiny_module, tmp_path / "m.ir")
    names = [c.name for c in flux_tiny_module.components()]
    args = ("codegen", str(tmp_path / "m.ir"), "--weights", "random:0", "--store", str(difflet_test_store))
    r = _difflet(*args, "-o", str(tmp_path / "art"))
    assert r.returncode == 0, r.stderr
    lines = (r.stdout + r.stderr).splitlines()
    assert len(lines) == len(names) + 1, lines
    for name, line in zip(names, lines):
        assert re.fullmatch(rf"{name}: reused in \d+\.\d s \(key [0-9a-f]{{8}}\)", line), line
    assert lines[-1] == f"compiled 0, reused {len(names)}"
    assert not any(word in r.stdout + r.stderr for word in ("Warning", "Loading"))
    loud = _difflet(*args, "-o", str(tmp_path / "art2"), "--verbose")
    assert loud.returncode == 0, loud.stderr
    assert "Loading" in loud.stdout + loud.stderr
    assert all(line in (loud.stdout + loud.stderr).splitlines() for line in lines[-1:])


def test_compile_worker_count_is_bounded_and_overridable(flux_tiny_module, monkeypatch):
    from difflet.codegen import compile_pool
    from difflet.errors import DiffletError

    nodes = list(flux_tiny_module.components())
    monkeypatch.delenv(compile_pool.WORKERS_ENV, raising=False)
    cores = len(__import__("os").sched_getaffinity(0))
    assert compile_pool.compile_workers(nodes) == min(cores, len(nodes))
    monkeypatch.setattr(compile_pool, "_mem_available", lambda: compile_pool.WORKER_BASE_BYTES * 3 // 2)
    assert compile_pool.compile_workers(nodes) == 1  # memory for one worker only
    monkeypatch.setenv(compile_pool.WORKERS_ENV, "3")
    assert compile_pool.compile_workers(nodes) == 3 and compile_pool.compile_workers(nodes[:2]) == 2
    monkeypatch.setenv(compile_pool.WORKERS_ENV, "many")
    with pytest.raises(DiffletError, match="DIFFLET_COMPILE_WORKERS: must be a positive integer, got 'many'"):
        compile_pool.compile_workers(nodes)


def test_a_failing_compile_worker_names_its_program(flux_tiny_module, tmp_path, monkeypatch):
    """Two programs in two spawned workers; the checkpoint does not exist, so each worker fails
    building its module, and the error that comes back names the program."""
    from difflet.codegen.compile_pool import WORKERS_ENV, CompilePool
    from difflet.errors import DiffletError

    monkeypatch.setenv(WORKERS_ENV, "2")
    nodes = [flux_tiny_module.component("vae"), flux_tiny_module.component("text_encoder")]
    with pytest.raises(DiffletError, match=r"compiling '(vae|text_encoder)' failed: ") as err:
        with CompilePool(flux_tiny_module, nodes, tmp_path / "no-ckpt", tmp_path / "store", "inductor",
                         tmp_path / "art", False) as pool:
            assert all(n in pool for n in nodes)
            list(pool.results())
    assert "no-ckpt" in str(err.value)
    assert not (tmp_path / "store" / "inductor").exists() or not any((tmp_path / "store" / "inductor").rglob("*.pt2"))
