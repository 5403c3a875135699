"""What ``net.checkpoint_from_steps`` costs: one SIFTNet training step (forward + backward) with the encoder's
activations kept against recomputed in the backward pass, on random inputs of a given shape.

    python scripts/bench_encoder_recompute.py                       # organism-like text_sift input: B 64, T <= 48
    python scripts/bench_encoder_recompute.py --steps 136 --threads 2

Prints the best of ``--repeats`` timings of ``--iters`` steps each, per setting, twice in alternation (so a drift of
the machine shows as a difference between the two rounds).
"""

from __future__ import annotations

import argparse
import time

import torch

from sift.detectors.sift_model import SIFTNet


def step_ms(net: SIFTNet, x: torch.Tensor, mask: torch.Tensor, iters: int, repeats: int) -> float:
    """Best-of-``repeats`` mean milliseconds of one forward + backward pass (after 3 warm-up steps)."""
    for _ in range(3):
        logits, z = net(x, mask)
        (logits.sum() + z.sum()).backward()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            logits, z = net(x, mask)
            (logits.sum() + z.sum()).backward()
        best = min(best, (time.perf_counter() - t) / iters)
    return best * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=48, help="the longest trace (lengths drawn from [steps/2, steps])")
    ap.add_argument("--channels", type=int, default=64, help="input width (text_sift's token embedding: 64)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.batch, a.steps, a.channels, generator=g)
    lengths = torch.randint(max(1, a.steps // 2), a.steps + 1, (a.batch,), generator=g)
    mask = torch.arange(a.steps)[None] < lengths[:, None]
    for rnd in (1, 2):
        for recompute in (False, True):
            torch.manual_seed(0)
            net = SIFTNet(a.channels, checkpoint_from_steps=1 if recompute else None).train()
            ms = step_ms(net, x, mask, a.iters, a.repeats)
            print(f"round {rnd}: {'recomputed' if recompute else 'kept':10s} {ms:7.1f} ms per training step "
                  f"(batch {a.batch}, T <= {a.steps}, {a.threads} threads, best of {a.repeats} x {a.iters})")


if __name__ == "__main__":
    main()
