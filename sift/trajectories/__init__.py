"""Hidden-state trajectories and their descriptors (DESIGN.md §5): extraction, cache, features."""
