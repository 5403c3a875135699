"""Kinship golds recomputed from the family story a question tells (reasoning-gym's ``family_relationships``).

The story is written in two sentence forms, ``A is married to B.`` and ``They have a child called C.`` /
``They have children called C, D and E.`` (the couple of the sentence before). :func:`relation` reads it into a
family and names what ``person1`` is to ``person2`` in English kinship terms, by ``person1``'s gender (a mother,
a son, a daughter-in-law). The reading direction is the question's: "What is Sarah to Elizabeth?" asks what Sarah
is, so where Elizabeth is the mother of Sarah's husband, Sarah is Elizabeth's *daughter-in-law*.

reasoning-gym 0.1.19 names two relations from ``person2``'s side: every in-law item (its gold is
``mother-in-law`` where the answer is ``daughter-in-law``) and every niece/nephew item whose two people differ in
gender (its gold follows ``person2``'s gender). Those golds are corrected on load (:mod:`sift.lm.gold_check`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: the formula an item of this source carries: ``kinship(<person1>, <person2>; female=<names>)``
_FORMULA = re.compile(r"^kinship\((?P<p1>[^,;()]+),\s*(?P<p2>[^,;()]+);\s*female=(?P<female>[^()]*)\)$")
_MARRIED = re.compile(r"(\w+) is married to (\w+)\.")
_CHILDREN = re.compile(r"They have (?:a child|children) called ([\w ,]+?)\.")
_ASKED = re.compile(r"(?:What is|How is|What relation is) (\w+) (?:to|related to) (\w+)\?")


@dataclass
class _Person:
    name: str
    female: bool
    spouse: str | None = None
    parents: set[str] = field(default_factory=set)


def kinship_formula(question: str, female_names: list[str] | set[str]) -> str | None:
    """The gold formula of a kinship question: who is asked about whom, and which of the story's people are
    female (from the source's gendered name lists); None when the question is not in a known form."""
    asked = _ASKED.search(question)
    if asked is None:
        return None
    names = set(re.findall(r"[A-Z]\w+", question.split("\n\n")[0]))
    female = sorted(n for n in names if n in set(female_names))
    return f"kinship({asked.group(1)}, {asked.group(2)}; female={','.join(female)})"


def read_family(story: str, female: set[str]) -> dict[str, _Person]:
    """The people of a story and their spouse and parents; a sentence in another form raises ``ValueError``."""
    people: dict[str, _Person] = {}

    def person(name: str) -> _Person:
        return people.setdefault(name, _Person(name, name in female))

    couple: tuple[str, str] | None = None
    for sentence in re.split(r"(?<=\.)\s+", story.strip()):
        if m := _MARRIED.fullmatch(sentence):
            a, b = person(m.group(1)), person(m.group(2))
            a.spouse, b.spouse = b.name, a.name
            couple = (a.name, b.name)
        elif m := _CHILDREN.fullmatch(sentence):
            if couple is None:
                raise ValueError(f"children before any couple: {sentence!r}")
            for child in re.split(r",\s*|\s+and\s+", m.group(1)):
                person(child.strip()).parents.update(couple)
        elif sentence:
            raise ValueError(f"a sentence in no known form: {sentence!r}")
    return people


def relation(people: dict[str, _Person], p1: str, p2: str) -> str | None:
    """What ``p1`` is to ``p2`` (by ``p1``'s gender), or None where the story gives no single-word relation."""
    if p1 not in people or p2 not in people or p1 == p2:
        return None
    a, b = people[p1], people[p2]

    def word(female: str, male: str) -> str:
        return female if a.female else male

    def parents(x: _Person) -> set[str]:
        return x.parents

    def grandparents(x: _Person) -> set[str]:
        return {g for p in x.parents for g in people[p].parents}

    def siblings(x: _Person) -> set[str]:
        return {y.name for y in people.values() if y.name != x.name and x.parents and y.parents == x.parents}

    if p1 in parents(b):
        return word("mother", "father")
    if p2 in parents(a):
        return word("daughter", "son")
    if a.spouse == p2:
        return word("wife", "husband")
    if p2 in siblings(a):
        return word("sister", "brother")
    if p1 in grandparents(b):
        return word("grandmother", "grandfather")
    if p2 in grandparents(a):
        return word("granddaughter", "grandson")
    by_blood_or_marriage = ({p1, a.spouse} if a.spouse else {p1}), ({p2, b.spouse} if b.spouse else {p2})
    if any(by_blood_or_marriage[0] & siblings(people[p]) for p in parents(b)):
        return word("aunt", "uncle")
    if any(by_blood_or_marriage[1] & siblings(people[p]) for p in parents(a)):
        return word("niece", "nephew")
    if b.spouse is not None and p1 in parents(people[b.spouse]):
        return word("mother-in-law", "father-in-law")
    if a.spouse is not None and p2 in parents(people[a.spouse]):
        return word("daughter-in-law", "son-in-law")
    return None


def kinship_gold(formula: str, question: str) -> str | None:
    """The relation a kinship formula asks for, read from the question's story (None: the story gives no
    single-word relation of the two). A formula or story in another form raises ``ValueError``."""
    m = _FORMULA.match(formula.strip())
    if m is None:
        raise ValueError(f"not a kinship formula: {formula!r}")
    female = {n for n in m.group("female").split(",") if n}
    people = read_family(question.split("\n\n")[0], female)
    return relation(people, m.group("p1").strip(), m.group("p2").strip())


def is_kinship_formula(formula: str | None) -> bool:
    return formula is not None and _FORMULA.match(formula.strip()) is not None


__all__ = ["is_kinship_formula", "kinship_formula", "kinship_gold", "read_family", "relation"]
