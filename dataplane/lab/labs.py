"""A running lab: realise a LabSpec in the kernel, record it, tear it down.

Order of ``up``: validate (done by labfile) -> under the registry lock, pick
an interface tag and write the journal -> namespaces -> veth pairs -> per
namespace configuration (concurrently) -> record the realised lab.  Any
failure, SIGINT or SIGTERM removes everything made so far; a SIGKILL leaves a
journal that ``clean`` acts on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import uvloop

from dataplane.errors import EthplusError, Interrupted
from dataplane.lab import cgroup, fabric_client, kernel, registry, userns
from dataplane.model.labfile import LabSpec
from dataplane.model.topology import IF_PREFIX, Topology, plane_subnet, valid_name


class LabError(EthplusError, RuntimeError):
    """A lab operation that cannot be done; the message says why and what to do."""


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise LabError(
            f"{what} needs root, or the `ethplus` command, which runs it without root in a"
            " user namespace of your own"
        )


# ---------------------------------------------------------------- the plan


def mac(slot: int, node_id: int, port: int) -> str:
    """Locally administered, unique per lab interface: 02:SS:NN:NN:PP:PP."""
    b = [0x02, slot & 0xFF, node_id >> 8 & 0xFF, node_id & 0xFF, port >> 8 & 0xFF, port & 0xFF]
    return ":".join(f"{x:02x}" for x in b)


def kernel_mac(wire_mac: str) -> str:
    """The address a switch port's interface has in its own namespace: the
    wire MAC with one more bit set (02:... -> 06:...).  Frames sent to the
    switch are then for another host as that kernel sees them, and it drops
    them at once after the switch's ring has its copy; addressed to the
    kernel itself, each would fail a route lookup there first (0.19 us more
    per frame and hop, measured with scripts/bench_switch.py's layout)."""
    first, rest = wire_mac.split(":", 1)
    return f"{int(first, 16) | 0x04:02x}:{rest}"


@dataclass
class Plan:
    """Every kernel object of a lab, named; derived from the spec and the tag."""

    name: str
    tag: str
    slot: int
    ns: dict[str, str] = field(default_factory=dict)  # node -> namespace path
    ifname: dict[tuple[str, int], str] = field(default_factory=dict)  # (node, port) -> name
    macs: dict[tuple[str, int], str] = field(default_factory=dict)
    veths: list[kernel.VethSpec] = field(default_factory=list)
    host_ports: dict[str, list[kernel.HostPortSpec]] = field(default_factory=dict)


def make_plan(spec: LabSpec, slot: int) -> Plan:
    topo: Topology = spec.topology
    tag = registry.tag_for(slot)
    plan = Plan(spec.name, tag, slot)
    for node_id, node in enumerate(topo.nodes.values()):
        plan.ns[node.name] = registry.ns_path(spec.name, node.name)
        for p in node.ports:
            plan.ifname[node.name, p.index] = f"{IF_PREFIX}{tag}-{p.ifname}"
            plan.macs[node.name, p.index] = mac(slot, node_id, p.index)

    def if_mac(node: str, port: int) -> str:
        wire = plan.macs[node, port]
        return kernel_mac(wire) if topo.nodes[node].role == "switch" else wire

    for link in topo.links.values():
        plan.veths.append(
            kernel.VethSpec(
                a_ns=plan.ns[link.a],
                a_if=plan.ifname[link.a, link.a_port],
                a_mac=if_mac(link.a, link.a_port),
                b_ns=plan.ns[link.b],
                b_if=plan.ifname[link.b, link.b_port],
                b_mac=if_mac(link.b, link.b_port),
                mtu_bytes=link.params.mtu_bytes,
            )
        )
    for h in topo.hosts():
        ports = []
        for p in h.ports:
            peer_port = topo.links[p.link]
            peer_index = peer_port.b_port if peer_port.a == h.name else peer_port.a_port
            ports.append(
                kernel.HostPortSpec(
                    ifname=plan.ifname[h.name, p.index],
                    ip=p.ip,
                    gateway=p.gateway,
                    gateway_mac=plan.macs[p.peer, peer_index],
                    subnet=plane_subnet(p.plane),
                )
            )
        plan.host_ports[h.name] = ports
    return plan


# ---------------------------------------------------------------- up


class _Interrupted(BaseException):
    pass


@contextlib.contextmanager
def _signals_raise():
    """Turn SIGTERM (and SIGINT) into an exception so cleanup code runs."""

    def handler(signum, _frame):
        raise _Interrupted(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only; its own code cleans up
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _start(spec: LabSpec) -> registry.Journal:
    with registry.locked():
        if registry.lab_dir(spec.name).exists():
            raise LabError(
                f"a lab named {spec.name!r} already exists: `ethplus lab down {spec.name}` "
                "or choose another with --name"
            )
        taken = [
            registry.ns_name(spec.name, n)
            for n in spec.topology.nodes
            if (registry.NETNS_DIR / registry.ns_name(spec.name, n)).exists()
        ]
        if taken:
            raise LabError(
                f"namespace {taken[0]} already exists but no lab records it: "
                "`ethplus clean` removes leftovers of ethplus"
            )
        slot = registry.free_slot()
        if slot is None:
            raise LabError(f"at most {registry.MAX_LABS} labs can run at once")
        journal = registry.Journal(
            name=spec.name,
            tag=registry.tag_for(slot),
            slot=slot,
            status="creating",
            namespaces=[registry.ns_path(spec.name, n) for n in spec.topology.nodes],
            pid=os.getpid(),
            pid_start=registry.process_start(os.getpid()),
            file=spec.path,
        )
        journal.save()
    return journal


def _realise_sync(plan: Plan, spec: LabSpec, timings: dict[str, float]) -> None:
    t0 = time.perf_counter()
    kernel.create_namespaces(list(plan.ns.values()), str(registry.NETNS_DIR))
    t1 = time.perf_counter()
    kernel.create_veths(plan.veths)
    t2 = time.perf_counter()
    for node in spec.topology.nodes.values():
        kernel.configure_namespace(
            plan.ns[node.name],
            spec.name,
            [plan.ifname[node.name, p.index] for p in node.ports],
            plan.host_ports.get(node.name, []),
        )
    t3 = time.perf_counter()
    timings.update(namespaces_s=t1 - t0, veths_s=t2 - t1, configure_s=t3 - t2)


async def _realise(plan: Plan, spec: LabSpec, timings: dict[str, float]) -> None:
    """Run the netlink work on one worker thread, off the uvloop loop.

    One thread, in order: every rtnetlink request takes the kernel's rtnl lock
    and pyroute2's per-request cost holds the GIL, so on this 2-core machine
    two threads measured 1.6 s against 1.0 s serially for erack-64x8's
    configuration step (docs/performance.md)."""
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ethp-netlink") as pool:
        await loop.run_in_executor(pool, _realise_sync, plan, spec, timings)


def up(spec: LabSpec) -> dict:
    """Build the lab; returns its record (what `lab show --json` prints)."""
    require_root("ethplus lab up")
    kernel.check_tcp(spec)
    t_start = time.perf_counter()
    journal = _start(spec)
    timings: dict[str, float] = {}
    try:
        with _signals_raise():
            plan = make_plan(spec, journal.slot)
            uvloop.run(_realise(plan, spec, timings))
            record = _record(spec, plan, timings)
            record["tcp_syn_rto"] = (
                cgroup.create(spec.name)
                if spec.tcp.get("syn_rto", cgroup.SYN_RTO_MAX) == cgroup.SYN_RTO_MAX
                else cgroup.SYN_RTO_LINUX
            )
            registry.save_lab(spec.name, record)
            t_fabric = time.perf_counter()
            journal.fabric_pid = _start_fabric(spec.name)
            journal.fabric_start = registry.process_start(journal.fabric_pid)
            journal.save()
            _wait_fabric(spec.name, journal.fabric_pid)
            record["timings_s"]["fabric_s"] = time.perf_counter() - t_fabric
            journal.status = "up"
            journal.save()
    except BaseException as exc:
        journal.status = "failed"
        journal.save()
        _teardown(journal)
        if isinstance(exc, _Interrupted):
            raise LabError(
                f"interrupted by {exc.args[0]}; nothing of lab {spec.name!r} is left"
            ) from None
        if isinstance(exc, OSError):
            raise LabError(
                f"building lab {spec.name!r} failed: {exc}; everything it made was removed"
            ) from exc
        raise
    record["timings_s"]["total_s"] = time.perf_counter() - t_start
    registry.save_lab(spec.name, record)
    return record


FABRIC_START_TIMEOUT_S = 60.0


def _start_fabric(name: str) -> int:
    log = open(fabric_client.log_path(name), "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            python_module("dataplane.lab.fabric", name),
            cwd="/",
            env=module_environ(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # a Ctrl-C in the shell does not reach it
            close_fds=True,
        )
    finally:
        log.close()
    return proc.pid


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs one of ethplus's modules as root: isolated (-I:
    neither the working directory nor PYTHON* variables nor the user's site
    reach sys.path), so a module planted where the caller stands never runs.
    Start it with cwd="/" too."""
    return [sys.executable, "-I", "-m", module, *args]


# numpy's OpenBLAS starts a thread per core in every process that imports it,
# and each spins for a while after start: about 0.09 CPU s a process here,
# for BLAS calls the fabric and the workers never make (their reductions
# are ethplus's own C).
ONE_THREAD_MATH = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def module_environ() -> dict[str, str]:
    """The environment of a process python_module starts for the fabric or a
    job's workers: the caller's, with numpy's math libraries on one thread."""
    return {**os.environ, **ONE_THREAD_MATH}


def _fabric_log_tail(name: str, lines: int = 5) -> str:
    try:
        with open(fabric_client.log_path(name), errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return ""


def _wait_fabric(name: str, pid: int) -> None:
    deadline = time.monotonic() + FABRIC_START_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if fabric_client.request(name, {"op": "ping"}, timeout_s=2).get("ok"):
                return
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            raise LabError(f"the fabric of lab {name!r} exited at start: {_fabric_log_tail(name)}")
        time.sleep(0.02)
    raise LabError(f"the fabric of lab {name!r} did not answer within {FABRIC_START_TIMEOUT_S:g} s")


def _stop_fabric(journal: registry.Journal) -> None:
    pids = fabric_client.find_pids(journal.name, journal.fabric_pid, journal.fabric_start)
    kernel.kill_all(pids, grace_s=3.0)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def fabric_alive(journal: registry.Journal) -> bool:
    return bool(fabric_client.find_pids(journal.name, journal.fabric_pid, journal.fabric_start))


def _record(spec: LabSpec, plan: Plan, timings: dict) -> dict:
    rec = spec.to_dict()
    rec.update(
        tag=plan.tag,
        created_unix=time.time(),
        namespaces=dict(plan.ns),
        timings_s=dict(timings),
    )
    if userns.rootless():
        rec["rootless_notes"] = userns.rootless_notes()
    for node in rec["topology"]["nodes"]:
        for port in node["ports"]:
            key = (node["name"], port["index"])
            port["ifname"] = plan.ifname[key]
            port["mac"] = plan.macs[key]
    return rec


# ---------------------------------------------------------------- down, clean


def _teardown(journal: registry.Journal) -> kernel.Removed:
    journal.status = "deleting"
    with contextlib.suppress(OSError):
        journal.save()
    _stop_fabric(journal)
    removed = kernel.delete_namespaces(journal.namespaces)
    cgroup.remove(journal.name)
    registry.remove(journal.name)
    return removed


def _journal(name: str) -> registry.Journal | None:
    """The lab's journal; LabError for a bad name or a journal ethplus did not write."""
    try:
        return registry.Journal.load(name)
    except registry.RegistryError as exc:
        raise LabError(str(exc)) from None


def down(name: str) -> kernel.Removed:
    """Remove a lab; returns what was removed."""
    require_root("ethplus lab down")
    journal = _journal(name)
    if journal is None:
        known = ", ".join(registry.names()) or "none are running"
        raise LabError(f"no lab named {name!r} ({known})")
    with registry.locked():
        return _teardown(journal)


def down_all() -> list[str]:
    require_root("ethplus lab down --all")
    names = []
    for j in registry.journals():
        with registry.locked():
            _teardown(j)
        names.append(j.name)
    return names


def lab_alive(journal: registry.Journal) -> bool:
    """Is somebody still using this lab: its creator still running (a lab
    being built, or one a bench or scenario holds), or it is up and its
    fabric runs?  A lab that is neither is a leftover of a crash."""
    if registry.process_alive(journal.pid, journal.pid_start):
        return True
    return journal.status == "up" and fabric_alive(journal)


def clean(only: list[str] | None = None) -> dict:
    """Remove the leftovers ethplus made (of the labs named in only, or all):
    labs whose creator and fabric are dead, and namespaces that carry the
    ethplus marker but no lab records.  Live labs stay (`lab down` removes
    those); a namespace that merely starts with "ethp-" is left alone, and
    so is a lab whose journal ethplus did not write.
    """
    require_root("ethplus clean")
    for name in only or []:
        try:
            registry.check_name(name)
        except registry.RegistryError as exc:
            raise LabError(str(exc)) from None
    removed: dict = {"labs": 0, "live": [], "refused": []}
    gone = kernel.Removed()
    with registry.locked():
        for name in only if only is not None else registry.names():
            if not registry.lab_dir(name).exists():
                continue
            try:
                j = registry.Journal.load(name)
            except registry.RegistryError as exc:
                removed["refused"].append(str(exc))
                continue
            if j is not None and lab_alive(j):
                removed["live"].append(name)
                continue
            if j is not None:
                gone += _teardown(j)
            else:
                registry.remove(name)
            removed["labs"] += 1
        stray = []
        wanted = {kernel.marker(n) for n in only} if only is not None else None
        if registry.NETNS_DIR.is_dir():
            for entry in os.scandir(registry.NETNS_DIR):
                if not entry.name.startswith(registry.NS_PREFIX):
                    continue
                m = kernel.read_marker(entry.path)
                if not m or not m.startswith(kernel.MARKER_PREFIX):
                    continue
                lab_of = m[len(kernel.MARKER_PREFIX) :]
                if (wanted is None or m in wanted) and not (
                    valid_name(lab_of) and registry.lab_dir(lab_of).exists()
                ):
                    stray.append(entry.path)
        gone += kernel.delete_namespaces(stray)
        for name in cgroup.strays(only):
            cgroup.remove(name)
    removed["namespaces"], removed["tcp_sockets"] = gone.namespaces, gone.tcp_sockets
    return removed


# ---------------------------------------------------------------- queries


def get(name: str) -> dict:
    rec = registry.load_lab(name)
    if rec is None:
        j = _journal(name)
        if j is not None:
            raise LabError(
                f"lab {name!r} is {j.status} (pid {j.pid}); if that process is gone, "
                "`ethplus clean` removes it"
            )
        known = ", ".join(registry.names()) or "none are running"
        raise LabError(f"no lab named {name!r} ({known})")
    return rec


def listing() -> list[dict]:
    out = []
    for j in registry.journals():
        rec = registry.load_lab(j.name) or {}
        topo = rec.get("topology", {})
        status = j.status
        if status == "up" and not fabric_alive(j):
            status = "failed: fabric exited"
        out.append(
            {
                "name": j.name,
                "status": status,
                "family": rec.get("family", "?"),
                "nodes": len(topo.get("nodes", [])),
                "links": len(topo.get("links", [])),
                "time_scale": rec.get("time_scale"),
                "file": j.file,
                "tag": j.tag,
            }
        )
    return out


def control(name: str, req: dict) -> dict:
    """A request to a running lab's fabric; LabError if the lab or fabric is gone."""
    get(name)
    j = _journal(name)
    if j is None or not fabric_alive(j):
        raise LabError(
            f"the fabric of lab {name!r} is not running (it crashed or was killed): "
            f"{_fabric_log_tail(name) or 'no log'}; `ethplus lab down {name}` removes the lab"
        )
    try:
        resp = fabric_client.request(name, req)
    except (OSError, ValueError) as exc:
        raise LabError(f"the fabric of lab {name!r} does not answer: {exc}") from None
    if not resp.get("ok"):
        raise LabError(resp.get("error", "request failed"))
    return resp


def rescale(rec: dict, k: float) -> None:
    """Change a running lab's time scale: its fabric first (links and
    shapers), then its record, which jobs started from now on read (rec is
    updated in place)."""
    control(rec["name"], {"op": "scale", "k": k})
    rec["time_scale"] = float(k)
    with registry.locked():
        saved = registry.load_lab(rec["name"])
        if saved is not None:
            saved["time_scale"] = float(k)
            registry.save_lab(rec["name"], saved)


def node_ns(rec: dict, node: str) -> str:
    """The namespace of node in the lab whose record is rec."""
    ns = rec["namespaces"].get(node)
    if ns is None:
        nodes = list(rec["namespaces"])
        shown = ", ".join(nodes[:12]) + (" ..." if len(nodes) > 12 else "")
        raise LabError(f"lab {rec['name']!r} has no node {node!r} (nodes: {shown})")
    return ns


@contextlib.contextmanager
def session(lab_arg: str, time_scale: float | None = None, announce=None) -> Iterator[dict]:
    """A running lab named lab_arg, or a lab file (or netns-labs/ name) brought
    up for the duration of the block and removed after it, even on error."""
    from dataplane.model import labfile, library

    if registry.load_lab(lab_arg) is not None:
        if time_scale is not None:
            raise LabError(f"lab {lab_arg!r} is already running; --time-scale applies to lab files")
        yield get(lab_arg)
        return
    try:
        spec = labfile.load(lab_arg)
    except labfile.LabFileError as exc:
        if not os.path.exists(lab_arg) and "/" not in lab_arg and not lab_arg.endswith(".toml"):
            known = ", ".join(registry.names()) or "none are running"
            files = ", ".join(library.names())
            raise LabError(
                f"--lab {lab_arg!r} is neither a running lab ({known}) nor a lab file "
                f"(a path, or one of: {files})"
            ) from None
        raise exc
    if registry.load_lab(spec.name) is not None or registry.Journal.load(spec.name) is not None:
        raise LabError(
            f"a lab named {spec.name!r} already exists; pass --lab {spec.name} to use it, "
            f"or remove it with `ethplus lab down {spec.name}`"
        )
    if time_scale is not None:
        spec.pin_time_scale(time_scale)
    rec = up(spec)
    if announce:
        announce(rec)
    try:
        with _signals_raise():  # SIGTERM or Ctrl-C mid-run: the lab goes too
            yield rec
    except (_Interrupted, Interrupted) as exc:
        name = exc.args[0] if isinstance(exc, _Interrupted) else exc.signame
        raise Interrupted(name, f"lab {spec.name!r}, brought up for this run, is removed") from None
    finally:
        down(spec.name)
