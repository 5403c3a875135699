"""One model's traces of one chunk of base items, for every source: generate, alter, truncate, verify.

The algorithm (:func:`build_chunk`) is written once; a source implements :class:`ChunkSource`:

1. generate the base and preserving views of every item (:meth:`ChunkSource.phase1_jobs`);
2. the **altering** axes start from each base trace's label (:meth:`ChunkSource.altering_view`): the
   organism's construction intent, known as soon as the base is generated, or a real LM's *verified* label
   (``labels_first``: the phase-1 traces are verified before any altering view is chosen);
3. generate the altering views; **causal truncation** cuts the eligible bases' CoTs before their last reasoning
   step and forces the answer (:func:`sift.corpus.verify.truncated`);
4. verify what is not verified yet (:func:`sift.corpus.verify.verify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sift.corpus.axes import generated_axes
from sift.corpus.verify import SourceVerifier, truncated, verify

#: the altering axis whose traces are cut from the base trace instead of generated
TRUNCATION = "causal_truncation"


class ChunkSource(Protocol):
    """What a source gives the one chunk builder."""

    verifier: SourceVerifier
    #: True: altering axes start from verified labels (phase 1 is verified first); False: from the intent
    labels_first: bool

    def phase1_jobs(self, items: Sequence[Any], conditions: Sequence[str]) -> list[Any]:
        """The base and preserving generation jobs of ``items`` (a source's own job type)."""
        ...

    def view_of(self, job: Any) -> Any:
        ...

    def generate(self, jobs: Sequence[Any], desc: str) -> list[dict]:
        """The trace records of ``jobs``, in order."""
        ...

    def bases(self, records: Sequence[dict], views: Sequence[Any],
              items: Sequence[Any]) -> list[tuple[dict, Any, Any]]:
        """(base record, item, base view) of the generated base traces, in the order altering jobs are made."""
        ...

    def altering_view(self, condition: str, base: dict, item: Any, view: Any) -> Any | None:
        """The view of an altering axis on this base (None: the axis does not apply to its label)."""
        ...

    def altering_job(self, condition: str, base: dict, item: Any, view: Any) -> Any:
        ...

    def truncation_record(self, base: dict, item: Any, view: Any, new_ids: list[int]) -> dict:
        """The causal-truncation trace of ``base`` with the cut CoT, forced answer and re-decoded answer."""
        ...


def build_chunk(cs: ChunkSource, items: Sequence[Any], conditions: Sequence[str]) -> list[dict]:
    """Every condition of ``items`` (of ``conditions``) on one model, verified (module docstring)."""
    item_map = {it.item_id: it for it in items}
    jobs = cs.phase1_jobs(items, conditions)
    records = cs.generate(jobs, "generate")
    views = [cs.view_of(j) for j in jobs]
    if cs.labels_first:
        verify(cs.verifier, records, views, item_map)
    bases = cs.bases(records, views, items)
    alter = [cs.altering_job(cond, b, it, v2) for b, it, v in bases for cond in generated_axes(("altering",))
             if cond in conditions and (v2 := cs.altering_view(cond, b, it, v)) is not None]
    more = cs.generate(alter, "altering") if alter else []
    more_views = [cs.view_of(j) for j in alter]
    if TRUNCATION in conditions:
        eligible = [(b, it, v) for b, it, v in bases if cs.altering_view(TRUNCATION, b, it, v) is not None]
        for b, it, v, new_ids in truncated(cs.verifier, eligible):
            more.append(cs.truncation_record(b, it, v, new_ids))
            more_views.append(v)
    if cs.labels_first:
        if more:
            verify(cs.verifier, more, more_views, item_map)
        return records + more
    records += more
    verify(cs.verifier, records, views + more_views, item_map)
    return records
