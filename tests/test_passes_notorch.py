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


def test_importing_every_pass_module_and_running_opt_leaves_torch_unloaded(tmp_path):
    """The lowered IR (lowering resolves classes, so it imports torch) is handed over as text; the
    child parses it and runs every pass of opt on several layouts, with keys and --explain-key."""
    from difflet.frontend.lower import lower_file
    from difflet.ir.text import print_module

    repo = PASSES.parent.parent
    for name in ("flux-tiny", "wan2.1-tiny", "qwen-image-tiny"):
        (tmp_path / f"{name}.ir").write_text(print_module(lower_file(repo / "models" / f"{name}.dsl")))
    mods = [f"difflet.passes.{p.stem}" for p in sorted(PASSES.glob("*.py")) if p.stem != "__init__"]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "from pathlib import Path\n"
            "from difflet.ir.text import parse_module\n"
            "from difflet.passes.cache_key import explain\n"
            "from difflet.passes.pipeline import optimize\n"
            f"d = Path({str(tmp_path)!r})\n"
            "for name, par, att in [('flux-tiny', 'tp2', None), ('flux-tiny', 'tp2cp2', 'ring'),\n"
            "                       ('wan2.1-tiny', 'tp1cp2', 'ulysses'), ('qwen-image-tiny', 'tp1+cfg2', None)]:\n"
            "    planned = optimize(parse_module((d / f'{name}.ir').read_text()), par, attention=att,\n"
            "                       probe='fused')\n"
            "    assert planned.level == 'planned' and explain(planned)\n"
            "assert 'torch' not in sys.modules, sorted(k for k in sys.modules if 'torch' in k)[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True)
