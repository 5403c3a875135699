"""Scalar features for the baselines (docs/design.md §6), with their names and groups.

* ``cue/*`` (biasing-features baseline; regex on the prompt and CoT text): a cue is present; the CoT mentions a
  hint word (either lexicon); the CoT states the cue's value; the answer equals the cue's value.
* ``beh/*`` (behavioural): CoT length in tokens, number of steps (step delimiters; a trailing unterminated
  step counts), the answer equals the CoT's last value, log P(answer) in the teacher-forced pass.
* ``int/*`` (internal): mean velocity, mean drift, early commitment, attention stability.
* ``cf/*`` (counterfactual): the intervention-response profile (:mod:`sift.trajectories.interventions`).
* ``conf/*`` (output confidence; the ``output_confidence`` control): log P(answer) and the top-2 log-probability
  margin at the position predicting the answer, under the source model — what a probe reading mostly output
  confidence would read, and nothing else.

Values are raw (not standardised); baselines standardise on the training split.
"""

from __future__ import annotations

import math
import re

from sift.corpus.cue_words import HINT_RE

CUE_NAMES = ["cue/present", "cue/cot_mentions_hint", "cue/cot_mentions_cue_value", "cue/answer_equals_cue"]
BEHAVIOURAL_NAMES = ["beh/cot_tokens", "beh/n_steps", "beh/answer_equals_last_value", "beh/answer_logp"]
INTERNAL_NAMES = ["int/mean_velocity", "int/mean_drift", "int/early_commitment", "int/attention_stability"]
CONFIDENCE_NAMES = ["conf/answer_logp", "conf/answer_margin"]

_CUE_PHRASES = [r"\bi think the answer is\b", r"\ba stanford professor\b"]  # Turpin et al.-style cues
_VALUE = re.compile(r"-?\d+|true|false|[a-d]")


def _organism_cue_phrases() -> list[str]:
    """The words before the value in every organism cue format, in both lexicons."""
    from sift.organism.render import ALL_CUE_FORMATS, SHARED, cue_words, xx_word

    out = []
    for fmt in ALL_CUE_FORMATS:
        words = cue_words("\x00", fmt)
        head = words[:words.index("\x00")]
        for lex in (head, [w if w in SHARED else xx_word(w) for w in head]):
            out.append(r"(?<![\w])" + r"\s+".join(map(re.escape, lex)) + r"(?![\w])")
    return out


CUE_RE = re.compile("|".join(_CUE_PHRASES + _organism_cue_phrases()), re.IGNORECASE)


def text_features(record: dict) -> list[float]:
    """The ``cue/*`` features and the text-only behavioural ones (n_steps, answer_equals_last_value)."""
    cot = record.get("cot") or ""
    words = cot.split()
    answer = record.get("answer")
    cue = record.get("cue")
    cue_value = cue.get("value") if isinstance(cue, dict) else None
    present = cue is not None if "cue" in record else bool(CUE_RE.search(record.get("prompt") or ""))
    mentions_hint = bool(HINT_RE.search(cot))
    mentions_value = cue_value is not None and str(cue_value) in words
    ans_cue = cue_value is not None and answer is not None and str(answer) == str(cue_value)
    delims = sum(1 for w in words if w in (";",)) + cot.count("\n")
    trailing = bool(words) and words[-1] != ";" and not cot.endswith("\n")
    values = [w for w in words if _VALUE.fullmatch(w)]
    last_eq = bool(values) and answer is not None and values[-1] == str(answer)
    return [float(present), float(mentions_hint), float(mentions_value), float(ans_cue),
            float(delims + trailing), float(last_eq)]


def _finite(v: float | None) -> float:
    return 0.0 if v is None or math.isnan(v) else float(v)


def assemble(text: list[float], n_tokens: int, answer_logp: float, internal: list[float],
             profile: list[float], answer_margin: float | None = None) -> list[float]:
    """One trace's feature vector in the order ``cue/*, beh/*, int/*, cf/*, conf/*`` (NaN → 0)."""
    lp = _finite(answer_logp)
    return (text[:4] + [float(n_tokens), text[4], text[5], lp] + list(internal) + list(profile)
            + [lp, _finite(answer_margin)])


def feature_names(profile_names: list[str]) -> list[str]:
    return CUE_NAMES + BEHAVIOURAL_NAMES + INTERNAL_NAMES + list(profile_names) + CONFIDENCE_NAMES


def feature_groups(names: list[str]) -> dict[str, list[int]]:
    """Column indices per baseline group: cue, behavioural, internal, counterfactual, confidence."""
    prefix = {"cue": "cue/", "behavioural": "beh/", "internal": "int/", "counterfactual": "cf/", "confidence": "conf/"}
    return {g: [i for i, n in enumerate(names) if n.startswith(p)] for g, p in prefix.items()}
