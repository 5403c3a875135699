"""sift: train and audit chain-of-thought faithfulness detectors under distribution shift."""

__version__ = "0.1.0"
