"""Free generation with vLLM's offline engine (GPU only; optional: ``pip install 'sift[vllm]'``).

Prompts go in as token ids (never re-tokenised text) and the exact generated ids come back, a trailing eos
removed, as with :class:`sift.lm.generation.HFBackend`. Each request carries its own seed, so a prompt's sample
does not depend on its batch. vLLM's sampler is not transformers', so sampled (not greedy) continuations differ
between the two backends for the same seed; verification and hidden states stay in transformers either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from sift.errors import SiftError
from sift.lm.generation import SEED_MASK

MISSING = "the vllm backend needs vLLM and a GPU: pip install 'sift[vllm]'"


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise SiftError(MISSING) from e
    return vllm


class VLLMBackend:
    """``generate(prompts, ...) -> list[list[int]]`` through ``vllm.LLM``; a GGUF file is served from its
    converted safetensors folder (:func:`sift.lm.loading.resolve_model_path`). ``device`` is accepted for symmetry
    with the hf backend; vLLM places the model itself. ``batch_size`` caps vLLM's concurrent sequences."""

    kind = "vllm"

    def __init__(self, model_name_or_path: str, *, eos_id: int | Sequence[int] | None = None,
                 dtype: str | None = None, device: str = "cuda", batch_size: int | None = None, **llm_kwargs):
        vllm = _import_vllm()
        from sift.lm.loading import resolve_model_path

        self._vllm = vllm
        self.path = resolve_model_path(model_name_or_path)
        kwargs = dict(model=self.path, tokenizer=self.path, dtype=dtype or "auto", seed=0)
        if batch_size:
            kwargs["max_num_seqs"] = int(batch_size)
        kwargs.update(llm_kwargs)
        self.llm = vllm.LLM(**kwargs)
        if eos_id is None:
            eos_id = self.llm.get_tokenizer().eos_token_id
        self.eos = [int(eos_id)] if isinstance(eos_id, int) else [int(e) for e in eos_id]

    def _params(self, *, max_new_tokens: int, do_sample: bool, temperature: float, top_p: float,
                seed: int | None):
        common = dict(max_tokens=int(max_new_tokens), stop_token_ids=list(self.eos), skip_special_tokens=False,
                      detokenize=False)
        if not do_sample:
            return self._vllm.SamplingParams(temperature=0.0, **common)
        return self._vllm.SamplingParams(temperature=float(temperature), top_p=float(top_p),
                                         seed=int(seed) & SEED_MASK, **common)

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0,
                 seeds: Sequence[int] | None = None) -> list[list[int]]:
        """New ids per prompt (a trailing eos removed), in the order of ``prompts``."""
        if do_sample and (seeds is None or len(seeds) != len(prompts)):
            raise SiftError("sampling needs one seed per prompt (seeds=...)")
        if not prompts:
            return []
        inputs = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        params = [self._params(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                               top_p=top_p, seed=seeds[i] if do_sample else None) for i in range(len(prompts))]
        outputs = self.llm.generate(prompts=inputs, sampling_params=params, use_tqdm=False)
        out: list[list[int]] = []
        for o in outputs:
            ids = [int(t) for t in o.outputs[0].token_ids]
            if ids and ids[-1] in self.eos:
                ids.pop()
            out.append(ids)
        return out
