"""Model-process memory of a shape-bucketed artifact: 3 sizes vs 1, weights loaded once.

The model is models/flux.dsl (configs from the checkpoint) on a random FLUX checkpoint whose
transformer is wide enough that its weights, not the torch runtime, dominate the process
(--hidden, default 1024: 8 heads x 128, 2 double + 4 single blocks, about 0.5 GB in fp32); the
encoders and VAE are tiny. Two artifacts, compiled through one program store: sizes 64x64 alone,
and 64x64,96x64,64x96 (`--shapes`). Each is loaded, warmed up at every size, in a fresh process
(ModelRunner.from_artifacts, as the model process does); that process reports its RSS and the
resident bytes of the compiled programs' shared objects (program code, excluded from the
ratio as the issue asks). Prints JSON (also to --json), then a markdown table.

    python bench/buckets.py [--hidden 1024] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = ["64x64", "96x64", "64x96"]
TINY = {  # models/flux.dsl's default blocks, in order, replaced by these configs
    "text_encoder": """vocab_size: 1000, hidden_size: 32, intermediate_size: 37, num_hidden_layers: 1
        num_attention_heads: 2, max_position_embeddings: 77, projection_dim: 32
        bos_token_id: 1, eos_token_id: 2, pad_token_id: 0""",
    "text_encoder_2": """vocab_size: 1000, d_model: 32, d_ff: 37, d_kv: 8, num_layers: 1, num_heads: 4
        relative_attention_num_buckets: 8, feed_forward_proj: "gated-gelu"
        pad_token_id: 0, eos_token_id: 2, decoder_start_token_id: 0""",
    "transformer": """patch_size: 1, in_channels: 64, num_layers: 2, num_single_layers: 4
        attention_head_dim: 128, num_attention_heads: HEADS, joint_attention_dim: 32
        pooled_projection_dim: 32, guidance_embeds: true, axes_dims_rope: [16, 56, 56]""",
    "vae": """in_channels: 3, out_channels: 3, latent_channels: 16, layers_per_block: 1, norm_num_groups: 4
        down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"]
        up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]
        block_out_channels: [8, 8, 8, 16], sample_size: 64, scaling_factor: 0.3611, shift_factor: 0.1159
        use_quant_conv: false, use_post_quant_conv: false""",
}

MEASURE = """
import json, sys, psutil
from difflet.runtime.runner import ModelRunner
runner = ModelRunner.from_artifacts(sys.argv[1])
runner.warm_up()
proc = psutil.Process()
code = sum(m.rss for m in proc.memory_maps() if m.path.endswith(".so") and "/data/aotinductor/" in m.path)
print(json.dumps({"rss": proc.memory_info().rss, "program_code": code}))
"""


def description(hidden: int) -> str:
    text = (REPO / "models" / "flux.dsl").read_text()
    blocks = iter(TINY.values())
    text = re.sub(r"default \{[^}]*\}", lambda _: "default {" + next(blocks) + "}", text)
    return text.replace("HEADS", str(hidden // 128))


def build(hidden: int, work: Path) -> dict[str, Path]:
    """Both artifacts; the random checkpoint is materialized once from the single-size module."""
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_buckets, lower_text
    from difflet.passes.pipeline import optimize

    text, path = description(hidden), str(work / "flux-mid.dsl")
    base = {"height": "64", "width": "64", "max_text": "16", "dtype": "float32"}
    one = optimize(lower_text(text, path, base))
    ckpt = resolve_weights(one, "random:0", work / "store")
    arts = {"1 size": one, "3 sizes": optimize(lower_buckets(text, path, SIZES, base))}
    out = {}
    for name, module in arts.items():
        out[name] = work / name.replace(" ", "-")
        codegen(module, str(ckpt), out[name], store=work / "store", log=lambda line: print("  " + line))
    return out


def measure(art: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", MEASURE, str(art)], capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024, help="transformer width (a multiple of 128)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        arts = build(args.hidden, Path(tmp))
        weights = (arts["1 size"] / "weights" / "transformer.rank0.safetensors").stat().st_size
        rows = {name: measure(art) for name, art in arts.items()}
    for r in rows.values():
        r["rss_without_code"] = r["rss"] - r["program_code"]
    one, three = rows["1 size"], rows["3 sizes"]
    result = {"hidden": args.hidden, "sizes": SIZES, "transformer_weights_bytes": weights, "runs": rows,
              "ratio_rss_without_code": round(three["rss_without_code"] / one["rss_without_code"], 3),
              "ratio_if_weights_were_copied_per_size": round(
                  (one["rss_without_code"] + 2 * weights) / one["rss_without_code"], 3)}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    mib = 1 << 20
    print("\n| artifact | RSS | program code | RSS without code |\n|---|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['rss'] / mib:.0f} MiB | {r['program_code'] / mib:.0f} MiB | "
              f"{r['rss_without_code'] / mib:.0f} MiB |")
    print(f"\n3 sizes / 1 size, without program code: {result['ratio_rss_without_code']}x "
          f"(transformer weights {weights / mib:.0f} MiB; one copy per size would give "
          f"{result['ratio_if_weights_were_copied_per_size']}x)")


if __name__ == "__main__":
    main()
