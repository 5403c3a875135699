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


def imports_of(path: Path, mod: str | None = None) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import statement in a file (``mod``: its module
    name, by default from its path under the repository)."""
    mod = module_name(path) if mod is None else mod
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
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
