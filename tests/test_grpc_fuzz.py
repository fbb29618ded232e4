"""A hypothesis-driven fuzzer of the gRPC face of a real difflet-runtime (flux-tiny,
--request-timeout 5, --queue-size 2): issue 31 item 4.

Every field of GenerateRequest is drawn over its whole wire domain (any int64/int32, any double
including nan and inf, any unicode text, set or unset where the proto says `optional`) or drawn among requests that
pass admission (so generation, batching and the server's deadline are fuzzed too), with a
client deadline anywhere from 1 ms to 10^9 s (gRPC clamps and the server bounds it), on both
Generate and GenerateStream; Cancel gets arbitrary ids.

Oracle: the status-code contract of difflet.proto: a call ends OK or with INVALID_ARGUMENT,
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE or CANCELLED, never INTERNAL or UNKNOWN (an
unexpected exception on the server), and never later than CALL_S (the server answers every
request within its 5 s deadline plus a step; a call still open at CALL_S is a hang). Derandomized,
a fixed example count: reproducible and bounded (well under a minute here).
"""
from __future__ import annotations

import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from difflet.runtime import difflet_pb2 as pb
from difflet.runtime import difflet_pb2_grpc as pb_grpc
from difflet.runtime.demo import start_server, stop_server

pytestmark = pytest.mark.slow  # starts a server and makes a few hundred calls

CALL_S = 60.0
EXAMPLES = 120
ANSWERS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
SMALL = st.integers(-2, 1100)  # near the bounds, where most of the checks are
SIZE = 32  # flux-tiny's served size (the fixture checks it)
TEXT = st.text(max_size=200) | st.sampled_from(["", " ", "a red fox", "off", "cadence:2",
                                                "online-delta:0.1", "calibrated:x", "lora:1"])


@pytest.fixture(scope="module")
def stub(flux_tiny_art):
    proc, address = start_server(flux_tiny_art, args=("--request-timeout", "5", "--queue-size", "2"))
    with grpc.insecure_channel(address) as channel:
        sizes = pb_grpc.DiffletStub(channel).GetProfile(pb.GetProfileRequest(), timeout=CALL_S).sizes
        assert f"{SIZE}x{SIZE}" in sizes, sizes
        yield pb_grpc.DiffletStub(channel)
    assert stop_server(proc) == 0


def _unset(strategy):
    return st.none() | strategy


wild = st.fixed_dictionaries({
    "prompt": TEXT, "seed": INT64 | SMALL, "height": INT32 | st.sampled_from([0, 32, 64]),
    "width": INT32 | st.sampled_from([0, 32, 64]), "request_id": TEXT, "cache": TEXT,
    "frames": INT32 | SMALL, "lora": TEXT,
    "steps": _unset(INT32 | SMALL), "guidance": _unset(st.floats() | st.floats(-1, 200)),
    "negative_prompt": _unset(TEXT),
    # the image fields, refused by this text-only profile before anything is decoded
    "strength": _unset(st.floats() | st.floats(-1, 2)), "image": st.lists(st.binary(max_size=64), max_size=2),
    "mask_image": _unset(st.binary(max_size=64)),
})
# requests that pass admission (mostly), so generation, batching and the deadline are fuzzed too
valid = st.fixed_dictionaries({
    "prompt": st.text(st.characters(codec="utf-8"), min_size=1, max_size=300).filter(str.strip),
    "seed": st.integers(0, 2**63 - 1), "steps": _unset(st.integers(1, 6)),
    "guidance": _unset(st.floats(0, 100) | st.floats(min_value=0)), "height": st.sampled_from([0, SIZE]),
    "width": st.sampled_from([0, SIZE]), "cache": st.sampled_from(["", "off", "cadence:2", "online-delta:0.1"]),
    "negative_prompt": _unset(st.text(max_size=50)), "request_id": st.just(""),
})
requests = wild | valid


def _call(fn, request, deadline: float):
    """(status code, seconds) of one unary or streaming call."""
    began = time.monotonic()
    try:
        result = fn(request, timeout=deadline)
        if isinstance(result, grpc.Future):  # a stream: read it to its end
            for _ in result:
                pass
        return grpc.StatusCode.OK, time.monotonic() - began
    except grpc.RpcError as err:
        return err.code(), time.monotonic() - began


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(fields=requests, deadline=st.floats(1e-3, 1e9), stream=st.booleans())
def test_generate_answers_within_the_contract(stub, fields, deadline, stream):
    request = pb.GenerateRequest(**{k: v for k, v in fields.items() if v is not None})
    code, took = _call(stub.GenerateStream if stream else stub.Generate, request, min(deadline, CALL_S))
    assert took < CALL_S - 1, f"no answer within {CALL_S:g} s (a hang) for {fields}"
    assert code in ANSWERS, f"{code} for {fields}"


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(request_id=TEXT)
def test_cancel_of_any_id_answers(stub, request_id):
    code, took = _call(stub.Cancel, pb.CancelRequest(request_id=request_id), CALL_S)
    assert took < CALL_S - 1 and code in ANSWERS, (code, request_id)
