"""Items for the real-LM corpus: reasoning-gym generators and local files in four common formats.

=============  ==========================================================================================
format          file layout (one record per line for ``.jsonl``)
=============  ==========================================================================================
gsm8k           jsonl: ``{"question": ..., "answer": "... #### 42"}`` (the gold is after the last ``####``)
math            json (one problem, or a list) / jsonl / a folder of such files:
                ``{"problem": ..., "solution": "... \\boxed{...}"}`` (the gold is the last ``\\boxed{}``)
commonsenseqa   jsonl: ``{"id": ..., "question": {"stem": ..., "choices": [{"label", "text"}]}, "answerKey"}``
bbh             json: ``{"examples": [{"input": ..., "target": ...}]}`` (options ``(A) ...`` in the input
                become choices; True/False/Yes/No targets are boolean; numbers numeric; else free)
=============  ==========================================================================================

A malformed file raises :class:`~sift.errors.SiftError` naming the file, the line or record and the field.
Gold answers are stored in the canonical form of :func:`sift.lm.parsing.canonical_answer`, so a parsed
answer compares with ``==``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sift.errors import SiftError
from sift.lm.parsing import boxed_contents, canonical_answer, infer_kind

FORMATS = ("gsm8k", "math", "commonsenseqa", "bbh")


@dataclass(frozen=True)
class LMItem:
    item_id: str
    domain: str
    question: str
    answer: str
    answer_kind: str  # numeric | choice | boolean | free
    choices: tuple[tuple[str, str], ...] | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["choices"] = [list(c) for c in self.choices] if self.choices else None
        return d


def _make(item_id: str, domain: str, question: str, answer: str, kind: str,
          choices: tuple[tuple[str, str], ...] | None, where: str) -> LMItem:
    gold = canonical_answer(answer, kind, choices)
    if gold is None:
        raise SiftError(f"{where}: cannot read the gold answer {answer!r} as a {kind} answer")
    return LMItem(item_id, domain, question, gold, kind, choices)


# ---------------------------------------------------------------------------------------------- reasoning-gym

def from_reasoning_gym(task_name: str, n: int, seed: int = 0) -> list[LMItem]:
    """``n`` items of a reasoning-gym task (entries without a gold answer string are skipped)."""
    try:
        import reasoning_gym
    except ImportError as e:  # pragma: no cover
        raise SiftError("reasoning-gym is not installed (pip install reasoning-gym)") from e
    if n < 1:
        raise SiftError(f"n must be positive, got {n}")
    try:
        data = reasoning_gym.create_dataset(task_name, size=n, seed=seed)
    except ValueError as e:
        raise SiftError(f"reasoning-gym task {task_name!r}: {e}") from e
    items = []
    for i in range(len(data)):
        entry = data[i]
        answer = entry.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            continue
        kind = infer_kind(answer)
        items.append(_make(f"{task_name}-{seed}-{i:05d}", task_name, entry["question"], answer, kind, None,
                           f"reasoning-gym {task_name} entry {i}"))
    if not items:
        raise SiftError(f"reasoning-gym task {task_name!r} gives no gold answer strings (it is scored by a "
                        f"checker); pick a task with gold answers, e.g. basic_arithmetic or gsm_symbolic")
    return items


# ---------------------------------------------------------------------------------------------- file helpers

def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}: line {n}", json.loads(line)
            except json.JSONDecodeError as e:
                raise SiftError(f"{path}: line {n}: not valid JSON ({e.msg})") from e


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SiftError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) for a .jsonl file, a .json list or a single .json object."""
    if path.suffix == ".jsonl":
        yield from _read_jsonl(path)
        return
    obj = _read_json(path)
    if isinstance(obj, list):
        for i, rec in enumerate(obj):
            yield f"{path}: record {i}", rec
    else:
        yield f"{path}", obj


def _field(rec: Any, key: str, where: str, typ: type = str) -> Any:
    if not isinstance(rec, dict):
        raise SiftError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if key not in rec or rec[key] is None:
        raise SiftError(f"{where}: missing field {key!r}")
    val = rec[key]
    if not isinstance(val, typ):
        raise SiftError(f"{where}: field {key!r} must be a {typ.__name__}, got {type(val).__name__}")
    return val


def _exists(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise SiftError(f"item file does not exist: {p}")
    return p


# ---------------------------------------------------------------------------------------------- loaders

def load_gsm8k(path: str | Path, domain: str = "gsm8k") -> list[LMItem]:
    path = _exists(path)
    items = []
    for i, (where, rec) in enumerate(_read_jsonl(path)):
        q = _field(rec, "question", where)
        a = _field(rec, "answer", where)
        if "####" not in a:
            raise SiftError(f"{where}: field 'answer' has no '####' before the final answer")
        gold = a.rsplit("####", 1)[1].strip()
        items.append(_make(f"{domain}-{i:05d}", domain, q, gold, "numeric", None, where))
    return items


def _math_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".json", ".jsonl"))
        if not files:
            raise SiftError(f"{path}: folder holds no .json or .jsonl files")
        return files
    return [path]


def load_math(path: str | Path, domain: str = "math") -> list[LMItem]:
    path = _exists(path)
    items = []
    for f in _math_files(path):
        for where, rec in _records(f):
            q = _field(rec, "problem", where)
            sol = _field(rec, "solution", where)
            boxed = boxed_contents(sol.replace("\n", " "))
            if boxed is None or not boxed.strip():
                raise SiftError(f"{where}: field 'solution' has no \\boxed{{...}} answer")
            kind = infer_kind(boxed) if infer_kind(boxed) != "boolean" else "free"
            if kind == "free" and re.fullmatch(r"-?\\[dt]?frac\{-?\d+\}\{\d+\}", boxed.strip()):
                kind = "numeric"
            items.append(_make(f"{domain}-{len(items):05d}", domain, q, boxed.strip(), kind, None, where))
    return items


def load_commonsenseqa(path: str | Path, domain: str = "commonsenseqa") -> list[LMItem]:
    path = _exists(path)
    items = []
    for i, (where, rec) in enumerate(_read_jsonl(path)):
        qd = _field(rec, "question", where, dict)
        stem = _field(qd, "stem", f"{where}: question")
        raw = _field(qd, "choices", f"{where}: question", list)
        choices = []
        for j, c in enumerate(raw):
            w = f"{where}: question.choices[{j}]"
            choices.append((_field(c, "label", w).strip(), _field(c, "text", w).strip()))
        if len(choices) < 2:
            raise SiftError(f"{where}: question.choices needs at least two options")
        key = _field(rec, "answerKey", where).strip()
        if key not in {lab for lab, _ in choices}:
            raise SiftError(f"{where}: answerKey {key!r} is not one of the choice labels")
        item_id = str(rec.get("id") or f"{i:05d}")
        items.append(_make(f"{domain}-{item_id}", domain, stem, key, "choice", tuple(choices), where))
    return items


_BBH_OPTION = re.compile(r"^\s*\(([A-Z])\)\s*(.+?)\s*$", re.MULTILINE)


def load_bbh(path: str | Path, domain: str | None = None) -> list[LMItem]:
    path = _exists(path)
    domain = domain or f"bbh/{path.stem}"
    obj = _read_json(path)
    examples = _field(obj, "examples", str(path), list)
    items = []
    for i, ex in enumerate(examples):
        where = f"{path}: examples[{i}]"
        inp = _field(ex, "input", where)
        target = _field(ex, "target", where).strip()
        opts = _BBH_OPTION.findall(inp)
        m = re.fullmatch(r"\(?([A-Z])\)?", target)
        if opts and m and m.group(1) in {lab for lab, _ in opts}:
            question = _BBH_OPTION.sub("", inp)
            question = re.sub(r"\n\s*Options:\s*$", "", question.rstrip()).rstrip()
            items.append(_make(f"{domain}-{i:05d}", domain, question, m.group(1), "choice", tuple(opts), where))
            continue
        items.append(_make(f"{domain}-{i:05d}", domain, inp, target, infer_kind(target), None, where))
    return items


LOADERS = {"gsm8k": load_gsm8k, "math": load_math, "commonsenseqa": load_commonsenseqa, "bbh": load_bbh}


def load_items(path: str | Path, fmt: str, n: int | None = None) -> list[LMItem]:
    """Items from a local file in one of :data:`FORMATS` (the first ``n`` if given)."""
    if fmt not in LOADERS:
        raise SiftError(f"unknown item format {fmt!r}; expected one of {', '.join(FORMATS)}")
    items = LOADERS[fmt](path)
    if not items:
        raise SiftError(f"{path}: no items")
    return items[:n] if n else items


__all__ = ["FORMATS", "LMItem", "from_reasoning_gym", "load_bbh", "load_commonsenseqa", "load_gsm8k",
           "load_items", "load_math"]
