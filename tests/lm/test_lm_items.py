"""Item loaders: reasoning-gym and tiny local fixtures in the GSM8K / MATH / CommonsenseQA / BBH formats."""

import json

import pytest

from sift.errors import SiftError
from sift.lm.items import from_reasoning_gym, load_bbh, load_commonsenseqa, load_gsm8k, load_items, load_math


def _jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_reasoning_gym():
    items = from_reasoning_gym("basic_arithmetic", 5, seed=1)
    assert len(items) == 5 and len({it.item_id for it in items}) == 5
    assert all(it.answer_kind == "numeric" and it.domain == "basic_arithmetic" for it in items)
    assert items[0].question.startswith("Calculate")
    assert [it.answer for it in from_reasoning_gym("basic_arithmetic", 5, seed=1)] == [it.answer for it in items]


def test_reasoning_gym_errors():
    with pytest.raises(SiftError, match="not registered"):
        from_reasoning_gym("no_such_task", 2)
    with pytest.raises(SiftError, match="no gold answer"):
        from_reasoning_gym("propositional_logic", 2)


def test_gsm8k(tmp_path):
    p = _jsonl(tmp_path / "gsm.jsonl", [
        {"question": "Tom has 3 apples and buys 1,200 more. How many?", "answer": "3 + 1200 = 1203\n#### 1,203"},
        "",
        {"question": "Ana had 5 pens and lost 7.", "answer": "5 - 7 = -2 #### -2"},
    ])
    items = load_gsm8k(p)
    assert [(it.answer, it.answer_kind) for it in items] == [("1203", "numeric"), ("-2", "numeric")]
    assert items[0].item_id == "gsm8k-00000" and items[0].choices is None


@pytest.mark.parametrize("rows,match", [
    ([{"question": "q"}], r"line 1: missing field 'answer'"),
    ([{"question": "q", "answer": "4"}, {"answer": "#### 4"}], r"line 1: field 'answer' has no '####'"),
    ([{"question": "q", "answer": "#### 4"}, "{not json"], r"line 2: not valid JSON"),
    ([{"question": 3, "answer": "#### 4"}], r"field 'question' must be a str"),
    ([{"question": "q", "answer": "#### four"}], r"line 1: cannot read the gold answer"),
])
def test_gsm8k_malformed(tmp_path, rows, match):
    p = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(SiftError, match=match) as e:
        load_gsm8k(p)
    assert str(p) in str(e.value)


def test_math_json_jsonl_and_folder(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "1.json").write_text(json.dumps(
        {"problem": "Compute 1/2 + 1/4.", "solution": "We get $\\boxed{\\frac{3}{4}}$."}))
    (tmp_path / "m" / "2.json").write_text(json.dumps(
        {"problem": "Simplify.", "solution": "First \\boxed{2}, no: it is $\\boxed{x^{2}+1}$"}))
    items = load_math(tmp_path / "m")
    assert [(it.answer, it.answer_kind) for it in items] == [("3/4", "numeric"), ("x^{2}+1", "free")]
    p = _jsonl(tmp_path / "math.jsonl", [{"problem": "2+2?", "solution": "\\boxed{4}"}])
    assert load_items(p, "math")[0].answer == "4"
    lst = tmp_path / "list.json"
    lst.write_text(json.dumps([{"problem": "a", "solution": "\\boxed{1,000}"}, {"problem": "b"}]))
    with pytest.raises(SiftError, match=r"list.json: record 1: missing field 'solution'"):
        load_math(lst)
    nobox = _jsonl(tmp_path / "nobox.jsonl", [{"problem": "a", "solution": "it is 4"}])
    with pytest.raises(SiftError, match=r"line 1: field 'solution' has no \\boxed"):
        load_math(nobox)


CSQA = {"answerKey": "B", "id": "abc",
        "question": {"stem": "Where do you put a book?",
                     "choices": [{"label": "A", "text": "oven"}, {"label": "B", "text": "shelf"},
                                 {"label": "C", "text": "sea"}]}}


def test_commonsenseqa(tmp_path):
    p = _jsonl(tmp_path / "csqa.jsonl", [CSQA])
    (it,) = load_commonsenseqa(p)
    assert it.item_id == "commonsenseqa-abc" and it.answer == "B" and it.answer_kind == "choice"
    assert it.choices == (("A", "oven"), ("B", "shelf"), ("C", "sea"))


def test_commonsenseqa_malformed(tmp_path):
    bad = json.loads(json.dumps(CSQA))
    del bad["question"]["choices"][1]["text"]
    p = _jsonl(tmp_path / "c.jsonl", [CSQA, bad])
    with pytest.raises(SiftError, match=r"c.jsonl: line 2: question.choices\[1\]: missing field 'text'"):
        load_commonsenseqa(p)
    bad2 = dict(CSQA, answerKey="E")
    with pytest.raises(SiftError, match="answerKey 'E' is not one of the choice labels"):
        load_commonsenseqa(_jsonl(tmp_path / "d.jsonl", [bad2]))
    bad3 = {"answerKey": "A", "question": {"choices": []}}
    with pytest.raises(SiftError, match=r"line 1: question: missing field 'stem'"):
        load_commonsenseqa(_jsonl(tmp_path / "e.jsonl", [bad3]))


def test_bbh(tmp_path):
    p = tmp_path / "date_understanding.json"
    p.write_text(json.dumps({"examples": [
        {"input": "Which is red?\nOptions:\n(A) sky\n(B) blood", "target": "(B)"},
        {"input": "not ( True ) and ( True ) is", "target": "False"},
        {"input": "Does Tom tell the truth?", "target": "Yes"},
        {"input": "How many legs?", "target": "8"},
        {"input": "Sort: b a", "target": "a b"},
    ]}))
    items = load_bbh(p)
    assert [(it.answer, it.answer_kind) for it in items] == [
        ("B", "choice"), ("False", "boolean"), ("True", "boolean"), ("8", "numeric"), ("a b", "free")]
    assert items[0].choices == (("A", "sky"), ("B", "blood")) and items[0].question == "Which is red?"
    assert items[0].domain == "bbh/date_understanding"


def test_bbh_malformed(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"examples": [{"input": "a", "target": "b"}, {"input": "c"}]}))
    with pytest.raises(SiftError, match=r"x.json: examples\[1\]: missing field 'target'"):
        load_bbh(p)
    p.write_text(json.dumps({"data": []}))
    with pytest.raises(SiftError, match=r"x.json: missing field 'examples'"):
        load_bbh(p)
    p.write_text("{oops")
    with pytest.raises(SiftError, match=r"x.json: not valid JSON"):
        load_bbh(p)


def test_load_items_errors(tmp_path):
    with pytest.raises(SiftError, match="item file does not exist"):
        load_items(tmp_path / "nope.jsonl", "gsm8k")
    with pytest.raises(SiftError, match="unknown item format"):
        load_items(tmp_path, "squad")


def test_a_source_shorter_than_its_n_is_refused_by_name(tmp_path):
    from sift.lm.items import ItemSpec, load_item_specs

    p = _jsonl(tmp_path / "gsm.jsonl", [{"question": f"Tom has {i} apples.", "answer": f"#### {i}"}
                                        for i in range(3)])
    specs = [ItemSpec(kind="reasoning_gym", task="basic_arithmetic", domain="arithmetic"),
             ItemSpec(kind="gsm8k", path=str(p), domain="gsm8k", n=3)]
    assert [it.domain for it in load_item_specs(specs, 6, seed=0)].count("gsm8k") == 3
    specs[1].n = 5
    with pytest.raises(SiftError, match=r"items\[1\] \(gsm8k\): asked for 5 items, the source has 3"):
        load_item_specs(specs, 8, seed=0)
