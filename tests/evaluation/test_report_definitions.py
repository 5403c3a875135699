"""Report fixes of issue 12 on hand-computable inputs: the held-out transfer matrix (defect 1), Table 8's rows
(defect 2), the bootstrap pool (defect 4) and the definitions of defect 5 (like-for-like gap, pooled IVR,
infeasible SGR seeds, seed-ensemble AUROC), plus the deterministic-baseline note (defect 7)."""

import ev_toy as toy
import numpy as np
import pytest
from ev_toy import CERT, est

from sift.evaluation.analysis import Items, bootstrap_vector, group_runs, is_ensemble_row, split_strata
from sift.evaluation.engine import ReportOptions
from sift.evaluation.predictions import ENSEMBLE_OF, Pairs, Predictions
from sift.evaluation.sections.ensemble import ensemble_table
from sift.evaluation.sections.main_table import main_table
from sift.evaluation.sections.transfer_matrix import IN_DIST, transfer_matrix
from sift.metrics.bootstrap import draw_clusters


def cell(probs, items=("a", "b", "c", "d"), labels=(0, 0, 1, 1), detector="sift", seed=0, split="test",
         prefix="t"):
    """Four traces, one per item; AUROC = share of (positive, negative) pairs ranked right (ties 1/2)."""
    n = len(probs)
    return Predictions(detector, seed, split, 0.5, np.array([f"{prefix}{i}" for i in range(n)]), np.array(items),
                       np.array(["d"] * n), np.array(["m"] * n), np.array(["base"] * n), np.array(labels),
                       np.array(probs, float))


# ------------------------------------------------------------------------------------------------ defect 1
def test_transfer_matrix_held_out_layout_has_in_distribution_cells(tmp_path):
    # the main job's layout: rows "all but X", columns "in-distribution" and the held-out names
    cells = {("all but boolean", IN_DIST): cell([0.1, 0.2, 0.8, 0.9]),     # AUROC 1
             ("all but boolean", "boolean"): cell([0.1, 0.6, 0.5, 0.9]),   # 3 of 4 pairs right: 0.75
             ("all but choice", IN_DIST): cell([0.2, 0.1, 0.9, 0.8]),      # 1
             ("all but choice", "choice"): cell([0.5, 0.5, 0.5, 0.5])}     # all ties: 0.5
    s = transfer_matrix(cells, out_dir=tmp_path, n_resamples=0)
    r = s.results
    assert r["layout"] == "held-out"
    assert r["train_on"] == ["all but boolean", "all but choice"]
    assert r["test_on"] == [IN_DIST, "boolean", "choice"]
    assert r["auroc"] == [[1.0, 0.75, None], [1.0, None, 0.5]]
    assert r["rows"]["all but boolean"] == {"in_dist": 1.0, "mean_transfer": 0.75, "gap": 0.25}
    assert r["rows"]["all but choice"] == {"in_dist": 1.0, "mean_transfer": 0.5, "gap": 0.5}
    # summary: mean of the in-distribution cells vs mean of the held-out cells, not of all cells
    assert r["summary"] == {"mean_in_dist": 1.0, "mean_transfer": 0.625, "gap": 0.375}
    assert "| all but boolean | 1.000 | 0.750 | — | 0.750 | 0.250 |" in s.markdown
    assert (tmp_path / "transfer_matrix.png").is_file()


def test_transfer_matrix_rejects_two_in_distribution_cells():
    from sift.errors import SiftError

    cells = {("A", "A"): cell([0.1, 0.2, 0.8, 0.9]), ("A", IN_DIST): cell([0.1, 0.2, 0.8, 0.9]),
             ("A", "B"): cell([0.1, 0.2, 0.8, 0.9])}
    with pytest.raises(SiftError, match="two in-distribution cells"):
        transfer_matrix(cells, n_resamples=0)


# ------------------------------------------------------------------------------------------------ defect 2
def test_ensemble_table_keeps_a_seeded_detector_named_ensemble_whole():
    # per-seed 4-detector ensembles are a detector of their own ("instance_ensemble", seeds 0 and 1): one row with
    # its single-seed mean and the seed ensemble built here, not a row "instance" holding the last seed
    runs = {"instance_ensemble": [toy.predictions(0, "instance_ensemble"), toy.predictions(1, "instance_ensemble")]}
    s = ensemble_table(runs, toy.pairs(), n_resamples=0)
    assert list(s.results["detectors"]) == ["instance_ensemble"] and s.results["built_here"] == ["instance_ensemble"]
    r = s.results["detectors"]["instance_ensemble"]
    assert r["n_seeds"] == 2
    assert est(r, "single_ivr") == pytest.approx((5 / 12 + 1 / 3) / 2)   # ev_toy: seed 0 5/12, seed 1 1/3
    assert est(r, "single_mfs") == pytest.approx((7 / 13 + 4 / 7) / 2)
    assert est(r, "ensemble_ivr") == pytest.approx(11 / 24) and est(r, "ensemble_mfs") == pytest.approx(13 / 25)
    assert est(r, "gain") == pytest.approx(13 / 25 - (7 / 13 + 4 / 7) / 2)
    # a seed-less run whose run spec names <base> as its members' detector is <base>'s seed ensemble, whatever
    # its name; without that role it is an ensemble row of its own (names are not read)
    ens = toy.predictions(None, "sift_ensemble")
    ens.meta[ENSEMBLE_OF] = "sift"
    runs = {"sift": [toy.predictions(0, "sift"), toy.predictions(1, "sift")], "sift_ensemble": [ens]}
    s = ensemble_table(runs, toy.pairs(), n_resamples=0)
    assert list(s.results["detectors"]) == ["sift"] and s.results["built_here"] == []
    runs["sift_ensemble"] = [toy.predictions(None, "sift_ensemble")]
    s = ensemble_table(runs, toy.pairs(), n_resamples=0)
    assert list(s.results["detectors"]) == ["sift", "sift_ensemble"] and s.results["built_here"] == ["sift"]


def test_ensemble_rows_come_from_the_run_spec_not_the_name():
    seeds = [toy.predictions(0, "sift"), toy.predictions(1, "sift")]
    of_sift = toy.predictions(None, "sift")
    of_sift.meta[ENSEMBLE_OF] = "sift"
    assert list(group_runs({"sift": [*seeds, of_sift]})) == ["sift", "sift (ensemble)"]
    assert list(group_runs({"sift": [of_sift]})) == ["sift (ensemble)"]   # its members' detector: a suffix
    named = toy.predictions(None, "my_avg")
    named.meta[ENSEMBLE_OF] = "sift"
    assert list(group_runs({"my_avg": [named]})) == ["my_avg"]            # an ensemble file of its own name
    assert list(group_runs({"x_ensemble": [toy.predictions(None, "x_ensemble")]})) == ["x_ensemble (ensemble)"]
    assert is_ensemble_row([of_sift]) and not is_ensemble_row([*seeds, of_sift]) and not is_ensemble_row([])


def test_ensemble_table_seed_ensemble_auroc():
    # seeds: AUROC 3/4 each; their average [0.3, 0.4, 0.6, 0.6] ranks both positives above both negatives
    runs = {"d": [cell([0.1, 0.6, 0.4, 0.9], detector="d", seed=0), cell([0.5, 0.2, 0.8, 0.3], detector="d", seed=1)]}
    s = ensemble_table(runs, toy.pairs(), n_resamples=0)
    r = s.results["detectors"]["d"]
    assert est(r, "single_auroc") == 0.75 and est(r, "ensemble_auroc") == 1.0 and est(r, "auroc_gain") == 0.25
    assert "| d (single, 2 seeds) | 0.750 |" in s.markdown and "| d (ensemble, built here) | 1.000 |" in s.markdown


# ------------------------------------------------------------------------------------------------ defect 4
def test_bootstrap_pool_is_the_evaluated_split_not_the_corpus():
    runs = {"toy": [toy.predictions(0)]}
    pairs = toy.pairs()
    # pairs of six items of other splits (their traces are not in the test predictions)
    extra = Pairs(axis=["paraphrase"] * 6, kind=["preserving"] * 6, source_id=[f"x{k}/b" for k in range(6)],
                  shifted_id=[f"x{k}/p" for k in range(6)], phi_source=[1] * 6, phi_shifted=[1] * 6,
                  base_item=[f"x{k}" for k in range(6)])
    corpus = Pairs(**{f: np.concatenate([getattr(pairs, f), getattr(extra, f)]) for f in
                      ("axis", "kind", "source_id", "shifted_id", "phi_source", "phi_shifted", "base_item")})
    a = main_table(runs, pairs, options=ReportOptions(n_resamples=200)).results
    b = main_table(runs, corpus, options=ReportOptions(n_resamples=200)).results
    assert a["n_items"] == b["n_items"] == 4   # i0..i3, not the 10 items the corpus's pairs name
    assert a["detectors"]["toy"]["ivr"] == b["detectors"]["toy"]["ivr"]
    assert a["detectors"]["toy"]["in_dist_auroc"] == b["detectors"]["toy"]["in_dist_auroc"]


def test_stratified_resamples_keep_each_split_size():
    test = [cell([0.1, 0.2, 0.8, 0.9])]                                              # items a b c d
    held = [cell([0.1, 0.2, 0.8, 0.9], items=("c", "d", "e", "f"), split="transfer")]  # c d shared, e f held out
    items = Items(["a", "b", "c", "d", "e", "f"])
    strata = split_strata(items, [test, held])
    # strata by split membership: {a, b} test only, {c, d} both, {e, f} held-out only
    assert len(set(strata[:2])) == len(set(strata[2:4])) == len(set(strata[4:])) == 1 and len(set(strata)) == 3
    for drawn in draw_clusters(6, 50, seed=3, strata=strata):
        counts = np.bincount(strata[drawn], minlength=3)
        assert sorted(counts.tolist()) == [2, 2, 2]
        assert np.isin(drawn, [0, 1, 2, 3]).sum() == 4   # every replicate holds exactly 4 test items
    # one stratum: the plain cluster bootstrap's draws
    rng = np.random.default_rng(7)
    assert np.array_equal(next(draw_clusters(5, 1, seed=7)), rng.integers(0, 5, size=5))
    est_, lo, hi = bootstrap_vector(lambda d: np.array([4.0 if d is None else np.isin(d, [0, 1, 2, 3]).sum()]),
                                    6, 30, strata=strata)
    assert est_[0] == lo[0] == hi[0] == 4.0


# ------------------------------------------------------------------------------------------------ defect 5
def test_like_for_like_gap_next_to_the_papers_gap():
    main = {"sift": [cell([0.1, 0.2, 0.8, 0.9])]}                                             # in-dist AUROC 1
    held = cell([0.5, 0.5, 0.5, 0.5], items=("e", "f", "g", "h"), split="transfer", prefix="u")  # held out: 0.5
    own = cell([0.1, 0.6, 0.5, 0.9], prefix="v")                       # the transfer run's own test split: 0.75
    s = main_table(main, toy.pairs(), transfer={"cross-domain (boolean)": {"sift": [held]}},
                   transfer_in_dist={"cross-domain (boolean)": {"sift": [own]}}, options=ReportOptions(n_resamples=50))
    r = s.results["detectors"]["sift"]
    assert est(r, "gap") == 0.5                                 # main run's 1.0 − held-out 0.5 (the paper's)
    assert est(r, "gap_like_for_like") == 0.25                  # transfer run's 0.75 − its held-out 0.5
    assert est(r, "gap_like_for_like/cross-domain (boolean)") == 0.25
    assert s.results["n_items"] == 8   # a b c d (both test splits) + e f g h (held out)
    assert "Gap (like-for-like)" in s.markdown


def test_pooled_ivr_and_infeasible_seeds_count_as_zero():
    # seed 1: the 7 traces with rho >= 0.75 are all wrong -> CP bound 1 > alpha: infeasible
    wrong = {"i0/b": 0.05, "i0/p": 0.05, "i0/h": 0.05, "i2/a": 0.05, "i0/a": 0.95, "i2/b": 0.95, "i2/p": 0.95}
    runs = {"toy": [toy.predictions(0), toy.predictions(1, probs=wrong)]}
    s = main_table(runs, toy.pairs(), options=ReportOptions(selective=CERT, n_resamples=0))
    r = s.results["detectors"]["toy"]
    # seed 0: paraphrase 2/4 + hint 1/3 violations -> macro 5/12, pooled 3/7
    r0 = main_table({"toy": [toy.predictions(0)]}, toy.pairs(),
                    options=ReportOptions(n_resamples=0)).results["detectors"]["toy"]
    assert est(r0, "ivr") == pytest.approx(5 / 12) and est(r0, "ivr_pooled") == pytest.approx(3 / 7)
    assert [x["feasible"] for x in r["sgr"]] == [True, False] and r["n_feasible"] == 1
    # seed 0 certifies 7/15 traces (cert MFS = kappa = 7/15, see test_eval_tables); seed 1 counts as 0
    assert est(r, "coverage") == pytest.approx((7 / 15 + 0) / 2)
    assert est(r, "cert_mfs") == pytest.approx((7 / 15 + 0) / 2)
    assert est(r, "cert_ivr") == 0.0                            # feasible seeds only
    assert "| 1/2 |" in s.markdown


# ------------------------------------------------------------------------------------------------ defect 7
def test_deterministic_detector_is_marked():
    same = toy.predictions(0, "probe")
    twin = toy.predictions(0, "probe")
    twin.seed = 1
    s = main_table({"probe": [same, twin], "toy": [toy.predictions(0), toy.predictions(1)]}, toy.pairs(),
                   options=ReportOptions(n_resamples=0))
    assert s.results["detectors"]["probe"]["deterministic"] and not s.results["detectors"]["toy"]["deterministic"]
    assert s.results["detectors"]["probe"]["seed_repeat"]["floor"] == 0.0
    assert "‡ probe: deterministic" in s.markdown and "seed_resample" in s.markdown
    e = ensemble_table({"probe": [same, twin]}, toy.pairs(), n_resamples=0)
    assert e.results["detectors"]["probe"]["deterministic"] and est(e.results["detectors"]["probe"], "gain") == 0.0
    assert "probe (single, 2 seeds) ‡" in e.markdown


# ------------------------------------------------------------------------------------------------ defect 6
def test_rows_of_undertrained_runs_are_marked():
    capped = toy.predictions(0, "sift")
    capped.meta.update(converged=False, preset="quick")   # the run's training record: hit the epoch cap
    done = toy.predictions(1, "sift")
    done.meta.update(converged=True, preset="quick")
    fitted = toy.predictions(0, "probe")
    s = main_table({"sift": [capped, done], "probe": [fitted]}, toy.pairs(), options=ReportOptions(n_resamples=0))
    assert s.results["detectors"]["sift"]["undertrained"] == "undertrained (quick)"
    assert s.results["detectors"]["probe"]["undertrained"] is None
    assert "| sift ⚠ undertrained (quick) |" in s.markdown and "| probe |" in s.markdown
    e = ensemble_table({"sift": [capped, done]}, toy.pairs(), n_resamples=0)
    assert "sift (single, 2 seeds) ⚠ undertrained (quick)" in e.markdown


def test_rows_the_preset_declares_below_full_are_marked(tmp_path):
    from pathlib import Path

    from sift.evaluation.faithshift_report import load_predictions
    from sift.faithshift import RunSpec

    small = toy.predictions(0, "mlp")
    small.meta.update(converged=True, preset="quick")   # converged, but the preset's data is too small for it
    path = small.save(tmp_path / "test.npz")
    specs = [RunSpec("main/mlp/seed0", "main", "mlp", 0), RunSpec("main/toy/seed0", "main", "toy", 0)]
    files = {"main/mlp/seed0": {"test": Path(path)},
             "main/toy/seed0": {"test": Path(toy.predictions(0).save(tmp_path / "toy.npz"))}}
    preds = load_predictions(specs, files, below_full=["mlp"])
    by = {p.detector: [p] for p in preds}
    s = main_table(by, toy.pairs(), options=ReportOptions(n_resamples=0))
    assert s.results["detectors"]["mlp"]["undertrained"] == "undertrained (quick)"
    assert s.results["detectors"]["toy"]["undertrained"] is None
    assert "0.05 AUROC of the `full` preset" in s.markdown


def test_run_roles_are_read_in_one_place():
    """RunRole: the report's one reading of the role keys a run spec writes into Predictions.meta."""
    from sift.evaluation.predictions import RunRole

    assert RunRole.of({}).is_main and not RunRole.of({}).is_variant
    for none in (None, "", "none"):  # a run trained without an ablation is a main run
        assert RunRole.of({"ablation": none}) == RunRole() and RunRole.of({"ablation": none}).is_main
    ab = RunRole.of({"ablation": "no_irm", "group": "ablation"})
    assert ab.ablation == "no_irm" and ab.is_variant and not ab.is_main
    assert RunRole.of({"variant": True}).is_variant and RunRole.of({"variant": True}).is_main  # own appendix rows
    col = RunRole.of({"transfer_setting": "cross-domain (boolean)"})
    assert col.transfer_setting == "cross-domain (boolean)" and not col.is_main and not col.is_variant
    cell = RunRole.of({"train_on": "all but boolean", "test_on": "boolean", "matrix": "cross-domain"})
    assert cell.cell == ("cross-domain", "all but boolean", "boolean") and not cell.is_main
    assert RunRole.of({"train_on": "a", "test_on": "b"}).cell == ("transfer", "a", "b")  # the default matrix
    home = RunRole.of({"in_dist_of": "cross-model (llama)"})
    assert home.in_dist_of == "cross-model (llama)" and not home.is_main
