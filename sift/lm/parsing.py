"""Robust final-answer parsing for free-form LM output.

Only the **last answer line** counts: the last line that carries an answer marker (``Answer:``,
``answer is`` — any case, markdown bold allowed — or a LaTeX ``\\boxed{...}``). Earlier lines of the CoT
never leak into the answer, and on the answer line only the value right after the last marker is read:

* ``numeric``: the first number after the marker (``1,234`` → ``1234``, ``-3.50`` → ``-3.5``, ``3/4`` and
  ``\\frac{3}{4}`` → ``3/4``); if that text is an equation (``5 - 3 = 2``), the part after its last ``=``.
* ``choice``: an option letter (A–E, or the labels given) as a standalone token or in parentheses; never a
  capital letter inside a word, and never the article "A" in "A train ..." unless it stands alone. With
  ``choices`` given, an answer that spells an option's text maps to its label.
* ``boolean``: the first true/false/yes/no word → ``"True"`` / ``"False"``.
* ``free``: the stripped text (markdown and a trailing full stop removed).

Everything returns ``None`` when there is no answer line or nothing parsable on it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction

from sift.errors import SiftError

KINDS = ("numeric", "choice", "boolean", "free")
DEFAULT_LABELS = ("A", "B", "C", "D", "E")

# "Answer:", "answer is", "**Answer:**", "Final answer is:", "answer ="; a word boundary keeps "answers" out.
_MARKER = re.compile(r"\banswer\b(?:\*\*|__)?\s*(?::|=|\bis\b\s*:?)", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_NUMBER = re.compile(
    r"(?<![\w.])(?<!\d[,/])"  # not glued to a word, a decimal point, or the middle of a number
    r"(-\s?)?"  # sign (unicode minus is normalised before matching)
    r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"  # 1,234,567.89 or 1234.5
    r"(?:\s*/\s*(\d+)(?![\d.]))?"  # an optional denominator: 3/4 (units may follow: "5km")
)
_BOOL = re.compile(r"(?<![\w])(true|false|yes|no)(?![\w])", re.IGNORECASE)
# after an option letter these words explain it ("A because ..."); other lower-case words make "A" an article
_EXPLAINS = re.compile(r"\s+(?:because|since|as|is|was|which|for|and|or|so|it)\b")
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-"})


def boxed_contents(line: str) -> str | None:
    """The content of the last ``\\boxed{...}`` on a line (balanced braces), or None."""
    found = None
    for m in _BOXED.finditer(line):
        depth, i = 1, m.end()
        while i < len(line) and depth:
            depth += {"{": 1, "}": -1}.get(line[i], 0)
            i += 1
        found = line[m.end():i - 1] if depth == 0 else line[m.end():]
    return found


def _last_answer_line(lines: list[str]) -> int | None:
    for i in range(len(lines) - 1, -1, -1):
        if _MARKER.search(lines[i]) or _BOXED.search(lines[i]):
            return i
    return None


def answer_line_start(text: str) -> int | None:
    """Character offset where the last answer line starts (the CoT is the text before it), or None."""
    lines = text.splitlines(keepends=True)
    i = _last_answer_line(lines)
    return None if i is None else sum(len(ln) for ln in lines[:i])


def answer_segment(text: str) -> str | None:
    """The text holding the final answer: after the last marker on the last answer line (None if none)."""
    if not text:
        return None
    lines = text.splitlines()
    i = _last_answer_line(lines)
    if i is not None:
        line = lines[i]
        boxed = boxed_contents(line)
        marks = list(_MARKER.finditer(line))
        if boxed is not None:
            return boxed
        seg = line[marks[-1].end():]
        if not re.sub(r"[\s*_$:.\\]", "", seg):  # "Answer:" alone: the value is on the next non-empty line
            rest = [ln for ln in lines[i + 1:] if ln.strip()]
            seg = rest[0] if rest else seg
        return seg
    return None


def normalize_number(s: str) -> str | None:
    """Canonical text of a number: no commas or plus sign, ``12.0`` → ``12``, fractions as ``a/b``."""
    s = s.translate(_MINUS).replace(",", "").replace(" ", "").lstrip("+")
    if not s:
        return None
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            num_f, den_f = Fraction(num), Fraction(den)
            if den_f == 0:
                return None
            value = num_f / den_f
            if value.denominator == 1:
                return str(value.numerator)
            if "." in s:  # 1.5/2: keep as a decimal
                return normalize_number(str(float(value)))
            neg = (num.startswith("-")) != (den.startswith("-"))
            return f"{'-' if neg else ''}{abs(int(num_f))}/{abs(int(den_f))}"
        value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    if value.denominator == 1:
        return str(value.numerator)
    text = s.lstrip("-").rstrip("0").rstrip(".")
    return ("-" if value < 0 else "") + (text if not text.startswith(".") else "0" + text)


def first_number(text: str) -> str | None:
    """The first number in ``text`` (normalised), reading LaTeX fractions as ``a/b``."""
    text = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", text.translate(_MINUS))
    m = _NUMBER.search(text)
    if m is None:
        return None
    sign = "-" if m.group(1) else ""
    body = m.group(2) + (f"/{m.group(3)}" if m.group(3) else "")
    return normalize_number(sign + body)


def _parse_numeric(seg: str) -> str | None:
    if "=" in seg:  # "5 - 3 = 2": the result, not the first operand
        tail = seg.rsplit("=", 1)[1]
        got = first_number(tail)
        if got is not None:
            return got
    return first_number(seg)


def _parse_choice(seg: str, labels: Sequence[str], choices: Sequence[tuple[str, str]] | None) -> str | None:
    upper = {lab.upper(): lab for lab in labels}
    alt = "|".join(re.escape(lab) for lab in sorted(upper, key=len, reverse=True))
    # 1. in parentheses or brackets, any case: "(B)", "[c]"
    m = re.search(rf"[(\[]\s*({alt})\s*[)\]]", seg, re.IGNORECASE)
    if m:
        return upper[m.group(1).upper()]
    # 2. a standalone capital: not inside a word, not "A" used as an article before a lower-case word
    for m in re.finditer(rf"(?<![A-Za-z0-9_'])({alt})(?![A-Za-z0-9_'])", seg):
        after = seg[m.end():]
        if m.group(1) in ("A", "I") and re.match(r"\s+[a-z]", after) and not _EXPLAINS.match(after):
            continue
        return upper[m.group(1)]
    # 3. the text of an option
    if choices:
        clean = re.sub(r"[^\w\s]", "", seg).strip().lower()
        for lab, txt in choices:
            if clean and clean == re.sub(r"[^\w\s]", "", txt).strip().lower():
                return lab
    return None


def _parse_boolean(seg: str) -> str | None:
    m = _BOOL.search(seg)
    if m is None:
        return None
    return "True" if m.group(1).lower() in ("true", "yes") else "False"


def _parse_free(seg: str) -> str | None:
    s, prev = seg, None
    while s != prev:  # markdown, math delimiters and a final full stop, in any nesting
        prev = s
        s = s.strip().strip("*_$`").rstrip(".")
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s).strip()
    return s or None


def parse_value(segment: str, kind: str, choices: Sequence[tuple[str, str]] | None = None,
                labels: Sequence[str] | None = None) -> str | None:
    """Parse an answer value of ``kind`` from an answer segment (no marker needed)."""
    if kind == "numeric":
        return _parse_numeric(segment)
    if kind == "choice":
        labs = labels or ([lab for lab, _ in choices] if choices else DEFAULT_LABELS)
        return _parse_choice(segment, labs, choices)
    if kind == "boolean":
        return _parse_boolean(segment)
    if kind == "free":
        return _parse_free(segment)
    raise SiftError(f"unknown answer kind {kind!r}; expected one of {', '.join(KINDS)}")


def parse_answer(text: str, kind: str, choices: Sequence[tuple[str, str]] | None = None,
                 labels: Sequence[str] | None = None) -> str | None:
    """The final answer in ``text`` (see the module docstring), or None without an answer line."""
    if kind not in KINDS:
        raise SiftError(f"unknown answer kind {kind!r}; expected one of {', '.join(KINDS)}")
    seg = answer_segment(text)
    if seg is None:
        return None
    return parse_value(seg, kind, choices, labels)


def canonical_answer(value: str, kind: str, choices: Sequence[tuple[str, str]] | None = None) -> str | None:
    """A gold answer in the form :func:`parse_answer` returns, so the two compare with ``==``."""
    value = str(value).strip()
    if kind == "numeric":
        return normalize_number(value) or _parse_numeric(value)
    if kind == "choice":
        labs = [lab for lab, _ in choices] if choices else list(DEFAULT_LABELS)
        if value.upper() in {lab.upper() for lab in labs}:
            return next(lab for lab in labs if lab.upper() == value.upper())
        return _parse_choice(value, labs, choices)
    if kind == "boolean":
        return _parse_boolean(value)
    return _parse_free(value)


def last_option_text(text: str, choices: Sequence[tuple[str, str]]) -> tuple[int, int, str] | None:
    """The last place a CoT states an option by its text (case-insensitive, whole words): (start, end, label)."""
    found = None
    for lab, txt in choices:
        t = txt.strip().rstrip(".")
        if len(t) < 2:
            continue
        for m in re.finditer(rf"(?<![\w]){re.escape(t)}(?![\w])", text, re.IGNORECASE):
            if found is None or m.start() > found[0]:
                found = (m.start(), m.end(), lab)
    return found


def last_value_span(text: str, kind: str, labels: Sequence[str] | None = None,
                    choices: Sequence[tuple[str, str]] | None = None) -> tuple[int, int, str, str] | None:
    """The last editable value stated in a CoT: ``(start, end, canonical value, value kind)`` or None.

    numeric / free: the last number; choice: the last option label in parentheses or standing alone (not the
    article "A"), or — with ``choices`` given — the last option stated by its text, whichever comes later (value
    kind ``choice_text``, value the option's label); boolean: the last true/false/yes/no word. Used by the
    CoT-edit intervention.
    """
    if kind == "choice" and choices:
        by_label = last_value_span(text, kind, labels or [lab for lab, _ in choices])
        by_text = last_option_text(text.translate(_MINUS), choices)
        if by_text is not None and (by_label is None or by_text[0] > by_label[0]):
            return by_text[0], by_text[1], by_text[2], "choice_text"
        return by_label
    text = text.translate(_MINUS)
    if kind in ("numeric", "free"):
        found = None
        for m in _NUMBER.finditer(text):
            val = normalize_number(("-" if m.group(1) else "") + m.group(2) + (f"/{m.group(3)}" if m.group(3) else ""))
            if val is not None:
                found = (m.start(), m.end(), val, "numeric")
        return found
    if kind == "choice":
        labs = {lab.upper(): lab for lab in (labels or DEFAULT_LABELS)}
        alt = "|".join(re.escape(lab) for lab in sorted(labs, key=len, reverse=True))
        found = None
        for m in re.finditer(rf"(?<![A-Za-z0-9_'])({alt})(?![A-Za-z0-9_'])", text):
            if m.group(1) in ("A", "I") and re.match(r"\s+[a-z]", text[m.end():]) \
                    and not _EXPLAINS.match(text[m.end():]):
                continue
            found = (m.start(1), m.end(1), labs[m.group(1)], "choice")
        return found
    if kind == "boolean":
        found = None
        for m in _BOOL.finditer(text):
            found = (m.start(1), m.end(1), "True" if m.group(1).lower() in ("true", "yes") else "False", "boolean")
        return found
    raise SiftError(f"unknown answer kind {kind!r}; expected one of {', '.join(KINDS)}")


def infer_kind(answer: str) -> str:
    """numeric / boolean / free from a gold answer's text (choice needs options, so it is never inferred)."""
    a = str(answer).strip()
    if re.fullmatch(r"[-+\u2212]?\s?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?(\s*/\s*\d+)?", a):
        return "numeric"
    if a.lower() in ("true", "false", "yes", "no"):
        return "boolean"
    return "free"


__all__ = ["KINDS", "DEFAULT_LABELS", "answer_line_start", "answer_segment", "boxed_contents", "canonical_answer",
           "first_number", "infer_kind", "last_value_span", "normalize_number", "parse_answer", "parse_value"]
