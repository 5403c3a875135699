"""Hidden-state trajectories and their descriptors (docs/design.md §5): extraction, cache, features."""
