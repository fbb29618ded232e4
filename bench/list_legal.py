"""Regenerate docs/parallel-legality.md: what each real-size model can run on one trn2 chip.

    python bench/list_legal.py                 # writes docs/parallel-legality.md
    python bench/list_legal.py --out -         # prints it

Every number comes from the lowered DSL (models/*.dsl) and the planner's own verdicts
(difflet.passes.legal_configs, the same passes `difflet opt` runs), never typed in here, so the
document cannot drift from the code: rerun after changing a model, a target or a rule.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from difflet.families import facts_of
from difflet.frontend.lower import lower_file
from difflet.ir.nodes import Attrs, Module, Op
from difflet.passes import legal_configs
from difflet.passes import model_facts as F
from difflet.passes.parallel_config import parse_parallel
from difflet.passes.pipeline import Options
from difflet.passes.targets import load_target

REPO = Path(__file__).resolve().parent.parent
MODELS = (("FLUX.1-dev", "flux"), ("Qwen-Image", "qwen-image"), ("Wan 2.1 T2V 14B", "wan2.1"),
          ("HunyuanVideo", "hunyuan-video"), ("LTX-2", "ltx2"),
          ("Wan 2.2 T2V A14B (two experts)", "wan2.2-a14b"), ("Wan 2.2 TI2V-5B (text to video)", "wan2.2-ti2v-5b"),
          ("Wan 2.2 I2V A14B (two experts)", "wan2.2-i2v-a14b"),
          ("Wan 2.2 TI2V-5B (image to video)", "wan2.2-ti2v-5b-i2v"),
          ("FLUX.2 [klein] 4B (distilled)", "flux2-klein-4b"), ("FLUX.2 [klein] base 4B", "flux2-klein-base-4b"))


def shape(m: Module) -> str:
    p = m.attrs["profile"]
    text = f"{p['height']}x{p['width']}"
    if "frames" in p:
        text += f"x{p['frames']}"
    return text


def tokens(m: Module) -> tuple[str, str]:
    t = F.tokens(m.components("denoiser")[0])
    visual = f"{t['visual']:,}" + (f" + {t['audio']} audio" if t.get("audio") else "")
    return visual, f"{t['text']:,}"


def guidance(m: Module) -> str:
    for sched in m.find(Op.SCHEDULE):
        for step in sched.body:
            g = step.attrs.get("guidance")
            if isinstance(g, Attrs):
                extra = facts_of(m).extra_guidance(m)  # LTX-2's STG and modality terms
                passes = F.guidance_branches(m) + sum(runs for _, runs in extra)
                kind = {"embedded": "embedded", "cfg": "CFG", "true_cfg": "true CFG"}.get(g["mode"], g["mode"])
                terms = "".join(f" + {label}" for label, _ in extra)
                return f"{kind} {g['scale']}{terms} ({passes} pass{'es' if passes > 1 else ''})"
    return "none"


def _collapse(rows: list[legal_configs.Row]) -> list[tuple[str, list[legal_configs.Row]]]:
    """Group rows that differ only in CP attention mode, keeping the enumeration order."""
    groups: dict[str, list[legal_configs.Row]] = {}
    for r in rows:
        groups.setdefault(r.config.name(), []).append(r)
    return list(groups.items())


def legal_cell(rows: list[legal_configs.Row]) -> str:
    out = []
    for name, rs in _collapse([r for r in rows if r.buildable]):
        modes = "/".join(r.config.attention for r in rs if r.config.cp > 1)
        comps = rs[0].components()
        out.append(f"{name}{f' {modes}' if modes else ''} {max(r.memory_gib for r in rs):.1f} GiB"
                   + ("" if comps == "all tp1" else f" [{comps}]"))
    return "; ".join(out) or "none"


def _first_rule(r: legal_configs.Row) -> str:
    return r.violations[0].rule if r.violations else "not-built"


def rejected_cell(rows: list[legal_configs.Row]) -> str:
    """Per first rule, the configs it rejects; CP modes named only where the rule splits them."""
    by_rule: dict[str, list[str]] = {}
    variants = {name: len(rs) for name, rs in _collapse(rows)}
    for name, rs in _collapse([r for r in rows if not r.buildable]):
        rules = list(dict.fromkeys(_first_rule(r) for r in rs))
        split = len(rules) > 1 or len(rs) < variants[name]   # only some CP modes rejected so
        for rule in rules:
            modes = [r.config.attention for r in rs if _first_rule(r) == rule and r.config.cp > 1]
            by_rule.setdefault(rule, []).append(name + (f" {'/'.join(modes)}" if split and modes else ""))
    return "; ".join(f"{rule}: {', '.join(names)}" for rule, names in by_rule.items()) or "none"


def build(target: str, cores: int) -> str:
    t = load_target(target)
    opts = Options(parallel=parse_parallel("tp1"), target=target, backend=t["backends"][0])
    summary = ["| model | default shape | visual tokens | text tokens | guidance | legal (memory/core) "
               "| main rejected (first rule) |", "|---|---|---|---|---|---|---|"]
    details = []
    for title, stem in MODELS:
        m = lower_file(f"models/{stem}.dsl")
        rows = legal_configs.rows(m, opts, cores)
        visual, text = tokens(m)
        summary.append(f"| {title} | {shape(m)} | {visual} | {text} | {guidance(m)} | "
                       f"{legal_cell(rows)} | {rejected_cell(rows)} |")
        details += [f"### {title} (`models/{stem}.dsl`)", "",
                    f"`difflet lower models/{stem}.dsl -o {stem}.ir && difflet opt {stem}.ir "
                    f"--list-legal --target {target} --cores {cores}`", "",
                    legal_configs.table(m, opts, cores), ""]
    head = [
        f"# Parallel legality on {target} with {cores} cores", "",
        "Generated by `python bench/list_legal.py`; do not edit by hand. Each verdict is the one",
        "`difflet opt` reaches before compiling (plan-parallel, extract-probe, legality): the summary",
        "and each table's first verdict without the step-caching probe, the table's last two columns",
        "with it (`--probe separate`: its weights, an upper bound, and its saved feature count in",
        "memory; `same` = the verdict without it),",
        "or `not-built` for a plan the planner accepts but codegen does not build yet (the reason is",
        "difflet/passes/built.py's, the words `difflet codegen` refuses it with); `legal` means built.",
        "Memory is the planner's per-core estimate (difflet/passes/memory.py) against",
        f"{t['memory_per_core_gib']} GiB per logical core: every resident component's weights (they",
        "share the cores), the denoiser's activations and the runtime reserve. An encoder",
        "or decoder that does not fit replicated (TP1) beside the denoiser gets its own TP,",
        "the smallest power of two up to the denoiser's TP that fits (marked `auto`).", "",
        "Not modelled: compiler limits such as the host memory that building Wan 2.1's TP2",
        "programs at 32.8k tokens exhausts (paper 7.4), and spill buffers the compiler adds. The",
        "paper's HunyuanVideo TP2 denoiser did not fit beside its replicated Llama encoder (so",
        "`--component-tp text_encoder=1`, rejected here too); with the encoder at TP2 the",
        "estimate fits, a prediction no measurement has checked yet.", "",
    ]
    return "\n".join(head + summary + ["", "## Every configuration", ""] + details)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--cores", type=int, default=4)
    ap.add_argument("--out", default="docs/parallel-legality.md", help="path, or - for stdout")
    a = ap.parse_args(argv)
    text = build(a.target, a.cores)
    if a.out == "-":
        sys.stdout.write(text)
    else:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
