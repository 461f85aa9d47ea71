#!/usr/bin/env bash
# GPU session: the staff verification on CUDA (all exercises, incl. bf16), the stubs, then each exercise's
# benchmark script. Usage (repo root, on the GPU machine): bash scripts/gpu/run_checks.sh [pytest|bench|all]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
what=${1:-all}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$what" = pytest ] || [ "$what" = all ]; then
  echo "== pytest assignments --impl solutions (CUDA, ci profile)"
  start=$(date +%s)
  python3 -m pytest -p grader.plugin assignments --impl solutions -q --hypothesis-profile ci -p no:cacheprovider \
      -m "not speed" -rfs 2>&1 | tail -25
  echo "pytest solutions: $(( $(date +%s) - start )) s"
  echo "== stubs"
  python3 -m pytest -p grader.plugin assignments -q -p no:cacheprovider -m "not speed" 2>&1 | grep -E "FAILED|passed|failed"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  echo "== bench foundation"; python3 scripts/gpu/bench_foundation.py
  [ -f scripts/gpu/check_rmsnorm_matmul.py ] && { echo "== rmsnorm/matmul"; python3 scripts/gpu/check_rmsnorm_matmul.py; }
  [ -f scripts/gpu/bench_flash_attention.py ] && { echo "== flash attention"; python3 scripts/gpu/bench_flash_attention.py; }
fi
exit 0
