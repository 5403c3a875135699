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
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
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
    #: the same problem in other languages, (language code, question), same gold answer (the language axis)
    translations: tuple[tuple[str, str], ...] | None = None
    #: an exact arithmetic formula whose value is the gold (:mod:`sift.lm.gold_check`), where the source has one
    gold_formula: str | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["choices"] = [list(c) for c in self.choices] if self.choices else None
        d["translations"] = [list(t) for t in self.translations] if self.translations else None
        return d


@dataclass
class ItemSpec:
    """One source of items for a real-LM corpus (an entry of the ``source.items`` list; the config group
    ``configs/source/items`` holds ready-made lists). ``kind`` picks the loader in :data:`ITEM_LOADERS`."""

    kind: str = "reasoning_gym"
    task: str | None = None  # reasoning-gym task; BIG-bench task name(s), comma-separated; HF dataset config name
    path: str | None = None  # a local file or folder (wheel, sdist or extracted package for mgsm_symbolic/bigbench)
    n: int | None = None  # items from this source (None: an equal share of n_items)
    domain: str | None = None  # the domain label of its items (default: from the task or file)
    languages: list[str] = field(default_factory=list)  # translations to attach (language axis), e.g. [fra, deu]
    language: str = "eng"  # the base language of the items (mgsm_symbolic)
    split: str | None = None  # HF dataset split
    fields: dict[str, str] = field(default_factory=dict)  # HF dataset: question/answer/choices/id field names
    format: str | None = None  # HF dataset records: gsm8k | math | commonsenseqa | bbh | plain (question+answer)
    variants: int = 0  # mgsm_symbolic: symbolic variants per template (needs the package importable)
    options: dict[str, Any] = field(default_factory=dict)  # reasoning-gym dataset options, e.g. {max_terms: 3}
    #: ask as multiple choice with this many options: the gold and distractors drawn from the source's other golds
    #: (:func:`as_multiple_choice`); 0 asks for the answer itself
    n_options: int = 0


#: item loaders by ``ItemSpec.kind``: ``loader(spec, n, seed) -> list[LMItem]``
ITEM_LOADERS: dict[str, Callable[[ItemSpec, int, int], list[LMItem]]] = {}


def register_item_loader(kind: str) -> Callable:
    """Decorator: make ``fn(spec, n, seed)`` the loader of items of ``kind``."""

    def deco(fn: Callable[[ItemSpec, int, int], list[LMItem]]) -> Callable:
        ITEM_LOADERS[kind] = fn
        return fn

    return deco


def item_kinds() -> tuple[str, ...]:
    import sift.lm.benchmarks  # noqa: F401  (registers the benchmark loaders)

    return tuple(ITEM_LOADERS)


#: how a loader's message names its spec's config key; :func:`load_item_specs` puts in the index the user gave
ITEM_KEY = "source.items.<i>"


def _at_index(e: SiftError, i: int) -> SiftError:
    """``e`` with :data:`ITEM_KEY` naming item source ``i`` (e.g. ``source.items.1.path``)."""
    return type(e)(str(e).replace(ITEM_KEY, f"source.items.{i}"))


def load_item_specs(specs: list[ItemSpec], n_items: int, seed: int = 0,
                    gold_report: dict[str, Any] | None = None) -> list[LMItem]:
    """Items of every spec: ``spec.n`` each, or an equal share of ``n_items`` (the first specs take the rest), their
    golds checked where the source can recompute them (a wrong gold corrected or the item replaced by the source's
    next; :mod:`sift.lm.gold_check`); ``gold_report`` receives the check's counts per spec."""
    kinds = item_kinds()
    if not specs:
        raise SiftError("items: the list of item sources is empty")
    free = [i for i, s in enumerate(specs) if s.n is None]
    left = n_items - sum(s.n for s in specs if s.n is not None)
    if free and left < len(free):
        raise SiftError(f"items: n_items={n_items} leaves {left} items for {len(free)} sources without n")
    out: list[list[LMItem]] = []
    for i, spec in enumerate(specs):
        if spec.kind not in kinds:
            raise SiftError(f"items[{i}].kind: unknown {spec.kind!r}; expected one of {', '.join(kinds)}")
        n = spec.n if spec.n is not None else left // len(free) + (free.index(i) < left % len(free))
        what = f"items[{i}] ({spec.kind}{' ' + spec.task if spec.task else ''})"
        if spec.n_options:
            got, checks = _choice_items(spec, n, seed, i, what)
        else:
            got, checks = _checked_items(spec, n, seed, i)
        if not got:
            raise SiftError(f"{what}: no items")
        if len(got) < n:  # a short source would silently shift the mix of domains
            raise SiftError(f"{what}: asked for {n} items, the source has {len(got)}; lower its n (or n_items)")
        out.append(got[:n])
        if gold_report is not None:
            from sift.lm.gold_check import gold_check_summary

            gold_report[what] = gold_check_summary(checks)
    return interleaved(out)


def _checked_items(spec: ItemSpec, n: int, seed: int, i: int) -> tuple[list[LMItem], list[dict]]:
    """``n`` items of a spec with their golds checked (:func:`sift.lm.gold_check.check_gold`): a corrected gold
    replaces the source's, a dropped item is replaced by the source's next one (loaders are prefix-stable: the
    first ``n`` of ``n + k`` items are the ``n`` items); also every checked item's verdict."""
    from sift.lm.gold_check import check_item_gold

    ask = n
    while True:
        try:
            got = ITEM_LOADERS[spec.kind](spec, ask, seed)
        except SiftError as e:
            raise _at_index(e, i) from e
        kept, checks = [], []
        for it in got:
            verdict, gold, why = check_item_gold(it)
            checks.append({"item_id": it.item_id, "verdict": verdict, "gold": it.answer, "now": gold, "why": why})
            if gold is not None:
                kept.append(it if gold == it.answer else replace(it, answer=gold))
            if len(kept) == n:
                break
        if len(kept) >= n or len(got) < ask:  # enough, or the source has no more
            return kept, checks
        if ask > 10 * n + 100:  # a generator whose golds keep failing the check: stop, say which
            raise SiftError(f"items[{i}] ({spec.kind}): {len(got) - len(kept)} of the first {len(got)} items have "
                            f"golds their own formula contradicts (sift.lm.gold_check); {len(kept)} of {n} kept")
        ask += n - len(kept) + 8


#: how many of a source's first items give the distractor pool of its multiple-choice version (fixed, so that the
#: options of the first ``n`` items do not depend on ``n``)
OPTION_POOL_ITEMS = 200


def _choice_items(spec: ItemSpec, n: int, seed: int, i: int, what: str) -> tuple[list[LMItem], list[dict]]:
    """``n`` checked items of a spec asked as multiple choice (:func:`as_multiple_choice`), the distractors drawn
    from the golds of the source's first :data:`OPTION_POOL_ITEMS` items; the gold checks of those ``n``."""
    if spec.n_options < 2 or spec.n_options > 26:
        raise SiftError(f"{what}: n_options must be 0 (free answer) or 2..26, got {spec.n_options}")
    probe, checks = _checked_items(spec, max(n, OPTION_POOL_ITEMS), seed, i)
    if any(it.answer_kind == "choice" for it in probe):
        raise SiftError(f"{what}: n_options asks a source that already has options as multiple choice; set it to 0")
    pool = sorted({it.answer for it in probe[:OPTION_POOL_ITEMS]})
    if len(pool) < spec.n_options:
        raise SiftError(f"{what}: n_options={spec.n_options}, but the source's first {len(probe)} items have only "
                        f"{len(pool)} distinct golds ({', '.join(pool)}) to draw options from")
    # the checks up to the n-th kept item: a dropped item among them stays counted, as without n_options
    last = next(j for j, c in enumerate(checks) if c["item_id"] == probe[:n][-1].item_id) if probe[:n] else -1
    return as_multiple_choice(probe[:n], spec.n_options, pool, seed), checks[:last + 1]


def as_multiple_choice(items: list[LMItem], n_options: int, pool: list[str], seed: int) -> list[LMItem]:
    """Each item asked as multiple choice: its gold and ``n_options - 1`` other values of ``pool`` as options
    labelled A, B, ..., drawn per item by ``seed`` and its id. The gold's places are balanced: each block of
    ``n_options`` consecutive items puts it once at every place, in a random order. The question's own
    answer-format sentence after its last question mark is cut (the options replace it)."""
    out = []
    for j, it in enumerate(items):
        block = list(range(n_options))
        random.Random(f"places:{seed}:{j // n_options}").shuffle(block)
        rng = random.Random(f"options:{seed}:{it.item_id}")
        texts = rng.sample([v for v in pool if v != it.answer], n_options - 1)
        texts.insert(block[j % n_options], it.answer)
        choices = tuple((chr(ord("A") + j), t) for j, t in enumerate(texts))
        question = it.question
        if "?" in question and "\n" not in question.rsplit("?", 1)[1]:
            question = question.rsplit("?", 1)[0] + "?"
        gold = choices[texts.index(it.answer)][0]
        out.append(replace(it, question=question, answer=gold, answer_kind="choice", choices=choices,
                           gold_formula=None))
    return out


def interleaved(groups: list[list[LMItem]]) -> list[LMItem]:
    """Round-robin over the sources' item lists, so that any prefix of the items (a chunk, the second model's
    ``family_items``) mixes the sources in proportion."""
    total = sum(len(g) for g in groups)
    keyed = [((j + 0.5) / len(g), i, j) for i, g in enumerate(groups) for j in range(len(g))]
    return [groups[i][j] for _, i, j in sorted(keyed)] if total else []


def _make(item_id: str, domain: str, question: str, answer: str, kind: str,
          choices: tuple[tuple[str, str], ...] | None, where: str) -> LMItem:
    gold = canonical_answer(answer, kind, choices)
    if gold is None:
        raise SiftError(f"{where}: cannot read the gold answer {answer!r} as a {kind} answer")
    return LMItem(item_id, domain, question, gold, kind, choices)


# ---------------------------------------------------------------------------------------------- reasoning-gym

#: reasoning-gym tasks whose question asks for one arithmetic expression's value: their golds are recomputed
#: (``basic_arithmetic`` evaluates ``a + b * c`` left to right upstream, 0.1.19 to 0.1.25)
EXPRESSION_TASKS = ("basic_arithmetic", "chain_sum", "products")
#: reasoning-gym tasks whose question tells a family story and asks a relation: their golds are recomputed
#: (``family_relationships`` names in-laws from the wrong side upstream, 0.1.19)
KINSHIP_TASKS = ("family_relationships",)


def from_reasoning_gym(task_name: str, n: int, seed: int = 0, options: dict[str, Any] | None = None,
                       domain: str | None = None) -> list[LMItem]:
    """``n`` items of a reasoning-gym task (entries without a gold answer string are skipped); ``options`` go to
    the task's dataset config (e.g. ``max_terms`` of basic_arithmetic)."""
    try:
        import reasoning_gym
    except ImportError as e:  # pragma: no cover
        raise SiftError("reasoning-gym is not installed (pip install reasoning-gym)") from e
    if n < 1:
        raise SiftError(f"n must be positive, got {n}")
    try:
        data = reasoning_gym.create_dataset(task_name, size=n, seed=seed, **dict(options or {}))
    except (TypeError, ValueError, AssertionError) as e:
        raise SiftError(f"reasoning-gym task {task_name!r}: {e}") from e
    items = []
    for i in range(len(data)):
        entry = data[i]
        answer = entry.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            continue
        kind = infer_kind(answer)
        item = _make(f"{task_name}-{seed}-{i:05d}", domain or task_name, entry["question"], answer, kind, None,
                     f"reasoning-gym {task_name} entry {i}")
        if task_name in EXPRESSION_TASKS and kind == "numeric":  # the question's expression is the gold's formula
            from sift.lm.gold_check import arithmetic_formula

            item = replace(item, gold_formula=arithmetic_formula(entry["question"]))
        elif task_name in KINSHIP_TASKS:  # the story's family is the gold's formula (sift.lm.kinship)
            from sift.lm.kinship import kinship_formula

            item = replace(item, gold_formula=kinship_formula(entry["question"], data.config.female_names))
        items.append(item)
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

#: a record's content: (question, gold answer text, answer kind, choices or None)
Record = tuple[str, str, str, "tuple[tuple[str, str], ...] | None"]


def _gsm8k_record(rec: Any, where: str) -> Record:
    q = _field(rec, "question", where)
    a = _field(rec, "answer", where)
    if "####" not in a:
        raise SiftError(f"{where}: field 'answer' has no '####' before the final answer")
    return q, a.rsplit("####", 1)[1].strip(), "numeric", None


def _math_record(rec: Any, where: str) -> Record:
    q = _field(rec, "problem", where)
    sol = _field(rec, "solution", where)
    boxed = boxed_contents(sol.replace("\n", " "))
    if boxed is None or not boxed.strip():
        raise SiftError(f"{where}: field 'solution' has no \\boxed{{...}} answer")
    kind = infer_kind(boxed) if infer_kind(boxed) != "boolean" else "free"
    if kind == "free" and re.fullmatch(r"-?\\[dt]?frac\{-?\d+\}\{\d+\}", boxed.strip()):
        kind = "numeric"
    return q, boxed.strip(), kind, None


def _choice_list(raw: Any, where: str, name: str) -> list[tuple[str, str]]:
    """Options as ``[{"label", "text"}, ...]`` or, as on the Hugging Face hub, ``{"label": [...], "text": [...]}``."""
    if isinstance(raw, dict) and isinstance(raw.get("label"), list) and isinstance(raw.get("text"), list):
        if len(raw["label"]) != len(raw["text"]):
            raise SiftError(f"{where}: {name}.label and {name}.text differ in length")
        raw = [{"label": lab, "text": txt} for lab, txt in zip(raw["label"], raw["text"])]
    if not isinstance(raw, list):
        raise SiftError(f"{where}: {name} must be a list, got {type(raw).__name__}")
    choices = []
    for j, c in enumerate(raw):
        w = f"{where}: {name}[{j}]"
        choices.append((_field(c, "label", w).strip(), _field(c, "text", w).strip()))
    return choices


def _commonsenseqa_record(rec: Any, where: str) -> Record:
    """The CommonsenseQA jsonl record (``question: {stem, choices}``) or the flat Hugging Face one
    (``question: str, choices: {label: [...], text: [...]}``)."""
    _field(rec, "question", where, object)
    if isinstance(rec["question"], dict):
        qd = rec["question"]
        stem = _field(qd, "stem", f"{where}: question")
        choices = _choice_list(_field(qd, "choices", f"{where}: question", object), where, "question.choices")
    else:
        stem = _field(rec, "question", where)
        choices = _choice_list(_field(rec, "choices", where, object), where, "choices")
    if len(choices) < 2:
        raise SiftError(f"{where}: the question needs at least two options")
    key = _field(rec, "answerKey", where).strip()
    if key not in {lab for lab, _ in choices}:
        raise SiftError(f"{where}: answerKey {key!r} is not one of the choice labels")
    return stem, key, "choice", tuple(choices)


_BBH_OPTION = re.compile(r"^\s*\(([A-Z])\)\s*(.+?)\s*$", re.MULTILINE)


def _bbh_record(rec: Any, where: str) -> Record:
    inp = _field(rec, "input", where)
    target = _field(rec, "target", where).strip()
    opts = _BBH_OPTION.findall(inp)
    m = re.fullmatch(r"\(?([A-Z])\)?", target)
    if opts and m and m.group(1) in {lab for lab, _ in opts}:
        question = _BBH_OPTION.sub("", inp)
        question = re.sub(r"\n\s*Options:\s*$", "", question.rstrip()).rstrip()
        return question, m.group(1), "choice", tuple(opts)
    return inp, target, infer_kind(target), None


#: record readers by format, shared by the file loaders here and the Hugging Face loader (sift.lm.benchmarks)
RECORD_READERS: dict[str, Callable[[Any, str], Record]] = {
    "gsm8k": _gsm8k_record, "math": _math_record, "commonsenseqa": _commonsenseqa_record, "bbh": _bbh_record}


def load_gsm8k(path: str | Path, domain: str = "gsm8k") -> list[LMItem]:
    path = _exists(path)
    items = []
    for i, (where, rec) in enumerate(_read_jsonl(path)):
        q, gold, kind, choices = _gsm8k_record(rec, where)
        items.append(_make(f"{domain}-{i:05d}", domain, q, gold, kind, choices, where))
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
            q, gold, kind, choices = _math_record(rec, where)
            items.append(_make(f"{domain}-{len(items):05d}", domain, q, gold, kind, choices, where))
    return items


def load_commonsenseqa(path: str | Path, domain: str = "commonsenseqa") -> list[LMItem]:
    path = _exists(path)
    items = []
    for i, (where, rec) in enumerate(_read_jsonl(path)):
        stem, key, kind, choices = _commonsenseqa_record(rec, where)
        item_id = str(rec.get("id") or f"{i:05d}")
        items.append(_make(f"{domain}-{item_id}", domain, stem, key, kind, choices, where))
    return items


def load_bbh(path: str | Path, domain: str | None = None) -> list[LMItem]:
    path = _exists(path)
    domain = domain or f"bbh/{path.stem}"
    obj = _read_json(path)
    examples = _field(obj, "examples", str(path), list)
    items = []
    for i, ex in enumerate(examples):
        where = f"{path}: examples[{i}]"
        q, gold, kind, choices = _bbh_record(ex, where)
        items.append(_make(f"{domain}-{i:05d}", domain, q, gold, kind, choices, where))
    return items


LOADERS = {"gsm8k": load_gsm8k, "math": load_math, "commonsenseqa": load_commonsenseqa, "bbh": load_bbh}


@register_item_loader("reasoning_gym")
def _reasoning_gym_spec(spec: ItemSpec, n: int, seed: int) -> list[LMItem]:
    return from_reasoning_gym(spec.task or "basic_arithmetic", n, seed, spec.options, spec.domain)


#: where each file source comes from (one line in a missing-file message; sift downloads nothing)
FILE_HINTS = {
    "gsm8k": "the GSM8K test file: curl -L -o /data/gsm8k_test.jsonl https://raw.githubusercontent.com/openai/"
             "grade-school-math/master/grade_school_math/data/test.jsonl",
    "math": "the MATH test set's JSON files (MATH/test/<subject>/*.json of hendrycks/math), or the Hugging Face "
            "dataset EleutherAI/hendrycks_math with kind: hf_dataset, format: math",
    "commonsenseqa": "the CommonsenseQA dev file: curl -L -o /data/csqa_dev.jsonl "
                     "https://s3.amazonaws.com/commensenseqa/dev_rand_split.jsonl",
    "bbh": "a BIG-Bench Hard task file: curl -L -o /data/bbh_date_understanding.json https://raw.githubusercontent.com/"
           "suzgunmirac/BIG-Bench-Hard/main/bbh/date_understanding.json",
}


def _file_spec(fmt: str) -> Callable[[ItemSpec, int, int], list[LMItem]]:
    def load(spec: ItemSpec, n: int, seed: int) -> list[LMItem]:
        if not spec.path:
            raise SiftError(f"items: kind {fmt!r} needs {ITEM_KEY}.path: {FILE_HINTS[fmt]}")
        if not Path(spec.path).expanduser().exists():
            raise SiftError(f"{fmt}: path does not exist: {spec.path}; get {FILE_HINTS[fmt]}")
        items = LOADERS[fmt](spec.path) if spec.domain is None else LOADERS[fmt](spec.path, spec.domain)
        return items[:n]

    return load


for _fmt in FORMATS:
    register_item_loader(_fmt)(_file_spec(_fmt))


def load_items(path: str | Path, fmt: str, n: int | None = None) -> list[LMItem]:
    """Items from a local file in one of :data:`FORMATS` (the first ``n`` if given)."""
    if fmt not in LOADERS:
        raise SiftError(f"unknown item format {fmt!r}; expected one of {', '.join(FORMATS)}")
    items = LOADERS[fmt](path)
    if not items:
        raise SiftError(f"{path}: no items")
    return items[:n] if n else items


__all__ = ["FORMATS", "ITEM_LOADERS", "RECORD_READERS", "ItemSpec", "LMItem", "from_reasoning_gym", "item_kinds",
           "FILE_HINTS", "ITEM_KEY", "load_item_specs", "register_item_loader", "load_bbh", "load_commonsenseqa",
           "load_gsm8k", "load_items", "load_math"]
