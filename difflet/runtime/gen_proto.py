"""Regenerate difflet_pb2.py, difflet_pb2_grpc.py and difflet_pb2.pyi from difflet.proto.

Run `python -m difflet.runtime.gen_proto` after editing the proto (needs grpcio-tools, the
`dev` extra); the generated files are committed so serving never needs the compiler.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    from grpc_tools import protoc  # dev-only dependency

    root = HERE.parent.parent  # so the generated import path is difflet.runtime.difflet_pb2
    rc = protoc.main([
        "grpc_tools.protoc", f"-I{root}", f"--python_out={root}", f"--pyi_out={root}",
        f"--grpc_python_out={root}", str(HERE / "difflet.proto"),
    ])
    return rc


if __name__ == "__main__":
    sys.exit(main())
