"""Over-long prompts are treated as each family's reference pipeline treats them (issue 17).

Oracles: diffusers' FluxPipeline image for a 200-token prompt (served over gRPC, default
`truncate` policy); for the other families, the token ids the reference pipeline's own encode
method hands its text encoder (a recording stand-in encoder stops it there), against what the
host step hands its encoder program and what admission reports as dropped.
"""
from __future__ import annotations

import io
import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from conftest import REPO
from difflet.errors import DiffletError
from difflet.runtime import client
from difflet.runtime.admission import Admission
from difflet.runtime.startup import ArtifactInfo, check_artifacts
from oracle_util import planned_tiny, random_checkpoint

OK = dict(seed=1, steps=None, guidance=None, height=0, width=0, request_id="", cache="")


def vocab_prompt(tokenizer_dir, words: int) -> str:
    """`words` in-vocabulary words (each one token in the tiny word-level tokenizers), so no
    part of the prompt collapses to <unk> and every position carries a different token."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab()
    known = [w for w, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i >= 4 and w.isalpha()]
    return " ".join(itertools.islice(itertools.cycle(known[:60]), words))


def close_images(a: np.ndarray, b: np.ndarray) -> bool:
    """Max pixel difference <= 1 and >= 99% identical pixels: separately compiled float programs
    may round a pixel differently, while a wrong text input moves most pixels (the untruncated
    oracle below fails it)."""
    diff = np.abs(a.astype(int) - b.astype(int))
    return a.shape == b.shape and diff.max() <= 1 and (diff.max(axis=-1) == 0).mean() >= 0.99


# ---- FLUX: served image vs FluxPipeline


@pytest.fixture(scope="module")
def server(flux_tiny_art):
    from difflet.runtime.demo import start_server, stop_server

    proc, address = start_server(flux_tiny_art)
    yield address, proc
    assert stop_server(proc) == 0


def server_log(proc) -> list[str]:
    """The server's stderr so far (launch_server sends it to a temporary file)."""
    proc.errlog.seek(0)
    return proc.errlog.read().splitlines()


def test_flux_long_prompt_is_truncated_like_fluxpipeline(server, flux_tiny_art, flux_tiny_ckpt, tmp_path):
    from diffusers import FluxPipeline

    server, proc = server
    prompt = vocab_prompt(flux_tiny_art / "host" / "tokenizer_2", 199)  # T5: 199 + </s> = 200 tokens
    reply = client.generate(server, prompt, 5, timeout=300)
    report = {(c.field, c.encoder): (c.tokens, c.kept, c.dropped) for c in reply.truncated}
    # CLIP (clip_len 16): <s> + 199 + </s>; T5 (max_text 32): 199 + </s>
    assert report == {("prompt", "text_encoder"): (201, 16, 185),
                      ("prompt", "text_encoder_2"): (200, 32, 168)}
    pipe = FluxPipeline.from_pretrained(str(flux_tiny_ckpt))
    pipe.set_progress_bar_config(disable=True)
    assert pipe.tokenizer_max_length == 16  # the pipeline's own CLIP limit is the tokenizer's

    def reference(max_sequence_length: int) -> np.ndarray:
        return np.asarray(pipe(prompt, generator=torch.Generator("cpu").manual_seed(5),
                               num_inference_steps=reply.steps, guidance_scale=reply.guidance,
                               height=32, width=32, max_sequence_length=max_sequence_length).images[0])

    logged = [line for line in server_log(proc) if f"request {reply.request_id}:" in line]
    assert logged == [f"request {reply.request_id}: prompt truncated: "
                      "prompt: text_encoder kept 16 of 201 tokens (185 dropped); "
                      "prompt: text_encoder_2 kept 32 of 200 tokens (168 dropped)"]
    ours = np.asarray(Image.open(io.BytesIO(reply.png)).convert("RGB"))
    assert close_images(ours, reference(32))
    assert not close_images(ours, reference(64))  # T5 reading 32 more tokens: a different image

    from difflet.cli import main

    out = tmp_path / "long.png"
    cli = CliRunner().invoke(main, ["generate", "--server", server, prompt, "--seed", "5", "-o", str(out)])
    assert cli.exit_code == 0, cli.output
    notes = [line for line in cli.stderr.splitlines() if line.startswith("note: truncated")]
    assert notes == ["note: truncated as the reference pipeline does: "
                     "prompt: text_encoder kept 16 of 201 tokens (185 dropped); "
                     "prompt: text_encoder_2 kept 32 of 200 tokens (168 dropped)"]


def test_short_prompt_reports_no_truncation(server):
    server, proc = server
    reply = client.generate(server, "a red fox", 1, timeout=300)
    assert not [line for line in server_log(proc) if f"request {reply.request_id}:" in line]
    assert list(reply.truncated) == []
    assert client.get_profile(server).prompt_policy == "truncate"


# ---- strict policy


def test_strict_policy_refuses_as_before_and_truncate_admits(flux_tiny_art):
    info = check_artifacts(flux_tiny_art)
    prompt = "word " * 32  # 32 words + </s> = 33 T5 tokens
    with pytest.raises(DiffletError) as err:
        Admission(info, prompt_policy="strict").admit(prompt=prompt, **OK)
    assert err.value.where == "prompt"
    assert err.value.message.startswith(
        "prompt: 33 tokens exceeds the text encoder limit of 32 tokens (text_encoder_2)")
    _, cuts = Admission(info, prompt_policy="strict").admit(prompt="word " * 31, **OK)
    assert [(c.encoder, c.dropped) for c in cuts] == [("text_encoder", 17)]  # CLIP still cuts: 33 -> 16
    fields, cuts = Admission(info).admit(prompt=prompt, **OK)
    assert fields.prompt == prompt
    assert [(c.encoder, c.tokens, c.limit, c.dropped) for c in cuts] == [
        ("text_encoder", 34, 16, 18), ("text_encoder_2", 33, 32, 1)]
    with pytest.raises(DiffletError, match="prompt policy 'lenient'"):
        Admission(info, prompt_policy="lenient")


def test_prompt_policy_option_reaches_admission(flux_tiny_art, monkeypatch):
    from difflet.runtime import server

    seen = {}

    class Stop(server.DiffletServer):  # built for real, then stopped before it binds or spawns
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["policy"] = self.admission.prompt_policy
            raise DiffletError("stop here", where="test")

    monkeypatch.setattr(server, "DiffletServer", Stop)
    # main's process-wide hooks (stop signals, the SIGUSR1 stack dump) stay out of pytest's process
    monkeypatch.setattr(server.signal, "signal", lambda *args: None)
    monkeypatch.setattr(server.faulthandler, "register", lambda *args, **kwargs: None)
    for flag, policy in (([], "truncate"), (["--prompt-policy", "strict"], "strict")):
        result = CliRunner().invoke(server.main, ["--artifacts", str(flux_tiny_art), "--port", "0", *flag])
        assert result.exit_code == 2 and "stop here" in result.stderr
        assert seen.pop("policy") == policy
    bad = CliRunner().invoke(server.main, ["--artifacts", str(flux_tiny_art), "--prompt-policy", "loose"])
    assert bad.exit_code == 2 and "--prompt-policy" in bad.output


# ---- the other families: host tokenization and admission vs the pipeline's own encode call


class Captured(Exception):
    def __init__(self, args, kwargs):
        super().__init__("captured")
        self.args_, self.kwargs = args, kwargs


class Recorder(torch.nn.Module):
    """A text encoder that stops the pipeline with the inputs it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, *args, **kwargs):
        raise Captured(args, kwargs)


def _valid_ids(ids: torch.Tensor, mask: torch.Tensor) -> list[int]:
    return ids[0][mask[0].bool()].tolist()


def _capture(call) -> Captured:
    with pytest.raises(Captured) as got:
        call()
    return got.value


def pipeline_inputs(family: str, ckpt, prompt: str, text_len: int) -> dict[str, tuple[list[int], int]]:
    """encoder -> (valid ids the pipeline's encoder reads, positions of them it keeps for the
    denoiser), from the pipeline's own encode method with max_sequence_length = the profile's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt / "tokenizer"))
    kw = dict(device=torch.device("cpu"), dtype=torch.float32)
    if family == "qwen_image":
        from diffusers import QwenImagePipeline

        pipe = QwenImagePipeline(scheduler=None, vae=None, text_encoder=Recorder(), tokenizer=tok,
                                 transformer=None)
        got = _capture(lambda: pipe._get_qwen_prompt_embeds(prompt, **kw))
        ids = _valid_ids(got.kwargs["input_ids"], got.kwargs["attention_mask"])
        drop = pipe.prompt_template_encode_start_idx  # encode_prompt keeps rows [drop, drop + T)
        return {"text_encoder": (ids, drop + min(len(ids) - drop, text_len))}
    if family == "wan":
        from diffusers import WanPipeline

        pipe = WanPipeline(tokenizer=tok, text_encoder=Recorder(), vae=None, scheduler=None)
        got = _capture(lambda: pipe._get_t5_prompt_embeds(prompt, max_sequence_length=text_len, **kw))
        ids = _valid_ids(got.args_[0], got.args_[1])
        return {"text_encoder": (ids, len(ids))}
    if family == "ltx2":
        from diffusers import LTX2Pipeline

        pipe = LTX2Pipeline(scheduler=None, vae=None, audio_vae=None, text_encoder=Recorder(),
                            tokenizer=tok, connectors=None, transformer=None, vocoder=None)
        got = _capture(lambda: pipe._get_gemma_prompt_embeds(prompt, max_sequence_length=text_len, **kw))
        ids = _valid_ids(got.kwargs["input_ids"], got.kwargs["attention_mask"])
        return {"text_encoder": (ids, len(ids))}
    assert family == "hunyuan_video"
    from diffusers import HunyuanVideoPipeline
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    tok2 = AutoTokenizer.from_pretrained(str(ckpt / "tokenizer_2"))
    pipe = HunyuanVideoPipeline(text_encoder=Recorder(), tokenizer=tok, transformer=None, vae=None,
                                scheduler=None, text_encoder_2=Recorder(), tokenizer_2=tok2)
    got = _capture(lambda: pipe._get_llama_prompt_embeds(
        prompt, DEFAULT_PROMPT_TEMPLATE, max_sequence_length=text_len, **kw))
    llama = _valid_ids(got.kwargs["input_ids"], got.kwargs["attention_mask"])
    got = _capture(lambda: pipe._get_clip_prompt_embeds(prompt, max_sequence_length=77, **kw))
    clip = got.args_[0][0].tolist()  # no padding: the prompt fills all 77 positions
    return {"text_encoder": (llama, len(llama)), "text_encoder_2": (clip, len(clip))}


def host_inputs(family: str, module, ckpt, prompt: str) -> dict[str, list[int]]:
    """encoder -> the valid ids the host step hands the encoder program (recording programs)."""
    from difflet.families.hunyuan_video import host as hunyuan_video
    from difflet.families.ltx2 import host as ltx2
    from difflet.families.qwen_image import host as qwen_image
    from difflet.families.wan import host as wan
    from difflet.runtime.host.toolkit import input_shape
    from difflet.runtime.host.env import HostEnv

    def program(*args):
        raise Captured(args, {})

    env = HostEnv(module, {c.name: program for c in module.components("encoder")}, ckpt)
    enc = env.component("text_encoder")
    denoiser = module.components("denoiser")[0]
    if family == "wan":
        ids, valid = wan.tokenize(env, enc, prompt)
        return {"text_encoder": ids[0, :valid].tolist()}
    if family == "ltx2":
        ids, valid = ltx2.tokenize(env, enc, prompt)
        return {"text_encoder": ids[0, ids.shape[1] - valid:].tolist()}  # left-padded
    if family == "qwen_image":
        t = input_shape(denoiser, "encoder_hidden_states")[1]
        got = _capture(lambda: qwen_image.encode_text(env, enc, t, prompt))
        return {"text_encoder": got.args_[0][0].tolist()}  # right-padded to exactly max_length
    t = input_shape(denoiser, "encoder_hidden_states")[1]
    llama = _capture(lambda: hunyuan_video.llama_embeds(env, enc, t, prompt)).args_[0][0].tolist()
    clip = _capture(lambda: hunyuan_video.clip_pooled(env, env.component("text_encoder_2"), prompt))
    return {"text_encoder": llama, "text_encoder_2": clip.args_[0][0].tolist()}


@pytest.mark.parametrize("dsl,family", [("qwen-image-tiny", "qwen_image"), ("wan2.1-tiny", "wan"),
                                        ("hunyuan-video-tiny", "hunyuan_video"), ("ltx2-tiny", "ltx2")])
def test_family_truncation_matches_its_pipeline(dsl, family):
    from transformers import AutoTokenizer

    module = planned_tiny(REPO / "models" / f"{dsl}.dsl")
    ckpt = random_checkpoint(module)
    text_len = int(module.attrs["profile"]["max_text"])
    prompt = vocab_prompt(ckpt / "tokenizer", 300)
    admission = Admission(ArtifactInfo(ckpt, SimpleNamespace(host=".", sizes=()), module))  # only .host (and .sizes) are read; host/ = the checkpoint folders
    _, cuts = admission.admit(prompt=prompt, **OK)
    reported = {c.encoder: c for c in cuts}
    pipeline = pipeline_inputs(family, ckpt, prompt, text_len)
    host = host_inputs(family, module, ckpt, prompt)
    assert set(reported) == set(pipeline)  # every encoder of these profiles cuts 300 words
    for encoder, (ids, kept) in pipeline.items():
        folder = "tokenizer_2" if encoder == "text_encoder_2" else "tokenizer"
        tok = AutoTokenizer.from_pretrained(str(ckpt / folder))
        full = len(tok(pipeline_text(family, encoder, prompt)).input_ids)  # nothing cut
        cut = reported[encoder]
        assert (cut.tokens, cut.tokens - cut.dropped, cut.field) == (full, kept, "prompt"), encoder
        assert host[encoder] == ids[:kept], encoder  # the host reads exactly what the pipeline keeps


def pipeline_text(family: str, encoder: str, prompt: str) -> str:
    """The text the reference pipeline tokenizes for `encoder`, from diffusers' own code."""
    if family == "wan":
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean

        return prompt_clean(prompt)
    if family == "ltx2":
        return prompt.strip()
    if family == "qwen_image":
        from diffusers import QwenImagePipeline

        return QwenImagePipeline(None, None, None, None, None).prompt_template_encode.format(prompt)
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    return DEFAULT_PROMPT_TEMPLATE["template"].format(prompt) if encoder == "text_encoder" else prompt


def test_prompt_templates_equal_the_pipelines():
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    from diffusers import QwenImagePipeline

    from difflet.families.hunyuan_video import facts as hunyuan_video
    from difflet.families.qwen_image import facts as qwen_image
    from difflet.families.qwen_image.programs import TEMPLATE_START

    pipe = QwenImagePipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=None)
    assert qwen_image.PROMPT_TEMPLATE == pipe.prompt_template_encode  # set in its __init__
    assert TEMPLATE_START == pipe.prompt_template_encode_start_idx
    assert hunyuan_video.PROMPT_TEMPLATE == DEFAULT_PROMPT_TEMPLATE["template"]


def test_negative_prompt_truncation_is_reported_where_the_model_reads_it():
    module = planned_tiny(REPO / "models" / "wan2.1-tiny.dsl")
    ckpt = random_checkpoint(module)
    long = vocab_prompt(ckpt / "tokenizer", 40)
    _, cuts = Admission(ArtifactInfo(ckpt, SimpleNamespace(host=".", sizes=()), module)).admit(
        prompt="a fox", negative_prompt=long, **OK)
    assert [(c.field, c.encoder, c.tokens, c.limit) for c in cuts] == [
        ("negative_prompt", "text_encoder", 41, 16)]


def test_tokenizer_folder_without_tokenizer_json_is_counted_like_the_host(tmp_path):
    """FLUX.1-dev's CLIP tokenizer ships vocab.json + merges.txt only: admission converts it (in a
    child process) and counts what the host's AutoTokenizer makes of the same files."""
    import json

    from transformers import AutoTokenizer, CLIPTokenizer

    from difflet.runtime.prompt_text import _counting_tokenizer, tokenizer_json

    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    vocab.update({c: 2 + i for i, c in enumerate(letters)})
    vocab.update({c + "</w>": 28 + i for i, c in enumerate(letters)})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")  # no merges: one token per letter
    CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"),
                  model_max_length=77).save_pretrained(str(tmp_path))
    (tmp_path / "tokenizer.json").unlink()
    host = AutoTokenizer.from_pretrained(str(tmp_path))
    ours = _counting_tokenizer(tokenizer_json(tmp_path))
    for prompt in ("a red fox", "Snow  FOX\tin the woods " * 9):
        assert ours.encode(prompt).ids == host(prompt).input_ids
    with pytest.raises(DiffletError, match="tokenizer directory missing"):
        tokenizer_json(tmp_path / "absent")
