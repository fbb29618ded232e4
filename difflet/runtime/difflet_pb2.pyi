from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "seed", "steps", "guidance", "height", "width", "request_id", "cache", "negative_prompt", "frames", "lora", "image", "mask_image", "strength", "guidance_2", "stg_scale", "modality_scale")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MASK_IMAGE_FIELD_NUMBER: _ClassVar[int]
    STRENGTH_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_2_FIELD_NUMBER: _ClassVar[int]
    STG_SCALE_FIELD_NUMBER: _ClassVar[int]
    MODALITY_SCALE_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    seed: int
    steps: int
    guidance: float
    height: int
    width: int
    request_id: str
    cache: str
    negative_prompt: str
    frames: int
    lora: str
    image: _containers.RepeatedScalarFieldContainer[bytes]
    mask_image: bytes
    strength: float
    guidance_2: float
    stg_scale: float
    modality_scale: float
    def __init__(self, prompt: _Optional[str] = ..., seed: _Optional[int] = ..., steps: _Optional[int] = ..., guidance: _Optional[float] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., request_id: _Optional[str] = ..., cache: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., frames: _Optional[int] = ..., lora: _Optional[str] = ..., image: _Optional[_Iterable[bytes]] = ..., mask_image: _Optional[bytes] = ..., strength: _Optional[float] = ..., guidance_2: _Optional[float] = ..., stg_scale: _Optional[float] = ..., modality_scale: _Optional[float] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("encode_ms", "denoise_ms", "decode_ms", "total_ms", "queue_ms")
    ENCODE_MS_FIELD_NUMBER: _ClassVar[int]
    DENOISE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    encode_ms: float
    denoise_ms: float
    decode_ms: float
    total_ms: float
    queue_ms: float
    def __init__(self, encode_ms: _Optional[float] = ..., denoise_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., queue_ms: _Optional[float] = ...) -> None: ...

class GenerateReply(_message.Message):
    __slots__ = ("png", "mp4", "frames", "fps", "seed", "steps", "timings", "request_id", "guidance", "height", "width", "cached_steps", "denoiser_calls", "cache", "model_pid", "replica", "truncated")
    PNG_FIELD_NUMBER: _ClassVar[int]
    MP4_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    CACHED_STEPS_FIELD_NUMBER: _ClassVar[int]
    DENOISER_CALLS_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    png: bytes
    mp4: bytes
    frames: int
    fps: float
    seed: int
    steps: int
    timings: Timings
    request_id: str
    guidance: float
    height: int
    width: int
    cached_steps: int
    denoiser_calls: int
    cache: str
    model_pid: int
    replica: int
    truncated: _containers.RepeatedCompositeFieldContainer[PromptTruncation]
    def __init__(self, png: _Optional[bytes] = ..., mp4: _Optional[bytes] = ..., frames: _Optional[int] = ..., fps: _Optional[float] = ..., seed: _Optional[int] = ..., steps: _Optional[int] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ..., guidance: _Optional[float] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., cached_steps: _Optional[int] = ..., denoiser_calls: _Optional[int] = ..., cache: _Optional[str] = ..., model_pid: _Optional[int] = ..., replica: _Optional[int] = ..., truncated: _Optional[_Iterable[_Union[PromptTruncation, _Mapping]]] = ...) -> None: ...

class PromptTruncation(_message.Message):
    __slots__ = ("field", "encoder", "tokens", "kept", "dropped")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    field: str
    encoder: str
    tokens: int
    kept: int
    dropped: int
    def __init__(self, field: _Optional[str] = ..., encoder: _Optional[str] = ..., tokens: _Optional[int] = ..., kept: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...

class Queued(_message.Message):
    __slots__ = ("request_id", "position")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    position: int
    def __init__(self, request_id: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("request_id", "step", "total", "cached", "model_pid")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    MODEL_PID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    step: int
    total: int
    cached: bool
    model_pid: int
    def __init__(self, request_id: _Optional[str] = ..., step: _Optional[int] = ..., total: _Optional[int] = ..., cached: _Optional[bool] = ..., model_pid: _Optional[int] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("queued", "progress", "result")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    queued: Queued
    progress: Progress
    result: GenerateReply
    def __init__(self, queued: _Optional[_Union[Queued, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., result: _Optional[_Union[GenerateReply, _Mapping]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class CancelReply(_message.Message):
    __slots__ = ("found", "state")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    state: str
    def __init__(self, found: _Optional[bool] = ..., state: _Optional[str] = ...) -> None: ...

class GetProfileRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelProcess(_message.Message):
    __slots__ = ("replica", "pid", "state", "served", "compiles", "generation", "error")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    COMPILES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    replica: int
    pid: int
    state: str
    served: int
    compiles: int
    generation: int
    error: str
    def __init__(self, replica: _Optional[int] = ..., pid: _Optional[int] = ..., state: _Optional[str] = ..., served: _Optional[int] = ..., compiles: _Optional[int] = ..., generation: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ServingState(_message.Message):
    __slots__ = ("processes", "queue_size", "queue_depth", "recoveries", "request_timeout_s", "grace_s")
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    RECOVERIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ModelProcess]
    queue_size: int
    queue_depth: int
    recoveries: int
    request_timeout_s: float
    grace_s: float
    def __init__(self, processes: _Optional[_Iterable[_Union[ModelProcess, _Mapping]]] = ..., queue_size: _Optional[int] = ..., queue_depth: _Optional[int] = ..., recoveries: _Optional[int] = ..., request_timeout_s: _Optional[float] = ..., grace_s: _Optional[float] = ...) -> None: ...

class Profile(_message.Message):
    __slots__ = ("model", "family", "height", "width", "steps", "guidance", "max_text", "dtype", "parallel", "target", "components", "attrs", "cache", "prompt_tokens", "prompt_policy", "serving", "sizes")
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
    CACHE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_POLICY_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
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
    cache: str
    prompt_tokens: int
    prompt_policy: str
    serving: ServingState
    sizes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., family: _Optional[str] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., steps: _Optional[int] = ..., guidance: _Optional[float] = ..., max_text: _Optional[int] = ..., dtype: _Optional[str] = ..., parallel: _Optional[str] = ..., target: _Optional[str] = ..., components: _Optional[_Iterable[str]] = ..., attrs: _Optional[_Mapping[str, str]] = ..., cache: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., prompt_policy: _Optional[str] = ..., serving: _Optional[_Union[ServingState, _Mapping]] = ..., sizes: _Optional[_Iterable[str]] = ...) -> None: ...
