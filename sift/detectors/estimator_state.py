"""A fitted scikit-learn estimator kept in a checkpoint as data, never as a pickle (issue 46).

The estimator is written with ``skops.io`` (a zip of JSON and ``.npy`` arrays, read with ``allow_pickle=False``) and
read back only when every type in the file is one skops trusts by default (scikit-learn estimators, NumPy, builtins)
or one that the detector names in its explicit ``trusted`` list; the loaded object must also be of the expected
class. Loading therefore builds objects of known types from data and calls no code named by the file.

Checkpoints written in the earlier format stored ``pickle.dumps(estimator)`` under
:data:`~sift.checkpoints.LEGACY_ESTIMATOR_KEY`; :func:`sift.checkpoints.load_checkpoint` refuses them
(:func:`~sift.checkpoints.refuse_pickle_entries`) with the command that retrains the control (a closed-form fit of a
few seconds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sift.checkpoints import LEGACY_ESTIMATOR_KEY, is_pickle_blob, refuse_pickle_entries
from sift.errors import SiftError

#: the checkpoint entry holding the skops bytes (a uint8 tensor, so ``weights_only`` loading keeps it as data)
STATE_KEY = "sift_estimator_skops"


def dump_estimator(estimator: Any) -> torch.Tensor:
    """The estimator as skops bytes in a uint8 tensor."""
    import skops.io as sio

    return torch.frombuffer(bytearray(sio.dumps(estimator)), dtype=torch.uint8).clone()


def load_estimator(state: torch.Tensor | bytes, *, expected: str, trusted: Sequence[str] = (),
                   what: str = "estimator") -> Any:
    """Rebuild an estimator written by :func:`dump_estimator`; refuse any type outside skops' defaults and
    ``trusted``, and any result whose class is not ``expected`` (a qualified name)."""
    import skops.io as sio
    from skops.io.exceptions import UntrustedTypesFoundException

    data = state.cpu().numpy().tobytes() if isinstance(state, torch.Tensor) else bytes(state)
    if is_pickle_blob(data):
        raise SiftError(f"{what}: refused: the estimator is pickle bytes, which sift never loads")
    try:
        est = sio.loads(data, trusted=list(trusted))
    except UntrustedTypesFoundException as e:
        raise SiftError(f"{what}: refused: the stored estimator holds types sift does not trust ({e})") from None
    except Exception as e:  # BadZipFile, a missing schema, a version mismatch ...
        raise SiftError(f"{what}: not a readable estimator ({type(e).__name__}: {str(e)[:160]})") from None
    got = f"{type(est).__module__}.{type(est).__qualname__}"
    if got != expected:
        raise SiftError(f"{what}: refused: the stored estimator is a {got}, expected a {expected}")
    return est


__all__ = ["LEGACY_ESTIMATOR_KEY", "STATE_KEY", "dump_estimator", "is_pickle_blob", "load_estimator",
           "refuse_pickle_entries"]
