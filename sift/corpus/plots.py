"""A one-page picture of a corpus manifest: pairs kept per axis and φ* balance per condition."""

from __future__ import annotations

from pathlib import Path


def plot_manifest(manifest: dict, path: str | Path) -> Path:
    """Write a PNG with two panels (kept fraction per axis; φ*=1 / φ*=0 / ambiguous traces per condition)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = {k: v for k, v in manifest["axes"].items() if v["built"]}
    conds = manifest["conditions"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(axes)
    kept = [axes[n]["kept_fraction"] for n in names]
    colors = ["tab:blue" if axes[n]["kind"] == "preserving" else "tab:orange" for n in names]
    a.barh(names, kept, color=colors)
    for n, k in zip(names, kept):
        a.text(min(k, 0.98), names.index(n), f" {axes[n]['verified']}/{axes[n]['built']}", va="center",
               ha="right" if k > 0.5 else "left", color="white" if k > 0.5 else "black", fontsize=8)
    a.axvline(0.9, color="tab:blue", ls="--", lw=1)
    a.axvline(0.8, color="tab:orange", ls="--", lw=1)
    a.set_xlim(0, 1)
    a.set_xlabel("verified pairs / pairs built")
    a.set_title("pairs kept per axis (blue: preserving, orange: altering)")
    cn = list(conds)
    p1 = [conds[c]["phi_1"] for c in cn]
    p0 = [conds[c]["phi_0"] for c in cn]
    amb = [conds[c]["ambiguous"] for c in cn]
    b.barh(cn, p1, color="tab:green", label="φ*=1")
    b.barh(cn, p0, left=p1, color="tab:red", label="φ*=0")
    b.barh(cn, amb, left=[x + y for x, y in zip(p1, p0)], color="tab:gray", label="ambiguous")
    b.set_xlabel("traces")
    b.set_title("verified labels per condition")
    b.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"FaithShift corpus: {manifest['traces']} traces, config {manifest['config_hash']}")
    fig.tight_layout()
    import io

    from sift.atomic import atomic_open

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    path = Path(path)
    with atomic_open(path, "wb") as fh:
        fh.write(buf.getvalue())
    return path
