"""Grading through a real single-node Slurm cluster (tests/slurm/start_cluster.sh): three submissions as one job
array and a merge job get the gradebook of a local run with the same secret; the secret is nowhere Slurm
keeps the jobs; re-running the command submits only what is missing.

Where no cluster can be started (no slurm-wlm/munge, not root) the test is skipped with the reason; in CI
(``GRADER_CI_SLURM=1``, set by .ci/run) it fails instead."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from grader import cli
from grader.grading import config, slurm, status, store
from grader.grading import grade as grade_cmd

REPO = Path(__file__).resolve().parents[1]
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
