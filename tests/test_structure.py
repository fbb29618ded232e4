"""Structure checks: no import cycles anywhere in difflet/, the family registry the only place
outside a family's folder that names it, generic codegen naming no model, small modules.

The import graph is read from source with ast, lazy imports inside functions included, so a
cycle hidden behind a function-level import is still a cycle. The family registry
(difflet/families/__init__.py) reaches each family's facts/programs/host by name through
importlib; the graph adds those edges, so a loop through the registry is a cycle too.
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
    """difflet module -> the difflet modules it imports anywhere in its body (ast), and the
    registry -> every part of every family it resolves by name."""
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
    from difflet.families import FAMILIES, module_name

    for family in FAMILIES:
        for part in ("facts", "programs", "host"):
            graph["difflet.families"].add(module_name(family, part))
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


def test_no_import_cycles_anywhere():
    graph = import_graph()
    found = cycles(graph, lambda m: m.startswith("difflet"))
    assert found == [], f"import cycles: {found}"


def test_the_graph_sees_lazy_imports_and_the_registry():
    graph = import_graph()
    # workers imports the call convention inside a function: the graph must still see it
    assert "difflet.codegen.program" in graph["difflet.parallel.workers"]
    assert "difflet.families.flux.host" in graph["difflet.families"]


def test_a_loop_through_the_registry_is_found():
    """The cycle the old family registry hid (attention operator <-> family processors)."""
    graph = {k: set(v) for k, v in import_graph().items()}
    graph["difflet.families.flux.programs"].add("difflet.codegen.declarations")
    assert any("difflet.families" in c for c in cycles(graph, lambda m: m.startswith("difflet")))


def test_only_the_registry_names_a_family_outside_its_folder():
    """Adding a family is its folder, its descriptions and one registry line: no other module of
    difflet/ names it (as a module, folder, step prefix or IR family attribute)."""
    from difflet.families import FAMILIES

    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel == Path("families/__init__.py") or rel.parts[0] == "train":  # train/ is flux-shapes' own
            continue
        text = path.read_text()
        for family in FAMILIES:
            if rel.parts[:2] == ("families", family):
                continue
            if re.search(rf"(?<![\w-]){family}(?![\w-]|\.dsl)", text):  # a description file is not the family
                offenders.append(f"{rel}: {family}")
    assert offenders == []


def test_no_module_over_300_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py")
            if "_pb2" not in p.name and (n := len(p.read_text().splitlines())) > 300}
    assert long == {}


def test_importing_the_attention_operator_imports_no_family():
    code = ("import sys, difflet.codegen.attention; "
            "print(sorted(m for m in sys.modules if m.startswith('difflet.families.')))")
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
    for path in sorted((PKG / "codegen").glob("*.py")):  # families/ is where classes are named
        text = path.read_text()
        offenders += [f"{path.name}: {c}" for c in sorted(classes) if re.search(rf"\b{c}\b", text)]
    assert offenders == []
