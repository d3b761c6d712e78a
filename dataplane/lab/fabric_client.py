"""Talking to a lab's fabric process (fabric.py) from outside it: its
control socket, its log, whether a pid is it.  Pure Python: the lab, the
job and the CLI use it without loading the switches' C core."""

from __future__ import annotations

import json
import os
import socket

from dataplane.lab import registry

SOCKET_NAME = "fabric.sock"


def socket_path(lab: str) -> str:
    return str(registry.lab_dir(lab) / SOCKET_NAME)


def log_path(lab: str) -> str:
    return str(registry.lab_dir(lab) / "fabric.log")


def request(lab: str, req: dict, timeout_s: float = 10.0) -> dict:
    """Send one request to a lab's fabric; raises OSError if it does not answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(socket_path(lab))
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


IDENTITY_NAME = "fabric.pid"  # in the lab's directory: the fabric's own word of who it is


def record_self(lab: str) -> None:
    """Written by the fabric as it starts: its pid and start time, so that a
    fabric whose creator was killed before recording it is still found by
    what the lab's own directory holds."""
    pid = os.getpid()
    path = registry.lab_dir(lab) / IDENTITY_NAME
    tmp = path.with_suffix(f".{pid}")
    tmp.write_text(f"{pid} {registry.process_start(pid)}\n")
    os.replace(tmp, path)


def recorded(lab: str, journal_pid: int = 0, journal_start: int = 0) -> list[tuple[int, int]]:
    """The (pid, start time) pairs the lab's records name as its fabric:
    the journal's, and the fabric's own file."""
    out = [(journal_pid, journal_start)] if journal_pid else []
    try:
        pid, start = (int(x) for x in (registry.lab_dir(lab) / IDENTITY_NAME).read_text().split())
    except (OSError, ValueError):
        return out
    if (pid, start) not in out:
        out.append((pid, start))
    return out


def find_pids(lab: str, journal_pid: int = 0, journal_start: int = 0) -> list[int]:
    """The live fabric processes of lab that its records name (recorded),
    each checked by is_fabric.  Never a scan of the machine's processes:
    another user's lab of the same name runs a process that looks alike."""
    return [
        pid for pid, start in recorded(lab, journal_pid, journal_start)
        if is_fabric(pid, lab, start)
    ]  # fmt: skip


def _ns_ids(pid: int | str) -> tuple[int, int] | None:
    """The (user, mount) namespaces pid lives in, or None if we may not look."""
    try:
        return tuple(os.stat(f"/proc/{pid}/ns/{ns}").st_ino for ns in ("user", "mnt"))  # type: ignore[return-value]
    except OSError:
        return None


def is_fabric(pid: int, lab: str, start: int = 0) -> bool:
    """Is pid (still) lab's fabric: the process that started at start (0:
    a record from before start times were kept), running the fabric module
    for this lab name, in this process's own user and mount namespaces (a
    user's rootless lab of the same name is not root's, nor root's the
    user's)?"""
    if pid <= 0 or (start and registry.process_start(pid) != start):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    if b"dataplane.lab.fabric" not in argv or lab.encode() not in argv:
        return False
    mine = _ns_ids("self")
    return mine is not None and _ns_ids(pid) == mine
