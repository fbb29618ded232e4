"""Several API keys on a real difflet-runtime (flux-tiny; DIFFLET_API_KEY="KEY_A KEY_B"): what one
key's holders make is theirs only (issue 31 item 2, finding 7 "scoped to the key").

Oracle: the threat model of docs/serving.md. An image `url` made with key A is 404 with key B
(exactly as a name never made) and 200 with A; B's gRPC Cancel of A's running request id finds
nothing and leaves it running, B may use the same request id at the same time (no
`duplicate_id`: ids are per key), A's Cancel finds it. Both keys are accepted, a third is not.
"""
from __future__ import annotations

import grpc
import pytest

from difflet.runtime import client
from difflet.runtime.demo import stop_server
from http_util import call, call_json, start_http_server
from serving_util import Stream

pytestmark = pytest.mark.slow  # starts a server

KEY_A, KEY_B = "key-of-a", "key-of-b"
PROMPT = "a red fox in the snow"


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def server(flux_tiny_art):
    proc, grpc_address, http_address = start_http_server(flux_tiny_art, env={"DIFFLET_API_KEY": f"{KEY_A} {KEY_B}"})
    yield grpc_address, http_address
    assert stop_server(proc) == 0


def test_an_image_url_is_its_keys_only(server):
    _, http_address = server
    status, reply = call_json(http_address, "POST", "/v1/images/generations",
                              {"prompt": PROMPT, "seed": 3, "response_format": "url"}, headers=auth(KEY_A))
    assert status == 200, reply
    path = "/v1/images/" + reply["data"][0]["url"].rsplit("/", 1)[1]
    status, _, png = call(http_address, "GET", path, headers=auth(KEY_A))
    assert status == 200 and png.startswith(b"\x89PNG")
    status, other = call_json(http_address, "GET", path, headers=auth(KEY_B))
    never = call_json(http_address, "GET", "/v1/images/img-never-made.png", headers=auth(KEY_B))
    assert (status, other["error"]["code"]) == (404, "not_found") and never[0] == 404
    assert call_json(http_address, "GET", path, headers=auth("key-of-c"))[0] == 401
    assert call_json(http_address, "GET", "/v1/videos", headers=auth(KEY_B)) == (200, {"object": "list", "data": []})


def test_request_ids_and_cancel_are_per_key(server):
    grpc_address, _ = server
    a = Stream(grpc_address, PROMPT, 1, steps=1000, request_id="shared-id", api_key=KEY_A)
    try:
        a.wait_for("progress")
        assert not client.cancel(grpc_address, "shared-id", api_key=KEY_B).found
        b = Stream(grpc_address, PROMPT, 2, steps=2, request_id="shared-id", api_key=KEY_B)
        assert b.wait_for("queued").request_id == "shared-id"  # not refused as a duplicate
        assert not a.done.is_set()
        assert client.cancel(grpc_address, "shared-id", api_key=KEY_A).found
        _, error = a.finish()
        assert error is not None and error.code() == grpc.StatusCode.CANCELLED, error
        result, error = b.finish()
        assert error is None and result.request_id == "shared-id"
    finally:
        client.cancel(grpc_address, "shared-id", api_key=KEY_A)
