"""The process handle around a worker, without the bubblewrap sandbox (test_isolation.py beside it has it): time-outs
kill the whole process group, leftover and escaped children are killed, stopping never waits on a pipe a child
keeps, output is capped, memory is limited, and the result channel survives (or reports) garbage. The processes
and their seconds are real: a test that bounds those (marked ``realtime``) leaves a loaded machine room to spare,
and stays below what the mistake it catches would take."""

from __future__ import annotations

import io
import itertools
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from grader.grading.isolation import channel, processes

from ...gates import until
from ...sandboxing import live_processes_with

SLACK_S = 60.0  # what a loaded machine may add to a run's real seconds


def _run(code: str, tmp_path: Path, **kwargs) -> processes.Outcome:
    options = {"stdin_data": b"", "cwd": str(tmp_path), "env": processes.minimal_env({}, str(tmp_path)),
               "timeout_s": 20.0, "rss_limit_bytes": None, "output_cap": 4096}
    options.update(kwargs)
    return processes.run([sys.executable, "-c", code], **options)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_dead(pid: int, what: str) -> None:
    until(lambda: not _alive(pid), f"{what} {pid} survived")


@pytest.mark.realtime
def test_timeout_kills_the_process_group_including_grandchildren(tmp_path):
    pidfile = tmp_path / "pids"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    start = time.monotonic()
    out = _run(code, tmp_path, timeout_s=5.0)
    assert out.timed_out and out.returncode is None
    # killed at its limit, not waited for: the process and its grandchild would sleep 600 s
    assert time.monotonic() - start < 5.0 + processes.WAIT_S + processes.DRAIN_S + SLACK_S
    _wait_dead(int(pidfile.read_text()), "the grandchild outlived the time-out:")


def test_children_left_running_after_a_normal_exit_are_killed(tmp_path):
    pidfile = tmp_path / "pids"
    code = (
        "import subprocess, sys\n"
        "a = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "b = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(f'{{a.pid}} {{b.pid}}')\n"
    )
    out = _run(code, tmp_path)
    assert out.returncode == 0 and not out.timed_out
    in_group, escaped = map(int, pidfile.read_text().split())
    assert out.leftover_killed == 2
    _wait_dead(in_group, "a child in the worker's process group")
    _wait_dead(escaped, "a child that called setsid (the environment token should find it)")


@pytest.mark.realtime
def test_stop_never_waits_for_a_pipe_that_an_escaped_child_keeps(tmp_path):
    """A child that leaves the session and drops its environment (only a sandbox can find it) and keeps the
    output pipes open for 120 s: the run still ends within the bounded drain time, with what was printed."""
    code = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', 'pipe-keeper' + '-fixture'],"
        " start_new_session=True, env={})\n"
        "print('parent done', flush=True)\n"
    )
    start = time.monotonic()
    try:
        out = _run(code, tmp_path)
        elapsed = time.monotonic() - start
        assert out.returncode == 0 and "parent done" in out.stdout.text()
        assert elapsed < processes.WAIT_S + processes.DRAIN_S + SLACK_S, f"stop() took {elapsed:.1f} s"
        assert live_processes_with("pipe-keeper-fixture"), "unsandboxed, such a child escapes (the sandbox's job)"
    finally:
        for pid in live_processes_with("pipe-keeper-fixture"):
            os.kill(pid, signal.SIGKILL)


def test_output_is_capped_and_counted(tmp_path):
    out = _run("import sys; sys.stdout.write('x' * 1_000_000); sys.stderr.write('e' * 10)", tmp_path,
               output_cap=1000)
    assert out.returncode == 0
    assert len(out.stdout.data) == 1000 and out.stdout.total == 1_000_000
    assert "999000 more bytes of output not kept" in out.stdout.text()
    assert out.stderr.text() == "e" * 10


@pytest.mark.realtime
def test_the_memory_watch_looks_less_often_the_more_room_is_left(tmp_path, monkeypatch):
    """Far below its limit a process is looked at about once a second (each look walks its threads); close to it,
    ten times a second (test_resident_memory_limit_kills_the_group: one past it is stopped). A loaded machine
    spaces the looks further apart, never closer."""
    assert processes.memory_poll_s(16 << 30, 2 << 30) == processes.MEMORY_POLL_MAX_S
    assert processes.memory_poll_s(16 << 30, (16 << 30) - (100 << 20)) == processes.POLL_S
    looks = []
    walk = processes.proctree.rss
    monkeypatch.setattr(processes.proctree, "rss", lambda pids: looks.append(time.monotonic()) or walk(pids))
    out = _run("import time; time.sleep(3)", tmp_path, rss_limit_bytes=16 << 30)
    assert out.returncode == 0 and not out.memory_exceeded
    gaps = [b - a for a, b in itertools.pairwise(looks)]
    assert gaps and min(gaps) > processes.MEMORY_POLL_MAX_S / 2, gaps  # about once a second, not ten times


def test_signals_are_named(tmp_path):
    out = _run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", tmp_path)
    assert out.signal_name == "SIGSEGV"


@pytest.mark.realtime
def test_resident_memory_limit_kills_the_group(tmp_path):
    code = "import time; x = bytearray(400 << 20); time.sleep(30)"
    out = _run(code, tmp_path, rss_limit_bytes=100 << 20, timeout_s=20.0)
    assert out.memory_exceeded and out.returncode is None
    assert not out.timed_out and 0 < out.elapsed_s < 20.0 + processes.WAIT_S  # killed before its time limit


def test_minimal_env_keeps_only_what_the_worker_needs(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_SECRET", "do-not-leak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nope")
    env = processes.minimal_env({"GRADER_DEVICE": "cpu"}, str(tmp_path))
    assert "GRADER_SECRET" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"] == str(tmp_path) and env["GRADER_DEVICE"] == "cpu"


def test_channel_round_trip_and_damage(tmp_path):
    path = tmp_path / "channel"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    channel.write_record(fd, {"type": "hello"})
    channel.write_record(fd, {"type": "result", "id": "a", "outputs": {"y": torch.arange(3.0)}})
    os.close(fd)
    data = path.read_bytes()

    def read_all(blob: bytes, **kw):
        stream, records = io.BytesIO(blob), []
        try:
            while (record := channel.read_record(stream, **kw)) is not None:
                records.append(record)
        except channel.ChannelError as exc:
            return records, str(exc)
        return records, None

    records, problem = read_all(data)
    assert problem is None and [r["type"] for r in records] == ["hello", "result"]
    assert torch.equal(records[1]["outputs"]["y"], torch.arange(3.0))
    torn, problem = read_all(data[:-5])
    assert len(torn) == 1 and "torn record" in problem
    garbage, problem = read_all(data + b"not a record at all")
    assert len(garbage) == 2 and "unexpected bytes" in problem
    big, problem = read_all(data, max_bytes=10)
    assert big == [] and "larger than" in problem


def test_channel_never_unpickles_arbitrary_objects(tmp_path, capfd):
    """The grader loads with weights_only: an object that would run code on load is refused."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    fd = os.open(tmp_path / "channel", os.O_WRONLY | os.O_CREAT)
    channel.write_record(fd, {"type": "result", "evil": Evil()})  # torch.save pickles os.system by name
    os.close(fd)
    with pytest.raises(channel.ChannelError, match="not valid data"):
        channel.read_record(io.BytesIO((tmp_path / "channel").read_bytes()))
    assert not marker.exists()


@pytest.mark.parametrize("value", [None, {"y": "not a tensor"}, [1, 2]])
def test_malformed_execution_records_are_rejected(value):
    from grader.grading.isolation import protocol, wire

    data = {"outputs": value, "error_kind": None} if value is not None else None
    with pytest.raises(protocol.ProtocolError):
        wire.decode({"type": "case_done", "id": "x", "execution": data})
