from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "seed", "steps", "guidance", "height", "width", "request_id")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    seed: int
    steps: int
    guidance: float
    height: int
    width: int
    request_id: str
    def __init__(self, prompt: _Optional[str] = ..., seed: _Optional[int] = ..., steps: _Optional[int] = ..., guidance: _Optional[float] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("encode_ms", "denoise_ms", "decode_ms", "total_ms")
    ENCODE_MS_FIELD_NUMBER: _ClassVar[int]
    DENOISE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    encode_ms: float
    denoise_ms: float
    decode_ms: float
    total_ms: float
    def __init__(self, encode_ms: _Optional[float] = ..., denoise_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class GenerateReply(_message.Message):
    __slots__ = ("png", "seed", "steps", "timings", "request_id", "guidance", "height", "width")
    PNG_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    png: bytes
    seed: int
    steps: int
    timings: Timings
    request_id: str
    guidance: float
    height: int
    width: int
    def __init__(self, png: _Optional[bytes] = ..., seed: _Optional[int] = ..., steps: _Optional[int] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ..., guidance: _Optional[float] = ..., height: _Optional[int] = ..., width: _Optional[int] = ...) -> None: ...

class GetProfileRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Profile(_message.Message):
    __slots__ = ("model", "family", "height", "width", "steps", "guidance", "max_text", "dtype", "parallel", "target", "components", "attrs")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXT_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    model: str
    family: str
    height: int
    width: int
    steps: int
    guidance: float
    max_text: int
    dtype: str
    parallel: str
    target: str
    components: _containers.RepeatedScalarFieldContainer[str]
    attrs: _containers.ScalarMap[str, str]
    def __init__(self, model: _Optional[str] = ..., family: _Optional[str] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., steps: _Optional[int] = ..., guidance: _Optional[float] = ..., max_text: _Optional[int] = ..., dtype: _Optional[str] = ..., parallel: _Optional[str] = ..., target: _Optional[str] = ..., components: _Optional[_Iterable[str]] = ..., attrs: _Optional[_Mapping[str, str]] = ...) -> None: ...
