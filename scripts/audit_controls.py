"""Print the shortcut-control audit of a corpus (grouped 5-fold CV AUROC of text_bow, surface, prompt_probe and
text_trees).

    python scripts/audit_controls.py <corpus_dir>                        # organism corpus: prompt states computed
    python scripts/audit_controls.py <corpus_dir> --trajectories <dir>   # prompt states from sift-extract shards
    python scripts/audit_controls.py <corpus_dir> --checkpoints <dir>    # organism checkpoints other than the default

Prompt-final states come from the extraction's shards when ``--trajectories`` is given, else (organism corpora,
``model`` starting with ``organism-``) from one forward pass of the organism over the prompts; otherwise the
prompt probe's cells stay undefined with the reason. ``text_trees`` (gradient-boosted trees on position-specific
CoT words and CoT / prompt word presence) is the audit's interaction-capable text learner: it reads a label that is
an interaction of words, which the linear ``text_bow`` misses. The same numbers are in the corpus manifest
(``controls_audit``); this script recomputes them, e.g. to cite in docs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def prompt_states_from_trajectories(traj_dir: Path) -> dict[str, np.ndarray]:
    from sift.trajectories import cache as C

    man = C.read_manifest(traj_dir)
    out: dict[str, np.ndarray] = {}
    for _m, info in man["models"].items():
        for shard in info["shards"]:
            t, meta = C.read_shard(traj_dir / shard)
            if "prompt_final" not in t:
                raise SystemExit(f"audit_controls: {traj_dir / shard} holds no prompt-final states; rerun sift-extract")
            out.update({tid: s for tid, s in zip(meta["trace_ids"], t["prompt_final"].numpy())})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus_dir", type=Path)
    ap.add_argument("--trajectories", type=Path, default=None)
    ap.add_argument("--checkpoints", type=Path, default=None, help="organism checkpoint folder (default: shipped)")
    ap.add_argument("--json", action="store_true", help="print the audit as JSON instead of a table")
    ap.add_argument("--null", type=int, default=0, metavar="N",
                    help="also the text controls' AUROC under N label flips per base item (the no-signal null)")
    a = ap.parse_args(argv)
    from sift.corpus.audit import audit_table, control_audit, prompt_states_for, slice_summary, warning_line
    from sift.corpus.store import read_jsonl

    path = a.corpus_dir / "traces.jsonl"
    if not path.is_file():
        print(f"audit_controls: {path}: no such file (expected a sift-corpus folder)", file=sys.stderr)
        return 2
    records = read_jsonl(path)
    states, why = None, "no prompt-final states: pass --trajectories (or use an organism corpus)"
    if a.trajectories is not None:
        states, why = prompt_states_from_trajectories(a.trajectories), None
    elif records and all(str(r.get("model", "")).startswith("organism-") for r in records):
        from sift.organism import DEFAULT_CHECKPOINTS
        from sift.organism.source import OrganismSource

        root = a.checkpoints or DEFAULT_CHECKPOINTS
        fams = sorted({str(r["family"]) for r in records})
        states, why = prompt_states_for({f: OrganismSource.load(f, root / f) for f in fams}, records)
    audit = control_audit(records, states, prompt_states_reason=why)
    if a.json:
        print(json.dumps({"matched_slice": slice_summary(records), "controls_audit": audit}, indent=1))
        return 0
    s = slice_summary(records)
    print(f"corpus {a.corpus_dir}: {audit['n_verified']} verified traces; matched slice {s['verified']} "
          f"({s['fraction_of_verified']} of verified), φ*=0 share {s['phi_0_fraction']}")
    print(f"grouped 5-fold CV AUROC by base item (limits: base + preserving ≤ {audit['limits']['base_preserving']}, "
          f"matched slice ≤ {audit['limits']['matched_slice']})\n")
    print(audit_table(audit))
    line = warning_line({"controls_audit": audit})
    if line:
        print("\n" + line.replace("sift-corpus: ", ""))
    if a.null:
        from sift.corpus.audit import permutation_null

        null = permutation_null(records, a.null)
        print(f"\nno-signal null: each base item's labels flipped with probability 1/2, {a.null} flips")
        print("| set | control | observed | null mean | null 95th pct | p |\n|---|---|---|---|---|---|")
        for sname in ("base_preserving", "matched_slice"):
            for name, r in null[sname].items():
                print(f"| {sname} | {name} | {r['observed']} | {r['null_mean']} | {r['null_p95']} | {r['p_value']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
