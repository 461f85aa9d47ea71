#!/usr/bin/env bash
# Set up .venv: the PyTorch build for this machine, then this project (editable) with its dev extras.
# Idempotent: re-running only installs what is missing.
#
#   bash scripts/bootstrap.sh                 # uses python3
#   PYTHON=python3.12 bash scripts/bootstrap.sh
#   TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" bash scripts/bootstrap.sh
#       (a machine without a GPU and without a local torch wheel: the CPU build is ~200 MB instead of
#        several GB of CUDA packages)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # Install torch first and explicitly: left to the project's dependency range, pip would pick the newest
  # CUDA build. 2.13.0 is the version CI runs (a CPU wheel of it is on the CI machine's disk).
  # shellcheck disable=SC2086
  "${PIP[@]}" install "torch==${TORCH_VERSION:-2.13.0}" ${TORCH_PIP_ARGS:-}
fi
# The exact versions CI was verified with (triton 3.9 + numpy 2.4: see pyproject.toml).
"${PIP[@]}" install -c .ci/constraints.txt -e '.[dev]'
.venv/bin/python -c "import torch, triton, numpy; print(f'bootstrap: torch {torch.__version__}, triton {triton.__version__}, numpy {numpy.__version__}')"
