"""The one analysis interface (sift.report.analysis): the main sections, the appendix analyses and the companion
families are Analyses in one kind of Registry, run by what their context has."""

from dataclasses import dataclass

import pytest

from sift.errors import SiftError
from sift.report import Section
from sift.report.analysis import Analysis, Registry, build_all


@dataclass
class Ctx:
    held: tuple

    def has(self, need):
        return need in self.held


class Count(Analysis):
    name, title, order, needs = "count", "Count", 20.0, ("numbers",)

    def compute(self, ctx):
        return {"n": len(ctx.held)}

    def render(self, results, ctx):
        return f"n = {results['n']}"


class First(Analysis):
    name, order = "first", 10.0

    def build(self, ctx):
        return [Section("first", "First", "-")]


def test_order_needs_and_the_default_build():
    reg = Registry("toy analysis")
    reg.register(Count())
    reg.register(First())
    assert [a.name for a in reg.ordered()] == ["first", "count"]  # by order, not registration
    secs = build_all(reg.ordered(), Ctx(("numbers", "x")))
    assert [(s.key, s.markdown, s.results) for s in secs] == [("first", "-", {}), ("count", "n = 2", {"n": 2})]
    assert [s.key for s in build_all(reg.ordered(), Ctx(()))] == ["first"]  # count needs numbers


def test_a_name_is_registered_once():
    reg = Registry("toy analysis")
    reg.register(Count())
    reg.register(Count())  # the same definition again: kept

    class Other(Count):
        pass

    with pytest.raises(SiftError, match="toy analysis 'count' is registered twice"):
        reg.register(Other())
    copy = reg.copy()
    copy.register(First())
    assert "first" in copy and "first" not in reg


def test_the_three_report_parts_share_the_interface():
    from sift.companion.families import FAMILIES, families
    from sift.evaluation.appendix import APPENDIX_ANALYSES
    from sift.evaluation.sections.registry import SECTIONS, registered_sections

    sections, fams = registered_sections(), families()
    for reg in (SECTIONS, APPENDIX_ANALYSES, FAMILIES):
        assert isinstance(reg, Registry) and len(reg) > 0
        assert all(isinstance(a, Analysis) and callable(a.build) and a.needs for a in reg)
    assert [a.name for a in sections][:3] == ["main_table", "ensemble_comparison", "selective_risk"]
    assert [a.name for a in fams] == ["system1", "ice", "edct", "judges", "detector_shap"]
    assert APPENDIX_ANALYSES["mechanism"].needs == ("runs", "pairs", "traces")
