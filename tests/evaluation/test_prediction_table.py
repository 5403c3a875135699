"""The aligned prediction table and its one run view (RunData; the appendix's SeedStack is stacked from it)."""

import math

import numpy as np
import pytest

from sift.errors import SiftError
from sift.evaluation.engine import PredictionTable, runs_table
from sift.evaluation.predictions import Pairs, Predictions


def run(seed, ids, probs, labels, threshold=0.5):
    n = len(ids)
    items = [t[0] for t in ids]  # trace "a1" belongs to base item "a"
    return Predictions("d", seed, "test", threshold, ids, items, ["dom"] * n, ["m"] * n, ["c"] * n, labels, probs)


@pytest.fixture
def two_seeds():
    r0 = run(0, ["a1", "a2", "b1", "b2"], [0.9, 0.8, 0.3, 0.6], [1, 1, 0, 1])
    r1 = run(1, ["b2", "a2", "a1", "b1", "c1"], [0.7, 0.2, 0.95, 0.1, 0.5], [1, 1, 1, 0, 0])
    pairs = Pairs(np.array(["paraphrase", "cue", "paraphrase"]), np.array(["preserving", "altering", "preserving"]),
                  np.array(["a1", "b1", "c1"]), np.array(["a2", "b2", "a1"]), np.array([1, 0, 0]),
                  np.array([1, 1, 1]), np.array(["a", "b", "c"]))
    return r0, r1, pairs


def test_columns_concatenate_runs_in_order(two_seeds):
    r0, r1, pairs = two_seeds
    t = PredictionTable.of([r0, r1], pairs)
    assert len(t) == 9 and t.start.tolist() == [0, 4, 9]
    assert t.trace_id[t.run_rows(r1)].tolist() == ["b2", "a2", "a1", "b1", "c1"]
    assert t.verdict.tolist() == [1, 1, 0, 1, 1, 0, 1, 0, 1]
    assert t.seed.tolist() == [0] * 4 + [1] * 5
    assert t.index_of(r1) == 1 and t.index_of(0) == 0


def test_pairs_of_gives_table_rows_of_pairs_inside_the_run(two_seeds):
    r0, r1, pairs = two_seeds
    t = PredictionTable.of([r0, r1], pairs)
    p0 = t.pairs_of(r0)  # c1 is not in run 0: its pair is left out
    assert t.trace_id[p0["src"]].tolist() == ["a1", "b1"] and t.trace_id[p0["dst"]].tolist() == ["a2", "b2"]
    p1 = t.pairs_of(r1)
    assert p1["src"].tolist() == [4 + 2, 4 + 3, 4 + 4] and p1["dst"].tolist() == [4 + 1, 4 + 0, 4 + 2]


def test_run_data_is_a_run_local_view(two_seeds):
    r0, r1, pairs = two_seeds
    t = PredictionTable.of([r0, r1], pairs)
    rd = t.run_data(r1, ["paraphrase"])
    assert rd.run is r1 and len(rd) == 5
    np.testing.assert_array_equal(rd.prob, r1.prob)
    np.testing.assert_array_equal(rd.rho, r1.confidence)
    np.testing.assert_array_equal(rd.correct, r1.correct)
    assert rd.p_src.tolist() == [2, 3, 4] and rd.p_dst.tolist() == [1, 0, 2]
    assert rd.p_axis.tolist() == [0, -1, 0] and rd.p_alt.tolist() == [False, True, False]
    st = rd.stats()
    # preserving pairs a1→a2 (verdict 1 → 0: violation) and c1→a1 (1 → 1)
    assert st["ivr"] == 0.5 and st["auroc"] == pytest.approx(5 / 6)
    bare = t.run_data(r1, paired=False, keep=np.array([True, False, True, False, False]))
    assert bare.trace_id.tolist() == ["b2", "a1"] and bare.p_src.size == 0
    with pytest.raises(SiftError, match="cannot keep its pairs"):
        t.run_data(r1, keep=np.ones(5, bool))
    with pytest.raises(SiftError, match="not in the prediction table"):
        t.run_data(run(2, ["a1"], [0.5], [1]))


def test_stack_aligns_seeds_on_common_traces_and_pair_rows_index_it(two_seeds):
    r0, r1, pairs = two_seeds
    t = runs_table({"d": [r0, r1]}, pairs)
    st = t.stack("d", [r0, r1])
    assert st.trace_id.tolist() == ["a1", "a2", "b1", "b2"]  # the first seed's order; c1 is only in seed 1
    np.testing.assert_array_equal(st.prob, [[0.9, 0.8, 0.3, 0.6], [0.95, 0.2, 0.1, 0.7]])
    assert st.rows.tolist() == [[0, 1, 2, 3], [6, 5, 7, 4]] and st.seeds == [0, 1]
    pres, alt = st.pair_rows("preserving"), st.pair_rows("altering")
    assert (pres.src.tolist(), pres.dst.tolist(), pres.source_id.tolist()) == ([0], [1], ["a1"])
    assert (alt.src.tolist(), alt.dst.tolist(), alt.phi_src.tolist(), alt.phi_dst.tolist()) == ([2], [3], [0], [1])
    assert not math.isnan(st.verdict.mean())


def test_stack_rejects_seeds_disagreeing_on_labels(two_seeds):
    r0, _, pairs = two_seeds
    bad = run(1, ["a1", "a2"], [0.5, 0.5], [0, 1])
    with pytest.raises(SiftError, match="disagree on verified labels"):
        runs_table({"d": [r0, bad]}, pairs).stack("d", [r0, bad])


def test_a_pickled_table_finds_its_runs_again(two_seeds):
    import pickle

    r0, r1, pairs = two_seeds
    t = PredictionTable.of([r0, r1], pairs)
    t.index_of(r1)  # fills the position cache with this process's object ids
    runs, t2 = pickle.loads(pickle.dumps(([r0, r1], t)))  # one pickle: the runs stay the table's runs
    assert t2.index_of(runs[1]) == 1 and t2.stack("d", runs).rows.tolist() == [[0, 1, 2, 3], [6, 5, 7, 4]]


def test_report_context_and_appendix_read_a_given_table(two_seeds, tmp_path):
    from sift.evaluation.appendix import run_appendix
    from sift.evaluation.engine import ReportContext

    r0, r1, pairs = two_seeds
    t = PredictionTable.of([r0, r1], pairs)
    assert ReportContext([r0, r1], pairs, tmp_path, aligned=t).table is t
    with pytest.raises(SiftError, match="not that of these predictions"):
        _ = ReportContext([r1, r0], pairs, tmp_path, aligned=t).table
    inputs = {"runs": {"d": [r0, r1]}, "pairs": pairs}
    common = {"n_resamples": 5, "seed": 0}
    own = run_appendix(inputs, names=["stability_sensitivity"], common=common)[0]
    shared = run_appendix({**inputs, "table": t}, names=["stability_sensitivity"], common=common)[0]
    assert shared.markdown == own.markdown and shared.results == own.results
