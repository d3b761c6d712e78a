#!/usr/bin/env python3
"""ETH+ NIC goodput, in one run:

(a) one endpoint pair over erack-8x4 at the lab's time scale, as a fraction
    of the nominal capacity of its planes (oblivious and adaptive spraying);
(b) unshaped, between two namespaces joined by one veth (MTU 4200, offloads
    off): our engine against kernel TCP (iperf3), goodput and whole-machine
    CPU per GB moved.

    sudo python3 scripts/bench_nic.py [--size-mib 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from dataplane.lab import core, cpu, kernel, labs
from dataplane.lab.nic import Endpoint
from dataplane.lab.registry import NETNS_DIR
from dataplane.model import labfile
from dataplane.report import stats

MTU = 4200


def transfer(a: Endpoint, b: Endpoint, size: int, tag: int) -> tuple[float, float]:
    src = np.ones(size, dtype=np.uint8)
    dst = np.empty(size, dtype=np.uint8)
    dst.fill(0)  # touch every page now: page faults are not the transport's cost
    c0, t0 = cpu.machine_busy_s(), time.perf_counter()
    hr, hs = b.post_recv(a.rank, tag, dst), a.post_send(b.rank, tag, src)
    a.wait(hs, 600)
    b.wait(hr, 600)
    dt, cpu_s = time.perf_counter() - t0, cpu.machine_busy_s() - c0
    assert np.array_equal(src, dst)
    return size * 8 / dt, cpu_s


def part_a(size: int) -> None:
    spec = labfile.load("erack-8x4")
    spec.name = "bench-nic"
    rec = labs.up(spec)
    try:
        k = rec["time_scale"]
        nominal = 4 * 400e9
        for adaptive in (False, True):
            a, b = Endpoint("bench-nic", "h0", adaptive=adaptive), Endpoint("bench-nic", "h1")
            try:
                transfer(a, b, 4 << 20, 1)  # warm up
                bps, _ = transfer(a, b, size, 2)
            finally:
                a.close()
                b.close()
            st = labs.control("bench-nic", {"op": "stats"})["stats"]
            t = stats.totals(st)
            late_ms = (
                max(
                    p["late_max_ns"] for sw in st["switches"].values() for p in sw["ports"].values()
                )
                / 1e6
            )
            mode = "adaptive" if adaptive else "oblivious"
            print(
                f"(a) erack-8x4, 4 planes, {mode:9s}: {bps / 1e6:7.1f} Mbit/s real = "
                f"{bps * k / 1e12:.3f} Tbit/s nominal = {bps * k / nominal:.3f} of the planes' "
                f"1.6 Tbit/s (target 0.95; payload/wire ceiling "
                f"{4096 / core.wire_bytes(4096 + 54):.3f}); pacer: {t['late_frames']} frames "
                f">100 us late, worst {late_ms:.1f} ms",
                flush=True,
            )
    finally:
        labs.down("bench-nic")


def _pair_record() -> dict:
    """A two-host record for Endpoint: h0 and h1 on one veth, each the other's next hop."""
    macs = {"h0": "02:cc:00:00:00:00", "h1": "02:cc:00:00:00:01"}
    ips = {"h0": "198.18.0.1", "h1": "198.18.0.2"}
    nodes = [
        {
            "name": h,
            "role": "host",
            "kind": "accelerator",
            "index": i,
            "ports": [
                {
                    "node": h,
                    "index": 0,
                    "link": f"w{i}",
                    "peer": "sw",
                    "ifname": f"ethpc{h}",
                    "plane": 0,
                    "ip": ips[h],
                    "mac": macs[h],
                }
            ],
        }
        for i, h in enumerate(("h0", "h1"))
    ]
    # a stand-in switch whose "port" towards each host has the other host's MAC
    nodes.append(
        {
            "name": "sw",
            "role": "switch",
            "kind": "plane",
            "index": 0,
            "ports": [
                {
                    "node": "sw",
                    "index": 0,
                    "link": "w0",
                    "peer": "h0",
                    "ifname": "-",
                    "plane": 0,
                    "mac": macs["h1"],
                },
                {
                    "node": "sw",
                    "index": 1,
                    "link": "w1",
                    "peer": "h1",
                    "ifname": "-",
                    "plane": 0,
                    "mac": macs["h0"],
                },
            ],
        }
    )
    return (
        {
            "time_scale": 1.0,
            "nic": {"encapsulation": "udp"},
            "namespaces": {h: str(NETNS_DIR / f"ethp-bnic-{h}") for h in ("h0", "h1")},
            "topology": {
                "base_rtt_ns": 50_000,
                "nodes": nodes,
                "links": [
                    {"name": f"w{i}", "params": {"rate_bps": 100_000_000_000}} for i in range(2)
                ],
            },
        },
        macs,
        ips,
    )


def part_b(size: int, reps: int = 3) -> None:
    rec, macs, ips = _pair_record()
    ns = rec["namespaces"]
    kernel.delete_namespaces(ns.values())
    kernel.create_namespaces(ns.values(), str(NETNS_DIR))
    try:
        kernel.create_veths(
            [kernel.VethSpec(ns["h0"], "ethpch0", macs["h0"], ns["h1"], "ethpch1", macs["h1"], MTU)]
        )
        for h, other in (("h0", "h1"), ("h1", "h0")):
            kernel.configure_namespace(ns[h], "bench-nic", [f"ethpc{h}"], [])
            subprocess.run(
                [
                    "ip",
                    "-n",
                    os.path.basename(ns[h]),
                    "addr",
                    "add",
                    f"{ips[h]}/24",
                    "dev",
                    f"ethpc{h}",
                ],
                check=True,
            )
            subprocess.run(
                [
                    "ip",
                    "-n",
                    os.path.basename(ns[h]),
                    "neigh",
                    "replace",
                    ips[other],
                    "lladdr",
                    macs[other],
                    "dev",
                    f"ethpc{h}",
                    "nud",
                    "permanent",
                ],
                check=True,
            )
        ratios = []
        for rep in range(reps):
            ours, tcp = _one_b(rec, ns, ips, size)
            ratios.append(tcp[1] / ours[1])
            print(
                f"(b) unshaped veth, MTU {MTU}, run {rep + 1}: ethplus {ours[0] / 1e9:.2f} Gbit/s,"
                f" {ours[1]:.2f} CPU-s/GB; kernel TCP {tcp[0] / 1e9:.2f} Gbit/s, "
                f"{tcp[1]:.2f} CPU-s/GB; ethplus / TCP goodput per CPU-second "
                f"{tcp[1] / ours[1]:.2f}x",
                flush=True,
            )
        ratios.sort()
        print(
            f"(b) median ethplus / TCP goodput per CPU-second: {ratios[len(ratios) // 2]:.2f}x "
            "(target >= 1.0)"
        )
    finally:
        kernel.delete_namespaces(ns.values())


def _one_b(rec: dict, ns: dict, ips: dict, size: int) -> tuple:
    a, b = Endpoint("x", "h0", rec=rec), Endpoint("x", "h1", rec=rec)
    try:
        transfer(a, b, 4 << 20, 1)
        bps, cpu_s = transfer(a, b, size, 2)
    finally:
        a.close()
        b.close()
    ours = (bps, cpu_s / (size / 1e9))
    h1 = os.path.basename(ns["h1"])
    srv = subprocess.Popen(
        ["ip", "netns", "exec", h1, "iperf3", "-s", "-1", "-B", ips["h1"]],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    c0 = cpu.machine_busy_s()
    h0 = os.path.basename(ns["h0"])
    out = subprocess.run(
        ["ip", "netns", "exec", h0, "iperf3", "-c", ips["h1"], "-n", str(size * 4), "-J"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    cpu_s = cpu.machine_busy_s() - c0
    srv.wait(10)
    tcp_bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
    return ours, (tcp_bps, cpu_s / (size * 4 / 1e9))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=64)
    args = ap.parse_args()
    labs.require_root("scripts/bench_nic.py")
    print(f"CPU time from: {cpu.source()}")
    size = args.size_mib << 20
    part_a(size)
    part_b(size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
