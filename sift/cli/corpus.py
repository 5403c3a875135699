"""``sift-corpus``: build a FaithShift trace corpus (Hydra overrides, e.g. ``n_items=100 source=hf``); its chunks
run as jobs on ``executor=local`` (``workers`` processes) or ``executor=slurm`` (an array job)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from sift.cli._common import clean_failure, sift_main


def run(cfg: DictConfig) -> dict:
    """Build the corpus described by ``cfg`` into ``cfg.output_dir``; returns the manifest. Prints one warning
    line when a shortcut control of the manifest's audit exceeds its limit (:mod:`sift.corpus.audit`)."""
    from sift.corpus.audit import warning_line

    m = _build(cfg)
    line = warning_line(m)
    if line:
        print(line, flush=True)
    return m


def _build(cfg: DictConfig) -> dict:
    from sift.errors import SiftError

    n = cfg.get("n_items")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SiftError(f"n_items: expected a positive integer, got {n!r}")
    from sift.corpus.store import engine_config
    from sift.engine import validate_executor

    src = cfg.source
    engine = engine_config(cfg.executor, cfg.workers)
    validate_executor(engine)
    if src.type == "organism":
        from sift.corpus.build import CorpusConfig, build_corpus
        from sift.organism import DEFAULT_CHECKPOINTS

        cc = CorpusConfig(n_items=cfg.n_items, domains=list(cfg.domains), conditions=list(cfg.conditions),
                          families=list(src.families),
                          checkpoint_dir=src.checkpoint_dir or str(DEFAULT_CHECKPOINTS), seed=cfg.seed,
                          p_cue=src.p_cue, p_cue_correct=src.p_cue_correct, do_sample=src.do_sample,
                          sampling_seed=src.sampling_seed, top_p=src.top_p, audit_seeds=src.audit_seeds,
                          chunk_items=src.chunk_items, batch_size=src.batch_size)
        return build_corpus(cc, cfg.output_dir, engine=engine)
    if src.type == "hf":
        from sift.lm.real_corpus import RealCorpusConfig, build_real_corpus

        s = OmegaConf.to_container(src, resolve=True)
        rc = RealCorpusConfig(models=list(s["models"]), families=s["families"], source=s["items"], task=s["task"],
                              path=s["path"], n_items=cfg.n_items, conditions=list(cfg.conditions),
                              family_conditions=s["family_conditions"], seed=cfg.seed, p_cue=s["p_cue"],
                              p_cue_correct=s["p_cue_correct"], do_sample=s["do_sample"],
                              temperature=s["temperature"], top_p=s["top_p"], max_new_tokens=s["max_new_tokens"],
                              answer_tokens=s["answer_tokens"], chunk_items=s["chunk_items"],
                              batch_size=s["batch_size"], device=s["device"], dtype=s["dtype"],
                              system_prompt=s["system_prompt"])
        return build_real_corpus(rc, cfg.output_dir, engine=engine)
    raise SiftError(f"source.type must be 'organism' or 'hf', got {src.type!r}")


@sift_main("corpus")
def main(cfg: DictConfig) -> None:
    with clean_failure("sift-corpus", cfg.output_dir):
        m = run(cfg)
        print(f"sift-corpus: {m['traces']} traces, {m['pairs']} pairs -> {cfg.output_dir}")


if __name__ == "__main__":
    main()
