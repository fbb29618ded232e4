"""`difflet opt` end to end on a saved pipeline IR: exit codes, error line, table, key JSON."""
import json

import pytest
from click.testing import CliRunner

from difflet.cli import main
from difflet.ir.binary import load, save


@pytest.fixture(scope="module")
def flux_ir(tmp_path_factory):
    from difflet.frontend.lower import lower_file

    path = tmp_path_factory.mktemp("opt") / "flux.ir"
    save(lower_file("models/flux.dsl"), path)
    return path


def test_opt_writes_planned_ir(flux_ir, tmp_path):
    out = tmp_path / "f.ir"
    r = CliRunner().invoke(main, ["opt", str(flux_ir), "--parallel", "tp4", "--target", "trn2",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    m = load(out)
    assert m.level == "planned" and m.attrs["parallel"]["tp"] == 4 and m.attrs["backend"] == "neuron"


def test_illegal_plan_is_one_error_line_exit_2(flux_ir, tmp_path):
    r = CliRunner().invoke(main, ["opt", str(flux_ir), "--parallel", "tp4cp4", "--target", "trn2",
                                  "-o", str(tmp_path / "x.ir")])
    assert r.exit_code == 2
    assert "error: models/flux.dsl:76:5: illegal plan tp4cp4 ulysses" in r.output
    assert "Traceback" not in r.output


def test_bad_parallel_text_exit_2(flux_ir, tmp_path):
    r = CliRunner().invoke(main, ["opt", str(flux_ir), "--parallel", "tp4xq2", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "cannot parse 'q2'" in r.output


def test_list_legal_table(flux_ir):
    r = CliRunner().invoke(main, ["opt", str(flux_ir), "--list-legal", "--target", "trn2", "--cores", "4"])
    assert r.exit_code == 0
    rows = {l.split("|")[1].strip(): l for l in r.output.splitlines() if l.startswith("| ")}
    # the neuron backend builds FLUX's tp-only plans (one NxD SPMD program), not its SP/CP ones
    assert rows["tp4"].split("|")[4].strip() == "legal" and rows["tp4"].rstrip().endswith("| same |")
    assert "| not-built (transformer): the neuron backend builds tp-only split programs" in rows["tp4+sp"]
    assert "cfg: cfg2 needs true classifier-free guidance" in rows["tp2+cfg2"]
    r = CliRunner().invoke(main, ["opt", str(flux_ir), "--list-legal", "--target", "cpu", "--cores", "4"])
    rows = {l.split("|")[1].strip(): l for l in r.output.splitlines() if l.startswith("| ")}
    assert rows["tp4"].split("|")[4].strip() == "legal"  # inductor builds FLUX's split programs
    assert rows["tp4"].rstrip().endswith("| same |")  # and the probe beside them
    assert rows["dp2xtp2"].split("|")[4].strip() == "legal"  # one tp2 program, served as 2 replicas


def test_explain_key_lists_inputs_and_matches_keys(flux_ir, tmp_path):
    out = tmp_path / "f.ir"
    r = CliRunner().invoke(main, ["opt", str(flux_ir), "--parallel", "tp2", "--explain-key", "-o", str(out)])
    assert r.exit_code == 0, r.output
    keys = json.loads(r.output)
    m = load(out)
    assert keys["transformer"]["cache_key"] == m.component("transformer").attrs["cache_key"]
    assert set(keys["transformer"]["inputs"]) == {"component", "attrs", "body", "backend",
                                                  "compiler", "difflet", "probe"}
