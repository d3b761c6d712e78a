"""The topology model and the shipped lab files (pure data, no root)."""

import ipaddress

import pytest

from dataplane.model import labfile, topology
from dataplane.model.topology import LinkParams, TopologyError

LINK = LinkParams(rate_bps=400_000_000_000, delay_ns=500, buffer_bytes=400_000, mtu_bytes=4200)


def _interfaces(t):
    return [(n.name, p) for n in t.nodes.values() for p in n.ports]


@pytest.mark.parametrize(
    "name, nodes, switches, links",
    [
        ("erack-8x4", 12, 4, 32),
        ("erack-64x8", 72, 8, 512),
        ("upn-512", 516, 4, 2048),
        ("clos-16", 24, 8, 32),
        ("hpn-16", 36, 20, 64),
    ],
)
def test_shipped_lab_files_build(name, nodes, switches, links):
    spec = labfile.load(name)
    t = spec.topology
    assert (len(t.nodes), len(t.switches()), len(t.links)) == (nodes, switches, links)
    assert spec.time_scale >= 1
    # every node's ports are its links' ends, once each
    ends = sorted((lk.a, lk.a_port) for lk in t.links.values()) + sorted(
        (lk.b, lk.b_port) for lk in t.links.values()
    )
    assert sorted(ends) == sorted((n, p.index) for n, p in _interfaces(t))
    # interface names fit Linux's limit, and are unique within each node
    for n in t.nodes.values():
        names = [p.ifname for p in n.ports]
        assert len(set(names)) == len(names)
        assert all(topology.IF_NAME_OVERHEAD_CHARS + len(x) <= 15 for x in names)
    # accelerator addresses are unique and inside 198.18.0.0/15
    ips = [p.ip for n in t.hosts() for p in n.ports]
    assert len(set(ips)) == len(ips)
    lab_net = ipaddress.ip_network("198.18.0.0/15")
    assert all(ipaddress.ip_address(ip) in lab_net for ip in ips)


def test_erack_every_accelerator_on_every_plane():
    t = topology.single_tier("erack", 8, 4, 64, LINK)
    for h in t.hosts():
        assert sorted(p.peer for p in h.ports) == [f"plane{i}" for i in range(4)]
        assert sorted(p.plane for p in h.ports) == [0, 1, 2, 3]
    for sw in t.switches():
        assert sorted(p.peer for p in sw.ports) == sorted(f"h{i}" for i in range(8))
    assert t.base_rtt_ns == 2000


def test_single_tier_radix_too_small():
    with pytest.raises(TopologyError) as e:
        topology.single_tier("erack", 65, 8, 64, LINK)
    assert e.value.key == "topology.switch_radix"
    assert "65 ports" in str(e.value)


def test_clos_wiring_and_oversubscription():
    fabric = LinkParams(400_000_000_000, 1250, 2_000_000, 4200)
    t = topology.clos(4, 4, 2, 2.0, 64, LINK, fabric)
    leaf0 = t.nodes["leaf0"]
    assert sorted(p.peer for p in leaf0.ports) == ["h0", "h1", "h2", "h3", "spine0", "spine1"]
    up = t.links["leaf0-spine0"]
    # 4 hosts x 400G over 2 uplinks at 2:1 -> 400G each
    assert up.params.rate_bps == 400_000_000_000
    assert up.tier == "fabric"
    assert t.nodes["h5"].ports[0].peer == "leaf1"


def test_hpn_rails_and_planes():
    spec = labfile.load("hpn-16")
    t = spec.topology
    for h in t.hosts():
        tors = [t.nodes[p.peer] for p in h.ports]
        assert len(tors) == 2
        assert {tor.plane for tor in tors} == {0, 1}  # dual plane
        assert {tor.rail for tor in tors} == {h.index % 8}  # rail-optimised
    for sw in t.switches():
        if sw.kind == "spine":
            assert {t.nodes[p.peer].plane for p in sw.ports} == {sw.plane}


def test_addresses_follow_planes():
    assert topology.host_ip(0, 0) == "198.18.0.1"
    assert topology.host_ip(3, 7) == "198.18.48.8"
    assert topology.plane_subnet(3) == "198.18.48.0/20"
    assert topology.gateway_ip(1) == "198.19.16.1"


def test_to_dict_is_json_ready():
    import json

    d = labfile.load("erack-8x4").to_dict()
    json.dumps(d)
    assert d["topology"]["family"] == "erack"
    assert len(d["topology"]["links"]) == 32


def test_auto_time_scale_fits_the_real_budget():
    spec = labfile.load("erack-8x4")
    t = spec.topology
    real = t.total_link_rate_bps() / spec.time_scale
    assert real == pytest.approx(topology.AUTO_REAL_BUDGET_BPS)
