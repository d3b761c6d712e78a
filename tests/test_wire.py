"""The C wire format through cffi: round trips, checksums, malformed frames."""

import struct

import pytest

from dataplane.lab import core
from dataplane.lab.core import Addr, Header, WireError, build_frame, parse_frame


def ref_csum(data: bytes) -> int:
    """RFC 1071 in plain Python: the reference the C code is checked against."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


ADDR = Addr(
    dst_mac=bytes.fromhex("02aabbccddee"),
    src_mac=bytes.fromhex("021122334455"),
    src_ip=0xC6120001,
    dst_ip=0xC6121002,
    src_port=40000,
    tos=0x02,
    ttl=17,
    ip_id=321,
)
HDR = Header(
    opcode=core.OPCODES["data"],
    flags=core.FLAGS["last"] | core.FLAGS["trimmable"],
    entropy=0xBEEF,
    src_ep=3,
    dst_ep=65000,
    msg_id=0xDEADBEEF,
    psn=123456,
    offset_bytes=4096 * 1000,
    tag=77,
    len_bytes=1000,
    tos=1,
    hops=2,
    ts_ns=0xFFFFFFFF,
    src_epoch=0x01020304,
    dst_epoch=0xA0B0C0D0,
)
PAYLOAD = bytes(range(256)) * 3 + bytes(232)


def test_udp_round_trip_keeps_every_field():
    frame = build_frame(ADDR, HDR, PAYLOAD)
    assert len(frame) == 14 + 20 + 8 + 40 + len(PAYLOAD)
    p = parse_frame(frame)
    assert p.kind == "ethp-udp"
    assert p.header == HDR
    assert p.payload == PAYLOAD
    assert p.addr.src_ip == ADDR.src_ip and p.addr.dst_ip == ADDR.dst_ip
    assert p.addr.src_port == 40000 and p.addr.dst_port == core.UDP_PORT
    assert p.addr.dst_mac == ADDR.dst_mac and p.addr.src_mac == ADDR.src_mac
    assert p.addr.ttl == 17 and p.addr.ip_id == 321
    assert p.ecn == 2
    assert p.offsets == {"l3": 14, "l4": 34, "hdr": 42, "payload": 82}


def test_compact_round_trip_and_overhead():
    frame = build_frame(ADDR, HDR, PAYLOAD, compact=True)
    assert len(frame) == 14 + 40 + len(PAYLOAD)
    assert frame[12:14] == b"\x88\xb5"
    p = parse_frame(frame)
    assert p.kind == "ethp-compact"
    assert p.header == HDR and p.payload == PAYLOAD
    assert p.ecn == HDR.tos & 3


def test_byte_layout_matches_wire_format_doc():
    frame = build_frame(ADDR, HDR, PAYLOAD)
    h = frame[42:82]
    assert h[0] == 0x21  # version 2, opcode 1 (data)
    assert h[1] == HDR.flags
    assert h[2:4] == b"\xbe\xef"  # entropy
    assert struct.unpack("!HHIIII", h[4:24]) == (3, 65000, 0xDEADBEEF, 123456, 4096000, 77)
    assert struct.unpack("!HBBI", h[24:32]) == (1000, 1, 2, 0xFFFFFFFF)
    assert struct.unpack("!II", h[32:40]) == (0x01020304, 0xA0B0C0D0)  # epochs
    ip = frame[14:34]
    assert ip[0] == 0x45 and ip[9] == 17
    assert struct.unpack("!H", ip[2:4])[0] == 20 + 8 + 40 + len(PAYLOAD)
    assert struct.unpack("!H", frame[36:38])[0] == core.UDP_PORT


@pytest.mark.parametrize("n", [0, 1, 2, 19, 20, 21, 1499])
def test_inet_csum_matches_reference(n):
    data = bytes((i * 37 + 11) & 0xFF for i in range(n))
    assert core.inet_csum(data) == ref_csum(data)


def test_built_ipv4_header_checksum_verifies():
    frame = build_frame(ADDR, HDR, PAYLOAD)
    ip = frame[14:34]
    assert ref_csum(ip) == 0  # a correct header sums to zero
    stored = struct.unpack("!H", ip[10:12])[0]
    assert stored == ref_csum(ip[:10] + b"\0\0" + ip[12:])


def test_bad_checksum_rejected():
    frame = bytearray(build_frame(ADDR, HDR, PAYLOAD))
    frame[14 + 8] ^= 0x01  # flip a TTL bit without fixing the checksum
    with pytest.raises(WireError, match="checksum"):
        parse_frame(bytes(frame))


@pytest.mark.parametrize("cut", [0, 5, 13, 20, 33, 40, 60, 81, 100])
def test_truncated_frames_rejected(cut):
    frame = build_frame(ADDR, HDR, PAYLOAD)
    with pytest.raises(WireError, match="truncated"):
        parse_frame(frame[:cut])


def test_truncated_compact_rejected():
    frame = build_frame(ADDR, HDR, PAYLOAD, compact=True)
    for cut in (20, 53, 54 + 10):
        with pytest.raises(WireError, match="truncated"):
            parse_frame(frame[:cut])


def test_ethernet_padding_is_ignored():
    hdr = Header(len_bytes=4)
    frame = build_frame(ADDR, hdr, b"abcd") + bytes(30)
    p = parse_frame(frame)
    assert p.payload == b"abcd"


def test_oversize_rejected_on_build_and_parse():
    with pytest.raises(WireError, match="oversize"):
        build_frame(ADDR, Header(len_bytes=0), bytes(core.MAX_FRAME_BYTES))
    with pytest.raises(WireError, match="oversize"):
        parse_frame(bytes(core.MAX_FRAME_BYTES + 1))


def test_payload_longer_than_header_says_is_rejected():
    frame = build_frame(ADDR, Header(len_bytes=10), bytes(10))
    # IPv4 total length is right, but the ETH+ length claims fewer bytes
    bad = bytearray(frame)
    bad[42 + 24 : 42 + 26] = struct.pack("!H", 4)
    with pytest.raises(WireError, match="oversize"):
        parse_frame(bytes(bad))


def test_trimmed_packet_keeps_its_length_field():
    hdr = Header(flags=core.FLAGS["trimmed"], len_bytes=4096)
    p = parse_frame(build_frame(ADDR, hdr, b""))
    assert p.header.len_bytes == 4096 and p.payload == b""


def test_unknown_version_rejected():
    bad = bytearray(build_frame(ADDR, HDR, PAYLOAD, compact=True))
    for v in (1, 3):  # version 1 (the 32-byte header without epochs) is refused too
        bad[14] = v << 4 | 1
        with pytest.raises(WireError, match="version"):
            parse_frame(bytes(bad))


def test_other_traffic_is_classified_not_rejected():
    eth = bytes(12)
    assert parse_frame(eth + b"\x86\xdd" + bytes(40)).kind == "other"
    assert parse_frame(eth + b"\x88\x08" + bytes(46)).kind == "macctl"
    udp_other = bytearray(build_frame(ADDR, Header(len_bytes=0)))
    udp_other[36:38] = struct.pack("!H", 53)
    assert parse_frame(bytes(udp_other)).kind == "ipv4"


def test_wire_bytes_counts_fcs_preamble_gap_and_minimum():
    assert core.wire_bytes(60) == 84  # minimum frame: 64 + 8 + 12
    assert core.wire_bytes(1514) == 1538


def test_pfc_frame_layout():
    src = bytes.fromhex("02aabbccdd01")
    f = core.build_pfc(src, class_mask=0b10, quanta=0x1234)
    assert len(f) == 60
    assert f[0:6] == bytes.fromhex("0180c2000001") and f[6:12] == src
    assert f[12:14] == b"\x88\x08" and f[14:16] == b"\x01\x01"  # MAC control, PFC opcode
    assert f[16:18] == b"\x00\x02"  # class-enable vector: class 1 only
    assert f[18:20] == b"\x00\x00" and f[20:22] == b"\x12\x34"  # quanta per class
    assert parse_frame(f).kind == "macctl"


@pytest.mark.parametrize("compact,int_off", [(False, 82), (True, 54)])
def test_int_block_sits_between_header_and_payload(compact, int_off):
    hdr = Header(**{**HDR.__dict__, "flags": HDR.flags | core.FLAGS["int"]})
    frame = build_frame(ADDR, hdr, PAYLOAD, compact=compact)
    plain = build_frame(ADDR, HDR, PAYLOAD, compact=compact)
    assert len(frame) == len(plain) + core.lib.ETHP_INT_BYTES == len(plain) + 84
    p = parse_frame(frame)
    assert p.offsets["int"] == int_off and p.offsets["payload"] == int_off + 84
    assert p.payload == PAYLOAD and p.header.len_bytes == len(PAYLOAD)  # len: payload only
    assert p.int_hops == []  # empty until a switch writes a record
    assert frame[int_off : int_off + 2] == bytes([0, 5])  # records written, room for
    if not compact:  # IPv4 and UDP lengths count the block
        assert struct.unpack("!H", frame[16:18])[0] == len(frame) - 14
        assert struct.unpack("!H", frame[38:40])[0] == len(frame) - 34
    assert "int" not in parse_frame(plain).offsets


def test_int_block_cut_short_is_rejected_and_kept_when_trimmed():
    flags = core.FLAGS["int"] | core.FLAGS["trimmed"]
    trimmed = build_frame(ADDR, Header(flags=flags, len_bytes=4000), compact=True)
    p = parse_frame(trimmed)  # a trimmed packet keeps its INT block: switches still stamp it
    assert p.payload == b"" and p.offsets["int"] == 54 and p.int_hops == []
    with pytest.raises(WireError):
        parse_frame(trimmed[:-1])


def test_int_records_decode_in_network_order():
    hdr = Header(flags=core.FLAGS["int"], len_bytes=4)
    frame = bytearray(build_frame(ADDR, hdr, b"abcd", compact=True))
    frame[54] = 2  # two records, as two switches would write them
    frame[58:74] = struct.pack("!HHIII", 1025, 3, 0xFFFFFFF0, 123456, 400_000_000)
    frame[74:90] = struct.pack("!HHIII", 2050, 0, 7, 9, 62_500)
    hops = parse_frame(bytes(frame)).int_hops
    assert hops == [
        {"port_id": 1025, "qlen_64b": 3, "ts_ns": 0xFFFFFFF0, "tx_bytes": 123456,
         "rate_kbps": 400_000_000},
        {"port_id": 2050, "qlen_64b": 0, "ts_ns": 7, "tx_bytes": 9, "rate_kbps": 62_500},
    ]  # fmt: skip
