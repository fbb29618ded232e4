"""Split Wan 2.1 tiny denoisers on real gloo ranks equal the UNSPLIT diffusers WanTransformer3DModel.

Every layout `--list-legal --target cpu` calls legal at 2 and 4 ranks (cfg/dp are not built) is built
per rank by codegen's split_layout (presharded ParallelLinears, ParallelRMSNorm q/k norms across
heads, SP regions, the visual stream sharded inside the model at blocks.0 / rope / proj_out, CP
self-attention via families/wan/attention.py's processor) from one random:0 checkpoint:
- wan2.1-tiny (2 heads): tp2, tp2+sp, cp2 x {ulysses, ring, gather_kv}; tp2cp2 and tp2cp2+sp x
  {ring, gather_kv}, cp4 x {ring, gather_kv} (Ulysses and tp4 need 4 heads);
- wan2.1-tiny4 (4 heads): tp4, tp4+sp, tp2cp2, tp2cp2+sp and cp4 x {ulysses, ring, gather_kv}.
They run EAGERLY (the rank modules without AOT compile, same code as the programs); one layout,
wan2.1-tiny tp2cp2+sp ring (TP, SP, the tp all-reduced norms, CP ring, stream shards), is also
compiled with AOTInductor through codegen (rank programs shared through the test store), loaded
as a SplitProgram and served by ModelRunner against the TP1 video.

Wan's denoiser has no runtime text bound: WanPipeline zero-pads the prompt embeddings after the
prompt's token count, and the transformer's cross-attention attends them unmasked. So "valid text
length v" here is the input WanPipeline gives it for a v-token prompt (rows >= v zero), the oracle
is diffusers on that same input, and padding contents are made irrelevant by the UMT5 program
(it zeroes rows >= valid_text): checked through the split denoiser below.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difflet.parallel.launch import run_ranks
from oracle_util import check_served_like_tp1, check_split_outputs, compile_art

pytestmark = pytest.mark.slow  # compiles whole split / bucketed / bf16 models: full suite only

MODELS = Path(__file__).resolve().parent.parent / "models"
DSL = {"tiny": MODELS / "wan2.1-tiny.dsl", "tiny4": MODELS / "wan2.1-tiny4.dsl"}
T = 16
TOKENS = 12  # visual tokens: 9 frames -> 3 latent frames, x (32 px / 8 / patch 2)^2
VALID = (1, 3, 7, 12, 16)  # >= 5 prompt lengths from 1 to max_text
TWO = [("tiny", "tp2", None), ("tiny", "tp2+sp", None), ("tiny", "cp2", "ulysses"), ("tiny", "cp2", "ring"),
       ("tiny", "cp2", "gather_kv")]
FOUR = [("tiny", p, a) for p in ("tp2cp2", "tp2cp2+sp", "cp4") for a in ("ring", "gather_kv")] + \
       [("tiny4", "tp4", None), ("tiny4", "tp4+sp", None)] + \
       [("tiny4", p, a) for p in ("tp2cp2", "tp2cp2+sp", "cp4") for a in ("ulysses", "ring", "gather_kv")]
BF16 = ("tiny4", "tp2cp2+sp", "ulysses")
COMPILED = ("tiny", "tp1cp2", "ring")  # the rank programs test_e2e_parallel_videos' wan2.1-tiny CP demo serves
TOL = 1e-4


def _plan(model, parallel, attention):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(DSL[model])), parallel=parallel, attention=attention, target="cpu")


def _inputs(node, valid):
    """The denoiser's inputs for a `valid`-token prompt: text rows >= valid zero, as WanPipeline pads."""
    from difflet.codegen.build import example_inputs

    x = list(example_inputs(node))
    enc = x[2].clone()
    enc[:, valid:] = 0
    x[2] = enc
    return tuple(x)


def _sweep_body(rank, world, configs, ckpts, valids, bf16):
    """On this rank: every config's split output at every prompt length (and one bf16 run)."""
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups

    out = {}
    for model, parallel, attention in configs:
        node = _plan(model, parallel, attention).component("transformer")
        pm = build_rank_module(node, ckpts[model], make_groups(degrees(node)))
        seen = {}  # what this rank really holds: tokens entering block 1 and attn1's q features
        pm.model.blocks[1].register_forward_pre_hook(lambda _m, a: seen.update(tokens=a[0].shape[1]))
        seen["q_features"] = pm.model.blocks[0].attn1.to_q.weight.shape[0]
        with torch.no_grad():
            out[model, parallel, attention] = [pm(*_inputs(node, v))[0] for v in valids]
            if (model, parallel, attention) == bf16:
                pm = pm.to(torch.bfloat16)
                out["bf16"] = pm(*[t.to(torch.bfloat16) for t in _inputs(node, T)])[0].float()
        out["seen", model, parallel, attention] = seen
    return out


@pytest.fixture(scope="module")
def wan(difflet_test_store):
    """model -> (checkpoint, diffusers reference, oracle outputs per prompt length)."""
    import diffusers

    from difflet.codegen.checkpoint import resolve_weights

    found = {}
    for model in DSL:
        module = _plan(model, "tp1", None)
        ckpt = resolve_weights(module, "random:0", difflet_test_store)
        ref = diffusers.WanTransformer3DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
        node = module.component("transformer")
        with torch.no_grad():
            oracle = {v: ref(*_inputs(node, v), return_dict=False)[0] for v in VALID}
        found[model] = (ckpt, ref, oracle)
    return found


@pytest.fixture(scope="module")
def sweep(wan):
    ckpts = {m: str(c[0]) for m, c in wan.items()}
    ranks4 = run_ranks(_sweep_body, 4, FOUR, ckpts, VALID, BF16, timeout=900)
    ranks2 = run_ranks(_sweep_body, 2, TWO, ckpts, VALID, None, timeout=600)
    return ranks4, ranks2


def _check(got, oracle, what):
    return check_split_outputs(got, oracle, VALID, TOL, what, "prompt length")


@pytest.mark.parametrize("model,parallel,attention", TWO + FOUR)
def test_split_equals_unsplit_diffusers_at_every_prompt_length(sweep, wan, model, parallel, attention):
    ranks = sweep[1] if (model, parallel, attention) in TWO else sweep[0]
    for r, got in enumerate(ranks):
        _check(got[model, parallel, attention], wan[model][2], f"{model} {parallel} {attention} rank {r}")


@pytest.mark.parametrize("model,parallel,attention", TWO + FOUR)
def test_each_rank_holds_only_its_shard(sweep, wan, model, parallel, attention):
    """Equality alone would also hold for a rank that silently ran the whole model."""
    from difflet.passes.parallel_config import parse_parallel

    pc = parse_parallel(parallel)
    ref = wan[model][1]
    ranks = sweep[1] if (model, parallel, attention) in TWO else sweep[0]
    for got in ranks:
        seen = got["seen", model, parallel, attention]
        assert seen["tokens"] == TOKENS // pc.cp // (pc.tp if pc.sp else 1)
        assert seen["q_features"] == ref.blocks[0].attn1.to_q.out_features // pc.tp


def test_bf16_split_cosine_to_unsplit_bf16(sweep, wan):
    ckpt, ref, _ = wan[BF16[0]]
    ref_bf16 = type(ref).from_pretrained(str(ckpt), subfolder="transformer", torch_dtype=torch.bfloat16).eval()
    node = _plan(BF16[0], "tp1", None).component("transformer")
    with torch.no_grad():
        want = ref_bf16(*[t.to(torch.bfloat16) for t in _inputs(node, T)], return_dict=False)[0].float()
    got = sweep[0][0]["bf16"]
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    print(f"bf16 {BF16}: cosine {cos:.6f}")
    assert cos >= 0.9999


@pytest.fixture(scope="module")
def compiled(wan, tmp_path_factory):
    """(ART of COMPILED, its planned transformer, its SplitProgram): codegen of the whole module, so
    the encoder and VAE are the TP1 plan's world-1 programs (shared through the test store) and
    only the denoiser's rank programs are AOTInductor-compiled for the split."""
    from difflet.codegen.artifacts import load_artifacts

    model, parallel, attention = COMPILED
    module = _plan(model, parallel, attention)
    out = compile_art(module, wan[model][0], tmp_path_factory.mktemp("wan-tiny-split"))
    prog = load_artifacts(out).programs["transformer"]
    yield out, module.component("transformer"), prog
    prog.close()


def test_compiled_split_program_equals_unsplit_diffusers(compiled, wan):
    _, node, prog = compiled
    with torch.no_grad():
        got = [prog(*_inputs(node, v))[0] for v in VALID]
    _check(got, wan[COMPILED[0]][2], f"AOTI {' '.join(map(str, COMPILED))}")


def test_split_video_equals_tp1_video(compiled, wan, tmp_path):
    """The split ART served by ModelRunner (CFG: two split calls per step) gives the TP1 video."""
    check_served_like_tp1(_plan("tiny", "tp1", None), compiled[0], wan["tiny"][0], tmp_path,
                          ("latents", "decoded"), TOL, " ".join(map(str, COMPILED)))


def test_padding_token_ids_change_nothing_through_the_split_denoiser(sweep, wan):
    """The UMT5 program zeroes rows >= valid_text, so the padding ids after a 5-token prompt reach
    neither the embeddings nor the split denoiser (run eagerly on 2 ranks, cp2 ring)."""
    from difflet.codegen.build import build_program_module

    module = _plan("tiny", "cp2", "ring")
    enc = build_program_module(module.component("text_encoder"), wan["tiny"][0])
    ids = torch.randint(2, 1000, (1, T), generator=torch.Generator().manual_seed(3))
    other = ids.clone()
    other[:, 5:] = torch.randint(2, 1000, (1, T - 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        embeds = [enc(i, torch.tensor(5))[0] for i in (ids, other)]
    assert not torch.equal(ids, other) and torch.equal(embeds[0], embeds[1])
    node = module.component("transformer")
    x = [(*_inputs(node, T)[:2], e) for e in embeds]
    outs = run_ranks(_pair_body, 2, str(wan["tiny"][0]), x, timeout=300)
    for a, b in outs:
        assert torch.equal(a, b)


def _pair_body(rank, world, ckpt, inputs):
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups

    node = _plan("tiny", "cp2", "ring").component("transformer")
    pm = build_rank_module(node, ckpt, make_groups(degrees(node)))
    with torch.no_grad():
        return [pm(*x)[0] for x in inputs]
