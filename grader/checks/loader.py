"""Find and import an exercise module from an implementation tree laid out like ``assignments/``.

Errors become :class:`LoadError` with a message a student can act on: the file is missing, it has
a syntax error (with the line; for a module made from a notebook, the cell and the line in that cell),
importing it raised, or a required function is not defined. A module is read as Python reads it: UTF-8,
unless its first or second line declares another encoding (PEP 263, ``# -*- coding: latin-1 -*-``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType

from grader.checks.spec import Exercise

# Where each notebook cell starts in a module made from a notebook (grader.grading.batch.submission writes them)
_CELL_MARKER = re.compile(r"^# --- notebook cell (\d+) ---$")


def cell_marker(cell: int) -> str:
    """The line put before notebook cell ``cell`` (counted from 1) in a module made from a notebook."""
    return f"# --- notebook cell {cell} ---"


class LoadError(Exception):
    """The student's module cannot be used; ``kind`` is "missing", "syntax", "import" or "function"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def module_path(root: str | os.PathLike, exercise: Exercise) -> Path:
    return Path(root) / exercise.name / f"{exercise.module}.py"


def load(root: str | os.PathLike, exercise: Exercise, functions: tuple[str, ...] = (), *,
         copy: str = "") -> ModuleType:
    """Import ``<root>/<exercise>/<module>.py`` under a name unique to ``root`` (so ``assignments``
    and ``solutions`` can be loaded side by side) and check it defines ``functions``. ``copy`` names another
    instance of the module, with globals (and kernel objects) of its own."""
    path = module_path(root, exercise).resolve()
    if not path.is_file():
        raise LoadError("missing", f"{exercise.name}: no file {path} (not submitted)")
    digest = hashlib.sha1(str(path.parent.parent).encode()).hexdigest()[:10]
    name = f"_grader_impl_{digest}{copy}.{exercise.name}.{exercise.module}"
    module = sys.modules.get(name)
    if module is None:
        source = path.read_bytes()
        try:
            compile(source, str(path), "exec")  # bytes: a declared encoding is honoured, as importing does
        except SyntaxError as exc:
            raise LoadError("syntax", syntax_message(path.name, source, exc)) from None
        except ValueError as exc:  # e.g. a null byte (a SyntaxError from Python 3.12 on)
            raise LoadError("syntax", f"{path.name} cannot be compiled: {exc}") from None
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # a student module may raise anything, SystemExit included
            del sys.modules[name]
            frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
            tail = "".join(frames[-3:]).rstrip()
            raise LoadError("import", f"importing {path.name} raised {type(exc).__name__}: {exc}\n{tail}") from None
    missing = [f for f in functions if not callable(getattr(module, f, None))]
    if missing:
        raise LoadError("function", f"{path.name} defines no function {', '.join(missing)}")
    problems = non_constexpr_globals(module)
    if problems:
        raise LoadError("kernel", f"{path.name}: " + "; ".join(problems))
    return module


def syntax_message(name: str, source: bytes, exc: SyntaxError) -> str:
    """What is wrong, and where: the line of the file, or the cell of the notebook and the line in that cell."""
    if exc.msg.startswith(("(unicode error)", "unknown encoding")):
        return (f"{name} cannot be read as text ({exc.msg}): save it as UTF-8, or declare its encoding on its first "
                "or second line as Python does (PEP 263), e.g. # -*- coding: latin-1 -*-")
    lines = source.decode("utf-8", errors="replace").splitlines()
    lineno = exc.lineno or 0
    for index in range(min(lineno, len(lines)) - 1, -1, -1):
        found = _CELL_MARKER.match(lines[index])
        if found:
            return (f"notebook cell {found.group(1)} has a syntax error at line {lineno - index - 1} of that cell: "
                    f"{exc.msg}")
    return f"{name} has a syntax error at line {lineno}: {exc.msg}"


def non_constexpr_globals(module: ModuleType) -> list[str]:
    """Kernels reading plain-number module globals: the interpreter accepts them, the GPU compiler does not
    ("Cannot access global variable ... from within @jit'ed function"), so say it before the student
    finds out on a GPU."""
    problems = []
    for name, obj in vars(module).items():
        fn = getattr(obj, "fn", None)
        if fn is None or not type(obj).__module__.startswith("triton.") or not hasattr(fn, "__code__"):
            continue
        for ref in fn.__code__.co_names:
            value = fn.__globals__.get(ref)
            if isinstance(value, int | float) and not isinstance(value, bool):
                problems.append(
                    f"kernel {name} reads the global {ref} = {value!r}, which the GPU compiler rejects; "
                    f"define it as {ref} = tl.constexpr({value!r})"
                )
    return problems
