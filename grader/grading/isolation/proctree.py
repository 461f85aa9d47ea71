"""Where a worker's processes are, read from Linux's /proc: its process group, everything below it, the members
of its PID namespace, and how much memory and CPU time they hold. :mod:`.processes` watches and kills with these."""

from __future__ import annotations

import os


def group_members(pgid: int) -> list[int]:
    """The live processes of the process group ``pgid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            pids.append(int(entry))
    return pids


def children(pid: int) -> list[int]:
    """The children of ``pid``'s main thread."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (the children of each of their threads)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo.extend(int(p) for p in f.read().split())
            except (OSError, ValueError):
                continue
    return found


def set_niceness(pids: list[int], nice: int) -> None:
    """Set the CPU niceness of every thread of ``pids`` (Linux keeps it per thread). Lowering it needs root (or
    CAP_SYS_NICE): where that is refused, nothing changes."""
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                os.setpriority(os.PRIO_PROCESS, int(task), nice)
            except (OSError, ValueError):
                continue


def pid_namespace(pid: int) -> str | None:
    """The PID namespace ``pid`` lives in (None where it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def pid_namespace_of_fd(fd: int) -> str | None:
    """The PID namespace a namespace file descriptor of this process refers to."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def namespace_members(namespace: str) -> list[tuple[int, int]]:
    """(pid here, pid in the namespace) of every live process of the PID namespace ``namespace``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or pid_namespace(int(entry)) != namespace:
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if status.get("State", "").strip().startswith("Z"):
            continue
        inner = status.get("NSpid", entry).split()
        found.append((int(entry), int(inner[-1])))
    return found


def rss(pids: list[int]) -> int:
    """Resident bytes of ``pids``."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) ``pids`` have used, with those of the children each has waited for (a compiler
    run by the student's process, say): summed over a whole live tree, every process of it counts once."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rfind(b")") + 2 :].split()
            total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            continue
    return total / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK")
