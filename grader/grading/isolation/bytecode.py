"""Compiled bytecode for the sandboxed processes (workers and trusted timers).

A sandbox shows the Python installation read-only, so a module whose ``.pyc`` is missing there is compiled from
source by every process that imports it, and the ``.pyc`` is never written. Installations made without bytecode
are common (``uv``'s default; container images with ``PYTHONDONTWRITEBYTECODE``): there each worker and timer
compiled torch and triton from source, and the modules imported later (CUDA's start, Triton's compiler) inside a
case, while a turn alone waited for it (docs/performance.md measures it).

The grader (trusted, outside any sandbox) compiles that bytecode once into a cache of its own
(``~/.cache/grader/pycache/<tag>``), which the sandboxes see read-only at ``/sandbox/pycache`` and Python reads
through ``-X pycache_prefix`` (:func:`options`): the standard library, the installed distributions torch, triton,
numpy, the grader's own and those the grader has imported, with all they require, and the grader package as the
sandbox shows it. Later gradings find it compiled and only check it. The grader package's bytecode is checked
against its source's hash (every checkout is shown at the same path), the rest against the source's time and size.
Where the cache cannot be written, the sandboxes go without it. Where the installation has its own bytecode (pip's
default) none of this is done: a cache prefix hides the bytecode beside the sources, so a package left out of the
cache would be compiled again in every process.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

from grader.grading.isolation import bwrap

COMPILE_TIMEOUT_S = 600.0
WORKER_DISTRIBUTIONS = ("torch", "triton", "numpy")  # what a worker imports, with what they require
SAMPLE = (("torch", "torch/__init__.py"), ("torch", "torch/_dynamo/__init__.py"), ("triton", "triton/__init__.py"),
          ("triton", "triton/compiler/compiler.py"))
# Folders of the standard library and of distributions that no worker imports (tests, GUIs, examples), and the
# installed packages inside the standard library's folder (some installations keep them there: only those needed count)
SKIP = ("test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages", "dist-packages")

_COMPILE = """
import compileall, concurrent.futures, functools, importlib.util, json, os, py_compile, sys
job = json.load(sys.stdin)
skip = set(job["skip"])
paths = list(job["files"])
for folder in job["folders"]:
    for here, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in skip and d != "__pycache__"]
        paths += [os.path.join(here, n) for n in names if n.endswith(".py")]
one = functools.partial(compileall.compile_file, quiet=2)  # skips a file whose bytecode is up to date
if job["workers"] > 1 and len(paths) > 100:
    with concurrent.futures.ProcessPoolExecutor(job["workers"]) as pool:
        list(pool.map(one, paths, chunksize=64))
else:
    list(map(one, paths))
# The grader package, as the sandbox shows it: two checkouts of it share these names, so their bytecode says which
# source it was compiled from (its hash, checked at each import), not a time and a size that both could have
for source, shown in job["mapped"]:
    target = importlib.util.cache_from_source(shown)
    with open(source, "rb") as f:
        digest = importlib.util.source_hash(f.read())
    try:
        with open(target, "rb") as f:
            header = f.read(16)
    except OSError:
        header = b""
    checked_hash = int.from_bytes(header[4:8], "little") == 3  # PEP 552: hash-based, checked at import
    if header[:4] == importlib.util.MAGIC_NUMBER and checked_hash and header[8:] == digest:
        continue
    py_compile.compile(source, cfile=target, dfile=shown, doraise=False, quiet=2,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
"""

_lock = threading.Lock()
_prepared: dict[tuple[str, str], Path | None] = {}


def grader_cache() -> Path:
    """The grader's folder in the user's cache (``$XDG_CACHE_HOME/grader``, else ``~/.cache/grader``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "grader"


def cache_dir() -> Path:
    """Where the bytecode is kept: the user's cache folder, per Python version."""
    return grader_cache() / "pycache" / sys.implementation.cache_tag


def for_sandbox() -> Path | None:
    """The bytecode cache for sandboxed processes (see :func:`prepared`); None where the installation has its own
    bytecode (the sandboxes read it where it is: a cache prefix would hide it)."""
    import grader

    if installation_has_bytecode():
        return None
    return prepared(Path(grader.__file__).resolve().parent, bwrap.PACKAGE)


def options(cache: Path | None) -> list[str]:
    """The interpreter's options that make a sandboxed process read its bytecode from ``cache`` (none without)."""
    return ["-X", f"pycache_prefix={bwrap.PYCACHE}"] if cache is not None else []


def prepared(package: Path, package_in_sandbox: str) -> Path | None:
    """The bytecode cache, compiled (once per grader process) for what the sandboxed processes import; None where it
    could not be written or compiled (they then compile their imports themselves, as without it). ``package``: the
    grader package, shown in the sandbox at ``package_in_sandbox``."""
    key = (str(package), package_in_sandbox)
    with _lock:  # the first worker of the batch compiles; the others wait for it
        if key not in _prepared:
            _prepared[key] = _compile(cache_dir(), package, package_in_sandbox)
        return _prepared[key]


def _compile(cache: Path, package: Path, package_in_sandbox: str) -> Path | None:
    folders, files = installed_code()
    mapped = [(str(source), os.path.join(package_in_sandbox, source.relative_to(package).as_posix()))
              for source in sorted(package.rglob("*.py"))]
    job = {"folders": folders, "files": files, "mapped": mapped, "skip": list(SKIP),
           "workers": min(16, os.cpu_count() or 1)}
    try:
        cache.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-I", "-X", f"pycache_prefix={cache}", "-c", _COMPILE],
                              input=json.dumps(job), capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"grader: the sandboxes' bytecode could not be compiled ({type(exc).__name__}: {exc}); each worker "
              "compiles its imports itself", file=sys.stderr)
        return None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        print(f"grader: the sandboxes' bytecode could not be compiled ({said}); each worker compiles its imports "
              "itself", file=sys.stderr)
        return None
    return cache


def installation_has_bytecode() -> bool:
    """Whether the installation keeps its own bytecode beside its sources (pip's default), which the sandboxes then
    read as it is. Judged by modules a worker imports, some only later (the grader's own imports may have written
    bytecode for the others)."""
    for distribution, module in SAMPLE:
        try:
            source = importlib.metadata.distribution(distribution).locate_file(module)
        except importlib.metadata.PackageNotFoundError:
            continue
        if os.path.exists(source) and not os.path.exists(importlib.util.cache_from_source(str(source))):
            return False
    return True


def installed_code() -> tuple[list[str], list[str]]:
    """What a worker may import outside the grader package: the standard library (a folder), and the Python files
    (but their tests) of the installed distributions that torch, triton, numpy and the grader require (followed),
    and of those this process has imported (what the others import where it is installed, such as pytest)."""
    names = list(WORKER_DISTRIBUTIONS)
    owners = importlib.metadata.packages_distributions()
    for module in list(sys.modules):
        names += owners.get(module.partition(".")[0], [])
    import grader

    own = str(Path(grader.__file__).resolve().parent) + os.sep  # compiled as the sandbox shows it instead
    files = []
    for dist in _needed(tuple(dict.fromkeys(names))):
        for path in dist.files or ():
            if path.suffix == ".py" and not any(part in SKIP for part in path.parts[:-1]):
                located = str(dist.locate_file(path))
                if not os.path.realpath(located).startswith(own):
                    files.append(located)
    return [sysconfig.get_paths()["stdlib"]], files


def _needed(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` and those they require, followed (optional extras left out)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[key] = dist
        for requirement in dist.requires or ():
            if "extra ==" not in requirement:
                todo += re.findall(r"^[A-Za-z0-9._-]+", requirement)
    return list(found.values())
