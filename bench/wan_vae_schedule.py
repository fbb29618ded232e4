"""How inductor schedules the Wan VAE's later-chunk decoder program: compile it alone (first = 0,
the torch.cond branch every later chunk runs) in several variants and replay each generated
wrapper's buffers (bench/aoti_liveness.py). A diagnostic of issue 34's VAE memory, not a product
path; it patches inductor internals for two variants (torch 2.13's torch/_inductor/memory.py).

    python bench/wan_vae_schedule.py --checkpoint /work/data/wan13b --height 240 --width 416

Variants: `levels` (the shipped program: one cache input/output per spatial level), `slots` (one
per cached conv, no split or join), `chained` (levels, each slot's read made to depend on the
previous slot's write by an exact where), `tied` (levels, each causal conv's cache read made to
depend on that conv's own new input, the same way), `slots-no-reorder` (inductor's reorder_for_peak_memory
off), `levels-inputs-kept` (the reordering told graph inputs are never freed), `levels-cat-sized`
(the reordering's size model charging a concatenation input its whole buffer).
Writes bench/results/wan_vae_schedule.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aoti_liveness import replay, wrapper_lines  # noqa: E402

VARIANTS = ("levels", "slots", "chained", "tied", "slots-no-reorder", "levels-inputs-kept", "levels-cat-sized")


class _Chained(list):
    """A feat_cache whose slot reads depend on the last slot written (values unchanged)."""
    last = None

    def __getitem__(self, i):
        value = super().__getitem__(i)
        if isinstance(i, int) and torch.is_tensor(value) and self.last is not None:
            probe = self.last[:1, :1, -1:, :1, :1]
            value = torch.where(probe == probe, value, value)  # NaN-safe identity
        return value

    def __setitem__(self, i, value):
        super().__setitem__(i, value)
        if torch.is_tensor(value):
            self.last = value


def _patch_inductor(variant: str) -> None:
    import torch._inductor.memory as memory
    from torch.utils._ordered_set import OrderedSet

    if variant == "levels-inputs-kept":
        original = memory.reorder_for_peak_memory

        def kept(nodes, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs, **kw):
            return original(nodes, name_to_buf, name_to_fused_node, OrderedSet(), graph_outputs, **kw)
        memory.reorder_for_peak_memory = kept
    elif variant == "levels-cat-sized":
        from torch._inductor.ir import NonOwningLayout
        from torch._inductor.utils import get_dtype_size
        from torch._inductor.virtualized import V

        sizes = memory.compute_size_for_scheduler_buffer

        def cat_sized(name_to_buf):
            out = sizes(name_to_buf)
            for name, buf in name_to_buf.items():
                layout = getattr(buf.node, "layout", None)
                if isinstance(layout, NonOwningLayout):
                    whole = getattr(layout.view, "data", layout.view)
                    n = V.graph.sizevars.optimization_hint(whole.get_numel(), fallback=0)
                    out[name] = (n * get_dtype_size(whole.get_dtype()),) * 2
            return out
        memory.compute_size_for_scheduler_buffer = cat_sized


def build(vae, variant: str, z_shape: tuple[int, ...]):
    """(module, example inputs) of the later-chunk program in `variant`."""
    import difflet.families.wan.vae as wan_vae

    slots = wan_vae.cache_layout(vae, z_shape)
    if variant.startswith("slots"):
        class Slots(torch.nn.Module):
            def forward(self, z, *caches):
                frames, new = wan_vae._run_decoder(vae, z, list(caches))
                return (frames.contiguous(), *[c.contiguous() for c in new])
        return Slots(), [torch.zeros(1, c, 2, h, w) for c, h, w in slots]
    levels = list(dict.fromkeys((h, w) for _, h, w in slots))
    module = wan_vae.WanChunkDecoder.__new__(wan_vae.WanChunkDecoder)
    torch.nn.Module.__init__(module)
    module.vae, module.fixed, module.chunk_frames, module.slots = vae, 0, 4, slots
    module.level_of = [levels.index((h, w)) for _, h, w in slots]
    if variant == "chained":
        def chained(vae_, z, caches):
            feat_cache, feat_idx = _Chained(caches), [0]
            out = vae_.decoder(vae_.post_quant_conv(z), feat_cache=feat_cache, feat_idx=feat_idx)
            return torch.clamp(out, -1.0, 1.0), list.__getitem__(feat_cache, slice(0, feat_idx[0]))
        wan_vae._run_decoder = chained
    if variant == "tied":  # each causal conv's cache read depends on its own new input x
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

        def tie(_m, args):
            if len(args) < 2 or args[1] is None:
                return None
            x, cache = args[0], args[1]
            probe = x[:1, :1, :1, :1, :1]
            return (x, torch.where(probe == probe, cache, cache), *args[2:])
        for m in vae.decoder.modules():
            if isinstance(m, WanCausalConv3d):
                m.register_forward_pre_hook(tie)
    inputs = [torch.zeros(1, sum(c for (c, *_), lv in zip(slots, module.level_of) if lv == k), 2, h, w)
              for k, (h, w) in enumerate(levels)]
    return module, inputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a Wan diffusers checkpoint (its vae/ folder)")
    ap.add_argument("--height", type=int, default=240)
    ap.add_argument("--width", type=int, default=416)
    ap.add_argument("--variant", choices=VARIANTS, help="one variant in this process (default: each in its own)")
    ap.add_argument("--out", default="bench/results/wan_vae_schedule")
    a = ap.parse_args(argv)
    if a.variant is None:  # each variant patches modules: a fresh process apiece
        import subprocess

        rows = []
        for variant in VARIANTS:
            proc = subprocess.run([sys.executable, __file__, "--checkpoint", a.checkpoint, "--height", str(a.height),
                                   "--width", str(a.width), "--variant", variant], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"error: variant {variant} failed:\n{proc.stderr[-2000:]}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out + ".json").write_text(json.dumps(rows, indent=1) + "\n")
        table = ["| variant | replayed peak (GiB) | held at the end (GiB) | compile (s) |", "|---|---:|---:|---:|"]
        table += [f"| {r['variant']} | {r['peak_gib']} | {r['end_gib']} | {r['compile_s']} |" for r in rows]
        Path(a.out + ".md").write_text("\n".join(table) + "\n")
        print("\n".join(table))
        return 0
    import os

    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")  # a patched size model is not in its key
    from diffusers import AutoencoderKLWan

    from difflet.codegen.inductor import INDUCTOR_CONFIGS, aoti_package

    if a.variant == "slots-no-reorder":
        INDUCTOR_CONFIGS["reorder_for_peak_memory"] = False
    _patch_inductor(a.variant)
    vae = AutoencoderKLWan.from_pretrained(a.checkpoint, subfolder="vae", torch_dtype=torch.float32).eval()
    scale = 2 ** (len(vae.config.dim_mult) - 1) * (vae.config.patch_size or 1)  # pixels per latent side
    z_shape = (1, vae.config.z_dim, 1, a.height // scale, a.width // scale)
    module, caches = build(vae, a.variant, z_shape)
    start = time.perf_counter()
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        ep = torch.export.export(module, (torch.zeros(z_shape), *caches), strict=False)
        aoti_package(ep, Path(tmp) / "vae.pt2")
        seconds = time.perf_counter() - start
        result = replay(wrapper_lines(str(Path(tmp) / "vae.pt2")))
    print(json.dumps({"variant": a.variant, "peak_gib": round(result["peak"] / 2**30, 2),
                      "end_gib": round(result["end"] / 2**30, 2), "compile_s": round(seconds, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
