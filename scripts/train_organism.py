"""Retrain the organism from scratch: ``python scripts/train_organism.py --family gpt2 --out checkpoints/organism/gpt2``."""

from __future__ import annotations

import argparse

import torch

from sift.organism.train import TrainConfig, train_organism


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--family", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    ap.add_argument("--lr", type=float, default=TrainConfig.lr)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = TrainConfig(family=a.family, steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed)
    rec = train_organism(cfg, a.out)["record"]
    print(f"trained {a.family}: {rec['parameters']} parameters in {rec['train_seconds']} s")


if __name__ == "__main__":
    main()
