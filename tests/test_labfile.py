"""Malformed lab files: one clear line naming file, key and expectation;
non-zero exit; no traceback; nothing created.  Runs the real command."""

import os
from pathlib import Path

import pytest
from conftest import ethplus

from dataplane.model import labfile

BAD = sorted((Path(__file__).parent / "labfiles" / "bad").glob("*.toml"))


def _lab_objects() -> set[str]:
    found = set()
    if os.path.isdir("/run/netns"):
        found |= {f"ns:{n}" for n in os.listdir("/run/netns") if n.startswith("ethp-")}
    runs = Path("/run/ethplus/labs")
    if runs.is_dir():
        found |= {f"lab:{p.name}" for p in runs.iterdir()}
    return found


def test_corpus_is_big_enough():
    assert len(BAD) >= 15


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_malformed_lab_file(path):
    expect_key = path.read_text().splitlines()[0].removeprefix("# expect: ").strip()
    before = _lab_objects()
    r = ethplus("lab", "up", str(path))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"ethplus: error: {path}: {expect_key}: expected "), lines[0]
    assert r.stdout == ""
    assert _lab_objects() == before


def test_loader_raises_the_same_error_in_process():
    with pytest.raises(labfile.LabFileError) as e:
        labfile.load(str(BAD[0]))
    assert e.value.path == str(BAD[0])


def test_unknown_lab_name_lists_the_shipped_ones():
    r = ethplus("lab", "up", "no-such-lab")
    assert r.returncode == 2
    assert "erack-8x4" in r.stderr and "Traceback" not in r.stderr


def test_bad_name_option():
    r = ethplus("lab", "up", "erack-8x4", "--name", "Has Space")
    assert r.returncode == 2
    assert "--name: expected" in r.stderr


def test_shipped_defaults_follow_protocols_md():
    spec = labfile.load("erack-8x4")
    link = spec.sections["link"]
    assert link["rate_gbps"] == 400 and link["mtu_bytes"] == 4200
    sw = spec.switch
    bdp = 100_000  # 400 Gbit/s x 2 us
    assert (sw["ecn_kmin_bytes"], sw["ecn_kmax_bytes"], sw["ecn_pmax"]) == (
        bdp // 5,
        bdp * 4 // 5,
        0.2,
    )
    assert sw["trim_threshold_bytes"] == bdp
    assert spec.time_scale_raw == "auto"


def test_defaults_fill_what_a_file_leaves_out(tmp_path):
    f = tmp_path / "tiny.toml"
    f.write_text('[lab]\nfamily = "clos"\n')
    spec = labfile.load(str(f))
    assert spec.name == "tiny"
    assert len(spec.topology.hosts()) == 16  # 4 leaves x 4 hosts
    assert spec.topology.base_rtt_ns == 10_000


def test_a_setting_is_declared_once_with_its_way_into_c():
    """The C structs' fields come from the declarations: each [switch] key
    that reaches a switch names its C field and conversion, and the nominal
    times and rates come out real at the lab's k (no root, no C)."""
    sw = labfile.switch_fields("erack")
    vals = {k: f.default for k, f in sw.items()}
    at_10 = labfile.c_values(sw, vals, 10.0)
    assert at_10["pfc_watchdog_ns"] == 200_000 * 1000 * 10  # us nominal -> ns real
    assert at_10["ecn_kmin_bytes"] == sw["ecn_kmin_bytes"].default  # bytes do not scale
    assert "inc_slots" not in at_10 and "inc" not in at_10  # by hand: only while inc is on
    nic = labfile.c_values(labfile.NIC_ROCE_FIELDS, {"dcqcn_rai_mbps": 400.0}, 100.0)
    assert nic["dcqcn_rai_bps"] == 4_000_000  # Mbit/s nominal -> bit/s real
    assert nic["dcqcn_g_inv"] == 256 and nic["cnp_interval_ns"] == 50 * 1000 * 100
    assert set(nic) >= {"qps", "rto_ns", "dcqcn", "dcqcn_timer_ns", "dcqcn_min_rate_bps"}


def test_lab_keys_lists_every_declared_key():
    r = ethplus("lab", "keys", "--family", "clos", check=True)
    for sec in ("lab", "switch", "nic", "tcp"):
        for key in labfile.schema("clos")[sec]:
            assert f"{sec}.{key}" in r.stdout
    assert "dcqcn_g" in r.stdout and "RED Kmin" in r.stdout
