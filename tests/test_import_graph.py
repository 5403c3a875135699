"""The import layering of sift's packages: lower stages never import higher ones, no cycles between packages,
library code never imports the CLI, and no package imports another package's private (``_name``) helpers.

Imports are read from the source (module level and inside functions alike), so a lazy import counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the stages, lowest first; a package may import its own level or lower ones
LAYERS: list[tuple[str, ...]] = [
    ("sift", "sift.metrics", "sift.report"),  # root utilities (errors, atomic, provenance, resources, ...)
    ("sift.lm",),
    ("sift.organism",),
    ("sift.corpus",),
    ("sift.trajectories",),
    ("datamodules",),
    ("sift.detectors",),
    ("sift.training",),
    ("sift.companion",),
    ("sift.evaluation",),
    ("sift.export",),  # the corpus and a job's predictions as datasets and an Inspect log
    ("sift.faithshift",),
    ("sift.cli",),
]
LEVEL = {pkg: k for k, names in enumerate(LAYERS) for pkg in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str | None:
    """The layer package a module belongs to (``sift.corpus.sources.hf`` → ``sift.corpus``; a root utility such as
    ``sift.errors`` → ``sift``); None outside sift and datamodules."""
    parts = module.split(".")
    if parts[0] == "datamodules":
        return "datamodules"
    if parts[0] != "sift":
        return None
    if len(parts) > 1 and "sift." + parts[1] in LEVEL:
        return "sift." + parts[1]
    return "sift"


def top_level_nodes(tree: ast.Module) -> list[ast.AST]:
    """The statements that run when a module is imported: its body, and the bodies of module-level ``if`` / ``try``
    blocks, except ``if TYPE_CHECKING:`` (function and class bodies run later)."""
    out: list[ast.AST] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        out.append(node)
        if isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return out


def imports_of(path: Path, mod: str | None = None, module_level: bool = False) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import statement in a file (``mod``: its module
    name, by default from its path under the repository; ``module_level``: only the imports run at import time)."""
    mod = module_name(path) if mod is None else mod
    is_pkg = path.name == "__init__.py"
    out = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in (top_level_nodes(tree) if module_level else ast.walk(tree)):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            if node.module is None:
                # ``from . import x``: each name may be a submodule
                out += [(f"{target}.{n}", [], node.lineno) for n in names]
            else:
                out.append((target, names, node.lineno))
    return out


def edges() -> list[tuple[str, str, str, list[str], int]]:
    """(importing package, imported package, importing module, imported names, line) across packages."""
    out = []
    files = sorted((ROOT / "sift").rglob("*.py")) + sorted((ROOT / "datamodules").rglob("*.py"))
    for path in files:
        src_mod = module_name(path)
        src_pkg = package_of(src_mod)
        for target, names, line in imports_of(path):
            dst_pkg = package_of(target)
            if dst_pkg is None or dst_pkg == src_pkg:
                continue
            out.append((src_pkg, dst_pkg, f"{src_mod}:{line} -> {target}", names, line))
    return out


def test_package_of_maps_modules_to_layers():
    assert package_of("sift.corpus.sources.hf") == "sift.corpus"
    assert package_of("sift.errors") == "sift"
    assert package_of("sift.training") == "sift.training"
    assert package_of("datamodules.batch") == "datamodules"
    assert package_of("torch.nn") is None


def test_no_lower_stage_imports_a_higher_one():
    bad = [where for a, b, where, _, _ in edges() if LEVEL[a] < LEVEL[b]]
    assert bad == [], "lower stage imports a higher one:\n" + "\n".join(bad)


def test_no_cycles_between_packages():
    graph: dict[str, set[str]] = {}
    for a, b, *_ in edges():
        graph.setdefault(a, set()).add(b)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for n in graph.get(todo.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    cycles = sorted(p for p in graph if p in reach(p))
    assert cycles == [], f"packages on an import cycle: {cycles}"


def test_library_code_never_imports_the_cli():
    bad = [where for a, b, where, _, _ in edges() if b == "sift.cli" and a != "sift.cli"]
    assert bad == [], "library code imports sift.cli:\n" + "\n".join(bad)




def test_no_private_imports_across_packages():
    bad = []
    for _, _, where, names, _ in edges():
        target = where.split(" -> ")[1]
        private_mod = any(p.startswith("_") and not p.startswith("__") for p in target.split("."))
        private_names = [n for n in names if n.startswith("_") and not n.startswith("__")]
        if private_mod or private_names:
            bad.append(f"{where} {private_names or ''}".strip())
    assert bad == [], "private helper imported across packages:\n" + "\n".join(bad)


def test_imports_are_read_inside_functions_and_relative_ones_resolved(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef g():\n    import sift.cli.corpus\n    from ..lm import states\n"
                 "    from .pairs import _pair\n")
    assert imports_of(f, "sift.corpus.m") == [("os", [], 1), ("sift.cli.corpus", [], 4), ("sift.lm", ["states"], 5),
                                              ("sift.corpus.pairs", ["_pair"], 6)]


def module_graph() -> dict[str, set[str]]:
    """Module → the sift / datamodules modules it imports at import time (module-level statements; an import inside
    a function is how a module defers one); ``from pkg import name`` resolves to the submodule ``pkg.name`` when that
    is a module."""
    files = sorted((ROOT / "sift").rglob("*.py")) + sorted((ROOT / "datamodules").rglob("*.py"))
    known = {module_name(p) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        src = module_name(path)
        for target, names, _ in imports_of(path, module_level=True):
            if package_of(target) is None:
                continue
            hits = {f"{target}.{n}" for n in names if f"{target}.{n}" in known}
            if not hits or len(hits) < len(names):
                hits.add(target)
            graph.setdefault(src, set()).update(h for h in hits if h in known and h != src)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_two_module_cycle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


def test_no_import_cycles_between_modules():
    found = cycles(module_graph())
    assert found == [], "modules on a module-level import cycle:\n" + "\n".join(map(str, found))


def test_module_level_reader_skips_functions_and_type_checking(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sift.lm\n"
                 "try:\n    import sift.corpus\nexcept ImportError:\n    pass\n\ndef g():\n    import sift.cli\n")
    assert [t for t, _, _ in imports_of(f, "sift.x", module_level=True)] == ["os", "typing", "sift.corpus"]
