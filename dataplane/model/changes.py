"""Link changes from words, such as ``loss 1%`` or ``rate 100G`` (nominal
units), as `ethplus link set` and scenario fault schedules give them (pure:
applying them is faults.py's, on a running lab)."""

from __future__ import annotations


def parse_value(what: str, text: str) -> float:
    """Numbers with units: rates 400G / 25Gbit / 800M (bit/s), delays 2us / 500ns / 1ms,
    probabilities 0.01 or 1%."""
    t = text.strip().lower()
    units = {
        "rate": [
            ("tbit", 1e12),
            ("gbit", 1e9),
            ("mbit", 1e6),
            ("kbit", 1e3),
            ("t", 1e12),
            ("g", 1e9),
            ("m", 1e6),
            ("k", 1e3),
            ("", 1e9),
        ],
        "delay": [("ns", 1), ("us", 1e3), ("ms", 1e6), ("s", 1e9), ("", 1)],
        "probability": [("%", 0.01), ("", 1)],
    }[what]
    for suffix, scale in units:
        if t.endswith(suffix):
            try:
                v = float(t[: len(t) - len(suffix)] if suffix else t) * scale
            except ValueError:
                break
            if v != v or v < 0 or (what == "probability" and v > 1) or (what == "rate" and v <= 0):
                break
            return v
    expected = {
        "rate": "a rate > 0 such as 400G, 25Gbit, 800M (bare numbers are Gbit/s)",
        "delay": "a delay >= 0 such as 500ns, 2us, 1ms (bare numbers are ns)",
        "probability": "a probability in [0, 1] such as 0.01 or 1%",
    }[what]
    raise ValueError(f"{what} {text!r}: expected {expected}")


CHANGES = "down, up, loss P, corrupt P, rate R, delay D, jitter J, llr on|off"


def link_change(words: list[str]) -> dict:
    """['down'] / ['loss', '1%'] / ['rate', '100G'] ... -> the fabric's change dict."""
    a = [str(w) for w in words]
    if len(a) == 1 and a[0] in ("up", "down"):
        return {"up": a[0] == "up"}
    if len(a) == 2 and a[0] == "llr" and a[1] in ("on", "off"):
        return {"llr": a[1] == "on"}
    if len(a) == 2 and a[0] in ("loss", "corrupt"):
        return {a[0]: parse_value("probability", a[1])}
    if len(a) == 2 and a[0] == "rate":
        return {"rate_bps": int(parse_value("rate", a[1]))}
    if len(a) == 2 and a[0] in ("delay", "jitter"):
        return {f"{a[0]}_ns": int(parse_value("delay", a[1]))}
    raise ValueError(f"cannot understand {' '.join(a)!r}: expected one of: {CHANGES}")
