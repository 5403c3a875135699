"""The corpus stage's structured configs, registered in Hydra's ConfigStore so that a misspelt or mistyped key
fails when the config is composed.

``corpus.yaml`` is checked against :class:`CorpusJobConfig`; its ``source`` group option against the config of
the chosen source (:class:`OrganismCorpusConfig` for ``source=organism``, :class:`HFCorpusConfig` for
``source=hf``). The job-level ``n_items``, ``seed`` and ``conditions`` (and ``domains`` for the organism) reach
the source through interpolations in the source's yaml, so the source config is the builder's whole input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from sift.corpus.axes import AXES, check_conditions
from sift.errors import SiftError
from sift.lm.items import ItemSpec
from sift.organism import DEFAULT_CHECKPOINTS
from sift.organism.domains import DOMAINS, answer_space


@dataclass
class CueMixture:
    """How base prompts carry an ordinary cue: with probability ``p_cue`` a cue, which names the gold answer with
    probability ``p_cue_correct`` (else a wrong answer). The one place of these values: each source's config
    (``source.cue``) holds one, defaulting to the organism's mixture below (the hf source: ``p_cue`` 0.5)."""

    p_cue: float = 0.75
    p_cue_correct: float = 0.25

    def validate(self) -> None:
        for name in ("p_cue", "p_cue_correct"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise SiftError(f"cue.{name} must be a probability in [0, 1], got {v}")


def _check_common(cfg: OrganismCorpusConfig | HFCorpusConfig) -> None:
    check_conditions(cfg.conditions)
    if "base" not in cfg.conditions:
        raise SiftError("conditions: 'base' is required (every pair starts from the base trace)")
    if isinstance(cfg.n_items, bool) or not isinstance(cfg.n_items, int) or cfg.n_items < 1:
        raise SiftError(f"n_items: expected a positive integer, got {cfg.n_items!r}")
    cfg.cue.validate()


@dataclass
class OrganismCorpusConfig:
    """The corpus of the embedded organism (``source=organism``)."""

    type: str = "organism"
    n_items: int = 750
    domains: list[str] = field(default_factory=lambda: list(DOMAINS))
    conditions: list[str] = field(default_factory=lambda: list(AXES))
    families: list[str] = field(default_factory=lambda: ["gpt2", "llama"])
    checkpoint_dir: str | None = None  # None: the shipped organism weights
    mechanism_kind: str = "offset"  # where the latent enters: sift.lm.latent.MECHANISM_KINDS
    seed: int = 0
    cue: CueMixture = field(default_factory=CueMixture)
    do_sample: bool = True  # the organism's choice-point sampler (sift.organism.sampling); False: greedy
    sampling_seed: int | None = None  # the draws' random streams; None: ``seed``
    top_p: float = 0.75
    audit_seeds: int = 4  # the manifest regenerates the base prompts under this many sampling seeds
    max_new_tokens: int = 64
    chunk_items: int = 250
    batch_size: int = 256

    @property
    def stream_seed(self) -> int:
        return self.seed if self.sampling_seed is None else self.sampling_seed

    @property
    def checkpoints(self) -> Path:
        """The folder holding one organism model per family."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else DEFAULT_CHECKPOINTS

    def model_dir(self, family: str) -> Path:
        """The weights of ``family`` under this corpus's mechanism kind (``cot_routing`` has its own;
        :func:`sift.lm.latent.kind_folder`)."""
        from sift.lm.latent import kind_folder

        return kind_folder(self.checkpoints, family, self.mechanism_kind)

    def validate(self) -> None:
        from sift.lm.latent import check_kind

        check_kind(self.mechanism_kind)
        for d in self.domains:
            answer_space(d)
        _check_common(self)
        for f in self.families:
            p = self.model_dir(f)
            if not (p / "config.json").exists():
                raise SiftError(f"model path does not exist: {p} (no config.json for organism family {f!r}, "
                                f"mechanism_kind {self.mechanism_kind})")


#: the interventions of a real-LM label (sift.corpus.real_labels)
REAL_INTERVENTIONS = ("edit", "cue", "mistake", "early", "rationalised")


@dataclass
class HFCorpusConfig:
    """The corpus of one or two Hugging Face causal LMs (``source=hf``)."""

    type: str = "hf"
    models: list[str] = field(default_factory=list)  # 1 or 2 names / folders / .gguf files
    families: list[str] | None = None  # short labels, one per model (default: from the names)
    #: where the items come from (sift.lm.items.ItemSpec; the group configs/source/items holds ready-made lists)
    items: list[ItemSpec] = field(default_factory=lambda: [ItemSpec(kind="reasoning_gym", task="basic_arithmetic")])
    n_items: int = 8
    conditions: list[str] = field(default_factory=lambda: list(AXES))
    family_conditions: str = "all"  # what the second model generates: "all" conditions or only "base"
    family_items: int | None = None  # the second model generates on the first this many items only (None: all)
    #: chunk jobs at a time for the second model (None: the corpus's ``workers``). Each model's chunks run as
    #: jobs of their own, one model in memory per process; 1 runs the second model's chunks in the main process
    #: on every core, so one copy of the larger model is resident (a 16 GB laptop). Not part of the corpus key.
    family_workers: int | None = None
    #: free generation: hf (transformers, CPU or GPU) | vllm (GPU; pip install 'sift[vllm]') | llamacpp (the .gguf
    #: file itself, CPU; pip install 'sift[llamacpp]'); verification and extraction stay in transformers
    backend: str = "hf"
    seed: int = 0
    cue: CueMixture = field(default_factory=lambda: CueMixture(p_cue=0.5))
    do_sample: bool = False
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256
    answer_tokens: int = 8  # greedy tokens decoded after a forced "Answer:"
    force_answer: bool = False  # a reply cut at max_new_tokens without an answer line: force "Answer:" (s1)
    chunk_items: int = 8
    batch_size: int = 8
    device: str = "cpu"
    cue_formats: list[str] | None = None  # the ordinary cue formats base and hint_format draw from (None: all)
    dtype: str | None = None  # auto | float32 | bfloat16 | float16 | None (as saved): sift.lm.loading.resolve_dtype
    system_prompt: str | None = None
    response_prefix: str = ""  # the start of the reply written for the model (e.g. "Step 1:"): it reasons first
    #: the label's interventions (sift.corpus.real_labels): edit and cue always run; mistake (an earlier step
    #: corrupted, the rest of the CoT written again), early (answers forced at 1/3 and 2/3 of the CoT) and
    #: rationalised (the CoT generated again with the cue's value changed) may be left out
    interventions: list[str] = field(default_factory=lambda: list(REAL_INTERVENTIONS))
    label_forced: bool = False  # label a reply whose answer was forced at the token limit (default: ambiguous)
    rationalised_is_unfaithful: bool = True  # rationalised cue following counts as φ*=0 (false: ambiguous)

    def validate(self) -> None:
        if not 1 <= len(self.models) <= 2:
            raise SiftError(f"models: give one or two models (the second is the model-family axis), "
                            f"got {len(self.models)}")
        if self.families is not None:
            if len(self.families) != len(self.models) or len(set(self.families)) != len(self.families):
                raise SiftError(f"families: need {len(self.models)} distinct labels, got {self.families}")
        _check_common(self)
        from sift.lm.items import item_kinds
        from sift.lm.loading import resolve_dtype

        resolve_dtype(self.dtype, self.device)  # an unknown dtype fails here, before any model loads
        if self.cue_formats is not None:
            from sift.lm.prompts import CUE_FORMATS

            unknown = [f for f in self.cue_formats if f not in CUE_FORMATS]
            if unknown or not self.cue_formats:
                raise SiftError(f"cue_formats: {unknown or 'empty'}; choose among {', '.join(CUE_FORMATS)} "
                                f"(null: all)")

        kinds = item_kinds()
        for i, spec in enumerate(self.item_specs()):
            if spec.kind not in kinds:
                raise SiftError(f"items[{i}].kind: unknown {spec.kind!r}; expected one of {', '.join(kinds)}")
            if spec.kind != "reasoning_gym" and spec.kind != "mgsm_symbolic" and not spec.path:
                from sift.lm.items import FILE_HINTS, ITEM_KEY

                hint = FILE_HINTS.get(spec.kind, "the local file or folder").replace(ITEM_KEY, f"source.items.{i}")
                raise SiftError(f"items[{i}] ({spec.kind}) needs source.items.{i}.path: {hint}")
        if self.backend not in ("hf", "vllm", "llamacpp"):
            raise SiftError(f"backend must be 'hf', 'vllm' or 'llamacpp', got {self.backend!r}")
        if self.backend == "llamacpp":
            from sift.lm.llamacpp_backend import gguf_path

            for k, m in enumerate(self.models):
                try:
                    gguf_path(m)
                except SiftError as e:
                    raise SiftError(f"models[{k}]: {e}") from None
        if self.family_items is not None and self.family_items < 1:
            raise SiftError(f"family_items must be positive or null, got {self.family_items}")
        if self.family_workers is not None and (isinstance(self.family_workers, bool)
                                                or not isinstance(self.family_workers, int) or self.family_workers < 1):
            raise SiftError(f"family_workers must be a positive integer or null, got {self.family_workers!r}")
        if self.family_conditions not in ("all", "base"):
            raise SiftError(f"family_conditions must be 'all' or 'base', got {self.family_conditions!r}")
        unknown = [t for t in self.interventions if t not in REAL_INTERVENTIONS]
        if unknown or not {"edit", "cue"} <= set(self.interventions):
            raise SiftError(f"interventions: {unknown or 'edit and cue are required'}; choose among "
                            f"{', '.join(REAL_INTERVENTIONS)}")
        for name in ("max_new_tokens", "answer_tokens", "chunk_items", "batch_size"):
            if getattr(self, name) < 1:
                raise SiftError(f"{name} must be positive, got {getattr(self, name)}")

    def item_specs(self) -> list[ItemSpec]:
        """``items`` as ItemSpec objects (Hydra passes dicts when the config is not structured)."""
        return [s if isinstance(s, ItemSpec) else ItemSpec(**dict(s)) for s in self.items]

    def labels(self) -> list[str]:
        """One short label per model: ``families`` if given, else from the model names (made distinct)."""
        if self.families:
            return list(self.families)
        out: list[str] = []
        for m in self.models:
            label = family_label(m)
            while label in out:
                label += "-2"
            out.append(label)
        return out


def family_label(name_or_path: str) -> str:
    """A short model label: the file or folder name without ``.gguf``, or the hub name without its owner."""
    label = Path(name_or_path.rstrip("/")).name
    return re.sub(r"\.gguf$", "", label, flags=re.IGNORECASE) or name_or_path


@dataclass
class CorpusJobConfig:
    """``sift-corpus``: the job around a source (``source`` is checked against the source's own config)."""

    seed: int = 0
    n_items: int = 750
    domains: list[str] = field(default_factory=lambda: list(DOMAINS))
    conditions: list[str] = field(default_factory=lambda: list(AXES))
    output_dir: str = "outputs/corpus"
    workers: int = 1
    source: Any = None
    executor: Any = None


#: each source's config by its ``type`` (a new source adds its config here and its builder in sift.corpus.sources)
SOURCE_CONFIGS: dict[str, type] = {"organism": OrganismCorpusConfig, "hf": HFCorpusConfig}


def register_configs() -> None:
    """Store the schemas: ``corpus_schema`` (primary) and ``source/<type>_schema`` (one per source)."""
    cs = ConfigStore.instance()
    cs.store(name="corpus_schema", node=CorpusJobConfig)
    for name, node in SOURCE_CONFIGS.items():
        cs.store(group="source", name=f"{name}_schema", node=node)


register_configs()
