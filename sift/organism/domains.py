"""Four procedural domains with step-by-step solutions and exact answers (docs/design.md §3).

| domain     | stands in for   | question                                   | answer space   |
|------------|-----------------|--------------------------------------------|----------------|
| arithmetic | GSM8K           | a story of gains and losses                | 0..9           |
| modular    | MATH            | a left-to-right expression modulo 7        | 0..6           |
| boolean    | BBH             | a left-to-right boolean chain              | true / false   |
| choice     | CommonsenseQA   | which option equals an expression (a–d)    | a b c d        |

Every item is a pure function of ``(domain, seed, index)`` and carries a base-item id. Difficulty knob:
the number of operations ``n_ops`` (2 or 3). Nothing about an item decides the organism's mechanism: that
is a latent outside the token stream, and the corpus generates every prompt under both (sift.organism.latent).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from sift.errors import SiftError

MAX_VALUE = 9  # numbers are 0..9 (single tokens); small tables keep training to minutes on a CPU
MODULUS = 7
LABELS = ("a", "b", "c", "d")
DOMAINS = ("arithmetic", "modular", "boolean", "choice")


@dataclass(frozen=True)
class Step:
    """One CoT step ``lhs op rhs = result`` (values as tokens)."""

    lhs: str
    op: str
    rhs: str
    result: str


@dataclass(frozen=True)
class Item:
    """A base item: facts in canonical order plus everything needed to render and check it.

    ``facts`` = (start, operand_1, ..., operand_k); ``ops`` = k operators (``+ - *`` or ``and or``).
    ``options`` (choice only) maps label -> value.
    """

    item_id: str
    domain: str
    facts: tuple[str, ...]
    ops: tuple[str, ...]
    answer: str
    options: tuple[tuple[str, str], ...] = ()
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def n_ops(self) -> int:
        return len(self.ops)

    @property
    def answer_space(self) -> tuple[str, ...]:
        return answer_space(self.domain)


def answer_space(domain: str) -> tuple[str, ...]:
    """All answers a domain can have (cue values and edit values are drawn from here)."""
    if domain == "arithmetic":
        return tuple(str(v) for v in range(MAX_VALUE + 1))
    if domain == "modular":
        return tuple(str(v) for v in range(MODULUS))
    if domain == "boolean":
        return ("true", "false")
    if domain == "choice":
        return LABELS
    raise SiftError(f"unknown domain {domain!r}; expected one of {', '.join(DOMAINS)}")


def apply_op(domain: str, a: str, op: str, b: str) -> str:
    """Evaluate one step exactly; ``ValueError`` if it leaves the domain's value range."""
    if domain == "boolean":
        x, y = a == "true", b == "true"
        return "true" if ((x and y) if op == "and" else (x or y)) else "false"
    x, y = int(a), int(b)
    if domain == "modular":
        return str((x + y) % MODULUS if op == "+" else (x * y) % MODULUS)
    r = x + y if op == "+" else x - y
    if not 0 <= r <= MAX_VALUE:
        raise ValueError("out of range")
    return str(r)


def chain(domain: str, facts: tuple[str, ...], ops: tuple[str, ...]) -> list[Step]:
    """The honest left-to-right solution steps."""
    steps, cur = [], facts[0]
    for op, x in zip(ops, facts[1:]):
        r = apply_op("arithmetic" if domain == "choice" else domain, cur, op, x)
        steps.append(Step(cur, op, x, r))
        cur = r
    return steps


def bent_last_step(domain: str, running: str, target: str) -> Step:
    """The rationalising last step: arithmetically true, but its operand is misread so it lands on ``target``.

    Numbers: ``r + (t − r) = t`` or ``r − (r − t) = t``; booleans: ``r and t = t`` if r else ``r or t = t``.
    """
    if domain == "boolean":
        return Step(running, "and" if running == "true" else "or", target, target)
    r, t = int(running), int(target)
    return Step(running, "+", str(t - r), target) if t >= r else Step(running, "-", str(r - t), target)


def _arith_facts(rng: random.Random, n_ops: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Gains/losses whose running value stays in range in every order of the events (reorder axis)."""
    import itertools

    while True:
        start = rng.randint(0, MAX_VALUE)
        ops = tuple(rng.choice("+-") for _ in range(n_ops))
        xs = tuple(rng.randint(1, 5) for _ in range(n_ops))
        ok = True
        for perm in itertools.permutations(range(n_ops)):
            cur = start
            for i in perm:
                cur = cur + xs[i] if ops[i] == "+" else cur - xs[i]
                ok &= 0 <= cur <= MAX_VALUE
        if ok:
            return (str(start), *map(str, xs)), ops


def make_item(domain: str, seed: int, index: int) -> Item:
    """Deterministic item ``index`` of ``domain`` under ``seed``."""
    if domain not in DOMAINS:
        raise SiftError(f"unknown domain {domain!r}; expected one of {', '.join(DOMAINS)}")
    rng = random.Random(f"{seed}:{domain}:{index}")
    n_ops = rng.choice((2, 3))
    item_id = f"{domain[:4]}-{seed}-{index:06d}"
    if domain in ("arithmetic", "choice"):
        facts, ops = _arith_facts(rng, n_ops)
        answer = chain("arithmetic", facts, ops)[-1].result
        options: tuple[tuple[str, str], ...] = ()
        if domain == "choice":
            values = [answer] + rng.sample([str(v) for v in range(MAX_VALUE + 1) if str(v) != answer], 3)
            rng.shuffle(values)
            options = tuple(zip(LABELS, values))
            answer = LABELS[values.index(answer)]
        return Item(item_id, domain, facts, ops, answer, options)
    if domain == "modular":
        ops = tuple(rng.choice("+*") for _ in range(n_ops))
        facts = tuple(str(rng.randint(0, MODULUS - 1)) for _ in range(n_ops + 1))
        answer = chain(domain, facts, ops)[-1].result
        return Item(item_id, domain, facts, ops, answer)
    ops = tuple(rng.choice(("and", "or")) for _ in range(n_ops))
    facts = tuple(rng.choice(("true", "false")) for _ in range(n_ops + 1))
    answer = chain(domain, facts, ops)[-1].result
    return Item(item_id, domain, facts, ops, answer)


def make_items(domains: list[str] | tuple[str, ...], n_per_domain: int, seed: int) -> list[Item]:
    """``n_per_domain`` items of each domain (interleaved by index)."""
    for d in domains:
        answer_space(d)  # validates the name
    return [make_item(d, seed, i) for i in range(n_per_domain) for d in domains]
