"""The OpenAI-compatible HTTP API of a real difflet-runtime (flux-tiny), driven by the official
`openai` package and raw HTTP.

Oracle: the same server's gRPC reply for the same prompt, seed and steps. Both routes run the
same compiled programs in the same model process, so the PNG must be byte-identical (exact
equality is right: any difference is a different request reaching the model).
"""
from __future__ import annotations

import base64
import json
import io
import re
import subprocess
import sys

import grpc
import openai
import pytest
from PIL import Image

from difflet.runtime import client as grpc_client
from difflet.runtime.demo import stop_server
from http_util import call, call_json, loads_torch, sse, start_http_server
from serving_util import Stream

PROMPT = "a red fox in the snow"


@pytest.fixture(scope="module")
def hold_file(tmp_path_factory):
    """While this file exists, the server's requests stop after each step (DIFFLET_FAULTS hold-steps)."""
    return tmp_path_factory.mktemp("hold") / "hold-steps"


@pytest.fixture(scope="module")
def server(flux_tiny_art, hold_file):
    proc, grpc_address, http_address = start_http_server(flux_tiny_art, "--queue-size", "1",
                                                         env={"DIFFLET_FAULTS": f"hold-steps:{hold_file}"})
    yield proc, grpc_address, http_address
    assert stop_server(proc) == 0


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"http://{server[2]}/v1", api_key="none-needed", max_retries=0)


def metric(address: str, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    status, _, text = call(address, "GET", "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_openai_images_generate_is_byte_identical_to_the_grpc_reply(server, oai):
    _, grpc_address, _ = server
    reply = oai.images.generate(model="flux_tiny", prompt=PROMPT, size="32x32", response_format="b64_json",
                                extra_body={"seed": 42, "num_inference_steps": 3})
    (item,) = reply.data
    png = base64.b64decode(item.b64_json)
    assert png == grpc_client.generate(grpc_address, PROMPT, 42, steps=3, timeout=300).png
    assert Image.open(io.BytesIO(png)).size == (32, 32) and png.startswith(b"\x89PNG")
    assert item.revised_prompt == PROMPT and item.model_extra["seed"] == 42


def test_n_images_use_consecutive_seeds_and_url_replies_are_served(server, oai):
    _, grpc_address, http_address = server
    reply = oai.images.generate(prompt=PROMPT, n=2, response_format="url",
                                extra_body={"seed": 7, "num_inference_steps": 2})
    assert [d.model_extra["seed"] for d in reply.data] == [7, 8]
    for seed, item in zip((7, 8), reply.data):
        assert item.url.startswith(f"http://{http_address}/v1/images/")
        status, headers, png = call(http_address, "GET", item.url.split(http_address, 1)[1])
        assert status == 200 and headers["Content-Type"] == "image/png"
        assert png == grpc_client.generate(grpc_address, PROMPT, seed, steps=2, timeout=300).png
    # issue 31 finding 7: ids were img-PREFIX-N (the next client's content one counter away); each
    # is now 128 random bits (22 url-safe characters)
    ids = [item.url.rsplit("/", 1)[1].removesuffix(".png") for item in reply.data]
    assert all(re.fullmatch(r"img-[A-Za-z0-9_-]{22}", i) for i in ids) and ids[0] != ids[1], ids


def test_jpeg_output_and_the_model_card(server, oai):
    reply = oai.images.generate(prompt=PROMPT, output_format="jpeg", extra_body={"seed": 1})
    image = Image.open(io.BytesIO(base64.b64decode(reply.data[0].b64_json)))
    assert image.format == "JPEG" and image.size == (32, 32)
    (card,) = oai.models.list().data
    assert card.id == "flux_tiny"
    assert (card.model_extra["sizes"], card.model_extra["kind"], card.model_extra["default_steps"],
            card.model_extra["guidance_kind"]) == (["32x32"], "image", 4, "embedded")


def test_stream_reports_every_step_then_the_image(server):
    _, grpc_address, http_address = server
    events = list(sse(http_address, "POST", "/v1/images/generations",
                      {"prompt": PROMPT, "seed": 5, "num_inference_steps": 3, "stream": True}))
    assert [(e["step"], e["total"]) for e in events[:-1]] == [(1, 3), (2, 3), (3, 3)]
    assert events[-1]["type"] == "image_generation.completed"
    assert base64.b64decode(events[-1]["b64_json"]) == \
        grpc_client.generate(grpc_address, PROMPT, 5, steps=3, timeout=300).png


@pytest.mark.parametrize("body,param,message", [
    ({}, "prompt", "prompt: is required"),
    ({"prompt": ""}, "prompt", "prompt: must be a non-empty string"),
    ({"prompt": 5}, "prompt", "prompt: must be a string"),
    # issue 31 finding 4: length is refused before any tokenizer counts it (1 MiB took seconds)
    ({"prompt": "x" * 100000}, "prompt", "prompt: is 100000 characters, at most 32768"),
    ({"negative_prompt": "x" * 32769}, "negative_prompt", "negative_prompt: is 32769 characters, at most 32768"),
    ({"n": 0}, "n", "n: 0 is outside [1, 10]"),
    ({"n": 11}, "n", "n: 11 is outside [1, 10]"),
    ({"size": "64x64"}, "size", "size: 64x64 is not served"),
    ({"size": "large"}, "size", "size: 'large' is not WIDTHxHEIGHT"),
    ({"num_inference_steps": 0}, "num_inference_steps", "num_inference_steps: 0 is outside [1, 1000]"),
    ({"num_inference_steps": "4"}, "num_inference_steps", "num_inference_steps: must be an integer"),
    ({"num_inference_steps": True}, "num_inference_steps", "num_inference_steps: must be an integer"),
    ({"guidance_scale": -1}, "guidance_scale", "guidance_scale: -1.0 must be finite and in [0, 100]"),
    ({"seed": -5}, "seed", "seed: -5 is outside"),
    ({"seed": 1.5}, "seed", "seed: must be an integer"),
    ({"negative_prompt": 3}, "negative_prompt", "negative_prompt: must be a string"),
    ({"response_format": "xml"}, "response_format", "response_format: 'xml' is not b64_json or url"),
    ({"output_format": "gif"}, "output_format", "output_format: 'gif' is not one of png, jpeg, webp"),
    ({"cache": "sometimes"}, "cache", "cache: unknown cache mode 'sometimes'"),
    # issue 31 finding 2: a request's cache named any server file (/dev/zero read until memory ran
    # out, /etc a 500, /etc/passwd "is not JSON"); now nothing is read and every path is refused alike
    *[({"cache": f"calibrated:{path}"}, "cache", f"cache: calibration {path!r} is not configured on this server "
       "(configured: none)") for path in ("/nonexistent.json", "/dev/zero", "/etc", "/etc/passwd")],
    ({"stream": "yes"}, "stream", "stream: must be true or false"),
    ({"timeout": 0}, "timeout", "timeout: 0 must be a number of seconds > 0"),
    ({"steps": 3}, "steps", "steps: unknown field"),
])
def test_every_bad_field_is_a_400_naming_it(server, body, param, message):
    http_address = server[2]
    body = {"prompt": PROMPT, **body} if "prompt" not in body and body else body
    status, reply = call_json(http_address, "POST", "/v1/images/generations", body)
    assert status == 400, reply
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["message"].startswith(message), reply


@pytest.mark.parametrize("content_type,body,param", [
    ("application/json", b"[" * 1000 + b"]" * 1000, None),  # RecursionError in json.loads
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=prompt\r\n"
     b"Content-Type: multipart/mixed; boundary=c\r\n\r\n--c\r\n\r\nx\r\n--c--\r\n--b--\r\n", "prompt"),
])
def test_malformed_bodies_are_400_without_exception_text(server, content_type, body, param):
    """Issue 31 finding 9: JSON nested 1,000 deep and a multipart field that is itself multipart
    were 500s carrying the Python exception (RecursionError, AttributeError)."""
    status, _, data = call(server[2], "POST", "/v1/images/generations", body, headers={"Content-Type": content_type})
    reply = json.loads(data)
    assert status == 400 and reply["error"]["param"] == param, reply
    assert "Error" not in reply["error"]["message"], reply


def test_refusals_keep_the_openai_shape_and_are_counted(server, oai):
    http_address = server[2]
    before = metric(http_address, "difflet_rejects_total", reason="invalid_argument")
    with pytest.raises(openai.BadRequestError) as err:
        oai.images.generate(prompt=PROMPT, extra_body={"num_inference_steps": 0})
    assert err.value.param == "num_inference_steps" and err.value.status_code == 400
    with pytest.raises(openai.NotFoundError) as err:
        oai.images.generate(prompt=PROMPT, model="dall-e-3")
    assert err.value.param == "model"
    assert metric(http_address, "difflet_rejects_total", reason="invalid_argument") == before + 2
    status, reply = call_json(http_address, "POST", "/v1/videos", {"prompt": PROMPT})
    assert (status, reply["error"]["param"], reply["error"]["code"]) == (400, "model", "wrong_route")
    status, _, body = call(http_address, "POST", "/v1/images/generations", b"{not json")
    assert status == 400 and b"not JSON" in body
    status, reply = call_json(http_address, "GET", "/v1/nothing")
    assert status == 404 and reply["error"]["code"] == "not_found"


def test_a_passed_deadline_is_504_and_the_server_serves_on(server, oai):
    http_address = server[2]
    # 1000 steps cannot finish in 50 ms on any CPU (each step is several program calls)
    status, reply = call_json(http_address, "POST", "/v1/images/generations",
                              {"prompt": PROMPT, "num_inference_steps": 1000, "timeout": 0.05})
    assert status == 504 and reply["error"]["code"] == "deadline"
    assert oai.images.generate(prompt=PROMPT, extra_body={"seed": 2}).data[0].b64_json


def test_a_deadline_past_the_bound_is_refused_or_clamped_and_the_server_serves_on(server, oai):
    """Issue 31, finding 1: a deadline of 2,200,000 s (past wait()'s 2**31 ms) ended the replica's
    supervisor thread, after which no request was ever answered. HTTP and --request-timeout refuse
    it naming the bound; a gRPC deadline past the bound is clamped to it and served."""
    from concurrent.futures import ThreadPoolExecutor

    from click.testing import CliRunner

    from difflet.runtime.server import main as runtime_main

    _, grpc_address, http_address = server
    status, reply = call_json(http_address, "POST", "/v1/images/generations", {"prompt": PROMPT, "timeout": 2_200_000})
    assert status == 400 and reply["error"]["param"] == "timeout", reply
    assert "<= 604800 (7 days)" in reply["error"]["message"], reply
    with ThreadPoolExecutor(1) as pool:  # on main this call was never answered: bounded here
        served = pool.submit(grpc_client.generate, grpc_address, PROMPT, 3, steps=2, timeout=2_200_000)
        assert served.result(timeout=300).png.startswith(b"\x89PNG")
    assert oai.images.generate(prompt=PROMPT, extra_body={"seed": 4}).data[0].b64_json  # still serving
    res = CliRunner().invoke(runtime_main, ["--artifacts", ".", "--request-timeout", "2200000"])
    assert res.exit_code == 2 and "2200000" in res.output and "604800" in res.output, res.output


def test_a_full_queue_is_429_and_shares_the_grpc_queue(server, hold_file):
    _, grpc_address, http_address = server
    # capacity 2 (--queue-size 1, one replica): one running request, held after its first step
    # until cancelled (hold-steps), and one queued fill it, for as long as the test needs
    hold_file.write_text("")
    running = Stream(grpc_address, PROMPT, 1, steps=1000, request_id="fill-running")
    running.wait_for("progress")
    waiting = Stream(grpc_address, PROMPT, 1, steps=1000, request_id="fill-queued")
    assert waiting.wait_for("queued").position == 0
    before = metric(http_address, "difflet_rejects_total", reason="queue_full")
    status, reply = call_json(http_address, "POST", "/v1/images/generations", {"prompt": PROMPT})
    assert status == 429 and reply["error"]["code"] == "queue_full", reply
    assert metric(http_address, "difflet_rejects_total", reason="queue_full") == before + 1
    for stream, rid in ((waiting, "fill-queued"), (running, "fill-running")):
        grpc_client.cancel(grpc_address, rid)
        assert stream.finish()[1].code() == grpc.StatusCode.CANCELLED
    hold_file.unlink()


def test_health_playground_metrics_and_no_torch_in_the_api_process(server):
    proc, _, http_address = server
    assert call_json(http_address, "GET", "/health") == (200, {"status": "serving"})
    status, headers, page = call(http_address, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"<title>Difflet playground</title>" in page
    assert metric(http_address, "difflet_requests_total", outcome="ok") >= 1
    assert not loads_torch(proc.pid), "the API process loaded libtorch"


def test_http_modules_import_without_torch():
    code = ("import sys\n"
            "import difflet.runtime.http.app, difflet.runtime.http.auth, difflet.runtime.server\n"
            "assert 'torch' not in sys.modules, sorted(k for k in sys.modules if 'torch' in k)[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_503_before_the_warm_up_passed(flux_tiny_art, tmp_path):
    import os

    from difflet.runtime.demo import launch_server, read_line

    fifo = tmp_path / "load.fifo"
    os.mkfifo(fifo)
    proc = launch_server(flux_tiny_art, ("--http-port", "0"), env={"DIFFLET_FAULTS": f"hold-load:{fifo}"})
    try:
        http_address = read_line(proc, "http on ")  # bound before the model process loads
        assert call_json(http_address, "GET", "/health") == (503, {"status": "not_serving"})
        status, reply = call_json(http_address, "POST", "/v1/images/generations", {"prompt": PROMPT})
        assert status == 503 and reply["error"]["code"] == "unavailable"
        assert "loading" in reply["error"]["message"]
        with open(fifo, "w") as f:  # blocks until the model process opened the FIFO
            f.write("go\n")
        read_line(proc, "listening on ")
        assert call_json(http_address, "GET", "/health") == (200, {"status": "serving"})
    finally:
        assert stop_server(proc) == 0


def test_truncation_is_reported_as_grpc_reports_it(server):
    """A prompt past the encoders' limits: each image item carries gRPC's `truncated` list."""
    long_prompt = " ".join(["a red fox in the snow"] * 20)
    reply = grpc_client.generate(server[1], long_prompt, 5, steps=1, timeout=300)
    status, body = call_json(server[2], "POST", "/v1/images/generations",
                             {"prompt": long_prompt, "seed": 5, "num_inference_steps": 1})
    assert status == 200, body
    want = [{"field": c.field, "encoder": c.encoder, "tokens": c.tokens, "kept": c.kept, "dropped": c.dropped}
            for c in reply.truncated]
    assert want and body["data"][0]["truncated"] == want
    status, body = call_json(server[2], "POST", "/v1/images/generations",
                             {"prompt": PROMPT, "seed": 5, "num_inference_steps": 1})
    assert status == 200 and "truncated" not in body["data"][0]
