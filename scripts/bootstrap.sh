#!/usr/bin/env bash
# Set up .venv: the PyTorch build for this machine, then this project (editable) with its dev extras.
# Idempotent: re-running only installs what is missing.
#
#   bash scripts/bootstrap.sh                 # uses python3
#   PYTHON=python3.12 bash scripts/bootstrap.sh
#   TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" bash scripts/bootstrap.sh
#       (pip's arguments for torch, used as given; without it, a machine where no NVIDIA GPU answers nvidia-smi gets
#        the CPU build by itself, ~200 MB instead of several GB of CUDA packages: see torch_install_args)
#   TORCH_VERSION=2.13.0 bash scripts/bootstrap.sh
#       (the default is 2.11.0 where an NVIDIA GPU answers nvidia-smi: the grading GPUs' torch, whose CUDA build
#        requires the course's triton (2.13.0's requires another, which .ci/constraints.txt refuses); 2.13.0 elsewhere,
#        whose CPU build requires no triton)

# The pip arguments that install torch here, one attempt per line, tried in order until one works. An explicit
# TORCH_PIP_ARGS wins. Where an NVIDIA GPU answers, PyPI's (CUDA) build. Elsewhere the CPU build, which PyPI does not
# have (its Linux x86-64 torch pulls the CUDA packages): pinned as +cpu, so that pip never falls back to the CUDA
# one; from a wheel pip already finds (its find-links, a local mirror), else from PyTorch's CPU index, else (neither
# reachable) PyPI's.
torch_install_args() {
  local default_torch gpu=""
  default_torch=2.13.0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; default_torch=2.11.0; fi
  local version=${TORCH_VERSION:-$default_torch}
  if [ -n "${TORCH_PIP_ARGS:-}" ]; then
    echo "torch==$version $TORCH_PIP_ARGS"
  elif [ -n "$gpu" ]; then
    echo "torch==$version"
  else
    case "$version" in *+*) ;; *) version="$version+cpu" ;; esac
    echo "torch==$version"
    echo "torch==$version --index-url https://download.pytorch.org/whl/cpu"
    echo "torch==${version%+cpu}"  # last: PyPI's build, CUDA packages and all, rather than no torch
  fi
}

# Sourced (the tests read torch_install_args): define, do nothing.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
# Triton publishes wheels for Linux (x86-64, aarch64) only: elsewhere nothing here can be installed, so say where the
# course runs instead before creating anything. (WSL reports Linux and is set up like any Linux machine.)
case "$(uname -s)" in
  Darwin | MINGW* | MSYS* | CYGWIN* | Windows_NT)
    echo "bootstrap: Triton has no wheels for $(uname -s) (Linux x86-64 and aarch64 only), so this script cannot" \
      "set up the course here. Run it in the course's Linux container instead (Docker Desktop, Podman, a VS Code" \
      "dev container or GitHub Codespaces): see docs/student-environment.md" >&2
    exit 1 ;;
esac
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # Install torch first and explicitly: left to the project's dependency range, pip would pick the newest
  # CUDA build. 2.13.0 is the version CI runs (a CPU wheel of it is on the CI machine's disk).
  installed=""
  while read -r attempt; do
    # shellcheck disable=SC2086
    if "${PIP[@]}" install $attempt; then installed=1; break; fi
    echo "bootstrap: pip install $attempt failed; trying the next source" >&2
  done < <(torch_install_args)
  if [ -z "$installed" ]; then
    echo "bootstrap: torch could not be installed (tried: $(torch_install_args | paste -sd ';' -)); set TORCH_PIP_ARGS" \
      "to pip's arguments for a source that has it (e.g. --index-url of a mirror)" >&2
    exit 1
  fi
fi
# The exact versions CI was verified with; triton is the course's, the grading GPUs' (grader/checks/runtime.py).
"${PIP[@]}" install -c .ci/constraints.txt -e '.[dev]'
.venv/bin/python -c "
import sys, numpy, torch, triton
from grader.checks import runtime
if runtime.version_note(triton.__version__):
    print(f'bootstrap: WARNING: triton {triton.__version__} was installed, not the course\'s {runtime.COURSE_TRITON}: '
          'results may differ from the grader\'s (a pip constraint or setting overrode .ci/constraints.txt?)',
          file=sys.stderr)
print(f'bootstrap: torch {torch.__version__}, triton {triton.__version__} (the course grades with triton '
      f'{runtime.COURSE_TRITON}), numpy {numpy.__version__}')
"
