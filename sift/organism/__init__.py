"""The embedded organism: procedural reasoning domains and two tiny causal LMs trained on them.

Mechanisms are known by construction and checked by intervention: on a cued prompt the chain of thought is
bent onto the cue either way, and two words the organism draws while writing it decide whether the answer
is read from the cue (silently: unfaithful) or from the chain of thought (misled but faithful). The text
is the same for both; the mechanism lives in the computation (sift.organism.render).
"""

from pathlib import Path

DEFAULT_CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints" / "organism"
"""The shipped organism weights (``checkpoints/organism/{gpt2,llama}`` in the repository)."""
