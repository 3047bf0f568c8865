#!/usr/bin/env bash
# The GPU check, in at most 8 minutes on one GPU (per-section budgets): the GPU's GEMM and HBM rates beside
# sim.dgx_h200(), each project at its GPU size (step time, MFU against the datasheet peak, the simulator's
# prediction beside it), torchrun with NCCL on every GPU, then side by side every lesson notebook in quick mode
# (each cell recorded), tests/test_gpu.py, the device guard and `simlib scaling`. Writes
# benchmarks/results/gpu_check.json.
#   bash tests/gpu_check.sh [--out PATH] [--skip notebooks ...] [--dry]
# Uses the python on PATH (or $PYTHON) with this clone's simlib. Dev extras it lacks (nbclient, ipykernel, pytest,
# ...) are named with the pip line that installs them; the sections that need them are skipped, the rest run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi || echo "gpu_check.sh: nvidia-smi not found"
"$PY" -m simlib doctor || echo "gpu_check.sh: simlib doctor failed (is torch installed? pip install -e .)"
exec "$PY" benchmarks/gpu_check.py "$@"
