-- MEMORY CHANNEL: a Wireshark dissector for the hub's capture
-- (`mc-hub --pcap FILE`, `mc-cluster capture start FILE`).
--
--   tshark -X lua_script:hub/wireshark/mc.lua -r trace.pcap
--   wireshark -X lua_script:hub/wireshark/mc.lua trace.pcap
--
-- A record is one link frame as the hub orders it (protocol/link/src/lib.rs:
-- a 16-byte header, then the payload of its kind), and after a Deliver the
-- capture's 2-byte destination trailer (hub/src/capture.rs). The dissector
-- registers on link type USER0 (wtap_encap), so nothing needs setting.
--
-- Fields (filters): mc.kind ("write", "member", ...), mc.seq (the global
-- order), mc.node (the writer of a write, the node of a membership event),
-- mc.dest (a write's destination node; absent for a broadcast), mc.p2p,
-- mc.addr, mc.page, mc.offset, mc.len, mc.data, mc.flags.* (loopback, ACK,
-- ACK answer), mc.up, and mc.imcd.* where the address is in imcd's own pages
-- (protocol/imc-proto/src/layout.rs): the directory's lock slot or entry,
-- a coherency ack, a host-table row, a relay mailbox, an error count.
--
-- A frame that is cut short, has a bad magic, version, kind, length or CRC
-- gets an expert-info error (group Malformed) and the `_ws.malformed` item,
-- never a Lua error.

local mc = Proto("mc", "MEMORY CHANNEL")

-- Link frame (protocol/link).
local MAGIC = 0x4b4c434d -- "MCLK" little-endian
local VERSION = 1
local HEADER_LEN = 16
local MAX_DATA = 8192
local BROADCAST = 0xffff
local DEST_TRAILER = 2
local KINDS = { [1] = "hello", [2] = "welcome", [3] = "write", [4] = "deliver", [5] = "member",
                [6] = "refuse", [7] = "challenge" }
local FLAG_LOOPBACK = 0x1
local FLAG_ACK = 0x2
local FLAG_ACK_REPLY = 0x4

-- Adapter (protocol/regs) and imcd's pages (protocol/imc-proto/src/layout.rs).
-- tests/tests/wireshark.rs checks these against the Rust constants.
local PAGE_SIZE = 8192
local DIR_PAGE = 0
local DIR_PAGES = 8
local LOCK_SLOTS = 64
local ENTRY_WORDS = 17
local ENTRIES = 478
local ACK_PAGE = 8
local ACK_PAGES = 30
local HOST_PAGE = 38
local HOST_ROW = 8
local RELAY_PAGE = 39
local RELAY_ROW = 8
local RELAY_RESPONSES = 512
local ERRCNT_PAGE = 40
local ACK_Q_PAGE = 41
local DATA_FIRST = 48
local MAX_NODES = 64

mc.prefs.imcd_pages = Pref.bool("Name imcd's pages", true,
    "Name the fields of imcd's pages (off for a raw cluster, where no imcd runs)")

local f = {
    magic = ProtoField.uint32("mc.magic", "Magic", base.HEX),
    version = ProtoField.uint8("mc.version", "Version"),
    kind = ProtoField.string("mc.kind", "Kind"),
    kind_code = ProtoField.uint8("mc.kind_code", "Kind code"),
    link_seq = ProtoField.uint16("mc.link_seq", "Link sequence"),
    plen = ProtoField.uint32("mc.payload_len", "Payload length"),
    crc = ProtoField.uint32("mc.crc", "Payload CRC-32", base.HEX),
    seq = ProtoField.uint64("mc.seq", "Global sequence"),
    node = ProtoField.uint16("mc.node", "Node"),
    dest = ProtoField.uint16("mc.dest", "Destination node"),
    to = ProtoField.string("mc.to", "To"),
    p2p = ProtoField.bool("mc.p2p", "Point-to-point"),
    flags = ProtoField.uint16("mc.flags", "Flags", base.HEX),
    flag_lb = ProtoField.bool("mc.flags.loopback", "Loopback", 16, nil, FLAG_LOOPBACK),
    flag_ack = ProtoField.bool("mc.flags.ack", "ACK page store", 16, nil, FLAG_ACK),
    flag_ackr = ProtoField.bool("mc.flags.ack_answer", "ACK answer", 16, nil, FLAG_ACK_REPLY),
    addr = ProtoField.uint64("mc.addr", "MEMORY CHANNEL address", base.HEX),
    page = ProtoField.uint32("mc.page", "Page"),
    offset = ProtoField.uint32("mc.offset", "Offset in page", base.HEX),
    len = ProtoField.uint32("mc.len", "Data length"),
    data = ProtoField.bytes("mc.data", "Data"),
    up = ProtoField.bool("mc.up", "Up"),
    members = ProtoField.string("mc.members", "Members"),
    max_nodes = ProtoField.uint16("mc.max_nodes", "Max nodes"),
    name = ProtoField.string("mc.name", "Name"),
    reason = ProtoField.string("mc.reason", "Reason"),
    imcd = ProtoField.string("mc.imcd", "imcd field"),
    imcd_area = ProtoField.string("mc.imcd.area", "imcd area"),
    imcd_slot = ProtoField.uint32("mc.imcd.slot", "Slot, entry or row"),
}
mc.fields = {}
for _, v in pairs(f) do table.insert(mc.fields, v) end

local ex = {
    short = ProtoExpert.new("mc.short", "Frame cut short", expert.group.MALFORMED, expert.severity.ERROR),
    bad = ProtoExpert.new("mc.bad", "Malformed frame", expert.group.MALFORMED, expert.severity.ERROR),
    crc = ProtoExpert.new("mc.bad_crc", "Bad payload CRC", expert.group.CHECKSUM, expert.severity.ERROR),
}
mc.experts = { ex.short, ex.bad, ex.crc }

-- CRC-32 (IEEE, reflected), as crc32fast computes it.
local crc_table = {}
for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
        if bit32.band(c, 1) == 1 then c = bit32.bxor(0xedb88320, bit32.rshift(c, 1)) else c = bit32.rshift(c, 1) end
    end
    crc_table[i] = c
end
local function crc32(tvb, off, n)
    local c = 0xffffffff
    for i = off, off + n - 1 do
        c = bit32.bxor(crc_table[bit32.band(bit32.bxor(c, tvb(i, 1):uint()), 0xff)], bit32.rshift(c, 8))
    end
    return bit32.bxor(c, 0xffffffff)
end

-- What imcd keeps at (page, offset), or nil outside its pages.
local function imcd_field(page, offset)
    local word = math.floor(offset / 8)
    if page >= DIR_PAGE and page < DIR_PAGE + DIR_PAGES then
        local w = (page - DIR_PAGE) * (PAGE_SIZE / 8) + word
        if w < LOCK_SLOTS then
            return "directory", w, string.format("directory lock, slot of node %d", w)
        end
        local e = math.floor((w - LOCK_SLOTS) / ENTRY_WORDS)
        if e >= ENTRIES then return "directory", e, "directory, past the last entry" end
        local i = (w - LOCK_SLOTS) % ENTRY_WORDS
        local rec = { "key", "first page", "pages", "mode and flags", "uid", "gid", "ctime", "hosts" }
        local what
        if i == 0 then what = "toggle word" else
            what = string.format("copy %d, %s", math.floor((i - 1) / 8), rec[(i - 1) % 8 + 1])
        end
        return "directory", e, string.format("directory entry %d, %s", e, what)
    elseif page >= ACK_PAGE and page < ACK_PAGE + ACK_PAGES then
        local w = (page - ACK_PAGE) * (PAGE_SIZE / 8) + word
        local e, n = math.floor(w / MAX_NODES), w % MAX_NODES
        return "coherency ack", e, string.format("coherency ack of entry %d by node %d", e, n)
    elseif page == HOST_PAGE then
        local row, i = math.floor(word / HOST_ROW), word % HOST_ROW
        local names = { [0] = "imcd token", "host name", "host name", "host name", "host name",
                        "join request", "join served", "ready" }
        return "host table", row, string.format("host row %d, %s", row, names[i])
    elseif page == RELAY_PAGE then
        local names = { [0] = "sequence", "destination", "service", "pid", "signal", "uid", "word 6", "kick" }
        if word < RELAY_RESPONSES then
            local row, i = math.floor(word / RELAY_ROW), word % RELAY_ROW
            return "relay", row, string.format("relay request of node %d, %s", row, names[i])
        end
        local row, i = math.floor((word - RELAY_RESPONSES) / RELAY_ROW), (word - RELAY_RESPONSES) % RELAY_ROW
        local rnames = { [0] = "sequence", "status" }
        return "relay", row, string.format("relay response to node %d, %s", row, rnames[i] or ("word " .. i))
    elseif page == ERRCNT_PAGE then
        return "error counts", word, string.format("error count of node %d", word)
    elseif page == ACK_Q_PAGE then
        return "ACK page", word, "imc_ckerrcnt's ACK page"
    elseif page < DATA_FIRST then
        return "reserved", page, "imcd's reserved pages"
    end
    return nil
end

local function bad(tree, pinfo, item, e, text)
    tree:add_proto_expert_info(e, text)
    pinfo.cols.info:append(" [" .. text .. "]")
end

function mc.dissector(tvb, pinfo, root)
    pinfo.cols.protocol = "MC"
    local n = tvb:captured_len()
    local tree = root:add(mc, tvb(0, n))
    if n < HEADER_LEN then
        pinfo.cols.info = "MEMORY CHANNEL frame cut short"
        bad(tree, pinfo, nil, ex.short, string.format("%d bytes, shorter than the %d-byte header", n, HEADER_LEN))
        return n
    end
    tree:add_le(f.magic, tvb(0, 4))
    tree:add(f.version, tvb(4, 1))
    local code = tvb(5, 1):uint()
    local kind = KINDS[code] or "unknown"
    -- A Deliver is the write as the hub ordered it: shown and filtered as "write".
    local shown = kind == "deliver" and "write" or kind
    tree:add(f.kind, tvb(5, 1), shown)
    tree:add(f.kind_code, tvb(5, 1))
    tree:add_le(f.link_seq, tvb(6, 2))
    local plen = tvb(8, 4):le_uint()
    tree:add_le(f.plen, tvb(8, 4))
    local crc_item = tree:add_le(f.crc, tvb(12, 4))
    pinfo.cols.info = shown
    if tvb(0, 4):le_uint() ~= MAGIC then
        bad(tree, pinfo, nil, ex.bad, "bad magic (not \"MCLK\")")
        return n
    end
    if tvb(4, 1):uint() ~= VERSION then
        bad(tree, pinfo, nil, ex.bad, "unknown link version " .. tvb(4, 1):uint())
        return n
    end
    if kind == "unknown" then
        bad(tree, pinfo, nil, ex.bad, "unknown frame kind " .. code)
        return n
    end
    if HEADER_LEN + plen > n then
        bad(tree, pinfo, nil, ex.short, string.format("payload of %d bytes announced, %d captured", plen,
            n - HEADER_LEN))
        return n
    end
    if plen > 0 and crc32(tvb, HEADER_LEN, plen) ~= tvb(12, 4):le_uint() then
        crc_item:add_proto_expert_info(ex.crc, "payload CRC does not match (corrupted on purpose, or damaged)")
        pinfo.cols.info:append(" [bad CRC]")
    end
    local p = HEADER_LEN
    if kind == "deliver" then
        if plen <= 24 or plen - 24 > MAX_DATA then
            bad(tree, pinfo, nil, ex.bad, string.format("write payload of %d bytes (25 to %d)", plen, 24 + MAX_DATA))
            return n
        end
        local seq = tvb(p, 8):le_uint64()
        local src = tvb(p + 8, 2):le_uint()
        local flags = tvb(p + 10, 2):le_uint()
        local addr = tvb(p + 16, 8):le_uint64()
        local dlen = plen - 24
        tree:add_le(f.seq, tvb(p, 8))
        tree:add_le(f.node, tvb(p + 8, 2)):append_text(" (writer)")
        local fl = tree:add_le(f.flags, tvb(p + 10, 2))
        fl:add_le(f.flag_lb, tvb(p + 10, 2))
        fl:add_le(f.flag_ack, tvb(p + 10, 2))
        fl:add_le(f.flag_ackr, tvb(p + 10, 2))
        tree:add_le(f.addr, tvb(p + 16, 8))
        local page = (addr / PAGE_SIZE):tonumber()
        local offset = (addr % PAGE_SIZE):tonumber()
        tree:add(f.page, tvb(p + 16, 8), page)
        tree:add(f.offset, tvb(p + 16, 8), offset)
        tree:add(f.len, tvb(8, 4), dlen)
        tree:add(f.data, tvb(p + 24, dlen))
        local to = "?"
        local rest = n - HEADER_LEN - plen
        if rest == DEST_TRAILER then
            local dest = tvb(HEADER_LEN + plen, 2):le_uint()
            if dest == BROADCAST then
                to = "all"
                tree:add(f.p2p, tvb(HEADER_LEN + plen, 2), false)
                tree:add(f.to, tvb(HEADER_LEN + plen, 2), "all (broadcast)")
            else
                to = tostring(dest)
                tree:add(f.p2p, tvb(HEADER_LEN + plen, 2), true)
                tree:add_le(f.dest, tvb(HEADER_LEN + plen, 2))
                tree:add(f.to, tvb(HEADER_LEN + plen, 2), "node " .. dest)
            end
        elseif rest ~= 0 then
            bad(tree, pinfo, nil, ex.bad, string.format("%d bytes after the frame (a destination takes %d)", rest,
                DEST_TRAILER))
        end
        local area, slot, what
        if mc.prefs.imcd_pages then area, slot, what = imcd_field(page, offset) end
        if area then
            tree:add(f.imcd_area, tvb(p + 16, 8), area)
            tree:add(f.imcd_slot, tvb(p + 16, 8), slot)
            tree:add(f.imcd, tvb(p + 16, 8), what)
        end
        local ackx = ""
        if bit32.band(flags, FLAG_ACK) ~= 0 then ackx = " ACK" end
        if bit32.band(flags, FLAG_ACK_REPLY) ~= 0 then ackx = " ACK-answer" end
        pinfo.cols.info = string.format("seq %s write %d -> %s page %d +0x%x len %d%s%s", tostring(seq), src, to,
            page, offset, dlen, ackx, what and (" (" .. what .. ")") or "")
    elseif kind == "member" then
        if plen ~= 16 then
            bad(tree, pinfo, nil, ex.bad, string.format("membership payload of %d bytes (16)", plen))
            return n
        end
        local up = tvb(p + 10, 1):uint()
        tree:add_le(f.seq, tvb(p, 8))
        tree:add_le(f.node, tvb(p + 8, 2))
        if up > 1 then
            bad(tree, pinfo, nil, ex.bad, "membership state " .. up .. " (0 or 1)")
            return n
        end
        tree:add(f.up, tvb(p + 10, 1), up == 1)
        pinfo.cols.info = string.format("seq %s member node %d %s", tostring(tvb(p, 8):le_uint64()),
            tvb(p + 8, 2):le_uint(), up == 1 and "up" or "down")
    elseif kind == "welcome" then
        if plen < 16 or (plen - 16) % 2 ~= 0 then
            bad(tree, pinfo, nil, ex.bad, string.format("welcome payload of %d bytes", plen))
            return n
        end
        tree:add_le(f.node, tvb(p, 2))
        tree:add_le(f.max_nodes, tvb(p + 2, 2))
        tree:add_le(f.seq, tvb(p + 8, 8))
        local m = {}
        for i = p + 16, p + plen - 2, 2 do table.insert(m, tostring(tvb(i, 2):le_uint())) end
        tree:add(f.members, tvb(p + 16, plen - 16), table.concat(m, ","))
    elseif kind == "refuse" then
        tree:add(f.reason, tvb(p, plen))
    elseif kind == "write" then
        if plen <= 16 then
            bad(tree, pinfo, nil, ex.bad, string.format("write payload of %d bytes", plen))
            return n
        end
        tree:add_le(f.dest, tvb(p, 2))
        tree:add_le(f.flags, tvb(p + 2, 2))
        tree:add_le(f.addr, tvb(p + 8, 8))
        tree:add(f.len, tvb(8, 4), plen - 16)
        tree:add(f.data, tvb(p + 16, plen - 16))
    end
    return n
end

DissectorTable.get("wtap_encap"):add(wtap.USER0, mc)
