"""The request bodies of /openapi.json, derived from the one request schema (request.FIELDS, in
their HTTP spelling) plus the HTTP API's own fields (fields.py's lists).

Invariant: the schema describes exactly the fields fields.py accepts (`additionalProperties:
false`, as fields.py refuses unknown fields), with the request schema's types and bounds; the
served sizes and the model name come from the artifact, so the spec is this server's.
"""
from __future__ import annotations

from typing import Any

from difflet.runtime.http import fields as F
from difflet.runtime.request import FIELDS
from difflet.runtime.validate import MAX_TIMEOUT_S

_JSON = {int: "integer", float: "number", str: "string"}


def _field_schema(field) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": _JSON[field.kind], "description": field.doc}
    lim = field.limits
    for ours, theirs in (("minimum", "ge"), ("exclusiveMinimum", "gt"), ("maximum", "le"),
                         ("maxLength", "max_length"), ("pattern", "pattern")):
        value = getattr(lim, theirs, None)
        if value is not None:
            schema[ours] = value
    if field.optional:
        schema = {"anyOf": [schema, {"type": "null"}], "description": field.doc}
    return schema


def _http_fields(api, kind: str) -> dict[str, Any]:
    sizes = sorted({"x".join(s.split("x")[:2]) for s in api.info.manifest.sizes})
    props: dict[str, Any] = {
        "model": {"type": "string", "enum": [api.model_id], "description": "the served model"},
        "size": {"type": "string", "enum": ["auto", *sizes], "description": "WIDTHxHEIGHT, a served size"},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S,
                    "description": "seconds until the request's deadline"},
    }
    for field in FIELDS:
        name = F.HTTP_NAME.get(field.name)
        if name and name not in props and (kind == "video" or field.name not in F.VIDEO_ONLY):
            props[name] = _field_schema(field)
    props["seed"]["description"] = "absent: a fresh random seed (reported back)"
    for name in F.IGNORED:
        props[name] = {"description": "accepted for OpenAI compatibility; no effect"}
    if kind == "edit":
        binary = {"type": "string", "format": "binary"}
        props.update({"image": {"anyOf": [binary, {"type": "array", "items": binary}],
                                "description": "the input image file(s): PNG, JPEG or WebP"},
                      "image[]": {"type": "array", "items": binary, "description": "several input images"},
                      "mask": {**binary, "description": "inpainting: white = repaint, black = keep"},
                      "input_fidelity": {"description": "accepted for OpenAI compatibility; no effect"}})
    if kind in ("image", "edit"):
        props.update(n={"type": "integer", "minimum": 1, "maximum": F.MAX_N},
                     response_format={"type": "string", "enum": ["b64_json", "url"]},
                     output_format={"type": "string", "enum": list(F.IMAGE_FORMATS)},
                     stream={"type": "boolean", "description": "Server-Sent Events per step"})
    else:
        props.update(seconds={"anyOf": [{"type": "string"}, {"type": "number"}],
                              "description": "the video length (a frame count at the model's fps)"},
                     fps={"type": "number", "enum": [api.fps]},
                     input_reference={"anyOf": [{"type": "string", "format": "binary"},
                                                {"type": "string", "pattern": "^data:"}],
                                      "description": "image-to-video: the first frame, a PNG, JPEG or WebP "
                                                     "file part or a base64 data URL"},
                     last_image={"anyOf": [{"type": "string", "format": "binary"},
                                           {"type": "string", "pattern": "^data:"}],
                                 "description": "first-last-frame to video (Difflet's): the last frame, "
                                                "in input_reference's forms"})
    allowed = (*{"image": F.IMAGE_FIELDS, "edit": F.EDIT_FIELDS}.get(kind, F.VIDEO_FIELDS), "timeout")
    assert set(props) == set(allowed), set(props) ^ set(allowed)  # the spec is what fields.py reads
    return props


def body(api, kind: str) -> dict[str, Any]:
    """`openapi_extra` of a route taking a `kind` ("image", "edit" or "video") request body."""
    schema = {"type": "object", "required": ["prompt"], "additionalProperties": False,
              "properties": _http_fields(api, kind)}
    content = {} if kind == "edit" else {"application/json": {"schema": schema}}
    if kind in ("video", "edit"):  # what the openai package sends to POST /videos
        content["multipart/form-data"] = {"schema": schema}
    return {"requestBody": {"required": True, "content": content}}
