"""The one request schema (difflet/runtime/request.py) against difflet.proto and the faces derived
from it. Torch-free and fast: no server, no artifacts.

Oracles: the proto's own descriptor (GenerateRequest, compiled from difflet.proto), click's parsed
options of `difflet generate`, inspect.signature of the Python API, and the messages the existing
serving tests check (each range message is the one the gRPC and HTTP tests expect).
"""
from __future__ import annotations

import inspect

import msgspec
import pytest
from google.protobuf.descriptor import FieldDescriptor

from difflet.errors import DiffletError
from difflet.runtime import difflet_pb2 as pb
from difflet.runtime import messages
from difflet.runtime.request import FIELDS, MEDIA, Request, check, from_arguments, names

PROTO_KINDS = {FieldDescriptor.TYPE_INT32: int, FieldDescriptor.TYPE_INT64: int,
               FieldDescriptor.TYPE_DOUBLE: float, FieldDescriptor.TYPE_FLOAT: float,
               FieldDescriptor.TYPE_STRING: str}
INT32_MAX = 2**31 - 1


def test_every_schema_field_has_a_proto_field_of_the_same_meaning_and_back():
    proto = {f.name: f for f in pb.GenerateRequest.DESCRIPTOR.fields}
    assert set(proto) == {f.name for f in FIELDS} | set(MEDIA)  # both ways: no field only on one side
    # the image fields: encoded bytes on the wire, several images, an optional mask
    assert proto["image"].type == proto["mask_image"].type == FieldDescriptor.TYPE_BYTES
    assert proto["image"].is_repeated and proto["mask_image"].has_presence
    for f in FIELDS:
        p = proto[f.name]
        assert PROTO_KINDS[p.type] is f.kind, f.name
        assert not p.is_repeated, f.name
        # "unset = the default" is None in the schema iff the proto can tell unset from a value
        assert p.has_presence == f.optional, f.name
        if p.type == FieldDescriptor.TYPE_INT32 and f.limits.le is not None:
            assert f.limits.le <= INT32_MAX, f.name  # the declared range fits the wire type


def test_proto_defaults_mean_the_schema_defaults():
    """An empty GenerateRequest reads as the schema's unset markers (0, "", unset optional)."""
    empty = pb.GenerateRequest()
    for f in FIELDS:
        if f.optional:
            assert not empty.HasField(f.name) and f.default is None, f.name
        elif not f.required:
            assert getattr(empty, f.name) == f.default, f.name


@pytest.mark.parametrize("values,where,message", [
    ({"prompt": "   "}, "prompt", "prompt: must be a non-empty string"),
    ({"prompt": 5}, "prompt", "prompt: must be a string, not int 5"),
    ({}, "prompt", "prompt: is required"),
    ({"seed": -1}, "seed", "seed: -1 is outside [0, 9223372036854775807]"),
    ({"steps": 0}, "steps", "steps: 0 is outside [1, 1000]"),
    ({"steps": True}, "steps", "steps: must be an integer, not bool True"),
    ({"guidance": float("nan")}, "guidance", "guidance: nan must be finite and in [0, 100]"),
    ({"guidance": -1}, "guidance", "guidance: -1.0 must be finite and in [0, 100]"),
    ({"strength": 0}, "strength", "strength: 0.0 must be finite and in (0, 1]"),
    ({"strength": 1.5}, "strength", "strength: 1.5 must be finite and in (0, 1]"),
    ({"height": -2}, "height", "height: -2 must be >= 0"),
    ({"request_id": "x" * 129}, "request_id", "request_id: is 129 characters, at most 128"),
    ({"request_id": "tab\there"}, "request_id", "request_id: must be printable ASCII"),
    ({"num_inference_steps": 3}, "num_inference_steps", "num_inference_steps: unknown request field"),
])
def test_each_declared_range_is_checked_naming_the_field(values, where, message):
    with pytest.raises(DiffletError) as err:
        check({"prompt": "a fox", **values} if "prompt" not in values and values else values)
    assert err.value.where == where and err.value.message.startswith(message)


def test_none_is_not_given_and_values_keep_their_types():
    request = check({"prompt": "a fox", "steps": None, "guidance": 2, "negative_prompt": None})
    assert request == Request("a fox", guidance=2.0) and type(request.guidance) is float


def test_the_model_process_message_checks_the_declared_ranges_on_decode():
    run = messages.Run(3, check({"prompt": "a fox", "steps": 4}))
    assert messages.decode_to_model(messages.encode(run)) == run
    bad = msgspec.msgpack.encode({"type": "run", "seq": 3, "fields": {"prompt": "a fox", "steps": 0}})
    with pytest.raises(msgspec.ValidationError, match=r"steps"):
        messages.decode_to_model(bad)


def test_the_cli_options_are_the_schema_fields():
    from difflet.runtime.commands import generate

    options = {p.name: p for p in generate.params}
    for f in FIELDS:
        if f.name != "prompt":
            assert f"--{f.name.replace('_', '-')}" in options[f.name].opts, f.name
            assert options[f.name].default == f.default and options[f.name].help == f.doc


def test_the_python_api_keywords_are_the_schema_fields():
    from difflet.pipeline import DiffletPipeline
    from difflet.runtime.client import Client

    api = names("api")
    assert (api["steps"], api["guidance"], api["frames"]) == ("num_inference_steps", "guidance_scale", "num_frames")
    for fn in (DiffletPipeline.__call__, Client.generate):
        params = inspect.signature(fn).parameters
        assert set(api.values()) <= set(params), fn
    assert from_arguments({"num_inference_steps": 3, "cache": "off"}, "f") == {"steps": 3, "cache": "off"}
    with pytest.raises(TypeError, match="unexpected keyword argument 'steps'"):
        from_arguments({"steps": 3}, "f")


def test_the_http_body_fields_are_the_schema_fields():
    from difflet.runtime.http import errors, fields

    http = names("http")
    assert "request_id" not in http and http["height"] == http["width"] == "size"
    assert set(http.values()) - {"num_frames"} <= set(fields.IMAGE_FIELDS)
    assert set(http.values()) <= set(fields.VIDEO_FIELDS)
    assert errors.PARAM_NAMES == http
