"""Block mode keeps one copy of the denoiser's weights: resident memory after loading the block
artifact (front + rest programs) against the unsplit artifact of the same checkpoint.

The model is models/flux-tiny.dsl with a wider denoiser (`--heads` x `--head-dim` hidden, 2 + 2
blocks, random:0 weights; the other components stay tiny) so its weights dominate the process.
Each artifact is loaded by `load_artifacts` in its own fresh Python process, which calls the
denoiser once (safetensors maps the weight files: a page is resident once read) and reports its
VmRSS (/proc/self/status) before the load and after the call; the difference is what serving cost.
Two copies of the weights would make the block artifact's load cost about twice the unsplit one's.

    python bench/blocks_memory.py [--heads 8] [--head-dim 128] [--store DIR] [--out PREFIX]
--out PREFIX writes PREFIX.json and PREFIX.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROBE = """
import json, sys
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
import torch
from difflet.codegen.artifacts import load_artifacts
from difflet.codegen.build import example_inputs
before = rss()
art = load_artifacts(sys.argv[1])
loaded = rss()
den = next(c for c in art.module.components() if c.attrs.get("role") == "denoiser")
with torch.no_grad():
    art.programs[den.name](*example_inputs(den))  # touches every weight page (safetensors maps them)
print(json.dumps({"before": before, "after": rss(), "loaded": loaded}))
"""


def wide_description(heads: int, head_dim: int) -> str:
    """flux-tiny's text with the denoiser widened to heads x head_dim and 2 + 2 blocks."""
    text = (REPO / "models" / "flux-tiny.dsl").read_text()
    swaps = [("num_layers: 1, num_single_layers: 2", "num_layers: 2, num_single_layers: 2"),
             ("attention_head_dim: 16, num_attention_heads: 2", f"attention_head_dim: {head_dim}, "
                                                                 f"num_attention_heads: {heads}"),
             ("heads 2 head_dim 16", f"heads {heads} head_dim {head_dim}")]
    for old, new in swaps:
        if old not in text:
            raise SystemExit(f"models/flux-tiny.dsl no longer has {old!r}: update bench/blocks_memory.py")
        text = text.replace(old, new)
    return text


def load_cost(art: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(art)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.driver import codegen
    from difflet.codegen.store import default_store_dir
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not (1 <= args.heads <= 64 and 4 <= args.head_dim <= 512 and args.head_dim % 4 == 0):
        ap.error("--heads in [1, 64], --head-dim in [4, 512] and a multiple of 4")
    store = args.store or default_store_dir()
    work = Path(tempfile.mkdtemp(prefix="blocks-memory-"))
    dsl = work / "flux-wide.dsl"
    dsl.write_text(wide_description(args.heads, args.head_dim))
    rows = []
    for label, k in (("unsplit", 0), ("front + rest (front_blocks 1)", 1)):
        module = optimize(lower_file(str(dsl)), parallel="tp1", target="cpu", backend="inductor", front_blocks=k)
        weights = resolve_weights(module, "random:0", store)
        art = work / f"art{k}"
        codegen(module, weights, art, backend="inductor", store=store, log=lambda *a: None)
        size = sum(p.stat().st_size for p in (art / "weights").glob("transformer*.safetensors"))
        cost = load_cost(art)
        rows.append({"artifact": label, "denoiser_weight_bytes": size, "rss_before": cost["before"],
                     "rss_after": cost["after"], "load_cost": cost["after"] - cost["before"]})
        print(json.dumps(rows[-1]), flush=True)
    mib = 1 << 20
    lines = [f"Resident memory of loading flux-tiny widened to {args.heads} x {args.head_dim} (2 + 2 blocks, "
             "random weights), each artifact in a fresh process", "",
             "| artifact | denoiser weight files MiB | RSS before MiB | RSS after a call MiB | cost MiB |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['artifact']} | {r['denoiser_weight_bytes'] / mib:.1f} | {r['rss_before'] / mib:.1f} | "
              f"{r['rss_after'] / mib:.1f} | {r['load_cost'] / mib:.1f} |" for r in rows]
    lines.append(f"\nblock / unsplit cost: {rows[1]['load_cost'] / rows[0]['load_cost']:.3f}")
    print("\n".join(lines))
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(rows, indent=1) + "\n")
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
