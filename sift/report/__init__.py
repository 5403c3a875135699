"""The report: sections (Markdown + figures + numbers) written as ``report.md`` and ``results.json``.

Every analysis returns a :class:`Section`; :func:`write_report` assembles them in order. ``results.json``
holds every number the report shows (``Section.results``, keyed by ``Section.key``) plus provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sift import __version__
from sift.atomic import write_json, write_text


@dataclass
class Section:
    """One report section. ``figures`` are paths relative to the report folder; ``results`` is JSON-able."""

    key: str
    title: str
    markdown: str
    figures: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub Markdown table; floats are shown with 3 decimals."""

    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def render(sections: list[Section], title: str = "sift report", preamble: str = "") -> str:
    """The Markdown text of a report."""
    parts = [f"# {title}", ""]
    if preamble:
        parts += [preamble, ""]
    for s in sections:
        parts += [f"## {s.title}", "", s.markdown.rstrip(), ""]
        parts += [f"![{s.key}]({fig})" for fig in s.figures]
        if s.figures:
            parts.append("")
    return "\n".join(parts)


def write_report(out_dir: str | Path, sections: list[Section], meta: dict[str, Any] | None = None,
                 title: str = "sift report", preamble: str = "") -> tuple[Path, Path]:
    """Atomically write ``report.md`` and ``results.json`` (with ``meta`` and the sift version) to ``out_dir``."""
    out = Path(out_dir)
    keys = [s.key for s in sections]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate report section keys: {sorted(k for k in set(keys) if keys.count(k) > 1)}")
    results = {"meta": {"sift_version": __version__, **(meta or {})}, **{s.key: s.results for s in sections}}
    write_json(out / "results.json", results)
    write_text(out / "report.md", render(sections, title, preamble))
    return out / "report.md", out / "results.json"
