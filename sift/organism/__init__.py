"""The embedded organism: procedural reasoning domains and two tiny causal LMs trained on them.

Mechanisms are known by construction (DESIGN.md §2–§4): on cued prompts that satisfy a latent rule the
organism silently follows the cue while its chain of thought rationalises toward it; otherwise it answers
from its chain of thought.
"""

from pathlib import Path

DEFAULT_CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints" / "organism"
"""The shipped organism weights (``checkpoints/organism/{gpt2,llama}`` in the repository)."""
