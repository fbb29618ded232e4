"""The calibration file: versioned JSON, read and written without torch (the API process checks
a server's --calibration files with it).

Invariant: a file read back has `format` == FORMAT and `version` == VERSION, else a DiffletError
naming `field` and the file says why (missing, not JSON, not a calibration, another version).
"""
from __future__ import annotations

import json
from pathlib import Path

from difflet.errors import DiffletError

FORMAT = "difflet-stepcache-calibration"
VERSION = 1


def write_calibration(path: Path | str, data: dict) -> None:
    data = {"format": FORMAT, "version": VERSION, **data}
    Path(path).write_text(json.dumps(data, indent=1))


def read_calibration(path: Path | str, field: str = "cache") -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DiffletError(f"{field}: calibration file {str(path)!r} does not exist", where=field) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DiffletError(f"{field}: calibration file {str(path)!r} is not JSON: {err}", where=field) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DiffletError(f"{field}: {str(path)!r} is not a Difflet calibration file", where=field)
    if data.get("version") != VERSION:
        raise DiffletError(f"{field}: calibration file version {data.get('version')!r} is not {VERSION}; "
                           "re-run `difflet calibrate`", where=field)
    return data
