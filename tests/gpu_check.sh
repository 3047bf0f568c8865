#!/usr/bin/env bash
# The GPU check, in at most 9 minutes on one GPU (per-section budgets, each 30 % over its work): the GPU's GEMM
# rates by shape and HBM beside the simulator's preset of this part, each project at its GPU size (step time, MFU
# against the datasheet's dense peak, the prediction beside it), the same GPT in a plain torch loop (compile,
# fused AdamW) with its MFU beside the course's, torchrun with NCCL on every GPU, then side by side the notebooks
# that reach a GPU (lesson 05b's GPU cells among them; --all-notebooks for every one), tests/test_gpu.py, the
# device guard and `simlib scaling`. Writes benchmarks/results/gpu_check.json (never replaced by a run without a
# GPU: that one goes to gpu_check.no_gpu.json).
#   bash tests/gpu_check.sh [--out PATH] [--skip notebooks ...] [--all-notebooks] [--dry]
# Uses the python on PATH (or $PYTHON) with this clone's simlib. Dev extras it lacks (nbclient, ipykernel, pytest,
# ...) are named with the pip line that installs them; the sections that need them are skipped, the rest run.
# On a machine with no package index, carry them as wheels: `bash benchmarks/gpu_wheels.sh` here fills .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi || echo "gpu_check.sh: nvidia-smi not found"
"$PY" -m simlib doctor || echo "gpu_check.sh: simlib doctor failed (is torch installed? pip install -e .)"
exec "$PY" benchmarks/gpu_check.py "$@"
