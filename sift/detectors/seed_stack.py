"""Stacked seeds: the S seeds of one detector config trained in one process, one batched forward and backward per
step (issue 44).

Each seed is still a complete Lightning run: its own Trainer, DataModule (data order), callbacks (early stopping,
checkpoints, validation history), loggers and run folder, driven by :func:`sift.training.train_stacked` in a thread
of its own. Only the training step is shared. A seed's ``training_step`` hands its batch to the group's
:class:`SeedStack` and waits; when every seed still training has handed one in, the last to arrive computes all of
them at once:

* each seed's own input layer (:meth:`~sift.detectors.module.DetectorModule.stack_inputs`: standardisation,
  token embedding, projection) on its own batch;
* the network of every seed in one call of its class's ``stacked_forward`` (:class:`SIFTNet`,
  :class:`~sift.detectors.baselines.MLPNet`): the S parameter sets stacked on a leading axis, the S batches padded to
  one length, batched matrix products and grouped convolutions; masked BatchNorm statistics per seed;
* each seed's objective (:meth:`~sift.detectors.module.DetectorModule.objective_loss`: its risk, IRM and DANN terms
  at its own step) and one backward pass over the sum, which gives each seed the gradient of its own loss (the seeds
  share no parameter).

Each seed then gets its gradient back through its own ``training_step`` (a surrogate loss whose gradient is that
gradient), and Lightning clips, steps its optimizer and scheduler, validates, checkpoints and stops it exactly as in
a separate run. A seed that stops leaves the group; the others go on. Dropout draws from a generator per seed
(seeded by the run's seed, saved in its checkpoints), so a seed's dropout stream does not depend on the other seeds
and a killed group resumes exactly. With dropout off, a stacked seed follows its separate run to float rounding
(``tests/detectors/test_seed_stack.py``).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from sift.errors import SiftError

if TYPE_CHECKING:
    from sift.detectors.module import DetectorModule

#: offset of the dropout generator's seed from the run's seed (kept apart from the run's global-RNG streams)
DROPOUT_SEED_OFFSET = 0x5EED


# --------------------------------------------------------------------------------------------- stacked ops
def stacked(mods: Sequence[torch.nn.Module], name: str) -> torch.Tensor:
    """The parameter (or buffer) ``name`` of every module, stacked on a new leading axis (differentiable: the
    gradient of the stack flows to each module's own parameter)."""
    return torch.stack([getattr(m, name) for m in mods])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Per-seed ``F.linear``: x [S, ..., in], weight [S, out, in], bias [S, out] → [S, ..., out]."""
    S = x.shape[0]
    flat = x.reshape(S, -1, x.shape[-1])
    out = torch.bmm(flat, weight.transpose(1, 2)) if bias is None else torch.baddbmm(bias[:, None, :], flat,
                                                                                       weight.transpose(1, 2))
    return out.reshape(*x.shape[:-1], weight.shape[1])


def dropout(x: torch.Tensor, p: float, generators: Sequence[torch.Generator] | None) -> torch.Tensor:
    """Inverted dropout with each seed's mask drawn from its own generator (``generators`` None or ``p`` 0: off)."""
    if not generators or p <= 0.0:
        return x
    keep = torch.empty_like(x)
    for s, g in enumerate(generators):
        keep[s].bernoulli_(1.0 - p, generator=g)
    return torch.mul(x, keep).mul_(1.0 / (1.0 - p))


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-seed affine LayerNorm over the last axis: x [S, ..., d], weight/bias [S, d]."""
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    return torch.addcmul(bias.reshape(shape), F.layer_norm(x, x.shape[-1:], eps=eps), weight.reshape(shape))


def masked_batch_norm(y: torch.Tensor, m: torch.Tensor, bns: Sequence[torch.nn.BatchNorm1d]) -> torch.Tensor:
    """Training-mode :class:`~sift.detectors.sift_model.MaskedBatchNorm1d` of every seed at once: y [S, B, F, T],
    m [S, B, 1, T] (1 on real steps); statistics per seed and channel over its real steps, each seed's running
    statistics updated in place as ``nn.BatchNorm1d`` does (biased variance to normalise, unbiased to track)."""
    n = m.sum(dim=(1, 3))  # [S, 1]
    mean = (y * m).sum(dim=(1, 3)) / n  # [S, F]
    centred = (y - mean[:, None, :, None]) * m
    var = (centred * centred).sum(dim=(1, 3)) / n
    bn0 = bns[0]
    out = (y - mean[:, None, :, None]) * torch.rsqrt(var + bn0.eps)[:, None, :, None]
    if bn0.affine:
        out = out * stacked(bns, "weight")[:, None, :, None] + stacked(bns, "bias")[:, None, :, None]
    if bn0.track_running_stats:
        with torch.no_grad():
            unbiased = var * (n / (n - 1).clamp_min(1))
            for s, bn in enumerate(bns):
                bn.num_batches_tracked.add_(1)
                mom = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
                bn.running_mean.mul_(1 - mom).add_(mean[s].detach(), alpha=mom)
                bn.running_var.mul_(1 - mom).add_(unbiased[s].detach(), alpha=mom)
    return out * m


def encoder_layer(x: torch.Tensor, key_pad: torch.Tensor, layers: Sequence[torch.nn.TransformerEncoderLayer],
                  generators: Sequence[torch.Generator] | None) -> torch.Tensor:
    """Training-mode ``nn.TransformerEncoderLayer`` (post-norm, ReLU, batch first) of every seed at once:
    x [S, B, T, d], key_pad [S, B, T] (True: padded key)."""
    lay = layers[0]
    if lay.norm_first or lay.activation_relu_or_gelu != 1:
        raise SiftError("stacked seeds: only post-norm ReLU transformer layers stack (the SIFTNet default)")
    att = lay.self_attn
    S, B, T, d = x.shape
    H = att.num_heads
    dh = d // H
    qkv = linear(x, stacked([m.self_attn for m in layers], "in_proj_weight"),
                 stacked([m.self_attn for m in layers], "in_proj_bias"))
    q, k, v = (t.reshape(S, B, T, H, dh).transpose(2, 3) for t in qkv.split(d, dim=-1))  # [S, B, H, T, dh]
    scores = torch.matmul(q, k.transpose(-1, -2)) / (dh ** 0.5)
    scores = scores.masked_fill(key_pad[:, :, None, None, :], float("-inf"))
    attn = dropout(torch.softmax(scores, dim=-1), att.dropout, generators)
    a = torch.matmul(attn, v).transpose(2, 3).reshape(S, B, T, d)
    outs = [m.self_attn.out_proj for m in layers]
    a = linear(a, stacked(outs, "weight"), stacked(outs, "bias"))
    x = layer_norm(x + dropout(a, lay.dropout1.p, generators), stacked([m.norm1 for m in layers], "weight"),
                   stacked([m.norm1 for m in layers], "bias"), lay.norm1.eps)
    h = torch.relu(linear(x, stacked([m.linear1 for m in layers], "weight"),
                          stacked([m.linear1 for m in layers], "bias")))
    h = linear(dropout(h, lay.dropout.p, generators), stacked([m.linear2 for m in layers], "weight"),
               stacked([m.linear2 for m in layers], "bias"))
    return layer_norm(x + dropout(h, lay.dropout2.p, generators), stacked([m.norm2 for m in layers], "weight"),
                      stacked([m.norm2 for m in layers], "bias"), lay.norm2.eps)


def mlp_head(z: torch.Tensor, heads: Sequence[torch.nn.Sequential],
             generators: Sequence[torch.Generator] | None) -> torch.Tensor:
    """Per-seed ``Linear → ReLU → Dropout → Linear`` (:func:`~sift.detectors.module.mlp`) → [S, B]."""
    h = torch.relu(linear(z, stacked([m[0] for m in heads], "weight"), stacked([m[0] for m in heads], "bias")))
    h = dropout(h, heads[0][2].p, generators)
    return linear(h, stacked([m[3] for m in heads], "weight"), stacked([m[3] for m in heads], "bias")).squeeze(-1)


def pad_steps(inputs: Sequence[tuple[torch.Tensor, torch.Tensor]],
              steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-seed (x [B, T_s, C], mask [B, T_s]) → x [S, B, T, C], mask [S, B, T], right-padded to ``steps`` (None:
    the longest). A group pads every step to one length (:attr:`SeedStack.steps`): a seed's numbers then do not
    depend on which other seeds are still training, or how long their traces are (the kernels' rounding depends
    on the padded length), so a resumed group repeats an uninterrupted one exactly."""
    B = {x.shape[0] for x, _ in inputs}
    if len(B) != 1:
        raise SiftError(f"stacked seeds: the seeds' step batches differ in size ({sorted(B)} traces)")
    longest = max(x.shape[1] for x, _ in inputs)
    if steps is not None and longest > steps:
        raise SiftError(f"stacked seeds: a batch of {longest} steps is longer than the group's {steps}")
    T = longest if steps is None else int(steps)
    xs = torch.stack([F.pad(x, (0, 0, 0, T - x.shape[1])) for x, _ in inputs])
    ms = torch.stack([F.pad(m.bool(), (0, T - m.shape[1]), value=False) for _, m in inputs])
    return xs, ms


# --------------------------------------------------------------------------------------------- the group
class SeedStack:
    """The shared training step of a stacked group (module docstring). ``modules``: one detector per seed, all of
    one class and net class; ``seeds``: their run seeds (each seeds its dropout generator)."""

    def __init__(self, modules: Sequence[DetectorModule], seeds: Sequence[int], steps: int | None = None) -> None:
        if len(modules) != len(seeds) or not modules:
            raise SiftError("SeedStack: one module per seed, at least one")
        net_cls = {type(m.net) for m in modules}
        if len({type(m) for m in modules}) != 1 or len(net_cls) != 1 or not hasattr(
                next(iter(net_cls)), "stacked_forward"):
            raise SiftError(f"SeedStack: the seeds must share one detector class and a net class with "
                            f"stacked_forward, got {sorted({type(m).__name__ for m in modules})} / "
                            f"{sorted(c.__name__ for c in net_cls)}")
        self.modules = list(modules)
        self.steps = steps  # every batch is padded to this many steps (None: the longest in the step)
        self.index = {id(m): i for i, m in enumerate(modules)}
        device = next(modules[0].parameters()).device
        self.generators = [torch.Generator(device=device).manual_seed(int(s) + DROPOUT_SEED_OFFSET) for s in seeds]
        self._live = set(range(len(modules)))
        self._pending: dict[int, Any] = {}
        self._results: dict[int, Any] = {}
        self._cond = threading.Condition()
        self.n_steps = 0  # batched steps computed (a step of k seeds counts once)

    # ---- membership
    def attach(self) -> None:
        for m in self.modules:
            m._seed_stack = self

    def detach(self) -> None:
        for m in self.modules:
            m._seed_stack = None

    def generator_of(self, module: DetectorModule) -> torch.Generator:
        return self.generators[self.index[id(module)]]

    def leave(self, module: DetectorModule) -> None:
        """The seed's fit has ended (stopped, finished or failed): the others no longer wait for it."""
        with self._cond:
            self._live.discard(self.index[id(module)])
            self._maybe_compute()
            self._cond.notify_all()

    # ---- the step
    def step(self, module: DetectorModule, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """Hand in this seed's batch; returns (surrogate loss, logged terms, batch size) once the group's step is
        computed. The surrogate's value is the seed's loss and its gradient the seed's gradient."""
        i = self.index[id(module)]
        with self._cond:
            self._pending[i] = batch
            self._maybe_compute()
            while i not in self._results:
                self._cond.wait()
            out = self._results.pop(i)
        if isinstance(out, BaseException):
            raise SiftError(f"stacked seeds: the group's training step failed ({type(out).__name__}: {out})") \
                from out
        grads, loss, terms, bs = out
        params = [p for p in module.parameters() if p.requires_grad]
        surrogate = sum((p * g).sum() for p, g in zip(params, grads) if g is not None)
        surrogate = torch.as_tensor(surrogate, dtype=loss.dtype, device=loss.device)
        return surrogate - surrogate.detach() + loss, terms, bs

    def _maybe_compute(self) -> None:
        """Under the lock: when every live seed has handed in a batch, compute the step for all of them."""
        if not self._pending or set(self._pending) != self._live:
            return
        idx = sorted(self._pending)
        try:
            with torch.enable_grad(), torch.inference_mode(False):
                res = self._compute([self.modules[i] for i in idx], [self._pending[i] for i in idx],
                                    [self.generators[i] for i in idx], self.steps)
            self._results.update(zip(idx, res))
        except Exception as e:  # every waiting seed raises it
            self._results.update({i: e for i in idx})
        self._pending.clear()
        self.n_steps += 1
        self._cond.notify_all()

    @staticmethod
    def _compute(mods: list[DetectorModule], batches: list[Any], gens: list[torch.Generator],
                 steps: int | None) -> list[tuple]:
        from sift.detectors.module import as_env_batches, concat_batches

        cats, sizes, inputs = [], [], []
        for m, b in zip(mods, batches):
            envs = as_env_batches(b)
            cat = concat_batches(envs)
            cats.append(cat)
            sizes.append([len(e) for e in envs])
            inp = m.stack_inputs(cat)
            if inp is None:
                raise SiftError(f"{type(m).__name__} does not train stacked (stack_inputs is None)")
            inputs.append(inp)
        dropout_on = any(mod.training for m in mods for mod in m.net.modules() if isinstance(mod, torch.nn.Dropout))
        nets = [m.net for m in mods]
        if len(mods) == 1:
            # a lone seed (the others have stopped) runs beside a throwaway copy of itself: batched kernels on one
            # slice take other code paths (other rounding) than on two or more, and a resumed group must repeat
            # the uninterrupted one exactly whichever seeds are still training
            nets, inputs, gens = [nets[0], copy.deepcopy(nets[0])], inputs * 2, [gens[0], torch.Generator(
                device=gens[0].device).manual_seed(0)]
        logits, z = type(nets[0]).stacked_forward(nets, inputs, gens if dropout_on else None, steps)
        losses, terms = [], []
        for s, m in enumerate(mods):
            loss, t = m.objective_loss(logits[s], z[s], cats[s], sizes[s])
            losses.append(loss)
            terms.append(t)
        params = [[p for p in m.parameters() if p.requires_grad] for m in mods]
        flat = [p for ps in params for p in ps]
        grads = torch.autograd.grad(torch.stack(losses).sum(), flat, allow_unused=True)
        out, k = [], 0
        for s, ps in enumerate(params):
            out.append((grads[k:k + len(ps)], losses[s].detach(), terms[s], len(cats[s])))
            k += len(ps)
        return out


@torch.no_grad()
def longest_input(module: DetectorModule, loader: Any) -> int | None:
    """The most steps (axis 1 of the net's inputs) over one pass of ``loader`` (None: inputs without a step
    axis). Every training trace is in one epoch of the environment-balanced loader."""
    from sift.detectors.module import as_env_batches, concat_batches

    longest = None
    for b in loader:
        x = module.stack_inputs(concat_batches(as_env_batches(b)))[0]
        if x.dim() < 3:
            return None
        longest = max(longest or 0, int(x.shape[1]))
    return longest


def config_stacks(detector: Any) -> bool:
    """Whether a ``detector`` config trains stacked: its class gives the net's inputs (``stack_net``, the net it
    builds when the config names none) and the net class (``net._target_`` or that default) has
    ``stacked_forward``."""
    from hydra.utils import get_class

    try:
        cls = get_class(str(detector.get("_target_")))
        net = (detector.get("net") or {}).get("_target_")
        net_cls = get_class(str(net)) if net else getattr(cls, "stack_net", None)
    except Exception:  # noqa: BLE001 - an unknown class simply does not stack (the run reports its own error)
        return False
    return getattr(cls, "stack_net", None) is not None and hasattr(net_cls, "stacked_forward")


def stackable(module: DetectorModule) -> bool:
    """Whether a detector can train in a stacked group (its net class has ``stacked_forward`` and the detector
    gives the net's inputs)."""
    return getattr(module, "stack_net", None) is not None and hasattr(type(getattr(module, "net", None)),
                                                                       "stacked_forward")


__all__ = ["SeedStack", "config_stacks", "longest_input", "stackable", "stacked", "linear", "dropout", "layer_norm",
           "masked_batch_norm", "encoder_layer", "mlp_head", "pad_steps"]
