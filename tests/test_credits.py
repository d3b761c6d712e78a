"""Receiver credits (RCCC-like) on a real lab: every ack and NACK carries
the receiver's grant, an equal share of its BDP among the peers with a
message under way to it, and a sender running `rccc` keeps no more than
its grant in flight (nic.c). Ground truth is the switches' trim counters
and queues, with every byte checked."""

import numpy as np
import pytest
from labtools import MiB, capture_cli, incast, shared_lab

from dataplane.lab.nic import Endpoint

pytestmark = pytest.mark.root


erack = shared_lab("traffic_erack")


def test_receiver_credits_keep_a_four_to_one_incast_from_trimming(erack, record_property):
    nscc, rccc = incast(erack, "nscc", 8 * MiB), incast(erack, "rccc", 8 * MiB)
    for name, r in (("nscc", nscc), ("rccc", rccc)):
        for k in ("goodput_bps", "queue_mean_bytes", "trimmed", "retx_nack"):
            record_property(f"{name}_{k}", round(r[k]))
    # the receiver counts its senders and grants whatever they run; only
    # an rccc sender takes the grant: a quarter of the budget each
    assert nscc["rx_senders_mode"] == rccc["rx_senders_mode"] == 4, (nscc, rccc)
    assert nscc["credit_mode_bytes"] == 0
    assert rccc["credit_mode_bytes"] == rccc["bdp_bytes"] // 4, rccc
    # NSCC starts each sender at 1.5 x BDP and learns of the incast from
    # trims; with credits the four together hold one BDP (measured at 8 MiB
    # each: no trims against 1113-1289, a quarter of the queue, 0.97-1.04x
    # the goodput)
    assert rccc["trimmed"] < 0.1 * nscc["trimmed"], (nscc, rccc)
    assert rccc["queue_mean_bytes"] < 0.5 * nscc["queue_mean_bytes"], (nscc, rccc)
    assert rccc["goodput_bps"] > 0.8 * nscc["goodput_bps"], (nscc, rccc)


def test_capture_shows_the_grant_each_ack_carries(erack):
    """One sender alone gets the receiver's whole BDP; `ethplus capture`
    prints the grant of every ack it sees."""
    p = capture_cli(erack, "h7-plane0", "-c", "40", "--seconds", "20")
    a, b = Endpoint(erack.name, "h1", cc="rccc"), Endpoint(erack.name, "h7")
    try:
        src = np.random.default_rng(3).integers(0, 256, 2 * MiB, dtype=np.uint8)
        dst = np.zeros_like(src)
        hr, hs = b.post_recv(a.rank, 1, dst), a.post_send(b.rank, 1, src)
        assert a.wait(hs, 60) == b.wait(hr, 60) == src.size
        assert np.array_equal(src, dst)
        assert a.counters(b.rank)["credit_bytes"] == b.config["bdp_bytes"]
    finally:
        a.close()
        b.close()
    out, err = p.communicate(timeout=40)
    acks = [ln for ln in out.splitlines() if "ETH+ ack" in ln]
    assert p.returncode == 0 and acks, (out, err)
    assert all(f"grant {b.config['bdp_bytes']} B" in ln for ln in acks), acks[:3]
