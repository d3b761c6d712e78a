/* ethp.h - the public API of the ethplus C core.
 *
 * This header is also the cffi cdef: the build script runs it through the C
 * preprocessor with ETHP_CDEF defined, so everything outside the #ifndef
 * ETHP_CDEF blocks must be plain declarations cffi can parse (no system
 * includes, no attributes).  Every public symbol starts with ethp_ / ETHP_.
 * Units are in names: _ns, _bytes, _ms, _pkts.
 */
#ifndef ETHP_H
#define ETHP_H

#ifndef ETHP_CDEF
#include <stddef.h>
#include <stdint.h>
#endif

/* Bump on any change to a struct or signature below; dataplane/lab/core.py checks it. */
#define ETHP_ABI_VERSION 47
uint32_t ethp_abi_version(void);

/* ------------------------------------------------------------------ wire */

enum {
    ETHP_ETHERTYPE_IPV4 = 0x0800,
    ETHP_ETHERTYPE_COMPACT = 0x88B5, /* IEEE 802 local experimental EtherType 1 */
    ETHP_ETHERTYPE_MACCTL = 0x8808,  /* 802.3x / 802.1Qbb pause */
    ETHP_UDP_PORT = 4793,            /* destination port of ETH+ over IPv4/UDP */
    ETHP_ROCE_UDP_PORT = 4791,       /* RoCEv2's: the emulated RoCE mode of the NIC */
    ETHP_VERSION = 2, /* 2: the header carries connection epochs (40 bytes) */
    ETHP_ETH_HDR_BYTES = 14,
    ETHP_IPV4_HDR_BYTES = 20,
    ETHP_UDP_HDR_BYTES = 8,
    ETHP_HDR_BYTES = 40,
    ETHP_MAX_FRAME_BYTES = 9216 + 14, /* largest lab MTU plus Ethernet header */
};

/* ETH+ opcodes (low 4 bits of byte 0 of the ETH+ header). */
enum ethp_opcode {
    ETHP_OP_DATA = 1,
    ETHP_OP_ACK = 2,
    ETHP_OP_NACK = 3,
    ETHP_OP_RNR = 4, /* receiver not ready: no receive posted for this tag yet */
    ETHP_OP_CNP = 5, /* roce: congestion notification (DCQCN) */
    ETHP_OP_AGG = 6,        /* in-network all-reduce: a member's contribution */
    ETHP_OP_AGG_RESULT = 7, /* in-network all-reduce: the aggregator's result */
    ETHP_OP_HELLO = 8, /* "this is my incarnation": to a peer that addressed an earlier one */
};
/* In-network aggregation (docs/wire-format.md).  Aggregator k (a switch) is
 * ETH+ endpoint ETHP_AGG_EP_BASE + k and IPv4 address ETHP_AGG_NET + k
 * (198.19.241.0 to 198.19.255.255: above the last plane's gateway).  Its frames carry: msg_id = the group, psn = the chunk's
 * sequence at this aggregator, tag = members << 16 | the member's index,
 * ts_ns = dtype << 24 | op << 16 | window (slots the group uses here). */
enum {
    ETHP_AGG_EP_BASE = 0xF000,
    ETHP_AGG_NET = 0xC613F100u,
    ETHP_AGG_MAX_IDS = 3840,
    ETHP_AGG_MAX_MEMBERS = 4096,
    ETHP_AGG_MAX_WINDOW = 1024,
};
enum ethp_agg_dtype {
    ETHP_AGG_F32 = 0,
    ETHP_AGG_I32 = 1,
    ETHP_AGG_F16 = 2,
    ETHP_AGG_BF16 = 3,
    ETHP_AGG_I64 = 4, /* ethp_reduce_into only: the switches do not reduce it */
};
enum ethp_agg_op { ETHP_AGG_SUM = 0, ETHP_AGG_MAX = 1, ETHP_AGG_MIN = 2 };

/* ETH+ header flags (byte 1). */
enum ethp_flag {
    ETHP_F_TRIMMED = 0x01,   /* a switch cut the payload */
    ETHP_F_LAST = 0x02,      /* last packet of a message */
    ETHP_F_ECN_ECHO = 0x04,  /* ack: the acked packet arrived CE-marked */
    ETHP_F_TRIMMABLE = 0x08, /* a switch may trim this packet */
    ETHP_F_RETX = 0x10,      /* a retransmission */
    ETHP_F_INT = 0x20,       /* an INT block follows the header (HPCC-like congestion control) */
    ETHP_F_BUSY = 0x40,      /* rnr: the receiver is taking other data: its receive is late, not missing */
};

/* In-band network telemetry (docs/wire-format.md): a block of
 * ETHP_INT_BYTES right after the ETH+ header of a data packet flagged
 * ETHP_F_INT, before the payload (len_bytes does not count it).  Each switch
 * the packet leaves appends one record of its egress port (up to
 * ETHP_INT_MAX_HOPS); an ack flagged ETHP_F_INT echoes the block of the data
 * packet that drew it. */
enum {
    ETHP_INT_MAX_HOPS = 5,
    ETHP_INT_HOP_BYTES = 16,
    ETHP_INT_BYTES = 4 + ETHP_INT_MAX_HOPS * ETHP_INT_HOP_BYTES,
};
/* One record, host byte order. */
struct ethp_int_hop {
    uint16_t port_id;    /* switch id x 1024 + port index, mod 2^16 */
    uint16_t qlen_64b;   /* egress queue behind the packet as it left, 64-byte units */
    uint32_t ts_ns;      /* when it finished leaving (the port's pacer clock), mod 2^32 */
    uint32_t tx_bytes;   /* wire bytes the port has sent, this packet included, mod 2^32 */
    uint32_t rate_kbps;  /* the port's real rate */
};
/* Decode the INT block at frame + int_off (ethp_parsed.int_off) into
 * hops[ETHP_INT_MAX_HOPS]; returns the number of records. */
uint32_t ethp_int_decode(const uint8_t *frame, uint32_t int_off, struct ethp_int_hop *hops);

/* What ethp_parse found.  Negative values are errors. */
enum ethp_kind {
    ETHP_KIND_OTHER = 0,     /* valid Ethernet, nothing we know above it */
    ETHP_KIND_IPV4 = 1,      /* IPv4, not UDP to ETHP_UDP_PORT */
    ETHP_KIND_ETHP_UDP = 2,  /* ETH+ over IPv4/UDP (scale-out) */
    ETHP_KIND_ETHP_COMPACT = 3, /* ETH+ right after Ethernet (scale-up) */
    ETHP_KIND_MACCTL = 4,    /* MAC control frame (pause) */
    ETHP_KIND_ROCE_UDP = 5,  /* the emulated RoCEv2: the same header on UDP port 4791;
                                switches treat it as any IPv4/UDP flow (5-tuple ECMP) */
};

enum ethp_err {
    ETHP_ERR_TRUNCATED = -1,  /* frame shorter than its headers say */
    ETHP_ERR_OVERSIZE = -2,   /* frame or payload larger than allowed */
    ETHP_ERR_CSUM = -3,       /* bad IPv4 header checksum */
    ETHP_ERR_IPV4 = -4,       /* bad IPv4 version, header length or total length */
    ETHP_ERR_VERSION = -5,    /* unknown ETH+ version */
    ETHP_ERR_NOSPACE = -6,    /* output buffer too small */
    ETHP_ERR_ARG = -7,        /* invalid argument */
};

/* Header fields of one ETH+ packet, host byte order, naturally aligned. */
struct ethp_hdr_fields {
    uint8_t opcode;
    uint8_t flags;
    uint16_t entropy;
    uint16_t src_ep;
    uint16_t dst_ep;
    uint32_t msg_id;
    uint32_t psn;
    uint32_t offset_bytes;
    uint32_t tag;
    uint16_t len_bytes;  /* payload bytes as sent (kept when trimmed) */
    uint8_t tos;         /* compact form only: traffic class << 2 | ECN */
    uint8_t hops;
    uint32_t ts_ns;      /* sender timestamp (data) or its echo (ack), mod 2^32 */
    uint32_t src_epoch;  /* the sender's incarnation (0: not an endpoint's frame) */
    uint32_t dst_epoch;  /* the receiver's incarnation as the sender knows it (0: none yet) */
};

/* Addresses of one frame, host byte order. */
struct ethp_l2l3 {
    uint8_t dst_mac[6];
    uint8_t src_mac[6];
    uint32_t src_ip;
    uint32_t dst_ip;
    uint16_t src_port;   /* UDP source port: carries the entropy value */
    uint16_t dst_port;
    uint8_t tos;         /* IPv4 DSCP << 2 | ECN */
    uint8_t ttl;
    uint16_t ip_id;
};

/* Result of ethp_parse: offsets into the frame and decoded fields. */
struct ethp_parsed {
    int32_t kind;            /* enum ethp_kind */
    uint16_t ethertype;
    uint16_t l3_off;
    uint16_t l4_off;
    uint16_t hdr_off;        /* ETH+ header offset, or 0 */
    uint16_t int_off;        /* ETHP_F_INT: the INT block's offset, else 0 */
    uint16_t payload_off;
    uint16_t payload_bytes;  /* payload actually present in the frame */
    uint8_t ip_proto;
    uint8_t ecn;             /* from IPv4 TOS, or the compact header's tos */
    struct ethp_l2l3 addr;
    struct ethp_hdr_fields hdr;
};

/* Build a complete frame into out[0..cap).  Returns the frame length or a
 * negative enum ethp_err.  payload may be NULL when payload_bytes is 0. */
int ethp_build_udp(uint8_t *out, size_t cap, const struct ethp_l2l3 *addr,
                   const struct ethp_hdr_fields *hdr, const uint8_t *payload,
                   size_t payload_bytes);
int ethp_build_compact(uint8_t *out, size_t cap, const struct ethp_l2l3 *addr,
                       const struct ethp_hdr_fields *hdr, const uint8_t *payload,
                       size_t payload_bytes);
/* Parse a frame.  Returns enum ethp_kind (>= 0) or a negative enum ethp_err. */
int ethp_parse(const uint8_t *frame, size_t len, struct ethp_parsed *out);
/* RFC 1071 Internet checksum of len bytes, as stored in a header (network order). */
uint16_t ethp_inet_csum(const uint8_t *data, size_t len);
/* Bytes on the wire for a frame: + FCS 4 + preamble/SFD 8 + gap 12, padded to 64. */
uint32_t ethp_wire_bytes(uint32_t frame_bytes);

/* ------------------------------------------------------------------ pool */

/* A packet buffer.  data points into the pool's slab; cap is fixed. */
struct ethp_pkt {
    uint8_t *data;
    uint32_t len;
    uint32_t cap;
    uint64_t ts_ns;      /* receive time, then the time it is due somewhere */
    struct ethp_pkt *next; /* queue link, owned by whoever holds the packet */
    uint16_t port;       /* ingress port index, owner's choice */
    uint8_t cls;         /* traffic class while queued */
    uint8_t in_pool;     /* 1 while owned by the pool: catches double frees */
    int32_t ifindex;     /* interface it arrived on (a port bound to all of them) */
    uint8_t origin;      /* 1: made by its owner (a switch's result frame), not received */
    uint16_t int_off;    /* a switch's queued data packet: its INT block, or 0 */
};

struct ethp_pool;
struct ethp_pool *ethp_pool_new(uint32_t n_pkts, uint32_t buf_bytes);
/* A pool with n_small buffers of small_bytes (< buf_bytes) too, which
 * ethp_pool_get_for hands out for frames that fit. */
struct ethp_pool *ethp_pool_new_sized(uint32_t n_pkts, uint32_t buf_bytes, uint32_t n_small,
                                      uint32_t small_bytes);
void ethp_pool_free(struct ethp_pool *pool);
/* Take up to n full-size packets; returns how many were taken. */
uint32_t ethp_pool_get(struct ethp_pool *pool, struct ethp_pkt **pkts, uint32_t n);
/* One packet for a frame of len bytes: a small one if it fits and one is
 * free, else a full-size one (which may still be shorter than len: the
 * caller checks cap); NULL if none is free. */
struct ethp_pkt *ethp_pool_get_for(struct ethp_pool *pool, uint32_t len);
/* Return n packets; returns how many were accepted (foreign or already
 * returned packets are refused). */
uint32_t ethp_pool_put(struct ethp_pool *pool, struct ethp_pkt **pkts, uint32_t n);
uint32_t ethp_pool_available(const struct ethp_pool *pool); /* of both sizes */
uint32_t ethp_pool_size(const struct ethp_pool *pool);

/* ------------------------------------------------------------------ port */

/* Per-port counters, defined once.  X(name, help) */
#define ETHP_PORT_COUNTERS(X)                                          \
    X(rx_frames, "frames received from the ring")                      \
    X(rx_bytes, "bytes received from the ring")                        \
    X(tx_frames, "frames handed to the kernel")                        \
    X(tx_bytes, "bytes handed to the kernel")                          \
    X(rx_ring_drops, "frames the kernel dropped: RX ring full")        \
    X(rx_truncated, "frames longer than a pool buffer, dropped")       \
    X(rx_no_buf, "frames dropped: packet pool empty")                  \
    X(rx_blocks, "ring blocks consumed")                               \
    X(tx_batches, "TX ring kicks (send calls)")                        \
    X(tx_again, "frames not sent yet: TX ring or socket buffer full")  \
    X(tx_errors, "frames refused: too long or short, or interface down") \
    X(rx_one_by_one, "frames received one at a time while the ring was down") \
    X(ring_builds, "times the RX ring was set up for a run of traffic")        \
    X(ring_parks, "times the RX ring was taken down after idling")            \
    X(ring_failures, "ring set-ups that failed (frames kept coming one by one)") \
    X(ring_backoffs, "rings taken down for a trickle: the next set-up waits longer") \
    X(rx_one_by_one_drops, "of rx_ring_drops, those lost while frames came one by one (socket buffer full)")

#define ETHP_X_ENUM(name, help) ETHP_PC_##name,
enum ethp_port_counter { ETHP_PORT_COUNTERS(ETHP_X_ENUM) ETHP_PORT_NCOUNTERS };
#undef ETHP_X_ENUM

uint32_t ethp_port_counter_count(void);
const char *ethp_port_counter_name(uint32_t i);
const char *ethp_port_counter_help(uint32_t i);

struct ethp_port_cfg {
    uint32_t block_bytes;      /* TPACKET_V3 block size, power of 2 >= page */
    uint32_t n_blocks;
    uint32_t block_timeout_ms; /* retire a partly filled block after this */
    uint32_t sndbuf_bytes;     /* forced SO_SNDBUF; 0 keeps the default */
    /* 0: the ring is up for the port's life.  Otherwise the port starts
     * with no ring and takes frames one at a time (a wakeup each, and no
     * timer: nothing runs while no frame comes).  A run of traffic sets the
     * ring up, and it is taken down again after ring_idle_ms without a
     * frame, or of fewer than 2 frames a block (a trickle).  A helper thread does the set-up and take-down, which wait for
     * the kernel's RCU grace periods; frames go to exactly one of the two
     * sockets (a fanout group), so none is lost or seen twice. */
    uint32_t ring_idle_ms;
};

struct ethp_port;
/* Open an AF_PACKET port on ifname inside the network namespace at
 * netns_path (NULL: the caller's).  ifname NULL binds to every interface of
 * the namespace: one ring for all of them, each frame tagged with its
 * ifindex.  On failure returns NULL and stores a negative errno in *err. */
struct ethp_port *ethp_port_open(const char *netns_path, const char *ifname,
                                 const struct ethp_port_cfg *cfg, int *err);
void ethp_port_close(struct ethp_port *port);
/* The ring's socket (-1 while a ring_idle_ms port has no ring). */
int ethp_port_fd(const struct ethp_port *port);
/* Watch the port's sockets in epfd: each event's data.u64 carries tag in its
 * low 32 bits.  Hand every such event to ethp_port_event before receiving.
 * 0 or negative errno. */
int ethp_port_watch(struct ethp_port *port, int epfd, uint32_t tag);
void ethp_port_event(struct ethp_port *port, uint64_t data);
/* When the port next needs a receive call though no frame came (to take an
 * idle ring down), in ethp_now_ns time; UINT64_MAX if never. */
uint64_t ethp_port_due_ns(const struct ethp_port *port);
/* 1 while the port's RX ring is up, 0 while frames come one by one. */
int ethp_port_ring_up(const struct ethp_port *port);
int ethp_port_ifindex(const struct ethp_port *port);
/* Wait until a ring block (or, without a ring, a frame) is ready or
 * timeout_ms passes (-1: forever).  Returns 1 if frames are ready, 0 on
 * timeout, negative errno on error. */
int ethp_port_wait(struct ethp_port *port, int timeout_ms);
/* Wait until the TX side can take frames again (after a burst came back
 * short) or timeout_ms passes. */
void ethp_port_wait_tx(struct ethp_port *port, int timeout_ms);
/* Copy up to n received frames into packets taken from pool. */
uint32_t ethp_port_rx_burst(struct ethp_port *port, struct ethp_pool *pool,
                            struct ethp_pkt **pkts, uint32_t n);
/* The same, and each frame's arrival time as the kernel stamped it
 * (CLOCK_REALTIME, ns) into wall_ns[i]. */
uint32_t ethp_port_rx_burst_stamped(struct ethp_port *port, struct ethp_pool *pool,
                                    struct ethp_pkt **pkts, uint64_t *wall_ns, uint32_t n);
/* Send up to n frames through the TX ring, one kick per call.  Returns how
 * many were consumed: sent, or refused and counted in tx_errors (too long
 * for the interface, shorter than an Ethernet header, or the interface is
 * down or gone).  The rest (ring or socket
 * buffer full) are counted in tx_again and left for the caller to retry.
 * The caller keeps ownership of every packet. */
uint32_t ethp_port_tx_burst(struct ethp_port *port, struct ethp_pkt **pkts, uint32_t n);
/* The same, out of interface ifindex (for a port bound to all interfaces). */
uint32_t ethp_port_tx_burst_to(struct ethp_port *port, struct ethp_pkt **pkts, uint32_t n,
                               int ifindex);
/* A traffic generator: send n_frames copies of frame in bursts.
 * If vary_off is non-zero, the 16-bit big-endian field at that offset counts
 * up by one per frame (e.g. a UDP source port, to make many flows).  Waits
 * for room when the socket is full; gives up after timeout_ms.  Returns how
 * many frames the kernel took.  rate_pps > 0 paces the frames (in bursts of
 * 32, sleeping between them); 0 sends as fast as it can. */
uint64_t ethp_port_blast(struct ethp_port *port, const uint8_t *frame, uint32_t len,
                         uint64_t n_frames, uint32_t vary_off, uint32_t timeout_ms,
                         uint64_t rate_pps);
/* A bare forwarder, for measuring the port I/O alone: for duration_ms,
 * every frame received on in is sent out of out unchanged, in bursts, with
 * no parsing, queueing or shaping (the switch's pipeline without the
 * pipeline).  Frames the TX ring cannot take yet are retried, never dropped
 * here.  Returns how many frames it handed on (sent, or refused and counted
 * in out's tx_errors).  Releases the GIL in Python. */
uint64_t ethp_port_relay(struct ethp_port *in, struct ethp_port *out, uint32_t duration_ms);
/* Copy the counters (ETHP_PORT_NCOUNTERS values) into out. */
void ethp_port_counters(struct ethp_port *port, uint64_t *out);

/* ---------------------------------------------------------------- switch */

enum {
    ETHP_NCLASSES = 2,
    ETHP_CLS_HIGH = 0,  /* control, acks, trimmed headers, pause */
    ETHP_CLS_DATA = 1,
    ETHP_MAX_GROUP_PORTS = 512,
};

enum ethp_fwd_mode {
    ETHP_FWD_ECMP = 0,     /* every flow by its 5-tuple hash */
    ETHP_FWD_SPRAY = 1,    /* ETH+ frames by their entropy value */
    ETHP_FWD_ADAPTIVE = 2, /* ETH+ frames to the least-loaded egress queue */
};

enum ethp_route_kind {
    ETHP_ROUTE_IPV4 = 0, /* key: an address in 198.18.0.0/16 */
    ETHP_ROUTE_EP = 1,   /* key: an ETH+ endpoint (compact form) */
};

struct ethp_switch_cfg {
    uint32_t forwarding;       /* enum ethp_fwd_mode */
    uint32_t ecn;              /* RED-mark ECT frames on enqueue */
    uint64_t ecn_kmin_bytes;
    uint64_t ecn_kmax_bytes;
    double ecn_pmax;
    uint32_t trimming;
    uint32_t lossless;         /* PFC on every port */
    uint64_t trim_threshold_bytes;
    uint64_t pfc_xoff_bytes;   /* per ingress port and class */
    uint64_t pfc_xon_bytes;
    /* Lossless: what an ingress port and class may have buffered past XOFF
     * (its egress queues then never tail-drop it); 0: from the port's link,
     * rate x (two delays + the emulator's response) plus two frames. */
    uint64_t pfc_headroom_bytes;
    uint64_t lookahead_ns;     /* how far ahead of its start a frame may leave its queue */
    uint64_t catchup_ns;       /* link time a late pacer may make up (the bounded burst) */
    uint64_t seed;             /* hashing and fault randomness */
    uint32_t pool_pkts;
    uint32_t buf_bytes;
    /* Small buffers beside the pool's full-size ones, for received frames
     * of at most small_buf_bytes (0 pool_small_pkts: none). */
    uint32_t pool_small_pkts;
    uint32_t small_buf_bytes;
    /* One buffer shared by every egress queue of the switch (0: none, each
     * port has its link's buffer_bytes alone).  A queue may then hold at
     * most dt_alpha x the buffer still free (dynamic threshold), and never
     * more than its port's buffer_bytes. */
    uint64_t shared_buffer_bytes;
    double dt_alpha;
    /* In-network aggregation: this switch is aggregator agg_id (its endpoint
     * ETHP_AGG_EP_BASE + agg_id, its address ETHP_AGG_NET + agg_id) with room
     * for agg_slots chunks at once, over every group (0: no aggregator). */
    uint32_t agg_id;
    uint32_t agg_slots;
    uint32_t int_id;           /* this switch's number in INT records (port_id's high bits) */
    uint32_t ring_idle_ms;     /* the switch's port: see struct ethp_port_cfg */
    uint32_t hosts_may_pause;  /* 0: PFC frames from an accelerator's port are ignored (counted) */
    uint64_t pfc_watchdog_ns;  /* a class paused longer than this without a break is released; 0: never */
};

/* One port's link, in real (time-scaled) units; both directions of the link. */
struct ethp_link_state {
    uint64_t rate_bps;
    uint64_t delay_ns;
    uint64_t jitter_ns;        /* each frame waits delay_ns + uniform [0, jitter_ns], in order */
    uint64_t buffer_bytes;     /* egress buffer of this port */
    double loss;               /* probability, each direction */
    double corrupt;            /* probability, each direction; dropped as on a bad FCS */
    uint32_t up;
    uint32_t peer_is_host;     /* this port also plays the host->switch direction */
    uint32_t llr;              /* link-level retry: corrupted or lost frames are replayed */
    uint8_t mac[6];
    uint8_t peer_mac[6];
};

/* Per-port counters.  X(name, help) */
#define ETHP_SW_COUNTERS(X)                                                     \
    X(rx_frames, "frames read from the ring")                                   \
    X(rx_bytes, "bytes read from the ring")                                     \
    X(tx_frames, "frames sent on this port")                                    \
    X(tx_bytes, "bytes sent on this port")                                      \
    X(drop_queue_full, "tail drops: egress buffer full")                        \
    X(drop_shared_full, "tail drops: over the shared buffer's dynamic threshold") \
    X(drop_headroom, "lossless: past the ingress's XOFF and headroom (a sender ignoring pauses)") \
    X(drop_loss, "injected loss")                                               \
    X(drop_corrupt, "injected corruption, dropped as a bad FCS would be")       \
    X(llr_replays, "frames replayed by link-level retry (bad FCS or lost)")     \
    X(llr_replay_ns, "link time spent on replays (NACK round trips, resends)") \
    X(drop_link_down, "link down")                                              \
    X(drop_node_down, "switch down")                                            \
    X(drop_malformed, "frames the parser rejected")                             \
    X(drop_spoofed, "frames from a host whose source address or endpoint is not routed back to it") \
    X(pause_ignored, "PFC frames from a host, ignored (the lab does not let hosts pause)") \
    X(pfc_watchdog, "pauses the watchdog broke: a class held paused too long was released") \
    X(drop_no_route, "no route to the destination")                             \
    X(drop_tx_error, "the kernel refused the frame")                            \
    X(ctl_consumed, "MAC control frames consumed here")                         \
    X(ecn_marked, "CE marks set")                                               \
    X(trimmed, "payloads trimmed")                                              \
    X(pause_tx, "PFC frames sent (pause and resume)")                           \
    X(pause_rx, "PFC frames received")                                          \
    X(q_frames, "frames in the egress queues now")                              \
    X(q_bytes, "bytes in the egress queues now")                                \
    X(q_hwm_bytes, "egress queue high-water mark")                              \
    X(wire_frames, "frames on the wire now (delay lines, both directions)")     \
    X(late_frames, "frames that left more than 100 us after they were due")     \
    X(late_max_ns, "largest pacer lateness")                                    \
    X(late_sum_ns, "sum of pacer lateness")                                     \
    X(lost_link_ns, "link time lost: the pacer woke later than its catch-up allows") \
    X(tx_again, "sends deferred: TX ring or socket buffer full")                \
    X(agg_consumed, "in-network all-reduce contributions absorbed by the aggregator") \
    X(agg_dup, "contributions already counted (a member resent), absorbed")   \
    X(agg_results, "result (or partial) frames the aggregator originated (then sent, dropped or queued)") \
    X(agg_replies, "results (or partials, up a tree) sent again after a member resent its contribution") \
    X(drop_agg_full, "contributions dropped: the aggregator had no free slot")   \
    X(drop_agg_stale, "contributions for a chunk the aggregator no longer holds") \
    X(drop_agg_foreign, "contributions to a group nobody registered, or not from the member's address") \
    X(int_stamped, "INT records written into data packets leaving this port")

/* Per-port, per-class counters.  X(name, help) */
#define ETHP_SW_CLASS_COUNTERS(X)                                               \
    X(enq_frames, "frames enqueued")                                            \
    X(tx_frames, "frames dequeued onto the link")                               \
    X(drop_queue_full, "tail drops")                                            \
    X(q_bytes, "bytes queued now")                                              \
    X(q_hwm_bytes, "high-water mark")                                           \
    X(paused_ns, "time this class was paused by the peer")

#define ETHP_X_ENUM(name, help) ETHP_SC_##name,
enum ethp_sw_counter { ETHP_SW_COUNTERS(ETHP_X_ENUM) ETHP_SW_NCOUNTERS };
#undef ETHP_X_ENUM
#define ETHP_X_ENUM(name, help) ETHP_CC_##name,
enum ethp_sw_class_counter { ETHP_SW_CLASS_COUNTERS(ETHP_X_ENUM) ETHP_SW_NCLASS_COUNTERS };
#undef ETHP_X_ENUM

uint32_t ethp_sw_counter_count(void);
const char *ethp_sw_counter_name(uint32_t i);
uint32_t ethp_sw_class_counter_count(void);
const char *ethp_sw_class_counter_name(uint32_t i);

struct ethp_switch;
struct ethp_switch *ethp_switch_new(const struct ethp_switch_cfg *cfg, uint32_t max_ports);
/* Add a port (opens its AF_PACKET socket).  Returns its index or a negative errno. */
int ethp_switch_add_port(struct ethp_switch *sw, const char *netns_path, const char *ifname,
                         const struct ethp_link_state *link);
/* Route key (enum ethp_route_kind) to an equal-cost group of ports. */
int ethp_switch_add_route(struct ethp_switch *sw, uint32_t kind, uint32_t key,
                          const uint16_t *ports, uint32_t n_ports);
/* Start the forwarding thread.  0 or negative errno. */
int ethp_switch_start(struct ethp_switch *sw);
/* Stop and join the thread, free everything. */
void ethp_switch_free(struct ethp_switch *sw);
/* Change a port's link at run time (applied by the thread within one loop). */
int ethp_switch_set_link(struct ethp_switch *sw, uint32_t port, const struct ethp_link_state *link);
void ethp_switch_set_up(struct ethp_switch *sw, uint32_t up);
uint32_t ethp_switch_port_count(const struct ethp_switch *sw);
/* The switch's one receiving port, for the whole switch.  Frames lost
 * before a port saw them: out[0] kernel ring (or socket) overflow, out[1]
 * packet pool empty, out[2] from an interface that is not a port.  Then
 * out[3] frames received one by one (ring down), out[4] ring set-ups,
 * out[5] ring take-downs, out[6] failed set-ups, out[7] 1 if the ring is
 * up now, out[8] take-downs for a trickle (the next set-up waits),
 * out[9] of out[0], those lost while frames came one by one (the socket's
 * buffer full, not the ring). */
void ethp_switch_ring_counters(struct ethp_switch *sw, uint64_t *out);
/* Copy one port's counters: ETHP_SW_NCOUNTERS values into out, then
 * ETHP_NCLASSES x ETHP_SW_NCLASS_COUNTERS into cls_out. */
void ethp_switch_counters(struct ethp_switch *sw, uint32_t port, uint64_t *out,
                          uint64_t *cls_out);
/* A few counters of every port in one call: for port p, counter which[i]
 * (an index below ETHP_SW_NCOUNTERS) into out[p * n_which + i]; out holds
 * n_ports x n_which values.  Returns n_ports, or -EINVAL for an index out
 * of range.  (The fabric samples thousands of ports several times a
 * second: one port's whole set, classes included, per call cost too much.) */
int ethp_switch_counters_of_all(struct ethp_switch *sw, const uint32_t *which, uint32_t n_which,
                                uint64_t *out, uint32_t n_ports);
/* Loop iterations and wake-ups of the thread (for idle-CPU checks). */
uint64_t ethp_switch_wakeups(const struct ethp_switch *sw);
/* Bytes in all the switch's egress queues now, and their high-water mark. */
void ethp_switch_buffer(const struct ethp_switch *sw, uint64_t *used_bytes, uint64_t *hwm_bytes);

/* In-network aggregation trees (an aggregator that is not the root of a
 * group's tree): group's partial results go to aggregator parent_id, where
 * this switch is child parent_index of parent_members.  Set before the
 * group's first frame.  0, -EINVAL (no aggregator here, this switch as its
 * own parent, or out of range). */
int ethp_switch_agg_join(struct ethp_switch *sw, uint32_t group, uint32_t parent_id,
                         uint32_t parent_index, uint32_t parent_members);
int ethp_switch_agg_leave(struct ethp_switch *sw, uint32_t group);
/* Register a group at this switch's aggregator: member i sends from ips[i]
 * (UDP form) or as endpoint eps[i] (compact form); the group may hold at
 * most quota_slots slots.  Only registered groups are aggregated. */
int ethp_switch_agg_register(struct ethp_switch *sw, uint32_t group, const uint32_t *ips,
                             const uint32_t *eps, uint32_t n_members, uint32_t quota_slots);
int ethp_switch_agg_unregister(struct ethp_switch *sw, uint32_t group);
/* The switch's settings as it was made with (real units). */
void ethp_switch_config(const struct ethp_switch *sw, struct ethp_switch_cfg *out);
/* Build an 802.1Qbb PFC frame pausing the classes in mask for quanta. */
int ethp_build_pfc(uint8_t *out, size_t cap, const uint8_t *src_mac, uint8_t class_mask,
                   uint16_t quanta);

/* ------------------------------------------------------------------- nic */

/* Per-endpoint counters.  X(name, help) */
#define ETHP_NIC_COUNTERS(X)                                                    \
    X(rx_frames, "frames taken as this endpoint's (ETH+ or RoCE, valid or not): each ends in exactly one rx_ fate below") \
    X(tx_data_pkts, "data packets sent (first transmissions and retransmissions)") \
    X(tx_data_bytes, "payload bytes sent")                                      \
    X(retx_pkts, "data packets retransmitted")                                  \
    X(retx_bytes, "payload bytes retransmitted")                                \
    X(retx_sack, "retransmissions on SACK-inferred loss")                       \
    X(retx_nack, "retransmissions on a trimmed-packet NACK")                    \
    X(retx_timeout, "retransmissions on a retransmit timeout")                  \
    X(rx_data_pkts, "data packets received")                                    \
    X(rx_data_bytes, "payload bytes placed")                                    \
    X(rx_dup_pkts, "duplicate data packets discarded")                          \
    X(rx_overlap, "data packets refused: not at the place their PSN gives them in their message, or past its last packet (they would overlap other data)") \
    X(rx_unexpected_pkts, "data for no posted receive, discarded")              \
    X(rx_trimmed_pkts, "trimmed packets seen (each answered by a NACK)")        \
    X(rx_ce_pkts, "CE-marked packets seen")                                     \
    X(rx_malformed, "frames refused: not valid ETH+ for this endpoint, a payload not its header's length, a msg_id bound to another tag") \
    X(rx_spoofed, "frames refused: not on one of its ports, or not from the address its claimed sender has there") \
    X(rx_stale_epoch, "frames refused: from an earlier incarnation of their sender, or for an earlier one of this endpoint") \
    X(peer_resets, "peers seen to restart: their unfinished messages, both ways, started over") \
    X(tx_hellos, "incarnation announcements sent to peers that addressed an earlier one") \
    X(rx_hellos, "incarnation announcements received") \
    X(rx_beyond_window, "data packets beyond the receive window, discarded (the sender resends)") \
    X(tx_acks, "acks sent")                                                     \
    X(rx_acks, "acks received")                                                 \
    X(tx_nacks, "nacks sent")                                                   \
    X(rx_nacks, "nacks received")                                               \
    X(ecn_echoes, "acks that echoed CE")                                        \
    X(rtt_samples, "RTT samples taken")                                         \
    X(rtt_last_ns, "last RTT sample (real ns)")                                 \
    X(cwnd_bytes, "congestion window now (sum over peers)")                     \
    X(pauses_rx, "PFC pause frames honoured")                                   \
    X(nack_retx_max_ns, "longest time from a NACK to its retransmission (real)") \
    X(plane_avoided, "packets steered off a plane recently marked or trimmed")   \
    X(tx_rnrs, "receiver-not-ready replies sent (no receive posted)")           \
    X(rx_rnrs, "receiver-not-ready replies received")                           \
    X(msgs_sent, "messages completed by the sender")                            \
    X(msgs_received, "messages completed by the receiver")                      \
    X(tx_again, "sends deferred: TX ring or socket buffer full")                \
    X(rx_oos_drops, "roce: out-of-sequence packets discarded (go-back-N)")      \
    X(retx_gbn, "roce: packets resent going back to a NAKed or timed-out PSN")  \
    X(tx_cnps, "roce: CNPs sent (CE marks seen, at most one per interval per QP)") \
    X(rx_cnps, "roce: CNPs received")                                           \
    X(rate_cuts, "roce: DCQCN rate decreases")                                  \
    X(rate_bps, "roce: DCQCN rate now, summed over QPs (real bit/s)")          \
    X(tx_injected_drops, "first transmissions dropped by fault injection (drop_psn)") \
    X(plane_failures, "adaptive: a plane kept losing packets and was taken out for a while") \
    X(inc_tx_pkts, "in-network all-reduce: contributions sent (first and resent)") \
    X(inc_retx_pkts, "in-network all-reduce: contributions resent on a timeout") \
    X(inc_rx_results, "in-network all-reduce: result packets placed")          \
    X(inc_dup_results, "in-network all-reduce: results already placed, discarded") \
    X(inc_timeouts, "in-network all-reduce: aggregator timeouts")             \
    X(int_acks, "hpcc: acks whose INT records drove the window")               \
    X(int_hops_max, "hpcc: most switch hops seen in one INT block")            \
    X(rx_one_by_one, "frames received one at a time while the RX ring was down") \
    X(ring_builds, "times the RX ring was set up for a run of traffic")        \
    X(ring_parks, "times the RX ring was taken down after idling")           \
    X(ring_backoffs, "RX rings taken down for a trickle: the next set-up waits longer") \
    X(eng_late_wakeups, "the engine ran more than 100 us after the time its next packet or timer was due") \
    X(eng_late_sum_ns, "how late the engine ran, summed (real ns; each ns counted once)") \
    X(eng_late_max_ns, "the engine's worst lateness (real ns)") \
    X(eng_lost_ns, "engine lateness beyond the pacers' catch-up: link time its ports lost (real ns)") \
    X(rescales, "changes of the lab's time scale the engine followed (fabric clock)") \
    X(rx_ring_drops, "frames the kernel dropped before the engine read them: its RX ring was full") \
    X(rx_wait_sum_ns, "how long frames waited in the RX ring before the engine read them, summed (real ns, from the kernel's arrival stamps)") \
    X(rx_wait_frames, "frames whose wait in the RX ring was measured") \
    X(rx_wait_max_ns, "the longest wait of a frame in the RX ring (real ns)") \
    X(credit_bytes, "rccc: what the receivers let this sender have in flight now (sum over peers)") \
    X(rx_senders, "senders this receiver shares its downlink among now (its grants' divisor)") \
    X(eng_passes, "passes the engine made over its peers") \
    X(eng_peer_visits, "peers those passes served (the others were idle, or asleep: waiting for a frame from their peer or their retransmit timer)") \
    X(scheds_run, "collective schedules the engine ran by itself (receives, reductions and sends without Python per step)") \
    X(caller_wakeups, "times a caller waiting for a transfer was woken (a schedule's caller: at its end, not per step)")

#define ETHP_X_ENUM(name, help) ETHP_NC_##name,
enum ethp_nic_counter { ETHP_NIC_COUNTERS(ETHP_X_ENUM) ETHP_NIC_NCOUNTERS };
#undef ETHP_X_ENUM
uint32_t ethp_nic_counter_count(void);
const char *ethp_nic_counter_name(uint32_t i);

enum {
    ETHP_NIC_MAX_PLANES = 16,
    ETHP_NIC_OK = 0,
    ETHP_NIC_PENDING = 1,
    ETHP_NIC_ERR_TOO_SMALL = -100,  /* a message longer than the posted buffer */
    ETHP_NIC_ERR_UNREACHABLE = -101, /* the retry budget ran out */
    ETHP_NIC_ERR_NO_SUCH = -102,     /* unknown handle or peer */
    ETHP_NIC_ERR_NO_RECEIVE = -103,  /* the peer never posted a receive for the tag */
    ETHP_NIC_ERR_NO_GROUP = -104,    /* in-network all-reduce without ethp_nic_inc_setup */
    ETHP_NIC_ERR_SHORT = -105,       /* a schedule's receive got a shorter whole message */
    /* An engine thread's nice value, the fabric's (fabric.py): a NIC is
     * hardware, due when its pacers say, ahead of the workers' numpy work
     * and kernels on the same cores (where the caller may raise priority) */
    ETHP_NIC_NICE = -10,
};

/* The ETH+ transport's congestion control. */
enum ethp_cc_algo {
    ETHP_CCA_NSCC = 0, /* NSCC-like: ECN and delay, window (UEC) */
    ETHP_CCA_HPCC = 1, /* HPCC-like: INT from every switch hop, window */
    ETHP_CCA_RCCC = 2, /* receiver credits (RCCC-like) capping the NSCC-like window */
};

struct ethp_nic_cfg {
    uint32_t ep;                /* this endpoint (its rank) */
    uint32_t compact;           /* compact EtherType form instead of IPv4/UDP */
    uint32_t payload_bytes;     /* payload per packet */
    uint32_t n_evs;             /* entropy values per peer */
    uint32_t adaptive;          /* avoid EVs recently marked, trimmed or lost */
    uint32_t max_retries;       /* timeouts in a row before a peer is unreachable */
    uint64_t rate_bps;          /* real rate of each port */
    uint64_t base_rtt_ns;       /* real */
    uint64_t rto_ns;            /* real, initial */
    uint64_t max_cwnd_bytes;    /* 1.5 x BDP over all planes */
    uint32_t cc;                /* enum ethp_cc_algo (ignored in roce mode: DCQCN) */
    uint64_t seed;
    /* The emulated RoCEv2 mode (roce != 0): go-back-N, one path per queue
     * pair, DCQCN; always IPv4/UDP to port 4791. */
    uint32_t roce;
    uint32_t qps;               /* queue pairs per peer (packet i goes on QP i mod qps) */
    uint32_t roce_spray;        /* a test of why RoCE keeps one path: spray every packet */
    uint32_t dcqcn;             /* DCQCN rate control on (else line rate, PFC alone) */
    uint64_t cnp_interval_ns;   /* real: at most one CNP per QP per interval */
    uint64_t dcqcn_timer_ns;    /* real: alpha update and rate-increase timer */
    uint64_t dcqcn_byte_counter_bytes;
    uint64_t dcqcn_g_inv;       /* g = 1 / dcqcn_g_inv */
    uint64_t dcqcn_rai_bps;     /* real: additive increase */
    uint64_t dcqcn_rhai_bps;    /* real: hyper increase */
    uint64_t dcqcn_min_rate_bps;
    uint32_t dcqcn_f;           /* fast-recovery stages */
    /* Fault injection, for tests: the first transmission of PSN
     * drop_psn_plus1 - 1 (towards any peer) is dropped at the sender, once. */
    uint32_t drop_psn_plus1;
    uint32_t ring_idle_ms;      /* the NIC's port: see struct ethp_port_cfg */
    uint32_t rx_ring_blocks;    /* its RX ring, in 64 KiB blocks (0: 256, 16 MiB) */
    uint32_t rx_ring_timeout_ms; /* its blocks' retire timeout (0: 1 ms) */
    /* The time scale the real values above were computed at, and the parts
     * that do not scale with it: when the lab's fabric clock (set with
     * ethp_nic_set_clock) moves to another k, every real time above is
     * multiplied, and every rate divided, by k / time_scale (the part of
     * base_rtt_ns that is unscaled_rtt_ns stays; rto_ns never goes under
     * rto_floor_ns). */
    double time_scale;
    uint64_t unscaled_rtt_ns;
    uint64_t rto_floor_ns;
    /* Real, never scaled: how long a peer may keep answering "receiver not
     * ready" (alive, no receive posted for the tag) with no progress before
     * the transfers to it fail ETHP_NIC_ERR_NO_RECEIVE; 0: wait for ever
     * (InfiniBand's rnr_retry 7).  It is the program's time, not the
     * fabric's: a receiver busy computing is late in real seconds. */
    uint64_t rnr_timeout_ns;
};

struct ethp_nic;
struct ethp_clock;
struct ethp_nic *ethp_nic_new(const struct ethp_nic_cfg *cfg, const char *netns_path,
                              uint32_t max_peers, int *err);
/* A port (plane): interface, its MAC and IPv4 address, the next hop's MAC. */
int ethp_nic_add_port(struct ethp_nic *nic, const char *ifname, const uint8_t *mac,
                      const uint8_t *gw_mac, uint32_t ip);
/* A peer endpoint and its address on each plane (index = port order). */
int ethp_nic_add_peer(struct ethp_nic *nic, uint32_t ep, const uint32_t *ips, uint32_t n);
int ethp_nic_start(struct ethp_nic *nic);
/* Engine groups: one thread runs the loops of many engines (the ranks of
 * one process).  A group's thread starts at once and idles until engines
 * join it; an engine started in a group (instead of ethp_nic_start) leaves
 * it when freed.  A group is freed only once it has no engine (-EBUSY). */
#define ETHP_NIC_GROUP_MAX 1024
struct ethp_nic_group;
struct ethp_nic_group *ethp_nic_group_new(int *err);
int ethp_nic_start_in(struct ethp_nic *nic, struct ethp_nic_group *group);
uint32_t ethp_nic_group_members(struct ethp_nic_group *group);
int ethp_nic_group_free(struct ethp_nic_group *group);
void ethp_nic_free(struct ethp_nic *nic);
/* Post a send or receive of len bytes at buf (which must stay valid until
 * completion).  Returns a handle > 0 or a negative error. */
int64_t ethp_nic_post_send(struct ethp_nic *nic, uint32_t peer, uint32_t tag,
                           const uint8_t *buf, uint64_t len);
int64_t ethp_nic_post_recv(struct ethp_nic *nic, uint32_t peer, uint32_t tag, uint8_t *buf,
                           uint64_t len);
/* Wait up to timeout_ms (-1: forever) for a handle.  Returns ETHP_NIC_OK,
 * ETHP_NIC_PENDING or an error; *bytes gets the message length. */
int ethp_nic_wait(struct ethp_nic *nic, int64_t handle, int timeout_ms, uint64_t *bytes);
/* A schedule's handle that finished ETHP_NIC_ERR_SHORT (ask before
 * releasing it): the peer of its first receive whose message was shorter
 * than its buffer, that message's length and the buffer's.
 * ETHP_NIC_ERR_NO_SUCH otherwise.  (A plain receive completes OK with its
 * message's length: ethp_nic_wait's *bytes.) */
int ethp_nic_short(struct ethp_nic *nic, int64_t handle, uint32_t *peer, uint64_t *got_bytes,
                   uint64_t *posted_bytes);
/* The caller will not wait on handle again: the engine frees its message
 * once it has finished (at once if it has), and its handle answers
 * ETHP_NIC_ERR_NO_SUCH from now on.  A job of many transfers then holds
 * only those not yet released.  ETHP_NIC_ERR_NO_SUCH for an unknown or
 * released handle. */
int ethp_nic_release(struct ethp_nic *nic, int64_t handle);
/* Messages the endpoint holds: posted and not yet freed (released and
 * finished ones are freed at the engine's next pass). */
uint64_t ethp_nic_held(struct ethp_nic *nic);
/* Counters of the endpoint (peer < 0) or of one peer. */
void ethp_nic_counters(struct ethp_nic *nic, int32_t peer, uint64_t *out);
/* Take a plane out of (or back into) the sender's rotation. */
int ethp_nic_set_plane(struct ethp_nic *nic, uint32_t plane, uint32_t up);
/* Follow a lab's fabric clock (before ethp_nic_start; the clock must outlive
 * the NIC): the engine takes every change of k as it comes, and reports its
 * lateness to the clock. */
int ethp_nic_set_clock(struct ethp_nic *nic, struct ethp_clock *clock);
/* The time scale the engine runs at now. */
double ethp_nic_time_scale(const struct ethp_nic *nic);
/* This endpoint's incarnation (its connection epoch, in every frame it sends). */
uint32_t ethp_nic_epoch(const struct ethp_nic *nic);
/* The engine's settings as it was made with (real units, at its first k). */
void ethp_nic_config(const struct ethp_nic *nic, struct ethp_nic_cfg *out);
/* In-network all-reduce.  One aggregator a job's chunks go to, and the port
 * (plane) that reaches it. */
struct ethp_nic_agg {
    uint32_t id;      /* the aggregator it sends to: endpoint ETHP_AGG_EP_BASE + id */
    uint32_t plane;   /* this endpoint's port towards it */
    uint32_t group;   /* the group id (msg_id) of this stream of chunks */
    uint32_t members; /* members of the group at that aggregator */
    uint32_t index;   /* this endpoint's place among them */
};
/* Join n_aggs streams of an in-network all-reduce (chunk c goes to
 * aggs[c mod n_aggs]), with window chunks in flight in each.  Before
 * ethp_nic_start. */
int ethp_nic_inc_setup(struct ethp_nic *nic, const struct ethp_nic_agg *aggs, uint32_t n_aggs,
                       uint32_t window);
/* All-reduce count elements of dtype (enum ethp_agg_dtype) at buf in place,
 * in the network, with op (enum ethp_agg_op).  Every member must post the
 * same calls in the same order.  Returns a handle for ethp_nic_wait. */
int64_t ethp_nic_post_allreduce(struct ethp_nic *nic, uint8_t *buf, uint64_t count,
                                uint32_t dtype, uint32_t op);

/* A collective's schedule the engine runs by itself (run.schedule): ops
 * with dependencies, no return to Python per step.  An op starts once the
 * n_deps ops that list it among their successors (succ[succ_first ..
 * succ_first + succ_count - 1]) have finished; those with none start when
 * posted, in index order.  SEND and RECV are ordinary messages of the
 * endpoint (peer, tag, buf, len; same matching as ethp_nic_post_*), done
 * when sent or received (at once if len is 0); REDUCE makes buf = buf (op)
 * src over len bytes of dtype, COPY copies len bytes from src to buf, both
 * at once.  -EINVAL unless every index is in range, every n_deps counts its
 * op's predecessors and the ops have no cycle; ETHP_NIC_ERR_NO_SUCH for an
 * unknown peer.  The buffers must stay valid until completion.  Returns a
 * handle for ethp_nic_wait (its status: the first error of its messages). */
enum ethp_sched_kind {
    ETHP_SCHED_SEND = 0,
    ETHP_SCHED_RECV = 1,
    ETHP_SCHED_REDUCE = 2,
    ETHP_SCHED_COPY = 3,
};
struct ethp_sched_op {
    uint32_t kind, peer, tag, n_deps;
    uint8_t *buf;
    const uint8_t *src;
    uint64_t len;
    uint32_t succ_first, succ_count;
};
enum { ETHP_SCHED_MAX_OPS = 1 << 22 };
int64_t ethp_nic_post_sched(struct ethp_nic *nic, const struct ethp_sched_op *ops,
                            uint32_t n_ops, const uint32_t *succ, uint32_t n_succ,
                            uint32_t dtype, uint32_t op);
/* dst = dst (op) src over count elements of dtype (enum ethp_agg_dtype, or
 * ETHP_AGG_I64), in the type's own arithmetic, as numpy does it
 * (reference.reduce_into): 16-bit floats through float32, rounded to
 * nearest even.  -EINVAL for an unknown type or operator. */
int ethp_reduce_into(uint8_t *dst, const uint8_t *src, uint64_t count, uint32_t dtype,
                     uint32_t op);

/* --------------------------------------------------------------- memfab */

/* An in-memory fabric: NIC engines of one process joined by a switch that
 * lives in memory, for tests of the engine without root or namespaces.
 * Endpoint e has one port per plane; the fabric delivers a frame to the
 * endpoint its header names, after delay_ns and its place in that
 * endpoint's downlink queue (rate_bps, buffer_bytes), and can lose, trim,
 * mark and reorder frames on the way.  X(name, help) */
#define ETHP_MEMFAB_COUNTERS(X)                                                 \
    X(frames, "frames sent into the fabric")                                   \
    X(delivered, "frames delivered")                                            \
    X(lost, "frames lost at random (loss)")                                     \
    X(silenced, "frames sent on a silent plane")                                \
    X(dropped, "frames dropped: their downlink queue was full")                 \
    X(trimmed, "payloads trimmed: their downlink queue was full")               \
    X(marked, "frames marked CE: their downlink queue was over ecn_bytes")      \
    X(reordered, "data frames delivered after one sent later (overtaken)")    \
    X(misrouted, "frames for no endpoint attached, or not parsable")

#define ETHP_X_ENUM(name, help) ETHP_MF_##name,
enum ethp_memfab_counter { ETHP_MEMFAB_COUNTERS(ETHP_X_ENUM) ETHP_MEMFAB_NCOUNTERS };
#undef ETHP_X_ENUM
uint32_t ethp_memfab_counter_count(void);
const char *ethp_memfab_counter_name(uint32_t i);

struct ethp_memfab_cfg {
    uint32_t planes;       /* ports per endpoint */
    uint32_t endpoints;    /* endpoints 0 .. endpoints-1 */
    uint64_t rate_bps;     /* each endpoint's downlink, on each plane */
    uint64_t delay_ns;     /* one way, on top of the queue */
    uint64_t buffer_bytes; /* a downlink's data queue; beyond it, trim or drop */
    uint64_t ecn_bytes;    /* mark CE above this queue (0: never) */
    uint32_t trimming;     /* trim trimmable data instead of dropping it */
    uint32_t reorder;      /* a frame may overtake up to this many queued before it */
    double loss;           /* each frame lost with this probability */
    uint64_t seed;
};
struct ethp_memfab;
struct ethp_memfab *ethp_memfab_new(const struct ethp_memfab_cfg *cfg, int *err);
/* Free the fabric; its engines must be freed first. */
void ethp_memfab_free(struct ethp_memfab *fab);
/* A NIC engine on the fabric as endpoint cfg->ep, with its ports and every
 * other endpoint as a peer; not started (ethp_nic_start). */
struct ethp_nic *ethp_memfab_nic(struct ethp_memfab *fab, const struct ethp_nic_cfg *cfg,
                                 int *err);
/* Change the loss probability, or silence a plane (up = 0: its frames vanish). */
void ethp_memfab_set_loss(struct ethp_memfab *fab, double loss);
int ethp_memfab_set_plane(struct ethp_memfab *fab, uint32_t plane, uint32_t up);
void ethp_memfab_counters(struct ethp_memfab *fab, uint64_t *out);

/* ----------------------------------------------------------------- clock */

/* The fabric clock of a lab: one shared page (a file under the lab's run
 * directory) the fabric owns and writes, every NIC engine and worker of the
 * lab maps.  It holds the time scale k and the anchor pair (real, nominal) it
 * was set at:  nominal(t) = anchor_nominal + (t - anchor_real) / k,  with t
 * CLOCK_MONOTONIC, so nominal time is continuous across changes of k.  Read
 * under a sequence lock.  Engines add what they lost (late wake-ups past the
 * catch-up allowance, ring drops) to the page's reports, for the governor,
 * and the union of the spans they ran behind (ETHP_CLOCK_R_ANY_LATE_NS: a
 * collective waits for its slowest rank, so any engine behind holds up all). */
enum {
    ETHP_CLOCK_R_LOST_NS = 0,    /* engines' wall time lost past the catch-up allowance */
    ETHP_CLOCK_R_LATE_SUM_NS,    /* how late engines ran (eng_late_sum_ns) */
    ETHP_CLOCK_PER_ENGINE,       /* the reports above are also kept per engine */
    ETHP_CLOCK_R_LATE_WAKEUPS = ETHP_CLOCK_PER_ENGINE, /* engines' late wake-ups */
    ETHP_CLOCK_R_RING_DROPS,     /* frames the kernel dropped at an engine's ring */
    ETHP_CLOCK_R_RX_WAIT_SUM_NS, /* how long frames waited in engines' rings (rx_wait_sum_ns) */
    ETHP_CLOCK_R_RX_WAIT_FRAMES, /* the frames those waits were measured on */
    ETHP_CLOCK_R_ANY_LATE_NS,    /* wall time at least one engine was behind (their union) */
    ETHP_CLOCK_R_ENGINES,        /* engines attached to the clock now */
    ETHP_CLOCK_NREPORTS,
    ETHP_CLOCK_MAX_ENGINES = 1792, /* engines with a lost-time slot of their own (they wrap) */
};
struct ethp_clock;
/* Map path (create: make it, mode 0600, at time scale k; else it must exist
 * and be a valid clock page).  NULL and *err = -errno on failure. */
struct ethp_clock *ethp_clock_map(const char *path, int create, double k, int *err);
void ethp_clock_unmap(struct ethp_clock *c);
/* A new k from now on (1 <= k <= 1e9); the writer is the fabric alone. */
int ethp_clock_set_k(struct ethp_clock *c, double k);
double ethp_clock_k(const struct ethp_clock *c);
/* Changes of k so far (1 after creation). */
uint64_t ethp_clock_gen(const struct ethp_clock *c);
/* Nominal nanoseconds now (0 at the clock's creation). */
uint64_t ethp_clock_nominal_ns(const struct ethp_clock *c);
/* Nominal nanoseconds at real_ns (CLOCK_MONOTONIC, after the last change of
 * k): a caller's real and nominal readings of one instant. */
uint64_t ethp_clock_nominal_at_ns(const struct ethp_clock *c, uint64_t real_ns);
void ethp_clock_reports(const struct ethp_clock *c, uint64_t *out);
void ethp_clock_report(struct ethp_clock *c, uint32_t which, uint64_t v);
/* An engine ran behind its schedule over [from_ns, now_ns] (CLOCK_MONOTONIC):
 * added to ETHP_CLOCK_R_ANY_LATE_NS where no report so far covers it, in
 * whatever order reports come (at once, or at the next report or flush
 * if another process held the union's lock). */
void ethp_clock_report_late(struct ethp_clock *c, uint64_t from_ns, uint64_t now_ns);
/* Add the late spans this mapping still keeps (a cheap no-op if none). */
void ethp_clock_flush_late(struct ethp_clock *c);
/* Each attached engine's own report which (< ETHP_CLOCK_PER_ENGINE), by
 * slot: up to n of them into out; returns how many. */
uint32_t ethp_clock_engines(const struct ethp_clock *c, uint32_t which, uint64_t *out, uint32_t n);

/* ----------------------------------------------------------------- netns */

/* Make dir (e.g. /run/netns) a shared mount point, as iproute2 does. */
int ethp_netns_rundir_init(const char *dir);
/* Create a network namespace bound at path.  0 or negative errno. */
int ethp_netns_create(const char *path);
/* Unmount and unlink a namespace bind mount.  0 or negative errno. */
int ethp_netns_delete(const char *path);
/* The ifindex of ifname inside the namespace at path, or a negative errno. */
int ethp_netns_ifindex(const char *path, const char *ifname);
/* Open a socket inside the namespace at path (the calling thread enters it
 * and returns).  Returns the fd or a negative errno. */
int ethp_netns_socket(const char *path, int domain, int type, int protocol);
/* Write value to /proc/sys/<key> as seen inside the namespace at path
 * (key like "net/ipv6/conf/all/disable_ipv6").  0 or negative errno. */
int ethp_netns_sysctl(const char *path, const char *key, const char *value);
/* Read /proc/thread-self/net/<name> (e.g. "netstat": the namespace's own
 * TCP counters) as seen inside the namespace at path, up to cap bytes into
 * buf.  Returns the bytes read (the rest cut) or a negative errno. */
int ethp_netns_proc_net(const char *path, const char *name, char *buf, int cap);
/* Move the calling thread into the namespace at path for good, with a
 * private mount namespace whose /sys shows that network namespace (as
 * `ip netns exec` does).  For a process about to exec.  0 or negative errno. */
int ethp_netns_join(const char *path);
/* Move the calling thread alone into the network namespace at path (sockets
 * it opens from then on are there); for a thread of a many-threaded process. */
int ethp_netns_move_thread(const char *path);
/* ---------------------------------------------------------------- userns */

/* Make the calling (single-threaded) process the keeper of a user namespace
 * mapping uid/gid to root, with its own mount namespace (a tmpfs on /run)
 * and network namespace.  0 or negative errno. */
int ethp_userns_unshare(uint32_t uid, uint32_t gid);
/* Join the user, mount and network namespaces of the keeper pid (a
 * single-threaded caller of the same user); chdir to /.  0 or negative errno. */
int ethp_userns_join(int pid);

/* Switch off TSO, GSO, GRO, scatter-gather and checksum offloads of ifname,
 * through sock (a socket in the interface's namespace).  0 or negative errno. */
int ethp_if_offloads_off(int sock, const char *ifname);

/* --------------------------------------------------------------- sockops */

/* Attach to the cgroup (v2) directory cgroup_dir a BPF sock_ops program that
 * gives every TCP connection made, or accepted, by its processes the
 * kernel's largest RTO as its SYN (SYN-ACK) retransmit timeout instead of a
 * real second.  0 or negative errno. */
int ethp_sockops_syn_rto_max(const char *cgroup_dir);
/* Is ethp_sockops_syn_rto_max's program attached to cgroup_dir (a cgroup
 * ethplus made)?  1, 0 or negative errno. */
int ethp_sockops_is_ours(const char *cgroup_dir);

#endif
