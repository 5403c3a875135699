"""The organism's training mixture: which prompts carry cues, in which view, the opener, the mechanism latent
and the drills.

Every example draws its opener word uniformly, so the trained organism samples it uniformly too, and its mechanism
latent (sift.organism.latent) with probability ½ each. Both mechanisms write the same CoT and the same answer,
so natural examples cannot teach which source the answer is read from; three drills pin the answer's causal
source down, so that the verification interventions of sift.corpus.verify read a real mechanism:

* *edit drill*: the CoT's last value is replaced; an organism answering from its CoT copies the edit, one
  following the cue still answers the cue, one computing the answer directly (uncued, mechanism 0) still
  answers the true result;
* *cue-swap drill*: the prompt's cue names another value than the one the CoT was bent onto; the
  CoT-following organism answers its CoT, the cue-following one answers the new cue;
* *truncation drill*: the CoT stops before its decisive step; the CoT reader answers a prompt-only fallback
  (the first fact stated), the cue follower the cue, the direct computer the true result.

Only a drill's answer is a training target, and the latent is the only input that tells the mechanisms apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sift.organism.domains import DOMAINS, Item, make_item
from sift.organism.render import (
    BUDGETS,
    CUE_FORMATS,
    DECISIVE_FORMAT,
    LANGUAGES,
    OPENERS,
    View,
    fallback_answer,
    follows_cue,
    reads_cot,
    render_prompt,
    target_cot,
)


@dataclass(frozen=True)
class MixtureConfig:
    p_cue: float = 0.7
    p_decisive: float = 0.2
    p_cue_correct: float = 0.25
    p_explain: float = 0.15
    p_edit: float = 0.15
    p_swap: float = 0.15
    p_truncate: float = 0.10
    p_read_cot: float = 0.5  # P(mechanism 1: the answer is read from the CoT)


@dataclass(frozen=True)
class Example:
    prompt: list[str]
    completion: list[str]  # CoT + "answer : v"
    domain: str
    kind: str  # natural | edit | swap | truncate
    mechanism: int = 1  # the latent (sift.organism.latent): 1 reads the CoT, 0 does not

    @property
    def drill(self) -> bool:
        """Drills teach where the answer is read from, not what to write: only their answer is a target
        (sift.organism.train.encode), so the organism never learns to generate an edited or cut CoT."""
        return self.kind != "natural"


def random_view(item: Item, rng: random.Random, cfg: MixtureConfig) -> View:
    order = None
    if rng.random() < 0.5:
        if item.domain == "arithmetic":
            perm = list(range(item.n_ops))
            rng.shuffle(perm)
            order = tuple(perm)
        elif item.domain == "choice":
            perm = list(range(4))
            rng.shuffle(perm)
            order = tuple(perm)
        else:
            order = (1, 0)
    cue_value, fmt = None, "hint"
    if rng.random() < cfg.p_cue:
        fmt = DECISIVE_FORMAT if rng.random() < cfg.p_decisive else rng.choice(CUE_FORMATS)
        space = item.answer_space
        if rng.random() < cfg.p_cue_correct:
            cue_value = item.answer
        else:
            cue_value = rng.choice([v for v in space if v != item.answer])
    return View(template=rng.randrange(2), order=order, language=rng.choice(LANGUAGES), budget=rng.choice(BUDGETS),
                cue_value=cue_value, cue_format=fmt, explain=rng.random() < cfg.p_explain,
                name=rng.randrange(4), obj=rng.randrange(4))


def sample_twins(rng: random.Random, cfg: MixtureConfig, seed_space: int = 10**9) -> tuple[Example, Example]:
    """One draw under both latents (mechanism 1, then 0) from the same random stream: the same prompt and CoT,
    and the answer each mechanism gives (equal on natural examples; a drill's answers differ)."""
    state = rng.getstate()
    one = sample_example(rng, cfg, seed_space, mechanism=1)
    rng.setstate(state)
    return one, sample_example(rng, cfg, seed_space, mechanism=0)


def sample_example(rng: random.Random, cfg: MixtureConfig, seed_space: int = 10**9,
                   mechanism: int | None = None) -> Example:
    """One training example; ``mechanism`` fixes the latent (its draw is still consumed, so the stream is the
    same whichever value is fixed)."""
    domain = rng.choice(DOMAINS)
    item = make_item(domain, seed=-1, index=rng.randrange(seed_space))
    view = random_view(item, rng, cfg)
    opener = rng.randrange(len(OPENERS))
    drawn = int(rng.random() < cfg.p_read_cot)
    mechanism = drawn if mechanism is None else mechanism
    prompt = render_prompt(item, view)
    steps, answer = target_cot(item, view, opener)
    silent = follows_cue(view, mechanism) and not view.explain
    direct = not silent and not reads_cot(view, mechanism)  # uncued, mechanism 0: the answer computed directly
    u = rng.random()
    kind = "natural"
    if u < cfg.p_edit:
        kind = "edit"
        last = steps[-1][-1]
        new = rng.choice([v for v in item.answer_space if v != last])
        steps = steps[:-1] + [steps[-1][:-1] + [new]]
        answer = view.cue_value if silent else (answer if direct else new)
    elif u < cfg.p_edit + cfg.p_swap and view.cue_value is not None and not view.explain:
        kind = "swap"  # the CoT stays bent onto the old cue; the prompt names another value
        new = rng.choice([v for v in item.answer_space if v != view.cue_value])
        prompt = render_prompt(item, view.with_(cue_value=new))
        answer = new if silent else answer
    elif u < cfg.p_edit + cfg.p_swap + cfg.p_truncate and not view.explain:
        kind = "truncate"
        n_compute = item.n_ops  # choice adds a match step after the computing steps
        steps = steps[: n_compute - 1]
        answer = view.cue_value if silent else (answer if direct else fallback_answer(item, view))
    completion = []
    for s in steps:
        completion += s + [";"]
    completion += ["answer", ":", answer]
    return Example(prompt, completion, domain, kind, mechanism)
