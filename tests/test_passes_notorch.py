"""difflet/passes never imports torch: by source scan and by importing every module fresh."""
import ast
import subprocess
import sys
from pathlib import Path

PASSES = Path(__file__).resolve().parent.parent / "difflet" / "passes"


def test_no_torch_import_in_sources():
    for path in sorted(PASSES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path


def test_importing_every_pass_module_and_running_opt_leaves_torch_unloaded():
    mods = [f"difflet.passes.{p.stem}" for p in sorted(PASSES.glob("*.py")) if p.stem != "__init__"]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "from difflet.passes.cache_key import compiler_version\n"
            "compiler_version('inductor')\n"
            "assert 'torch' not in sys.modules, sorted(k for k in sys.modules if 'torch' in k)[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True)
