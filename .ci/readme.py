"""Run the README's commands for students, course staff and instructors as written, in order, and check that each
does what the README says (exit status and a line of its output). CI runs it right after the README's set-up
command (`bash scripts/bootstrap.sh`), on a clean clone:

    .venv/bin/python .ci/readme.py [--sections Students,...] [--workdir DIR] [--dry-run]

Each command runs in a fresh `bash` from the checkout's root, after the README's shell-state commands that came
before it (`source .venv/bin/activate`), exactly as pasted into one terminal. A command this script has no
expectation for is an error: a README change must say here what its new command is supposed to do. Standard
library only.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("Students", "Course staff", "Instructors")
SETUP = "bash scripts/bootstrap.sh"  # run by CI just before this script
STATE = ("source ", "cd ", "export ")  # commands that change the shell the later ones run in


@dataclass(frozen=True)
class Expect:
    codes: tuple[int, ...]
    needles: tuple[str, ...] = ()
    gpu_codes: tuple[int, ...] | None = None  # where a GPU changes the outcome
    gpu_needles: tuple[str, ...] | None = None


def _exercises(root: Path) -> list[str]:
    return sorted(p.parent.name for p in (root / "assignments").glob("*/test_*.py"))


def expectations(root: Path) -> list[tuple[str, Expect]]:
    stub = "is not implemented yet — see assignments/{}/README.md"
    every_stub = tuple(stub.format(name) for name in _exercises(root))
    needs_gpu = ("needs a CUDA GPU",)
    return [
        (r"pytest assignments/gelu", Expect((1,), (stub.format("gelu"),))),
        (r"pytest assignments/", Expect((1,), every_stub)),
        (r"pytest assignments/ --impl solutions", Expect((0,), (" passed",))),
        (r"grader list", Expect((0,), ("gelu", "flash_attention", "points of 100"))),
        (r"grader verify", Expect((0,), ("grader verify: OK",))),
        (r"grader grade solutions --out grading-out", Expect((0,), ("reports written to grading-out",))),
        (r"grader grade --regrade-errors grading-out", Expect((0,), ("reports written to grading-out",))),
        (r"grader status grading-out", Expect((0,), ("done",))),
        (r"grader grade solutions --out grading-gpus --gpus all", Expect((0,), ("reports written to grading-gpus",))),
        (r"grader release course-release --notebooks", Expect((0,), ("every stub failed with 'not implemented'",))),
        (r"grader calibrate", Expect((2,), needs_gpu, (0,), ("wrote ",))),
        (r"grader bench \S+ --impl solutions.*", Expect((2,), needs_gpu, (0,), ("roofline: copy",))),
        (r"pytest -m gpu", Expect((0,), (" skipped",), (0,), (" passed",))),
    ]


def commands(readme: str, sections: tuple[str, ...] = SECTIONS) -> list[tuple[str, str]]:
    """(section, command) for every line of the ```bash blocks under the given ## headings, comments dropped."""
    found, section, fenced = [], "", False
    for line in readme.splitlines():
        if line.startswith("## ") and not fenced:
            section = line[3:].strip()
        elif line.strip().startswith("```"):
            fenced = not fenced and line.strip() == "```bash"
        elif fenced and section in sections:
            command = re.split(r"(?:^|\s)#\s", line, maxsplit=1)[0].strip()
            if command:
                found.append((section, command))
    return found


def expectation(command: str, table: list[tuple[str, Expect]]) -> Expect:
    for pattern, expect in table:
        if re.fullmatch(pattern, command):
            return expect
    raise SystemExit(f"readme.py: no expectation for the README command {command!r}: say in .ci/readme.py what it "
                     "does (exit status and a line of its output)")


def on_gpu(root: Path) -> bool:
    probe = subprocess.run([str(root / ".venv" / "bin" / "python"), "-c",
                            "from grader.checks import runtime; print(runtime.configure().device)"],
                           cwd=root, capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        raise SystemExit(f"readme.py: .venv is not set up (run {SETUP} first):\n{probe.stderr[-2000:]}")
    return probe.stdout.strip().splitlines()[-1] == "cuda"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(ROOT), help="the checkout to run in (default: this one)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="README sections to run (comma-separated)")
    parser.add_argument("--dry-run", action="store_true", help="list the commands and what each must do; run none")
    args = parser.parse_args(argv)
    root = Path(args.workdir).resolve()
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"readme.py: unknown section(s) {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
    table = expectations(root)
    todo = commands((root / "README.md").read_text(), sections)
    if not todo:
        raise SystemExit("readme.py: found no ```bash commands in README.md")
    plan = [(section, cmd, None if cmd == SETUP or cmd.startswith(STATE) else expectation(cmd, table))
            for section, cmd in todo]
    if args.dry_run:
        for section, cmd, expect in plan:
            what = "set-up (run before)" if cmd == SETUP else "shell state" if expect is None else (
                f"exit {'/'.join(map(str, expect.codes))}, prints {' | '.join(expect.needles) or '-'}")
            print(f"[{section}] {cmd}  ->  {what}")
        return 0
    gpu = on_gpu(root)
    state: list[str] = []
    failures = []
    start = time.monotonic()
    for section, cmd, expect in plan:
        if cmd == SETUP:
            print(f"[{section}] {cmd}: the set-up command, run before this script")
            continue
        if expect is None:
            state.append(cmd)
            print(f"[{section}] {cmd}")
            continue
        codes = expect.gpu_codes if gpu and expect.gpu_codes is not None else expect.codes
        needles = expect.gpu_needles if gpu and expect.gpu_needles is not None else expect.needles
        began = time.monotonic()
        proc = subprocess.run(["bash", "-c", "\n".join(["set -e", *state, cmd])], cwd=root, capture_output=True,
                              text=True, timeout=3600)
        output = proc.stdout + proc.stderr
        missing = [n for n in needles if n not in output]
        ok = proc.returncode in codes and not missing
        print(f"[{section}] {cmd}: exit {proc.returncode} in {time.monotonic() - began:.0f} s — "
              + ("as the README says" if ok else "NOT as the README says"), flush=True)
        if not ok:
            tail = "\n    ".join(output.strip().splitlines()[-25:])
            failures.append(f"{cmd}: exit {proc.returncode} (expected {'/'.join(map(str, codes))})"
                            + (f", missing {missing}" if missing else "") + f"\n    {tail}")
    print(f"readme.py: {len(plan)} commands in {time.monotonic() - start:.0f} s"
          + (f" on a {'GPU' if gpu else 'CPU'}; {len(failures)} not as the README says" if failures else
             f" on a {'GPU' if gpu else 'CPU'}; every one as the README says"))
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
