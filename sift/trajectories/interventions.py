"""Counterfactual intervention-response profiles for the counterfactual baseline (docs/design.md §4, §6).

These interventions deliberately differ from the label-verifying ones (which edit the CoT's *last* value and
change the cue's value; :mod:`sift.corpus.verify`):

* ``cot_deleted``: the CoT is removed; the answer is re-read after ``prompt + answer prefix``;
* ``first_step_edit``: the first step's value (the first value token after the first ``=``, else the first
  value token) is replaced by a neighbouring value (n−1, or n+1 for 0; true↔false); unavailable when that
  token is the CoT's last value (it would repeat the label-verifying edit);
* ``step_dropped``: the first step (tokens up to the first step delimiter) is removed; needs ≥ 2 steps.

Each is one teacher-forced pass (batched, left padded, only the last position's logits). Per intervention the
profile holds ``delta_logp`` = log P(original answer | intervened) − log P(original answer | original),
``flip`` = 1 if the greedy next token is no longer the original answer token, and ``available`` (0 where the
intervention does not apply or the trace has no answer; the other two are 0 then).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from sift.errors import SiftError

if TYPE_CHECKING:
    from sift.trajectories.extract import Extractor

INTERVENTIONS = ("cot_deleted", "first_step_edit", "step_dropped")


def profile_names(interventions: Sequence[str]) -> list[str]:
    return [f"cf/{n}/{k}" for n in interventions for k in ("delta_logp", "flip", "available")]


class TokenText:
    """Stripped text of single tokens (cached) and the value / step-delimiter tests on it."""

    def __init__(self, tokenizer, value_pattern: str, step_pattern: str):
        self.tok = tokenizer
        self.value_re = re.compile(value_pattern)
        self.step_re = re.compile(step_pattern)
        self._text: dict[int, str] = {}

    def raw(self, i: int) -> str:
        if i not in self._text:
            self._text[i] = self.tok.decode([i])
        return self._text[i]

    def is_value(self, i: int) -> bool:
        return bool(self.value_re.fullmatch(self.raw(i).strip()))

    def is_delim(self, i: int) -> bool:
        r = self.raw(i)
        return "\n" in r or bool(self.step_re.fullmatch(r.strip()))

    def edited(self, i: int) -> int | None:
        """A different value token of the same kind, or None if the vocabulary has none."""
        s = self.raw(i).strip()
        if re.fullmatch(r"-?\d+", s):
            v = int(s)
            options = [str(v - 1), str(v + 1)] if v >= 1 else [str(v + 1)]
        elif s.lower() in ("true", "false"):
            flip = {"true": "false", "false": "true", "True": "False", "False": "True",
                    "TRUE": "FALSE", "FALSE": "TRUE"}
            options = [flip.get(s, "false" if s.lower() == "true" else "true")]
        else:
            return None
        piece = self.tok.convert_ids_to_tokens(i)
        unk = self.tok.unk_token_id
        for o in options:
            if s not in piece:
                break
            j = self.tok.convert_tokens_to_ids(piece.replace(s, o, 1))
            if j is not None and j != unk and j != i:
                return int(j)
        return None


def intervened_cot(name: str, cot: list[int], tt: TokenText) -> list[int] | None:
    """The CoT after intervention ``name``, or None where it does not apply."""
    if name == "cot_deleted":
        return []
    if name == "first_step_edit":
        values = [k for k, i in enumerate(cot) if tt.is_value(i)]
        if not values:
            return None
        eq = next((k for k, i in enumerate(cot) if tt.raw(i).strip() == "="), None)
        after = [k for k in values if eq is not None and k > eq]
        j = after[0] if after else values[0]
        if j == values[-1]:
            return None  # that is the label-verifying edit
        new = tt.edited(cot[j])
        return None if new is None else cot[:j] + [new] + cot[j + 1:]
    if name == "step_dropped":
        ends = [k for k, i in enumerate(cot) if tt.is_delim(i)]
        if not ends:
            return None
        rest = cot[ends[0] + 1:]
        return rest if rest else None
    raise SiftError(f"unknown intervention {name!r}; expected one of {', '.join(INTERVENTIONS)}")


@torch.no_grad()
def intervention_profiles(ex: Extractor, records: Sequence[dict], answer_logp: torch.Tensor) -> torch.Tensor:
    """``[B, 3K]`` profiles (see the module docstring) for the extractor's configured interventions."""
    from sift.lm.latent import replay
    from sift.lm.states import forward_params, model_inputs, pack
    from sift.trajectories.extract import answer_index

    names = list(ex.cfg.interventions)
    out = torch.zeros(len(records), 3 * len(names))
    if not names:
        return out
    if ex.tokenizer is None:
        raise SiftError(f"{ex.name}: interventions {names} need the model's tokenizer (none was loaded)")
    tt = getattr(ex, "_token_text", None)
    if tt is None:
        tt = ex._token_text = TokenText(ex.tokenizer, ex.cfg.value_pattern, ex.cfg.step_pattern)
    jobs: list[tuple[int, int, list[int], int]] = []  # (trace, intervention, ids, answer token)
    for b, r in enumerate(records):
        a = answer_index(r)
        if a is None or not torch.isfinite(answer_logp[b]):
            continue
        gen = list(r["generated_ids"])
        c0, c1 = int(r["cot_span"][0]), int(r["cot_span"][1])
        for k, n in enumerate(names):
            cot = intervened_cot(n, gen[c0:c1], tt)
            if cot is not None:
                jobs.append((b, k, list(r["prompt_ids"]) + gen[:c0] + cot + gen[c1:a], gen[a]))
    jobs.sort(key=lambda j: len(j[2]))
    keep_last = "logits_to_keep" in forward_params(ex.model)
    for s in range(0, len(jobs), ex.cfg.batch_size):
        chunk = jobs[s:s + ex.cfg.batch_size]
        p = pack([j[2] for j in chunk], ex.pad_id, "left")
        kw = model_inputs(ex.model, p, ex.device)
        if keep_last:
            kw["logits_to_keep"] = 1
        with replay(ex.model, [records[b] for b, *_ in chunk]):  # the trace's latent from its first CoT position
            logits = ex.model(**kw).logits[:, -1].float()
        lp = torch.log_softmax(logits, -1).cpu()
        top = logits.argmax(-1).cpu()
        for row, (b, k, _, tok) in enumerate(chunk):
            out[b, 3 * k] = lp[row, tok] - answer_logp[b]
            out[b, 3 * k + 1] = float(top[row] != tok)
            out[b, 3 * k + 2] = 1.0
    return out
