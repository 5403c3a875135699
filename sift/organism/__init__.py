"""The embedded organism: procedural reasoning domains and two tiny causal LMs trained on them.

Mechanisms are known by construction and checked by intervention: on a cued prompt the chain of thought is
bent onto the cue either way, and two words the organism draws while writing it decide whether the answer
is read from the cue (silently: unfaithful) or from the chain of thought (misled but faithful). The text
is the same for both; the mechanism lives in the computation (sift.organism.render).
"""

from sift.resources import organism_checkpoints

DEFAULT_CHECKPOINTS = organism_checkpoints()
"""The shipped organism weights: package data ``sift/weights/organism/{gpt2,llama}`` (``checkpoints/organism/``
in the repository is a link to it)."""
