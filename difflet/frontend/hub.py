"""`--weights hf:ORG/NAME[@REVISION]`: a checkpoint from the local Hugging Face cache, offline.

Invariants:
- Never touches the network (local_files_only): a model not in the cache is a clear error that
  says how to get it there, on a machine that has a hub connection.
- The result is the cached snapshot directory, an ordinary diffusers-format checkpoint: it is then
  loaded by exactly the code that loads a local directory (and the tiny test checkpoints).
"""
from __future__ import annotations

from pathlib import Path

from difflet.errors import DiffletError

PREFIX = "hf:"


def hub_snapshot(spec: str) -> Path:
    """`hf:ORG/NAME` (or `hf:ORG/NAME@<revision>`) -> its cached snapshot directory."""
    repo, _, revision = spec[len(PREFIX):].partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise DiffletError(f"--weights {spec!r}: expected hf:ORG/NAME[@REVISION]", where="--weights")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise DiffletError("--weights hf:... needs the huggingface_hub package (a diffusers "
                           "dependency)", where="--weights") from None
    try:
        path = Path(snapshot_download(repo, revision=revision or None, local_files_only=True))
    except LocalEntryNotFoundError:
        raise DiffletError(f"{repo} is not in the local Hugging Face cache (offline lookup); on a "
                           f"machine with hub access run `huggingface-cli download {repo}`, or "
                           "pass the checkpoint directory itself", where="--weights") from None
    if not (path / "model_index.json").is_file():
        raise DiffletError(f"the cached snapshot of {repo} is not a diffusers-format checkpoint "
                           "(no model_index.json)", where=str(path))
    return path
