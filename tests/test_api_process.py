"""The API process (`difflet-runtime`) never imports torch (issue 17, item 3).

Three checks, each able to fail on its own:
- source: the import closure of the API modules (every import in the API modules themselves,
  module-level imports of the difflet modules they reach) names no torch, diffusers or
  transformers;
- in-process: a fresh interpreter that imports the API modules, builds `DiffletServer` on real
  artifacts (startup checks, admission, dispatcher, replicas, gRPC, metrics) and admits a request
  has none of them in sys.modules;
- the running server: after it served a request, /proc/<pid>/maps of the `difflet-runtime`
  process maps no file under a torch directory, while its model process's maps do (the positive
  control: the same reader sees libtorch where it is loaded, so the check cannot pass because
  the maps were unreadable or torch's libraries were named differently).
"""
from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from difflet.runtime import client
from difflet.runtime.demo import start_server, stop_server

REPO = Path(__file__).resolve().parent.parent
API_MODULES = ("server", "api_server", "service", "admission", "dispatcher", "replica", "procs", "jobs",
               "metrics", "startup", "validate", "request", "messages")
HEAVY = ("torch", "diffusers", "transformers")


def _imports(path: Path, everywhere: bool) -> set[str]:
    """Modules `path` imports: all of them, or only those run at import time (not in a def)."""
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if everywhere else _module_level(tree)
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _module_level(tree: ast.AST):
    """Nodes outside function bodies (class bodies and if/try blocks run at import)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.append(child)


def _source(module: str) -> Path | None:
    base = REPO / Path(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_api_import_closure_names_no_torch():
    todo = [(f"difflet.runtime.{m}", True) for m in API_MODULES]
    seen: dict[str, str] = {}
    while todo:
        module, everywhere = todo.pop()
        path = _source(module)
        if path is None or module in seen:
            continue
        seen[module] = str(path)
        for name in _imports(path, everywhere):
            top = name.split(".")[0]
            assert top not in HEAVY, f"{path} imports {name}"
            if top == "difflet":
                # a package's __init__ runs too when any submodule is imported
                parts = name.split(".")
                todo += [(".".join(parts[:i]), False) for i in range(1, len(parts) + 1)]
    # the model process's entry module is reached (replica imports it): its top level is light too
    assert "difflet.runtime.model_process" in seen and "difflet.runtime.messages" in seen


def test_building_the_server_and_admitting_a_request_imports_no_torch(flux_tiny_art):
    code = f"""
import sys
from difflet.runtime.server import DiffletServer
server = DiffletServer({str(flux_tiny_art)!r}, port=0)
fields = server.admission.check(prompt="a cat", seed=1, steps=None, guidance=None, height=0,
                                width=0, request_id="r", cache="")
from difflet.runtime import messages
sent = messages.Run(0, fields)
assert messages.decode_to_model(messages.encode(sent)) == sent  # the model process's message
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
assert not heavy, heavy[:10]
print("ok", len(sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]


def _torch_maps(pid: int) -> list[str]:
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    assert lines, f"/proc/{pid}/maps is empty"
    return sorted({ln.split()[-1] for ln in lines if "/torch/" in ln or "libtorch" in ln})


def test_running_server_maps_no_torch_while_its_model_process_does(flux_tiny_art, tmp_path):
    """... and leaves nothing in its TMPDIR: every model process extracted each program's
    AOTInductor package into TMPDIR/aotinductor_* (2 MB+ each), which a killed process (crash,
    grace timeout) never removed: its loaders' destructors never ran. One is killed here."""
    (tmp_path / "tmp").mkdir()
    proc, address = start_server(flux_tiny_art, env={"TMPDIR": str(tmp_path / "tmp")})
    try:
        reply = client.generate(address, "a red fox in snow", 3, timeout=300)
        assert reply.png[:8] == b"\x89PNG\r\n\x1a\n"  # the API process ran a full request
        api_maps = _torch_maps(proc.pid)
        model_maps = _torch_maps(reply.model_pid)
        rss_kib = next(int(ln.split()[1]) for ln in Path(f"/proc/{proc.pid}/status").read_text()
                       .splitlines() if ln.startswith("VmRSS:"))
        print(f"difflet-runtime pid {proc.pid}: VmRSS {rss_kib / 1024:.0f} MiB")
        os.kill(reply.model_pid, signal.SIGKILL)
        deadline = time.monotonic() + 300
        while not any(p.pid not in (0, reply.model_pid) and p.state == "ready"  # its replacement
                      for p in client.get_profile(address, timeout=30).serving.processes):
            assert time.monotonic() < deadline, "no replacement model process"
            time.sleep(0.2)
        again = client.generate(address, "a red fox in snow", 3, timeout=300)
        assert again.model_pid != reply.model_pid and again.png == reply.png
    finally:
        assert stop_server(proc) == 0
    assert reply.model_pid != proc.pid
    assert any("libtorch" in m for m in model_maps), "positive control: the model process maps torch"
    assert api_maps == [], api_maps
    left = [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith(("aotinductor_", "difflet-model"))]
    assert left == [], left


def test_model_processes_start_under_a_tmpdir_too_deep_for_a_unix_socket(tmp_path):
    """multiprocessing binds the forkserver's AF_UNIX socket under $TMPDIR, and a Linux socket path
    holds 107 bytes: with a deeper $TMPDIR the server starts its forkserver from a short directory
    (procs.socket_safe_tempdir) and a model process runs; without it the same start fails (the
    control: the depth used does overflow)."""
    deep = tmp_path / ("d" * (100 - len(str(tmp_path))) if len(str(tmp_path)) < 99 else "d")
    deep.mkdir()
    start = ("from difflet.runtime import procs\n"
             "{prestart}\n"
             "p = procs.CTX.Process(target=print, args=('child ran',)); p.start(); p.join()\n"
             "print('exit', p.exitcode)\n")
    env = dict(os.environ, TMPDIR=str(deep))
    ran = subprocess.run([sys.executable, "-c", start.format(prestart="procs.prestart([])")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "child ran" in ran.stdout and "exit 0" in ran.stdout, ran.stderr
    control = subprocess.run([sys.executable, "-c", start.format(prestart="")], env=env,
                             capture_output=True, text=True, timeout=120)
    assert control.returncode != 0 and "AF_UNIX path too long" in control.stderr
