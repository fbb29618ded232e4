"""AutoencoderKLWan's causal decode as one fixed-size chunk program: one latent frame per call.

AutoencoderKLWan._decode runs its decoder once per latent frame, each causal conv reading a
feature cache of the previous frames (`feat_cache`: the last <= 2 input frames per conv, the
string "Rep" for a temporal upsampler that has seen only the first chunk). Here that cache is
explicit tensors, so the host loops over latent frames and the program has a static shape:

    (z [1, C, 1, h, w], first (runtime 0/1), cache0..) -> (sample [1, 3, T, H, W], next_cache0..)

`first` = 1 for latent frame 0: diffusers' first chunk (no cache, first_chunk=True), whose one
video frame is sample[:, :, 0] (the others are zeros) and whose cache inputs are not read;
otherwise a later chunk (T video frames: the VAE's temporal scale, 4 in Wan 2.1). Both paths
live in one program (torch.cond), so the decoder's weights are loaded once; on a target without
control flow (trn2) codegen builds one program per value instead (codegen/branches.py: `first`
fixed, left out of the signature).

Invariants:
- Every cache slot is two frames. Where diffusers holds fewer (one frame after the first chunk,
  "Rep"), the missing frames are zeros: a causal conv zero-pads exactly those frames, so
  cat([zeros, cache, x]) is the very tensor the reference convolves, and "Rep" (time_conv
  without cache, cache_x = [zeros, x]) is the two-zero-frame cache. Hence bit-faithful.
- Slots are grouped by spatial level (in order of first use) and concatenated over channels:
  IR input `cache<k>` / output `next_cache<k>` is level k, slots in decoder order.
- post_quant_conv (1x1x1) is applied per chunk, clamp(-1, 1) per output frame: both per frame;
  so is Wan 2.2's unpatchify (a pixel rearrangement within each frame).
"""
from __future__ import annotations

import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op, RuntimeType


def _run_decoder(vae, z: torch.Tensor, caches: list | None):
    """One diffusers decoder call on latent frame z; returns (frames, caches used, in order)."""
    feat_cache = list(caches) if caches is not None else [None] * vae._cached_conv_counts["decoder"]
    feat_idx = [0]
    out = vae.decoder(vae.post_quant_conv(z), feat_cache=feat_cache, feat_idx=feat_idx,
                      first_chunk=caches is None)
    if vae.config.patch_size is not None:  # Wan 2.2's VAE decodes patches: _decode unpatchifies
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        out = unpatchify(out, patch_size=vae.config.patch_size)
    return torch.clamp(out, min=-1.0, max=1.0), feat_cache[: feat_idx[0]]


def cache_layout(vae, z_shape: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(channels, height, width) of every cache slot in decoder order, from a shape-only run
    (fake tensors: no compute) of a first and a second chunk (a "Rep" slot gets its shape in
    the second)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
        param = next(vae.parameters())  # the model's device (meta works: shapes only)
        z = torch.zeros(z_shape, dtype=param.dtype, device=param.device)
        _, first = _run_decoder(vae, z, None)
        _, second = _run_decoder(vae, z, [c if isinstance(c, str) else _pad_two(c) for c in first])
    return [(c.shape[1], c.shape[3], c.shape[4]) for c in second]


def _pad_two(c: torch.Tensor) -> torch.Tensor:
    """A cache of < 2 frames as two frames, zeros first (what the causal conv would pad)."""
    if c.shape[2] >= 2:
        return c
    return torch.cat([torch.zeros_like(c[:, :, :1]).expand(-1, -1, 2 - c.shape[2], -1, -1), c], dim=2)


class WanChunkDecoder(torch.nn.Module):
    """The chunk program (see the module docstring); checks the IR's declarations at build."""

    def __init__(self, vae: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.vae = vae
        inputs = node.find(Op.INPUT)
        z_shape = tuple(inputs[0].results[0].type.shape)
        if len(z_shape) != 5 or z_shape[0] != 1 or z_shape[2] != 1:
            raise DiffletError(f"decoder input {inputs[0].name!r} must be one latent frame "
                               f"[1, C, 1, h, w], got {list(z_shape)}", where=inputs[0].loc)
        self.fixed = (node.attrs.get("branch") or {}).get("first")  # a branch program: `first` built in
        if self.fixed is None:
            flag = inputs[1] if len(inputs) > 1 else None
            if flag is None or flag.name != "first" or not isinstance(flag.results[0].type, RuntimeType) \
                    or (flag.results[0].type.lo, flag.results[0].type.hi) != (0, 1):
                raise DiffletError(f"decoder {node.name!r}: its second input must be `first`, a runtime "
                                   f"value in [0, 1] (1 for latent frame 0)", where=(flag or node).loc)
            inputs = [inputs[0], *inputs[2:]]
        self.chunk_frames = node.find(Op.OUTPUT)[0].results[0].type.shape[2]  # a later chunk's frames
        self.slots = cache_layout(vae, z_shape)
        levels: list[tuple[int, int]] = []
        for _, h, w in self.slots:
            if (h, w) not in levels:
                levels.append((h, w))
        self.level_of = [levels.index((h, w)) for _, h, w in self.slots]
        want = [[1, sum(c for (c, *_), lv in zip(self.slots, self.level_of) if lv == k), 2, h, w]
                for k, (h, w) in enumerate(levels)]
        declared = [("input", n) for n in inputs[1:]] + [("output", n) for n in node.find(Op.OUTPUT)[1:]]
        if len(declared) != 2 * len(want):
            raise DiffletError(f"decoder {node.name!r} must declare {len(want)} cache levels in and "
                               f"out (the model's causal caches: {want}), it declares "
                               f"{len(declared)} cache tensors", where=node.loc)
        dtype = node.attrs.get("dtype", "float32")  # caches carry the decoder's activations
        for i, (kind, decl) in enumerate(declared):
            have, level = decl.results[0].type, i % len(want)
            if list(have.shape) != want[level] or have.dtype != dtype:
                raise DiffletError(f"decoder {node.name!r} {kind} {decl.name!r} must be "
                                   f"{dtype}{want[level]} (the model's causal caches at level "
                                   f"{level}), got {have.dtype}{list(have.shape)}", where=decl.loc)

    def _split(self, levels: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        parts = [list(t.split([c for (c, *_), lv in zip(self.slots, self.level_of) if lv == k], dim=1))
                 for k, t in enumerate(levels)]
        return [parts[lv].pop(0) for lv in self.level_of]

    def _join(self, frames: torch.Tensor, caches: list) -> tuple[torch.Tensor, ...]:
        n = max(self.level_of) + 1
        joined = [torch.cat([c for c, lv in zip(caches, self.level_of) if lv == k], dim=1)
                  for k in range(n)]
        return tuple(t.contiguous() for t in (frames, *joined))  # both cond branches alike

    def _first(self, z: torch.Tensor, *levels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        frames, caches = _run_decoder(self.vae, z, None)
        caches = [torch.zeros(1, c, 2, h, w, dtype=z.dtype, device=z.device) if isinstance(x, str)
                  else _pad_two(x) for x, (c, h, w) in zip(caches, self.slots)]
        pad = torch.zeros_like(frames).expand(-1, -1, self.chunk_frames - 1, -1, -1)  # static frame count
        return self._join(torch.cat([frames, pad], dim=2), caches)

    def _later(self, z: torch.Tensor, *levels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        frames, caches = _run_decoder(self.vae, z, self._split(levels))
        return self._join(frames, caches)

    def forward(self, z: torch.Tensor, *rest: torch.Tensor):
        """(z, first, *levels), or (z, *levels) in a branch program (`first` fixed at build)."""
        if self.fixed is not None:
            return (self._first if self.fixed else self._later)(z, *rest)
        first, *levels = rest
        return torch.cond(first > 0, self._first, self._later, (z, *levels))
