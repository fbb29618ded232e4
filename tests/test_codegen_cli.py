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
