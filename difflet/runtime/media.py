"""Output encoding: an image -> PNG, a video (+ optional audio) -> MP4 through PyAV (FFmpeg).

Invariants:
- Deterministic: the same frames give the same bytes (no timestamps in PNG; MP4 metadata has no
  creation time and x264 runs single-threaded).
- Videos are H.264 yuv420p at CRF 12 (near-lossless for review, playable everywhere); odd frame
  sizes are refused, since yuv420p needs even width and height. Audio is AAC.
- `lossless=True` (difflet-runtime --lossless-video): H.264 RGB 4:4:4 at qp 0 (libx264rgb), so
  the decoded frames are the generated frames exactly; larger files that browsers do not play.
"""
from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

from difflet.errors import DiffletError


def encode_png(image: np.ndarray) -> bytes:
    """Deterministic PNG bytes of a uint8 [H, W, 3] array (no timestamps, fixed compression)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def encode_mp4(video: np.ndarray, fps: float, audio: np.ndarray | None = None,
               sample_rate: int = 0, crf: int = 12, lossless: bool = False) -> bytes:
    """MP4 bytes of uint8 [F, H, W, 3] frames at `fps`; `audio` float32 [channels, samples];
    `lossless`: RGB H.264 at qp 0, decoding to exactly these frames."""
    import av

    if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8:
        raise DiffletError(f"video must be uint8 [F, H, W, 3], got {video.dtype} {list(video.shape)}",
                           where="video")
    frames, height, width, _ = video.shape
    if not lossless and (height % 2 or width % 2):
        raise DiffletError(f"H.264 needs an even frame size, got {width}x{height}", where="video")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        rate = Fraction(fps).limit_denominator(1001)
        stream = container.add_stream("libx264rgb" if lossless else "libx264", rate=rate)
        stream.width, stream.height = width, height
        stream.pix_fmt = "rgb24" if lossless else "yuv420p"
        stream.options = {"crf": "0" if lossless else str(crf), "preset": "medium"}
        stream.thread_count = 1  # x264's threaded lookahead is not bit-reproducible
        astream = None
        if audio is not None:
            channels = audio.shape[0]
            astream = container.add_stream("aac", rate=int(sample_rate),
                                           layout="stereo" if channels == 2 else "mono")
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(video[i], format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if astream is not None:
            samples = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
            aframe = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format="fltp",
                                                layout=astream.layout.name)
            aframe.sample_rate = int(sample_rate)
            aframe.pts = 0
            for packet in astream.encode(aframe):
                container.mux(packet)
            for packet in astream.encode():
                container.mux(packet)
    return buf.getvalue()


def decode_mp4(data: bytes) -> tuple[np.ndarray, float]:
    """(uint8 [F, H, W, 3] frames, fps) of MP4 bytes; for tests and tools."""
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        fps = float(stream.average_rate or 0)
    return np.stack(frames), fps


def encode_output(image: np.ndarray | None, video: np.ndarray | None, fps: float = 0.0,
                  audio: np.ndarray | None = None, sample_rate: int = 0,
                  lossless_video: bool = False) -> tuple[bytes, str]:
    """(bytes, kind) with kind "png" for an image, "mp4" for a video."""
    if image is not None:
        return encode_png(image), "png"
    return encode_mp4(video, fps, audio, sample_rate, lossless=lossless_video), "mp4"
