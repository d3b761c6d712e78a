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


def find_pids(lab: str) -> list[int]:
    """Every fabric process of lab, recorded or not (a SIGKILL can orphan one)."""
    return [
        int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and is_fabric(int(e.name), lab)
    ]


def is_fabric(pid: int, lab: str) -> bool:
    """Is pid (still) the fabric process of lab, and not a recycled pid?"""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"dataplane.lab.fabric" in argv and lab.encode() in argv
