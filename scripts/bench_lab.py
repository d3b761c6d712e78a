#!/usr/bin/env python3
"""Lab bring-up and teardown time: ethplus against a naive baseline.

The baseline builds the same lab (same namespaces, veth pairs, MTU, offloads
off, links up, host addresses, neighbours and routes) the way a shell script
or an early Mininet would: one `ip`/`ethtool` process per object.  Both run
in this invocation, one after the other, so machine noise hits both.

With --rootless, also ethplus without root (an unprivileged user, its labs
in a user namespace of its own): this checkout installed into a virtual
environment that user may run, and the same environment's `ethplus` run by
root, one after the other, so that the only difference is root.

    sudo python3 scripts/bench_lab.py [--labs erack-64x8,upn-512] [--no-baseline]
        [--rootless [--runs N]]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

import userenv

from dataplane.lab import labs, registry
from dataplane.model import labfile

TARGETS_S = {"erack-64x8": (10.0, 5.0), "upn-512": (60.0, None)}
BASELINE_SLOT = registry.MAX_LABS - 1


def _sh(cmds: list[list[str]]) -> None:
    for c in cmds:
        subprocess.run(c, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def baseline_up(spec) -> float:
    plan = labs.make_plan(spec, BASELINE_SLOT)
    ns = {n: registry.ns_name(spec.name, n) for n in spec.topology.nodes}
    t0 = time.perf_counter()
    for name in ns.values():
        _sh(
            [
                ["ip", "netns", "add", name],
                [
                    "ip",
                    "netns",
                    "exec",
                    name,
                    "sysctl",
                    "-q",
                    "-w",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                ],
                ["ip", "-n", name, "link", "set", "lo", "up"],
            ]
        )
    for v in plan.veths:
        a, b = v.a_ns.rsplit("/", 1)[1], v.b_ns.rsplit("/", 1)[1]
        _sh(
            [
                [
                    "ip",
                    "link",
                    "add",
                    v.a_if,
                    "netns",
                    a,
                    "address",
                    v.a_mac,
                    "mtu",
                    str(v.mtu_bytes),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    v.b_if,
                    "netns",
                    b,
                    "address",
                    v.b_mac,
                    "mtu",
                    str(v.mtu_bytes),
                ]
            ]
        )
    for node in spec.topology.nodes.values():
        name = ns[node.name]
        for p in node.ports:
            ifname = plan.ifname[node.name, p.index]
            _sh(
                [
                    [
                        "ip",
                        "netns",
                        "exec",
                        name,
                        "ethtool",
                        "-K",
                        ifname,
                        "tso",
                        "off",
                        "gso",
                        "off",
                        "gro",
                        "off",
                        "sg",
                        "off",
                        "tx",
                        "off",
                        "rx",
                        "off",
                    ],
                    ["ip", "-n", name, "link", "set", ifname, "up"],
                ]
            )
        for hp in plan.host_ports.get(node.name, []):
            _sh(
                [
                    ["ip", "-n", name, "addr", "add", f"{hp.ip}/32", "dev", hp.ifname],
                    [
                        "ip",
                        "-n",
                        name,
                        "neigh",
                        "add",
                        hp.gateway,
                        "lladdr",
                        hp.gateway_mac,
                        "dev",
                        hp.ifname,
                        "nud",
                        "permanent",
                    ],
                    [
                        "ip",
                        "-n",
                        name,
                        "route",
                        "add",
                        hp.subnet,
                        "via",
                        hp.gateway,
                        "dev",
                        hp.ifname,
                        "src",
                        hp.ip,
                        "onlink",
                    ],
                ]
            )
    return time.perf_counter() - t0


def baseline_down(spec) -> float:
    t0 = time.perf_counter()
    _sh([["ip", "netns", "del", registry.ns_name(spec.name, n)] for n in spec.topology.nodes])
    return time.perf_counter() - t0


def ethplus_cli(*args: str, cmd: list[str] | None = None) -> float:
    """Time the real command, interpreter start-up included."""
    t0 = time.perf_counter()
    subprocess.run([*(cmd or [sys.executable, "-m", "cli.main"]), *args], check=True,
                   stdout=subprocess.DEVNULL, cwd="/")  # fmt: skip
    return time.perf_counter() - t0


def rootless(names: list[str], runs: int) -> None:
    """Bring-up and teardown without root against root, the same install."""
    base = userenv.make()
    cli = str(base / "venv/bin/ethplus")
    try:
        for name in names:
            times: dict[str, list[float]] = {"root up": [], "root down": [],
                                             "rootless up": [], "rootless down": []}  # fmt: skip
            for _ in range(runs):
                for who, cmd in (("root", [cli]), ("rootless", userenv.as_user(base, [cli]))):
                    run_name = f"rl-{name}"
                    times[f"{who} up"].append(ethplus_cli("lab", "up", name, "--name", run_name,
                                                          cmd=cmd))  # fmt: skip
                    times[f"{who} down"].append(ethplus_cli("lab", "down", run_name, cmd=cmd))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{name} rootless (median of {runs}, the same install for both):")
            for what in ("up", "down"):
                r, u = med[f"root {what}"], med[f"rootless {what}"]
                print(f"  {what:5s} root {r:6.2f} s   rootless {u:6.2f} s   rootless / root "
                      f"{u / r:.2f} (target <= 1.10)", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", default="erack-64x8,upn-512")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--rootless", action="store_true", help="also without root, against root")
    ap.add_argument("--runs", type=int, default=3, help="--rootless: runs each (median)")
    args = ap.parse_args()
    labs.require_root("scripts/bench_lab.py")
    rows = []
    for name in args.labs.split(","):
        spec = labfile.load(name)
        t = spec.topology
        run_name = f"bench-{name}"
        up_s = ethplus_cli("lab", "up", name, "--name", run_name)
        down_s = ethplus_cli("lab", "down", run_name)
        bl_up = bl_down = float("nan")
        if not args.no_baseline:
            spec.name = f"bl-{name}"
            try:
                bl_up = baseline_up(spec)
            finally:
                bl_down = baseline_down(spec)
        rows.append((name, len(t.nodes), len(t.links), up_s, bl_up, down_s, bl_down))
        print(f"{name}: {len(t.nodes)} namespaces, {len(t.links)} veth pairs", flush=True)
        print(
            f"  up    ethplus {up_s:7.2f} s   baseline {bl_up:7.2f} s   "
            f"speed-up {bl_up / up_s:5.1f}x",
            flush=True,
        )
        print(
            f"  down  ethplus {down_s:7.2f} s   baseline {bl_down:7.2f} s   "
            f"speed-up {bl_down / down_s:5.1f}x",
            flush=True,
        )
        up_t, down_t = TARGETS_S.get(name, (None, None))
        if up_t:
            print(f"  target up < {up_t:g} s: {'met' if up_s < up_t else 'MISSED'}")
        if down_t:
            print(f"  target down < {down_t:g} s: {'met' if down_s < down_t else 'MISSED'}")
    if args.rootless:
        rootless(args.labs.split(","), args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
