"""The item splits of a trajectory folder: every trace of a base item in one split, deterministic in the seed."""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterable, Sequence


def item_splits(items: Iterable[str], seed: int, fractions: Sequence[float] = (0.6, 0.15, 0.25),
                calib_fraction: float = 0.0) -> dict[str, set[str]]:
    """Base items → ``train``, ``val``, ``calib`` and ``test`` (``fractions`` of train / validation / test).

    The items are sorted and shuffled with ``seed``. The validation block is split by item into a selection part
    (``val``: checkpoint selection, early stopping, the decision threshold) and a calibration part (``calib``,
    ``calib_fraction`` of it: SGR only); train and test are the same items whatever ``calib_fraction`` is."""
    items = sorted(set(items))
    random.Random(f"split:{seed}").shuffle(items)
    n = len(items)
    n_train = int(round(fractions[0] * n))
    n_val = int(round(fractions[1] * n))
    val = items[n_train:n_train + n_val]
    n_cal = min(max(1, int(round(calib_fraction * len(val)))), len(val) - 1) if calib_fraction else 0
    if n_cal <= 0 and calib_fraction > 0:
        warnings.warn(f"{len(val)} validation item(s) cannot be split into a selection and a calibration part: "
                      f"no 'calib' split (SGR will be computed in-sample, not certified)", stacklevel=2)
        n_cal = 0
    return {"train": set(items[:n_train]), "val": set(val[:len(val) - n_cal]),
            "calib": set(val[len(val) - n_cal:]), "test": set(items[n_train + n_val:])}
