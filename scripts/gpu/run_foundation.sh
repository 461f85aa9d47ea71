#!/usr/bin/env bash
# One GPU session for the foundation issue: pytest on CUDA (solutions, stubs) and the timing table.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
echo "== pytest assignments/gelu assignments/softmax --impl solutions (CUDA, ci profile)"
time python3 -m pytest -p grader.plugin assignments/gelu assignments/softmax --impl solutions -q \
    --hypothesis-profile ci -p no:cacheprovider 2>&1 | tail -15
echo "== stubs"
python3 -m pytest -p grader.plugin assignments/gelu assignments/softmax -q -p no:cacheprovider 2>&1 | tail -4
echo "== timing"
python3 scripts/gpu/bench_foundation.py
