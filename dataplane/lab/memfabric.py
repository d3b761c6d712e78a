"""NIC engines in one process, on a fabric that lives in memory.

The C engine's frames go to an in-memory switch (dataplane/csrc/memfab.c)
instead of AF_PACKET ports in lab namespaces: no root, no lab, no rings, so
the transport's corners (loss, reordering, trimming, a silent plane,
receiver-not-ready, credits) can be tested in milliseconds.  The fabric is a
test seam, not a lab: its times and rates are real, at time scale 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.lab.core import ffi, lib
from dataplane.lab.nic import (
    RNR_TIMEOUT_S,
    RTO_FLOOR_NS,
    Endpoint,
    EngineGroup,
    NicError,
    engine_cfg,
    roce_cfg,
)

MEMFAB_COUNTERS: tuple[str, ...] = tuple(
    ffi.string(lib.ethp_memfab_counter_name(i)).decode()
    for i in range(lib.ethp_memfab_counter_count())
)


@dataclass(frozen=True)
class FabricSpec:
    """What the in-memory fabric does to frames (real units)."""

    endpoints: int = 2
    planes: int = 2
    # each endpoint's downlink, per plane: slow enough that an engine thread
    # keeps up on a busy machine, so the fabric (not the host) sets the pace
    rate_bps: int = 1_000_000_000
    delay_ns: int = 20_000  # one way
    buffer_bytes: int = 512 * 1024  # a downlink's data queue
    ecn_bytes: int = 0  # mark CE above this queue (0: never)
    trimming: bool = False
    reorder: int = 0  # a frame may be overtaken by up to this many
    loss: float = 0.0
    seed: int = 1


class MemFabric:
    """The fabric and its endpoints; close() frees the endpoints first."""

    def __init__(self, spec: FabricSpec | None = None, **kw):
        self.spec = spec or FabricSpec(**kw)
        cfg = ffi.new("struct ethp_memfab_cfg *")
        for name in FabricSpec.__dataclass_fields__:
            setattr(cfg, name, getattr(self.spec, name))
        err = ffi.new("int *")
        fab = lib.ethp_memfab_new(cfg, err)
        if fab == ffi.NULL:
            raise NicError(f"cannot make an in-memory fabric of {self.spec} (error {err[0]})")
        self._fab = fab
        self.endpoints: list[Endpoint] = []

    def endpoint(
        self,
        rank: int,
        *,
        cc: str = "nscc",
        roce: bool = False,
        qps: int | None = None,
        dcqcn: bool | None = None,
        adaptive: bool = False,
        compact: bool = False,
        max_retries: int = 12,
        rnr_timeout_s: float = RNR_TIMEOUT_S,
        rto_floor_ns: int = RTO_FLOOR_NS,
        seed: int = 1,
        drop_psn: int | None = None,
        group: EngineGroup | None = None,
    ) -> Endpoint:
        """Endpoint `rank` on this fabric, started; every other rank is its
        peer.  The retransmit timeout keeps a lab's floor (RTO_FLOOR_NS): a
        thread of this machine can be late by milliseconds, which is not loss."""
        spec = self.spec
        # the fabric's RTT: both ways' delay and a full frame's time on each
        base_rtt_ns = 2 * spec.delay_ns + 2 * (4200 * 8 * 1_000_000_000 // spec.rate_bps)
        nic = {"cc": cc, "encapsulation": "compact" if compact else "udp", "ring_idle_ms": 0}
        cfg, bdp = engine_cfg(
            rank, spec.planes, spec.rate_bps, base_rtt_ns, 1.0, nic, adaptive=adaptive,
            seed=seed + rank, max_retries=max_retries, drop_psn=drop_psn,
            rto_floor_ns=rto_floor_ns, unscaled_rtt_ns=0, rnr_timeout_s=rnr_timeout_s,
        )  # fmt: skip
        if roce:
            roce_cfg(cfg, {}, 1.0, spec.planes, spec.rate_bps, qps, dcqcn, False)
        err = ffi.new("int *")
        nic = lib.ethp_memfab_nic(self._fab, cfg, err)
        if nic == ffi.NULL:
            raise NicError(f"cannot put endpoint {rank} on the in-memory fabric (error {err[0]})")
        ep = Endpoint.__new__(Endpoint)
        ep.rank, ep.world, ep._clock = rank, spec.endpoints, None
        ep._adopt(nic)
        ep._start(cfg, bdp, cc, spec.planes, group)
        self.endpoints.append(ep)
        return ep

    def set_loss(self, loss: float) -> None:
        lib.ethp_memfab_set_loss(self._fab, loss)

    def set_plane(self, plane: int, up: bool) -> None:
        """A silent plane: every frame sent on it vanishes (up=False)."""
        if lib.ethp_memfab_set_plane(self._fab, plane, 1 if up else 0) < 0:
            raise NicError(f"no plane {plane} (the fabric has {self.spec.planes})")

    def counters(self) -> dict[str, int]:
        out = ffi.new("uint64_t[]", len(MEMFAB_COUNTERS))
        lib.ethp_memfab_counters(self._fab, out)
        return dict(zip(MEMFAB_COUNTERS, out, strict=True))

    def close(self) -> None:
        for ep in self.endpoints:
            ep.close()
        self.endpoints.clear()
        if self._fab is not None:
            lib.ethp_memfab_free(self._fab)
            self._fab = None

    def __enter__(self) -> MemFabric:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
