"""List every call in sift's code that could run code from a file it reads (issue 46).

    python scripts/scan_unsafe_loaders.py      # scans sift/ datamodules/ scripts/ hydra_plugins/; exit 1 on a find

A static scan of the syntax tree, with import aliases resolved (``import pickle as p``, ``from torch import load``):

==========================================  =========================================================================
flagged                                     why
==========================================  =========================================================================
``pickle``/``cPickle``/``dill``/             unpickling runs whatever callables the stream names
``cloudpickle`` ``load(s)``, ``Unpickler``
``joblib.load``, ``pandas.read_pickle``,    pickle underneath
``shelve.open``, ``marshal.load(s)``
``torch.load`` without ``weights_only=True``  a full unpickler (the default before torch 2.6)
``torch.jit.load``                          a TorchScript archive is a program
``numpy.load`` with ``allow_pickle`` not    object arrays are pickles
``False``
``yaml.load``/``load_all`` without a safe   the full loaders build arbitrary Python objects
loader; ``yaml.unsafe_load``/``full_load``
builtin ``eval``/``exec``/``compile``       code from a string
==========================================  =========================================================================

``ast.literal_eval`` (literals only), ``json``, ``safetensors``, ``skops.io`` with an explicit trusted list and
``torch.load(..., weights_only=True)`` are the safe forms sift uses.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIRS = ("sift", "datamodules", "scripts", "hydra_plugins")

_PICKLERS = ("pickle", "cPickle", "_pickle", "dill", "cloudpickle")
#: fully qualified callables that are unsafe whatever their arguments
ALWAYS = {f"{m}.{f}" for m in _PICKLERS for f in ("load", "loads", "Unpickler")} | {
    "joblib.load", "pandas.read_pickle", "shelve.open", "marshal.load", "marshal.loads", "torch.jit.load",
    "yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load", "yaml.full_load_all",
    "builtins.eval", "builtins.exec", "builtins.compile"}
_SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    call: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.call}: {self.why}"


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name → the module or object it stands for."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _qualname(func: ast.expr, aliases: dict[str, str]) -> str | None:
    """``np.load`` → ``numpy.load`` (None for a call on anything but an imported name or a builtin)."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    if func.id in aliases:
        base = aliases[func.id]
    elif not parts and func.id in ("eval", "exec", "compile"):
        base = f"builtins.{func.id}"
    else:
        return None
    return ".".join([base, *reversed(parts)])


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_const(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def check_call(call: ast.Call, q: str) -> str | None:
    """Why this call is unsafe, or None."""
    if q in ALWAYS:
        return "runs code named by its input"
    if q == "torch.load" and not _is_const(_kw(call, "weights_only"), True):
        return "torch.load without weights_only=True unpickles arbitrary objects"
    if q in ("numpy.load", "numpy.lib.npyio.load"):
        ap = _kw(call, "allow_pickle")
        if ap is not None and not _is_const(ap, False):
            return "numpy.load with allow_pickle enabled unpickles object arrays"
    if q in ("yaml.load", "yaml.load_all"):
        loader = _kw(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
        name = loader.attr if isinstance(loader, ast.Attribute) else getattr(loader, "id", None)
        if name not in _SAFE_YAML_LOADERS:
            return "yaml.load without a safe Loader builds arbitrary objects"
    return None


def scan_source(text: str, path: str = "<string>") -> list[Finding]:
    tree = ast.parse(text, filename=path)
    aliases = _aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            q = _qualname(node.func, aliases)
            why = check_call(node, q) if q else None
            if why:
                out.append(Finding(path, node.lineno, q, why))
    return out


def python_files(dirs: Iterable[str | Path], root: Path = REPO) -> Iterator[Path]:
    for d in dirs:
        yield from sorted((root / d).rglob("*.py"))


def scan(dirs: Iterable[str | Path] = DEFAULT_DIRS, root: Path = REPO) -> tuple[int, list[Finding]]:
    """(files scanned, findings) over the ``.py`` files under ``dirs``."""
    n, found = 0, []
    for f in python_files(dirs, root):
        n += 1
        found += scan_source(f.read_text(encoding="utf-8"), str(f.relative_to(root)))
    return n, found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", default=list(DEFAULT_DIRS), help="folders under the repository root")
    args = ap.parse_args(argv)
    n, found = scan(args.dirs)
    for f in found:
        print(f)
    print(f"scanned {n} files under {', '.join(map(str, args.dirs))}: {len(found)} unsafe loaders")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
