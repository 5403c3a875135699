"""SIFT (paper §5, Table 7): masked multi-scale TCN → transformer encoder → attention pooling → MLP.

Padding never leaks: padded steps are zeroed before every convolution, BatchNorm statistics use real steps
only, the transformer gets a key-padding mask and the pooling softmax is masked; so appending padding leaves
the eval-mode output unchanged (tested).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from datamodules.batch import TraceBatch
from datamodules.features import keep_channels
from sift.detectors.module import DataSpec, DetectorModule, Standardizer, build_net, mlp
from sift.errors import SiftError

if TYPE_CHECKING:
    from sift.detectors.fast_inference import SIFTDetectorInference

# eval-mode nn.TransformerEncoder skips padding through nested tensors; torch warns that their API is a prototype
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")


class MaskedBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm over the real steps of [B, C, T] only (training statistics ignore padding)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if not self.training:
            return super().forward(x) * mask[:, None, :]
        h = x.transpose(1, 2)  # [B, T, C]
        out = torch.zeros_like(h)
        out[mask] = super().forward(h[mask])
        return out.transpose(1, 2)


class MaskedTCN(nn.Module):
    """Parallel 1-D convolutions with kernels ``kernels`` × ``filters`` ("same" padding), each followed by
    masked BatchNorm and ReLU; outputs are concatenated along channels → [B, T, len(kernels)·filters]."""

    def __init__(self, in_channels: int, kernels: Sequence[int] = (3, 5, 7, 11), filters: int = 64) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(in_channels, filters, k, padding=k // 2) for k in kernels)
        self.norms = nn.ModuleList(MaskedBatchNorm1d(filters) for _ in kernels)
        self.out_dim = filters * len(kernels)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask[:, None, :].to(x.dtype)
        h = x.transpose(1, 2) * m  # [B, C, T], zero padding
        outs = [torch.relu(bn(conv(h), mask)) * m for conv, bn in zip(self.convs, self.norms)]
        return torch.cat(outs, dim=1).transpose(1, 2)


def sinusoidal_positions(T: int, d: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[T, d] sinusoidal position encodings (Vaswani et al.)."""
    pos = torch.arange(T, device=device, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(T, d, device=device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d // 2])
    return pe.to(dtype)


class AttentionPooling(nn.Module):
    """Learned attention pooling: softmax over real steps of a linear score."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.score = nn.Linear(d, 1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s = self.score(h).squeeze(-1).masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=1).nan_to_num(0.0)  # an all-padding row pools to 0
        return torch.einsum("bt,btd->bd", w, h)


class SIFTNet(nn.Module):
    """x [B, T, C] + mask [B, T] → (logits [B], pooled representation [B, d_model]).

    Sinusoidal positions are added after the input projection (with or without the transformer), so the
    pooling sees where in the trace a pattern occurs even in the no-transformer ablation."""

    def __init__(self, in_channels: int, kernels: Sequence[int] = (3, 5, 7, 11), filters: int = 64,
                 d_model: int = 128, n_layers: int = 4, n_heads: int = 8, dim_feedforward: int = 256,
                 dropout: float = 0.1, mlp_hidden: int = 128, use_tcn: bool = True,
                 use_transformer: bool = True, encoder_chunk: int = 32, input_scale: float | None = None,
                 checkpoint_from_steps: int | None = None) -> None:
        super().__init__()
        self.encoder_chunk = int(encoder_chunk)
        # training batches whose longest trace has at least this many steps recompute each chunk's encoder
        # activations in the backward pass instead of keeping them (the same numbers, the RNG state of dropout
        # replayed; more compute, the encoder's activation memory of one chunk instead of the whole batch: text_sift
        # on a real LM's ~136-step inputs kept 3.9 GB). None: never (short inputs, e.g. the organism's, keep them)
        if checkpoint_from_steps is not None and int(checkpoint_from_steps) < 1:
            raise SiftError(f"net.checkpoint_from_steps must be >= 1 or null, got {checkpoint_from_steps}")
        self.checkpoint_from_steps = None if checkpoint_from_steps is None else int(checkpoint_from_steps)
        self.tcn = MaskedTCN(in_channels, kernels, filters) if use_tcn else None
        self.proj = nn.Linear(self.tcn.out_dim if self.tcn is not None else in_channels, d_model)
        if use_transformer:
            layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward, dropout, batch_first=True)
            self.encoder: nn.TransformerEncoder | None = nn.TransformerEncoder(
                layer, n_layers, enable_nested_tensor=True)
        else:
            self.encoder = None
        self.pool = AttentionPooling(d_model)
        self.head = mlp(d_model, mlp_hidden, 1, dropout)
        self.d_model = d_model
        # Vaswani et al.'s √d scale on the projected input before the positions are added. Without it the
        # projection's outputs (std ≈ 0.2 at initialisation on the organism) are swamped by the sinusoids
        # (std ≈ 0.7), and training sat on a plateau for ~100 steps (issue 12)
        self.input_scale = math.sqrt(d_model) if input_scale is None else float(input_scale)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = mask.bool()
        x = x * mask[..., None].to(x.dtype)
        h = self.tcn(x, mask) if self.tcn is not None else x
        h = self.proj(h) * self.input_scale
        h = h + sinusoidal_positions(h.shape[1], h.shape[2], h.device, h.dtype)
        if self.encoder is not None:
            if self.training and 0 < self.encoder_chunk < h.shape[0]:
                h = self._encode_by_length(h, mask)
            else:
                h = self.encoder(h, src_key_padding_mask=~mask)
        z = self.pool(h, mask)
        return self.head(z).squeeze(-1), z


    @staticmethod
    def stacked_forward(nets: Sequence[SIFTNet], inputs: Sequence[tuple[torch.Tensor, torch.Tensor]],
                        generators: Sequence[torch.Generator] | None,
                        steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The training-mode forward of S nets of one architecture on S batches at once (stacked seeds,
        :mod:`sift.detectors.seed_stack`): ``inputs`` per net (x [B, T_s, C], mask [B, T_s]) → (logits [S, B],
        pooled [S, B, d]), every batch padded to ``steps`` (None: the longest). Same function as each net's own
        forward (padding is masked everywhere; tested); dropout draws each seed's mask from its ``generators`` entry
        (None: no dropout)."""
        from sift.detectors import seed_stack as st

        net0 = nets[0]
        x, mask = st.pad_steps(inputs, steps)  # [S, B, T, C], [S, B, T]
        S, B, T, _ = x.shape
        m = mask[..., None].to(x.dtype)
        x = x * m
        if net0.tcn is not None:
            h = x.permute(1, 0, 3, 2).reshape(B, -1, T)  # [B, S·C, T]: seed-major channel groups
            mt = mask[:, :, None, :].to(x.dtype)  # [S, B, 1, T]
            outs = []
            for j, conv in enumerate(net0.tcn.convs):
                w = st.stacked([n.tcn.convs[j] for n in nets], "weight")  # [S, F, C, k]
                b = st.stacked([n.tcn.convs[j] for n in nets], "bias")
                y = F.conv1d(h, w.reshape(-1, *w.shape[2:]), b.reshape(-1), padding=conv.padding, groups=S)
                y = y.reshape(B, S, w.shape[1], T).transpose(0, 1)  # [S, B, F, T]
                y = st.masked_batch_norm(y, mt, [n.tcn.norms[j] for n in nets])
                outs.append(torch.relu(y) * mt)
            x = torch.cat(outs, dim=2).transpose(2, 3)  # [S, B, T, 4F]
        h = st.linear(x, st.stacked([n.proj for n in nets], "weight"), st.stacked([n.proj for n in nets], "bias"))
        h = h * net0.input_scale + sinusoidal_positions(T, h.shape[-1], h.device, h.dtype)
        if net0.encoder is not None:
            for i in range(len(net0.encoder.layers)):
                h = st.encoder_layer(h, ~mask, [n.encoder.layers[i] for n in nets], generators)
        s = st.linear(h, st.stacked([n.pool.score for n in nets], "weight"),
                      st.stacked([n.pool.score for n in nets], "bias")).squeeze(-1)
        w = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
        z = torch.einsum("sbt,sbtd->sbd", w, h)
        return st.mlp_head(z, [n.head for n in nets], generators), z

    def _encode_by_length(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The encoder on length-sorted chunks of ``encoder_chunk`` traces, each trimmed to its longest trace.

        The encoder treats traces independently and ignores padded keys, so this is the same function as one
        padded call (tested with dropout off); it skips the padding that a mixed-length training batch carries
        (about a third of the steps on the organism), which halves the encoder's training cost on CPU. Padded
        output rows are 0 (the pooling never reads them)."""
        assert self.encoder is not None
        lengths = mask.sum(1)
        out = h.new_zeros(h.shape)
        recompute = (self.checkpoint_from_steps is not None and torch.is_grad_enabled()
                     and int(lengths.max()) >= self.checkpoint_from_steps)
        for idx in torch.argsort(lengths, stable=True).split(self.encoder_chunk):
            T = max(1, int(lengths[idx].max()))
            if recompute:
                from torch.utils.checkpoint import checkpoint

                out[idx, :T] = checkpoint(self.encoder, h[idx, :T], src_key_padding_mask=~mask[idx, :T],
                                          use_reentrant=False)
            else:
                out[idx, :T] = self.encoder(h[idx, :T], src_key_padding_mask=~mask[idx, :T])
        return out


class SIFTDetector(DetectorModule):
    """SIFT as a Lightning detector: Σ_e R_e + λ_IRM Ω_IRM + λ_DANN Ω_DANN (paper eq. 14, Table 7).

    ``net``: :class:`SIFTNet` keyword arguments (or another ``_target_`` taking ``in_channels``); ``optimizer``,
    ``scheduler``, ``objective``: see :class:`~sift.detectors.module.DetectorModule` (IRM and DANN on by default).
    Ablation switches (each removes its component): ``net.use_tcn`` (input goes straight to the projection),
    ``net.use_transformer``, ``objective.use_irm``, ``objective.use_dann`` (no domain classifier is built),
    ``drop_channels`` (e.g. ``[attention_stability]``, ``[early_commitment]``: those channels are dropped from the
    input).
    Channels are standardised with statistics fitted on training steps (``standardize``).
    """

    objective_defaults: ClassVar[dict[str, Any]] = {"use_irm": True, "use_dann": True}
    stack_net: ClassVar[type | None] = SIFTNet

    def __init__(self, *, data: DataSpec | Mapping[str, Any] | None = None, name: str = "sift",
                 net: Mapping[str, Any] | None = None, optimizer: Mapping[str, Any] | None = None,
                 scheduler: Mapping[str, Any] | None = None, objective: Mapping[str, Any] | None = None,
                 drop_channels: Sequence[str] = (), standardize: bool = True,
                 threshold_method: str = "youden") -> None:
        super().__init__(data=data, name=name, optimizer=optimizer, scheduler=scheduler, objective=objective,
                         threshold_method=threshold_method)
        self.save_hyperparameters(logger=False)
        kept = keep_channels(self.channel_names, sorted(set(drop_channels)))
        self.kept_channels = [self.channel_names[i] for i in kept]
        self.register_buffer("channel_idx", torch.tensor(kept, dtype=torch.long), persistent=False)
        self.standardizer = Standardizer(len(kept)) if standardize else None
        self.net = build_net(net, SIFTNet, in_channels=len(kept))
        self.representation_dim = int(self.net.d_model)
        self.build_dann_head()

    @property
    def in_channels(self) -> int:
        return len(self.kept_channels)

    def _inputs(self, batch: TraceBatch) -> torch.Tensor:
        x = batch.x.index_select(-1, self.channel_idx)
        if self.standardizer is not None:
            x = self.standardizer(x)
        return x

    def stack_inputs(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self._inputs(batch), batch.mask

    def encode(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(*self.stack_inputs(batch))

    def inference_engine(self, *, chunk: int | None = None, int8: bool = False) -> SIFTDetectorInference:
        """A frozen fast-inference snapshot (BN folded, one fused TCN conv, length-bucketed chunks; see
        :mod:`sift.detectors.fast_inference`): ``engine.probs(batch)`` equals ``self(batch)`` in eval mode
        (allclose). ``int8=True`` adds dynamic int8 quantisation of the Linear layers (approximate). The
        detector itself is left unchanged; build a new engine after further training."""
        from sift.detectors.fast_inference import SIFTDetectorInference

        was = self.training
        self.eval()
        try:
            return SIFTDetectorInference(self, chunk=chunk, int8=int8)
        finally:
            self.train(was)

    def fit_input_stats(self, batches: Iterable[TraceBatch]) -> None:
        if self.standardizer is None:
            return
        for b in batches:
            self.standardizer.update(b.x.index_select(-1, self.channel_idx)[b.mask.bool()])
        self.standardizer.finalize()
