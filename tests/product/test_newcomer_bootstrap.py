"""scripts/bootstrap.sh picks the torch build by itself: PyPI's CUDA build where an NVIDIA GPU answers ``nvidia-smi``,
else the CPU build, pinned as ``+cpu``, from a wheel pip already finds, then PyTorch's CPU index (PyPI's CUDA wheel
only where neither is reachable); an explicit ``TORCH_PIP_ARGS`` wins. A fake ``nvidia-smi`` and a fake
``.venv/bin/python`` stand in: nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _path_with(tmp_path: Path, nvidia_smi: str | None) -> str:
    """A PATH whose nvidia-smi exits with ``nvidia_smi`` ("0": a GPU answers, "9": a driver without a GPU), or has
    none; the rest of the PATH holds no nvidia-smi either way."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        (fake / "nvidia-smi").write_text(f"#!/bin/sh\necho 'GPU 0: NVIDIA H100'\nexit {nvidia_smi}\n")
        (fake / "nvidia-smi").chmod(0o755)
    for tool in ("bash", "paste", "dirname", "uname", "cat"):
        if (found := shutil.which(tool)) and not (fake / tool).exists():
            (fake / tool).symlink_to(found)
    return str(fake)


def _torch_args(tmp_path: Path, nvidia_smi: str | None, **env: str) -> list[str]:
    done = subprocess.run(["bash", "-c", f"source {ROOT / 'scripts' / 'bootstrap.sh'} && torch_install_args"],
                          env={"PATH": _path_with(tmp_path, nvidia_smi), **env}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("nvidia_smi", [None, "9"])
def test_without_an_nvidia_gpu_the_cpu_build_is_pinned(tmp_path, nvidia_smi):
    # the CPU build first (a local wheel, then PyTorch's CPU index); PyPI's CUDA build only where neither is reachable
    assert _torch_args(tmp_path, nvidia_smi) == ["torch==2.13.0+cpu", f"torch==2.13.0+cpu {CPU_INDEX}",
                                                 "torch==2.13.0"]
    assert _torch_args(tmp_path, nvidia_smi, TORCH_VERSION="2.12.0") == [
        "torch==2.12.0+cpu", f"torch==2.12.0+cpu {CPU_INDEX}", "torch==2.12.0"]


def test_with_an_nvidia_gpu_pypis_build_of_the_grading_gpus_torch(tmp_path):
    assert _torch_args(tmp_path, "0") == ["torch==2.11.0"]


@pytest.mark.parametrize("nvidia_smi", [None, "0"])
def test_explicit_pip_args_win(tmp_path, nvidia_smi):
    assert _torch_args(tmp_path, nvidia_smi, TORCH_PIP_ARGS="--index-url https://mirror/simple") == [
        f"torch=={'2.11.0' if nvidia_smi else '2.13.0'} --index-url https://mirror/simple"]


FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls"
case "$*" in
  "-c import torch") exit 1 ;;  # torch is not installed yet
  *"install torch==2.13.0+cpu") exit 1 ;;  # no local CPU wheel: pip finds none
esac
exit 0
"""


def test_bootstrap_falls_back_to_pytorchs_cpu_index_before_the_cuda_build(tmp_path):
    copy = tmp_path / "course"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "bootstrap.sh", copy / "scripts" / "bootstrap.sh")
    python = copy / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    done = subprocess.run(["bash", "scripts/bootstrap.sh"], cwd=copy, env={"PATH": _path_with(tmp_path, None)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installs = [line for line in (python.parent / "calls").read_text().splitlines() if " install " in line]
    assert [i.split(" install ", 1)[1] for i in installs] == [
        "torch==2.13.0+cpu", f"torch==2.13.0+cpu {CPU_INDEX}", "-c .ci/constraints.txt -e .[dev]"]
    assert "install torch==2.13.0+cpu failed; trying the next source" in done.stderr
