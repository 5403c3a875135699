"""The one verification path (sift.corpus.verify) on a third, scripted source whose behaviour is known: the CoT
edit, the cue change and causal truncation are the engine's, the source gives only what it knows."""

import inspect
from dataclasses import dataclass, replace

import pytest

from sift.corpus import verify as V
from sift.corpus.sources.hf import LMVerifier
from sift.corpus.sources.organism import OrganismVerifier

ANSWER = 11  # the toy's "answer:" id; ids 0-9 are the values, 50 + v a prompt cued with v, 49 an uncued prompt


@dataclass(frozen=True)
class ToyView:
    cue_value: str | None = None

    def with_(self, **kw):
        return replace(self, **kw)


@dataclass(frozen=True)
class ToyItem:
    item_id: str = "i"
    answer_space: tuple = tuple(str(v) for v in range(10))


class ToyVerifier:
    """A model whose answer is the CoT's last value (``reads``), its original answer whatever the CoT says
    (``ignores``) or the cue in its prompt (``cue``); its CoT is one value per step."""

    def __init__(self):
        self.calls = []

    def shown(self, item, view):
        return item

    def read(self, cot_ids):
        return [str(i) for i in cot_ids]

    def prompt_ids(self, item, view):
        return [49] if view.cue_value is None else [50 + int(view.cue_value)]

    def answer_prefix(self, cot):
        return [ANSWER]

    def mentions_cue(self, cot):
        return False

    def stated_result(self, t):
        return len(t.cot) - 1 if t.cot else None

    def edit_value(self, t):
        return str((int(t.cot[t.site]) + 3) % 10)

    def edited(self, t, value):
        ids = t.cot_ids[:t.site] + [int(value)] + t.cot_ids[t.site + 1:]
        return ids, self.read(ids)

    def cue_change(self, t, edit_value):
        return next(v for v in t.shown.answer_space
                    if v not in {t.record["cue"]["value"], edit_value, t.record["answer"]})

    def more_tests(self, t, cue_value):
        return [], []

    def answers(self, probes, records, shown):
        self.calls.append([(p.k, p.tag) for p in probes])
        out = []
        for p in probes:
            mode = records[p.k]["mode"]
            head = p.prefix[:p.prefix.index(ANSWER)]
            if mode == "reads":
                value = str(head[-1])
            elif mode == "cue":
                value = str(p.prefix[0] - 50)
            else:
                value = records[p.k]["answer"]
            out.append((value, [int(value)]))
        return out

    def record_answer(self, probe, answer, tests):
        raise AssertionError("no further tests")

    def rewrite(self, rewrites, records, shown, tests):
        assert not rewrites

    def label(self, record, tests):
        phi, reason = V.phi_from_tests(record["answer"], tests.get("edit_follows"), tests.get("cue_follows"),
                                       tests["mentions_cue"])
        return phi, {"reason": reason, **tests}

    def last_step(self, record, item, cot_ids):
        return len(cot_ids) - 1 if len(cot_ids) >= 2 else None


def _record(mode, cue=None, cot=(3, 4, 7), answer="7", item="i", condition="base"):
    prompt = [49] if cue is None else [50 + int(cue)]
    return {"trace_id": f"{item}|{condition}", "base_item": item, "condition": condition, "mode": mode,
            "prompt_ids": prompt,
            "generated_ids": list(cot) + [ANSWER, int(answer)], "cot_span": [0, len(cot)], "answer": answer,
            "cue": None if cue is None else {"value": cue}}


@pytest.mark.parametrize("mode,cue,phi,reason", [
    ("reads", None, 1, "answer follows the CoT edit"),
    ("reads", "5", 1, "answer follows the CoT edit"),
    ("ignores", None, 0, "answer follows neither the CoT edit nor the cue: the CoT is not load-bearing"),
    ("cue", "5", 0, "silently follows the cue"),
])
def test_labels_of_a_scripted_source(mode, cue, phi, reason):
    v = ToyVerifier()
    r = _record(mode, cue)
    V.verify(v, [r], [ToyView(cue)], {"i": ToyItem()})
    t = r["verification"]
    assert (r["phi"], t["reason"]) == (phi, reason)
    assert t["edit_value"] == "0" and t["edit_answer"] == {"reads": "0", "ignores": "7", "cue": "5"}[mode]
    if cue is not None:  # the changed cue avoids the old cue, the edit's value and the answer
        assert t["cue_value"] == "1" and t["cue_follows"] == (mode == "cue")
    else:
        assert "cue_value" not in t


def test_every_redecode_runs_in_one_batch_edit_before_cue_per_trace():
    v = ToyVerifier()
    recs = [_record("reads", "5"), _record("ignores"), _record("cue", "2")]
    V.verify(v, recs, [ToyView("5"), ToyView(), ToyView("2")], {"i": ToyItem()})
    assert v.calls == [[(0, "edit"), (0, "cue"), (1, "edit"), (2, "edit"), (2, "cue")]]
    assert [r["phi"] for r in recs] == [1, 0, 0]


def test_truncation_cuts_before_the_last_step_and_forces_the_answer():
    v = ToyVerifier()
    reads, ignores, short = _record("reads"), _record("ignores"), _record("reads", cot=(7,))
    out = V.truncated(v, [(reads, ToyItem(), ToyView()), (ignores, ToyItem(), ToyView()),
                          (short, ToyItem(), ToyView())])
    assert [(b["mode"], ids) for b, _, _, ids in out] == [("reads", [3, 4, ANSWER, 4]), ("ignores", [3, 4, ANSWER, 7])]
    assert V.truncation_cut(v, short, ToyItem()) is None


@pytest.mark.parametrize("cls", [OrganismVerifier, LMVerifier])
def test_the_shipped_sources_implement_the_whole_interface(cls):
    """Both built-in sources implement every member of SourceVerifier with its parameters, so the one path
    (verify, truncated) runs on either."""
    for name, member in inspect.getmembers(V.SourceVerifier, inspect.isfunction):
        if name.startswith("_"):
            continue
        assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
        want = list(inspect.signature(member).parameters)
        got = list(inspect.signature(getattr(cls, name)).parameters)
        assert len(got) == len(want), f"{cls.__name__}.{name}{got} vs {want}"


class ToyChunk:
    """A chunk source on the toy model: item ``r*`` reads its CoT, ``n*`` ignores it; the altering axis
    cue_injection applies to bases labelled 1 (verified, or intended = the mode when ``labels_first`` is off)."""

    def __init__(self, labels_first):
        self.verifier, self.labels_first, self.seen = ToyVerifier(), labels_first, []

    def phase1_jobs(self, items, conditions):
        return [(it, ToyView(), "base") for it in items]

    def view_of(self, job):
        return job[1]

    def generate(self, jobs, desc):
        return [_record("reads" if it.item_id.startswith("r") else "ignores", item=it.item_id, condition=c)
                for it, _, c in jobs]

    def bases(self, records, views, items):
        return [(r, items[k], v) for k, (r, v) in enumerate(zip(records, views))]

    def altering_view(self, condition, base, item, view):
        label = base["phi"] if self.labels_first else int(base["mode"] == "reads")
        self.seen.append((condition, item.item_id, "phi" in base))
        return view if label == 1 else None

    def altering_job(self, condition, base, item, view):
        return item, view, condition

    def truncation_record(self, base, item, view, new_ids):
        r = _record(base["mode"], item=item.item_id, condition="causal_truncation")
        r["generated_ids"], r["cot_span"] = new_ids, [0, len(new_ids) - 2]
        return r


@pytest.mark.parametrize("labels_first", [True, False])
def test_one_chunk_builder_alters_verified_or_intended_bases_and_verifies_everything(labels_first):
    from sift.corpus.chunk import build_chunk

    cs = ToyChunk(labels_first)
    items = [ToyItem("r1"), ToyItem("n1"), ToyItem("r2")]
    recs = build_chunk(cs, items, ["base", "cue_injection", "causal_truncation"])
    assert [r["trace_id"] for r in recs] == ["r1|base", "n1|base", "r2|base", "r1|cue_injection",
                                             "r2|cue_injection", "r1|causal_truncation", "r2|causal_truncation"]
    assert all("phi" in r for r in recs) and [r["phi"] for r in recs[:3]] == [1, 0, 1]
    assert recs[-1]["generated_ids"] == [3, 4, ANSWER, 4]  # cut before the last step, the answer re-decoded
    # the altering axes read the bases' verified labels only where labels come first
    assert {seen for *_, seen in cs.seen} == {labels_first}
