"""Structure checks: no import cycles in codegen/parallel, generic codegen names no model.

The import graph is read from source with ast, lazy imports inside functions included, so a
cycle hidden behind a function-level import is still a cycle. The family registry
(difflet/codegen/family/__init__.py) reaches family modules by name through importlib: that is
the one edge from generic codegen to a family, and it is not a static import.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "difflet"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The difflet module an import names (a `from pkg import mod` names the submodule)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """difflet module -> the difflet modules it imports anywhere in its body (ast)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                if target.startswith("difflet"):
                    found = _resolve(target, modules)
                    if found and found != mod:
                        graph[mod].add(found)
    return graph


def cycles(graph: dict[str, set[str]], keep) -> list[list[str]]:
    """Strongly connected components (size > 1) of the subgraph of modules `keep` accepts."""
    nodes = [n for n in graph if keep(n)]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is small, recursion depth is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if not keep(w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return out


def test_no_import_cycles_in_codegen_and_parallel():
    graph = import_graph()
    found = cycles(graph, lambda m: m.startswith(("difflet.codegen", "difflet.parallel")))
    assert found == [], f"import cycles: {found}"


def test_the_graph_sees_lazy_imports():
    # workers imports the call convention inside a function: the graph must still see it
    assert "difflet.codegen.program" in import_graph()["difflet.parallel.workers"]


def test_importing_the_attention_operator_imports_no_family():
    code = ("import sys, difflet.codegen.attention; "
            "print(sorted(m for m in sys.modules if m.startswith('difflet.codegen.family')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.strip()
    assert out == "[]", out


def _described_classes() -> set[str]:
    """Every diffusers/transformers class the model descriptions name, schedulers and
    tokenizers excepted (they are not components codegen adapts)."""
    found = set()
    for dsl in (ROOT / "models").glob("*.dsl"):
        for qualified in re.findall(r"\b(?:diffusers|transformers)\.[A-Za-z0-9_.]+", dsl.read_text()):
            name = qualified.rpartition(".")[2]
            if not name.endswith(("Scheduler", "TokenizerFast")):
                found.add(name)
    return found


def test_generic_codegen_names_no_model_class():
    classes = _described_classes()
    assert {"FluxTransformer2DModel", "QwenImageTransformer2DModel", "WanTransformer3DModel",
            "HunyuanVideoTransformer3DModel", "LTX2VideoTransformer3DModel", "AutoencoderKLWan"} <= classes
    offenders = []
    for path in sorted((PKG / "codegen").glob("*.py")):  # family/ is where classes are named
        text = path.read_text()
        offenders += [f"{path.name}: {c}" for c in sorted(classes) if re.search(rf"\b{c}\b", text)]
    assert offenders == []
