"""Evaluation: per-trace prediction tables, analyses (report sections) and evaluation callbacks."""
