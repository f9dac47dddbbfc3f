#!/usr/bin/env bash
# GPU smoke test of the real stack, sized for one H200 in under 8 minutes:
#   1. install: a venv with CUDA torch, ATTUNE and the torchtitan extra
#   2. the llama3 debug model for ~30 steps on the shipped offline tokenizer and text (no hub)
#   3. `attune tune --stack torchtitan --budget-gpu-hours 0.1` on the same one-GPU recipe
# and prints the measured tokens/s/GPU and MFU of the trial, and of the campaign's baseline and best.
#
# Usage: scripts/gpu_smoke.sh            (from anywhere; work files go to $ATTUNE_SMOKE_DIR)
#   ATTUNE_SMOKE_VENV  venv to create/reuse (default .venv-gpu). If the system Python already has a
#                      CUDA torch, the venv reuses it (--system-site-packages) instead of downloading.
#   ATTUNE_SMOKE_DIR   work folder (default ./gpu-smoke)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ATTUNE_SMOKE_VENV:-.venv-gpu}
WORK=${ATTUNE_SMOKE_DIR:-$PWD/gpu-smoke}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }

step "1/3 install"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "$PY" -m venv --system-site-packages "$VENV"   # keep the image's CUDA torch
  else
    "$PY" -m venv "$VENV"
  fi
fi
# On a GPU machine PyPI's torch==2.13.0 wheel is the CUDA build (the project pins the version only).
timeout 300 "$VENV/bin/python" -m pip install -q -e '.[torchtitan]'
"$VENV/bin/python" -c 'import torch, torchtitan; assert torch.cuda.is_available(), "no CUDA"; print("torch", torch.__version__, "cuda", torch.version.cuda, "torchtitan", torchtitan.__version__)'
export PATH="$PWD/$VENV/bin:$PATH"

step "2/3 llama3 debug model, ~30 steps, offline assets"
# torchtitan's llama3_debugmodel (6 layers, dim 256, vocab 2048) as a one-GPU ATTUNE recipe.
cat > "$WORK/llama3-debug.json" <<'EOF'
{"name": "llama3-debug", "n_layers": 6, "dim": 256, "n_heads": 16, "n_kv_heads": 16, "head_dim": 16,
 "ffn_dim": 768, "vocab_size": 2048}
EOF
cat > "$WORK/llama3_debug.toml" <<EOF
name = "llama3_debugmodel-smoke"
model_spec = "$WORK/llama3-debug.json"
[cluster]
accelerator = "h200"
gpus = 1
[stack]
torch = "2.13.0"
torchtitan = "0.3.0"
[torchtitan]
module = "llama3"
config = "llama3_debugmodel"
[config]
"training.local_batch_size" = 8
"training.seq_len" = 2048
"activation_checkpoint.mode" = "selective"
"compile.enable" = false
"quantize.float8" = "none"
EOF
rc=0
timeout 240 attune trial run "$WORK/llama3_debug.toml" --steps 25 --warmup 5 --smoke-assets \
  --workdir "$WORK/trial" --json > "$WORK/trial.json" || rc=$?
python - "$WORK/trial.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"trial: {r['status']}  tokens/s/GPU {r['tokens_per_sec_per_gpu']}  MFU {r['mfu']}  "
      f"peak memory {r['peak_memory_gib']} GiB  wall {r['wall_time_s']:.0f} s  {r['gpu_hours']:.4f} GPU-h")
if r["status"] != "ok":
    print("message:", r["message"])
EOF
[ "$rc" -eq 0 ] || { echo "trial failed (exit $rc); log: $WORK/trial/train.log"; tail -n 30 "$WORK/trial/train.log" || true; exit 1; }

step "3/3 attune tune --stack torchtitan --budget-gpu-hours 0.1"
if ! attune tune --help > /dev/null 2>&1; then
  echo "attune tune is not available in this checkout: skipped"
  exit 0
fi
export ATTUNE_TORCHTITAN_SMOKE_ASSETS=1 ATTUNE_HOME="$WORK/.attune" PREFECT_HOME="$WORK/.prefect"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
timeout 420 attune tune "$WORK/llama3_debug.toml" --stack torchtitan --budget-gpu-hours 0.1 \
  --steps 10 --replicates 2 --json > "$WORK/tune.json"
python - "$WORK/tune.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for role in ("baseline", "best"):
    m = r.get(role) or {}
    print(f"{role:8}: tokens/s/GPU {m.get('tokens_per_sec_per_gpu')}  MFU {m.get('mfu')}  levers {m.get('levers', '')}")
print(f"stop: {r.get('stop_reason')}  gain {r.get('gain')}  GPU-hours {r.get('gpu_hours_used')} / {r.get('budget_gpu_hours')}")
EOF
