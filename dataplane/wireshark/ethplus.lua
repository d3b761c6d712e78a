-- Wireshark dissector for ethplus (docs/wire-format.md): the ETH+ header in
-- both encapsulations (IPv4/UDP port 4793; EtherType 0x88B5), its INT
-- block, acks (cumulative PSN, SACK base and bitmap, receiver grant),
-- in-network all-reduce frames, and the emulated RoCEv2 frames on UDP 4791
-- (only frames that pass our checks; any other 4791 traffic goes on to
-- Wireshark's own RoCEv2 dissector).
--
-- Load:   wireshark -X lua_script:ethplus.lua    (tshark the same)
-- or copy it into the personal Lua plugins folder: `ethplus wireshark --install`.
--
-- Every length and index is checked against the bytes the frame carries;
-- a frame that fails a check is marked malformed (expert info), never an error.
-- Arithmetic, not bit operators: the same file runs on Lua 5.1 to 5.4.

local HDR_BYTES = 40
local VERSION = 2
local INT_MAX_HOPS = 5
local INT_HOP_BYTES = 16
local INT_BYTES = 4 + INT_MAX_HOPS * INT_HOP_BYTES
local UDP_PORT = 4793
local ROCE_PORT = 4791
local ETHERTYPE = 0x88B5
local AGG_EP_BASE = 0xF000

local OP = { DATA = 1, ACK = 2, NACK = 3, RNR = 4, CNP = 5, AGG = 6, AGG_RESULT = 7, HELLO = 8 }
local OPCODES = {
    [1] = "data", [2] = "ack", [3] = "nack", [4] = "rnr", [5] = "cnp",
    [6] = "agg", [7] = "agg-result", [8] = "hello",
}
local FLAG_BITS = {
    { 0x01, "trimmed" }, { 0x02, "last" }, { 0x04, "ecn-echo" },
    { 0x08, "trimmable" }, { 0x10, "retx" }, { 0x20, "int" }, { 0x40, "busy" },
}
local ECN = { [0] = "Not-ECT", [1] = "ECT(1)", [2] = "ECT(0)", [3] = "CE" }
local DTYPES = { [0] = "float32", [1] = "int32", [2] = "float16", [3] = "bfloat16" }
local OPS = { [0] = "sum", [1] = "max", [2] = "min" }

local function has(v, bit) return math.floor(v / bit) % 2 == 1 end
local function shr(v, n) return math.floor(v / 2 ^ n) end

local p = Proto("ethplus", "ETH+ transport (ethplus)")
local f = p.fields
f.transport = ProtoField.string("ethplus.transport", "Transport")
f.version = ProtoField.uint8("ethplus.version", "Version", base.DEC, nil, 0xF0)
f.opcode = ProtoField.uint8("ethplus.opcode", "Opcode", base.DEC, OPCODES, 0x0F)
f.flags = ProtoField.uint8("ethplus.flags", "Flags", base.HEX)
f.flag_trimmed = ProtoField.bool("ethplus.flags.trimmed", "Trimmed", 8, nil, 0x01)
f.flag_last = ProtoField.bool("ethplus.flags.last", "Last packet of its message", 8, nil, 0x02)
f.flag_ecn_echo = ProtoField.bool("ethplus.flags.ecn_echo", "ECN echo", 8, nil, 0x04)
f.flag_trimmable = ProtoField.bool("ethplus.flags.trimmable", "Trimmable", 8, nil, 0x08)
f.flag_retx = ProtoField.bool("ethplus.flags.retx", "Retransmission", 8, nil, 0x10)
f.flag_int = ProtoField.bool("ethplus.flags.int", "INT block follows", 8, nil, 0x20)
f.flag_busy = ProtoField.bool("ethplus.flags.busy", "Receiver busy with other data (RNR)", 8, nil, 0x40)
f.flag_names = ProtoField.string("ethplus.flags.names", "Flag names")
f.entropy = ProtoField.uint16("ethplus.entropy", "Entropy", base.DEC)
f.plane = ProtoField.uint8("ethplus.plane", "Plane (entropy mod 16)", base.DEC)
f.src_ep = ProtoField.uint16("ethplus.src_ep", "Source endpoint", base.DEC)
f.dst_ep = ProtoField.uint16("ethplus.dst_ep", "Destination endpoint", base.DEC)
f.msg_id = ProtoField.uint32("ethplus.msg_id", "Message", base.DEC)
f.psn = ProtoField.uint32("ethplus.psn", "PSN", base.DEC)
f.offset = ProtoField.uint32("ethplus.offset", "Offset", base.DEC)
f.tag = ProtoField.uint32("ethplus.tag", "Tag", base.DEC)
f.len = ProtoField.uint16("ethplus.len", "Payload length as sent", base.DEC)
f.tos = ProtoField.uint8("ethplus.tos", "TOS (compact form)", base.HEX)
f.tc = ProtoField.uint8("ethplus.tos.tc", "Traffic class", base.DEC, nil, 0xFC)
f.tos_ecn = ProtoField.uint8("ethplus.tos.ecn", "ECN", base.DEC, ECN, 0x03)
f.hops = ProtoField.uint8("ethplus.hops", "Switches traversed", base.DEC)
f.ts = ProtoField.uint32("ethplus.ts_ns", "Timestamp (ns mod 2^32)", base.DEC)
f.src_epoch = ProtoField.uint32("ethplus.src_epoch", "Source epoch", base.DEC)
f.dst_epoch = ProtoField.uint32("ethplus.dst_epoch", "Destination epoch", base.DEC)
f.ce = ProtoField.bool("ethplus.ce", "CE (congestion experienced)")
-- acks and nacks
f.cum_psn = ProtoField.uint32("ethplus.ack.psn", "Cumulative PSN (all below arrived)", base.DEC)
f.sack_base = ProtoField.uint32("ethplus.sack.base", "SACK base", base.DEC)
f.sack_bitmap = ProtoField.uint64("ethplus.sack.bitmap", "SACK bitmap", base.HEX)
f.sack_psn = ProtoField.uint32("ethplus.sack.psn", "Arrived PSN", base.DEC)
f.grant = ProtoField.uint32("ethplus.grant", "Receiver grant (bytes in flight)", base.DEC)
f.qp = ProtoField.uint32("ethplus.roce.qp", "Queue pair", base.DEC)
-- in-network all-reduce
f.agg_group = ProtoField.uint32("ethplus.agg.group", "Aggregation group", base.HEX)
f.agg_chunk = ProtoField.uint32("ethplus.agg.chunk", "Chunk", base.DEC)
f.agg_members = ProtoField.uint16("ethplus.agg.members", "Members", base.DEC)
f.agg_index = ProtoField.uint16("ethplus.agg.index", "Member index", base.DEC)
f.agg_dtype = ProtoField.uint8("ethplus.agg.dtype", "Element type", base.DEC, DTYPES)
f.agg_op = ProtoField.uint8("ethplus.agg.op", "Operator", base.DEC, OPS)
f.agg_window = ProtoField.uint16("ethplus.agg.window", "Window (slots)", base.DEC)
f.agg_switch = ProtoField.uint16("ethplus.agg.aggregator", "Aggregator", base.DEC)
-- INT
f.int_nhops = ProtoField.uint8("ethplus.int.n_hops", "Records", base.DEC)
f.int_max = ProtoField.uint8("ethplus.int.max_hops", "Room (records)", base.DEC)
f.int_port_id = ProtoField.uint16("ethplus.int.port_id", "Port id", base.DEC)
f.int_switch = ProtoField.uint16("ethplus.int.switch", "Switch", base.DEC)
f.int_port = ProtoField.uint16("ethplus.int.port", "Port", base.DEC)
f.int_qlen = ProtoField.uint32("ethplus.int.qlen_bytes", "Queue left behind (bytes)", base.DEC)
f.int_ts = ProtoField.uint32("ethplus.int.ts_ns", "Left the port at (ns mod 2^32)", base.DEC)
f.int_tx = ProtoField.uint32("ethplus.int.tx_bytes", "Port's wire bytes sent (mod 2^32)", base.DEC)
f.int_rate = ProtoField.uint32("ethplus.int.rate_kbps", "Link rate (kbit/s, real)", base.DEC)
f.payload = ProtoField.bytes("ethplus.payload", "Payload")

local ef_malformed = ProtoExpert.new("ethplus.malformed", "Malformed ETH+ frame",
    expert.group.MALFORMED, expert.severity.ERROR)
p.experts = { ef_malformed }

local ip_ecn = Field.new("ip.dsfield.ecn")

local function malformed(tree, pinfo, why)
    tree:add_proto_expert_info(ef_malformed, "Malformed: " .. why)
    pinfo.cols.info:append(" [malformed: " .. why .. "]")
end

local function add_int(tvb, tree, pinfo, off)
    local t = tree:add(p, tvb(off, INT_BYTES), "INT block")
    local n, room = tvb(off, 1):uint(), tvb(off + 1, 1):uint()
    t:add(f.int_nhops, tvb(off, 1))
    t:add(f.int_max, tvb(off + 1, 1))
    if n > INT_MAX_HOPS then
        malformed(t, pinfo, "INT records " .. n .. " over " .. INT_MAX_HOPS)
        n = INT_MAX_HOPS
    end
    local hops = {}
    for i = 0, n - 1 do
        local h = off + 4 + i * INT_HOP_BYTES
        local port_id = tvb(h, 2):uint()
        local sw, port = shr(port_id, 10), port_id % 1024
        local qlen = tvb(h + 2, 2):uint() * 64
        local ht = t:add(p, tvb(h, INT_HOP_BYTES),
            string.format("Hop %d: switch %d port %d, queue %d B", i + 1, sw, port, qlen))
        ht:add(f.int_port_id, tvb(h, 2))
        ht:add(f.int_switch, tvb(h, 2), sw):set_generated()
        ht:add(f.int_port, tvb(h, 2), port):set_generated()
        ht:add(f.int_qlen, tvb(h + 2, 2), qlen)
        ht:add(f.int_ts, tvb(h + 4, 4))
        ht:add(f.int_tx, tvb(h + 8, 4))
        ht:add(f.int_rate, tvb(h + 12, 4))
        hops[#hops + 1] = sw .. "/" .. port .. " q " .. qlen .. " B"
    end
    return n == 0 and "(none yet)" or table.concat(hops, ", ")
end

local function add_sack(tvb, tree, off, base_psn)
    local st = tree:add(f.sack_bitmap, tvb(off, 8))
    for b = 0, 7 do
        local byte = tvb(off + b, 1):uint()
        for j = 0, 7 do
            if has(byte, 2 ^ j) then
                local i = (7 - b) * 8 + j
                st:add(f.sack_psn, tvb(off + b, 1), (base_psn + i) % 2 ^ 32):set_generated()
            end
        end
    end
end

-- The whole ETH+ header and what follows it; kind: "udp", "compact" or "roce".
local function dissect(tvb, pinfo, root, kind)
    local size = tvb:len()
    local roce = kind == "roce"
    pinfo.cols.protocol = roce and "RoCE (ethplus)" or "ETH+"
    local tree = root:add(p, tvb(0, math.min(size, HDR_BYTES)),
        roce and "ethplus emulated RoCEv2" or "ETH+ transport")
    tree:add(f.transport, tvb(0, 0), roce and "RoCE (emulated)" or "ETH+"):set_generated()
    if size < HDR_BYTES then
        malformed(tree, pinfo, "header needs " .. HDR_BYTES .. " bytes, frame carries " .. size)
        return size
    end
    local ver_op = tvb(0, 1):uint()
    local ver, op = shr(ver_op, 4), ver_op % 16
    tree:add(f.version, tvb(0, 1))
    tree:add(f.opcode, tvb(0, 1))
    if ver ~= VERSION then
        malformed(tree, pinfo, "version " .. ver .. " (expected " .. VERSION .. ")")
        return size
    end
    local flags = tvb(1, 1):uint()
    local ft = tree:add(f.flags, tvb(1, 1))
    local names = {}
    for _, fb in ipairs(FLAG_BITS) do
        if has(flags, fb[1]) then names[#names + 1] = fb[2] end
    end
    for _, pf in ipairs({ f.flag_trimmed, f.flag_last, f.flag_ecn_echo, f.flag_trimmable,
                          f.flag_retx, f.flag_int, f.flag_busy }) do
        ft:add(pf, tvb(1, 1))
    end
    ft:add(f.flag_names, tvb(1, 1), table.concat(names, ",")):set_generated()
    local entropy = tvb(2, 2):uint()
    tree:add(f.entropy, tvb(2, 2))
    tree:add(f.plane, tvb(2, 2), entropy % 16):set_generated()
    tree:add(f.src_ep, tvb(4, 2))
    tree:add(f.dst_ep, tvb(6, 2))
    local msg_id, psn = tvb(8, 4):uint(), tvb(12, 4):uint()
    local offset, tag = tvb(16, 4):uint(), tvb(20, 4):uint()
    local len = tvb(24, 2):uint()
    tree:add(f.msg_id, tvb(8, 4))
    tree:add(f.psn, tvb(12, 4))
    tree:add(f.offset, tvb(16, 4))
    tree:add(f.tag, tvb(20, 4))
    tree:add(f.len, tvb(24, 2))
    local tt = tree:add(f.tos, tvb(26, 1))
    tt:add(f.tc, tvb(26, 1))
    tt:add(f.tos_ecn, tvb(26, 1))
    tree:add(f.hops, tvb(27, 1))
    local ts = tvb(28, 4):uint()
    tree:add(f.ts, tvb(28, 4))
    tree:add(f.src_epoch, tvb(32, 4))
    tree:add(f.dst_epoch, tvb(36, 4))

    -- CE: the IPv4 header's ECN (UDP forms) or the tos byte's (compact)
    local ecn
    if kind == "compact" then
        ecn = tvb(26, 1):uint() % 4
    else
        local fi = ip_ecn()
        ecn = fi and fi.value or 0
    end
    tree:add(f.ce, tvb(0, 0), ecn == 3):set_generated()

    local what = OPCODES[op] or ("opcode " .. op)
    local info = string.format("%s %s psn %d msg %d ev %d len %d", roce and "RoCE" or "ETH+",
        what, psn, msg_id, entropy, len)
    if #names > 0 then info = info .. " [" .. table.concat(names, ",") .. "]" end

    if op == OP.ACK or op == OP.NACK then
        if op == OP.ACK then
            tree:add(f.cum_psn, tvb(12, 4)):set_generated()
        end
        if roce then
            if op ~= OP.NACK then tree:add(f.qp, tvb(16, 4), offset):set_generated() end
        else
            if op == OP.ACK then tree:add(f.sack_base, tvb(16, 4), offset):set_generated() end
            tree:add(f.grant, tvb(20, 4), tag):set_generated()
            if tag ~= 0 then info = info .. " grant " .. tag .. " B" end
        end
    elseif op == OP.CNP and roce then
        tree:add(f.qp, tvb(16, 4), offset):set_generated()
    elseif op == OP.AGG or op == OP.AGG_RESULT then
        local at = tree:add(p, tvb(8, 24), "In-network all-reduce")
        at:add(f.agg_group, tvb(8, 4), msg_id):set_generated()
        at:add(f.agg_chunk, tvb(12, 4), psn):set_generated()
        at:add(f.agg_members, tvb(20, 2), shr(tag, 16)):set_generated()
        at:add(f.agg_index, tvb(22, 2), tag % 65536):set_generated()
        at:add(f.agg_dtype, tvb(28, 1), shr(ts, 24)):set_generated()
        at:add(f.agg_op, tvb(29, 1), shr(ts, 16) % 256):set_generated()
        at:add(f.agg_window, tvb(30, 2), ts % 65536):set_generated()
        local agg = op == OP.AGG and tvb(6, 2):uint() or tvb(4, 2):uint()
        if agg >= AGG_EP_BASE then
            at:add(f.agg_switch, tvb(op == OP.AGG and 6 or 4, 2), agg - AGG_EP_BASE):set_generated()
        end
        info = info .. " member " .. (tag % 65536) .. "/" .. shr(tag, 16)
    end
    if ecn == 3 then info = info .. " CE" end

    local off = HDR_BYTES
    if has(flags, 0x20) then
        if size - off < INT_BYTES then
            malformed(tree, pinfo, "INT block needs " .. INT_BYTES .. " bytes, " .. (size - off) .. " left")
            pinfo.cols.info = info
            return size
        end
        info = info .. " int " .. add_int(tvb, tree, pinfo, off)
        off = off + INT_BYTES
    end
    local left = size - off
    local trimmed = has(flags, 0x01)
    if trimmed then
        if left > 0 then
            malformed(tree, pinfo, "trimmed, yet " .. left .. " payload bytes")
        end
    elseif left ~= len then
        malformed(tree, pinfo, left .. " payload bytes, len says " .. len)
    end
    if left > 0 then
        local body = math.min(left, len > 0 and len or left)
        if op == OP.ACK and not roce and len == 8 and left >= 8 then
            add_sack(tvb, tree, off, offset)
        else
            tree:add(f.payload, tvb(off, body))
        end
    end
    pinfo.cols.info = info
    return size
end

-- UDP 4793 and EtherType 0x88B5: the port or type says it is ours.
function p.dissector(tvb, pinfo, root)
    return dissect(tvb, pinfo, root, pinfo.match_uint == ETHERTYPE and "compact" or "udp")
end

-- UDP 4791 is RoCEv2's port.  A frame is ours only if it looks like one of
-- ours: version nibble 2, a RoCE opcode (1-5), no unknown flag, and a
-- length that adds up (header, INT block, then len payload bytes unless
-- trimmed); anything else goes to Wireshark's own RoCEv2 dissector.
local roce = Proto("ethplus_roce", "ethplus emulated RoCEv2 (UDP 4791)")
local udp_table = DissectorTable.get("udp.port")
local builtin_roce = udp_table:get_dissector(ROCE_PORT)

local function looks_ours(tvb)
    local size = tvb:len()
    if size < HDR_BYTES then return false end
    local ver_op, flags = tvb(0, 1):uint(), tvb(1, 1):uint()
    local op = ver_op % 16
    if shr(ver_op, 4) ~= VERSION or op < OP.DATA or op > OP.CNP or flags >= 0x40 then
        return false
    end
    local want = HDR_BYTES + (has(flags, 0x20) and INT_BYTES or 0)
    if not has(flags, 0x01) then want = want + tvb(24, 2):uint() end
    return size == want
end

function roce.dissector(tvb, pinfo, root)
    if looks_ours(tvb) then
        return dissect(tvb, pinfo, root, "roce")
    end
    if not builtin_roce then
        return 0
    end
    -- its exceptions (a malformed RoCEv2 frame) would surface here as a Lua error
    local ok, n = pcall(builtin_roce.call, builtin_roce, tvb, pinfo, root)
    if ok then
        return n
    end
    local t = root:add(roce, tvb(), "Not an ethplus frame")
    malformed(t, pinfo, "Wireshark's RoCEv2 dissector: " .. tostring(n):gsub("^.*: ", ""))
    return tvb:len()
end

udp_table:add(UDP_PORT, p)
udp_table:add(ROCE_PORT, roce)
DissectorTable.get("ethertype"):add(ETHERTYPE, p)
