"""Grading through a real single-node Slurm cluster (tests/slurm/start_cluster.sh): three submissions as one job
array and a merge job get the gradebook of a local run with the same secret; the secret is nowhere Slurm
keeps the jobs; re-running the command submits only what is missing.

Where no cluster can be started (no slurm-wlm/munge, not root) the test is skipped with the reason; in CI
(``GRADER_CI_SLURM=1``, set by .ci/run) it fails instead."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from grader import cli
from grader.grading import config
from grader.grading.batch import slurm
from grader.grading.commands import grade as grade_cmd
from grader.grading.commands import status
from grader.grading.results import store

REPO = Path(__file__).resolve().parents[3]
START = REPO / "tests" / "slurm" / "start_cluster.sh"
REQUIRED = os.environ.get("GRADER_CI_SLURM") == "1"

pytestmark = pytest.mark.slow


def _answers(conf: str) -> bool:
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env={**os.environ, "SLURM_CONF": conf},
                          capture_output=True, text=True, timeout=30)
    return done.returncode == 0 and any(s in done.stdout for s in ("idle", "mixed", "allocated"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """SLURM_CONF of a cluster that answers: the one .ci/run started, else one of our own."""
    given = os.environ.get("SLURM_CONF")
    if given and shutil.which("sinfo") and _answers(given):
        yield Path(given).parent
        return
    why = None
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        why = "Slurm is not installed (apt-get install -y slurm-wlm munge)"
    elif os.geteuid() != 0:
        why = "starting a Slurm cluster needs root (slurmd runs jobs as their user)"
    folder = tmp_path_factory.mktemp("slurm")
    if why is None:
        done = subprocess.run(["bash", str(START), str(folder)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            why = f"the single-node cluster did not start: {(done.stderr or done.stdout)[-1500:]}"
    if why is not None:
        if REQUIRED:
            pytest.fail(f"GRADER_CI_SLURM=1 but {why}")
        pytest.skip(why)
    os.environ["SLURM_CONF"] = str(folder / "slurm.conf")
    try:
        yield folder
    finally:
        subprocess.run(["bash", str(START), "--stop", str(folder)], timeout=60)
        os.environ.pop("SLURM_CONF", None)


def _class(tmp: Path) -> list[str]:
    shutil.copytree(REPO / "solutions", tmp / "ada")
    shutil.copytree(REPO / "tests" / "submissions" / "wrong_dtype", tmp / "grace")
    shutil.copytree(REPO / "tests" / "submissions" / "nans", tmp / "linus")
    return [str(tmp / n) for n in ("ada", "grace", "linus")]


def _wait(out: Path, entry: dict) -> None:
    slurm.wait(out, slurm.Submitted(entry["batch"], entry["array_job"], entry["merge_job"], Path(entry["tasks_file"])))


def test_a_slurm_batch_grades_like_a_local_one_and_keeps_the_secret(cluster, tmp_path, monkeypatch, capsys):
    subs = _class(tmp_path / "class")
    secret = "slurm-" + secrets.token_hex(12)
    local = tmp_path / "local"
    grade_cmd.grade(subs, out=local, options=config.GradeOptions(exercises=("gelu",), random_cases=0, secret=secret))

    out = tmp_path / "out"
    monkeypatch.setenv("GRADER_SECRET", secret)  # the usual way to give it: it must not reach Slurm
    command = ["grade", *subs, "--out", str(out), "--exercises", "gelu", "--random", "0", "--slurm",
               "--cpus-per-task", "1", "--time-limit", "00:10:00"]
    assert cli.main(command) == 0
    assert "submitted 3 exercise run(s) of 3 submission(s) as Slurm job array" in capsys.readouterr().err
    (entry,) = slurm.batch_jobs(out)

    # What Slurm keeps of the jobs while they are in the system: their scripts and environments.
    kept = [p for p in (cluster / "state").rglob("*") if p.is_file() and p.name in ("script", "environment")]
    assert {p.name for p in kept} == {"script", "environment"}, "the jobs left the system before they were read"
    environments = [p.read_bytes() for p in kept if p.name == "environment"]
    assert all(b"PATH=" in env and b"GRADER_SECRET=" not in env for env in environments)
    for path in [*kept, *(p for p in out.rglob("*") if p.is_file() and p.stat().st_mode & 0o004)]:
        assert secret.encode() not in path.read_bytes(), f"the secret is in {path}"
    assert all(secret not in " ".join(argv) for argv in entry["sbatch"])
    assert (out / store.SECRET_FILE).stat().st_mode & 0o077 == 0

    _wait(out, entry)
    assert (out / "grades.csv").read_text() == (local / "grades.csv").read_text()
    assert (out / store.CLASS_REPORT_HTML).is_file()
    states = status.collect(out)
    assert states["counts"]["done"] == 3, states

    # the same command again: nothing is left, nothing is submitted
    assert cli.main(command) == 0
    assert "every exercise run is graded already" in capsys.readouterr().err
    assert len(slurm.batch_jobs(out)) == 1

    # a lost result: only that submission goes to Slurm again
    (out / "students" / "linus" / "state" / "gelu.json").unlink()
    cell = status.collect(out)["students"]["linus"]["gelu"]
    assert cell["state"] == "failed" and "ended without a result (log:" in cell["detail"], cell
    assert cli.main([*command, "--wait"]) == 0
    jobs = slurm.batch_jobs(out)
    assert len(jobs) == 2 and jobs[1]["tasks"] == 1
    assert (out / "grades.csv").read_text() == (local / "grades.csv").read_text()


# ------------------------------------------------------------------------------------------ without a cluster

FAKE_SBATCH = """#!/bin/bash
# records how it was called, answers a job id
n=$(( $(ls "$RECORD" | wc -l) + 100 ))
{ printf '%s\\n' "$@"; echo ---; env; } > "$RECORD/$n"
echo "$n;cluster"
"""


def test_the_course_file_sets_the_slurm_defaults_and_the_command_line_overrides_them(tmp_path):
    course = config.load_course()
    assert config.slurm_settings(course, {}).device == "cpu"
    assert config.slurm_settings(course, {"gres": "gpu:h100:1"}).device == "cuda"
    assert config.slurm_settings(course, {"extra_args": ["--gpus-per-task=1"]}).device == "cuda"
    overlay = tmp_path / "course.toml"
    overlay.write_text('[slurm]\npartition = "gpu"\nmax_parallel = 8\n')
    settings = config.slurm_settings(config.load_course(overlay), {"max_parallel": 2, "partition": None})
    assert (settings.partition, settings.max_parallel, settings.time_limit) == ("gpu", 2, "02:00:00")
    overlay.write_text("[slurm]\nmax_paralel = 8\n")
    with pytest.raises(config.CourseError, match=r"unknown key.*max_paralel"):
        config.load_course(overlay)
    overlay.write_text('[slurm]\nmax_parallel = "8"\n')
    with pytest.raises(config.CourseError, match="max_parallel must be int"):
        config.load_course(overlay)


def test_one_array_longest_first_and_a_merge_job_without_the_secret(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from grader import exercises
    from grader.grading.batch.scheduler import Task

    bin_dir, record = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    record.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RECORD", str(record))
    secret = "the-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("GRADER_SECRET", secret)
    gelu, fa = exercises.get("gelu"), exercises.get("flash_attention")
    tasks = [Task("amy", gelu, SimpleNamespace(source=Path("/s/amy")), estimate_s=20.0),
             Task("bo", gelu, SimpleNamespace(source=Path("/s/bo")), estimate_s=20.0),
             Task("bo", fa, SimpleNamespace(source=Path("/s/bo")), estimate_s=150.0)]
    settings = config.slurm_settings(config.load_course(), {
        "partition": "gpu", "gres": "gpu:1", "time_limit": "00:30:00", "max_parallel": 4, "mem": "32G",
        "extra_args": ["--account=cs336"]})
    out = tmp_path / "out"
    submitted = slurm.submit(out, tasks, settings=settings, secret=secret)
    assert (submitted.array_job, submitted.merge_job) == ("100", "101")
    array, merge = ((record / n).read_text().split("---\n") for n in ("100", "101"))
    args = array[0].splitlines()
    assert {"--array=0-1%4", "--partition=gpu", "--gres=gpu:1", "--time=00:30:00", "--mem=32G",
            "--account=cs336", "--parsable"} <= set(args)
    assert f"--output={out}/staff/slurm/logs/%A_%a.log" in args and args[-1].endswith("batch-1.sh")
    assert "--dependency=afterany:100" in merge[0].splitlines() and merge[0].splitlines()[-1].endswith("merge-1.sh")
    entries = json.loads(submitted.tasks_file.read_text())["students"]
    assert [(e["student"], e["exercises"]) for e in entries] == [("bo", ["gelu", "flash_attention"]), ("amy", ["gelu"])]
    script = (out / "staff" / "slurm" / "batch-1.sh").read_text()
    assert 'grade-task' in script and '--index "$SLURM_ARRAY_TASK_ID"' in script
    for text in (*array, *merge, script, (out / "staff" / "slurm" / "jobs.json").read_text()):
        assert secret not in text and "GRADER_SECRET=" not in text
    assert slurm.batch_jobs(out)[0]["array_job"] == "100"
