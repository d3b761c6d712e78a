"""Scenarios: every one runs (short form) over every transport it names with
zero #wrong and a fidelity report; plane failure loses and duplicates nothing;
runs are reproducible from the seed; bad scenario files get one-line errors."""

import itertools
import json
import statistics
import warnings

import pytest
from conftest import ethplus
from labtools import module_lab

from dataplane.report import reports
from dataplane.run import bench, scenario

KiB, MiB = 1024, 1 << 20


erack = module_lab("sc", "erack-8x4", name_only=True)


clos = module_lab("sc", "clos-16", name_only=True)


def _run(lab: str, name: str, out, *extra: str) -> dict:
    r = ethplus("scenario", "run", name, "--short", "--lab", lab, "--out", str(out), *extra,
                timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"report: {out}/report.md" in r.stdout
    return json.loads((out / "results.json").read_text())


@pytest.mark.root
@pytest.mark.parametrize("name", [s.name for s in scenario.listing()])
def test_every_scenario_runs_on_every_transport(request, name, tmp_path):
    sc = scenario.load(name, short=True)
    lab = request.getfixturevalue("erack" if sc.lab == "erack-8x4" else "clos")
    res = _run(lab, name, tmp_path / name)
    assert list(res["transports"]) == sc.transports
    for t, r in res["transports"].items():
        for jname, j in r["jobs"].items():
            assert j["status"] == "ok", f"{t} {jname}: {j}"
            assert j["wrong"] == 0
        assert r["fidelity"] and "not_time_scaled" in r["fidelity"]
        assert len(r["faults_applied"]) == len(sc.faults)
        tcp = r["fidelity"]["kernel_tcp"]  # the kernel's own counts (TCP_INFO)
        assert bool(tcp) == (t == "tcp"), tcp
        if t == "tcp" and name == "lossy-link":  # corrupted frames are resent
            assert tcp["tcp_retx_segs"] > tcp["tcp_setup_retx_segs"], tcp
        if t == "tcp" and name == "plane-failure":  # a dead plane's connections time out
            assert tcp["tcp_rtos"] > tcp["tcp_setup_rtos"], tcp  # in the traffic, not set-up
            assert tcp["tcp_rto_time_ms"] > tcp["tcp_setup_rto_time_ms"], tcp
        again, headline = _recomputed(sc, r), res["summary"]["figures"][t]
        assert (again is None) == (headline is None), (t, again, headline)
        assert again is None or again == pytest.approx(headline, rel=1e-9), (t, again, headline)
    md = (tmp_path / name / "report.md").read_text()
    assert sc.explain.split()[0] in md and "## Result" in md
    assert "k check: not run (`--check-k`" in md  # and what it would cost
    for png in ("timeline.png", "busbw.png", "link-utilisation.png", "queue-depth.png"):
        assert (tmp_path / name / png).stat().st_size > 10_000


def _recomputed(sc, r: dict) -> float | None:
    """A transport's headline figure worked out again from its run's
    per-iteration timeline and faults, without timeline.py: what the
    headline must agree with."""
    if sc.alone or sc.metric in ("jct", "busbw"):
        return res_figure_by_jobs(sc, r)
    its = next(iter(r["jobs"].values()))["iterations"]
    spans = [(x["start_nominal_us"], x["end_nominal_us"], x["busbw_GBps"]) for x in its]
    at = [f["at_nominal_us"] for f in r["faults_applied"]]
    if sc.metric == "slowdown":
        lo, hi = at[0], at[1] if len(at) > 1 else float("inf")
        met = [(a, b) for a, b, _ in spans if a < hi and b > lo]
        clean = sorted(b - a for a, b, _ in spans if not (a < hi and b > lo))
        if not met or len(clean) < 2:
            return None
        mid = len(clean) // 2
        median = clean[mid] if len(clean) % 2 else (clean[mid - 1] + clean[mid]) / 2
        return (max(b for _, b in met) - min(a for a, _ in met)) / (len(met) * median)
    edges = [0.0, *at, float("inf")]  # phases: whole iterations of the last span over the first's
    bw = [[w for a, b, w in spans if a >= lo and b <= hi]
          for lo, hi in zip(edges, edges[1:], strict=False)]  # fmt: skip
    if len(bw) < 2 or len(bw[0]) < 2 or len(bw[-1]) < 2:
        return None
    return (sum(bw[-1]) / len(bw[-1])) / (sum(bw[0]) / len(bw[0]))


def res_figure_by_jobs(sc, r: dict) -> float | None:
    jobs = list(r["jobs"].values())
    if sc.alone:
        return max(j["slowdown_vs_alone"] or 0.0 for j in jobs)
    if sc.metric == "jct":
        return max(j["jct_nominal_us"] for j in jobs)
    return min(j["busbw_GBps"] for j in jobs)


@pytest.mark.root
def test_plane_failure_loses_and_duplicates_nothing(erack, tmp_path):
    res = _run(erack, "plane-failure", tmp_path / "pf", "--transports", "ethplus")
    e = res["transports"]["ethplus"]
    assert [f["set"] for f in e["faults_applied"]] == ["down", "up"]
    job = e["jobs"]["allreduce"]
    assert job["status"] == "ok" and job["wrong"] == 0
    c = e["results"]["allreduce"]["nic_counters"]
    assert c["msgs_sent"] == c["msgs_received"] > 0  # every message once
    slowdown = res["summary"]["figures"]["ethplus"]
    assert slowdown is not None and slowdown > 0
    md = (tmp_path / "pf" / "report.md").read_text()
    assert "4/3" in md


@pytest.mark.root
def test_a_seed_reproduces_faults_and_traffic(erack, tmp_path):
    runs = [
        _run(erack, "lossy-link", tmp_path / f"r{i}", "--transports", "ethplus") for i in range(2)
    ]
    fa = [r["transports"]["ethplus"]["faults_applied"] for r in runs]
    assert [f["planned_us"] for f in fa[0]] == [f["planned_us"] for f in fa[1]]
    # A fault lands on the fabric's clock: at its planned nominal time, a
    # little late (the schedule looks every few ms of real time), and the
    # run says how late.
    for f in fa[0] + fa[1]:
        assert f["at_nominal_us"] >= f["planned_us"]
        assert f["late_us"] == pytest.approx(f["at_nominal_us"] - f["planned_us"])
    first_tx = [
        (c["tx_data_bytes"] - c["retx_bytes"], c["msgs_sent"])
        for c in (r["transports"]["ethplus"]["results"]["allreduce"]["nic_counters"] for r in runs)
    ]
    assert first_tx[0] == first_tx[1]


@pytest.mark.root
def test_iters_sets_every_jobs_iterations_and_the_report_gives_their_range(clos, tmp_path):
    res = _run(clos, "incast-alltoall", tmp_path / "ia", "--transports", "ethplus,tcp",
               "--iters", "3")  # fmt: skip
    s = res["summary"]
    for t in ("ethplus", "tcp"):
        (job,) = res["transports"][t]["jobs"].values()
        assert len(job["iterations"]) == 3
        # the spread is the bench row's: each rank's own iterations (the
        # timeline in job["iterations"] is the job's, across the ranks)
        lo, hi = s["spread"][t]
        assert [lo, hi] == job["busbw_range_GBps"] and lo <= hi
        assert 0.95 * lo <= s["figures"][t] <= 1.05 * hi  # the mean lies within
    md = (tmp_path / "ia" / "report.md").read_text()
    assert "iterations' range" in md and f"{s['spread']['tcp'][0]:.3f}-" in md
    r = ethplus("scenario", "run", "incast-alltoall", "--iters", "0")
    assert r.returncode == 2 and "--iters" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.root
def test_check_k_runs_each_transport_again_at_a_larger_k_and_gives_the_lab_back(erack, tmp_path):
    from dataplane.lab import clock

    fabric_clock = clock.Clock.open(erack)
    k_before = fabric_clock.k
    out = tmp_path / "kc"
    r = ethplus("scenario", "run", "incast-alltoall-erack", "--short", "--lab", erack,
                "--out", str(out), "--transports", "ethplus,tcp", "--iters", "2",
                "--check-k", "--check-factor", "2", "--repeat", "2", timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "results.json").read_text())
    check = res["k_check"]
    assert check["factor"] == 2 and check["k_top"] == k_before  # a pinned lab: its k
    assert check["repeat"] == 2 and "2 runs each, medians" in r.stdout
    md = (out / "report.md").read_text()
    assert "the median of 2 runs" in md
    for t in ("ethplus", "tcp"):
        figs = [x["figure"] for x in res["transports"][t]["repeats"]]
        assert len(figs) == 2 and res["summary"]["figures"][t] == pytest.approx(sum(figs) / 2)
        assert f"Runs ({res['summary']['unit']}): {figs[0]:.4g} at k={k_before:g}" in md
        assert "(median of 2 runs)" in r.stdout
        pinned = [x["figure"] for x in check["runs"][t]["repeats"]]
        assert f"{t} at k={2 * k_before:g}: Runs: {pinned[0]:.4g} at k={2 * k_before:g}" in md
        c = check["transports"][t]
        assert c["k_range"] == [k_before, k_before]
        assert c["k"] == 2 * k_before and c["k_range_at_k"] == [c["k"], c["k"]]  # ran there
        assert c["figure"] == res["summary"]["figures"][t] and c["figure_at_k"] > 0
        assert c["ratio"] == pytest.approx(c["figure"] / c["figure_at_k"])
        assert c["wrong"] == 0 and c["real_s"] > 0
        if not any(c["fell_behind"]):
            assert c["held"] == (abs(c["ratio"] - 1) <= c["band"])
        line = f"{t}: {c['figure']:.4g} at k={k_before:g}, {c['figure_at_k']:.4g} at k={c['k']:g}"
        assert line in md
        assert f"at k={c['k']:g}" in r.stdout
    assert check["transports"]["tcp"]["band"] > check["transports"]["ethplus"]["band"]
    assert set(check["ethplus_advantage_at_k"]) == {"tcp"}
    assert "## At a larger time scale" in md and "k check: not run" not in md
    assert fabric_clock.k == k_before  # the lab's k given back as it was
    bad = ethplus("scenario", "run", "incast-alltoall-erack", "--check-factor", "1")
    assert bad.returncode == 2 and "--check-factor" in bad.stderr and "above 1" in bad.stderr
    alone = ethplus("scenario", "run", "incast-alltoall-erack", "--check-factor", "2")
    assert alone.returncode == 2 and "only with --check-k" in alone.stderr
    none = ethplus("scenario", "run", "incast-alltoall-erack", "--repeat", "0")
    assert none.returncode == 2 and "--repeat: expected a positive number" in none.stderr
    assert "Traceback" not in bad.stderr + alone.stderr + none.stderr


BAD = {
    "no-scenario": ('[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n', "scenario"),
    "bad-collective": (
        '[scenario]\nlab = "erack-8x4"\n[[job]]\ncollective = "gather"\nsizes = ["1M"]\n',
        "job.job0.collective",
    ),
    "bad-size": (
        '[scenario]\nlab = "erack-8x4"\n[[job]]\ncollective = "all-reduce"\nsizes = ["1Q"]\n',
        "job.job0.sizes",
    ),
    "bad-transport": (
        '[scenario]\nlab = "erack-8x4"\ntransports = ["udp"]\n'
        '[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n',
        "scenario.transports",
    ),
    "bad-fault": (
        '[scenario]\nlab = "erack-8x4"\n[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n'
        '[[fault]]\nat_us = 1\nlink = "h0-plane0"\nset = "melt"\n',
        "fault[0].set",
    ),
    "fault-both": (
        '[scenario]\nlab = "erack-8x4"\n[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n'
        '[[fault]]\nat_us = 1\nlink = "h0-plane0"\nnode = "plane0"\nset = "down"\n',
        "fault[0]",
    ),
    "real-seconds": (  # faults were once planned in real seconds: refused, how to convert said
        '[scenario]\nlab = "erack-8x4"\n[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n'
        '[[fault]]\nat_s = 3.0\nnode = "plane0"\nset = "down"\n',
        "fault[0].at_s",
    ),
    "overlap": (
        '[scenario]\nlab = "erack-8x4"\n[[job]]\nname = "a"\ncollective = "all-reduce"\n'
        'sizes = ["1M"]\nnodes = ["h0", "h1"]\n[[job]]\nname = "b"\ncollective = "all-reduce"\n'
        'sizes = ["1M"]\nnodes = ["h1", "h2"]\n',
        "job.b.nodes",
    ),
    "unknown-key": ('[scenario]\nlab = "erack-8x4"\nspeed = 3\n', "scenario.speed"),
    "bad-short": (
        '[scenario]\nlab = "erack-8x4"\n[short]\niters = "x"\n'
        '[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n',
        "short.iters",
    ),
    "no-fault-time": (
        '[scenario]\nlab = "erack-8x4"\n[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n'
        '[[fault]]\nnode = "plane0"\nset = "down"\n',
        "fault[0].at_us",
    ),
    "not-toml": ("[scenario\n", "file"),
    "bad-algo": (
        '[scenario]\nlab = "erack-8x4"\n[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n'
        'algo = "butterfly"\n',
        "job.job0.algo",
    ),
    "bad-cc": (
        '[scenario]\nlab = "erack-8x4"\ncc = "dctcp"\n[[job]]\ncollective = "all-reduce"\n'
        'sizes = ["1M"]\n',
        "scenario.cc",
    ),
    "cc-of-roce": (
        '[scenario]\nlab = "erack-8x4"\ntransports = ["ethplus", "roce/hpcc"]\n[[job]]\n'
        'collective = "all-reduce"\nsizes = ["1M"]\n',
        "scenario.transports",
    ),
    "unknown-cc-run": (
        '[scenario]\nlab = "erack-8x4"\ntransports = ["ethplus/cubic"]\n[[job]]\n'
        'collective = "all-reduce"\nsizes = ["1M"]\n',
        "scenario.transports",
    ),
    "in-network-over-roce": (
        '[scenario]\nlab = "erack-8x4"\ntransports = ["ethplus", "roce"]\n[[job]]\n'
        'collective = "all-reduce"\nsizes = ["1M"]\nalgo = "in-network"\n',
        "scenario.transports",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenario_files_are_one_line_errors(case, tmp_path):
    text, key = BAD[case]
    f = tmp_path / f"{case}.toml"
    f.write_text(text)
    r = ethplus("scenario", "run", str(f))
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and str(f) in line and f"{key}:" in line and "expected" in line, line
    assert "Traceback" not in r.stderr


def test_a_scenario_chooses_the_congestion_control_of_ethplus_only(tmp_path):
    f = tmp_path / "cc.toml"
    f.write_text('[scenario]\nlab = "erack-8x4"\ncc = "hpcc"\n[[job]]\ncollective = "all-reduce"\n'
                 'sizes = ["1M"]\n')  # fmt: skip
    sc = scenario.load(str(f))
    assert scenario._spec(sc, sc.jobs[0], "ethplus").cc == "hpcc"
    assert scenario._spec(sc, sc.jobs[0], "roce").cc is None  # DCQCN is RoCE's own
    assert bench.run_name(scenario._spec(sc, sc.jobs[0], "ethplus")) == "ethplus/hpcc"


def test_a_scenario_compares_two_congestion_controls_of_ethplus(tmp_path):
    f = tmp_path / "two-cc.toml"
    f.write_text('[scenario]\nlab = "erack-8x4"\ncc = "nscc"\n'
                 'transports = ["ethplus/hpcc", "ethplus", "roce"]\n'
                 '[[job]]\ncollective = "all-reduce"\nsizes = ["1M"]\n')  # fmt: skip
    sc = scenario.load(str(f))
    specs = [scenario._spec(sc, sc.jobs[0], t) for t in sc.transports]
    assert [(s.transport, s.cc) for s in specs] == [
        ("ethplus", "hpcc"),  # named in the run: it wins over [scenario] cc
        ("ethplus", "nscc"),
        ("roce", None),
    ]
    assert [bench.run_name(s) for s in specs] == ["ethplus/hpcc", "ethplus/nscc", "roce"]
    # plain ethplus is the reference when it ran; else the first ethplus run
    assert scenario.reference_run(sc.transports) == "ethplus"
    assert scenario.reference_run(["roce", "ethplus/nscc", "ethplus/hpcc"]) == "ethplus/nscc"
    assert scenario.reference_run(["roce", "tcp"]) is None
    # a bad --transports names what is allowed, in one line
    r = ethplus("scenario", "run", str(f), "--transports", "ethplus/bbr")
    assert r.returncode == 2 and "ethplus/hpcc" in r.stderr and "Traceback" not in r.stderr


def test_every_shipped_scenario_loads_in_both_forms():
    names = {s.name for s in scenario.listing()}
    assert {"ecmp-collision", "incast-alltoall", "plane-failure", "lossy-link", "two-jobs"} <= names
    for n in names:
        full, short = scenario.load(n), scenario.load(n, short=True)
        assert full.explain and short.short
        assert sum(j.sizes[-1] * j.iters for j in short.jobs) <= sum(
            j.sizes[-1] * j.iters for j in full.jobs
        )


def test_the_timeline_of_a_job_that_stalled_before_any_iteration_plots_cleanly(tmp_path):
    """A transport whose only job never finished an iteration (roce on
    plane-failure) still gets its panel, with no legend to draw and no
    warning."""
    result = {
        "scenario": "plane-failure",
        "transports": {
            "roce": {
                "label": "RoCEv2 (emulated)",
                "jobs": {"allreduce": {"iterations": []}},
                "faults_applied": [{"at_s": 3.0, "name": "plane2", "set": "down"}],
                "stalled": ["allreduce"],
            }
        },
    }
    out = tmp_path / "timeline.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reports.plot_timeline(result, out, k=6400.0)
    assert out.stat().st_size > 1000


def test_scenario_times_are_nominal_and_a_behind_job_is_said():
    """The headline JCT is nominal (us), comparable across time scales; a run
    any of whose jobs fell behind is listed, and the report says so."""
    from dataplane.run import scenario as sc_mod

    sc = sc_mod.load("netns-labs/scenarios/ecmp-collision.toml")
    its = [{"size": 1, "time_nominal_us": t} for t in (300.0, 400.0, 300.0)]
    out = {"transports": {
        "ethplus": {"jobs": {"a": {"status": "ok", "jct_real_s": 6.4, "jct_nominal_us": 1000.0,
                                   "fell_behind": False, "iterations": its}}},
        "tcp": {"jobs": {"a": {"status": "ok", "jct_real_s": 12.8, "jct_nominal_us": 2000.0,
                               "fell_behind": True}}},
    }}  # fmt: skip
    s = sc_mod.summary(sc, out)
    assert s["metric"] == "jct" and "nominal us" in s["unit"]
    assert s["figures"] == {"ethplus": 1000.0, "tcp": 2000.0}
    assert s["ethplus_advantage"] == {"tcp": 2.0} and s["fell_behind"] == ["tcp"]
    # the JCT had every iteration been the best or the worst of the three
    assert s["spread"] == {"ethplus": [900.0, 1200.0], "tcp": None}


def test_a_governed_runs_timeline_and_stalls_are_read_on_the_fabric_clock(tmp_path):
    """When k moves during a run, real seconds no longer map onto nominal
    time by one factor: the third iteration took 8 s of real time because
    the governor had raised k, not because the transport stalled (50 us
    nominal against a median of 100).  Iterations, faults and stalls are
    read on the fabric clock."""
    from dataplane.run import scenario as sc_mod

    job = {
        "world": 2, "collective": "all-reduce", "lab": {"time_scale": 6400.0},
        "real_rows": [{"size": MiB, "t0": 100.0, "ends": [101.0, 102.0, 110.0],
                       "n0": 5.0, "nends": [5.0001, 5.0002, 5.00025]}],
    }  # fmt: skip
    its = sc_mod._iterations(job, 99.0, 4.9999)
    assert [round(x["start_nominal_us"], 3) for x in its] == [100.0, 200.0, 300.0]
    assert [round(x["end_nominal_us"], 3) for x in its] == [200.0, 300.0, 350.0]
    assert [round(x["time_nominal_us"], 3) for x in its] == [100.0, 100.0, 50.0]
    faults = [{"at_s": 10.5, "at_nominal_us": 330.0, "planned_us": 320.0, "late_us": 10.0,
               "name": "plane2", "set": "down", "target": "node"}]  # fmt: skip
    st = sc_mod.analyse(its, faults)
    assert st["stalls"] == [] and st["stalled_nominal_us"] == 0.0  # no stall
    assert round(st["longest_iteration_nominal_us"], 3) == 100.0
    # a stall is a nominal one: 400 us against a median of 100
    slow = [*its[:2], {**its[2], "end_nominal_us": 700.0, "time_nominal_us": 400.0}]
    assert round(sc_mod.analyse(slow, faults)["stalled_nominal_us"], 3) == 300.0
    r = {"jobs": {"a": {"status": "ok", "iterations": its, **st}}, "faults_applied": faults,
         "results": {}}  # fmt: skip
    lines = " ".join(reports._stall_lines(r, 6400.0))
    assert "did not stall (longest iteration 100.0 us, median 100.0 us" in lines
    out = tmp_path / "timeline.png"
    reports.plot_timeline({"scenario": "x", "transports": {"ethplus": {**r, "label": "ETH+",
                           "stalled": []}}}, out, k=6400.0)  # fmt: skip
    assert out.stat().st_size > 1000


def _timeline(times_us: list[float], bw: float = 100.0) -> list[dict]:
    """Back-to-back iterations of these nominal durations, from 0."""
    out, t = [], 0.0
    for d in times_us:
        out.append({"size": MiB, "start_nominal_us": t, "end_nominal_us": t + d,
                    "time_nominal_us": d, "busbw_GBps": bw * 85.0 / d,
                    "start_s": t / 10, "end_s": (t + d) / 10})  # fmt: skip
        t += d
    return out


def test_a_stall_across_the_whole_fault_window_is_the_slowdown_not_a_phase_against_itself():
    """Kernel TCP on plane-failure, as a run once printed it: the first timed
    iteration took 1,595.5 us nominal against 82-89 us for every other, and
    spanned the whole fault window (down at 69.5 us, up at 500 us).  Read
    by phases, "before any fault" and "after plane2 down" were that one
    iteration each, so the slowdown came out 1.000.  On the timeline it is
    a stall of about 1,510 us, and the window's slowdown about 18.8."""
    from dataplane.run import scenario as sc_mod

    sc = sc_mod.load("plane-failure")
    its = _timeline([1595.5] + [82.0 + (i % 8) for i in range(23)])
    faults = [
        {"at_s": 3.0, "at_nominal_us": 69.5, "name": "plane2", "set": "down", "target": "node"},
        {"at_s": 10.0, "at_nominal_us": 500.0, "name": "plane2", "set": "up", "target": "node"},
    ]
    tcp = {"status": "ok", "iterations": its, **sc_mod.analyse(its, faults)}
    fs = tcp["fault_slowdown"]
    assert fs["iterations"] == 1 and fs["clean_iterations"] == 23
    assert fs["slowdown"] == pytest.approx(1595.5 / 85.0)
    assert [s["iteration"] for s in tcp["stalls"]] == [0]
    median = statistics.median(x["time_nominal_us"] for x in its)  # the job's, the stall's too
    assert tcp["stalled_nominal_us"] == pytest.approx(1595.5 - median)
    # a phase is never one iteration against itself: too few whole ones, said
    assert [p["busbw_GBps"] for p in tcp["phases"][:2]] == [None, None]
    # ETH+ through the same window: a third slower while the plane was down
    eth = _timeline([85.0] * 4 + [85.0 * 4 / 3] * 3 + [85.0] * 17)
    faults_e = [{**faults[0], "at_nominal_us": 300.0}, {**faults[1], "at_nominal_us": 640.0}]
    e = {"status": "ok", "iterations": eth, **sc_mod.analyse(eth, faults_e)}
    assert e["stalls"] == [] and 1.2 < e["fault_slowdown"]["slowdown"] < 4 / 3 + 1e-9
    out = {"transports": {"ethplus": {"jobs": {"allreduce": e}},
                          "tcp": {"jobs": {"allreduce": tcp}}}}  # fmt: skip
    s = sc_mod.summary(sc, out)
    assert s["figures"]["tcp"] == pytest.approx(18.77, abs=0.01)
    assert s["ethplus_advantage"]["tcp"] > 10
    rec = {"topology": {"nodes": [{"name": f"plane{p}", "role": "switch", "plane": p}
                                  for p in range(4)]}}  # fmt: skip
    assert reports.plane_bound({"planned_faults": [vars(f) for f in sc.faults]}, rec) == 4 / 3
    lines = " ".join(reports._stall_lines({"jobs": {"allreduce": tcp}, "faults_applied": faults,
                                           "results": {}}, 19200.0))  # fmt: skip
    assert f"**allreduce stalled** {1595.5 - median:.1f} us nominal" in lines
    assert "typical 0.0" not in lines
    # too few iterations outside the window: no figure, and why
    short = _timeline([2000.0, 85.0])
    fs = sc_mod.analyse(short, faults)["fault_slowdown"]
    assert fs["slowdown"] is None and "fewer than 2" in fs["why"]
    said = reports.figure_text({"jobs": {"allreduce": sc_mod.analyse(short, faults)}}, None)
    assert said.startswith("none: ") and "fewer than 2" in said, said


def test_a_counted_run_that_fell_behind_runs_again_at_a_larger_k(monkeypatch):
    """On a governed lab the counted run (faults and all) that fell behind
    all the same runs again once the governor raised k, as bench's sizes
    do; the report says which runs it replaced.  (The lab is not needed:
    the jobs' runs and the governor are stood in for.)"""
    from dataplane.run import scenario as sc_mod
    from dataplane.run import trials

    ks = iter([6400.0, 9600.0, 14400.0])

    def run_jobs(sc, rec, tname, jobs, with_faults, log):
        k = next(ks)
        row = {"k_range": [k, k], "fell_behind": k < 14400.0}
        return {"jobs": {"j": {"rows": [row]}}, "errors": {}, "faults": []}

    monkeypatch.setattr(sc_mod, "_run_jobs", run_jobs)
    monkeypatch.setattr(sc_mod, "_governing", lambda rec: True)
    monkeypatch.setattr(trials, "_wait_for_a_change", lambda rec, k: True)  # the governor raised k
    said = []
    sc = sc_mod.load("netns-labs/scenarios/ecmp-collision.toml")
    res, real_s, reruns = sc_mod._counted(sc, {"name": "x"}, "ethplus", said.append, True)
    assert res["jobs"]["j"]["rows"][0]["k_range"] == [14400.0, 14400.0]  # the last run's
    assert [r["k_range"] for r in reruns] == [[6400.0, 6400.0], [9600.0, 9600.0]]
    assert all(r["fell_behind"] for r in reruns) and real_s >= 0
    assert any("fell behind" in m for m in said)
    md_lines = " ".join(
        reports.scenario_markdown(
            {"scenario": "x", "short": True, "description": "", "explain": "", "seed": 1,
             "planned_faults": [], "summary": {"metric": "jct", "figures": {}, "spread": {},
                                               "ethplus_advantage": {}, "fell_behind": []},
             "transports": {"ethplus": {"label": "ETH+", "k_range": [14400.0, 14400.0],
                                        "reruns": reruns, "faults_applied": [],
                                        "jobs": {"j": {"status": "failed", "error": "-"}},
                                        "results": {}, "fidelity": None}}},
            {"name": "x", "family": "erack", "file": "f", "time_scale": 6400.0,
             "time_scale_setting": "auto", "topology": {"nodes": []}},
        ).splitlines()
    )  # fmt: skip
    assert "fell behind at k = 6400, 9600 and ran again at a larger k (2 time(s))" in md_lines
    assert "k = 14400." in md_lines and "governed: its floor" in md_lines
    # not governed (or a check's run): one run, whatever its verdict
    ks = iter([6400.0])
    res, _, reruns = sc_mod._counted(sc, {"name": "x"}, "ethplus", said.append, False)
    assert reruns == [] and res["jobs"]["j"]["rows"][0]["fell_behind"]


def test_repeated_runs_give_the_median_and_every_run_is_kept(monkeypatch):
    """`--repeat N`: a transport runs N times; its figure is the median of
    the runs' figures, its tables the median run's, its k range all of
    theirs, and a run that fell behind, went wrong or failed is not hidden
    by the others.  (The runs are stood in for: what is tested is the
    choice.)"""
    from dataplane.run import scenario as sc_mod

    sc = sc_mod.load("netns-labs/scenarios/ecmp-collision.toml")
    jcts = iter([300.0, 100.0, 200.0, 400.0, None])
    counter = itertools.count()

    def transport(sc, rec, tname, log, with_trials=True, rerun=None):
        jct, n = next(jcts), next(counter)
        calls.append((with_trials, rerun))
        job = {"status": "ok" if jct else "failed", "jct_nominal_us": jct or 0.0,
               "fell_behind": n == 3, "wrong": 1 if n == 3 else 0, "iterations": []}  # fmt: skip
        return {"jobs": {j.name: dict(job) for j in sc.jobs}, "k_range": [6400.0 * (n + 1)] * 2,
                "reruns": [], "real_s": 1.0, "jct": jct}  # fmt: skip

    calls: list = []
    monkeypatch.setattr(sc_mod, "_transport", transport)
    said: list[str] = []
    r = sc_mod._repeated(sc, {}, "ethplus", said.append, 3)
    assert r["jct"] == 200.0 and r["figure_median"] == 200.0  # the middle run is the one shown
    assert [x["figure"] for x in r["repeats"]] == [300.0, 100.0, 200.0]
    assert r["k_range"] == [6400.0, 19200.0] and r["real_s"] == 3.0
    assert calls == [(True, True), (False, True), (False, True)]  # trials before the first only
    assert "run 2 of 3" in " ".join(said)
    out = {"transports": {"ethplus": r}}
    assert sc_mod.summary(sc, out)["figures"]["ethplus"] == 200.0
    assert sc_mod.summary(sc, out)["fell_behind"] == [] and sc_mod.wrong(r) == 0
    # the fourth run fell behind and went wrong, the fifth failed: both are said
    calls.clear()
    r = sc_mod._repeated(sc, {}, "ethplus", said.append, 2, with_trials=False)
    assert r["figure_median"] is None and r["jct"] is None  # the failed run is the one shown
    assert calls == [(False, False), (False, False)]  # a check's runs: no trials, no reruns
    assert sc_mod.summary(sc, {"transports": {"ethplus": r}})["fell_behind"] == ["ethplus"]
    assert sc_mod.wrong(r) == len(sc.jobs)
    md = reports.repeats_line(r["repeats"], r["figure_median"], "us")
    assert "Runs (us): 400 at k=25600, behind; stalled or failed at k=32000" in md
    assert "Median none" in md
    # one run: as it is, no repeats recorded
    jcts = iter([50.0])
    assert "repeats" not in sc_mod._repeated(sc, {}, "ethplus", said.append, 1)
