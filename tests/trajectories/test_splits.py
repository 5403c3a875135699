"""Item splits of the trajectory stage: disjoint, sized by the fractions, deterministic in the seed."""

import pytest

from sift.trajectories.splits import item_splits


def test_item_splits_partition_the_items_by_the_fractions():
    items = [f"it{i:02d}" for i in range(40)]
    s = item_splits(reversed(items), seed=3, calib_fraction=0.5)
    assert [len(s[k]) for k in ("train", "val", "calib", "test")] == [24, 3, 3, 10]
    assert set().union(*s.values()) == set(items) and sum(map(len, s.values())) == 40
    assert s == item_splits(items, seed=3, calib_fraction=0.5)  # input order does not matter
    assert item_splits(items, seed=4)["train"] != s["train"]
    no_cal = item_splits(items, seed=3)
    assert no_cal["train"] == s["train"] and no_cal["test"] == s["test"] and no_cal["calib"] == set()
    assert no_cal["val"] == s["val"] | s["calib"]


def test_a_validation_block_too_small_to_split_warns():
    with pytest.warns(UserWarning, match="no 'calib' split"):
        s = item_splits(["a", "b", "c", "d", "e"], seed=0, fractions=(0.6, 0.2, 0.2), calib_fraction=0.5)
    assert s["calib"] == set() and len(s["val"]) == 1
