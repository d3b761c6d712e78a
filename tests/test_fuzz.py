"""The protocol-aware fuzzer (dataplane/run/fuzz.py) against a running lab: at
least 200,000 frames, each valid up to one field, from a lab node through
its switch and straight onto an endpoint's link, while the other
accelerators run all-reduces (every run checked) over ETH+ and over the
emulated RoCE.  Nothing crashes, every result is byte-exact, and every frame
ends somewhere counted: the switches' conservation check and every
endpoint's receive balance hold."""

import pytest
from labtools import shared_lab

from dataplane.lab import core, registry
from dataplane.run import fuzz
from dataplane.run.job import fabric_stats

pytestmark = pytest.mark.root


erack = shared_lab("traffic_erack", name_only=True)


def test_fuzzer_covers_every_opcode_form_and_field():
    rec_like = fuzz.Node(b"\x02" * 6, b"\x06" * 6, 0xC6120008, 7)
    fz = fuzz.Fuzzer(rec_like, fuzz.Node(b"\x02" * 6, b"\x06" * 6, 0xC6120001, 0), 0)
    names = [name for name, _ in zip_n(fz.frames(), 3 * len(fuzz.OPCODES) * len(fz.cases))]
    forms = {n.split("/")[0] for n in names}
    fields = {n.split("/")[2].split("=")[0] for n in names}
    assert forms == {"udp", "compact", "roce"}
    assert {f"op{o}" for o in fuzz.OPCODES} == {n.split("/")[1] for n in names}
    assert set(fuzz.FIELDS) | {"int_hops", "cut", "extra"} == fields
    flags = {n for n in names if "/flags=" in n and n.startswith("udp/op1/")}
    assert len(flags) == 66  # every combination of the six flags, and undefined bits


def zip_n(it, n):
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


@pytest.mark.parametrize("transport", ["ethplus", "roce"])
def test_100k_fuzzed_frames_per_transport_break_nothing(erack, transport):
    """Two runs of 100,000 frames (200,000 in all)."""
    out = fuzz.campaign(erack, 100_000, attacker="h7", target="h0", transport=transport,
                        rate_fps=25_000, seed=11 if transport == "ethplus" else 12)  # fmt: skip
    assert not out["errors"], out["errors"]
    assert out["sent"]["frames"] == 100_000
    assert out["rows"] and all(r["wrong"] == 0 for r in out["rows"]), out["rows"]
    # every frame h7 sent was read by its switch (or, on a busy machine, dropped
    # by the kernel with the switch's RX ring full: counted), and every frame
    # a switch read is forwarded, consumed or dropped for one reason
    arrived = out["switch_rx_from_attacker"] + out["switch_ring_drops_near_attacker"]
    assert arrived >= out["sent"]["via_switch"], out
    assert out["switch_conservation"]["difference"] == 0, out["switch_conservation"]
    assert out["switch_reasons"].get("drop_malformed", 0) > 0
    assert out["switch_reasons"].get("drop_spoofed", 0) > 0
    assert out["switch_reasons"].get("drop_agg_foreign", 0) > 0
    # every frame an endpoint took ended in one fate
    for c in out["nic_conservation"]:
        assert c["difference"] == 0, out["nic_conservation"]
    fates = out["nic_fates"]
    assert fates["rx_malformed"] > 0 and fates["rx_stale_epoch"] > 0
    # the fabric survived
    assert fabric_stats(erack)["switches"]
    assert registry.load_lab(erack) is not None
    assert core.ETHP_HDR_BYTES == 40
