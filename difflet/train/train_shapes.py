"""Train the flux-shapes model from scratch: `python -m difflet.train.train_shapes --out DIR`.

Stages, each resumable from `DIR/state_<stage>.pt` (written atomically every `--save-every`
steps and when `--stop-at` is reached):
1. vae     AutoencoderKL, 2x downsampling (32x32x3 -> 16x16x4), MSE + tiny KL;
2. latents encode a fixed set of procedural images once (posterior mean) and fix the latent
           scaling/shift so the denoiser sees unit-variance latents;
3. dit     FluxTransformer2DModel + both text encoders, rectified flow (x_t = (1-s) x0 + s e,
           target e - x0, exactly what FlowMatchEulerDiscreteScheduler integrates), caption
           dropout (so true CFG is available), EMA of the weights;
4. save    the EMA weights as a stock diffusers FluxPipeline in DIR/pipeline (safetensors).

Invariants: every random draw comes from a generator seeded by (seed, stage, step), so a
resumed run draws the same batches as an uninterrupted one; tokenization in training goes
through the very tokenizers that are saved with the pipeline, at the same padded lengths
(`CLIP_LEN`, `MAX_TEXT`) the pipeline must be called with.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from difflet.train import shapes_data as D
from difflet.train import (CLIP_LEN, MAX_TEXT, TRAIN, build_models, build_scheduler, load_tokenizers,
                           write_tokenizers)


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


def _save(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-write never leaves a torn checkpoint


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup then cosine decay to 10% of peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def _loop(name, out, params, total, peak, warmup, step_fn, state_extra, load_extra, args):
    """Shared resumable optimisation loop; `step_fn(step)` returns the scalar loss."""
    opt = torch.optim.AdamW(params, lr=peak, weight_decay=0.0)
    path, step = out / f"state_{name}.pt", 0
    if path.exists():
        st = torch.load(path, weights_only=False)
        opt.load_state_dict(st["opt"])
        load_extra(st)
        step = st["step"]
        torch.set_rng_state(st["torch_rng"])  # T5 dropout draws from the global generator
        log(f"{name}: resumed at step {step}")
    t0, ema_loss = time.time(), None

    def save():
        _save(path, {"opt": opt.state_dict(), "step": step, "torch_rng": torch.get_rng_state(),
                     **state_extra()})

    while step < total:
        for g in opt.param_groups:
            g["lr"] = _lr(step, total, peak, warmup)
        loss = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        ema_loss = loss.item() if ema_loss is None else 0.98 * ema_loss + 0.02 * loss.item()
        if getattr(step_fn, "after", None):
            step_fn.after(step)
        if step % args.log_every == 0 or step == total:
            log(f"{name} step {step}/{total} loss {ema_loss:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{time.time() - t0:.0f}s this run")
        if step % args.save_every == 0 or step == total:
            save()
        if args.stop_at and datetime.datetime.now().strftime("%H:%M") >= args.stop_at and step < total:
            save()
            log(f"{name}: stopped at step {step} (--stop-at {args.stop_at}); rerun to resume")
            sys.exit(3)


def train_vae(vae, out: Path, args) -> None:
    cfg = TRAIN["vae"]

    def step_fn(step):
        rng = np.random.default_rng([args.seed, 1, step])
        x = D.to_tensor(D.sample(rng, cfg["batch"])[0])
        post = vae.encode(x).latent_dist
        gen = torch.Generator().manual_seed(args.seed * 7919 + step)
        z = post.mean + post.std * torch.randn(post.mean.shape, generator=gen)
        rec = vae.decode(z).sample
        return (rec - x).pow(2).mean() + cfg["kl"] * post.kl().mean()

    vae.train()
    _loop("vae", out, list(vae.parameters()), cfg["steps"] if args.vae_steps is None else args.vae_steps,
          cfg["lr"], cfg["warmup"], step_fn, lambda: {"vae": vae.state_dict()},
          lambda st: vae.load_state_dict(st["vae"]), args)
    vae.eval()
    log(f"vae: held-out reconstruction PSNR {vae_psnr(vae, args.seed):.2f} dB")


@torch.no_grad()
def vae_psnr(vae, seed: int, n: int = 256) -> float:
    """PSNR (peak = the [-1, 1] range) of posterior-mean reconstructions of unseen images."""
    x = D.to_tensor(D.sample(np.random.default_rng([seed, 9]), n)[0])
    mse = (vae.decode(vae.encode(x).latent_dist.mean).sample.clamp(-1, 1) - x).pow(2).mean().item()
    return 10 * math.log10(4.0 / mse)


@torch.no_grad()
def make_latents(vae, out: Path, args) -> dict:
    """Fixed training set of packed, normalised latents with caption indices (cached on disk)."""
    path = out / "latents.pt"
    if path.exists():
        return torch.load(path)
    from diffusers import FluxPipeline

    n, rng, lat, caps = TRAIN["dit"]["dataset"], np.random.default_rng([args.seed, 2]), [], []
    index = {c: i for i, c in enumerate(D.CAPTIONS)}
    for lo in range(0, n, 250):
        imgs, specs = D.sample(rng, min(250, n - lo))
        lat.append(vae.encode(D.to_tensor(imgs)).latent_dist.mean)
        caps += [index[(s.shape, s.fg, s.bg)] for s in specs]
    lat = torch.cat(lat)
    shift, scale = lat.mean().item(), 1.0 / lat.std().item()
    vae.register_to_config(shift_factor=round(shift, 4), scaling_factor=round(scale, 4))
    z = (lat - vae.config.shift_factor) * vae.config.scaling_factor  # what the pipeline inverts
    b, c, h, w = z.shape
    packed = FluxPipeline._pack_latents(z, b, c, h, w)
    data = {"latents": packed, "captions": torch.tensor(caps), "shift": vae.config.shift_factor,
            "scale": vae.config.scaling_factor, "hw": (h, w)}
    _save(path, data)
    log(f"latents: {n} images -> {tuple(packed.shape)}, shift {shift:.4f} scale {scale:.4f}")
    return data


def tokenize_captions(tok, tok2) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of every caption (rows 0..len-1) and of the empty prompt (last row)."""
    texts = [D.caption(*c) for c in D.CAPTIONS] + [""]
    ids = tok(texts, padding="max_length", max_length=CLIP_LEN, truncation=True,
              return_tensors="pt").input_ids
    ids2 = tok2(texts, padding="max_length", max_length=MAX_TEXT, truncation=True,
                return_tensors="pt").input_ids
    return ids, ids2


def train_dit(models: dict, data: dict, tok, tok2, out: Path, args) -> dict:
    """Trains transformer + text encoders; returns their EMA copies."""
    from diffusers import FluxPipeline

    cfg = TRAIN["dit"]
    live = {k: models[k] for k in ("transformer", "text_encoder", "text_encoder_2")}
    ema = {k: copy.deepcopy(m).eval().requires_grad_(False) for k, m in live.items()}
    ids, ids2 = tokenize_captions(tok, tok2)
    h, w = data["hw"]
    img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(MAX_TEXT, 3)  # what FluxPipeline.encode_prompt passes
    lat, caps, n = data["latents"], data["captions"], data["latents"].shape[0]
    empty = ids.shape[0] - 1

    def step_fn(step):
        gen = torch.Generator().manual_seed(args.seed * 104729 + step)
        idx = torch.randint(n, (cfg["batch"],), generator=gen)
        x0, c = lat[idx], caps[idx].clone()
        c[torch.rand(len(c), generator=gen) < cfg["cond_drop"]] = empty
        e = torch.randn(x0.shape, generator=gen)
        # logit-normal sigmas: most weight mid-trajectory, where layout and shape are decided
        s = torch.sigmoid(torch.randn(len(c), generator=gen) * cfg["sigma_std"] + cfg["sigma_mean"])
        # ...mixed with uniform ones so the near-pure-noise first sampling steps are trained too
        uni = torch.rand(len(c), generator=gen) < cfg["sigma_uniform"]
        s = torch.where(uni, torch.rand(len(c), generator=gen), s)
        xt = (1 - s[:, None, None]) * x0 + s[:, None, None] * e
        pooled = live["text_encoder"](ids[c]).pooler_output
        text = live["text_encoder_2"](ids2[c]).last_hidden_state
        v = live["transformer"](hidden_states=xt, encoder_hidden_states=text, pooled_projections=pooled,
                                timestep=s, img_ids=img_ids, txt_ids=txt_ids, guidance=None,
                                return_dict=False)[0]
        return (v - (e - x0)).pow(2).mean()

    @torch.no_grad()
    def after(step):
        d = min(cfg["ema"], (1 + step) / (10 + step))  # short warmup so early EMA is not stale init
        for k in live:
            for pe, p in zip(ema[k].parameters(), live[k].parameters()):
                pe.lerp_(p, 1 - d)

    step_fn.after = after

    def extra():
        return {"live": {k: m.state_dict() for k, m in live.items()},
                "ema": {k: m.state_dict() for k, m in ema.items()}}

    def load(st):
        for k in live:
            live[k].load_state_dict(st["live"][k])
            ema[k].load_state_dict(st["ema"][k])

    for m in live.values():
        m.train()
    params = [p for m in live.values() for p in m.parameters()]
    _loop("dit", out, params, cfg["steps"] if args.dit_steps is None else args.dit_steps, cfg["lr"],
          cfg["warmup"], step_fn, extra, load, args)
    return ema


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vae-steps", type=int, default=None, help="override (quick experiments)")
    ap.add_argument("--dit-steps", type=int, default=None, help="override (quick experiments)")
    ap.add_argument("--stop-at", default=None, help="HH:MM wall clock: save and exit (code 3) then")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pipeline-dir", type=Path, default=None,
                    help="where to save the pipeline (default OUT/pipeline); with --dit-steps 0 this "
                         "exports the current checkpoint's EMA weights without training")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)  # the machine is shared: one core per training process
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    torch.manual_seed(args.seed)  # initial weights
    models = build_models()
    write_tokenizers(args.out / "tokenizers")
    tok, tok2 = load_tokenizers(args.out / "tokenizers")
    vae_done = args.out / "vae_done.pt"
    if vae_done.exists():
        models["vae"].load_state_dict(torch.load(vae_done))
    else:
        train_vae(models["vae"], args.out, args)
        _save(vae_done, models["vae"].state_dict())
    models["vae"].eval().requires_grad_(False)
    data = make_latents(models["vae"], args.out, args)
    models["vae"].register_to_config(shift_factor=data["shift"], scaling_factor=data["scale"])
    ema = train_dit(models, data, tok, tok2, args.out, args)
    from diffusers import FluxPipeline

    pipe = FluxPipeline(scheduler=build_scheduler(), vae=models["vae"], text_encoder=ema["text_encoder"],
                        tokenizer=tok, text_encoder_2=ema["text_encoder_2"], tokenizer_2=tok2,
                        transformer=ema["transformer"])
    dest = args.pipeline_dir or args.out / "pipeline"
    pipe.save_pretrained(str(dest), safe_serialization=True)
    log(f"saved {dest} ({time.time() - t0:.0f}s this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
