"""Which ``effectlog serve`` processes are still connected to a broker (``make kafka-down``).

Read from ``/proc`` (Linux): the TCP connections to the broker's port in ``/proc/net/tcp*``,
their socket inodes, and the processes whose file descriptors hold those sockets. Only
processes whose command line runs ``effectlog … serve`` count; other clients are left alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

PROC = Path("/proc")
_ESTABLISHED = "01"


def _sockets_to(port: int) -> set[str]:
    """Inodes of established TCP connections whose remote port is ``port``."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == _ESTABLISHED and int(remote.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def _command(pid: str) -> list[str]:
    try:
        raw = (PROC / pid / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _is_serve(command: list[str]) -> bool:
    runs_effectlog = any("effectlog" in part for part in command[:3])
    return runs_effectlog and "serve" in command


def serve_processes(port: int) -> dict[int, str]:
    """``effectlog serve`` processes connected to ``port`` on this machine: pid -> command."""
    inodes = _sockets_to(port)
    found: dict[int, str] = {}
    if not inodes:
        return found
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        command = _command(entry.name)
        if not _is_serve(command):
            continue
        try:
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            found[int(entry.name)] = " ".join(command)
    return found


def stop_processes(pids: list[int], within_s: float = 10.0) -> list[int]:
    """SIGTERM each pid and wait up to ``within_s`` for them to exit; those still running."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + within_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        if alive:
            time.sleep(0.1)
    return alive


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = PROC / str(pid) / "stat"
    try:  # a zombie (exited, not yet reaped by its parent) has stopped
        return status.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
