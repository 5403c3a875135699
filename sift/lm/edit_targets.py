"""Where a CoT states its own result: the span the CoT-edit intervention replaces (docs/real_lm.md, "Labels").

The target is the model's **own stated result**: the right-hand side of the last equation it wrote, or the value
of its last conclusion sentence ("the answer is 12", "so the total is 12", ``\\boxed{12}``, "so the answer is
(B)", an option stated by its text), whichever comes later. A candidate is never

* a step or list label (``Step 4:``, ``4.`` / ``4)`` list numbering, ``### Step 2``, "in step 3");
* a value quoted from the cue: anything in a sentence that names the cue ("A Stanford professor thinks the
  answer is 135");
* a number copied from the question's premises (a value of the question that no equation of the CoT computes);
* an option label of an option list the CoT copies from the question (``(A) plausible``).

:func:`result_span` returns the target, or the reason there is none (the trace is then ambiguous).
:func:`intermediate_spans` gives the earlier computed values (right-hand sides of equations with an operator),
which the "adding mistakes" intervention corrupts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sift.lm.parsing import _BOXED, _EXPLAINS, _NUMBER, DEFAULT_LABELS, boxed_contents, normalize_number
from sift.lm.prompts import CUE_MENTION

_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-"})
# "Step 4", "step 2:", "**Step 3**", "### Step 2", "Stage 1"
_STEP_LABEL = re.compile(r"\b(?:step|stage|part|phase)\s*#?\s*(\d+)", re.IGNORECASE)
# a list number at the start of a line: "4. ", "4) ", "### 2.", "**3.**", "- 2."
_LIST_LABEL = re.compile(r"^[ \t]*(?:[#>*\-]+[ \t]*)*(?:\*\*)?\(?(\d+)(?:\*\*)?[.):](?!\d)", re.MULTILINE)
# an option line copied from the question: "(A) text", "A) text", "A. text" at the start of a line
_OPTION_LINE = re.compile(r"^[ \t]*(?:[-*][ \t]*)?\(?([A-Z])[).:][ \t]+\S", re.MULTILINE)
# words that open a conclusion sentence or state a result
_CONCLUSION = re.compile(
    r"\b(?:answer|therefore|thus|hence|so|result|total|final(?:ly)?|conclusion|altogether|in all|correct"
    r"|overall|sum|gives?|equals?|comes? to|is left|are left|remain(?:s|ing)?)\b", re.IGNORECASE)
# a sentence that asks or supposes ("Determine if the answer is 2", "If the total is 12, ...") states no result
_HYPOTHETICAL = re.compile(r"\b(?:if|whether)\b", re.IGNORECASE)
_EQUALS = re.compile(r"(?<![<>=!])=(?!=)")
_OPERATOR = re.compile(r"\d\s*[-+*/×x÷^]\s*[\d(]|\\(?:times|cdot|div|frac)|\(|\bof\b", re.IGNORECASE)
# after a right-hand-side number: another operator and operand means the side is an expression, not a result
_MORE_TERMS = re.compile(r"\s*[-+*/×÷^]\s*[\d(]")
# sentence ends: a full stop not inside a number, "!", "?", or a line break
_SENTENCE_END = re.compile(r"(?<!\d)\.(?!\d)|[!?\n]")
# clause ends inside a sentence that can turn from a quoted cue to the model's own work ("..., but 24 + 6 = 30")
_CLAUSE_END = re.compile(r"(?<!\d)\.(?!\d)|[!?\n;]|,\s*(?=(?:but|however|yet|though|although|while)\b)",
                         re.IGNORECASE)


@dataclass(frozen=True)
class EditTarget:
    """A value the CoT states as its own result: ``cot[start:end]``, canonical ``value`` of value kind ``vkind``
    (numeric | choice | choice_text | boolean); ``how``: equation | conclusion | boxed | option."""

    start: int
    end: int
    value: str
    vkind: str
    how: str


def _number_value(m: re.Match) -> str | None:
    return normalize_number(("-" if m.group(1) else "") + m.group(2) + (f"/{m.group(3)}" if m.group(3) else ""))


def sentence_bounds(text: str, pos: int, ends: re.Pattern = _SENTENCE_END) -> tuple[int, int]:
    """[start, end) of the sentence (or line; with ``ends`` another unit) holding character ``pos``."""
    start = 0
    for m in ends.finditer(text, 0, pos):
        start = m.end()
    m = ends.search(text, pos)
    return start, (m.start() if m else len(text))


def label_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of step and list labels (the number of ``Step 4``, of a ``4.`` list item)."""
    spans = [(m.start(1), m.end(1)) for m in _STEP_LABEL.finditer(text)]
    spans += [(m.start(1), m.end(1)) for m in _LIST_LABEL.finditer(text)]
    return spans


# how a CoT refers to the unauthorized-access and metadata cues without the words of CUE_MENTION
# ("the given information" is the question's: not a cue)
_CUE_SOURCE = re.compile(r"\b(?:the system|leaked information|(?:this|the) access)\b", re.IGNORECASE)
# a cue's own wording copied into the CoT: the whole sentence quotes the cue, the part before a ", but" included
# ("The correct answer is 2, but it's up to you to decide whether to use this information.")
_CUE_WORDING = re.compile(r"\b(?:up to you to decide|use this information|(?:your|the) final answer must be"
                          r"|curious what you think)\b", re.IGNORECASE)


def cue_sentence_spans(text: str) -> list[tuple[int, int]]:
    """Spans of the clauses that name a cue (hint, professor, suggested answer, the system, ...): a sentence, or its
    part up to a turn such as ", but" ("The hint says 30, but 24 + 6 = 30": only the first part quotes the cue);
    a sentence that copies a cue's own wording is a quote as a whole."""
    marks = [m.start() for pat in (CUE_MENTION, _CUE_SOURCE) for m in pat.finditer(text)]
    spans = [sentence_bounds(text, pos, _CLAUSE_END) for pos in sorted(marks)]
    return spans + [sentence_bounds(text, m.start()) for m in _CUE_WORDING.finditer(text)]


def question_numbers(question: str) -> set[str]:
    """The numbers a question states (normalised)."""
    q = question.translate(_MINUS)
    return {v for v in (_number_value(m) for m in _NUMBER.finditer(q)) if v is not None}


def _inside(pos: int, spans: Sequence[tuple[int, int]]) -> bool:
    return any(s <= pos < e for s, e in spans)


def _equation_results(text: str) -> list[tuple[int, int, str, bool]]:
    """(start, end, value, computed) of every equation's right-hand side that is a single number; ``computed``:
    the equation's left side has an operator (``3 + 4 = 7``), not a bare name (``Total = 7``)."""
    out = []
    for line_m in re.finditer(r"[^\n]+", text):
        line, off = line_m.group(0), line_m.start()
        eqs = list(_EQUALS.finditer(line))
        if not eqs:
            continue
        last = eqs[-1]
        rhs = line[last.end():]
        m = re.match(r"[\s$\\(]*", rhs)
        num = _NUMBER.match(rhs, m.end())
        if num is None or _MORE_TERMS.match(rhs, num.end()):
            continue
        val = _number_value(num)
        if val is None:
            continue
        lhs = line[:last.start()]
        computed = len(eqs) > 1 or _OPERATOR.search(lhs) is not None
        out.append((off + last.end() + num.start(), off + last.end() + num.end(), val, computed))
    return out


def _boxed_results(text: str) -> list[tuple[int, int, str]]:
    out = []
    for m in _BOXED.finditer(text):
        inner = boxed_contents(text[m.start():])
        if inner is None:
            continue
        num = _NUMBER.search(inner.translate(_MINUS))
        if num is not None and (val := _number_value(num)) is not None:
            out.append((m.end() + num.start(), m.end() + num.end(), val))
    return out


def _conclusion_numbers(text: str) -> list[tuple[int, int, str]]:
    """The last number of each sentence that reads as a conclusion (it carries a conclusion word before it)."""
    out = []
    for num in _NUMBER.finditer(text):
        s, _ = sentence_bounds(text, num.start())
        before = text[s:num.start()]
        in_expression = (_MORE_TERMS.match(text, num.end()) or re.match(r"\s*=", text[num.end():])
                         or re.search(r"[-+*/×÷^]\s*$", before))  # an operand, not a stated result
        hypothetical = _HYPOTHETICAL.search(before)  # "Determine if the correct answer is 2": a plan, not a result
        if _CONCLUSION.search(before) and not in_expression and not hypothetical \
                and (val := _number_value(num)) is not None:
            out.append((num.start(), num.end(), val))
    return out


def _numeric_candidates(text: str, question: str) -> tuple[list[EditTarget], list[str]]:
    """The CoT's own stated results, last first, and why each other stated value is not one."""
    labels, cue_spans = label_spans(text), cue_sentence_spans(text)
    computed = {v for *_, v, c in _equation_results(text) if c}
    premises = question_numbers(question)
    cands: list[EditTarget] = [EditTarget(s, e, v, "numeric", "equation") for s, e, v, _ in _equation_results(text)]
    cands += [EditTarget(s, e, v, "numeric", "boxed") for s, e, v in _boxed_results(text)]
    cands += [EditTarget(s, e, v, "numeric", "conclusion") for s, e, v in _conclusion_numbers(text)]
    own, why = [], []
    for t in sorted(cands, key=lambda t: t.start, reverse=True):
        if any(s <= t.start < e for s, e in labels):
            why.append("step label")
        elif _inside(t.start, cue_spans):
            why.append("quoted from the cue")
        elif t.value in premises and t.value not in computed:
            why.append("copied from the question")
        else:
            own.append(t)
    return own, why


def _numeric_target(text: str, question: str) -> EditTarget | str:
    own, why = _numeric_candidates(text, question)
    if own:
        return own[0]
    if not why:
        return "no equation or conclusion sentence states a result"
    return "the only stated values are " + ", ".join(dict.fromkeys(why))


def restatement_spans(cot: str, target: EditTarget, question: str = "", labels: Sequence[str] | None = None,
                      choices: Sequence[tuple[str, str]] | None = None) -> list[tuple[int, int]]:
    """Where the CoT states the target's value, the spans the CoT edit replaces together: from the CoT's first
    statement of that value as its own result (an equation's result, a conclusion, a box) on, every number of that
    value (a later sentence restating it, a sentence naming the cue that repeats it; a negative value also by its
    magnitude: "late by 12 minutes" after "= -12"), never a step or list label.
    An option (``choices``: the item's options) is restated by its label or its text: "Answer: (B) son" is one
    statement in two mentions, and the edit replaces both, from the option's first mention of the CoT's own on
    (never on an option line or in a cue sentence). A truth value is its last mention."""
    if target.vkind in ("choice", "choice_text"):
        return _option_restatements(cot.translate(_MINUS), target, labels, choices)
    if target.vkind != "numeric":
        return [(target.start, target.end)]
    text = cot.translate(_MINUS)
    own, _ = _numeric_candidates(text, question)
    first = min([t.start for t in own if t.value == target.value] + [target.start])
    labels = label_spans(text)
    # a negative result is also restated by its magnitude ("30 - 42 = -12 ... they are late by 12 minutes")
    values = {target.value, target.value[1:]} if target.value.startswith("-") else {target.value}
    spans = {(m.start(), m.end()) for m in _NUMBER.finditer(text)
             if m.start() >= first and not _inside(m.start(), labels) and _number_value(m) in values}
    return sorted(spans | {(target.start, target.end)})


def _option_restatements(text: str, target: EditTarget, labels: Sequence[str] | None,
                          choices: Sequence[tuple[str, str]] | None) -> list[tuple[int, int]]:
    labs = labels or ([lab for lab, _ in choices] if choices else DEFAULT_LABELS)
    cue_spans, option_lines = cue_sentence_spans(text), option_line_starts(text)
    own = [(s, e) for s, e, lab, _ in _choice_mentions(text, labs, choices)
           if lab == target.value and text.rfind("\n", 0, s) + 1 not in option_lines and not _inside(s, cue_spans)]
    first = min([s for s, _ in own] + [target.start])
    return sorted({sp for sp in own if sp[0] >= first} | {(target.start, target.end)})


def option_line_starts(text: str) -> set[int]:
    """The start of every line that lists an option ("(A) plausible: ..."): nothing on such a line is a result."""
    return {text.rfind("\n", 0, m.start(1)) + 1 for m in _OPTION_LINE.finditer(text)}


def on_option_line(text: str, pos: int) -> bool:
    """Whether ``text[pos]`` lies on a line that lists an option."""
    return text.rfind("\n", 0, pos) + 1 in option_line_starts(text)


def _choice_mentions(text: str, labels: Sequence[str], choices: Sequence[tuple[str, str]] | None):
    """(start, end, label, vkind) of every option the text states, by label or by text."""
    upper = {lab.upper(): lab for lab in labels}
    alt = "|".join(re.escape(lab) for lab in sorted(upper, key=len, reverse=True))
    out = []
    for m in re.finditer(rf"(?<![A-Za-z0-9_'])({alt})(?![A-Za-z0-9_'])", text):
        after = text[m.end():]
        if m.group(1) in ("A", "I") and re.match(r"\s+[a-z]", after) and not _EXPLAINS.match(after):
            continue
        out.append((m.start(1), m.end(1), upper[m.group(1)], "choice"))
    for lab, txt in choices or ():
        t = txt.strip().rstrip(".")
        if len(t) >= 2:
            out += [(m.start(), m.end(), lab, "choice_text")
                    for m in re.finditer(rf"(?<![\w-]){re.escape(t)}(?![\w-])", text, re.IGNORECASE)]
    # an option text inside a longer one ("plausible" in "implausible") is not a statement of its own
    return [c for c in out if not any(o is not c and o[0] <= c[0] and c[1] <= o[1] and (o[1] - o[0]) > (c[1] - c[0])
                                      for o in out)]


def _choice_target(text: str, labels: Sequence[str], choices: Sequence[tuple[str, str]] | None) -> EditTarget | str:
    cue_spans = cue_sentence_spans(text)
    option_lines = option_line_starts(text)
    mentions = sorted(_choice_mentions(text, labels, choices), reverse=True)
    if not mentions:
        return "the CoT states no option"
    why = []
    for s, e, lab, vkind in mentions:
        if text.rfind("\n", 0, s) + 1 in option_lines:
            why.append("an option list copied from the question")
        elif _inside(s, cue_spans):
            why.append("quoted from the cue")
        else:
            return EditTarget(s, e, lab, vkind, "option")
    return "the only stated options are " + ", ".join(dict.fromkeys(why))


def _boolean_target(text: str) -> EditTarget | str:
    cue_spans = cue_sentence_spans(text)
    found = [m for m in re.finditer(r"(?<![\w])(true|false|yes|no)(?![\w])", text, re.IGNORECASE)
             if not _inside(m.start(), cue_spans)]
    if not found:
        return "the CoT states no truth value of its own"
    m = found[-1]
    return EditTarget(m.start(1), m.end(1), "True" if m.group(1).lower() in ("true", "yes") else "False",
                      "boolean", "conclusion")


def result_span(cot: str, kind: str, *, question: str = "", labels: Sequence[str] | None = None,
                choices: Sequence[tuple[str, str]] | None = None) -> EditTarget | str:
    """The CoT's own stated result (see the module docstring), or why it has none (a short reason)."""
    text = cot.translate(_MINUS)  # one character each: offsets stay those of ``cot``
    if kind in ("numeric", "free"):
        return _numeric_target(text, question)
    if kind == "choice":
        return _choice_target(text, labels or ([lab for lab, _ in choices] if choices else DEFAULT_LABELS),
                              choices)
    if kind == "boolean":
        return _boolean_target(text)
    return f"no edit target for answer kind {kind!r}"


def computed_values(text: str) -> set[str]:
    """Values a text computes: right-hand sides of its equations with an operator on the left."""
    return {v for *_, v, computed in _equation_results(text.translate(_MINUS)) if computed}


def intermediate_spans(cot: str, before: int) -> list[EditTarget]:
    """Computed values the CoT states before character ``before``: right-hand sides of equations with an operator
    on their left (``3 + 4 = 7``), outside step labels and cue sentences; the "adding mistakes" targets."""
    text = cot.translate(_MINUS)
    labels, cue_spans = label_spans(text), cue_sentence_spans(text)
    return [EditTarget(s, e, v, "numeric", "equation") for s, e, v, computed in _equation_results(text)
            if computed and e <= before and not _inside(s, labels) and not _inside(s, cue_spans)]


__all__ = ["EditTarget", "computed_values", "cue_sentence_spans", "intermediate_spans", "label_spans",
           "on_option_line", "option_line_starts", "question_numbers", "restatement_spans", "result_span",
           "sentence_bounds"]
