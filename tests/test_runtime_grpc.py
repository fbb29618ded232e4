"""difflet-runtime over real gRPC on loopback: one server subprocess (module scope) on flux-tiny ART.

Oracle for the served image: diffusers' FluxPipeline.from_pretrained(the same checkpoint) with the
same prompt, seed, steps and guidance. PSNR >= 40 dB is the stated bar; because random tiny weights
move the image little, the test also requires every pixel within 1 of the reference (compiled
float rounding may flip a rounding, a host mistake moves many pixels by more).
"""
from __future__ import annotations

import io
import socket
import subprocess
import sys

import grpc
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from difflet.runtime import client
from difflet.runtime.demo import start_server, stop_server
from oracle_util import assert_images_close


def png_array(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture(scope="module")
def server(flux_tiny_art):
    proc, address = start_server(flux_tiny_art)
    yield address
    assert stop_server(proc) == 0, "difflet-runtime did not exit cleanly on SIGTERM"


def test_health_is_serving_and_reflection_lists_services(server):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    assert client.health_status(server) == "SERVING"
    with client.channel(server) as ch:
        services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
    assert {"difflet.v1.Difflet", "grpc.health.v1.Health"} <= services


def test_get_profile_reports_the_compiled_profile(server):
    profile = client.get_profile(server)
    assert (profile.family, profile.height, profile.width, profile.steps) == ("flux", 32, 32, 4)
    assert profile.guidance == pytest.approx(3.5)
    assert set(profile.components) == {"text_encoder", "text_encoder_2", "transformer", "vae"}


@pytest.mark.parametrize("prompt,seed,steps,guidance", [
    ("a red fox in the snow", 42, None, None),
    ("blue circle on a white background", 7, 2, 1.0),
])
def test_served_image_matches_fluxpipeline(server, flux_tiny_ckpt, prompt, seed, steps, guidance):
    from diffusers import FluxPipeline

    reply = client.generate(server, prompt, seed, steps=steps, guidance=guidance, timeout=300)
    ours = png_array(reply.png)
    pipe = FluxPipeline.from_pretrained(str(flux_tiny_ckpt))
    pipe.set_progress_bar_config(disable=True)
    ref = np.asarray(pipe(prompt, generator=torch.Generator("cpu").manual_seed(seed),
                          num_inference_steps=reply.steps, guidance_scale=reply.guidance,
                          height=32, width=32, max_sequence_length=32).images[0])
    assert (reply.seed, reply.steps) == (seed, steps or 4)
    assert ours.shape == ref.shape == (32, 32, 3)
    assert_images_close(ours, ref, what="served PNG vs FluxPipeline")
    assert min(reply.timings.encode_ms, reply.timings.denoise_ms, reply.timings.decode_ms) > 0


def test_difflet_client_names_arguments_as_diffusers_does(server):
    """`difflet.Client(...).generate` is the same Generate call as the module functions."""
    import difflet

    c = difflet.Client(server, timeout=300)
    assert c.profile().height == 32
    reply = c.generate("a cat on a box", seed=3, num_inference_steps=2, guidance_scale=1.0)
    same = client.generate(server, "a cat on a box", 3, steps=2, guidance=1.0, timeout=300)
    assert (reply.steps, reply.guidance) == (2, 1.0) and reply.png == same.png
    assert np.array_equal(np.asarray(c.image(reply)), png_array(same.png))


def test_repeated_requests_are_byte_identical(server):
    first = client.generate(server, "a cat on a box", 3, timeout=300).png
    other = client.generate(server, "a green tree", 4, steps=3, timeout=300).png
    again = client.generate(server, "a cat on a box", 3, timeout=300).png
    assert first == again  # one server, one compiled program, same request: exact by construction
    assert other != first


@pytest.mark.parametrize("kwargs,details", [
    ({"height": 64}, "height: 64 does not match the serving profile (32)"),
    ({"width": 48}, "width: 48 does not match the serving profile (32)"),
    ({"steps": 0}, "steps: 0 is outside [1, 1000]"),
    ({"steps": 1001}, "steps: 1001 is outside [1, 1000]"),
    ({"guidance": float("nan")}, "guidance: nan must be finite and in [0, 100]"),
    ({"guidance": -1.0}, "guidance: -1.0 must be finite and in [0, 100]"),
    ({"guidance": 1.3e308}, "guidance: 1.3e+308 must be finite and in [0, 100]"),  # overflowed in torch (issue 31 fuzzing)
    ({"prompt": ""}, "prompt: must be a non-empty string"),
    ({"seed": -5}, "seed: -5 is outside"),
    ({"cache": "sometimes"}, "cache: unknown cache mode 'sometimes'"),
    ({"cache": "cadence:0"}, "cache: cadence interval 0 is outside [2, "),
    ({"request_id": "x" * 129}, "request_id: is 129 characters, at most 128"),
    ({"request_id": "tab\there"}, "request_id: must be printable ASCII"),
])
def test_invalid_requests_are_invalid_argument_naming_the_field(server, kwargs, details):
    fields = {"prompt": "a red fox", "seed": 1, **kwargs}
    with pytest.raises(grpc.RpcError) as err:
        client.generate(server, fields.pop("prompt"), fields.pop("seed"), timeout=60, **fields)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details in err.value.details()


def _refusing_port() -> socket.socket:
    """A socket bound to a loopback port and never listening: connections to it are refused, and
    no other process can take the port while it is held (a closed "free" port could be reused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def test_cli_generate_exit_codes(server, tmp_path):
    from difflet.cli import main

    out = tmp_path / "fox.png"
    ok = CliRunner().invoke(main, ["generate", "--server", server, "a red fox in the snow", "--seed", "42",
                                   "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    # the CLI and the client asked one server (one compiled program) the same: exact by construction
    assert out.read_bytes() == client.generate(server, "a red fox in the snow", 42, timeout=300).png

    bad = CliRunner().invoke(main, ["generate", "--server", server, "a fox", "--height", "64",
                                    "-o", str(tmp_path / "x.png")])
    assert bad.exit_code == 2
    assert bad.stderr.strip().startswith("error: ") and "height: 64" in bad.stderr
    assert "Traceback" not in bad.output and len(bad.stderr.strip().splitlines()) == 1

    with _refusing_port() as refusing:
        down = CliRunner().invoke(main, ["generate", "--server", "127.0.0.1:%d" % refusing.getsockname()[1],
                                         "a fox", "-o", str(tmp_path / "y.png"), "--timeout", "60"])
    assert down.exit_code == 1
    assert "UNAVAILABLE" in down.stderr and "Traceback" not in down.output
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "y.png").exists()


def test_cache_override_skips_denoiser_calls_and_off_matches_the_default(server):
    # 20 steps: the step cache keeps its first and last 5 steps full, cadence:2 skips every other
    plain = client.generate(server, "a red fox", 9, steps=20, timeout=300)
    off = client.generate(server, "a red fox", 9, steps=20, cache="off", timeout=300)
    cached = client.generate(server, "a red fox", 9, steps=20, cache="cadence:2", timeout=300)
    assert (plain.cache, plain.cached_steps, plain.denoiser_calls) == ("off", 0, 20)
    assert off.png == plain.png and off.cache == "off"  # same server and request: exact
    assert cached.cache == "cadence:2" and cached.cached_steps == 5
    assert cached.denoiser_calls + cached.cached_steps == 20
    with pytest.raises(grpc.RpcError) as err:  # a request names a --calibration, never a file
        client.generate(server, "a red fox", 9, cache="calibrated:/nonexistent.json", timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("cache: ")


def test_cli_generate_progress_and_timeout(server, tmp_path):
    from difflet.cli import main

    out = tmp_path / "fox.png"
    ok = CliRunner().invoke(main, ["generate", "--server", server, "a red fox", "--steps", "3",
                                   "--progress", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert "step 1/3" in ok.stderr and "step 3/3 [" + "#" * 30 + "]" in ok.stderr
    assert ok.stdout.startswith(f"wrote {out}")

    # 1000 steps in 0.1 s would be 0.1 ms a step: late on any CPU, however fast or idle
    late = CliRunner().invoke(main, ["generate", "--server", server, "a red fox", "--steps", "1000",
                                     "--timeout", "0.1", "-o", str(tmp_path / "late.png")])
    assert late.exit_code == 1
    assert late.stderr.startswith("error: ") and "DEADLINE_EXCEEDED" in late.stderr
    assert len(late.stderr.strip().splitlines()) == 1 and not (tmp_path / "late.png").exists()


def test_runtime_rejects_a_missing_artifact_dir(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "difflet.runtime.server", "--artifacts",
                           str(tmp_path / "nope"), "--port", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in proc.stderr and "listening on" not in proc.stdout
