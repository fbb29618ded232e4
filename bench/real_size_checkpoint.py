"""Write a random-weight Wan2.1-T2V-1.3B checkpoint in diffusers format (sharded safetensors; the
transformer and UMT5-XXL in bf16, the VAE in fp32 as the published checkpoint has it) without ever
holding a model or an fp32 copy: each model is built on the meta device, and its tensors are made,
initialized and written shard by shard (peak memory: about one shard).

Test data for bench/real_size.py (issue 34), not a product feature. The configs are the published
ones (../shared/models.md; diffusers' scripts/convert_wan_to_diffusers.py "Wan-T2V-1.3B"): the
transformer 12 heads x 128, 30 layers, ffn 8960; UMT5-XXL and AutoencoderKLWan as models/wan2.1.dsl
states them. Weights: each tensor by its module's own PyTorch init (Linear, Conv, Embedding, norms:
`reset_parameters`), a norm's other scales 1, other parameters N(0, 1/last_dim) (diffusers' own
init of Wan's scale-shift tables) and biases 0; persistent buffers as the constructor makes them.

    python bench/real_size_checkpoint.py --out /data/wan2.1-1.3b-random [--seed 0] [--tiny]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

SHARD_BYTES = 2 << 30  # 2 GiB shards: the transformer (2.8 GB) is sharded too

UMT5_XXL = {"vocab_size": 256384, "d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_layers": 24,
            "num_heads": 64, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
            "feed_forward_proj": "gated-gelu", "layer_norm_epsilon": 1e-6, "dropout_rate": 0.1,
            "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
WAN_1_3B = {"patch_size": [1, 2, 2], "num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 16,
            "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 8960, "num_layers": 30,
            "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "image_dim": None,
            "added_kv_proj_dim": None, "rope_max_seq_len": 1024}
WAN_VAE = {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
           "temperal_downsample": [False, True, True], "dropout": 0.0,
           "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                            0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
           "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                           3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916]}
SCHEDULER = {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0,
             "solver_order": 2, "solver_type": "bh2", "num_train_timesteps": 1000}
# (subfolder, library, class, config, dtype)
COMPONENTS = (("text_encoder", "transformers", "UMT5EncoderModel", UMT5_XXL, torch.bfloat16),
              ("transformer", "diffusers", "WanTransformer3DModel", WAN_1_3B, torch.bfloat16),
              ("vae", "diffusers", "AutoencoderKLWan", WAN_VAE, torch.float32))
# --tiny: the same code path at toy widths (tests/test_real_size_checkpoint.py loads it back)
TINY = {"text_encoder": {"vocab_size": 64, "d_model": 32, "d_ff": 64, "d_kv": 8, "num_layers": 2, "num_heads": 4},
        "transformer": {"num_attention_heads": 2, "attention_head_dim": 8, "text_dim": 32, "freq_dim": 16,
                        "ffn_dim": 32, "num_layers": 2},
        "vae": {"base_dim": 8, "num_res_blocks": 1}}
MAX_TEXT = 512


def meta_model(library: str, cls_name: str, config: dict, dtype: torch.dtype) -> torch.nn.Module:
    """The model with every parameter on the meta device in `dtype` (buffers real: the constructor's)."""
    from accelerate import init_empty_weights

    lib = __import__(library)
    cls = getattr(lib, cls_name)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # meta parameters in the stored dtype: nothing is ever made in fp32
    try:
        with init_empty_weights(include_buffers=False):
            return cls(cls.config_class(**config)) if library == "transformers" else cls.from_config(config)
    finally:
        torch.set_default_dtype(before)


def _initialized(module: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The module's own parameters, made on the CPU and initialized (the module keeps its meta ones)."""
    own = dict(module.named_parameters(recurse=False))
    if not own:
        return {}
    if hasattr(module, "reset_parameters") and type(module).__module__.startswith("torch.nn"):
        module.to_empty(device="cpu", recurse=False)
        module.reset_parameters()
        made = {n: p.detach().to(dtype) for n, p in module.named_parameters(recurse=False)}
        for name, meta in own.items():  # give the tensors back to the writer only
            module._parameters[name] = meta
        return made
    made = {}
    norm = "norm" in type(module).__name__.lower()
    for name, meta in own.items():
        t = torch.empty(meta.shape, dtype=dtype)
        if name.endswith("bias"):
            t.zero_()
        elif norm or name in ("gamma", "scale"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, meta.shape[-1] ** -0.5)
        made[name] = t
    return made


def _tied(model: torch.nn.Module) -> set[str]:
    """Keys the loader ties to another (UMT5's encoder.embed_tokens -> shared): stored once, as
    save_pretrained stores them."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied)


def _entries(model: torch.nn.Module, dtype: torch.dtype):
    """(key, module, name, bytes) of every tensor the checkpoint stores, in writing order."""
    tied = _tied(model)
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        for name, p in module.named_parameters(recurse=False):
            if dot + name not in tied:
                yield dot + name, module, name, p.numel() * dtype.itemsize
        for name, b in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set and dot + name not in tied:
                yield dot + name, module, name, b.numel() * b.element_size()


def _tensors(model: torch.nn.Module, dtype: torch.dtype):
    """(key, tensor) in _entries' order, each module's parameters made when it is reached."""
    made: dict[str, torch.Tensor] = {}
    last = None
    for key, module, name, _ in _entries(model, dtype):
        if module is not last:
            made, last = _initialized(module, dtype), module
        yield key, (made[name] if name in made else module._buffers[name].detach()).contiguous()


def _plan(model: torch.nn.Module, dtype: torch.dtype) -> list[int]:
    """Shard index of each tensor _tensors yields, filling shards up to SHARD_BYTES in order."""
    shard, used, plan = 0, 0, []
    for *_, size in _entries(model, dtype):
        if used and used + size > SHARD_BYTES:
            shard, used = shard + 1, 0
        used += size
        plan.append(shard)
    return plan


def write_weights(model: torch.nn.Module, dtype: torch.dtype, dest: Path, stem: str) -> dict:
    """Sharded safetensors under `dest` named as save_pretrained names them; returns sizes."""
    from safetensors.torch import save_file

    plan = _plan(model, dtype)
    count = plan[-1] + 1
    name = (lambda i: f"{stem}-{i + 1:05d}-of-{count:05d}.safetensors") if count > 1 else (lambda i: f"{stem}.safetensors")
    weight_map, total, pending, current = {}, 0, {}, 0
    for (key, tensor), shard in zip(_tensors(model, dtype), plan, strict=True):
        if shard != current:
            save_file(pending, str(dest / name(current)), metadata={"format": "pt"})
            pending, current = {}, shard
        pending[key] = tensor
        weight_map[key] = name(shard)
        total += tensor.numel() * tensor.element_size()
    save_file(pending, str(dest / name(current)), metadata={"format": "pt"})
    if count > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (dest / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return {"bytes": total, "shards": count, "tensors": len(weight_map)}


def write_component(sub: str, library: str, cls_name: str, config: dict, dtype: torch.dtype,
                    out: Path, seed: int) -> dict:
    dest = out / sub
    dest.mkdir(parents=True, exist_ok=True)
    model = meta_model(library, cls_name, config, dtype)
    torch.manual_seed(seed)
    if library == "transformers":
        model.config.dtype = dtype
        model.config.save_pretrained(str(dest))
        stats = write_weights(model, dtype, dest, "model")
    else:
        model.register_to_config(_diffusers_version=__import__("diffusers").__version__)
        model.save_config(str(dest))
        stats = write_weights(model, dtype, dest, "diffusion_pytorch_model")
    return stats


def write_checkpoint(out: Path, seed: int = 0, tiny: bool = False) -> dict:
    import diffusers

    from difflet.codegen.tiny_tokenizers import special_ids, word_level_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    stats = {}
    for i, (sub, library, cls_name, config, dtype) in enumerate(COMPONENTS):
        config = {**config, **(TINY[sub] if tiny else {})}
        start = time.perf_counter()
        stats[sub] = write_component(sub, library, cls_name, config, dtype, out, seed * 1000 + i)
        stats[sub]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{sub}: {stats[sub]}", file=sys.stderr)
        if sub == "text_encoder":
            word_level_tokenizer(config["vocab_size"], special_ids(config), clip_style=False,
                                 max_length=MAX_TEXT, dest=out / "tokenizer")
    diffusers.UniPCMultistepScheduler(**SCHEDULER).save_pretrained(str(out / "scheduler"))
    index = {"_class_name": "WanPipeline", "_diffusers_version": diffusers.__version__,
             "boundary_ratio": None, "expand_timesteps": False,
             "scheduler": ["diffusers", "UniPCMultistepScheduler"],
             "text_encoder": ["transformers", "UMT5EncoderModel"],
             "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
             "transformer": ["diffusers", "WanTransformer3DModel"], "transformer_2": [None, None],
             "vae": ["diffusers", "AutoencoderKLWan"]}
    (out / "model_index.json").write_text(json.dumps(index, indent=2))
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="toy widths, same code path (for tests)")
    args = ap.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        ap.error(f"--out {args.out} exists and is not empty")
    print(json.dumps(write_checkpoint(args.out, args.seed, args.tiny), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
