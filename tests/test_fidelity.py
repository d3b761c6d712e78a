"""The fidelity verdict on synthetic counter samples (no lab needed)."""

from dataplane import fidelity


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


def test_no_samples_no_verdict():
    assert fidelity.window([], 0.0, 1.0, 1e6) is None
    row = {"t0": 0.0, "t1": 1.0}
    fidelity.mark_row(row, [], {"topology": {"base_rtt_ns": 2000}, "time_scale": 10})
    assert row["fell_behind"] is False and row["pacing"] is None
