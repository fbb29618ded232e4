"""`HttpApi`: the HTTP server of the API process (FastAPI on uvicorn, optional TLS).

Invariants:
- It holds no queue of its own: requests go through the server's Admission and Dispatcher,
  so gRPC and HTTP share one FIFO, one capacity bound, the replicas and the metrics.
- Torch-free: it imports the stdlib, FastAPI/uvicorn, PIL (for jpeg/webp re-encoding) and
  Difflet's API-process modules.
- Connections, timeouts and TLS are transport.py's; the routes are routes.py's.
"""
from __future__ import annotations

import io
import secrets

from difflet.families import facts_of, guidance_mode
from difflet.runtime.http.content import ContentStore
from difflet.runtime.http.videos import VideoJobs
from difflet.runtime.image_fields import profile_images


class HttpApi:
    def __init__(self, info, admission, dispatcher, metrics, *, request_timeout: float | None,
                 serving, keys, tls: tuple[str, str] | None = None,
                 content_retention_s: float = 3600.0, content_max_bytes: int = 1 << 30,
                 state_dir: str | None = None) -> None:
        self.info, self.admission, self.dispatcher, self.metrics = info, admission, dispatcher, metrics
        self.request_timeout, self.serving, self.keys, self.tls = request_timeout, serving, keys, tls
        profile = info.profile
        self.model_id = info.module.name
        self.family = str(info.module.attrs.get("family", ""))
        self.frames = int(profile.get("frames", 0))
        self.fps = facts_of(info.module).fps(info.module) if self.frames else 0.0
        self.guidance_kind = guidance_mode(info.module)
        self.content = ContentStore(content_retention_s, content_max_bytes, state_dir=state_dir)
        self.videos = VideoJobs(dispatcher, self.content, content_retention_s, admission, self.model_id)
        self._server = None
        self.address = ""

    def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 picks one) and serve from a thread; returns the bound port.
        OSError (ssl.SSLError included) when the port or the TLS files are unusable."""
        from difflet.runtime.http.routes import build_app
        from difflet.runtime.http.transport import UvicornThread

        self._server = UvicornThread(build_app(self), host, port, self.tls)
        bound = self._server.start()
        self.address = f"{host}:{bound}"
        self.videos.resume()  # the state dir's queued jobs, once a model process is ready
        return bound

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self.content.close()

    def new_id(self, kind: str) -> str:
        """128 random bits: an id is the only handle on a job's content, so it must not be guessed
        (a counter let a client fetch, cancel or collide with the next client's job)."""
        return f"{kind}-{secrets.token_urlsafe(16)}"

    def model_card(self) -> dict:
        p = self.info.profile
        return {"id": self.model_id, "object": "model", "created": 0, "owned_by": "difflet",
                "family": self.family, "sizes": [s.rsplit("x", 1)[0] if self.frames else s
                                                         for s in self.info.manifest.sizes],
                "kind": "video" if self.frames else "image", "frames": self.frames, "fps": self.fps,
                "default_steps": int(p["steps"]), "default_guidance": float(p["guidance"]),
                "guidance_kind": self.guidance_kind,
                "prompt_tokens": self.admission.token_limit, "inputs": self.inputs()}

    def inputs(self) -> dict:
        """The profile's image inputs: how many images (0: text only), a mask, the default strength."""
        images, mask, strength = profile_images(self.info.profile)
        return {"images": images, "mask": mask, "default_strength": strength}

    @staticmethod
    def encode_image(png: bytes, fmt: str) -> tuple[bytes, str]:
        """The PNG as served (byte-identical to gRPC's) or re-encoded as jpeg/webp."""
        if fmt == "png":
            return png, "png"
        from PIL import Image

        out = io.BytesIO()
        Image.open(io.BytesIO(png)).convert("RGB").save(out, format=fmt.upper())
        return out.getvalue(), fmt
