"""Fast eval-only SIFT inference: the same function as :class:`SIFTNet` in eval mode, computed faster on CPU.

:class:`SIFTInference` is built from an eval ``SIFTNet`` (a snapshot: it does not follow later weight updates)
and computes the same logits and pooled representation (``allclose``, tested) with

* BatchNorm folded into the convolutions (eval BN is an affine map of each conv output) and the four "same"
  kernels [3,5,7,11] zero-padded to the widest one, so the TCN is ONE convolution, done as one GEMM over
  ``unfold``-ed windows ([B·T, C·11] @ [C·11, 4·64]);
* the sinusoidal position table and the projection bias pre-added once;
* the post-norm transformer layers written out, attention as two batched products around a softmax with the
  ``1/√d_head`` scale folded into the query projection and the key-padding mask as an additive bias (no
  nested-tensor conversion; padded query rows are computed and then ignored by the masked pooling, the same
  outputs as torch's nested-tensor fast path, which drops them);
* traces sorted by length and run in chunks, each trimmed to its own longest trace, so short traces do not pay
  for the longest one (padding never changes SIFT's output, tested in ``test_sift_net``);
* optionally (``int8=True``) dynamic int8 quantisation of every Linear (``torch.ao.quantization.quantize_dynamic``:
  int8 weights, activations quantised per batch). That one is an approximation: probabilities agree with fp32
  within the tolerance stated in ``tests/detectors/test_fast_inference.py``.

Everything runs under ``torch.inference_mode``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sift.errors import SiftError

#: tolerance of the int8 path: max |P_int8 − P_fp32| over the test's traces (stated in the tests)
# max |ΔP| of dynamic int8 vs fp32 on probabilities spread over (0, 1); mean ≤ 0.03. Measured on 8 random paper-size
# nets (4 seeds, with and without the √d input scale): max 0.062–0.164, mean 0.015–0.029
INT8_PROB_ATOL = 0.2

#: traces per length bucket: at SIFT's sizes, chunks of 32–64 traces keep a layer's activations in cache and ran
#: 1.15–1.2× faster than 128 at full length on 2 CPU cores (``scripts/bench_sift_throughput.py --chunk``)
DEFAULT_CHUNK = 64


def _positions(T: int, d: int) -> torch.Tensor:
    from sift.detectors.sift_model import sinusoidal_positions

    return sinusoidal_positions(T, d, torch.device("cpu"), torch.float32)


class _Layer(nn.Module):
    """One post-norm ``nn.TransformerEncoderLayer`` (eval) with plain Linears (so they can be quantised).

    Attention is written out as two batched products around a softmax over ``[B·H, T, T]``, with the
    ``1/√d_head`` scale folded into the query rows of the in-projection and the key-padding mask added as a bias
    inside the first product (``baddbmm``). At SIFT's sizes (d_head = 16, T ≤ 64) this is 1.5–1.8× faster on CPU
    than ``scaled_dot_product_attention``, whose flash kernel spent 38–41 % of the fast path's time on 10 % of its
    FLOPs (``scripts/bench_sift_throughput.py --profile``)."""

    def __init__(self, layer: nn.TransformerEncoderLayer) -> None:
        super().__init__()
        if layer.norm_first:
            raise SiftError("SIFTInference supports post-norm encoder layers only (norm_first=False)")
        if layer.activation_relu_or_gelu not in (1, 2):
            raise SiftError("SIFTInference supports relu or gelu encoder activations only")
        att = layer.self_attn
        if not att.batch_first or att._qkv_same_embed_dim is False:
            raise SiftError("SIFTInference needs a batch_first self-attention with one in-projection")
        d = att.embed_dim
        self.n_heads, self.d = att.num_heads, d
        scale = torch.ones(3 * d, 1)
        scale[:d] = (d // att.num_heads) ** -0.5  # softmax(q·k / √d_head) = softmax((q / √d_head)·k)
        self.qkv = _linear(att.in_proj_weight * scale, att.in_proj_bias * scale[:, 0])
        self.out = _linear(att.out_proj.weight, att.out_proj.bias)
        self.ff1 = _linear(layer.linear1.weight, layer.linear1.bias)
        self.ff2 = _linear(layer.linear2.weight, layer.linear2.bias)
        self.norm1, self.norm2 = _copy_ln(layer.norm1), _copy_ln(layer.norm2)
        self.gelu = layer.activation_relu_or_gelu == 2

    def forward(self, h: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
        """``h`` [B, T, d]; ``key_bias`` [B·H, 1, T] (0 on real steps, −inf on padding) or None (no padding)."""
        B, T, d = h.shape
        H = self.n_heads
        qkv = self.qkv(h).view(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4).reshape(3, B * H, T, d // H)
        kt = qkv[1].transpose(1, 2)
        s = torch.bmm(qkv[0], kt) if key_bias is None else torch.baddbmm(key_bias, qkv[0], kt)
        a = torch.bmm(torch.softmax(s, dim=-1), qkv[2])  # [B·H, T, d_head]
        a = a.view(B, H, T, d // H).transpose(1, 2).reshape(B, T, d)
        h = self.norm1(h + self.out(a))
        f = self.ff1(h)
        f = F.gelu(f) if self.gelu else torch.relu_(f)
        return self.norm2(h + self.ff2(f))


def _linear(w: torch.Tensor, b: torch.Tensor | None) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    with torch.no_grad():
        lin.weight.copy_(w.detach())
        if b is not None:
            lin.bias.copy_(b.detach())
    return lin


def _copy_ln(ln: nn.LayerNorm) -> nn.LayerNorm:
    out = nn.LayerNorm(ln.normalized_shape, eps=ln.eps, elementwise_affine=ln.elementwise_affine,
                       bias=ln.bias is not None)
    out.load_state_dict(ln.state_dict())
    return out


def fold_tcn(tcn: nn.Module) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Fold each branch's eval BatchNorm into its conv and zero-pad all kernels to the widest one.

    Returns ``(W [F_total, C, K], b [F_total], K)`` with ``conv1d(x, W, b, padding=K//2)`` equal to the
    concatenated ``BN(conv_k(x))`` of the branches (before ReLU)."""
    ws, bs = [], []
    K = max(c.kernel_size[0] for c in tcn.convs)
    for conv, bn in zip(tcn.convs, tcn.norms):
        k = conv.kernel_size[0]
        if k % 2 == 0 or conv.padding[0] != k // 2 or conv.stride[0] != 1 or conv.dilation[0] != 1:
            raise SiftError(f"cannot fuse a conv with kernel {k}, padding {conv.padding}: odd 'same' kernels only")
        if bn.running_mean is None:
            raise SiftError("cannot fold a BatchNorm without running statistics")
        scale = (bn.weight if bn.affine else torch.ones_like(bn.running_var)) / torch.sqrt(bn.running_var + bn.eps)
        shift = bn.bias if bn.affine else torch.zeros_like(bn.running_mean)
        w = conv.weight * scale[:, None, None]
        b = ((conv.bias if conv.bias is not None else 0.0) - bn.running_mean) * scale + shift
        off = (K - k) // 2  # centre the shorter kernel: same "same"-padding alignment
        ws.append(F.pad(w, (off, K - k - off)))
        bs.append(b)
    return torch.cat(ws).detach(), torch.cat(bs).detach(), K


class SIFTInference(nn.Module):
    """Eval-only SIFTNet: ``(x [B, T, C], mask [B, T]) → (logits [B], z [B, d_model])``, same values.

    ``chunk``: traces per length bucket (None: :data:`DEFAULT_CHUNK`; 0: the whole batch at once, trimmed to its
    longest trace).
    ``int8``: dynamic int8 quantisation of the Linear layers (approximate; see module docstring)."""

    def __init__(self, net: nn.Module, *, chunk: int | None = None, int8: bool = False) -> None:
        super().__init__()
        self.chunk, self.int8 = DEFAULT_CHUNK if chunk is None else int(chunk), bool(int8)
        self.d_model = net.d_model
        if net.tcn is not None:
            W, b, K = fold_tcn(net.tcn)
            # the fused conv as a Linear over unfold-ed windows: input layout [.., C, K] (unfold appends K last)
            self.tcn: nn.Linear | None = _linear(W.reshape(W.shape[0], -1), b)
            self.K = K
        else:
            self.tcn, self.K = None, 1
        scale = net.input_scale  # folded: s·(Wx + b) + PE = (sW)x + (s·b + PE)
        self.proj = _linear(net.proj.weight * scale, None)
        self.register_buffer("proj_bias", net.proj.bias.detach().clone() * scale)
        self.register_buffer("pos_bias", _positions(64, self.d_model) + self.proj_bias, persistent=False)
        enc = net.encoder
        self.layers = nn.ModuleList(_Layer(l) for l in enc.layers) if enc is not None else nn.ModuleList()
        self.final_norm = _copy_ln(enc.norm) if enc is not None and enc.norm is not None else None
        self.score = _linear(net.pool.score.weight, net.pool.score.bias)
        lin = [m for m in net.head if isinstance(m, nn.Linear)]
        if len(lin) != 2 or not any(isinstance(m, nn.ReLU) for m in net.head):
            raise SiftError("SIFTInference expects the head Linear → ReLU → Dropout → Linear")
        self.head1, self.head2 = _linear(lin[0].weight, lin[0].bias), _linear(lin[1].weight, lin[1].bias)
        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)
        if self.int8:
            # dynamic quantisation replaces every nn.Linear by an int8-weight one (fbgemm/x86 kernels on CPU)
            import warnings

            from torch.ao.quantization import quantize_dynamic

            with warnings.catch_warnings():  # torch ≥ 2.10 marks its quantized tensor constructors deprecated
                warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated.*")
                warnings.filterwarnings("ignore", category=DeprecationWarning)
                quantize_dynamic(self, {nn.Linear}, dtype=torch.qint8, inplace=True)

    def _pos(self, T: int) -> torch.Tensor:
        if self.pos_bias.shape[0] < T:
            self.pos_bias = (_positions(T, self.d_model).to(self.proj_bias.device) + self.proj_bias)
        return self.pos_bias[:T]

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = mask.bool()
        B = x.shape[0]
        lengths = _row_extent(mask)  # last real step + 1 (so masks with holes are handled too)
        logits = x.new_empty(B)
        z = x.new_zeros(B, self.d_model)
        live = torch.nonzero(lengths > 0).squeeze(1)
        if len(live) < B:  # an all-padding trace pools to 0 (as SIFTNet's nan_to_num does)
            dead = torch.nonzero(lengths == 0).squeeze(1)
            logits[dead] = self._head(z[dead])
        if len(live) == 0:
            return logits, z
        if len(live) == B and (self.chunk <= 0 or self.chunk >= B):  # one chunk: just trim to the longest
            T = int(lengths.max())
            z = self._encode(x[:, :T], mask[:, :T])
            return self._head(z), z
        order = live[torch.argsort(lengths[live], stable=True)]
        chunk = self.chunk if self.chunk > 0 else len(order)
        for s in range(0, len(order), chunk):
            idx = order[s:s + chunk]
            T = int(lengths[idx[-1]])  # the chunk's longest trace (sorted ascending)
            zc = self._encode(x[idx, :T], mask[idx, :T])
            z[idx] = zc
            logits[idx] = self._head(zc)
        return logits, z

    def _head(self, z: torch.Tensor) -> torch.Tensor:
        return self.head2(torch.relu(self.head1(z))).squeeze(-1)

    def _encode(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        full = bool(mask.all())
        if not full:
            x = x * mask[..., None].to(x.dtype)
        if self.tcn is not None:
            p = self.K // 2
            win = F.pad(x, (0, 0, p, p)).unfold(1, self.K, 1)  # [B, T, C, K]
            h = torch.relu_(self.tcn(win.reshape(B, T, C * self.K)))
            # TCN outputs at padded steps are not zeroed: they only reach padded positions, which the
            # attention's key mask and the masked pooling ignore
        else:
            h = x
        h = self.proj(h) + self._pos(T)
        bias = None
        if not full and len(self.layers):  # key padding as an additive bias per (trace, head): [B·H, 1, T]
            H = self.layers[0].n_heads
            bias = torch.zeros(B, 1, T, dtype=h.dtype, device=h.device).masked_fill_(~mask[:, None, :], float("-inf"))
            bias = bias.repeat_interleave(H, dim=0)
        for layer in self.layers:
            h = layer(h, bias)
        if self.final_norm is not None:
            h = self.final_norm(h)
        s = self.score(h).squeeze(-1)
        if not full:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=1)  # every row has ≥ 1 real step here
        return torch.bmm(w[:, None, :], h).squeeze(1)


def _row_extent(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True of each row + 1 (0 for an all-False row)."""
    T = mask.shape[1]
    pos = torch.arange(1, T + 1, device=mask.device)
    return (mask * pos).amax(1) if T else torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)


class SIFTDetectorInference(nn.Module):
    """:class:`SIFTInference` plus the detector's channel selection and standardisation:
    ``probs(batch)`` = ``SIFTDetector(batch)`` = P(faithful), for a frozen eval snapshot of the detector."""

    def __init__(self, detector: Any, *, chunk: int | None = None, int8: bool = False) -> None:
        super().__init__()
        self.register_buffer("channel_idx", detector.channel_idx.clone(), persistent=False)
        st = detector.standardizer
        self.register_buffer("mean", st.mean.clone() if st is not None else torch.zeros(0), persistent=False)
        self.register_buffer("std", st.std.clone() if st is not None else torch.zeros(0), persistent=False)
        self.standardize = st is not None
        self.net = SIFTInference(detector.net, chunk=chunk, int8=int8)

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """P(faithful) [B] from raw channels ``x`` [B, T, C_all]."""
        x = x.index_select(-1, self.channel_idx)
        if self.standardize:
            x = (x - self.mean) / self.std
        return torch.sigmoid(self.net(x, mask)[0])

    def probs(self, batch: Any) -> torch.Tensor:
        return self(batch.x, batch.mask)


__all__: Sequence[str] = ("SIFTInference", "SIFTDetectorInference", "fold_tcn", "INT8_PROB_ATOL", "DEFAULT_CHUNK")
