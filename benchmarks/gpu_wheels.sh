#!/usr/bin/env bash
# Wheels the GPU check needs that a lent GPU machine's image lacks (it has torch, numpy, pandas, matplotlib,
# scikit-learn, statsmodels, tokenizers, pytest, cloudpickle, tqdm, pyyaml: /work/.library/device/KINDS.md), for
# CPython 3.12 on x86-64 Linux, into .whl/ (.gitignore; name it in the run's carry). Run here, where pip reaches
# a package index:   bash benchmarks/gpu_wheels.sh
# On the machine:    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#                    && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# the notebooks section (nbclient runs each notebook in an ipykernel), the explorers, the finance project (arch)
NEEDED="nbclient nbformat ipykernel ipywidgets arch jupyter_client jupyter_core traitlets pyzmq tornado comm
debugpy ipython matplotlib-inline nest_asyncio platformdirs fastjsonschema jsonschema jsonschema-specifications
referencing rpds-py attrs widgetsnbextension jupyterlab_widgets decorator jedi parso pexpect ptyprocess
prompt_toolkit wcwidth stack_data executing asttokens pure_eval psutil"
for name in $NEEDED; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$name" \
    || echo "gpu_wheels.sh: no wheel for $name (the section that needs it is skipped and says so)"
done
du -sh .whl
