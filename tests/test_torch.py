"""PyTorch on the emulated fabric: the ethplus torch.distributed backend and
`ethplus run`, against stock gloo over kernel TCP through the same switches."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import RUN_ID, ethplus, netns_names
from labtools import module_lab

from dataplane.errors import UsageError
from dataplane.lab import labs
from dataplane.run import launcher, torch_backend

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "torch_programs"
TRANSPORTS = ("ethplus", "roce", "tcp")


def run(lab: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """ethplus run LAB ARGS (options, then -- and the command)."""
    return ethplus("run", lab, *args, timeout=timeout)


PROGRAM_HEAD = (
    "import os, signal, time, torch, torch.distributed as dist\n"
    "import dataplane.run.torch_backend\n"
    "dist.init_process_group(os.environ['ETHPLUS_BACKEND'])\n"
)


def run_program(lab: str, path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    """Write a program (imports, the group ethplus run names, then body) to
    path and run it on lab with args."""
    path.write_text(PROGRAM_HEAD + body)
    return run(lab, *args, "--", "python", str(path), timeout=120)


def rank_lines(out: str, pattern: str) -> dict[int, list[str]]:
    """Each rank's output lines matching pattern (its first group), in order."""
    got: dict[int, list[str]] = {}
    for m in re.finditer(r"^\[rank (\d+) \S+\] " + pattern + r"$", out, re.M):
        got.setdefault(int(m.group(1)), []).append(m.group(2))
    return got


# ---------------------------------------------------------------- without a lab


def test_tensors_the_backend_cannot_take_are_a_clear_type_error():
    with pytest.raises(TypeError, match=r"float64; supported: float32, float16, bfloat16"):
        torch_backend.array(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="not contiguous"):
        torch_backend.array(torch.zeros(4, 4).t())
    with pytest.raises(TypeError, match="not a tensor"):
        torch_backend.array([1.0, 2.0])
    with pytest.raises(ValueError, match="AVG of int32 is not defined"):
        torch_backend.op_name(torch.distributed.ReduceOp.AVG, "int32")
    with pytest.raises(ValueError, match="PRODUCT"):
        torch_backend.op_name(torch.distributed.ReduceOp.PRODUCT, "float32")


def test_negative_split_sizes_are_refused_though_they_sum_right():
    t = torch.zeros(8, 2)
    with pytest.raises(ValueError, match="input_split_sizes must not be negative"):
        torch_backend._counts(t, [4, -2, 6, 0], 4, "input_split_sizes")
    assert torch_backend._counts(t, [4, 2, 2, 0], 4, "input_split_sizes") == [8, 4, 4, 0]


def test_the_backend_uses_the_tensors_own_memory():
    for dtype in torch_backend.DTYPES:
        t = torch.zeros(6, dtype=dtype)
        a = torch_backend.array(t)
        a[2] = 1  # bfloat16: the bits 0x0001, a tiny positive number
        assert t[2] != 0 and a.size == 6, dtype
    g = torch.zeros(3, requires_grad=True)
    torch_backend.array(g)[0] = 5
    assert g[0].item() == 5


def test_a_rank_outside_ethplus_run_is_told_how_to_start():
    with pytest.raises(UsageError, match="runs under `ethplus run LAB -- CMD`"):
        launcher.rank_env({})
    with pytest.raises(UsageError, match="ETHPLUS_TRANSPORT='ib'"):
        launcher.rank_env(
            {launcher.ENV_LAB: "x", launcher.ENV_NODES: "h0", launcher.ENV_TRANSPORT: "ib"}
        )


def test_a_call_counts_from_the_last_rank_in_to_the_last_rank_out():
    """Rank 0 came to the all-reduce at 1.0 s and waited for rank 1, still
    computing until 1.5 s: the call took 0.003 s, not 0.503."""
    ranks = [
        {"calls": [["all-reduce", 1 << 20, 1.0, 1.502], ["all-to-all", 300, 2.0, 2.004]],
         "p2p": {"send": [1, 10, 0.5], "recv": [0, 0, 0.0]}},
        {"calls": [["all-reduce", 1 << 20, 1.5, 1.503], ["all-to-all", 500, 2.001, 2.003]],
         "p2p": {"send": [0, 0, 0.0], "recv": [1, 10, 0.25]}},
    ]  # fmt: skip
    rows = {r["collective"]: r for r in launcher.summary({"ranks": ranks})}
    ar = rows["all-reduce"]
    assert ar["calls"] == 1 and ar["time_s"] == pytest.approx(0.003)
    assert ar["busbw_GBps"] == pytest.approx((1 << 20) / 0.003 / 1e9 * 1.0)  # 2(n-1)/n = 1
    a2a = rows["all-to-all"]  # uneven: the larger rank's bytes
    assert a2a["size_bytes"] == 500 and a2a["min_bytes"] == 500
    assert a2a["time_s"] == pytest.approx(0.003)
    assert rows["send"]["calls"] == 1 and rows["recv"]["bytes"] == 10


def test_run_says_what_is_wrong_before_touching_a_lab():
    r = ethplus("run", "erack-8x4")
    assert r.returncode != 0 and "nothing to run" in r.stderr and "Traceback" not in r.stderr
    r = ethplus("run", "no-such-lab", "--", "true")
    assert r.returncode != 0 and "neither a running lab" in r.stderr
    r = ethplus("run", "erack-8x4", "--transport", "ib", "--", "true")
    assert r.returncode != 0 and "invalid choice: 'ib'" in r.stderr


# ---------------------------------------------------------------- real labs


erack = module_lab("pt", "erack-8x4", name_only=True)
clos = module_lab("pt", "clos-16", name_only=True)


def _losses(out: str) -> dict[int, list[float]]:
    return {r: [float(x) for x in v] for r, v in rank_lines(out, r"step \d+ loss (\S+).*").items()}


@pytest.mark.root
def test_ddp_training_agrees_on_every_transport_and_with_gloo(erack):
    """The DDP example on ethplus, roce, tcp and stock gloo: each completes;
    every rank of a run has the same losses and weights bit for bit (an
    all-reduce gives all ranks the same bits); the runs' losses agree within
    1e-5 (their reductions add in different orders)."""
    script = str(ROOT / "examples" / "ddp_mlp.py")
    runs = {}
    for t in TRANSPORTS:
        runs[t] = run(erack, "--transport", t, "--", "python", script, "--steps", "4")
    runs["gloo"] = run(erack, "--backend", "gloo", "--", "python", script, "--steps", "4")
    losses = {}
    for name, r in runs.items():
        assert r.returncode == 0, f"{name}: {r.stderr[-2000:]}"
        per_rank = _losses(r.stdout)
        assert sorted(per_rank) == list(range(8)), name
        assert all(v == per_rank[0] and len(v) == 4 for v in per_rank.values()), name
        digests = set(sum(rank_lines(r.stdout, r"weights sha256 (\w+)").values(), []))
        assert len(digests) == 1, f"{name}: ranks' weights differ: {digests}"
        assert re.search(r"^all-reduce\s+\S+ \S+\s+\d+", r.stdout, re.M), r.stdout
        assert "fidelity (time scale" in r.stdout
        losses[name] = per_rank[0]
    assert losses["gloo"][-1] < losses["gloo"][0]  # it trains
    for name, v in losses.items():
        assert v == pytest.approx(losses["gloo"], rel=1e-5), name


@pytest.mark.root
def test_moe_steps_agree_with_gloo(erack):
    script = str(ROOT / "examples" / "moe_step.py")
    ours = run(erack, "--", "python", script, "--steps", "3")
    gloo = run(erack, "--backend", "gloo", "--", "python", script, "--steps", "3")
    for r in (ours, gloo):
        assert r.returncode == 0, r.stderr[-2000:]
    sent = rank_lines(ours.stdout, r"step 0 loss \S+ sent (.*)")
    assert len({s[0] for s in sent.values()}) > 1  # uneven, rank by rank
    assert _losses(ours.stdout)[0] == pytest.approx(_losses(gloo.stdout)[0], rel=1e-5)
    assert re.search(r"^all-to-all\s+\S+ \w+\s+\d+", ours.stdout, re.M)  # in the table


def _collectives(lab: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    out.mkdir()
    r = run(lab, *args, "--", "python", str(PROGRAMS / "collectives.py"), str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.root
@pytest.mark.parametrize(
    "lab, nodes, runs",
    [
        ("erack", None, ("ethplus", "ethplus --algo ring", "roce", "tcp")),
        ("clos", "h0,h1,h4,h6,h9,h14", ("ethplus", "ethplus --algo halving-doubling")),
    ],
)
def test_every_collective_matches_gloo(lab, nodes, runs, request, tmp_path):
    """all_reduce (sum, max, min, avg; every type), all_gather (both forms),
    reduce_scatter (both), all_to_all_single (even, uneven), all_to_all,
    broadcast, barrier, send/recv, async: the same results as stock gloo's,
    exactly (the inputs are small integers, exact in any order).  Both labs
    reduce in the switches: ethplus's all-reduces go there by default (int64
    stays on the hosts), and on the hosts with --algo."""
    name = request.getfixturevalue(lab)
    sel = ("--nodes", nodes) if nodes else ()
    _collectives(name, tmp_path / "gloo", *sel, "--backend", "gloo")
    world = len(nodes.split(",")) if nodes else 8
    for spec in runs:
        transport, *algo = spec.split()
        t = spec.replace(" ", "_")  # its results' directory
        r = _collectives(name, tmp_path / t, *sel, "--transport", transport, *algo)
        if spec == "ethplus":
            assert "all-reduce in the switches" in r.stdout
        assert len(rank_lines(r.stdout, r"(uneven all_to_all exact)")) == world
        assert len(rank_lines(r.stdout, r"refused (dtype): .*float64.*")) == world
        assert len(rank_lines(r.stdout, r"refused (contiguous): .*not contiguous.*")) == world
        assert len(rank_lines(r.stdout, r"refused (tag): .*tag 999: expected 0 to 255")) == world
        for rank in range(world):
            ours = torch.load(tmp_path / t / f"rank-{rank}.pt")
            base = torch.load(tmp_path / "gloo" / f"rank-{rank}.pt")
            assert ours.keys() == base.keys()
            wrong = [k for k in ours if not torch.equal(ours[k], base[k])]
            assert not wrong, f"{t}, rank {rank}: {wrong}"


@pytest.mark.root
@pytest.mark.parametrize("backend", ["ethplus", "gloo"])
def test_rank_0_may_finish_first(erack, backend, tmp_path):
    """As under torchrun, the store outlives rank 0: here rank 0 leaves at
    once, and the others still meet over the store a second later.  When
    rank 0 served the store, a peer's store call after rank 0 had gone
    failed with "Connection was likely closed" (CI saw it once in a gloo
    run: rank 0 left while a peer was still closing its group)."""
    body = (
        "x = torch.ones(64)\n"
        "dist.all_reduce(x)\n"
        "store = dist.distributed_c10d._get_default_store()\n"
        "store.set(f'rank{dist.get_rank()}', 'gone')\n"
        "if dist.get_rank() > 0:\n"
        "    time.sleep(1.0)\n"
        "    n = store.add('after', 1)\n"
        "    print(f'after rank 0: {store.get(\"rank0\").decode()} {n}', flush=True)\n"
        "os._exit(0)  # no goodbyes (a closing group waits for its peers')\n"
    )
    r = run_program(erack, tmp_path / "first.py", body, "--nodes", "h0,h1,h2",
                    "--backend", backend)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    seen = rank_lines(r.stdout, r"after rank 0: (gone \d)")
    assert sorted(seen) == [1, 2], r.stdout
    assert sorted(v[0] for v in seen.values()) == ["gone 1", "gone 2"]


@pytest.mark.root
@pytest.mark.parametrize("transport", ["ethplus", "roce"])
def test_a_send_waits_for_a_peer_that_computes_before_receiving(erack, transport, tmp_path):
    """Rank 0 sends 4 MiB at once; rank 1 computes for 3 s first.  The send
    waits (the NIC's receiver-not-ready retries last the group's timeout),
    as gloo's does; once it ended after a dozen rounds, under a second."""
    body = (
        "x = torch.arange(1 << 20, dtype=torch.float32)\n"
        "if dist.get_rank() == 0:\n"
        "    dist.send(x, 1)\n"
        "else:\n"
        "    time.sleep(3.0)  # computing\n"
        "    y = torch.zeros_like(x)\n"
        "    dist.recv(y, 0)\n"
        "    print(f'received exact {torch.equal(x, y)}', flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    r = run_program(erack, tmp_path / "late.py", body, "--nodes", "h0,h1",
                    "--transport", transport)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert rank_lines(r.stdout, r"received exact (\w+)") == {1: ["True"]}


@pytest.mark.root
@pytest.mark.parametrize("transport", ["ethplus", "tcp"])
def test_a_message_shorter_than_its_receive_is_an_error_naming_the_peer(erack, transport,
                                                                       tmp_path):  # fmt: skip
    """Rank 0 sends 4 floats where rank 1 receives 8: the receive fails,
    naming rank 0 and both lengths, never a success with half the tensor
    unwritten."""
    body = (
        "if dist.get_rank() == 0:\n"
        "    dist.send(torch.ones(4), 1)\n"
        "else:\n"
        "    y = torch.zeros(8)\n"
        "    try:\n"
        "        dist.recv(y, 0)\n"
        "        print('received', flush=True)\n"
        "    except Exception as e:\n"
        "        print(f'refused: {e}', flush=True)\n"
    )
    r = run_program(erack, tmp_path / "short.py", body, "--nodes", "h0,h1",
                    "--transport", transport)  # fmt: skip
    said = rank_lines(r.stdout, r"(refused: .*|received)")
    assert len(said.get(1, [])) == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "rank 0 sent a 16-byte message" in said[1][0] and "32 bytes" in said[1][0], said


@pytest.mark.root
def test_a_taken_master_port_fails_the_run_naming_it(erack):
    holder = subprocess.Popen(
        ["ip", "netns", "exec", f"ethp-{erack}-h0", sys.executable, "-c",
         "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 29777)); "
         "s.listen(); print('up', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "up\n"
        prog = "import torch.distributed as d; d.init_process_group('gloo')"
        r = run(erack, "--nodes", "h0,h1", "--master-port", "29777", "--", "python", "-c", prog,
                timeout=120)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert re.search(r"store on h0 \(--master-port 29777\) .*address already in use", r.stderr)


def test_output_is_cut_at_newlines_and_carriage_returns_and_long_lines_are_held():
    async def lines(chunks, most):
        r = asyncio.StreamReader()
        for c in chunks:
            r.feed_data(c)
        r.feed_eof()
        return [x async for x in launcher.output_lines(r, most)]

    got = asyncio.run(lines([b"a\r", b"\nb\rc\n", b"x" * 100_000, b"y\r\n", b"tail"], 20))
    assert got == ["a", "b", "c", "x" * 20 + "... [line cut: 99981 more bytes]", "tail"]


@pytest.mark.root
def test_a_run_survives_a_progress_bar_and_a_line_of_ten_megabytes(erack, tmp_path):
    """What tqdm writes ('\r' and no newline, 100,000 times) and one 10 MB
    line without a newline: the run ends 0, every line prefixed by its rank."""
    path = tmp_path / "noisy.py"
    path.write_text(
        "import sys\n"
        "for i in range(100_000):\n"
        "    sys.stdout.write(f'\\r{i:6d}/100000 |' + '#' * (i // 5000) + '|')\n"
        "sys.stdout.write('\\n' + 'z' * 10_000_000)\n"
        "sys.stdout.flush()\n"
    )
    r = run(erack, "--nodes", "h0,h1", "--", "python", str(path), timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    bar = rank_lines(r.stdout, r"(\s*\d+)/100000 \|#*\|")
    assert {k: len(v) for k, v in bar.items()} == {0: 100_000, 1: 100_000}
    assert [int(x) for x in bar[1]] == list(range(100_000))
    cut = rank_lines(r.stdout, r"(z+)\.\.\. \[line cut: \d+ more bytes\]")
    assert {k: len(v) for k, v in cut.items()} == {0: 1, 1: 1}
    assert len(cut[0][0]) == launcher.LINE_MAX_CHARS


@pytest.mark.root
def test_a_killed_rank_fails_the_run_in_one_line(erack, tmp_path):
    marker = f"ethp-victim-{os.getpid()}"
    body = (
        "x = torch.ones(1 << 16)\n"
        "dist.all_reduce(x)\n"
        "if dist.get_rank() == 2:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "while True:\n"
        "    dist.all_reduce(x)\n"
    )
    before = netns_names()
    r = run_program(erack, tmp_path / f"{marker}.py", body)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()
    assert last == ["ethplus: error: rank 2 (h2) was killed by signal 9"], r.stderr
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert not left, f"processes left behind: {left}"
    assert netns_names() == before


@pytest.mark.root
def test_a_run_past_its_timeout_shows_where_each_rank_waits(erack, tmp_path):
    """ethplus run --timeout: a rank that never joins the all-reduce (rank 0
    sleeps) keeps its peer waiting; at the timeout each rank is sent
    SIGUSR1 (dataplane.run.stacks) and its threads' stacks come out with
    its prefix, the sleeper's in the program, its peer's in the backend's
    all-reduce; then the run fails in one line that says so."""
    body = (
        "print('ready', flush=True)\n"
        "if dist.get_rank() == 0:\n"
        "    time.sleep(1000)\n"
        "dist.all_reduce(torch.ones(8))\n"
    )
    path = tmp_path / "stuck.py"
    path.write_text(PROGRAM_HEAD + body)
    r = run(erack, "--nodes", "h0,h1", "--timeout", "20", "--", "python", str(path))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == (
        "ethplus: error: the run took longer than --timeout 20 s"
        " (each rank's stacks above: where it was waiting)"
    ), r.stderr
    assert rank_lines(r.stdout, "(ready)") == {0: ["ready"], 1: ["ready"]}, r.stdout[-3000:]
    stack = {rank: "\n".join(lines) for rank, lines in rank_lines(r.stdout, "(.*)").items()}
    assert re.search(r"File .*stuck\.py\", line 6 in <module>", stack[0]), stack[0]
    assert re.search(r"Thread 0x[0-9a-f]+", stack[1]), stack[1]
    assert re.search(r"File .* in all_reduce\b", stack[1]), stack[1]


@pytest.mark.root
def test_killed_runs_leave_no_in_network_registration_behind(tmp_path, lab_name):
    """`ethplus run` with the all-reduce in the switches, killed -9 while its
    ranks aggregate, 20 times in a row on a lab of 8 slots per switch: the
    fabric expires each run's registrations once its process is gone, and
    no run directory is left; a normal run after them aggregates in the
    switches, exact.  SIGTERM and SIGHUP stop a run the same way, cleaning up."""
    lab = tmp_path / "erack-8slots.toml"
    text = (ROOT / "netns-labs" / "erack-8x4.toml").read_text()
    lab.write_text(text.replace("[switch]\n", "[switch]\ninc_slots = 8\n", 1))
    ethplus("lab", "up", str(lab), "--name", lab_name, check=True)
    busy = tmp_path / "busy.py"
    busy.write_text(PROGRAM_HEAD + (
        "x = torch.ones(1 << 14)\n"
        "dist.all_reduce(x)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    dist.all_reduce(x)\n"
    ))  # fmt: skip
    runs = Path(f"/run/ethplus/labs/{lab_name}/runs")

    def start() -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "run", lab_name, "--nodes", "h0,h1", "--algo",
             "in-network", "--", "python", str(busy)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        )  # fmt: skip
        assert p.stdout is not None
        for line in p.stdout:
            if line.endswith("] ready\n"):
                return p
        raise AssertionError(f"the run ended before its ranks aggregated: {p.wait()}")

    for _ in range(20):
        p = start()
        p.kill()
        p.wait()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        p = start()
        p.send_signal(sig)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 1 and f"interrupted by {sig.name}" in out, out[-2000:]
    body = (
        "x = torch.arange(1 << 14, dtype=torch.float32) * (dist.get_rank() + 1)\n"
        "dist.all_reduce(x)\n"
        "want = torch.arange(1 << 14, dtype=torch.float32) * 3\n"
        "print('exact' if torch.equal(x, want) else 'wrong', flush=True)\n"
    )
    r = run_program(lab_name, tmp_path / "check.py", body, "--nodes", "h0,h1", "--algo",
                    "in-network")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "all-reduce in the switches" in r.stdout
    assert rank_lines(r.stdout, "(exact|wrong)") == {0: ["exact"], 1: ["exact"]}, r.stdout[-2000:]
    st = json.loads(ethplus("lab", "stats", lab_name, "--json", check=True).stdout)
    assert st["inc_leases"] == 0 and st["inc_leases_expired"] >= 20, st["inc_leases_expired"]
    assert list(runs.iterdir()) == [], list(runs.iterdir())


@pytest.fixture
def governed_erack():
    """An erack-8x4 of the test's own, governed (time_scale "auto"), removed
    after."""
    name = f"{RUN_ID}-ptg"
    ethplus("lab", "up", str(ROOT / "netns-labs" / "erack-8x4.toml"), "--name", name,
            check=True, governed=True)  # fmt: skip
    try:
        yield name
    finally:
        ethplus("lab", "down", name)


@pytest.mark.root
def test_a_governed_run_checks_its_calls_at_four_times_the_k(governed_erack, tmp_path):
    """A program cannot run again, but its calls can: on a governed lab,
    after the program, bench's same collectives and sizes run at the lowest
    k it ran at and at 4x it.  The table's AT_4X_K and the JSON say how far
    each moved (past 5%: 'moved'); a barrier is not checked; the governor
    has the lab after.  --no-k-check: none."""
    erack = governed_erack
    body = (
        "x, y = torch.ones(1 << 14), torch.ones(1 << 10)\n"
        "for _ in range(3):\n"
        "    dist.all_reduce(x)\n"
        "    dist.broadcast(y, 0)\n"
        "dist.barrier()\n"
        "assert x[0].item() == 8 ** 3\n"
    )
    js = tmp_path / "r.json"
    r = run_program(erack, tmp_path / "p.py", body, "--nodes", "h0,h1,h2,h3,h4,h5,h6,h7",
                    "--json", str(js))  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(js.read_text())
    checks = {c["collective"]: c for c in res["k_checks"]}
    assert set(checks) == {"all-reduce", "broadcast"}, res["k_checks"]
    assert checks["all-reduce"]["size_bytes"] == 1 << 16
    for c in checks.values():
        assert c["k_range"] == [res["k_range"][0]] * 2 and not c["wrong"], c
        assert c["k"] == 4 * c["k_range"][0]
        assert c["ratio"] == pytest.approx(c["time_us"] / c["time_us_at_k"])
        assert c["moved"] == (abs(c["ratio"] - 1) > 0.05 and not c["fell_behind"][1])
    rows = {x["collective"]: x for x in res["summary"]}
    assert rows["all-reduce"]["k_check"] == checks["all-reduce"]
    assert "k_check" not in rows["barrier"]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("all-reduce "))
    assert f"{checks['all-reduce']['ratio'] - 1:+.1%}" in line, r.stdout
    assert "AT_4X_K: bench's same collective" in r.stdout
    assert labs.control(erack, {"op": "governor"})["governor"]["on"]
    r = run_program(erack, tmp_path / "p.py", body, "--no-k-check", "--json", str(js))
    assert r.returncode == 0 and json.loads(js.read_text())["k_checks"] == [], r.stderr
