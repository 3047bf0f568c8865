#!/usr/bin/env bash
# The GPU check: on a machine with NVIDIA GPUs, run the GPU tests, the device guard, every lesson notebook in
# quick mode, `simlib scaling`, project 1's trainer and a GPU calibration; write benchmarks/results/gpu_check.json.
#   bash tests/gpu_check.sh [--out PATH] [--skip notebooks ...]
# Uses the python on PATH (or $PYTHON). The notebooks section needs nbval, nbformat, nbclient and ipykernel there;
# a machine without them records that section as failed and goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
nvidia-smi || echo "gpu_check.sh: nvidia-smi not found"
"$PY" -m simlib doctor
exec "$PY" benchmarks/gpu_check.py "$@"
