"""The ``cot_routing`` organism's mechanism: a latent-gated low-rank adapter on the queries of a few heads.

Under ``cot_routing`` (:data:`sift.lm.latent.MECHANISM_KINDS`) nothing is added to the residual stream. At the
CoT's positions only (from the first CoT token up to, not including, the answer line), the queries of the adapted
heads become ``q + z · (x A) B``: the latent ``z`` changes *where those heads look* while the CoT is written, and
so what the CoT-time computation reads. The answer line sees no latent; it must read the decision from what the
CoT's states hold. Training (:func:`sift.organism.train.train_organism` with ``mechanism_kind=cot_routing``)
equalises the class means of the CoT states, so no static direction carries ``z``.

The adapter is saved beside the weights in ``mechanism_adapter.safetensors`` (tensors ``A`` ``[layers, width,
rank]`` and ``B`` ``[layers, rank, width]``, and ``layers``/``heads`` index tensors); loading never unpickles.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sift.errors import SiftError

ADAPTER_FILE = "mechanism_adapter.safetensors"


class QueryAdapter(torch.nn.Module):
    """Low-rank query deltas for ``heads`` of each of ``layers`` (the same heads in every adapted layer)."""

    def __init__(self, width: int, n_heads: int, layers: tuple[int, ...], heads: tuple[int, ...], rank: int = 4,
                 init_scale: float = 0.0):
        super().__init__()
        if not layers or not heads:
            raise SiftError("a query adapter needs at least one layer and one head")
        if width % n_heads:
            raise SiftError(f"width {width} is not a multiple of {n_heads} heads")
        if any(not 0 <= h < n_heads for h in heads):
            raise SiftError(f"adapter heads {heads} outside 0..{n_heads - 1}")
        self.layers, self.heads, self.rank = tuple(layers), tuple(heads), rank
        hd = width // n_heads
        mask = torch.zeros(width)
        for h in heads:
            mask[h * hd:(h + 1) * hd] = 1.0
        self.register_buffer("column_mask", mask)
        self.A = torch.nn.Parameter(torch.randn(len(layers), width, rank) / width ** 0.5)
        self.B = torch.nn.Parameter(torch.randn(len(layers), rank, width) * init_scale)

    def delta(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """The query delta of adapted layer number ``k`` (not the model's layer index) for inputs ``x [..., W]``."""
        return (x.to(self.A.dtype) @ self.A[k]) @ self.B[k] * self.column_mask

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        save_file({"A": self.A.detach().float().contiguous(), "B": self.B.detach().float().contiguous(),
                   "layers": torch.tensor(self.layers), "heads": torch.tensor(self.heads)},
                  str(Path(folder) / ADAPTER_FILE))


def load_adapter(folder: str | Path, n_heads: int) -> QueryAdapter | None:
    """The adapter saved in an organism folder (None when the folder has none); a malformed file is named."""
    path = Path(folder) / ADAPTER_FILE
    if not path.exists():
        return None
    from safetensors.torch import load_file

    t = load_file(str(path))
    missing = {"A", "B", "layers", "heads"} - set(t)
    if missing:
        raise SiftError(f"{path}: missing tensors {sorted(missing)}")
    A, B = t["A"].float(), t["B"].float()
    if A.ndim != 3 or B.ndim != 3 or A.shape[0] != B.shape[0] or A.shape[2] != B.shape[1] or A.shape[1] != B.shape[2]:
        raise SiftError(f"{path}: A {tuple(A.shape)} and B {tuple(B.shape)} are not [layers, width, rank] and "
                        f"[layers, rank, width]")
    ad = QueryAdapter(A.shape[1], n_heads, tuple(t["layers"].tolist()), tuple(t["heads"].tolist()), A.shape[2])
    if len(ad.layers) != A.shape[0]:
        raise SiftError(f"{path}: {len(ad.layers)} layers named but A holds {A.shape[0]}")
    with torch.no_grad():
        ad.A.copy_(A)
        ad.B.copy_(B)
    return ad


def query_modules(model: torch.nn.Module, layers: tuple[int, ...]) -> list[torch.nn.Module]:
    """The module whose output holds layer ``l``'s queries in its first ``width`` columns, per adapted layer
    (GPT-2: the fused ``c_attn``, queries first; Llama: ``q_proj``)."""
    out = []
    for layer in layers:
        for name in (f"transformer.h.{layer}.attn.c_attn", f"model.layers.{layer}.self_attn.q_proj"):
            try:
                out.append(model.get_submodule(name))
                break
            except AttributeError:
                continue
        else:
            raise SiftError(f"cot_routing adapter: the model has no query projection for layer {layer} "
                            f"(organism families: gpt2, llama)")
    return out


def register_adapter_hooks(model: torch.nn.Module, adapter: QueryAdapter, gate) -> list:
    """Hooks adding ``gate() [B, T]`` (the row's ``z`` at CoT positions, 0 elsewhere) × the adapter's delta to each
    adapted layer's queries; returns the handles. ``gate()`` returning None leaves the queries alone."""
    handles = []
    for k, mod in enumerate(query_modules(model, adapter.layers)):
        def hook(_m, inp, out, k=k):
            g = gate()
            if g is None:
                return None
            d = (adapter.delta(k, inp[0]) * g.to(adapter.A.dtype)[..., None]).to(out.dtype)
            width = d.shape[-1]
            if out.shape[-1] == width:
                return out + d
            return torch.cat([out[..., :width] + d, out[..., width:]], dim=-1)

        handles.append(mod.register_forward_hook(hook))
    return handles
