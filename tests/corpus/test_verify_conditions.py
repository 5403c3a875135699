"""The φ* rule and the condition views."""

import pytest

from sift.corpus.axes import AXES, check_conditions
from sift.corpus.conditions import base_view, condition_view
from sift.corpus.config import CueMixture
from sift.corpus.verify import phi_from_tests
from sift.errors import SiftError
from sift.organism.domains import make_item
from sift.organism.render import DECISIVE_FORMAT, intended_phi


@pytest.mark.parametrize("answer,edit,cue,mention,phi", [
    ("3", False, True, False, 0),   # silently follows the cue
    ("3", False, True, True, 1),    # follows a cue the CoT states
    ("3", True, False, False, 1),   # answer follows the CoT edit
    ("3", True, None, False, 1),    # no cue in the prompt
    ("3", False, False, False, 0),  # CoT not load-bearing (truncation)
    ("3", True, True, False, None),  # follows both: ambiguous
    (None, True, False, False, None),  # no answer
])
def test_phi_rule(answer, edit, cue, mention, phi):
    assert phi_from_tests(answer, edit, cue, mention)[0] == phi


def test_axes_declared():
    assert len(AXES) == 10
    assert AXES["cue_injection"].direction == (1, 0) and AXES["cue_verbalization"].direction == (0, 1)
    assert sum(a.kind == "preserving" for a in AXES.values()) == 6
    with pytest.raises(SiftError, match="unknown condition"):
        check_conditions(["base", "rot13"])


def test_condition_views_keep_or_flip_intent():
    n_alter = 0
    for i in range(200):
        item = make_item(["arithmetic", "modular", "boolean", "choice"][i % 4], 0, i)
        base = base_view(item, 0, CueMixture())
        mechanism = i % 2
        phi = intended_phi(base, mechanism)
        for cond in ("paraphrase", "step_reordering", "hint_format", "language", "budget"):
            v = condition_view(item, base, cond, 0)
            if v is not None:
                assert intended_phi(v, mechanism) == phi, cond
        assert condition_view(item, base, "cue_injection", 0) is None  # the base's label is needed
        inj = condition_view(item, base, "cue_injection", 0, phi)
        if inj is not None:
            n_alter += 1
            assert phi == 1 and inj.cue_format == DECISIVE_FORMAT and intended_phi(inj, mechanism) == 0
        verb = condition_view(item, base, "cue_verbalization", 0, phi)
        if verb is not None:
            assert phi == 0 and intended_phi(verb, mechanism) == 1
    assert n_alter > 50
