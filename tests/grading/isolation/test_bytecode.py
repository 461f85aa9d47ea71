"""The bytecode the grader compiles for its sandboxed processes (grader.grading.isolation.bytecode): a sandboxed
process compiles none of torch's, triton's or the grader's modules from source (the sandbox shows the installation
read-only: a missing ``.pyc`` would be compiled in every process, never written), and a cache that cannot be
written leaves the sandboxes as they were."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import grader
from grader.grading.isolation import bwrap, bytecode
from tests.sandboxing import require_sandbox

# Run in the sandbox: import what a worker imports, counting the modules compiled from source (not read as bytecode)
_PROBE = """
import importlib._bootstrap_external as external, json, sys
sys.path.insert(0, sys.argv[1])
compiled = []
original = external.SourceLoader.source_to_code
def counted(self, data, path, *, _optimize=-1):
    compiled.append(path)
    return original(self, data, path, _optimize=_optimize)
external.SourceLoader.source_to_code = counted
import torch, triton, triton.language
from grader import exercises
exercises.all_exercises()  # what a worker and a trusted timer import
import grader.grading.isolation.worker, grader.checks.execute, grader.checks.compile_ahead, grader.speed.autotune
import grader.speed.measure, grader.speed.recorder, grader.speed.timer, grader.speed.trusted
print(json.dumps(compiled))
"""


def _compiled_from_source(tmp_path: Path, cache: Path | None) -> list[str]:
    sandbox = require_sandbox()
    binds = bwrap.worker_binds(submission=tmp_path, package=Path(grader.__file__).resolve().parent,
                               scratch=tmp_path, triton_cache=None, pycache=cache)
    argv = sandbox.command([sys.executable, "-I", *bytecode.options(cache), "-c", _PROBE, bwrap.LIB], binds=binds,
                           env={"PATH": "/usr/bin:/bin", "HOME": bwrap.SCRATCH}, cwd=bwrap.SCRATCH)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def without_bytecode(monkeypatch):
    """An installation without bytecode of its own (uv's default, images with PYTHONDONTWRITEBYTECODE), as the
    grader sees it."""
    monkeypatch.setattr(bytecode, "installation_has_bytecode", lambda: False)


def test_a_sandboxed_process_compiles_none_of_its_imports_from_source(tmp_path, without_bytecode):
    cache = bytecode.for_sandbox()
    assert cache is not None
    compiled = _compiled_from_source(tmp_path, cache)
    assert compiled == []


def test_without_the_cache_the_sandboxed_process_compiles_its_imports_itself(tmp_path, monkeypatch):
    """What the cache saves: given an empty cache folder, the same process compiles every module it imports
    (the installation's own ``.pyc``, if it has any, are not looked for under a cache prefix)."""
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    compiled = _compiled_from_source(tmp_path, empty)
    assert sum("/torch/" in path for path in compiled) > 100
    assert any(path.startswith(f"{bwrap.PACKAGE}/") for path in compiled)


def test_a_cache_that_cannot_be_written_leaves_the_sandboxes_without_it(tmp_path, monkeypatch, capsys,
                                                                       without_bytecode):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(bytecode, "_prepared", {})
    assert bytecode.for_sandbox() is None
    assert bytecode.options(None) == []
    assert "could not be compiled" in capsys.readouterr().err


def test_the_cache_holds_torch_triton_numpy_and_what_they_require_but_not_their_tests():
    folders, files = bytecode.installed_code()
    tops = {part for f in files for part in Path(f).parts if part in ("torch", "triton", "numpy", "sympy")}
    assert tops == {"torch", "triton", "numpy", "sympy"}  # sympy: torch requires it, and imports it lazily
    assert not any(part in ("test", "tests") for f in files for part in Path(f).parts)
    root = Path(grader.__file__).resolve().parents[1]
    assert not any(Path(f).resolve().is_relative_to(root / "grader") for f in files)
    assert folders == [sysconfig.get_paths()["stdlib"]]


def test_an_installation_with_its_own_bytecode_is_left_as_it_is(monkeypatch):
    """pip writes bytecode beside the sources: the sandboxes read it there, with no cache prefix (which would hide
    it for every package left out of the cache)."""
    monkeypatch.setattr(bytecode, "installation_has_bytecode", lambda: True)
    assert bytecode.for_sandbox() is None
    assert bytecode.options(None) == []


@pytest.mark.parametrize("which", ["worker", "timer"])
def test_workers_and_timers_are_started_reading_the_cache(tmp_path, monkeypatch, which, without_bytecode):
    """Both kinds of sandboxed process get the option and the cache, read-only (their start is faked here)."""
    from grader.grading.config import RunSettings
    from grader.grading.exercise_run import timer_process, workers
    from grader.grading.isolation import processes

    started: list[list[str]] = []

    class Started(Exception):
        pass

    def fake_process(argv, **kwargs):
        started.append(list(argv))
        raise Started

    monkeypatch.setattr(processes, "Process", fake_process)
    settings = RunSettings(device="cpu", secret="", random_cases=0, timeout_s=60.0, call_timeout_s=30.0,
                           memory_mb=None, speed_budget_s=1.0, workdir=tmp_path, sandbox=require_sandbox())
    with pytest.raises(Started):
        if which == "worker":
            workers.Worker(settings, tmp_path, tmp_path, None, {})
        else:
            timer_process.Timer(settings, scratch=tmp_path, arbiter=None)
    cache = bytecode.for_sandbox()
    assert cache is not None
    argv = started[0]
    assert ["-X", f"pycache_prefix={bwrap.PYCACHE}"] == argv[argv.index("-I") + 1:argv.index("-I") + 3]
    i = argv.index(bwrap.PYCACHE)
    assert argv[i - 2:i] == ["--ro-bind", str(cache)]


def test_two_checkouts_of_the_grader_package_never_share_stale_bytecode(tmp_path, monkeypatch):
    """Every checkout is shown at the same path in the sandbox: its bytecode is checked against the source's hash,
    so a module of the same size and time but other contents is compiled again (and checked again at import)."""
    import importlib.util
    import os

    monkeypatch.setattr(bytecode, "installed_code", lambda: ([], []))
    package, cache = tmp_path / "checkout", tmp_path / "cache"
    package.mkdir()
    module = package / "m.py"
    compiled = cache / "sandbox" / "lib" / "grader" / f"m.{sys.implementation.cache_tag}.pyc"
    for text in ("X = 1\n", "X = 2\n"):
        module.write_text(text)
        os.utime(module, (1_000_000, 1_000_000))
        assert bytecode._compile(cache, package, bwrap.PACKAGE) == cache
        header = compiled.read_bytes()[:16]
        assert int.from_bytes(header[4:8], "little") == 3  # hash-based, checked at each import
        assert header[8:] == importlib.util.source_hash(text.encode())


def test_an_installation_without_bytecode_for_a_module_a_worker_imports_later_gets_the_cache(tmp_path, monkeypatch):
    """Judged by modules a worker imports, some only later: the grader's own imports may have written bytecode for
    torch's first modules and none for Triton's compiler."""
    import importlib.metadata
    import importlib.util
    import py_compile
    from types import SimpleNamespace

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: SimpleNamespace(
        locate_file=lambda module: tmp_path / module))
    for _, module in bytecode.SAMPLE:
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("X = 1\n")
    assert not bytecode.installation_has_bytecode()
    for _, module in bytecode.SAMPLE[:-1]:
        py_compile.compile(str(tmp_path / module), cfile=importlib.util.cache_from_source(str(tmp_path / module)))
    assert not bytecode.installation_has_bytecode()  # Triton's compiler has none
    last = tmp_path / bytecode.SAMPLE[-1][1]
    py_compile.compile(str(last), cfile=importlib.util.cache_from_source(str(last)))
    assert bytecode.installation_has_bytecode()
