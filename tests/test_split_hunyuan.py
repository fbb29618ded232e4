"""Split HunyuanVideo tiny denoisers on real gloo ranks equal the UNSPLIT diffusers
HunyuanVideoTransformer3DModel at every valid text length.

Every layout `--list-legal --target cpu` calls legal at 2 and 4 ranks (cfg needs two guidance
passes, which this model does not run) is built
per rank by codegen's split_layout (presharded ParallelLinears, SP regions with the single-stream
blocks' joint [visual, text] token segments, the visual stream sharded inside the model at
transformer_blocks.0 / rope / proj_out, the SP text at transformer_blocks.0's input, CP joint
attention with the runtime bound via families/hunyuan_video/attention.py's processor; the token refiner
replicated) from one random:0 checkpoint:
- hunyuan-video-tiny (2 heads): tp2, tp2+sp, cp2 x {ulysses, ring, gather_kv}; tp2cp2 and
  tp2cp2+sp x {ring, gather_kv}, cp4 x {ring, gather_kv} (Ulysses at 4 ranks and tp4 need 4 heads);
- hunyuan-video-tiny4 (4 heads): tp4, tp4+sp, tp2cp2, tp2cp2+sp and cp4 x {ulysses, ring, gather_kv};
- the 4-rank dp layouts (dp2xtp2, dp2xtp2+sp, dp2xtp1cp2 x {ulysses, ring, gather_kv}) as codegen
  builds them: one replica's 2 ranks (split_codegen.degrees leaves dp out).
They run EAGERLY (the rank modules without AOT compile, same code as the programs) from one
program build per layout at every valid_text; one layout, hunyuan-video-tiny tp1cp2 ulysses, is
also compiled with AOTInductor through codegen (the same rank programs `difflet demo --parallel`
serves in test_e2e_parallel_videos, so the store compiles them once), loaded as a SplitProgram and served by
ModelRunner against the TP1 video.

The oracle is diffusers itself with the pipeline's encoder_attention_mask (right padding,
arange(T) < valid_text); the text rows from valid_text on are random, and replacing them with
other random rows must change no split output.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difflet.parallel.launch import run_ranks
from oracle_util import check_served_like_tp1, check_split_outputs, compile_art

pytestmark = pytest.mark.slow  # compiles whole split / bucketed / bf16 models: full suite only

MODELS = Path(__file__).resolve().parent.parent / "models"
DSL = {"tiny": MODELS / "hunyuan-video-tiny.dsl", "tiny4": MODELS / "hunyuan-video-tiny4.dsl"}
T = 16
TOKENS = 32  # visual tokens: 5 frames -> 2 latent frames, x (32 px / 4 / patch 2)^2
VALID = (1, 3, 7, 12, 16)  # >= 5 valid text lengths from 1 to max_text
PAD_VALID = 7  # the swept length at which the padding rows are redrawn
TWO = [("tiny", "tp2", None), ("tiny", "tp2+sp", None), ("tiny", "cp2", "ulysses"), ("tiny", "cp2", "ring"),
       ("tiny", "cp2", "gather_kv")] + \
      [("tiny", "dp2xtp2", None), ("tiny", "dp2xtp2+sp", None)] + \
      [("tiny", "dp2xtp1cp2", a) for a in ("ulysses", "ring", "gather_kv")]  # one dp replica: 2 ranks
FOUR = [("tiny", p, a) for p in ("tp2cp2", "tp2cp2+sp", "cp4") for a in ("ring", "gather_kv")] + \
       [("tiny4", "tp4", None), ("tiny4", "tp4+sp", None)] + \
       [("tiny4", p, a) for p in ("tp2cp2", "tp2cp2+sp", "cp4") for a in ("ulysses", "ring", "gather_kv")]
BF16 = ("tiny4", "tp2cp2+sp", "ulysses")
COMPILED = ("tiny", "tp1cp2", "ulysses")  # the demo test's layout: one compile for both
TOL = 1e-4


def _plan(model, parallel, attention):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(DSL[model])), parallel=parallel, attention=attention, target="cpu")


def _inputs(node, valid, pad_seed=None):
    """The program's inputs (IR order, valid_text last) at `valid`; pad_seed redraws text rows >= valid."""
    from difflet.codegen.build import example_inputs

    x = list(example_inputs(node))
    if pad_seed is not None:
        enc = x[2].clone()
        enc[:, valid:] = torch.randn(enc[:, valid:].shape, generator=torch.Generator().manual_seed(pad_seed))
        x[2] = enc
    x[-1] = torch.tensor(valid, dtype=torch.int64)
    return tuple(x)


def _diffusers(ref, x):
    """The unsplit diffusers module on the program inputs, with the pipeline's text mask."""
    hidden, timestep, text, pooled, guidance, valid = x
    mask = (torch.arange(text.shape[1]) < valid).to(text.dtype)[None].expand(text.shape[0], -1)
    return ref(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text, encoder_attention_mask=mask,
               pooled_projections=pooled, guidance=guidance, return_dict=False)[0]


def _sweep_body(rank, world, configs, ckpts, valids, bf16):
    """On this rank: every config's split output at every valid length, with other padding at
    PAD_VALID, and one bf16 run; what each rank really holds."""
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups

    out = {}
    for cfg in configs:
        model, parallel, attention = cfg
        node = _plan(model, parallel, attention).component("transformer")
        pm = build_rank_module(node, ckpts[model], make_groups(degrees(node)))
        seen = {}  # tokens entering the single-stream block and the dual block's q features
        pm.model.single_transformer_blocks[0].register_forward_pre_hook(
            lambda _m, a: seen.update(tokens=a[0].shape[1], text=a[1].shape[1]))
        seen["q_features"] = pm.model.transformer_blocks[0].attn.to_q.weight.shape[0]
        with torch.no_grad():
            out[cfg] = [pm(*_inputs(node, v))[0] for v in valids]
            out["pad", cfg] = pm(*_inputs(node, PAD_VALID, pad_seed=9))[0]
            if cfg == bf16:
                pm = pm.to(torch.bfloat16)
                x = [t.to(torch.bfloat16) if t.is_floating_point() else t for t in _inputs(node, T)]
                out["bf16"] = pm(*x)[0].float()
        out["seen", cfg] = seen
    return out


@pytest.fixture(scope="module")
def hunyuan(difflet_test_store):
    """model -> (checkpoint, diffusers reference, oracle outputs per valid length)."""
    import diffusers

    from difflet.codegen.checkpoint import resolve_weights

    found = {}
    for model in DSL:
        module = _plan(model, "tp1", None)
        ckpt = resolve_weights(module, "random:0", difflet_test_store)
        ref = diffusers.HunyuanVideoTransformer3DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
        node = module.component("transformer")
        with torch.no_grad():
            oracle = {v: _diffusers(ref, _inputs(node, v)) for v in VALID}
        found[model] = (ckpt, ref, oracle)
    return found


@pytest.fixture(scope="module")
def sweep(hunyuan):
    ckpts = {m: str(c[0]) for m, c in hunyuan.items()}
    ranks4 = run_ranks(_sweep_body, 4, FOUR, ckpts, VALID, BF16, timeout=900)
    ranks2 = run_ranks(_sweep_body, 2, TWO, ckpts, VALID, None, timeout=600)
    return ranks4, ranks2


def _ranks(sweep, cfg):
    return sweep[1] if cfg in TWO else sweep[0]


def _check(got, oracle, what):
    return check_split_outputs(got, oracle, VALID, TOL, what)


@pytest.mark.parametrize("model,parallel,attention", TWO + FOUR)
def test_split_equals_unsplit_diffusers_at_every_valid_text(sweep, hunyuan, model, parallel, attention):
    for r, got in enumerate(_ranks(sweep, (model, parallel, attention))):
        _check(got[model, parallel, attention], hunyuan[model][2], f"{model} {parallel} {attention} rank {r}")


@pytest.mark.parametrize("model,parallel,attention", TWO + FOUR)
def test_padding_contents_change_nothing(sweep, model, parallel, attention):
    """Other random text rows from valid_text on (through the refiner, then masked keys) give the
    bitwise same split output."""
    cfg = (model, parallel, attention)
    for got in _ranks(sweep, cfg):
        assert torch.equal(got["pad", cfg], got[cfg][VALID.index(PAD_VALID)])


@pytest.mark.parametrize("model,parallel,attention", TWO + FOUR)
def test_each_rank_holds_only_its_shard(sweep, hunyuan, model, parallel, attention):
    """Equality alone would also hold for a rank that silently ran the whole model."""
    from difflet.passes.parallel_config import parse_parallel

    pc = parse_parallel(parallel)
    ref = hunyuan[model][1]
    sp = pc.tp if pc.sp else 1
    for got in _ranks(sweep, (model, parallel, attention)):
        seen = got["seen", (model, parallel, attention)]
        assert seen["tokens"] == TOKENS // pc.cp // sp and seen["text"] == T // sp
        assert seen["q_features"] == ref.transformer_blocks[0].attn.to_q.out_features // pc.tp


def test_bf16_split_cosine_to_unsplit_bf16(sweep, hunyuan):
    ckpt, ref, _ = hunyuan[BF16[0]]
    ref_bf16 = type(ref).from_pretrained(str(ckpt), subfolder="transformer", torch_dtype=torch.bfloat16).eval()
    node = _plan(BF16[0], "tp1", None).component("transformer")
    x = [t.to(torch.bfloat16) if t.is_floating_point() else t for t in _inputs(node, T)]
    with torch.no_grad():
        want = _diffusers(ref_bf16, x).float()
    got = sweep[0][0]["bf16"]
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    print(f"bf16 {BF16}: cosine {cos:.6f}")
    assert cos >= 0.9999


@pytest.fixture(scope="module")
def compiled(hunyuan, tmp_path_factory):
    """(ART of COMPILED, its planned transformer, its SplitProgram): codegen of the whole module, so
    the encoders and VAE are the TP1 plan's world-1 programs (shared through the test store) and
    only the denoiser's rank programs are AOTInductor-compiled for the split."""
    from difflet.codegen.artifacts import load_artifacts

    model, parallel, attention = COMPILED
    module = _plan(model, parallel, attention)
    out = compile_art(module, hunyuan[model][0], tmp_path_factory.mktemp("hunyuan-tiny-split"))
    prog = load_artifacts(out).programs["transformer"]
    yield out, module.component("transformer"), prog
    prog.close()


def test_compiled_split_program_equals_unsplit_diffusers(compiled, hunyuan):
    _, node, prog = compiled
    with torch.no_grad():
        got = [prog(*_inputs(node, v))[0] for v in VALID]
    _check(got, hunyuan[COMPILED[0]][2], f"AOTI {' '.join(map(str, COMPILED))}")


def test_split_video_equals_tp1_video(compiled, hunyuan, tmp_path):
    """The split ART served by ModelRunner gives the TP1 video (latents and decoded frames)."""
    check_served_like_tp1(_plan("tiny", "tp1", None), compiled[0], hunyuan["tiny"][0], tmp_path,
                          ("latents", "decoded"), TOL, " ".join(map(str, COMPILED)))
