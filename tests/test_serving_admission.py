"""API-side request checks (no server): each field's INVALID_ARGUMENT message, the prompt-token
policy against the real tokenizer the host schedule uses, and cache-mode syntax."""
from __future__ import annotations

import pytest

from difflet.errors import DiffletError
from difflet.runtime.admission import Admission
from difflet.runtime.startup import check_artifacts
from difflet.runtime.validate import check_cache_mode

OK = dict(prompt="a red fox", seed=1, steps=None, guidance=None, height=0, width=0,
          request_id="", cache="")


@pytest.fixture(scope="module")
def admission(flux_tiny_art):
    # strict: the prompt-length refusal below is that policy's; truncate is in test_prompt_policy.py
    return Admission(check_artifacts(flux_tiny_art), prompt_policy="strict")


def test_defaults_are_filled_from_the_profile(admission):
    request = admission.check(**OK)
    assert (request.steps, request.guidance, request.height, request.width) == (4, 3.5, 32, 32)
    assert len(request.request_id) == 16 and request.cache == ""  # "" = the server's mode


def test_prompt_token_count_matches_the_host_tokenizer(admission, flux_tiny_art):
    from transformers import AutoTokenizer

    host = AutoTokenizer.from_pretrained(str(flux_tiny_art / "host" / "tokenizer_2"))
    for prompt in ("a red fox in the snow", "word " * 31, "word " * 40):
        assert admission.prompt_tokens(prompt) == len(host(prompt).input_ids)
    assert admission.token_limit == 32 and admission.limit_encoder == "text_encoder_2"
    admission.check(**dict(OK, prompt="word " * 31))  # 31 words + EOS = 32 tokens: the limit


@pytest.mark.parametrize("field,value,message", [
    ("prompt", "word " * 32, "prompt: 33 tokens exceeds the text encoder limit of 32 tokens (text_encoder_2)"),
    ("prompt", "   ", "prompt: must be a non-empty string"),
    ("seed", -1, "seed: -1 is outside"),
    ("steps", 0, "steps: 0 is outside [1, 1000]"),
    ("guidance", float("inf"), "guidance: inf must be finite and in [0, 100]"),
    ("height", 48, "height: 48 does not match the serving profile (32)"),
    ("width", 16, "width: 16 does not match the serving profile (32)"),
    ("request_id", "é", "request_id: must be printable ASCII"),
    ("cache", "cadence:x", "cache: cadence needs an integer interval"),
    ("cache", "calibrated:curve.json:-2", "cache: calibrated threshold -2 must be finite and > 0"),
])
def test_each_field_error_names_the_field(admission, field, value, message):
    with pytest.raises(DiffletError) as err:
        admission.check(**dict(OK, **{field: value}))
    assert err.value.where == field and err.value.message.startswith(message)


@pytest.mark.parametrize("mode", ["off", "cadence:2", "online-delta:0.1", "online-delta",
                                  "calibrated:curve.json", "calibrated:/tmp/a:b.json:0.05:accumulate"])
def test_valid_cache_modes(mode):
    assert check_cache_mode(f" {mode} ") == mode


@pytest.mark.parametrize("dsl, limit", [
    ("flux-tiny", (32, "text_encoder_2")),          # T5's max_length; CLIP is shorter
    ("qwen-image-tiny", (16, "text_encoder")),      # max_text + 34 template tokens, less the template
    ("hunyuan-video-tiny", (16, "text_encoder")),   # Llama: max_text + 95 template tokens
])
def test_prompt_token_limit_leaves_out_the_prompt_template(dsl, limit):
    from conftest import REPO

    from difflet.frontend.lower import lower_file
    from difflet.runtime.startup import text_limit

    assert text_limit(lower_file(str(REPO / "models" / f"{dsl}.dsl"))) == limit
