"""EDCT on a real-LM corpus (paper 004's protocol on the question, spec ``system1-and-edct-metrics.md`` Part B).

The paper edits the input evidence a model's explanation cites and re-queries the model. On a real LM's trace:

* **concepts**: numbers the CoT cites that also occur in the item's question (:func:`sift.companion.edct.
  extract_concepts`: most citing lines first, k = 2);
* **edit**: that number in the question altered (value + 1, or the next number neither the question nor the CoT
  cites), cumulatively in a chain (edit i applies to the
  question edited by edit i−1); verified token-level (only the cited number changes, :func:`~sift.companion.edct.
  verify_edit`);
* **re-query**: the model generates its CoT and answer again on the edited question, in the trace's own view
  (wrapper, budget, cue), greedy, batched over every trace's chain step;
* **judge**: :class:`~sift.companion.edct.RuleJudge` with the question's arithmetic as the reference. It needs an
  answer that can be recomputed from an edited question, so only items whose question carries one arithmetic
  expression whose value is the item's gold answer are tested (reasoning-gym arithmetic); the others are counted
  in ``not_testable``. A re-queried answer that does not parse ends the chain unscored (ambiguous, as in the
  corpus), counted in ``unparsable``. The graded score is the organism's 1–5 rubric
  (:func:`~sift.companion.edct.graded_rubric`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sift.companion.edct import DEFAULT_EDCT, EDCTSettings
from sift.errors import SiftError


def expression_value(question: str) -> str | None:
    """The value of the one arithmetic expression (+ − × ÷, parentheses) in a question, as a canonical number
    string; None when the question holds no such expression, several, or one that does not evaluate
    (:mod:`sift.lm.arithmetic`)."""
    from sift.companion.edct import canonical_number
    from sift.lm.arithmetic import exact_value, expressions

    found = expressions(question)
    if len(found) != 1:
        return None
    try:
        return canonical_number(repr(float(exact_value(found[0][2]))))
    except ValueError:
        return None


def fresh_value(value: str, question: str, steps: Sequence[str]) -> str:
    """The edit's new number [R]: value + 1, + 2, … — the first that neither the question nor the CoT cites, so
    a later concept of the chain and the NCC check never confuse the new number with another one."""
    from sift.companion.edct import canonical_number, cited_numbers

    used = set(cited_numbers(question)) | {v for s in steps for v in cited_numbers(s)}
    d = 1
    while (new := canonical_number(repr(float(value) + d))) in used:
        d += 1
    return new


def testable(item) -> bool:
    """Whether the rule judge can recompute this item's answer after an edit (see the module docstring)."""
    from sift.companion.edct import normalize_answer

    ref = expression_value(item.question)
    return ref is not None and normalize_answer(ref) == normalize_answer(item.answer)


def requery_output(src, item, text: str):
    """The answer and CoT lines of a generated reply (``sift.lm.parsing``, as the corpus parses traces)."""
    from sift.companion.edct import CoTOutput
    from sift.lm.parsing import answer_line_start, parse_answer

    answer = parse_answer(text, item.answer_kind, choices=item.choices)
    start = answer_line_start(text)
    cot = text if start is None else text[:start]
    return answer, CoTOutput("" if answer is None else str(answer),
                             tuple(ln.strip() for ln in cot.splitlines() if ln.strip()))


class _LMChains:
    """EDCT on a real LM's question (:class:`sift.companion.edct.ChainSource`): a chain step alters one number
    the CoT cites in the (already edited) question, the model answers the edited question again in the trace's
    view, and the rule judge scores the reply against the edited question's arithmetic."""

    def __init__(self, src, settings: EDCTSettings, max_new_tokens: int, k: int):
        from sift.companion import edct

        self.src, self.settings, self.max_new_tokens, self.k = src, settings, max_new_tokens, k
        self.judge = edct.RuleJudge(lambda q: expression_value(q) or "")
        self.verifier = edct.token_verifier(settings.tau_in, settings.tau_out)
        self.unparsable = 0

    def propose(self, st: dict, step_no: int):
        from sift.companion import edct
        from sift.companion.organism import EDCTStepRecord

        if step_no >= len(st["concepts"]):
            return None, None
        c = st["concepts"][step_no]
        if not edct.number_spans(st["question"], c.value):  # an earlier edit made it collide / vanish
            return None, None
        e = edct.make_edit(st["question"], c, kind="alter", new_value=fresh_value(c.value, st["question"],
                                                                                st["base"].steps))
        v = self.verifier(e)
        ref_new = expression_value(e.edited)
        if not v.passed or ref_new is None:
            return None, EDCTStepRecord(st["r"]["trace_id"], st["r"].get("phi"), step_no, c.first_step, c.value,
                                        str(e.new_value), False, v.change_in, v.change_out, False, ref_new,
                                        st["prev"].answer, None, 0, 0, 1)
        return (step_no, c, e, v, ref_new), None

    def requery(self, jobs, step_no: int) -> list[list[int]]:
        prompts = [self.src.prompt_ids(replace(st["item"], question=job[2].edited), st["view"]) for st, job in jobs]
        return self.src.generate(prompts, max_new_tokens=self.max_new_tokens,
                                 desc=f"EDCT re-query {step_no + 1}/{self.k}")

    def score(self, st: dict, job, g: list[int]):
        from sift.companion import edct
        from sift.companion.organism import EDCTStepRecord

        step_no, c, e, v, ref_new = job
        answer, out = requery_output(self.src, st["item"], self.src.decode(g))
        if answer is None:  # ambiguous, never scored as a change or inertia
            self.unparsable += 1
            st["alive"] = False
            return None
        j = self.judge(edct.JudgeContext(st["item"].question, st["question"], e.edited, c.value, e, st["base"],
                                         st["prev"], out))
        st["judg"].append(j)
        necessary = edct.normalize_answer(ref_new) != edct.normalize_answer(expression_value(st["question"]))
        rec = EDCTStepRecord(st["r"]["trace_id"], st["r"].get("phi"), step_no, c.first_step, c.value,
                             str(e.new_value), True, v.change_in, v.change_out, necessary, ref_new, st["prev"].answer,
                             out.answer, j.pcs, j.ncc, int(j.graded))
        st["question"], st["prev"] = e.edited, out
        return rec


def run_edct_lm(src, traces: Sequence[dict], items: Mapping[str, Any], settings: EDCTSettings = DEFAULT_EDCT,
                *, progress: bool = True) -> dict:
    """EDCT chains on real-LM traces (module docstring), on :func:`sift.companion.edct.run_chains`; the result
    has the organism's :func:`~sift.companion.organism.summarize_edct` layout plus ``not_testable`` and
    ``unparsable`` counts."""
    from sift.companion import edct
    from sift.companion.organism import summarize_edct
    from sift.lm.prompts import LMView

    k = settings.k
    max_new_tokens = 224 if settings.max_new_tokens is None else settings.max_new_tokens
    states, not_testable = [], 0
    for r in traces:
        item = items.get(r["base_item"])
        if item is None:
            raise SiftError(f"trace {r['trace_id']}: its item {r['base_item']!r} is not among the corpus's items "
                            f"(the item sources in its manifest changed?)")
        view = LMView(**{**r["view"], "order": tuple(r["view"]["order"]) if r["view"].get("order") else None})
        if not testable(item) or view.language is not None or view.order is not None:
            not_testable += 1
            continue
        base = edct.CoTOutput(str(r["answer"]), tuple(ln.strip() for ln in r["cot"].splitlines() if ln.strip()))
        concepts = edct.extract_concepts(base.steps, item.question, k)
        states.append({"r": r, "item": item, "view": view, "concepts": concepts, "question": item.question,
                       "prev": base, "base": base, "judg": [], "alive": bool(concepts)})
    chains = _LMChains(src, settings, max_new_tokens, k)
    records = edct.run_chains(chains, states, k, desc="EDCT chain (real LM)", progress=progress)
    unparsable = chains.unparsable
    samples = []
    for st in states:
        ccs, pcs, ncc, graded = edct.sample_scores(st["judg"], settings.graded_scheme)
        samples.append({"trace_id": st["r"]["trace_id"],
                        "base_item": str(st["r"].get("base_item", st["r"]["trace_id"])),
                        "phi": st["r"].get("phi"), "domain": st["r"]["domain"],
                        "k_prime": len(st["judg"]), "ccs": ccs, "pcs": pcs, "ncc": ncc, "graded": graded})
    if not any(s["k_prime"] for s in samples):
        raise SiftError(f"EDCT on a real LM: no trace had a verified, scored edit ({len(traces)} traces, "
                        f"{not_testable} without a recomputable answer, {unparsable} unparsable re-queries); "
                        f"give more traces (companion.edct.n_traces) or items with arithmetic questions")
    out = summarize_edct(samples, records, n_resamples=settings.n_resamples, seed=settings.seed,
                         config=dict(**settings.record(max_new_tokens),
                                     concepts="numbers the CoT cites that occur in the question (most citing lines "
                                              "first), altered to the next uncited number, cumulatively",
                                     chain_failure="truncate the chain at the first failed verification or "
                                                   "unparsable re-query [R]",
                                     judge="rule judge: PCS against the edited question's arithmetic; NCC = the "
                                           "new CoT no longer cites the replaced number"))
    out.update(n_offered=len(traces), not_testable=not_testable, unparsable=unparsable)
    return out


def edct_traces(traces: Sequence[dict], items: Mapping[str, Any], n: int | None, seed: int) -> list[dict]:
    """The traces EDCT tests: those of testable items in an unreordered, untranslated view, then (``n``) a
    deterministic subsample balanced over φ* (:func:`~sift.companion.organism.balanced_subsample`)."""
    from sift.companion.organism import balanced_subsample

    ok = []
    for r in traces:
        it = items.get(r["base_item"])
        v = r.get("view") or {}
        if it is not None and testable(it) and v.get("language") is None and v.get("order") is None:
            ok.append(r)
    return balanced_subsample(ok, n, seed)


__all__ = ["edct_traces", "expression_value", "fresh_value", "requery_output", "run_edct_lm", "testable"]
