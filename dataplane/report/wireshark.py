"""The Wireshark dissector ethplus ships (wireshark/ethplus.lua): where it
is, and how it goes into a user's Wireshark."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

DISSECTOR = Path(__file__).resolve().parents[1] / "wireshark" / "ethplus.lua"
# Wireshark's personal Lua plugins folder (Wireshark >= 2.6, Linux)
PERSONAL_PLUGINS = ".local/lib/wireshark/plugins"
FILTERS = (
    "ethplus",
    "ethplus.opcode == 2  (acks; 1 data, 3 nack, 6 agg, 7 agg-result)",
    "ethplus.flags.trimmed == 1 || ethplus.flags.retx == 1",
    "ethplus.ce == 1",
    "ethplus.int.qlen_bytes > 100000",
    'ethplus.transport == "RoCE (emulated)"',
    "ethplus.agg.group == 0x1234abc0",
)


def personal_plugin_dir() -> Path:
    """This user's Wireshark plugin folder, from the password database (the
    user's own home, whatever $HOME says)."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / PERSONAL_PLUGINS


def install(directory: Path | None = None) -> Path:
    """Copy the dissector into directory (the personal plugin folder by
    default), made if missing; returns the file written."""
    d = directory or personal_plugin_dir()
    d.mkdir(parents=True, exist_ok=True)
    dest = d / DISSECTOR.name
    shutil.copyfile(DISSECTOR, dest)
    dest.chmod(0o644)
    return dest


def usage() -> str:
    """What `ethplus wireshark` prints."""
    lines = [
        f"ETH+ Wireshark dissector: {DISSECTOR}",
        "",
        "Load it for one run:",
        f"  wireshark -X lua_script:{DISSECTOR} FILE.pcap",
        f"  tshark -X lua_script:{DISSECTOR} -r FILE.pcap -V",
        "Or for good: `ethplus wireshark --install` copies it into your personal plugin folder",
        f"  ({personal_plugin_dir()}); Wireshark loads it at start.",
        "",
        "It decodes ETH+ on UDP 4793 and EtherType 0x88B5 (every header field, flags by",
        "name, the INT block hop by hop, SACK and grant of acks, aggregation frames) and",
        "this project's emulated RoCEv2 on UDP 4791 (frames that are not ours still go to",
        "Wireshark's RoCEv2 dissector). Pcaps: `ethplus capture NAME LINK -w FILE.pcap`.",
        "",
        "Display filters, for example:",
        *(f"  {x}" for x in FILTERS),
    ]
    return "\n".join(lines)
