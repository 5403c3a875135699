"""One exception type for bad input: its message is the single line a user sees."""

from __future__ import annotations


class SiftError(Exception):
    """Bad input or an unusable resource; the message names the file, field or shape at fault."""


class PermanentError(SiftError):
    """A failure that a retry cannot fix (a model that cannot load, a truncated file): the job executor does not
    retry it."""
