"""Text encoders' 4-D attention masks, built in the program by transformers' own mask functions.

Given a 2-D padding mask, transformers' models build their 4-D masks with `masking_utils`, which
first asks whether the mask can be skipped (`padding_mask.all()`, position-id packing checks):
a host read of a tensor value unless torch.export/dynamo is tracing. Under torch-xla's lazy
tracing (the path torch-neuronx takes) that read runs the graph so far and bakes its branch:
traced at `valid_text` = max_text, the program would leave out the mask for every shorter prompt
(bench/xla_check.py measured it). The wrappers therefore call the same mask functions with the
skip turned off and pass the finished 4-D mask (or per-layer-type masks), which the models take
as-is: the mask is the one torch.export already traced, now with no host read.

Invariant: the masks are exactly what `create_*_mask` builds for the model's attention
implementation and dtype; only the "skip when nothing is masked" shortcut is not taken.
"""
from __future__ import annotations

import torch

from difflet.errors import DiffletError


def _stub(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """What the mask functions read of inputs_embeds (batch, length, dtype, device), without data."""
    dtype = model.get_input_embeddings().weight.dtype
    return torch.empty(input_ids.shape[0], input_ids.shape[1], 0, dtype=dtype, device=input_ids.device)


def bidirectional_mask(model: torch.nn.Module, input_ids: torch.Tensor, keep: torch.Tensor):
    """The 4-D mask of an encoder over `keep` [B, L] (True = a real token)."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=model.config, inputs_embeds=_stub(model, input_ids),
                                     attention_mask=keep, allow_is_bidirectional_skip=False)


def causal_masks(model: torch.nn.Module, input_ids: torch.Tensor, keep: torch.Tensor | None, where=None):
    """The causal 4-D mask, or {layer type: mask} for a model with sliding-window layers, over the
    padding mask `keep` [B, L] (None: no padding)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    config = model.config.get_text_config()
    if getattr(config, "use_bidirectional_attention", False):
        raise DiffletError("text encoders with use_bidirectional_attention are not built", where=where)
    kwargs = {"config": config, "inputs_embeds": _stub(model, input_ids), "attention_mask": keep,
              "cache": None, "allow_is_causal_skip": False}
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types == {"full_attention"}:
        return create_causal_mask(**kwargs)
    build = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
    unknown = types - set(build)
    if unknown:
        raise DiffletError(f"text encoder layer types {sorted(unknown)} have no mask builder here", where=where)
    return {t: build[t](**kwargs) for t in sorted(types)}
