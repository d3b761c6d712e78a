"""The fidelity verdict on synthetic counter samples (no lab needed)."""

import pytest

from dataplane.report import fidelity, reports


def _sample(t: float, tx_frames: int, late_sum_ns: int, lost_ns: int) -> dict:
    # per port: tx_bytes, q_bytes, late_frames, late_sum_ns, tx_frames, lost_link_ns
    return {
        "t": t,
        "ports": {"plane0:h1": [tx_frames * 4000, 0, 0, late_sum_ns, tx_frames, lost_ns]},
    }


def test_a_window_that_lost_link_time_fell_behind():
    base_rtt_ns = 10e6
    ok = [_sample(0.0, 0, 0, 0), _sample(1.0, 1000, 1000 * 50_000, 10_000_000)]
    w = fidelity.window(ok, 0.1, 0.9, base_rtt_ns)
    assert not w["fell_behind"] and w["lost_link_share"] == 0.01
    lost = [_sample(0.0, 0, 0, 0), _sample(1.0, 1000, 0, 80_000_000)]
    assert fidelity.window(lost, 0.1, 0.9, base_rtt_ns)["fell_behind"]  # 8% of the link's time
    late = [_sample(0.0, 0, 0, 0), _sample(1.0, 1000, 1000 * 2_000_000, 0)]
    w = fidelity.window(late, 0.1, 0.9, base_rtt_ns)  # 2 ms late on a 10 ms RTT
    assert w["fell_behind"] and w["added_delay_share"] == 0.2


def test_frames_a_switch_lost_before_reading_them_mark_the_window():
    # every link on time, but a switch's RX ring overflowed: frames lost
    # that no emulated queue dropped (upn-512's all-to-all, otherwise clean)
    a, b = _sample(0.0, 0, 0, 0), _sample(1.0, 1000, 0, 0)
    assert not fidelity.window([a, b], 0.1, 0.9, 10e6)["fell_behind"]
    a["ring_drops"], b["ring_drops"] = 7, 7  # before the window only
    assert not fidelity.window([a, b], 0.1, 0.9, 10e6)["fell_behind"]
    b["ring_drops"] = 19
    w = fidelity.window([a, b], 0.1, 0.9, 10e6)
    assert w["fell_behind"] and w["ring_drops"] == 12
    assert fidelity.why("pacing", w) == ["the switches' RX rings dropped 12 frames"]


def test_no_samples_no_verdict():
    assert fidelity.window([], 0.0, 1.0, 1e6) is None
    row = {"t0": 0.0, "t1": 1.0}
    fidelity.mark_row(row, [], {"topology": {"base_rtt_ns": 2000}, "time_scale": 10})
    assert row["fell_behind"] is False and row["pacing"] is None


def _row(**engine) -> dict:
    return {"t0": 0.0, "t1": 1.0, "engines": [{"rank": 0}, {"rank": 1, **engine}]}


def test_an_endpoint_that_fell_behind_marks_the_row():
    """The switches' pacers can be on time while an endpoint is starved: its
    NIC engine ran behind its schedule, lost link time, dropped frames in
    its RX ring, or its threads waited for a CPU.  Each alone marks the row.
    Running behind is judged as a delay line is: by the delay it adds to a
    packet on average, against the real base RTT (here 20 us)."""
    rec = {"topology": {"base_rtt_ns": 2000}, "time_scale": 10}
    # behind 40% of the time by 8 us at a time: 1.6 us a packet, 8% of the RTT
    fine = _row(eng_late_sum_ns=400_000_000, eng_late_wakeups=50_000, eng_lost_ns=10_000_000,
                waited_s=0.2)  # fmt: skip
    fidelity.mark_row(fine, [], rec)
    assert fine["fell_behind"] is False and fine["endpoints"]["behind_share_max"] == 0.4
    assert fine["behind_why"] == []
    for engine in (
        # behind 6% of the time by 1 ms at a time: 30 us a packet, 1.5 RTTs
        {"eng_late_sum_ns": 60_000_000, "eng_late_wakeups": 60},
        {"eng_lost_ns": 60_000_000},  # its ports lost 6% of their time
        {"rx_ring_drops": 1},
        {"waited_s": 0.3},  # ready, not scheduled, 30% of the window
        # some engine of the lab behind 6% of the window (their union)
        {"any_late_ns": 60_000_000},
    ):
        row = _row(**engine)
        fidelity.mark_row(row, [], rec)
        assert row["fell_behind"] and row["endpoints"]["fell_behind"], engine
        assert len(row["behind_why"]) == 1, row["behind_why"]  # and says why
    tcp = {"t0": 0.0, "t1": 1.0}  # no figures from the ranks: no endpoint verdict
    fidelity.mark_row(tcp, [], rec)
    assert tcp["endpoints"] is None and tcp["fell_behind"] is False


def test_a_rank_hosts_cpu_counts_once_however_many_ranks_it_ran():
    """Every rank of a rank host reports the process's CPU so far: counted
    once per process (its latest report), and a rank alone in its process
    as itself."""
    ranks = [
        {"pid": 10, "cpu_s": 4.0},
        {"pid": 10, "cpu_s": 4.5},
        {"pid": 11, "cpu_s": 3.0},
        {"cpu_s": 1.0},  # an older worker's report, without its pid
    ]
    assert fidelity.workers_cpu_s(ranks) == pytest.approx(8.5)


def test_samples_pack_their_ports_and_share_the_names():
    a = fidelity.PortRows({"s0:h0": [1, 2, 3, 4, 5, 6], "s0:h1": [7, 8, 9, 10, 11, 1 << 62]})
    assert a["s0:h1"] == (7, 8, 9, 10, 11, 1 << 62) and "s0:h0" in a and "s9:h0" not in a
    assert list(a) == ["s0:h0", "s0:h1"] and len(a) == 2
    b = fidelity.PortRows({"s0:h0": [2] * 6, "s0:h1": [3] * 6}, a)
    assert b._index is a._index and dict(b) == {"s0:h0": (2,) * 6, "s0:h1": (3,) * 6}
    c = fidelity.PortRows({"s0:h1": [3] * 6}, a)  # another set of ports: names of its own
    assert c._index is not a._index and list(c) == ["s0:h1"]
    with pytest.raises(KeyError):
        a["s9:h0"]
    # the verdict reads packed samples as it reads plain ones
    lost = fidelity.PortRows({"p": [4000, 0, 0, 0, 1, 80_000_000]})
    samples = [{"t": 0.0, "ports": fidelity.PortRows({"p": [0] * 6})}, {"t": 1.0, "ports": lost}]
    w = fidelity.window(samples, 0.1, 0.9, 10e6)
    assert w["fell_behind"] and w["lost_link_share"] == 0.08


def test_a_large_lab_is_sampled_less_often():
    def lab(ports: int) -> dict:
        return {"topology": {"nodes": [{"role": "switch", "ports": [{}] * ports},
                                       {"role": "host", "ports": [{}] * 9999}]}}  # fmt: skip

    assert fidelity.sample_interval_s(lab(64)) == fidelity.SAMPLE_S
    assert fidelity.sample_interval_s(lab(512)) == fidelity.SAMPLE_S
    assert fidelity.sample_interval_s(lab(4096)) == pytest.approx(8 * fidelity.SAMPLE_S)


def test_a_size_run_again_is_judged_by_its_last_run_and_named():
    """A size that fell behind in the run and ran again clean at a larger k
    (trials.py): the report's verdicts are the kept rows' and it names the
    size run again, instead of listing it as fallen behind."""
    f = {"fell_behind_sizes": [4 << 20], "behind_why": [[4 << 20, ["x"]]], "clean": False,
         "cpu": {"saturated": False}}  # fmt: skip
    rows = [{"size_bytes": 1 << 20, "fell_behind": False},
            {"size_bytes": 4 << 20, "fell_behind": False}]  # fmt: skip
    fidelity.after_reruns(f, rows, [{"size_bytes": 4 << 20, "k_range": [6400.0, 9600.0]}])
    assert f["fell_behind_sizes"] == [] and f["clean"] and f["behind_why"] == []
    f.update(time_scale=6400.0, links=[], pacer={"late_frames": 0, "tx_frames": 0,
             "late_share": 0.0, "late_mean_ns": 0, "lost_link_ns": 0},
             cpu={"fabric_cores": 0.1, "workers_cores": 0.1, "machine_busy_share": 0.5,
                  "saturated": False}, drops={}, not_time_scaled=[])  # fmt: skip
    text = fidelity.render(f)
    assert "FELL BEHIND" not in text
    assert "ran again at a larger k" in text and "4194304 B (behind at k=6400-9600)" in text


def test_sizes_checked_at_a_larger_k_are_named_with_their_k_and_ratio():
    """After trials.check_k the report's k per size is the kept rows' (a size
    that moved is reported at the larger k), and the terminal report and the
    markdown one list each check, saying which moved."""
    f = {"fell_behind_sizes": [], "behind_why": [], "clean": True, "cpu": {"saturated": False},
         "k_per_size": [[1 << 20, [6400.0, 6400.0]]]}  # fmt: skip
    rows = [{"size_bytes": 1 << 20, "fell_behind": False, "k_range": [25600.0, 25600.0]}]
    checks = [{"size_bytes": 1 << 20, "k_range": [6400.0, 6400.0], "k": 25600.0, "ratio": 1.072,
               "moved": True}]  # fmt: skip
    fidelity.after_reruns(f, rows, [], checks)
    assert f["k_per_size"] == [[1 << 20, [25600.0, 25600.0]]] and f["k_checks"] == checks
    f.update(time_scale=6400.0, links=[], pacer={"late_frames": 0, "tx_frames": 0,
             "late_share": 0.0, "late_mean_ns": 0, "lost_link_ns": 0},
             cpu={"fabric_cores": 0.1, "workers_cores": 0.1, "machine_busy_share": 0.5,
                  "saturated": False}, drops={}, not_time_scaled=[])  # fmt: skip
    text = fidelity.render(f)
    assert "1048576 B k=25600" in text  # time scale per size: the kept row's
    assert "checked at 4x the k" in text and "1048576 B k=6400->25600 +7.2% moved" in text
    md = reports._k_checks_md(f)
    assert md and "1 MiB k 6400 -> 25600: 1.072 moved" in md[0]


def test_ranks_that_began_their_runs_far_apart_fell_behind():
    """The ranks leave one barrier together: a row whose ranks began their
    timed runs more than START_SKEW_MAX of the runs apart measured their
    processes' CPU, whatever the engines and switches say (upn-512's rank
    hosts: 30% apart, busbw 22% low, every other figure clean)."""

    def row(skew_s: float) -> dict:
        engine = {"rank": 0, "eng_late_sum_ns": 0, "eng_lost_ns": 0, "waited_s": 0.0}
        return {"t0": 10.0, "t1": 40.0, "n0": 0.0, "n1": 20e-6, "start_skew_s": skew_s,
                "engines": [engine, {**engine, "rank": 1}]}  # fmt: skip

    late = fidelity.engines_window(row(6e-6), base_rtt_real_ns=1e6)
    assert late["fell_behind"] and late["start_skew_share"] == pytest.approx(0.3)
    assert "began their timed runs 30.0% of those runs apart" in late["why"][0]
    assert not fidelity.engines_window(row(0.2e-6), base_rtt_real_ns=1e6)["fell_behind"]
