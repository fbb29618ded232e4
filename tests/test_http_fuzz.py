"""Fuzzing the HTTP API from its own /openapi.json (schemathesis) on a real difflet-runtime
(flux-tiny, --api-key, --request-timeout 5): issue 31 item 4.

Oracles: the OpenAPI 3.1 specification (openapi-spec-validator) for the served spec, and the
documented error contract for every reply: no 500 at all (a 500 is a bug: an unexpected
exception), any other 5xx only with a documented OpenAI error object (503 unavailable/queue,
504 the request's deadline, 507 content bound), and every reply within CALL_S (no hang).
Schemathesis generates both valid bodies (which really generate images, bounded by the server's
5 s deadline) and invalid ones (wrong types, out-of-range numbers, unknown fields). Derandomized
with a fixed example count, so a run is reproducible and its time bounded (about a minute here).
"""
from __future__ import annotations

import json

import pytest
import schemathesis

from difflet.runtime.demo import stop_server
from http_util import call_json, start_http_server

pytestmark = pytest.mark.slow  # starts a server and makes a few hundred requests

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CALL_S = 60.0  # far above the 5 s request deadline: a reply later than this is a hang
EXAMPLES = 25  # per operation and generation mode
DOCUMENTED_5XX = {503: {"service_unavailable"}, 504: {"timeout"}, 507: {"server_error"}}


@pytest.fixture(scope="module")
def server(flux_tiny_art):
    proc, _, http_address = start_http_server(flux_tiny_art, "--api-key", KEY, "--request-timeout", "5",
                                              "--queue-size", "2")
    yield http_address
    assert stop_server(proc) == 0


def test_the_served_spec_is_valid_openapi(server):
    from openapi_spec_validator import validate

    status, spec = call_json(server, "GET", "/openapi.json")
    assert status == 200
    validate(spec)  # raises with the offending path if the spec is not OpenAPI 3.x
    assert {"/v1/images/generations", "/v1/videos", "/health"} <= set(spec["paths"])


def _check(case, response) -> None:
    where = f"{case.method} {case.formatted_path} {case.body!r:.300}"
    if response.status_code < 500:
        return
    assert response.status_code != 500, f"500 for {where}: {response.text[:300]}"
    body = json.loads(response.text)
    assert body["error"]["type"] in DOCUMENTED_5XX.get(response.status_code, ()), \
        f"undocumented {response.status_code} for {where}: {response.text[:300]}"


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_fuzzed_requests_get_no_500_and_no_hang(server, mode):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable

    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"http://{server}/openapi.json", timeout=CALL_S)
    generation = GenerationMode.POSITIVE if mode == "positive" else GenerationMode.NEGATIVE
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=generation))
        def fuzz(case) -> None:
            nonlocal calls
            calls += 1
            _check(case, case.call(base_url=f"http://{server}", headers=AUTH, timeout=CALL_S))

        try:
            fuzz()
        except Unsatisfiable:  # nothing can be invalid about it (no parameters, no body)
            assert mode == "negative" and not operation.body, operation.label
        except ValueError as err:
            # schemathesis' own negative generator cannot build a multipart `format: binary` part on
            # some draws (seen once in a full run, before any request left it): a tool limit, not a reply
            if mode != "negative" or "Unsupported type: 'Binary'" not in str(err):
                raise
    assert calls >= EXAMPLES  # the spec's operations were really exercised
