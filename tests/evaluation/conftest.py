"""Shared fixtures of the evaluation tests."""

import warnings

import pytest


@pytest.fixture(autouse=True)
def _quiet():
    """The toy tables trip numpy/sklearn warnings on purpose (empty slices, one-class resamples)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
