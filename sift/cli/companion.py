"""``sift-companion``: the other papers' metrics (ICE, cue-anchored judges, System-1 / S1-SHAP, EDCT) as a
report, e.g. ``sift-companion companion=tiny output_dir=/tmp/comp`` or ``companion.data.corpus_dir=/tmp/c750``.

The primary config lives in the ConfigStore (below) so that ``configs/companion/`` only holds the options of
the ``companion`` group, which ``sift-evaluate`` shares.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from sift.cli._common import clean_failure, sift_main

PRIMARY = {
    "defaults": [{"companion": "all"}, {"override hydra/job_logging": "stdout"}, "_self_"],
    "output_dir": "outputs/companion",
    "hydra": {"run": {"dir": "${output_dir}"}, "output_subdir": None, "job": {"chdir": False}},
}
ConfigStore.instance().store(name="sift_companion", node=PRIMARY)


def run(cfg: DictConfig) -> dict:
    """Run the enabled families of ``cfg.companion``; write ``report.md`` and ``results.json`` to ``cfg.output_dir``."""
    from sift.companion.report import companion_sections
    from sift.errors import SiftError
    from sift.provenance import provenance
    from sift.report import write_report

    if not cfg.companion.get("enabled", False):
        raise SiftError("companion.enabled is false (companion=none): nothing to run; choose companion=all or tiny")
    sections = companion_sections(cfg.companion, cfg.output_dir)
    meta = provenance(OmegaConf.to_container(cfg.companion, resolve=True), seed=int(cfg.companion.seed),
                      command="sift-companion", config=OmegaConf.to_container(cfg.companion, resolve=True))
    report, results = write_report(cfg.output_dir, sections, meta=meta, title="sift companion metrics",
                                   preamble="Metrics of the companion papers (ICE 000, judges 001, System-1 003, "
                                            "EDCT 004) on the organism and a Hugging Face judge.")
    return {"report": str(report), "results": str(results), "sections": [s.key for s in sections]}


@sift_main("sift_companion")
def main(cfg: DictConfig) -> None:
    with clean_failure("sift-companion", cfg.output_dir):
        r = run(cfg)
        print(f"sift-companion: {', '.join(r['sections'])} -> {r['report']}")


if __name__ == "__main__":
    main()
