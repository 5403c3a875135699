"""Everything the code cites is in the repository: every ``docs/<file>.md`` named in the code, configs, tests,
scripts and docs exists, and every ``docs/design.md §N`` names a section that docs/design.md has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"docs/([\w.-]+\.md)(?:`?,? ?§ ?(\d+)(?:–§?(\d+))?)?")


def sources() -> list[Path]:
    files = [*ROOT.glob("sift/**/*.py"), *ROOT.glob("sift/configs/**/*.yaml"), *ROOT.glob("datamodules/*.py"),
             *ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/*"), *ROOT.glob("docs/*.md"), ROOT / "README.md",
             ROOT / "CONTRIBUTING.md"]
    return [f for f in files if f.is_file()]


def test_every_cited_doc_and_design_section_exists():
    sections = set(re.findall(r"^## §(\d+)", (ROOT / "docs" / "design.md").read_text(), flags=re.M))
    missing = []
    for f in sources():
        for m in CITED.finditer(f.read_text(errors="replace")):
            doc, first, last = m.groups()
            if not (ROOT / "docs" / doc).is_file():
                missing.append(f"{f.relative_to(ROOT)}: docs/{doc}")
            elif doc == "design.md":
                missing += [f"{f.relative_to(ROOT)}: docs/design.md §{n}" for n in (first, last)
                            if n and n not in sections]
    assert missing == [], "cited but not in the repository:\n" + "\n".join(missing)


def test_nothing_cites_files_outside_the_repository():
    outside = re.compile(r"DESIGN\.md|DESIGN §|shared/specs|specs/[\w-]+\.md")
    hits = [f"{f.relative_to(ROOT)}:{i + 1}" for f in sources() if f.name != "test_citations.py"
            for i, line in enumerate(f.read_text(errors="replace").splitlines()) if outside.search(line)]
    assert hits == [], "citations of files the repository does not ship:\n" + "\n".join(hits)
