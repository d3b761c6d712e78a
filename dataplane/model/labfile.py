"""Lab files (TOML): schema, defaults, validation, and the resulting LabSpec.

Every mistake is reported as one line naming the file, the key and what was
expected, e.g. ``netns-labs/x.toml: topology.planes: expected an integer > 0,
got -2``.  Nothing is created before a file validates.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataplane.errors import UsageError
from dataplane.model import library
from dataplane.model import topology as topo_mod
from dataplane.model.topology import LinkParams, Topology, TopologyError
from dataplane.scale import Scale

FAMILIES = ("erack", "upn", "clos", "hpn")


class LabFileError(UsageError):
    """A user mistake in a lab file: one line, naming file, key, expectation."""

    def __init__(self, path: str, key: str, expected: str, got: Any = None, *, detail: str = ""):
        self.path, self.key = path, key
        msg = f"{path}: {key}: expected {expected}"
        if got is not None:
            msg += f", got {_show(got)}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


def _show(v: Any) -> str:
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "an array"
    return str(v)


# ---------------------------------------------------------------- field kinds


@dataclass(frozen=True)
class Field:
    expected: str
    ok: Callable[[Any], bool]
    default: Any = None
    help: str = ""
    # Where the setting goes in the C core's struct (None: nowhere, or by
    # hand), and how: to_c(value, k) gives the real value from the file's
    # nominal one at time scale k (None: as written).
    c: str | None = None
    to_c: Callable[[Any, float], Any] | None = None
    choices: tuple[str, ...] = ()  # one_of's

    def into(self, c: str = "", to_c: Callable[[Any, float], Any] | None = None) -> Field:
        """This field, filling C field c (default: the key's own name)."""
        return dataclasses.replace(self, c=c, to_c=to_c)


def real_ns_from_us(v: float, k: float) -> int:
    """A nominal time in microseconds, as real nanoseconds at time scale k."""
    return Scale(k).real_ns(v * 1000)


def real_bps_from_mbps(v: float, k: float) -> int:
    """A nominal rate in Mbit/s, as real bit/s at time scale k (at least 1)."""
    return Scale(k).real_bps(v * 1e6)


def c_values(fields: dict[str, Field], values: dict[str, Any], k: float) -> dict[str, Any]:
    """The C struct's fields from a section's settings: every declared
    field with a C home, converted to real units at time scale k."""
    out = {}
    for key, f in fields.items():
        if f.c is None:
            continue
        v = values.get(key, f.default)
        out[f.c or key] = f.to_c(v, k) if f.to_c else v
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


REQUIRED: Any = object()  # a Field's default when the key must be given


def pos_int(default: Any = None, help: str = "") -> Field:
    return Field("an integer > 0", lambda v: _is_int(v) and v > 0, default, help)


def nonneg_int(default: Any = None, help: str = "") -> Field:
    return Field("an integer >= 0", lambda v: _is_int(v) and v >= 0, default, help)


def pos_num(default: Any = None, help: str = "") -> Field:
    return Field("a number > 0", lambda v: _is_num(v) and v > 0, default, help)


def nonneg_num(default: Any = None, help: str = "") -> Field:
    return Field("a number >= 0", lambda v: _is_num(v) and v >= 0, default, help)


def fraction(default: Any = None, help: str = "") -> Field:
    return Field("a number in (0, 1]", lambda v: _is_num(v) and 0 < v <= 1, default, help)


def int_range(lo: int, hi: int, default: Any = None, help: str = "") -> Field:
    return Field(
        f"an integer in [{lo}, {hi}]", lambda v: _is_int(v) and lo <= v <= hi, default, help
    )


def boolean(default: Any = None, help: str = "") -> Field:
    return Field("true or false", lambda v: isinstance(v, bool), default, help)


def one_of(choices: tuple[str, ...], default: Any = None, help: str = "") -> Field:
    return Field(
        "one of " + ", ".join(repr(c) for c in choices),
        lambda v: v in choices,
        default,
        help,
        choices=choices,
    )


def text(default: Any = None, help: str = "") -> Field:
    return Field("a string", lambda v: isinstance(v, str), default, help)


def text_list(min_items: int, what: str, default: Any = None, help: str = "") -> Field:
    return Field(
        f"a list of {min_items} or more {what}",
        lambda v: (
            isinstance(v, list) and len(v) >= min_items and all(isinstance(x, str) for x in v)
        ),
        default,
        help,
    )


def lab_name(default: Any = None) -> Field:
    return Field(
        "a name of 1-24 characters from a-z, 0-9 and '-', starting with a letter or digit",
        topo_mod.valid_name,
        default,
    )


def time_scale(default: Any = "auto") -> Field:
    return Field(
        'a number >= 1 or "auto"',
        lambda v: v == "auto" or (_is_num(v) and v >= 1),
        default,
        "real rate = nominal / time_scale; real delay = nominal * time_scale",
    )


# ---------------------------------------------------------------- schema

MTU_MIN, MTU_MAX = 1280, 9216


def _link_schema(rate_gbps: float, delay_ns: int, buffer_bytes: int) -> dict[str, Field]:
    return {
        "rate_gbps": pos_num(rate_gbps, "nominal link rate"),
        "delay_ns": nonneg_int(delay_ns, "nominal one-way propagation delay"),
        "jitter_ns": nonneg_int(0, "each frame's delay: delay_ns + uniform [0, jitter_ns]"),
        "buffer_bytes": pos_int(buffer_bytes, "switch egress buffer per port"),
        "mtu_bytes": int_range(
            MTU_MIN, MTU_MAX, 4200, "interface MTU; ETH+ carries 4096 B payload"
        ),
        "llr": boolean(False, "link-level retry: the hop replays corrupted or lost frames"),
    }


# Defaults (PROTOCOLS.md, "Defaults"): 400 Gbit/s ports; base RTT 2 us in a
# rack (4 link traversals -> 500 ns per link), 10 us in a Clos pod (8 -> 1250
# ns); buffer 4 x BDP without trimming (2-5 x BDP guidance).
_FAMILY_DEFAULTS = {
    "erack": {"delay_ns": 500, "rtt_ns": 2000, "planes": 8, "radix": 64},
    "upn": {"delay_ns": 500, "rtt_ns": 2000, "planes": 4, "radix": 512},
    "clos": {"delay_ns": 1250, "rtt_ns": 10000, "radix": 64},
    "hpn": {"delay_ns": 1250, "rtt_ns": 10000, "radix": 128},
}


def _bdp_bytes(family: str, rate_gbps: float = 400) -> int:
    return int(rate_gbps * _FAMILY_DEFAULTS[family]["rtt_ns"] / 8)


def _topology_schema(family: str) -> dict[str, Field]:
    d = _FAMILY_DEFAULTS[family]
    radix = pos_int(d["radix"], "ports per switch")
    if family in ("erack", "upn"):
        return {
            "accelerators": pos_int(64 if family == "erack" else 512),
            "planes": pos_int(d["planes"]),
            "switch_radix": radix,
        }
    if family == "clos":
        return {
            "leaves": pos_int(4),
            "hosts_per_leaf": pos_int(4),
            "spines": pos_int(4),
            "oversubscription": pos_num(1.0, "host bandwidth / uplink bandwidth per leaf"),
            "switch_radix": radix,
        }
    return {
        "hosts": pos_int(2),
        "accelerators_per_host": pos_int(8),
        "tors_per_rail": pos_int(1),
        "spines_per_plane": pos_int(2),
        "switch_radix": radix,
    }


def switch_fields(family: str) -> dict[str, Field]:
    bdp = _bdp_bytes(family)
    # .into(): the C struct field it fills (inc_slots goes in by hand: only
    # while inc is on)
    return {
        "forwarding": one_of(
            ("ecmp", "spray", "adaptive"),
            "spray",
            "ETH+ frames: per-packet by entropy, or least-loaded queue",
        ).into(),
        "ecn": boolean(True).into(),
        "ecn_kmin_bytes": pos_int(bdp // 5, "RED Kmin (0.2 BDP)").into(),
        "ecn_kmax_bytes": pos_int(bdp * 4 // 5, "RED Kmax (0.8 BDP)").into(),
        "ecn_pmax": fraction(0.2).into(),
        "trimming": boolean(True).into(),
        "trim_threshold_bytes": pos_int(bdp, "1 x BDP").into(),
        "lossless": boolean(False, "PFC on every switch port").into(),
        "pfc_xoff_bytes": pos_int(bdp * 2).into(),
        "pfc_xon_bytes": pos_int(bdp).into(),
        "pfc_headroom_bytes": nonneg_int(
            0,
            "lossless: what a port may have buffered past XOFF (its frames are never"
            " tail-dropped at an egress); 0: its link's rate x (two delays + 50 ms of"
            " emulator response), plus two frames",
        ).into(),
        "hosts_may_pause": boolean(
            False, "PFC frames from an accelerator's port pause the switch (else ignored, counted)"
        ).into(),
        "pfc_watchdog_us": nonneg_int(
            200_000,
            "PFC watchdog, nominal: a class paused longer than this without a break is released"
            " and ignores pauses for as long again (0: never)",
        ).into("pfc_watchdog_ns", real_ns_from_us),
        "shared_buffer_bytes": nonneg_int(
            0, "one buffer for all of a switch's egress queues; 0: per-port buffers"
        ).into(),
        "dt_alpha": pos_num(
            1.0, "dynamic threshold: a queue may take alpha x the free buffer"
        ).into(),
        "ring_idle_ms": nonneg_int(
            100,
            "a switch receives frame by frame while idle and through an RX ring while busy;"
            " the ring is taken down after this long without a frame, or of a trickle"
            " (0: it stays up)",
        ).into(),
        "inc": boolean(False, "in-network computing: switches aggregate all-reduce chunks"),
        "inc_tree": boolean(
            True,
            "multi-tier fabrics: a member's first switch reduces its members' chunks before the"
            " top switch does (an aggregation tree); false: every member sends to the top",
        ),
        "inc_slots": Field(
            "an integer from 1 to 65536",
            lambda v: _is_int(v) and 1 <= v <= 65536,
            1024,
            "chunks (packets) one switch aggregates at once, over every job",
        ),
    }


# The ETH+ transport's congestion controls (nic.CC_ALGOS maps them to the C core's).
CC_NAMES = ("nscc", "hpcc", "rccc")

# The emulated RoCEv2 transport (`roce`), nominal units, each into the
# engine's struct ethp_nic_cfg (nic.roce_cfg); DCQCN defaults are the
# paper's (PROTOCOLS.md), increase steps 0.1% / 1% of a 400G port.
NIC_ROCE_FIELDS = {
    "roce_qps": nonneg_int(0, "queue pairs per pair of ranks; 0: one per plane").into("qps"),
    "roce_rto_us": pos_num(131.072, "retransmit timeout: 4.096 us x 2^5, as RoCE NICs set it").into(
        "rto_ns", real_ns_from_us
    ),
    "dcqcn": boolean(True, "DCQCN rate control (off: line rate, PFC alone)").into(),
    "dcqcn_g": fraction(1 / 256, "alpha gain g").into(
        "dcqcn_g_inv", lambda g, _k: max(1, round(1 / g))
    ),
    "dcqcn_timer_us": pos_num(55.0, "alpha update and rate-increase timer").into(
        "dcqcn_timer_ns", real_ns_from_us
    ),
    "dcqcn_byte_counter_bytes": pos_int(10_000_000, "bytes per byte-counter stage").into(),
    "dcqcn_f": pos_int(5, "fast-recovery stages").into(),
    "dcqcn_rai_mbps": pos_num(400.0, "additive increase step").into(
        "dcqcn_rai_bps", real_bps_from_mbps
    ),
    "dcqcn_rhai_mbps": pos_num(4000.0, "hyper increase step").into(
        "dcqcn_rhai_bps", real_bps_from_mbps
    ),
    "dcqcn_min_rate_mbps": pos_num(100.0, "lowest rate").into(
        "dcqcn_min_rate_bps", real_bps_from_mbps
    ),
    "cnp_interval_us": pos_num(50.0, "at most one CNP per QP per interval").into(
        "cnp_interval_ns", real_ns_from_us
    ),
}

# The ETH+ transport's settings, each into struct ethp_nic_cfg (nic.engine_cfg;
# cc as the C enum, whose order is CC_NAMES': nic.py checks it).
NIC_ETHP_FIELDS = {
    "encapsulation": one_of(
        ("udp", "compact"), "udp", "ETH+ over IPv4/UDP, or the compact EtherType form"
    ).into("compact", lambda v, _k: int(v == "compact")),
    "cc": one_of(
        CC_NAMES,
        "nscc",
        "ETH+ congestion control: NSCC-like (ECN and delay), HPCC-like (INT from each switch)"
        " or RCCC-like (receiver credits capping the NSCC-like window)",
    ).into("cc", lambda v, _k: CC_NAMES.index(v)),
    "ring_idle_ms": nonneg_int(
        100,
        "a NIC receives frame by frame while idle and through an RX ring while busy;"
        " the ring is taken down after this long without a frame, or of a trickle"
        " (0: it stays up)",
    ).into(),
}
NIC_FIELDS = {**NIC_ETHP_FIELDS, **NIC_ROCE_FIELDS}


# What a route can set of kernel TCP (defaults: Linux's own), on every host
# route at lab up (kernel.tcp_routes): the congestion control and ECN, so that
# a lab's TCP never depends on the host's sysctls, and the minimum RTO,
# nominal: real = nominal x k, kept right as k changes.
TCP_CONGESTION_CONTROLS = ("cubic", "reno", "bbr", "dctcp")
TCP_SYN_RTOS = ("max", "linux")
_TCP_SCHEMA = {
    "rto_min_us": pos_num(
        200_000.0,
        "minimum retransmit timeout (Linux's TCP_RTO_MIN, 200 ms); real = this x time_scale,"
        " at most the kernel's 120 s",
    ),
    "congestion_control": one_of(
        TCP_CONGESTION_CONTROLS,
        "cubic",
        "every connection's congestion control (Linux's default: cubic), whatever the host's"
        " sysctl says; lab up checks that this kernel has it",
    ),
    "ecn": boolean(
        False,
        "connections ask for ECN (the route feature ecn); false: Linux's default, they only"
        " answer a peer that asks",
    ),
    "quickack": boolean(
        False,
        "ack every segment at once (the route's quickack): no delayed-ACK timer, whose 40 ms"
        " minimum is real time and so 40 ms / k nominal; false: Linux's delayed acks",
    ),
    "syn_rto": one_of(
        TCP_SYN_RTOS,
        "max",
        "what a handshake waits before a SYN or SYN-ACK goes again: max, the kernel's largest"
        " RTO (120 s real, as Linux's 1 s would be at any k over 120; a BPF program on the"
        " lab's cgroup); linux, Linux's fixed 1 s of real time, which a handshake outlasts at"
        " a large k",
    ),
}


def schema(family: str) -> dict[str, dict[str, Field]]:
    """Every table and key a lab file of this family may have, declared."""
    bdp = _bdp_bytes(family)
    d = _FAMILY_DEFAULTS[family]
    s = {
        "lab": {
            "family": one_of(FAMILIES),
            "name": lab_name(),
            "description": text(""),
            "time_scale": time_scale(),
        },
        "topology": _topology_schema(family),
        "link": _link_schema(400, d["delay_ns"], 4 * bdp),
        "switch": switch_fields(family),
        "nic": NIC_FIELDS,
        "tcp": _TCP_SCHEMA,
    }
    if family in ("clos", "hpn"):
        s["fabric_link"] = _link_schema(400, d["delay_ns"], 4 * bdp)
    return s


# ---------------------------------------------------------------- the spec


@dataclass
class LabSpec:
    path: str
    name: str
    family: str
    description: str
    time_scale_raw: Any
    time_scale: float
    topology: Topology
    switch: dict[str, Any] = field(default_factory=dict)
    nic: dict[str, Any] = field(default_factory=dict)
    tcp: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def pin_time_scale(self, k: Any) -> None:
        """Override the file's time scale with --time-scale k: a finite
        number >= 1, or a LabFileError naming it."""
        if not (_is_num(k) and k >= 1):
            raise LabFileError(self.path, "--time-scale", "a number >= 1", k)
        self.time_scale = self.time_scale_raw = float(k)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "file": self.path,
            "family": self.family,
            "description": self.description,
            "time_scale": self.time_scale,
            "time_scale_setting": self.time_scale_raw,
            "switch": self.switch,
            "nic": self.nic,
            "tcp": self.tcp,
            "settings": self.sections,
            "topology": self.topology.to_dict(),
        }


def resolve_path(file_or_name: str, what: str = "lab file") -> Path:
    """A file path, or the name of a lab file (what: or scenario file) in
    the library (library.py: the user's directories, then the package's)."""
    p = library.find(file_or_name, what)
    if p is not None:
        return p
    known = ", ".join(library.names(what)) or "none"
    raise LabFileError(
        file_or_name, "file", f"an existing {what} or one of: {known}",
        detail=f"looked in {library.looked_in(what)}",
    )  # fmt: skip


def read_table(path: str, raw: Any, where: str, fields: dict[str, Field]) -> dict[str, Any]:
    """A TOML table checked against its fields: no unknown key, every value of
    its field's kind, every REQUIRED key given; absent keys get their
    defaults.  LabFileError names the first key that is wrong."""
    if not isinstance(raw, dict):
        raise LabFileError(path, where, "a table", raw)
    out = {}
    for key, value in raw.items():
        if key not in fields:
            known = ", ".join(fields)
            raise LabFileError(path, f"{where}.{key}", f"a known key (one of {known})")
        if not fields[key].ok(value):
            raise LabFileError(path, f"{where}.{key}", fields[key].expected, value)
        out[key] = value
    for key, f in fields.items():
        if key not in out:
            if f.default is REQUIRED:
                raise LabFileError(path, f"{where}.{key}", f.expected)
            out[key] = f.default
    return out


def _section(path: str, data: dict, name: str, fields: dict[str, Field]) -> dict[str, Any]:
    return read_table(path, data.get(name, {}), name, fields)


def _link(values: dict[str, Any]) -> LinkParams:
    return LinkParams(
        rate_bps=int(values["rate_gbps"] * 1e9),
        delay_ns=values["delay_ns"],
        jitter_ns=values["jitter_ns"],
        buffer_bytes=values["buffer_bytes"],
        mtu_bytes=values["mtu_bytes"],
        llr=values["llr"],
    )


def _build(family: str, t: dict[str, Any], host: LinkParams, fabric: LinkParams | None) -> Topology:
    if family in ("erack", "upn"):
        return topo_mod.single_tier(family, t["accelerators"], t["planes"], t["switch_radix"], host)
    if family == "clos":
        return topo_mod.clos(
            t["leaves"],
            t["hosts_per_leaf"],
            t["spines"],
            t["oversubscription"],
            t["switch_radix"],
            host,
            fabric,
        )
    return topo_mod.hpn(
        t["hosts"],
        t["accelerators_per_host"],
        t["tors_per_rail"],
        t["spines_per_plane"],
        t["switch_radix"],
        host,
        fabric,
    )


def _cross_checks(path: str, sw: dict[str, Any], host: LinkParams) -> None:
    if sw["ecn_kmin_bytes"] > sw["ecn_kmax_bytes"]:
        raise LabFileError(
            path,
            "switch.ecn_kmin_bytes",
            f"at most switch.ecn_kmax_bytes ({sw['ecn_kmax_bytes']})",
            sw["ecn_kmin_bytes"],
        )
    if sw["ecn_kmax_bytes"] > host.buffer_bytes:
        raise LabFileError(
            path,
            "switch.ecn_kmax_bytes",
            f"at most link.buffer_bytes ({host.buffer_bytes})",
            sw["ecn_kmax_bytes"],
        )
    frame_bytes = host.mtu_bytes + 14
    if 0 < sw["shared_buffer_bytes"] < frame_bytes:
        raise LabFileError(
            path,
            "switch.shared_buffer_bytes",
            f"0 (per-port buffers) or at least one frame ({frame_bytes} bytes)",
            sw["shared_buffer_bytes"],
        )
    if sw["pfc_xon_bytes"] >= sw["pfc_xoff_bytes"]:
        raise LabFileError(
            path,
            "switch.pfc_xon_bytes",
            f"less than switch.pfc_xoff_bytes ({sw['pfc_xoff_bytes']})",
            sw["pfc_xon_bytes"],
        )


def read_toml(p: Path) -> dict:
    """A TOML file's tables, or a LabFileError (one line) naming the file."""
    path = str(p)
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise LabFileError(path, "file", "valid TOML", detail=str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LabFileError(path, "file", "a readable UTF-8 text file", detail=str(exc)) from None


def load(file_or_name: str, name: str | None = None) -> LabSpec:
    """Read and validate a lab file.  Raises LabFileError; creates nothing."""
    p = resolve_path(file_or_name)
    path = str(p)
    data = read_toml(p)

    lab_raw = data.get("lab")
    if not isinstance(lab_raw, dict) or "family" not in lab_raw:
        raise LabFileError(path, "lab.family", "one of " + ", ".join(repr(f) for f in FAMILIES))
    family = lab_raw["family"]
    if family not in FAMILIES:
        raise LabFileError(
            path, "lab.family", "one of " + ", ".join(repr(f) for f in FAMILIES), family
        )
    tables = schema(family)
    for section in data:
        if section not in tables:
            raise LabFileError(path, section, "a known section (one of " + ", ".join(tables) + ")")
    s = {sec: _section(path, data, sec, fields) for sec, fields in tables.items()}

    lab_name_value = name if name is not None else (s["lab"]["name"] or p.stem)
    if not topo_mod.valid_name(lab_name_value):
        key = "--name" if name is not None else ("lab.name" if s["lab"]["name"] else "file name")
        raise LabFileError(path, key, lab_name(None).expected, lab_name_value)

    host = _link(s["link"])
    fabric = _link(s["fabric_link"]) if "fabric_link" in s else None
    _cross_checks(path, s["switch"], host)
    try:
        topology = _build(family, s["topology"], host, fabric)
    except TopologyError as exc:
        raise LabFileError(path, exc.key, "a topology that fits", detail=str(exc)) from None

    ts_raw = s["lab"]["time_scale"]
    ts = topology.auto_time_scale() if ts_raw == "auto" else float(ts_raw)
    return LabSpec(
        path=path,
        name=lab_name_value,
        family=family,
        description=s["lab"]["description"],
        time_scale_raw=ts_raw,
        time_scale=ts,
        topology=topology,
        switch=s["switch"],
        nic=s["nic"],
        tcp=s["tcp"],
        sections=s,
    )
