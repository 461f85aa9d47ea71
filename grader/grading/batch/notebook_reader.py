"""Reading a student's notebook within a memory and time bound.

A notebook is JSON that nbformat parses into Python objects and validates against its schema: a 55 MB notebook (cell
outputs, mostly) costs gigabytes and minutes that way. The grader reads only the code cells' sources and the
``grader`` metadata, so a child process parses the file under an address-space limit and a CPU-time limit, drops
every cell's outputs and attachments before validating, and hands back just what the grader reads. A notebook that
needs more is that submission's problem, told as such; the grader's own process never holds it.

    python -m grader.grading.batch.notebook_reader NOTEBOOK  # {"cells", "grader"}, {"error"} or {"too_big"}
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

MEMORY_BYTES = 2 << 30  # the child's address space: Python, nbformat and jsonschema take ~0.3 GiB of it
CPU_S = 120  # the child's CPU time
WALL_S = 180.0


class NotebookError(ValueError):
    """The notebook cannot be read: the message says why, naming the file."""


def read(path: Path) -> dict[str, Any]:
    """``{"cells": [{"cell_type", "source"}...], "grader": {...}}`` of the notebook at ``path``, read in a bounded
    child process; :class:`NotebookError` if it is malformed or needs more than the bounds."""
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_S, CPU_S))

    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(path)], capture_output=True, timeout=WALL_S,
                              preexec_fn=limits, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise NotebookError(f"notebook {path.name} took more than {WALL_S:.0f} s to read (clear its outputs before "
                            "handing it in)") from None
    try:
        found = json.loads(done.stdout)
    except ValueError:
        found = None
    if isinstance(found, dict) and "error" in found:
        raise NotebookError(str(found["error"]))
    if isinstance(found, dict) and found.get("too_big"):
        raise NotebookError(_too_big(path.name))
    if done.returncode != 0 or not isinstance(found, dict):
        if b"MemoryError" in done.stderr or done.returncode in (-9, 137):
            raise NotebookError(_too_big(path.name))
        if done.returncode in (-24, 152):  # SIGXCPU
            why = f"took more than {CPU_S} s of CPU time to read"
        else:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"status {done.returncode}"]
            why = f"could not be read ({tail[0][:200]})"
        raise NotebookError(f"notebook {path.name} {why} (clear its outputs before handing it in)")
    return found


def _parse(path: Path) -> dict[str, Any]:
    """In the child: the code cells and the grader metadata, outputs dropped before validation."""
    import warnings

    import nbformat

    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotebookError(f"notebook {path.name} is not valid: it is not JSON ({_first_line(exc)})") from None
    if isinstance(data, dict):
        for cell in data.get("cells", []) if isinstance(data.get("cells"), list) else []:
            if isinstance(cell, dict):
                if "outputs" in cell:
                    cell["outputs"] = []
                cell.pop("attachments", None)
    with warnings.catch_warnings():  # missing cell ids: nbformat warns, and validate() says what matters
        warnings.simplefilter("ignore")
        try:
            nb = nbformat.reads(json.dumps(data), as_version=4)
        except MemoryError:
            raise
        except Exception as exc:  # nbformat raises NotJSONError, ValueError, KeyError, ... on bad files
            why = _first_line(exc) or type(exc).__name__
            raise NotebookError(f"notebook {path.name} is not valid: {why}") from None
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as exc:
            where = "/".join(str(p) for p in getattr(exc, "absolute_path", []) or [])
            raise NotebookError(f"notebook {path.name} is not valid: {_first_line(exc)}"
                                + (f" (at {where})" if where else "")) from None
    cells = []
    for cell in nb.cells:
        source = cell.get("source", "")
        cells.append({"cell_type": cell.get("cell_type"),
                      "source": "".join(source) if isinstance(source, list) else str(source)})
    meta = nb.metadata.get("grader", {}) if isinstance(nb.metadata, dict) else {}
    return {"cells": cells, "grader": meta if isinstance(meta, dict) else {}}


def _too_big(name: str) -> str:
    bound = f"{MEMORY_BYTES >> 30} GiB" if MEMORY_BYTES % (1 << 30) == 0 else f"{MEMORY_BYTES >> 20} MiB"
    return (f"notebook {name} needs more than {bound} of memory to read (its code cells are that large; outputs do "
            "not count)")


def _first_line(exc: Exception) -> str:
    message = getattr(exc, "message", None) or str(exc)
    return str(message).strip().splitlines()[0] if str(message).strip() else ""


def main(argv: list[str]) -> int:
    try:
        found = _parse(Path(argv[0]))
    except NotebookError as exc:
        found = {"error": str(exc)}
    except OSError as exc:
        found = {"error": f"notebook {Path(argv[0]).name} could not be read: {exc.strerror or exc}"}
    except MemoryError:
        found = {"too_big": True}
    sys.stdout.write(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
