"""Where a compiled AOTInductor program's memory goes: the live bytes of the buffers its generated
wrapper allocates, replayed in program order from the package's `*.wrapper.cpp`.

    python bench/aoti_liveness.py ART/programs/vae.rank0.pt2 --prefix false_graph_0_

Allocations are `aoti_torch_empty_strided` calls and extern-op outputs (sized by the
`assert_size_stride` the wrapper writes after them); frees are `.reset()`. Aliases
(`reinterpret_tensor`) allocate nothing. Graph inputs, outputs handed to the caller and weights
are not counted: the figure is what the program itself holds on top of them. `--prefix` picks a
torch.cond branch (`true_graph_0_`, `false_graph_0_`); without it the top-level graph.
It reads generated C++ (torch 2.13's wrapper format), so it is a diagnostic, not a product check.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import zipfile

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4,
               "int8": 1, "uint8": 1, "bool": 1}
_ARRAY = re.compile(r"int64_t (int_array_\d+)\[\] = \{([^}]*)\}")
_EMPTY = r"aoti_torch_empty_strided\(\d+, (int_array_\d+), int_array_\d+, cached_torch_dtype_(\w+), .*&({p}buf\w+)_handle"
_EXTERN = r"aoti_torch_cpu_\w+\(.*&({p}buf\w+)_handle\)\);"
_ASSERT = r"assert_size_stride\({name}, \{{([^}}]*)\}}"


def _ints(text: str) -> list[int]:
    return [int(x.strip().rstrip("L")) for x in text.split(",") if x.strip()]


def replay(lines: list[str], prefix: str = "") -> dict:
    """{'peak': bytes, 'peak_line': n, 'at_peak': {buffer: (bytes, line allocated)}, 'end': bytes,
    'unsized': [buffers whose size the wrapper does not state]} for buffers named PREFIX + buf*.
    An extern op's output is sized as float32 (what the wrapper asserts carries no dtype)."""
    arrays = {m.group(1): _ints(m.group(2)) for line in lines for m in [_ARRAY.search(line)] if m}
    empty, extern = re.compile(_EMPTY.format(p=re.escape(prefix))), re.compile(_EXTERN.format(p=re.escape(prefix)))
    freed = re.compile(r"\b(" + re.escape(prefix) + r"buf\w+)\.reset\(\)")  # \b: not a branch's buf
    live: dict[str, tuple[int, int]] = {}
    out = {"peak": 0, "peak_line": 0, "at_peak": {}, "end": 0, "unsized": []}
    cur = 0
    for i, line in enumerate(lines):
        name, size = None, None
        if m := empty.search(line):
            if m.group(2) not in DTYPE_BYTES:
                raise SystemExit(f"error: wrapper line {i + 1}: dtype {m.group(2)!r} has no size in DTYPE_BYTES")
            name, size = m.group(3), math.prod(arrays[m.group(1)]) * DTYPE_BYTES[m.group(2)]
        elif m := extern.search(line):
            name = m.group(1)
            for after in lines[i + 1:i + 4]:
                if a := re.search(_ASSERT.format(name=re.escape(name)), after):
                    size = math.prod(_ints(a.group(1))) * 4
                    break
            if size is None:
                out["unsized"].append(name)
        if name is not None and size is not None:
            live[name] = (size, i + 1)
            cur += size
            if cur > out["peak"]:
                out.update(peak=cur, peak_line=i + 1, at_peak=dict(live))
        if (m := freed.search(line)) and m.group(1) in live:
            cur -= live.pop(m.group(1))[0]
    out["end"] = cur
    return out


def wrapper_lines(package: str) -> list[str]:
    """The generated wrapper's lines from a .pt2 package (or a .cpp file itself)."""
    if package.endswith(".cpp"):
        with open(package) as f:
            return f.read().splitlines()
    try:
        with zipfile.ZipFile(package) as z:
            names = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
            if len(names) != 1:
                raise SystemExit(f"error: {package}: expected one *.wrapper.cpp in the package, found {len(names)}")
            return z.read(names[0]).decode().splitlines()
    except (OSError, zipfile.BadZipFile) as err:
        raise SystemExit(f"error: {package}: not a readable .pt2 package ({err})") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", help="a compiled program (.pt2) or its *.wrapper.cpp")
    ap.add_argument("--prefix", default="", help="buffer-name prefix of a torch.cond branch, e.g. false_graph_0_")
    ap.add_argument("--top", type=int, default=12, help="how many of the largest buffers live at the peak to list")
    args = ap.parse_args(argv)
    res = replay(wrapper_lines(args.package), args.prefix)
    print(f"peak {res['peak'] / 2**30:.2f} GiB at wrapper line {res['peak_line']}; "
          f"held at the end {res['end'] / 2**30:.2f} GiB")
    for name, (size, line) in sorted(res["at_peak"].items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"  {size / 2**20:9.1f} MiB  {name}  (allocated at line {line})")
    if res["unsized"]:
        print(f"not counted (no size stated): {', '.join(res['unsized'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
