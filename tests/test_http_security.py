"""API key and TLS on both faces of a real difflet-runtime (flux-tiny): `--api-key` and
`--tls-cert/--tls-key`, with a CA made for the test.

Oracles: a refused call leaves no trace in the work counters (difflet_requests_total is
unchanged: nothing was admitted) and a body that is not even JSON is refused 401, not 400 (the
body is never parsed); a client trusting the test CA gets the same PNG as any other call.
"""
from __future__ import annotations

import base64
import http.client
import ssl

import grpc
import openai
import pytest
from click.testing import CliRunner

from difflet.runtime import client as grpc_client
from difflet.runtime.demo import stop_server
from http_util import call, call_json, make_tls, start_http_server

KEY = "s3cret-test-key"
PROMPT = "a red fox in the snow"


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(flux_tiny_art, tls):
    ca, cert, key = tls
    proc, grpc_address, http_address = start_http_server(
        flux_tiny_art, "--tls-cert", str(cert), "--tls-key", str(key), env={"DIFFLET_API_KEY": KEY})
    yield grpc_address, http_address
    assert stop_server(proc) == 0


@pytest.fixture(scope="module")
def context(tls):
    return ssl.create_default_context(cafile=str(tls[0]))


def work_done(http_address, context) -> float:
    """Requests admitted and answered so far (all outcomes), from the server's own metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, _, text = call(http_address, "GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"},
                           context=context)
    assert status == 200
    return sum(s.value for f in text_string_to_metric_families(text.decode()) for s in f.samples
               if s.name == "difflet_requests_total")


def test_http_without_the_key_is_401_before_the_body_is_read(server, context):
    _, http_address = server
    before = work_done(http_address, context)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, reply = call_json(http_address, "POST", "/v1/images/generations", b"{not json",
                                  headers=headers, context=context)
        assert status == 401 and reply["error"]["code"] == "invalid_api_key", reply
    status, _ = call_json(http_address, "GET", "/v1/models", context=context)
    assert status == 401
    # open without a key: the liveness probe and the static playground page
    assert call_json(http_address, "GET", "/health", context=context) == (200, {"status": "serving"})
    assert call(http_address, "GET", "/", context=context)[0] == 200
    assert work_done(http_address, context) == before


def test_openai_client_with_the_key_and_the_ca(server, context, tls):
    grpc_address, http_address = server
    oai = openai.OpenAI(base_url=f"https://{http_address}/v1", api_key=KEY, max_retries=0,
                        http_client=openai.DefaultHttpxClient(verify=context))
    png = base64.b64decode(oai.images.generate(prompt=PROMPT, extra_body={"seed": 3}).data[0].b64_json)
    assert png == grpc_client.generate(grpc_address, PROMPT, 3, timeout=300, api_key=KEY,
                                       tls_ca=str(tls[0])).png
    wrong = openai.OpenAI(base_url=f"https://{http_address}/v1", api_key="nope", max_retries=0,
                          http_client=openai.DefaultHttpxClient(verify=context))
    with pytest.raises(openai.AuthenticationError):
        wrong.images.generate(prompt=PROMPT)


def test_plain_text_and_untrusted_clients_do_not_connect(server):
    _, http_address = server
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        call(http_address, "GET", "/health", timeout=30)  # plain HTTP to the TLS port
    with pytest.raises(ssl.SSLCertVerificationError):  # TLS without the test CA
        call(http_address, "GET", "/health", context=ssl.create_default_context(), timeout=30)


def test_grpc_needs_the_key_and_tls(server, context, tls):
    grpc_address, http_address = server
    ca = str(tls[0])
    before = work_done(http_address, context)
    for key in (None, "wrong"):
        with pytest.raises(grpc.RpcError) as err:
            grpc_client.generate(grpc_address, PROMPT, 1, timeout=60, api_key=key, tls_ca=ca)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            grpc_client.get_profile(grpc_address, timeout=60, api_key=key, tls_ca=ca)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert work_done(http_address, context) == before
    assert grpc_client.get_profile(grpc_address, timeout=60, api_key=KEY, tls_ca=ca).height == 32
    with pytest.raises(grpc.RpcError) as err:  # a plain-text channel to the TLS port
        grpc_client.get_profile(grpc_address, timeout=10, api_key=KEY)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_cli_generate_sends_the_key_over_tls(server, tls, tmp_path, monkeypatch):
    from difflet.cli import main

    grpc_address, _ = server
    out = tmp_path / "fox.png"
    args = ["generate", "--server", grpc_address, PROMPT, "--seed", "4", "--tls-ca", str(tls[0]), "-o", str(out)]
    monkeypatch.delenv("DIFFLET_API_KEY", raising=False)
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 1 and "UNAUTHENTICATED" in refused.stderr and not out.exists()
    ok = CliRunner().invoke(main, args + ["--api-key", KEY])
    assert ok.exit_code == 0, ok.output
    monkeypatch.setenv("DIFFLET_API_KEY", KEY)
    again = tmp_path / "again.png"
    assert CliRunner().invoke(main, args[:-1] + [str(again)]).exit_code == 0
    assert out.read_bytes() == again.read_bytes() == grpc_client.generate(
        grpc_address, PROMPT, 4, timeout=300, api_key=KEY, tls_ca=str(tls[0])).png


def test_unusable_tls_files_are_one_error_line(flux_tiny_art, tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    for extra in (["--tls-cert", str(bad)], ["--tls-cert", str(bad), "--tls-key", str(bad)]):
        proc = subprocess.run([sys.executable, "-m", "difflet.runtime.server", "--artifacts",
                               str(flux_tiny_art), "--port", "0", "--http-port", "0", *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("error: ") and "--tls-" in line
