"""Split LTX-2 tiny denoisers on real gloo ranks equal the UNSPLIT diffusers LTX2VideoTransformer3DModel.

Every layout `--list-legal --target cpu` calls legal at 2 and 4 ranks (cfg/dp are not built) is built
per rank by codegen's split_layout (presharded ParallelLinears of both streams, ParallelRMSNorm q/k
norms across heads, RoPE tables cut to the rank's heads, the video stream CP-sharded at the IR
inputs, audio and text replicated over cp and token-sharded over tp with SP, the split attention of
families/ltx2/attention.py: planned CP mode for video self-attention, gather_kv for audio queries over
video keys, local elsewhere) from one random:0 checkpoint:
- ltx2-tiny (2 heads per stream, 9 audio tokens: no SP): tp2, cp2 x {ulysses, ring, gather_kv};
  tp2cp2 and cp4 x {ring, gather_kv} (Ulysses and tp4 need 4 heads);
- ltx2-tiny4 (4 heads, 16 audio tokens): tp2+sp; tp4, tp4+sp, tp2cp2, tp2cp2+sp and cp4 x {ulysses,
  ring, gather_kv}.
They run EAGERLY (the rank modules without AOT compile, same code as the programs); one layout,
ltx2-tiny tp1cp2 ring (CP ring, gather_kv for audio queries, the stream shards; TP is compiled by
test_e2e_parallel_videos' tp2 demo), is also compiled with AOTInductor through codegen, loaded as a
SplitProgram and served by ModelRunner against the TP1 video and audio.

LTX-2's denoiser has no runtime text bound: the connectors replace the left padding with learnable
registers, so the transformer attends every text key. "Prompt length v" here is the text input
LTX2Pipeline gives it for a v-token prompt: the TP1 connectors program run at valid_text = v on the
same stacked Gemma states; padding contents are made irrelevant by the connectors (checked below,
through the split denoiser).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difflet.parallel.launch import run_ranks
from oracle_util import check_served_like_tp1, check_split_outputs, compile_art

pytestmark = pytest.mark.slow  # compiles whole split / bucketed / bf16 models: full suite only

MODELS = Path(__file__).resolve().parent.parent / "models"
DSL = {"tiny": MODELS / "ltx2-tiny.dsl", "tiny4": MODELS / "ltx2-tiny4.dsl"}
GEOMETRY = {"tiny": (5, 4, 4, 9), "tiny4": (8, 4, 4, 16)}  # latent frames, height, width; audio tokens
T = 16
VALID = (1, 3, 7, 12, 16)  # >= 5 prompt lengths from 1 to max_text
ISOLATED_AT = 7  # the prompt length whose inputs take the modality-isolated pass (guidance_pass 2)
TWO = [("tiny", "tp2", None)] + [("tiny", "cp2", a) for a in ("ulysses", "ring", "gather_kv")] + \
      [("tiny4", "tp2+sp", None)]
FOUR = [("tiny", p, a) for p in ("tp2cp2", "cp4") for a in ("ring", "gather_kv")] + \
       [("tiny4", "tp4", None), ("tiny4", "tp4+sp", None)] + \
       [("tiny4", p, a) for p in ("tp2cp2", "tp2cp2+sp", "cp4") for a in ("ulysses", "ring", "gather_kv")]
BF16 = ("tiny4", "tp2cp2+sp", "ulysses")
COMPILED = ("tiny", "tp1cp2", "ring")  # the rank programs test_e2e_parallel_videos' ltx2-tiny CP demo serves
TOL = 1e-4


def _plan(model, parallel, attention, dtype=None):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    overrides = {"dtype": dtype} if dtype else None
    return optimize(lower_file(str(DSL[model]), overrides), parallel=parallel, attention=attention, target="cpu")


def make_inputs(module, model, ckpt, stacked=None, valids=VALID):
    """{v: the transformer's IR inputs for a v-token prompt}: text from the TP1 connectors program
    at valid_text = v on one set of stacked Gemma states, seeded latents, RoPE coordinates from
    diffusers' own helpers (as the host's prepare_latents makes them), and the guidance pass:
    the modality-isolated one at ISOLATED_AT (its hooks on split attention), else the plain one."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    from difflet.codegen.build import build_program_module

    connectors = build_program_module(module.component("connectors"), ckpt)
    cfg = module.component("transformer").attrs["config"]
    f, h, w, audio = GEOMETRY[model]
    gen = torch.Generator().manual_seed(11)
    stacked = torch.randn(1, T, 96, generator=gen) if stacked is None else stacked
    video, audio_lat = torch.randn(1, f * h * w, 4, generator=gen), torch.randn(1, audio, 4, generator=gen)
    vrope = LTX2AudioVideoRotaryPosEmbed(dim=2, patch_size=1, patch_size_t=1,
                                         scale_factors=tuple(cfg["vae_scale_factors"]), modality="video")
    arope = LTX2AudioVideoRotaryPosEmbed(dim=2, patch_size=1, patch_size_t=1, scale_factors=[4], modality="audio")
    cpu = torch.device("cpu")
    coords = (vrope.prepare_video_coords(1, f, h, w, cpu, fps=24.0), arope.prepare_audio_coords(1, audio, cpu))
    with torch.no_grad():
        return {v: (video, audio_lat, *connectors(stacked, torch.tensor(v)), torch.tensor([650.0]), *coords,
                    torch.tensor(2 if v == ISOLATED_AT else 0)) for v in valids}


def reference(ref, x):
    """diffusers' forward as TransformerProgram calls it (sigma = timestep, use_cross_timestep) for
    the inputs' guidance pass (2: isolate_modalities)."""
    names = ("hidden_states", "audio_hidden_states", "encoder_hidden_states", "audio_encoder_hidden_states",
             "timestep", "video_coords", "audio_coords")
    kw = dict(zip(names, x))
    with torch.no_grad():
        return ref(**kw, sigma=kw["timestep"], isolate_modalities=int(x[len(names)]) == 2, use_cross_timestep=True,
                   return_dict=False)


def _sweep_body(rank, world, configs, ckpts, inputs, bf16):
    """On this rank: every config's split outputs at every prompt length (and one bf16 run)."""
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups

    out = {}
    for model, parallel, attention in configs:
        node = _plan(model, parallel, attention).component("transformer")
        groups = make_groups(degrees(node))
        pm = build_rank_module(node, ckpts[model], groups)
        blocks = pm.model.transformer_blocks
        seen = {}  # what this rank really holds: tokens entering each stream's first attention
        for site, key in ((blocks[0].attn1, "video"), (blocks[0].audio_attn1, "audio")):  # called by keyword
            site.register_forward_pre_hook(lambda _m, _a, kw, key=key: seen.update({key: kw["hidden_states"].shape[1]}),
                                           with_kwargs=True)
        seen["q_features"] = blocks[0].attn1.to_q.weight.shape[0]
        seen["audio_q_features"] = blocks[0].audio_attn1.to_q.weight.shape[0]
        with torch.no_grad():
            out[model, parallel, attention] = [pm(*inputs[model][v]) for v in VALID]
            if (model, parallel, attention) == bf16:  # built as codegen builds a bf16 description
                node16 = _plan(model, parallel, attention, "bfloat16").component("transformer")
                pm = build_rank_module(node16, ckpts[model], groups)
                x = [t.to(torch.bfloat16) if i < 5 else t for i, t in enumerate(inputs[model][T])]
                out["bf16"] = tuple(y.float() for y in pm(*x))
        out["seen", model, parallel, attention] = seen
    return out


@pytest.fixture(scope="module")
def ltx2(difflet_test_store):
    """model -> (checkpoint, diffusers reference, inputs per prompt length, oracle outputs per length)."""
    import diffusers

    from difflet.codegen.checkpoint import resolve_weights

    found = {}
    for model in DSL:
        module = _plan(model, "tp1", None)
        ckpt = resolve_weights(module, "random:0", difflet_test_store)
        ref = diffusers.LTX2VideoTransformer3DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
        inputs = make_inputs(module, model, ckpt)
        found[model] = (ckpt, ref, inputs, {v: reference(ref, inputs[v]) for v in VALID})
    return found


@pytest.fixture(scope="module")
def sweep(ltx2):
    ckpts = {m: str(c[0]) for m, c in ltx2.items()}
    inputs = {m: c[2] for m, c in ltx2.items()}
    ranks4 = run_ranks(_sweep_body, 4, FOUR, ckpts, inputs, BF16, timeout=900)
    ranks2 = run_ranks(_sweep_body, 2, TWO, ckpts, inputs, None, timeout=600)
    return ranks4, ranks2


def _check(got, oracle, what):
    """Both outputs (video sample, audio sample) at every prompt length."""
    for i, stream in enumerate(("video", "audio")):
        check_split_outputs([g[i] for g in got], {v: o[i] for v, o in oracle.items()}, VALID, TOL,
                            f"{what} {stream}", "prompt length")


@pytest.mark.parametrize("model,parallel,attention", TWO + FOUR)
def test_split_equals_unsplit_diffusers_at_every_prompt_length(sweep, ltx2, model, parallel, attention):
    ranks = sweep[1] if (model, parallel, attention) in TWO else sweep[0]
    for r, got in enumerate(ranks):
        _check(got[model, parallel, attention], ltx2[model][3], f"{model} {parallel} {attention} rank {r}")


@pytest.mark.parametrize("model,parallel,attention", TWO + FOUR)
def test_each_rank_holds_only_its_shard(sweep, ltx2, model, parallel, attention):
    """Equality alone would also hold for a rank that silently ran the whole model."""
    from difflet.passes.parallel_config import parse_parallel

    pc = parse_parallel(parallel)
    block = ltx2[model][1].transformer_blocks[0]
    f, h, w, audio = GEOMETRY[model]
    sp = pc.tp if pc.sp else 1
    ranks = sweep[1] if (model, parallel, attention) in TWO else sweep[0]
    for got in ranks:
        seen = got["seen", model, parallel, attention]
        assert seen["video"] == f * h * w // pc.cp // sp
        assert seen["audio"] == audio // sp  # replicated over cp: only SP cuts the audio stream
        assert seen["q_features"] == block.attn1.to_q.out_features // pc.tp
        assert seen["audio_q_features"] == block.audio_attn1.to_q.out_features // pc.tp


def test_bf16_split_cosine_to_unsplit_bf16(sweep, ltx2):
    """bf16 split (the rank modules of the description lowered at dtype bfloat16, as codegen builds
    them: the RoPE frequency buffers stay float32) vs bf16 unsplit diffusers: cosine >= 0.9999,
    and a split deviation at most a tenth of bf16's own (the tiny LTX-2 in bf16 is only ~0.998 to
    its fp32 output). Casting a built fp32 module to bf16 instead would round those buffers to
    bf16 and move the output by ~1.6e-4 in cosine, split or not."""
    ckpt, ref, inputs, oracle = ltx2[BF16[0]]
    ref_bf16 = type(ref).from_pretrained(str(ckpt), subfolder="transformer", torch_dtype=torch.bfloat16).eval()
    want = reference(ref_bf16, [t.to(torch.bfloat16) if i < 5 else t for i, t in enumerate(inputs[T])])
    got = sweep[0][0]["bf16"]

    def cos(a, b):
        return torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()

    for i, stream in enumerate(("video", "audio")):
        split, own = cos(got[i], want[i]), cos(want[i], oracle[T][i])
        print(f"bf16 {BF16} {stream}: cosine to unsplit bf16 {split:.6f} (unsplit bf16 to fp32 {own:.6f})")
        assert split >= 0.9999 and 1 - split <= 0.1 * (1 - own)


@pytest.fixture(scope="module")
def compiled(ltx2, tmp_path_factory):
    """(ART of COMPILED, its planned transformer, its SplitProgram): codegen of the whole module, so
    the encoders and decoders are the TP1 plan's world-1 programs (shared through the test store)
    and only the denoiser's rank programs are AOTInductor-compiled for the split."""
    from difflet.codegen.artifacts import load_artifacts

    model, parallel, attention = COMPILED
    module = _plan(model, parallel, attention)
    out = compile_art(module, ltx2[model][0], tmp_path_factory.mktemp("ltx2-tiny-split"))
    prog = load_artifacts(out).programs["transformer"]
    yield out, module.component("transformer"), prog
    prog.close()


def test_compiled_split_program_equals_unsplit_diffusers(compiled, ltx2):
    _, _, prog = compiled
    inputs = ltx2[COMPILED[0]][2]
    with torch.no_grad():
        got = [prog(*inputs[v]) for v in VALID]
    _check(got, ltx2[COMPILED[0]][3], f"AOTI {' '.join(map(str, COMPILED))}")


def test_split_video_and_audio_equal_tp1(compiled, ltx2, tmp_path):
    """The split ART served by ModelRunner (CFG: two split calls per step) gives the TP1 video and
    audio."""
    check_served_like_tp1(_plan("tiny", "tp1", None), compiled[0], ltx2["tiny"][0], tmp_path,
                          ("video_latents", "audio_latents", "decoded", "waveform"), TOL,
                          " ".join(map(str, COMPILED)))


def test_padding_states_change_nothing_through_the_split_denoiser(sweep, ltx2):
    """The connectors replace the left padding with registers, so different Gemma states in the
    padding of a 5-token prompt reach neither the text embeddings nor the split denoiser (run
    eagerly on 2 ranks, cp2 ring)."""
    ckpt = ltx2["tiny"][0]
    module = _plan("tiny", "cp2", "ring")
    stacked = torch.randn(1, T, 96, generator=torch.Generator().manual_seed(3))
    other = stacked.clone()
    other[:, : T - 5] = torch.randn(1, T - 5, 96, generator=torch.Generator().manual_seed(4))  # left padding
    x = [make_inputs(module, "tiny", ckpt, s, (5,))[5] for s in (stacked, other)]
    assert not torch.equal(stacked, other)
    assert all(torch.equal(a, b) for a, b in zip(x[0][2:4], x[1][2:4]))
    outs = run_ranks(_pair_body, 2, str(ckpt), x, timeout=300)
    for a, b in outs:
        assert all(torch.equal(p, q) for p, q in zip(a, b))


def _pair_body(rank, world, ckpt, inputs):
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups

    node = _plan("tiny", "cp2", "ring").component("transformer")
    pm = build_rank_module(node, ckpt, make_groups(degrees(node)))
    with torch.no_grad():
        return [pm(*x) for x in inputs]
