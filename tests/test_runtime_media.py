"""MP4/PNG output encoding (difflet.runtime.media) against an independent decode of the bytes."""
from __future__ import annotations

import io

import numpy as np
import pytest

from difflet.errors import DiffletError
from difflet.runtime.media import decode_mp4, encode_mp4, encode_output, encode_png
from oracle_util import psnr


def _clip(frames: int = 9, height: int = 32, width: int = 48) -> np.ndarray:
    """A smooth moving gradient: what a lossy codec at high quality must keep within 40 dB."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = [np.stack([x * 3 + 10 * t, y * 6, np.full_like(x, 16 * t)], -1)  # no wrap-around edges
           for t in range(frames)]
    return np.stack(out).astype(np.uint8)


def test_mp4_round_trip_keeps_every_frame_and_the_rate():
    video = _clip()
    frames, fps = decode_mp4(encode_mp4(video, 16.0))
    assert frames.shape == video.shape and fps == 16.0
    assert min(psnr(a, b) for a, b in zip(frames, video)) >= 38.0  # H.264 CRF 12, 4:2:0 chroma


def test_lossless_mp4_decodes_to_exactly_the_frames_at_any_size():
    """--lossless-video: the noisiest content (random pixels, which CRF 12 would blur) and an odd
    size (refused by yuv420p) come back bit-identical, audio alongside; bytes are deterministic."""
    rng = np.random.default_rng(0)
    for shape in ((9, 32, 48, 3), (4, 31, 17, 3)):
        video = rng.integers(0, 256, shape, dtype=np.uint8)
        data = encode_mp4(video, 24.0, lossless=True)
        frames, fps = decode_mp4(data)
        assert fps == 24.0 and np.array_equal(frames, video)
        assert data == encode_mp4(video, 24.0, lossless=True)
    lossy, _ = decode_mp4(encode_mp4(video[:, :30, :16], 24.0))  # the default is not exact here
    assert not np.array_equal(lossy, video[:, :30, :16])
    audio = np.zeros((1, 4800), np.float32)
    data, kind = encode_output(None, video, 24.0, audio, 24000, lossless_video=True)
    assert kind == "mp4" and np.array_equal(decode_mp4(data)[0], video)


def test_mp4_bytes_are_deterministic_and_depend_on_the_frames():
    video = _clip()
    assert encode_mp4(video, 15.0) == encode_mp4(video, 15.0)
    other = video.copy()
    other[4] = 255 - other[4]
    assert encode_mp4(other, 15.0) != encode_mp4(video, 15.0)


def test_audio_becomes_an_aac_track_of_the_given_rate():
    import av

    t = np.arange(24000, dtype=np.float32) / 24000.0
    audio = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)]) * 0.5
    data = encode_mp4(_clip(), 24.0, audio=audio, sample_rate=24000)
    with av.open(io.BytesIO(data)) as container:
        (stream,) = container.streams.audio
        assert stream.codec_context.name == "aac" and stream.rate == 24000 and stream.channels == 2
        decoded = np.concatenate([f.to_ndarray() for f in container.decode(stream)], axis=-1)
    assert decoded.shape[0] == 2 and decoded.shape[1] >= audio.shape[1]
    assert 0.3 < float(np.abs(decoded).max()) < 0.6  # the tone, not silence or clipping


def test_bad_videos_are_refused_with_the_reason():
    with pytest.raises(DiffletError, match="even frame size"):
        encode_mp4(_clip(height=31), 16.0)
    with pytest.raises(DiffletError, match=r"uint8 \[F, H, W, 3\]"):
        encode_mp4(_clip().astype(np.float32), 16.0)


def test_encode_output_picks_png_for_an_image_and_mp4_for_a_video():
    from PIL import Image

    image = _clip(1)[0]
    data, kind = encode_output(image, None)
    assert kind == "png" and data == encode_png(image)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), image)  # PNG is lossless: exact
    data, kind = encode_output(None, _clip(), fps=16.0)
    assert kind == "mp4" and decode_mp4(data)[0].shape == _clip().shape
