"""What a family's programs.py declares about one diffusers/transformers class, as data (a leaf:
generic codegen reads declarations through codegen/declarations.py).

Invariants:
- Torch-free: a declaration holds names, tuples and callables; the callables import torch
  (and the family's own modules) only when called.
- A class is declared once, by the family that owns it (`CLASSES` in its programs.py); generic
  codegen reads them through `declarations.declaration(cls)` and never names a class or a family.
- Whether codegen *builds* a class's split or probe program is decided on the passes side
  (difflet/passes/built.py, from the families' facts); `split` and `probe` here say only how,
  and exist exactly for the classes built.py lists (tests/test_passes_built.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class SplitDecl:
    """How a denoiser's split program is built (difflet/codegen/split_layout.py reads it).

    visual_inputs / visual_outputs: IR input/output name -> its token dimension (the rank slices
    its CP shard of those inputs and all-gathers those outputs); sp_entries: modules whose output
    becomes an SP token shard; joint_prefixes: module prefixes whose linears see the joint
    [text, visual] sequence; processor(text_len, text_first, mode, group): the split attention
    processor installed at every layout attention site.

    A class whose IR visual input is not a token sequence (a video latent that the model patches
    itself) shards inside the model instead, as diffusers' own `_cp_plan` does; then
    visual_inputs/outputs are empty and: stream_entries: module path -> token dim of its first
    positional input, the full visual stream, which becomes this rank's shard (its CP chunk,
    then with SP its TP chunk of that); stream_exits: module path -> token dim of its output, this
    rank's shard, gathered back to every token (TP with SP, then CP); cp_tables: module path ->
    token dim of its per-visual-token output tables read inside attention after the SP gather
    (RoPE), cut to this rank's CP chunk; stream_inputs: IR input name -> its token dim, one value
    per visual token cut as the stream is (CP chunk, then SP's TP chunk) when the input has that
    dim (Wan 2.2 TI2V's t per token [B, S]), left whole when not (the one t [B]), as diffusers'
    `_cp_plan` entries with `expected_dims` do.

    A class with a second token stream that CP leaves replicated (LTX-2's audio) declares:
    sp_outputs: IR output name -> token dim of that stream's output (with SP this rank's TP token
    shard, gathered over tp only; never over cp); head_tables: module path -> head dim of its
    per-head output tables (split RoPE [B, H, T, r]), cut to this rank's TP shard of heads.
    """

    visual_inputs: Mapping[str, int]
    visual_outputs: Mapping[str, int]
    sp_entries: tuple[str, ...]
    joint_prefixes: tuple[str, ...]
    processor: Callable[..., Any]
    stream_entries: Mapping[str, int] = field(default_factory=dict)
    stream_exits: Mapping[str, int] = field(default_factory=dict)
    cp_tables: Mapping[str, int] = field(default_factory=dict)
    stream_inputs: Mapping[str, int] = field(default_factory=dict)
    sp_inputs: Mapping[str, int] = field(default_factory=dict)
    sp_outputs: Mapping[str, int] = field(default_factory=dict)
    head_tables: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeDecl:
    """How the step-caching probe of a denoiser is built (difflet/codegen/probe.py reads it).

    inputs: the denoiser inputs the probe computation reads, in the order forward takes them;
    build(model, feature_shape, inputs) -> torch module with a `prev_feature` buffer, STATE,
    OUTPUTS, `compute(*inputs) -> (score, feature)` and `forward` updating the buffer in place.
    """

    inputs: tuple[str, ...]
    build: Callable[..., Any]


@dataclass(frozen=True)
class BlockDecl:
    """How a denoiser is cut into block mode's front and rest (difflet/codegen/blocks.py reads it).

    stacks: the model's block ModuleLists in call order (their blocks are the denoiser's N
    blocks); outputs: the names of the streams a block returns, in its return order (each is
    also the name of the block forward's argument that takes it); tail: the streams the output
    layers read after the last block (their residuals cross between the programs).
    """

    stacks: tuple[str, ...]
    outputs: tuple[str, ...]
    tail: tuple[str, ...]


@dataclass(frozen=True)
class ClassDecl:
    """Everything Difflet adds to one class; every field is optional (None = generic path).

    processor(text_len, text_first): world-1 attention processor for the IR's joint attention
    sites (a class attribute `prepare_model(model, node)` adapts the model once installed);
    wrapper(model, node): the program module when the generic ProgramModule cannot adapt the
    class to the IR calling convention; build_random(comp, config): a random model for a
    materialized checkpoint; write_tokenizer(comp, config, tokenizer_attrs, dest): the tiny
    tokenizer of a materialized checkpoint; write_extras(comp, config, dest) -> model_index.json
    entries: checkpoint folders a materialized checkpoint adds beside the component (an image
    processor), which may name the pipeline class (`_class_name`) the class implies;
    host_folders: checkpoint folders the host steps read beside this component (copied into the
    artifact's host/ as tokenizers are); split / probe: see SplitDecl / ProbeDecl;
    branch_inputs: runtime inputs the wrapper branches on (torch.cond) unless the node fixes
    them in `attrs.branch` (codegen/branches.py: one program per value where the target has no
    control flow).
    """

    processor: Callable[..., Any] | None = None
    wrapper: Callable[..., Any] | None = None
    build_random: Callable[..., Any] | None = None
    write_tokenizer: Callable[..., Any] | None = None
    write_extras: Callable[..., Any] | None = None
    host_folders: tuple[str, ...] = ()
    split: SplitDecl | None = None
    probe: ProbeDecl | None = None
    blocks: BlockDecl | None = None
    branch_inputs: tuple[str, ...] = ()


NONE = ClassDecl()  # an undeclared class: every hook takes the generic path

