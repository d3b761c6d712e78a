"""The comparison use case (`ethplus compare`, `ethplus demo`): the same
collectives over several transports on one lab, one after the other, then
a report (reports.write).  The command line only parses and prints: what a
run prints goes through the callbacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dataplane.lab import labs
from dataplane.report import reports
from dataplane.run import bench, inc
from dataplane.run.bench import BenchError


def specs(
    collectives: list[str], transports: list[str], make: Callable[..., bench.Spec],
    ccs: list[str], in_network: bool, algo: str,
) -> list[bench.Spec]:  # fmt: skip
    """Every run of a comparison, in order: each collective over each
    transport (ethplus once per congestion control in ccs, if any), and
    all-reduce also reduced in the network when in_network.  make(collective,
    transport, cc) gives one validated bench.Spec."""
    if ccs and "ethplus" not in transports:
        raise BenchError("--cc: chooses the ethplus transport's congestion control;"
                         " add ethplus to --transports")  # fmt: skip
    out = []
    for c in collectives:
        for t in transports:
            out += [make(c, t, cc) for cc in ccs] if t == "ethplus" and ccs else [make(c, t, None)]
        if in_network and c == "all-reduce" and algo != "in-network":
            out.append(dataclasses.replace(make(c, "ethplus", None), algo="in-network"))
    return out


def run(
    runs: list[bench.Spec], lab_name: str | None, time_scale, out_dir: str, *,
    run_one: Callable[[bench.Spec, dict, list | None], dict],
    nodes: list[str] | None = None, skip_in_network: bool = False,
    announce=None, say: Callable[[str], None] = lambda _m: None,
) -> tuple[list[dict], dict]:  # fmt: skip
    """Run each spec on the lab (a session: made and removed when lab_name
    names a lab file, not a running lab), run_one(spec, rec, nodes) doing
    one; then write the report.  Returns the results and the report's paths.
    A lab that cannot reduce in the network: an error, or (skip_in_network)
    those runs left out, said why."""
    results = []
    with labs.session(lab_name, time_scale, announce=announce) as rec:
        why = inc.inc_problem(rec)
        if why and any(s.algo == "in-network" for s in runs):
            if not skip_in_network:
                raise BenchError(f"--in-network: {why}")
            say(f"(no in-network all-reduce: {why})")
            runs = [s for s in runs if s.algo != "in-network"]
        nodes = bench.check_nodes(nodes, rec)
        for spec in runs:
            results.append(run_one(spec, rec, nodes))
        paths = reports.write(out_dir, results, rec)
    return results, paths


def wrong(results: list[dict]) -> bool:
    """Did any run deliver a wrong byte?"""
    return any(r["wrong"] for res in results for r in res["rows"])
