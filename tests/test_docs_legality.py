"""The legality tables in docs/parallel-legality.md and README.md say what the planner says.

Oracles:
- every per-model table of docs/parallel-legality.md, row by row, is the reviewed `--list-legal`
  golden (tests/golden/passes/list-legal-<model>.txt, itself held to the planner by
  test_passes_models.py::test_list_legal_golden);
- each summary row (in both documents) restates those golden rows: its "legal" cell lists exactly
  the rows whose verdict is `legal` (with their largest memory figure and raised encoders), its
  "main rejected" cell every other row once, under the rule its verdict starts with; the rules of
  the summary are re-derived here from the golden cells, not by the script that wrote the docs;
- the summary's shape is README's Models table's; its text tokens and guidance are the reference
  pipeline's own defaults (diffusers' `__call__` signature: `max_sequence_length`,
  `guidance_scale`, `true_cfg_scale`); its visual tokens are worked out from the shape with the
  VAE/patch compression of /work/shared/models.md (16 px per token and 4 frames per latent frame;
  LTX-2 32 px and 8 frames, plus 25 audio tokens per second at 24 fps).
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC, README = REPO / "docs" / "parallel-legality.md", REPO / "README.md"
GOLDEN = REPO / "tests" / "golden" / "passes"
MODELS = {"FLUX.1-dev": "flux", "Qwen-Image": "qwen-image", "Wan 2.1 T2V 14B": "wan2.1",
          "HunyuanVideo": "hunyuan-video", "LTX-2": "ltx2", "Wan 2.2 T2V A14B (two experts)": "wan2.2-a14b",
          "Wan 2.2 TI2V-5B (text to video)": "wan2.2-ti2v-5b", "Wan 2.2 I2V A14B (two experts)": "wan2.2-i2v-a14b",
          "Wan 2.2 TI2V-5B (image to video)": "wan2.2-ti2v-5b-i2v", "FLUX.2 [klein] 4B (distilled)": "flux2-klein-4b",
          "FLUX.2 [klein] base 4B": "flux2-klein-base-4b"}
# models served at their authors' defaults where diffusers' __call__ differs: Wan 2.2 A14B's
# wan/configs/wan_t2v_A14B.py sample_guide_scale (4.0 high-noise, 3.0 low-noise), not 5.0, and
# I2V A14B's wan_i2v_A14B.py (3.5 both); FLUX.2 [klein] 4B, step-distilled, at its model card's call
# (4 steps, guidance 1.0: Flux2KleinPipeline runs no CFG when is_distilled, whatever the scale)
OWN_GUIDANCE = {"wan2.2-a14b": "CFG 4.0 (2 passes)", "wan2.2-i2v-a14b": "CFG 3.5 (2 passes)",
                "flux2-klein-4b": "none 1.0 (1 pass)"}
SUMMARY_HEAD = "| model | default shape | visual tokens | text tokens | guidance | legal (memory/core) |"
# models.md: (pixels per token side, video frames per latent frame) of each family's VAE + patch
COMPRESSION = {"flux": (16, None), "qwen-image": (16, None), "wan2.1": (16, 4), "hunyuan-video": (16, 4),
               "ltx2": (32, 8), "wan2.2-a14b": (16, 4), "wan2.2-i2v-a14b": (16, 4),
               "wan2.2-ti2v-5b": (32, 4), "wan2.2-ti2v-5b-i2v": (32, 4),
               "flux2-klein-4b": (16, None), "flux2-klein-base-4b": (16, None)}  # Wan 2.2 VAE: 16x spatial (convert_wan_to_diffusers.py), 2x2 patches
LTX2_AUDIO_TOKENS_PER_S, LTX2_FPS = 16000 / 160 / 4, 24  # models.md: 16 kHz, hop 160, scale 4; 24 fps


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split("|")]


def _table_after(lines: list[str], start: int) -> list[str]:
    """The markdown table lines (header, rule, rows) of the first table at or after `start`."""
    i = next(j for j in range(start, len(lines)) if lines[j].startswith("|"))
    out = []
    while i < len(lines) and lines[i].startswith("|"):
        out.append(lines[i])
        i += 1
    return out


def _summary(path: Path) -> dict[str, list[str]]:
    """title -> the cells of its summary row (the table headed SUMMARY_HEAD)."""
    lines = path.read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith(SUMMARY_HEAD)]
    return {_cells(r)[0]: _cells(r) for r in _table_after(lines, start)[2:]}


def _detail(stem: str) -> list[str]:
    lines = DOC.read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("### ") and f"(`models/{stem}.dsl`)" in line]
    return _table_after(lines, start)


def _golden(stem: str) -> dict[str, list[str]]:
    """label -> cells (config, memory, encoders/decoders, verdict, probe memory, probe verdict)."""
    rows = [line for line in (GOLDEN / f"list-legal-{stem}.txt").read_text().splitlines() if line.startswith("|")]
    return {_cells(r)[0]: _cells(r) for r in rows[2:]}


def _rule(verdict: str) -> str:
    """`legal`, or the rule a verdict starts with (`not-built (x): ...`, `memory (x): ...`, `cfg: ...`)."""
    return "legal" if verdict == "legal" else re.split(r"[ :(]", verdict, maxsplit=1)[0]


def _expand(name: str, modes: str | None, golden: dict) -> list[str]:
    """Golden labels an entry stands for: `tp2cp2 ulysses/ring` -> two rows, `tp2cp2` -> all its modes."""
    labels = [f"{name} {m}" for m in modes.split("/")] if modes else \
        [label for label in golden if label.split(" ")[0] == name]
    assert labels and all(label in golden for label in labels), f"{name} {modes or ''}: not a golden row"
    return labels


@pytest.mark.parametrize("stem", MODELS.values())
def test_every_detail_table_is_the_reviewed_golden(stem):
    golden = [line for line in (GOLDEN / f"list-legal-{stem}.txt").read_text().splitlines() if line.startswith("|")]
    doc = _detail(stem)
    assert doc[:2] == golden[:2], "header"
    got, want = {_cells(r)[0]: r for r in doc[2:]}, {_cells(r)[0]: r for r in golden[2:]}
    assert len(got) == len(doc) - 2, "a config is listed twice"
    wrong = sorted(label for label in want.keys() | got.keys() if got.get(label) != want.get(label))
    assert not wrong, f"docs/parallel-legality.md rows differing from the golden: {wrong}"
    assert [_cells(r)[0] for r in doc[2:]] == [_cells(r)[0] for r in golden[2:]]  # the planner's order


@pytest.mark.parametrize("doc", [DOC, README], ids=["parallel-legality.md", "README.md"])
@pytest.mark.parametrize("title", MODELS)
def test_summary_row_restates_the_golden_verdicts(doc, title):
    golden = _golden(MODELS[title])
    row = _summary(doc)[title]
    legal_cell, rejected_cell = row[5], row[6]
    legal = []
    for entry in ([] if legal_cell == "none" else legal_cell.split("; ")):
        m = re.fullmatch(r"(\S+)(?: ([a-z_/]+))? ([\d.]+) GiB(?: \[(.*)\])?", entry)
        assert m, f"{title}: unreadable legal entry {entry!r}"
        labels = _expand(m[1], m[2], golden)
        assert all(golden[label][3] == "legal" for label in labels), f"{title}: {entry!r} is not legal"
        most = max(float(golden[label][1].split()[0]) for label in labels)
        assert m[3] == f"{most:.1f}", f"{title}: {entry!r}: the golden's memory is {most:.1f} GiB"
        assert {golden[label][2] for label in labels} == {m[4] or "all tp1"}, f"{title}: {entry!r} encoders"
        legal += labels
    assert sorted(legal) == sorted(label for label, cells in golden.items() if cells[3] == "legal"), title
    rejected = []
    for group in ([] if rejected_cell == "none" else rejected_cell.split("; ")):
        rule, _, names = group.partition(": ")
        for entry in names.split(", "):
            m = re.fullmatch(r"(\S+)(?: ([a-z_/]+))?", entry)
            assert m, f"{title}: unreadable rejected entry {entry!r}"
            for label in _expand(m[1], m[2], golden):
                assert _rule(golden[label][3]) == rule, \
                    f"{title}: {label} is listed under {rule!r}, the golden verdict is {golden[label][3]!r}"
                rejected.append(label)
    assert len(rejected) == len(set(rejected)), f"{title}: a config is listed under two rules"
    assert sorted(rejected) == sorted(label for label, cells in golden.items() if cells[3] != "legal"), title


def test_readme_summary_is_the_generated_docs_summary():
    assert _summary(README) == _summary(DOC)


def _models_table() -> dict[str, list[str]]:
    """README's Models table: title -> (model, description, default shape, guidance, output, pipeline, hub)."""
    lines = README.read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("| model | description (tiny variant) |")]
    return {_cells(r)[0]: _cells(r) for r in _table_after(lines, start)[2:]}


def _pipeline_defaults(name: str) -> dict:
    import diffusers

    params = inspect.signature(getattr(diffusers, name).__call__).parameters
    return {k: p.default for k, p in params.items()}


@pytest.mark.parametrize("doc", [DOC, README], ids=["parallel-legality.md", "README.md"])
@pytest.mark.parametrize("title", MODELS)
def test_summary_shape_tokens_and_guidance_match_the_reference_pipeline(doc, title):
    row, model = _summary(doc)[title], _models_table()[title]
    shape, visual, text, guidance = row[1:5]
    # README Models table: "480x832, 81 frames, 50 steps" -> 480x832x81
    parts = model[2].split(", ")
    frames = [p.split()[0] for p in parts if re.fullmatch(r"\d+ frames( \+ audio)?", p)]
    assert shape == "x".join([parts[0], *frames]), f"{title}: {shape} vs the Models table's {model[2]!r}"
    h, w, *f = map(int, shape.split("x"))
    px, per_latent = COMPRESSION[MODELS[title]]
    tokens = (h // px) * (w // px) * ((f[0] - 1) // per_latent + 1 if f else 1)
    want = f"{tokens:,}"
    if MODELS[title] == "ltx2":
        want += f" + {int(f[0] / LTX2_FPS * LTX2_AUDIO_TOKENS_PER_S)} audio"
    assert visual == want, f"{title}: visual tokens"
    defaults = _pipeline_defaults(model[5].split(" (")[0])  # "WanPipeline (expand_timesteps)": the class
    assert text == f"{defaults['max_sequence_length']:,}", f"{title}: text tokens"
    true_cfg = defaults.get("true_cfg_scale")
    if true_cfg is not None and true_cfg > 1:    # Qwen-Image: true CFG on by default
        want = f"true CFG {true_cfg} (2 passes)"
    elif true_cfg is not None:                   # FLUX, HunyuanVideo: true CFG off, guidance embedded
        want = f"embedded {defaults['guidance_scale']} (1 pass)"
    elif "stg_scale" in defaults:                # LTX-2: CFG + STG + modality isolation; LTX-2.0's blocks
        # have no perturbed_attn, so the pipeline's STG pass is its conditional pass again: 3 run
        want = (f"CFG {defaults['guidance_scale']} + STG {defaults['stg_scale']} + modality "
                f"{defaults['modality_scale']} (3 passes)")
    else:                                        # Wan: classic CFG, two passes
        want = f"CFG {defaults['guidance_scale']} (2 passes)"
    want = OWN_GUIDANCE.get(MODELS[title], want)
    assert guidance == want, f"{title}: guidance"
    kind_scale, passes = want.split(" (")
    assert model[3].startswith(kind_scale) and f"({passes[:-1]}" in model[3], \
        f"{title}: README Models table guidance {model[3]!r}"
