"""Collectives through real labs, over every transport; `ethplus bench`'s
output, JSON and CSV; supervision of ranks; argument errors."""

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import jsonschema
import pytest
from conftest import RUN_ID, ethplus, fabric_pids, lab_namespaces
from labtools import if_stats, module_lab

from dataplane.lab import governor, labs, registry
from dataplane.model import catalog
from dataplane.model.catalog import COLLECTIVES, bus_factor
from dataplane.report import fidelity
from dataplane.run import bench, job
from dataplane.run.job import Job, JobError, Plan

pytestmark = pytest.mark.root
MiB = 1 << 20


erack = module_lab("bn", "erack-8x4", name_only=True)


clos = module_lab("bn", "clos-16", name_only=True)


def _job(lab: str, transport_name: str, collective: str, sizes: list[int], **kw) -> dict:
    plan = Plan(lab=lab, transport=transport_name, collective=collective, sizes=sizes,
                iters=1, warmup=0, **kw)  # fmt: skip
    return Job(plan, registry.load_lab(lab)).run()


# 1 element, an odd count that no world size divides, a few MiB, and 64 MiB
# (a whole NIC window of 4 KiB packets) for all-reduce; 16 MiB for the rest
# keeps the suite in its budget (test_nic moves 64 MiB messages themselves).
SIZES = [4, 4 * 1001, 3 * MiB + 4, 64 * MiB]


def _sizes(collective: str) -> list[int]:
    return SIZES if collective == "all-reduce" else [*SIZES[:-1], 16 * MiB]


@pytest.mark.parametrize("transport_name", catalog.available())
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_collective_is_exact_on_erack(erack, transport_name, collective):
    sizes = _sizes(collective)
    res = _job(erack, transport_name, collective, sizes, uneven=collective == "all-to-all")
    assert [r["size"] for r in res["rows"]] == sizes
    assert [r["wrong"] for r in res["rows"]] == [0] * len(sizes)
    # by default the eight ranks share as many processes as the machine has
    # CPUs: the pids the ranks' own processes reported
    assert len({r["pid"] for r in res["ranks"]}) == min(8, os.cpu_count() or 1)
    if transport_name != "tcp":
        # the collectives' steps ran in the NIC engines, not from Python
        assert sum(r["counters"]["scheds_run"] for r in res["ranks"]) > 0


@pytest.mark.parametrize("transport_name", catalog.available())
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_collective_is_exact_on_clos(clos, transport_name, collective):
    # (64 MiB all-reduces run on erack above; 8 MiB here keeps the suite in its budget)
    sizes = [4, 4 * 1001, 8 * MiB] if collective == "all-reduce" else [4, 4 * 1001, 2 * MiB + 4]
    res = _job(clos, transport_name, collective, sizes, root=5)
    assert res["world"] == 16
    assert len({r["pid"] for r in res["ranks"]}) == min(16, os.cpu_count() or 1)
    assert [r["wrong"] for r in res["rows"]] == [0] * len(sizes)


@pytest.mark.parametrize(
    "dtype,op,algo",
    [("bfloat16", "max", "halving-doubling"), ("float16", "sum", "ring"), ("int32", "min", "ring")],
)
def test_types_and_operators_on_a_lab(erack, dtype, op, algo):
    res = _job(erack, "ethplus", "all-reduce", [2, 4 * 999, MiB + 2], dtype=dtype, op=op, algo=algo)
    assert [r["wrong"] for r in res["rows"]] == [0, 0, 0]


def _rows(stdout: str) -> list[list[str]]:
    """The table's rows: the only lines that start with a number, as in
    nccl-tests' output (a fidelity line that did once broke a parser)."""
    return [ln.split() for ln in stdout.splitlines() if re.match(r"\s*\d", ln)]


def test_bench_output_json_and_csv(erack, tmp_path):
    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    r = ethplus(
        "bench",
        "all-gather",
        "--lab",
        erack,
        "--transport",
        "tcp",
        "--sizes",
        "4K:64K",
        "--factor",
        "4",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--json",
        str(js),
        "--csv",
        str(cs),
    )
    assert r.returncode == 0, r.stderr
    header = next(ln for ln in r.stdout.splitlines() if "#wrong" in ln)
    assert header.lstrip("#").split() == list(bench.COLUMNS)
    rows = _rows(r.stdout)
    assert [int(x[0]) for x in rows] == [4096, 16384, 65536]
    for x in rows:
        size, count, dtype, redop, t_us, alg, bus, wrong, pacing = x
        assert int(count) == int(size) // 4 and dtype == "float32" and redop == "none"
        assert float(t_us) > 0 and int(wrong) == 0 and pacing in ("ok", "behind")
        assert float(alg) == pytest.approx(int(size) / float(t_us) / 1e3, rel=0.02, abs=0.01)
    assert "# Avg bus bandwidth" in r.stdout
    result = json.loads(js.read_text())
    jsonschema.validate(result, json.loads(bench.SCHEMA_PATH.read_text()))
    f = bus_factor("all-gather", result["world"])
    for row in result["rows"]:
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * f)
        # its timed iterations' busbw, each rank's own as the row's time is
        # the slowest rank's own: the mean lies between them, however the
        # ranks left the barrier (CI once saw it 1.6% above the job's range)
        lo, hi = row["busbw_range_GBps"]
        assert lo <= hi and lo * (1 - 1e-9) <= row["busbw_GBps"] <= hi * (1 + 1e-9), row
        # k held still: the fabric clock's nominal time is real / k (to its 1 ns grain)
        k = result["lab"]["time_scale"]
        assert row["time_us"] == pytest.approx(row["time_real_us"] / k, rel=1e-3)
    with open(cs) as fh:
        table = list(csv.DictReader(fh))
    assert [int(t["size"]) for t in table] == [4096, 16384, 65536]
    assert result["fidelity"]["links"] and "not_time_scaled" in result["fidelity"]
    assert any("not time-scaled" in n for n in result["fidelity"]["not_time_scaled"])


def test_a_rows_range_holds_its_mean_when_the_ranks_left_the_barrier_apart():
    """A row's time is the slowest rank's own; its range must be of each
    rank's own iterations too.  Rank 1 left the timing barrier 5 us late and
    its iterations were short: over the job's ends (the old range) both
    iterations took 6 us, longer than the row's 5.5 us mean, and the mean's
    busbw lay above the range (as CI saw once, by 1.6%)."""
    per_rank = [
        {"size": 1 << 20, "count": 1 << 18, "wrong": 0, "t0": 0.0, "t1": 11e-6,
         "ends": [1e-6, 11e-6], "n0": 0.0, "n1": 11e-6, "nends": [1e-6, 11e-6]},
        {"size": 1 << 20, "count": 1 << 18, "wrong": 0, "t0": 5e-6, "t1": 12e-6,
         "ends": [6e-6, 12e-6], "n0": 5e-6, "n1": 12e-6, "nends": [6e-6, 12e-6]},
    ]  # fmt: skip
    j = Job.__new__(Job)  # _row reads the plan's iterations alone
    j.plan = Plan(collective="all-gather", sizes=[1 << 20], iters=2, lab="none", transport="tcp")
    row = j._row(per_rank)
    assert row["time_nominal_s"] == pytest.approx(5.5e-6)
    assert row["rank_iters_range_s"] == pytest.approx([1e-6, 10e-6])
    spec = bench.Spec(collective="all-gather", transport="tcp", sizes=[1 << 20]).validate()
    r = bench.nominal_row(row, spec, world=2, k=1.0)
    lo, hi = r["busbw_range_GBps"]
    assert lo <= r["busbw_GBps"] <= hi, r


def test_a_sample_is_the_stats_counters_of_every_port(erack):
    """A job's samples (one C call per switch) read the same counters as the
    full stats, for every port, after traffic."""
    _job(erack, "ethplus", "all-reduce", [MiB])
    s = job.fabric_sample(erack)
    st = job.fabric_stats(erack)  # after: counters only grow (but the queue)
    want = {
        f"{sw}:{c['peer']}": [c[f] for f in fidelity.SAMPLE_FIELDS]
        for sw, x in st["switches"].items()
        for c in x["ports"].values()
    }
    assert set(s["ports"]) == set(want) and len(want) == 32  # 8 hosts x 4 planes
    moving = [i for i, f in enumerate(fidelity.SAMPLE_FIELDS) if f != "q_bytes"]
    for port, row in want.items():
        assert all(s["ports"][port][i] <= row[i] for i in moving), port
    assert sum(row[0] for row in s["ports"].values()) > 8 * MiB  # tx_bytes: the all-reduce
    again = job.fabric_sample(erack, s)
    assert again["ports"]._index is s["ports"]._index  # the names, once per job
    assert again["k"] == st["time_scale"] and again["t"] > s["t"]
    # the fabric's CPU when asked and once answered: a job's window runs from
    # the end of its first stats request to the start of its second, so the
    # requests' own netlink queries are not counted as the job's
    st2 = job.fabric_stats(erack)
    assert st["cpu_s"] < st["cpu_s_done"] <= st2["cpu_s"] < st2["cpu_s_done"]
    assert st["frames_cpu_s"] <= st2["frames_cpu_s"]


def test_bench_qps_reaches_the_roce_engines(erack, tmp_path):
    """--qps sets the queue pairs per pair of ranks (it was once parsed and
    dropped): the run records it, and the engines say they ran that many."""
    js = tmp_path / "q.json"
    r = ethplus("bench", "all-reduce", "--lab", erack, "--transport", "roce", "--qps", "2",
                "--sizes", "64K", "--iters", "1", "--warmup", "0", "--json", str(js))  # fmt: skip
    assert r.returncode == 0, r.stderr
    result = json.loads(js.read_text())
    assert result["qps"] == 2
    notes = " ".join(result["transport_config"]["notes"])
    assert "2 QP(s) per pair of ranks" in notes, notes


def _erack_file(tmp_path, name: str, edits: dict[str, str] | None = None):
    """erack-8x4's lab file, named name (and with edits: old -> new text),
    written to tmp_path/lab.toml."""
    src = open("netns-labs/erack-8x4.toml").read().replace("[lab]", f'[lab]\nname = "{name}"', 1)
    for old, new in (edits or {}).items():
        src = src.replace(old, new)
    f = tmp_path / "lab.toml"
    f.write_text(src)
    return f


def test_bench_brings_a_lab_file_up_and_down(tmp_path):
    name = f"{RUN_ID}-bf"
    f = _erack_file(tmp_path, name)
    r = ethplus("bench", "broadcast", "--lab", str(f), "--sizes", "1M", "--iters", "1")
    assert r.returncode == 0, r.stderr
    # one size; a governed run prints it again if it ran again at a larger k
    # (behind, or moved in its k check: a "# k check" line says so)
    rows = _rows(r.stdout)
    assert {row[0] for row in rows} == {"1048576"}
    assert len(rows) == 1 or "ran again" in r.stdout or "# k check" in r.stderr
    assert name not in ethplus("lab", "ls").stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_run_removes_the_lab_the_bench_brought_up(tmp_path, sig):
    """SIGTERM, or SIGINT even from a parent that left it ignored (a script's
    background job), in the middle of a bench on a lab file: the run ends
    with one line saying so, and the lab, its fabric and the job's workers
    are gone."""
    name = f"{RUN_ID}-bs{int(sig)}"
    f = _erack_file(tmp_path, name)
    p = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "bench", "all-reduce", "--lab", str(f), "--sizes", "64M",
         "--iters", "20", "--no-check"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        _mid_run_worker(name, min(8, os.cpu_count() or 1), "h0")  # the default's rank hosts
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
        if lab_namespaces(name):
            ethplus("lab", "down", name)
    assert p.returncode == 128 + sig, err  # as a shell reports the signal
    last = err.strip().splitlines()[-1]
    assert f"interrupted by {signal.Signals(sig).name}" in last and name in last, err
    assert all(ln.startswith("# ") for ln in err.strip().splitlines()[:-1]), f"noise: {err}"
    assert not lab_namespaces(name)
    assert fabric_pids(name) == {} and not _workers(name)


def _workers(lab: str) -> dict[int, str]:
    return fabric_pids(lab, "dataplane.run.worker")


def _node_of(worker_pid: int) -> str:
    """A worker's node: its argv is ... dataplane.run.worker SOCK LAB NODE NS."""
    argv = open(f"/proc/{worker_pid}/cmdline").read().split("\0")
    return argv[argv.index("dataplane.run.worker") + 3]


def _rx_bytes(pid: int) -> int:
    """Bytes the interfaces of process pid's network namespace have received."""
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            rows = [line.split(":", 1) for line in f.readlines()[2:]]
    except OSError:
        return 0
    return sum(int(cols.split()[0]) for name, cols in rows if name.strip() != "lo")


def _netns_inode(pid: int) -> int:
    """Which network namespace process pid is in (0: it is gone)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return 0


def _mid_run_worker(lab: str, processes: int, node: str, into_bytes: int = 16 * MiB) -> int:
    """Once a job's worker processes are all up and node has received
    into_bytes of its collective (not a fixed time: on a loaded machine the
    ranks' set-up alone can take seconds): the pid of the worker whose
    (first) rank is node."""
    deadline = time.monotonic() + 60
    while len(_workers(lab)) < processes and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = next(pid for pid in _workers(lab) if _node_of(pid) == node)
    while _netns_inode(pid) in (_netns_inode(os.getpid()), 0) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the worker is in its node's namespace
    start = _rx_bytes(pid)
    while (
        _rx_bytes(pid) - start < into_bytes
        and _netns_inode(pid)  # (a worker gone: nothing to wait for)
        and time.monotonic() < deadline + 60
    ):
        time.sleep(0.05)
    return pid


def _kill_mid_bench(lab: str, processes: int, node: str, *extra: str) -> tuple[int, str, float]:
    """A long bench with node's worker process killed mid-collective: its exit
    status, its stderr, and the seconds from the kill to its end."""
    p = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "bench", "all-reduce", "--lab", lab, "--sizes", "64M",
         "--iters", "20", "--no-check", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        victim = _mid_run_worker(lab, processes, node)
        t_kill = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        _, err = p.communicate(timeout=30)
        return p.returncode, err, time.monotonic() - t_kill
    finally:
        p.kill()


def test_a_killed_worker_fails_the_run_naming_its_rank(erack):
    rc, err, elapsed = _kill_mid_bench(erack, 8, "h3", "--ranks-per-host", "1")
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert "rank 3 (h3)" in last and "signal 9" in last, err
    assert all(ln.startswith("# ") for ln in err.strip().splitlines()[:-1]), f"noise: {err}"
    assert elapsed < 15
    assert not _workers(erack), "workers outlived the job"


@pytest.mark.parametrize("args,expect", [
    (["bench", "gather", "--lab", "x"], "unknown collective 'gather'"),
    (["bench", "all-reduce", "--lab", "x", "--transport", "udp"], "unknown transport 'udp'"),
    (["bench", "all-reduce", "--lab", "x", "--sizes", "64M:8K"], "out of order"),
    (["bench", "all-reduce", "--lab", "x", "--sizes", "8Q"], "is not a size"),
    (["bench", "all-reduce", "--lab", "x", "--dtype", "float64"], "unknown data type 'float64'"),
    (["bench", "all-reduce", "--lab", "x", "--sizes", "2"], "smaller than one float32"),
    (["bench", "all-to-all", "--lab", "x", "--algo", "halving-doubling"], "no algorithm"),
    (["bench", "broadcast", "--lab", "x", "--algo", "in-network"],
     "broadcast has no algorithm 'in-network' (expected one of ring, tree, auto)"),
    (["bench", "all-reduce", "--lab", "ethp-no-such-lab"], "neither a running lab"),
    (["bench", "all-reduce", "--lab", "x", "--cc", "cubic"], "unknown congestion control 'cubic'"),
    (["bench", "all-reduce", "--lab", "x", "--transport", "tcp", "--cc", "hpcc"], "not of tcp"),
    (["compare", "all-reduce", "--lab", "x", "--transports", "tcp", "--cc", "hpcc"],
     "add ethplus to --transports"),
    (["compare", "all-reduce", "--lab", "x", "--cc", "nscc,reno"], "unknown congestion control"),
])  # fmt: skip
def test_bad_arguments_are_one_line_errors(args, expect):
    r = ethplus(*args)
    assert r.returncode != 0
    assert expect in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert "Traceback" not in r.stderr


def test_parse_sizes():
    assert bench.parse_sizes("8K:64K") == [8192, 16384, 32768, 65536]
    assert bench.parse_sizes("1M") == [1 << 20]
    assert bench.parse_sizes("1K,4K,1M") == [1024, 4096, 1 << 20]
    assert bench.parse_sizes("8:100", 3) == [8, 24, 72]
    with pytest.raises(bench.BenchError, match="--factor"):
        bench.parse_sizes("8:64", 1)


def _png_ok(path, width: int, height: int) -> None:
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(path)
    assert img.shape[1] == width and img.shape[0] == height, (path, img.shape)
    flat = img[..., :3].reshape(-1, 3)
    assert flat.std() > 0.05, f"{path} is nearly blank"
    colours = np.unique((flat * 255).astype(np.uint8), axis=0)
    assert len(colours) > 50, f"{path} has only {len(colours)} colours"


def test_compare_writes_report_json_and_plots(erack, tmp_path):
    out = tmp_path / "cmp"
    r = ethplus(
        "compare",
        "all-reduce,all-to-all",
        "--lab",
        erack,
        "--transports",
        "ethplus,tcp",
        "--in-network",
        "--sizes",
        "64K,1M",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert f"report: {out}/report.md" in r.stdout
    md = (out / "report.md").read_text()
    for part in ("## all-reduce", "## all-to-all", "ethplus busbw", "tcp / best", "## Fidelity",
                 "Not time-scaled", "kernel TCP timers", "time scale k = ",
                 "ethplus/in-network busbw",
                 "in-network all-reduce (the switches reduce)"):  # fmt: skip
        assert part in md, part
    doc = json.loads((out / "results.json").read_text())
    pairs = [(x["collective"], x["name"]) for x in doc["runs"]]
    assert pairs == [("all-reduce", "ethplus"), ("all-reduce", "tcp"),
                     ("all-reduce", "ethplus/in-network"), ("all-to-all", "ethplus"),
                     ("all-to-all", "tcp")]  # fmt: skip
    schema = json.loads(bench.SCHEMA_PATH.read_text())
    for run in doc["runs"]:
        jsonschema.validate(run, schema)
        assert all(row["wrong"] == 0 for row in run["rows"])
    best = doc["comparison"]["all-reduce"][0]["transports"]
    assert max(v["ratio_to_best"] for v in best.values()) == pytest.approx(1.0)
    _png_ok(out / "busbw.png", 1200, 720)  # two collectives
    _png_ok(out / "link-utilisation.png", 1200, 1680)  # five runs
    _png_ok(out / "queue-depth.png", 1200, 1680)


def test_demo_runs_every_transport(erack, tmp_path):
    # the demo's sizes but 16M (the fresh-machine check runs it whole)
    r = ethplus("demo", "--lab", erack, "--sizes", "64K,1M", "--out", str(tmp_path / "demo"),
                timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    for t in catalog.available():
        assert t.upper() in r.stdout
    assert "ETHPLUS/IN-NETWORK" in r.stdout  # the switches reduce, on a lab that can
    assert "all-reduce: busbw" in r.stdout and "all-to-all: busbw" in r.stdout
    assert (tmp_path / "demo" / "report.md").exists()


def test_a_run_the_machine_cannot_keep_up_with_is_marked_behind(tmp_path):
    """At time scale 10 the links run at 40 Gbit/s real, far more than a
    two-core machine forwards or its NIC engines pace (at 100 a fast CI
    machine's engines kept up): the row must say `behind`, the report must
    say so, and the JSON's fidelity must not be clean."""
    name = f"{RUN_ID}-bk"
    f = _erack_file(tmp_path, name)
    js = tmp_path / "r.json"
    r = ethplus("bench", "all-reduce", "--lab", str(f), "--time-scale", "10", "--sizes", "4M",
                "--iters", "2", "--warmup", "0", "--json", str(js))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert _rows(r.stdout)[0][-1] == "behind"
    assert "FELL BEHIND" in r.stdout
    # the table's one row and nothing else starts with a number, the why included
    assert [x[0] for x in _rows(r.stdout)] == ["4194304"] and "    at 4194304 B: " in r.stdout
    result = json.loads(js.read_text())
    assert result["rows"][0]["fell_behind"] and not result["fidelity"]["clean"]
    # the endpoints could not keep up either, and say so
    assert result["rows"][0]["endpoints"]["fell_behind"]
    assert "endpoints: 8 NIC engines" in r.stdout


def _tcp_handshake_run(tmp_path, name: str, syn_rto: str) -> tuple[dict, str]:
    """An all-reduce over kernel TCP on 2 accelerators of one plane at k =
    1e6, where a rack's 2 us round trip is 2 s of real time, longer than
    Linux's fixed 1 s before a SYN goes again; the lab's [tcp] syn_rto set.
    Returns the report's kernel TCP counters and the bench's output."""
    f = _erack_file(tmp_path, name, {"accelerators = 8": "accelerators = 2",
                                     "planes = 4": "planes = 1",
                                     "[tcp]": f'[tcp]\nsyn_rto = "{syn_rto}"'})  # fmt: skip
    js = tmp_path / "r.json"
    r = ethplus("bench", "all-reduce", "--lab", str(f), "--transport", "tcp",
                "--time-scale", "1000000", "--sizes", "4K", "--iters", "1", "--warmup", "0",
                "--json", str(js))  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(js.read_text())["fidelity"]["kernel_tcp"], r.stdout


def test_kernel_tcp_handshakes_longer_than_a_second_send_no_syn_again(tmp_path):
    """A lab's handshakes wait the kernel's largest RTO before a SYN goes
    again (its cgroup's BPF program): at k = 1e6 no SYN or SYN-ACK is sent
    twice, and the report says what they wait."""
    t, out = _tcp_handshake_run(tmp_path, f"{RUN_ID}-hm", "max")
    assert t["tcp_setup_rtos"] == 0 and t["tcp_setup_retx_segs"] == 0, t
    assert "waits the kernel's largest RTO (120 s real)" in out, out


def test_kernel_tcp_handshakes_longer_than_linuxs_second_are_counted_as_set_up(tmp_path):
    """With Linux's own 1 s ([tcp] syn_rto = "linux") every SYN times out
    at k = 1e6 and is sent again with nothing lost.  The report counts those
    timeouts as the connections' set-up, apart from the traffic's."""
    t, out = _tcp_handshake_run(tmp_path, f"{RUN_ID}-hs", "linux")
    assert t["tcp_setup_rtos"] >= 1 and t["tcp_rtos"] >= t["tcp_setup_rtos"], t
    assert "in the connections' set-up" in out, out
    assert "waits Linux's fixed 1 s (real)" in out, out


def test_kernel_tcp_on_a_shipped_lab_gets_and_counts_the_switches_ecn_marks(erack, tmp_path):
    """The shipped labs' kernel TCP asks for ECN ([tcp] ecn = true), as a
    datacentre's does: an uneven all-to-all builds queues the switches mark,
    the senders count segments delivered CE-marked, and the report says so.
    Without it TCP only learns of a full queue by losing a segment."""
    js = tmp_path / "r.json"
    r = ethplus("bench", "all-to-all", "--uneven", "--lab", erack, "--transport", "tcp",
                "--sizes", "4M", "--iters", "2", "--warmup", "0", "--json", str(js))  # fmt: skip
    assert r.returncode == 0, r.stderr
    f = json.loads(js.read_text())["fidelity"]
    marked = sum(d.get("ecn_marked", 0) for d in f["drops"].values())
    assert marked > 0, f["drops"]
    ce = f["kernel_tcp"].get("tcp_delivered_ce", 0)
    assert ce > 0, f["kernel_tcp"]
    assert f"{ce} segments delivered CE-marked" in r.stdout, r.stdout


def test_kernel_tcp_opens_streams_only_to_the_peers_a_rank_uses(erack, tmp_path):
    """A rank connects to a peer when its collective first uses it, not to
    every rank of the job: in a ring all-reduce of 8 ranks each holds
    streams to its two neighbours (16 peers in all, not 56), in
    halving-doubling to its three partners (24), one stream per plane."""
    for algo, peers in (("ring", 16), ("halving-doubling", 24)):
        js = tmp_path / f"{algo}.json"
        r = ethplus("bench", "all-reduce", "--lab", erack, "--transport", "tcp",
                    "--algo", algo, "--sizes", "64K", "--iters", "1", "--warmup", "0",
                    "--json", str(js))  # fmt: skip
        assert r.returncode == 0, r.stderr
        res = json.loads(js.read_text())
        assert [row["wrong"] for row in res["rows"]] == [0]
        t = res["fidelity"]["kernel_tcp"]
        assert (t["tcp_peers"], t["tcp_streams"]) == (peers, 4 * peers), t
        assert f"over {4 * peers} streams to {peers} peers" in r.stdout, r.stdout


# a busy loop above the ranks' priority (nice 0) and below the fabric's (-10)
RANK_HOG = "import os\nos.nice(-5)\nwhile True:\n    pass\n"


def test_kernel_tcp_ranks_starved_of_cpu_are_marked_behind(erack, tmp_path):
    """Kernel TCP has no engine of ours to watch, but its ranks' threads
    waiting for a CPU show that the machine set the pace.  Every rank on one
    core, which a busier process holds, at time scale 400: the row is behind
    and the ranks' wait says so.  (Left to both cores, a fast CI machine's
    ranks waited 18% of the window: its switches fell behind first.)"""
    cpu = str(min(os.sched_getaffinity(0)))
    k0 = json.loads(ethplus("lab", "show", erack, "--json", check=True).stdout)["time_scale"]
    js = tmp_path / "r.json"
    ethplus("lab", "scale", erack, "400", check=True)
    hog = subprocess.Popen(["taskset", "-c", cpu, sys.executable, "-c", RANK_HOG])
    try:
        r = subprocess.run(["taskset", "-c", cpu, sys.executable, "-m", "cli.main", "bench",
                            "all-reduce", "--lab", erack, "--transport", "tcp", "--sizes", "16M",
                            "--iters", "2", "--warmup", "1", "--json", str(js)],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        hog.kill()
        hog.wait()
        ethplus("lab", "scale", erack, f"{k0:g}", check=True)
    assert r.returncode == 0, r.stderr
    res = json.loads(js.read_text())
    row = res["rows"][0]
    # (a retransmit timeout, 400 ms real at this k, idles every rank: it
    # would thin the share out, so the counts are shown should this fail)
    why = (row["endpoints"], res["fidelity"]["kernel_tcp"], row["time_real_us"])
    assert row["k_range"] == [400, 400], row["k_range"]
    assert row["fell_behind"] and row["endpoints"]["fell_behind"], why
    assert row["endpoints"]["waited_share_max"] > fidelity.WAITED_SHARE_MAX, why


@pytest.mark.parametrize("transport_name", ["ethplus", "tcp"])
def test_check_all_verifies_every_warm_up_and_timed_run(erack, transport_name, tmp_path):
    """--check all refills and checks every run of an in-place all-reduce (a
    run over the previous run's result would be wrong: sums of sums), and
    its times are of the runs alone."""
    js = tmp_path / "r.json"
    r = ethplus("bench", "all-reduce", "--lab", erack, "--transport", transport_name,
                "--sizes", "64K,1M", "--iters", "3", "--warmup", "2", "--check", "all",
                "--json", str(js))  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(js.read_text())["rows"]
    assert [x["wrong"] for x in rows] == [0, 0]
    assert all(x["time_us"] > 0 for x in rows)
    for x in rows:  # each iteration's busbw too is of its run alone, not its check
        lo, hi = x["busbw_range_GBps"]
        assert 0.99 * lo <= x["busbw_GBps"] <= 1.01 * hi, x


@pytest.fixture
def governed_lab(tmp_path):
    """An erack-8x4 of its own (time_scale "auto": governed), removed after."""
    name = f"{RUN_ID}-gv"
    f = _erack_file(tmp_path, name)
    ethplus("lab", "up", str(f), check=True, governed=True)
    try:
        yield name
    finally:
        ethplus("lab", "down", name)


def _consistent(row: dict) -> bool:
    """A row's verdict is what its own measurements say."""
    parts = [row.get("pacing"), row.get("endpoints")]
    return row["fell_behind"] == any(p and p["fell_behind"] for p in parts)


def test_a_size_pinned_where_it_saturates_is_behind_and_governed_is_not(governed_lab, tmp_path):
    """k pinned (ethplus lab scale) at a tenth of the auto choice saturates
    this machine: the size is marked behind.  Handed back to the governor,
    the same size runs at a k where no part fell behind, and the JSON
    records the trials and the governor's changes of k, with reasons."""
    name = governed_lab
    pinned, governed = tmp_path / "p.json", tmp_path / "g.json"
    common = ["all-reduce", "--transport", "ethplus", "--sizes", "4M", "--iters", "2",
              "--warmup", "1", "--lab", name]  # fmt: skip
    floor = json.loads(ethplus("lab", "show", name, "--json", check=True).stdout)["time_scale"]
    ethplus("lab", "scale", name, f"{floor / 10:g}", check=True)
    r = ethplus("bench", *common, "--json", str(pinned))
    assert r.returncode == 0, r.stderr
    row = json.loads(pinned.read_text())["rows"][0]
    assert row["fell_behind"] and _consistent(row) and row["k_range"] == [floor / 10] * 2
    assert "governed" not in r.stdout  # pinned: only reported
    ethplus("lab", "scale", name, "auto", check=True)
    r = ethplus("bench", *common, "--json", str(governed))
    assert r.returncode == 0, r.stderr
    res = json.loads(governed.read_text())
    row, g = res["rows"][0], res["governor"]
    assert not row["fell_behind"] and _consistent(row), row
    assert g["trials"] and row["k_range"][0] > floor / 10
    raised = [e for e in g["events"] if e["k_to"] > e["k_from"]]
    assert raised and all(e["why"] for e in raised)
    assert "governed time scale" in r.stdout


def test_a_governed_bench_checks_its_small_sizes_at_four_times_their_k(governed_lab, tmp_path):
    """After a governed run, its smallest size runs again with k pinned at
    4x the k it ran at: a row whose nominal time moved past 5% is the larger
    k's run, one that held stays as it was; the JSON, the governor's line
    and the fidelity report say which, and the governor has the lab again
    after.  --no-k-check runs none."""
    name = governed_lab
    js = tmp_path / "c.json"
    common = ["all-reduce", "--transport", "ethplus", "--sizes", "64K,4M", "--iters", "3",
              "--warmup", "1", "--lab", name]  # fmt: skip
    r = ethplus("bench", *common, "--json", str(js))
    assert r.returncode == 0, r.stderr
    res = json.loads(js.read_text())
    checks = res["governor"]["k_checks"]
    # (a machine so loaded that the governor raised k far enough skips the
    # check for its cost: then stdout says so)
    assert checks and checks[0]["size_bytes"] == 64 * 1024, (checks, r.stdout[-1500:])
    for c in checks:
        assert c["k"] == 4 * c["k_range"][1]
        assert c["ratio"] == pytest.approx(c["time_us"] / c["time_us_at_k"])
        assert c["moved"] == (abs(c["ratio"] - 1) > 0.05)
    row = next(x for x in res["rows"] if x["size_bytes"] == 64 * 1024)
    last = row["k_checks"][-1]
    if last["moved"]:  # (then the check at the larger k is the row, checked in turn)
        assert row["k_range"][1] == last["k"] and row["time_us"] == last["time_us_at_k"]
    else:
        assert row["time_us"] == last["time_us"] and row["k_range"] == last["k_range"]
    assert [c for c in checks if c["size_bytes"] == 64 * 1024] == row["k_checks"]
    said = "moved" if any(c["moved"] for c in checks) else "held within 5% at 4x their k"
    assert said in r.stdout and "checked at 4x the k" in r.stdout
    assert labs.control(name, {"op": "governor"})["governor"]["on"]
    r = ethplus("bench", *common, "--no-k-check", "--json", str(js))
    assert r.returncode == 0, r.stderr
    assert json.loads(js.read_text())["governor"]["k_checks"] == []


def test_no_govern_leaves_a_k_pinned_by_hand_pinned(governed_lab):
    """`ethplus lab scale` pinned k; a bench with --no-govern runs at it and
    leaves it pinned there (it used to hand k back to the governor)."""
    name = governed_lab
    floor = json.loads(ethplus("lab", "show", name, "--json", check=True).stdout)["time_scale"]
    ethplus("lab", "scale", name, f"{floor * 2:g}", check=True)
    try:
        r = ethplus("bench", "all-reduce", "--lab", name, "--sizes", "64K", "--iters", "1",
                    "--warmup", "0", "--no-govern")  # fmt: skip
        assert r.returncode == 0, r.stderr
        g = labs.control(name, {"op": "governor"})["governor"]
        assert not g["on"] and g["k"] == floor * 2, g
    finally:
        ethplus("lab", "scale", name, "auto", check=True)


# longer than a hold (after raises that did not help, the governor holds for
# CALM_S): the hog must outlast it
HOG_S = governor.CALM_S + governor.WINDOW_S
# above the fabric's nice -10 too: on every core the lab keeps a quarter at most
HOG = (
    f"import os, time\nos.nice(-15)\nend = time.monotonic() + {HOG_S:g}\n"
    "while time.monotonic() < end:\n    pass\n"
)


def test_a_cpu_hog_mid_run_makes_the_governor_raise_k(governed_lab, tmp_path):
    """Busy loops, one pinned to each core at a priority above the lab's,
    for HOG_S from the middle of a governed all-reduce: the governor raises
    k (in the JSON), and each size is ok or behind as its own measurements
    say.  (One plain busy loop on one core left a fast CI machine room to
    spare: nothing had to move.)"""
    name = governed_lab
    js = tmp_path / "r.json"
    bench_cmd = [sys.executable, "-m", "cli.main", "bench", "all-reduce", "--lab", name,
                 "--transport", "ethplus", "--sizes", "1M,4M,16M", "--iters", "4",
                 "--warmup", "1", "--no-k-check", "--json", str(js)]  # fmt: skip
    b = subprocess.Popen(bench_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hogs = []
    try:
        # the middle of the run: once the trial is through and sizes are timed
        for line in b.stdout:
            if line.lstrip().startswith("1048576"):
                break
        hog_started = time.monotonic()
        hogs = [
            subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", HOG])
            for cpu in sorted(os.sched_getaffinity(0))
        ]
        out, err = b.communicate(timeout=1500)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        if b.poll() is None:
            b.kill()
            b.wait()
    assert b.returncode == 0, err
    res = json.loads(js.read_text())
    raised = [
        e
        for e in res["governor"]["events"]
        if e["k_to"] > e["k_from"] and e["t_real"] > hog_started
    ]
    assert raised, res["governor"]["events"]
    assert all(_consistent(r) for r in res["rows"]), res["rows"]


@pytest.mark.parametrize(
    "transport,extra",
    [("ethplus", ()), ("roce", ()), ("tcp", ()), ("ethplus", ("--engine-per-rank",))],
    ids=["ethplus", "roce", "tcp", "ethplus-engine-per-rank"],
)
def test_ranks_share_processes_and_stay_byte_exact(erack, transport, extra, tmp_path):
    """--ranks-per-host 3: eight ranks in three processes (3, 3, 2), a thread
    each in its own namespace, their NIC engines in one thread per process
    (or a thread each); every collective byte exact."""
    js = tmp_path / "r.json"
    r = ethplus("bench", "all-reduce", "--lab", erack, "--transport", transport,
                "--sizes", "256K:1M", "--factor", "4", "--iters", "2", "--warmup", "1",
                "--ranks-per-host", "3", "--check", "all", "--json", str(js), *extra)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "8 ranks in 3 processes" in r.stdout
    res = json.loads(js.read_text())
    assert [h["ranks"] for h in res["hosts"]] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert len({h["pid"] for h in res["hosts"]}) == 3
    assert [row["wrong"] for row in res["rows"]] == [0, 0]
    if transport != "tcp":
        want = "own" if extra else "shared"
        assert res["transport_config"]["engine_thread"] == want
    # the CPU of the threads that move frames, apart: the switches' within
    # the fabric's, the NIC engines' within the workers' (kernel TCP has none:
    # its frames are the kernel's work in the ranks' own threads)
    c = res["fidelity"]["cpu"]
    slack = 0.01 / res["wall_s"]  # the parts are read a moment after the whole
    assert 0 < c["fabric_frames_cores"] <= c["fabric_cores"] + slack, c
    if transport == "tcp":
        assert c["workers_frames_cores"] == 0, c
    else:
        assert 0 < c["workers_frames_cores"] <= c["workers_cores"] * 1.01 + slack, c
    assert "(switch threads " in r.stdout
    # and the workers' start-up, before their ranks were ready: each of the
    # three processes' Python, imports and transport set-up (tens of ms at
    # least), a part of the workers' CPU
    startup_s = c["workers_startup_cores"] * res["wall_s"]
    assert 3 * 0.01 < startup_s < c["workers_cores"] * res["wall_s"], c
    assert "start-up " in r.stdout


def test_a_killed_rank_host_fails_the_run_naming_its_ranks(erack):
    rc, err, _ = _kill_mid_bench(erack, 2, "h4", "--ranks-per-host", "4")
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert "ranks 4-7 (h4..h7)" in last and "signal 9" in last, err
    assert not _workers(erack), "workers outlived the job"


@pytest.mark.parametrize("sample", [True, False])
def test_a_collective_longer_than_the_stall_limit_is_not_a_stall_while_frames_move(erack, sample):
    """At the lab's k one 64 MiB all-reduce takes seconds of real time, more
    than this job's stall limit: the fabric's frames keep moving, so the job
    runs to its end (at a large k a collective can outlast any fixed limit).
    So too for a job that leaves sampling the fabric to another (a
    scenario's jobs but the first): kernel TCP's ecmp-collision jobs at k
    108,000 failed as stalled while their frames moved."""
    res = _job(erack, "ethplus", "all-reduce", [64 * MiB], stall_s=1.5, sample=sample)
    assert res["rows"][0]["wrong"] == 0
    assert res["rows"][0]["time_real_s"] > 1.5  # longer than the limit: it was tested


def test_a_rank_kept_off_the_cpu_shows_as_its_engines_rx_backlog(erack):
    """A rank's process frozen (SIGSTOP) for a moment mid-collective, as a
    machine too busy to run it would: the frames that came meanwhile waited
    in its engine's RX ring, and its rx_wait_max says how long (the kernel's
    arrival stamps); the other engines, which kept running, show less."""
    plan = Plan(lab=erack, transport="ethplus", collective="all-reduce", sizes=[64 * MiB],
                iters=2, warmup=0, ranks_per_host=1)  # fmt: skip
    job = Job(plan, registry.load_lab(erack))
    frozen_s, early_s = 0.6, 0.2
    early_bytes = []  # per freeze: what h3's interfaces took in its first early_s

    def freeze():
        # A freeze that catches h3 with nothing coming (every rank waiting for
        # it already) shows no wait: then freeze again, up to three times.
        victim = _mid_run_worker(erack, 8, "h3")
        for _ in range(3):
            before = _rx_bytes(victim)
            os.kill(victim, signal.SIGSTOP)
            time.sleep(early_s)
            early_bytes.append(_rx_bytes(victim) - before)
            time.sleep(frozen_s - early_s)
            os.kill(victim, signal.SIGCONT)
            if early_bytes[-1] > 0:
                break
            time.sleep(0.3)

    t = threading.Thread(target=freeze)
    t.start()
    try:
        res = job.run()
    finally:
        t.join()
    assert early_bytes[-1] > 0, f"no frame reached h3 early in any freeze: {early_bytes}"
    engines = {e["node"]: e for e in fidelity.engines(res)}
    # a frame that came in the first early_s waited the rest of the freeze
    assert engines["h3"]["rx_wait_max_ns"] >= (frozen_s - early_s) * 1e9, (
        early_bytes,
        engines["h3"],
    )
    others = max(e["rx_wait_max_ns"] for n, e in engines.items() if n != "h3")
    assert others < engines["h3"]["rx_wait_max_ns"], engines
    assert all(e["rx_wait_ns"] > 0 for e in engines.values())  # measured on every engine


FROZEN_S = 2.0


def test_a_rank_frozen_in_a_timed_run_marks_its_size_behind_saying_why(erack, tmp_path):
    """A rank's process frozen (SIGSTOP) for two seconds in the middle of a
    size's timed runs, as a machine too busy to run it would: every other
    rank waits for it, so its engine's stall counts in the time some NIC
    engine of the lab was behind, and the size is `behind`, saying so."""
    js = tmp_path / "r.json"
    b = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "bench", "all-reduce", "--lab", erack, "--sizes", "64M",
         "--iters", "3", "--warmup", "1", "--ranks-per-host", "1", "--json", str(js)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # past the untimed check run (each node receives 7/4 of 64 MiB) into the timed ones
        victim = _mid_run_worker(erack, 8, "h3", into_bytes=150 * MiB)
        os.kill(victim, signal.SIGSTOP)
        time.sleep(FROZEN_S)
        os.kill(victim, signal.SIGCONT)
        _, err = b.communicate(timeout=300)
    finally:
        b.kill()
    assert b.returncode == 0, err
    res = json.loads(js.read_text())
    row = res["rows"][0]
    window_s = row["time_real_us"] * res["iters"] / 1e6  # (time_real_us: one iteration's)
    behind_s = row["endpoints"]["any_behind_share"] * window_s
    # a good share of the freeze, whether or not its engine had a timer due:
    # frames waited in its RX ring for it. Not all of it: the peers' frames
    # come only once they send, and they stop for the frozen rank. A 1 s freeze
    # counted 0.39 s (before the ring's wait counted), then 0.47-1.93 s.
    assert behind_s > FROZEN_S / 4, f"{behind_s:.2f} s behind: {row}"
    assert row["fell_behind"] and any("some NIC engine was behind" in w for w in row["behind_why"])


def test_a_job_whose_ranks_stop_and_whose_frames_stop_is_a_stall(erack):
    """A rank frozen (SIGSTOP) mid-collective: nobody reports and, once the
    others have nothing left to send, no frame moves: the job fails as
    stalled, within the limit plus the sampling, and nothing is left."""
    plan = Plan(lab=erack, transport="ethplus", collective="all-reduce", sizes=[64 * MiB],
                iters=50, warmup=0, stall_s=3.0, ranks_per_host=1)  # fmt: skip
    job = Job(plan, registry.load_lab(erack))
    stopped: list[int] = []

    def freeze():
        victim = _mid_run_worker(erack, 8, "h3")
        os.kill(victim, signal.SIGSTOP)
        stopped.append(victim)

    t = threading.Thread(target=freeze)
    t.start()
    try:
        with pytest.raises(JobError, match="stalled"):
            job.run()
    finally:
        t.join()
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert stopped, "no worker was frozen"
    deadline = time.monotonic() + 10
    while _workers(erack) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _workers(erack), "workers outlived the job"


def _spine_tx_bytes(lab: str) -> dict[str, int]:
    """Each spine's bytes sent, all its interfaces together, as the kernel
    counts them (IFLA_STATS64)."""
    rec = registry.load_lab(lab)
    return {
        n["name"]: sum(if_stats(rec["namespaces"][n["name"]], p["ifname"])["tx_bytes"]
                       for p in n["ports"])
        for n in rec["topology"]["nodes"] if n["name"].startswith("spine")
    }  # fmt: skip


def test_kernel_tcps_paths_across_the_spines_follow_the_seed(clos):
    """A TCP flow's path is its switches' hash of its ports: the run's seed
    draws each stream's source port, so the same seed takes the same spine
    in every run (on any machine), and other seeds take others (the
    kernel's random ephemeral ports moved ecmp-collision's tcp job time
    1.36x between two runs).  h0 -> h8, leaf 0 to leaf 2, one stream."""

    def spines(seed: int) -> frozenset[str]:
        """The spines that sent more than 1 MB while the job ran."""
        before = _spine_tx_bytes(clos)
        res = _job(clos, "tcp", "broadcast", [4 * MiB], nodes=["h0", "h8"], seed=seed)
        assert res["rows"][0]["wrong"] == 0
        assert sum(r["counters"].get("unseeded_ports", 0) for r in res["ranks"]) == 0
        after = _spine_tx_bytes(clos)
        return frozenset(s for s in after if after[s] - before[s] > 1_000_000)

    first = spines(3)
    assert len(first) == 1, first
    assert spines(3) == first and spines(3) == first  # the 4-tuple again, from TIME-WAIT
    assert len({first, *(spines(s) for s in (4, 5, 6, 7))}) > 1
