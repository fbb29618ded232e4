"""Difflet: a compiler-style serving engine for diffusion transformers.

`from difflet import DiffletPipeline, Client` (loaded on first use: `import difflet` stays
torch-free, as the API process needs).
"""

from difflet.version import __version__  # noqa: F401


def __getattr__(name: str):
    if name in ("DiffletPipeline", "DiffletPipelineOutput"):
        from difflet import pipeline

        return getattr(pipeline, name)
    if name == "Client":
        from difflet.runtime.client import Client

        return Client
    raise AttributeError(f"module 'difflet' has no attribute {name!r}")
