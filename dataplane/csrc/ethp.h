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

/* Bump on any change to a struct or signature below; dataplane/core.py checks it. */
#define ETHP_ABI_VERSION 2
uint32_t ethp_abi_version(void);

/* ------------------------------------------------------------------ wire */

enum {
    ETHP_ETHERTYPE_IPV4 = 0x0800,
    ETHP_ETHERTYPE_COMPACT = 0x88B5, /* IEEE 802 local experimental EtherType 1 */
    ETHP_ETHERTYPE_MACCTL = 0x8808,  /* 802.3x / 802.1Qbb pause */
    ETHP_UDP_PORT = 4793,            /* destination port of ETH+ over IPv4/UDP */
    ETHP_VERSION = 1,
    ETHP_ETH_HDR_BYTES = 14,
    ETHP_IPV4_HDR_BYTES = 20,
    ETHP_UDP_HDR_BYTES = 8,
    ETHP_HDR_BYTES = 32,
    ETHP_MAX_FRAME_BYTES = 9216 + 14, /* largest lab MTU plus Ethernet header */
};

/* ETH+ opcodes (low 4 bits of byte 0 of the ETH+ header). */
enum ethp_opcode {
    ETHP_OP_DATA = 1,
    ETHP_OP_ACK = 2,
    ETHP_OP_NACK = 3,
};

/* ETH+ header flags (byte 1). */
enum ethp_flag {
    ETHP_F_TRIMMED = 0x01,   /* a switch cut the payload */
    ETHP_F_LAST = 0x02,      /* last packet of a message */
    ETHP_F_ECN_ECHO = 0x04,  /* ack: the acked packet arrived CE-marked */
    ETHP_F_TRIMMABLE = 0x08, /* a switch may trim this packet */
    ETHP_F_RETX = 0x10,      /* a retransmission */
};

/* What ethp_parse found.  Negative values are errors. */
enum ethp_kind {
    ETHP_KIND_OTHER = 0,     /* valid Ethernet, nothing we know above it */
    ETHP_KIND_IPV4 = 1,      /* IPv4, not UDP to ETHP_UDP_PORT */
    ETHP_KIND_ETHP_UDP = 2,  /* ETH+ over IPv4/UDP (scale-out) */
    ETHP_KIND_ETHP_COMPACT = 3, /* ETH+ right after Ethernet (scale-up) */
    ETHP_KIND_MACCTL = 4,    /* MAC control frame (pause) */
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
    uint64_t ts_ns;      /* receive (or scheduled departure) time */
    uint32_t port;       /* ingress or egress port index, owner's choice */
    uint32_t in_pool;    /* 1 while owned by the pool: catches double frees */
};

struct ethp_pool;
struct ethp_pool *ethp_pool_new(uint32_t n_pkts, uint32_t buf_bytes);
void ethp_pool_free(struct ethp_pool *pool);
/* Take up to n packets; returns how many were taken. */
uint32_t ethp_pool_get(struct ethp_pool *pool, struct ethp_pkt **pkts, uint32_t n);
/* Return n packets; returns how many were accepted (foreign or already
 * returned packets are refused). */
uint32_t ethp_pool_put(struct ethp_pool *pool, struct ethp_pkt **pkts, uint32_t n);
uint32_t ethp_pool_available(const struct ethp_pool *pool);
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
    X(tx_batches, "sendmmsg calls")                                    \
    X(tx_again, "frames not sent: socket buffer full (EAGAIN)")        \
    X(tx_errors, "frames not sent: other send error")

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
};

struct ethp_port;
/* Open an AF_PACKET port on ifname inside the network namespace at
 * netns_path (NULL: the caller's).  On failure returns NULL and stores a
 * negative errno in *err. */
struct ethp_port *ethp_port_open(const char *netns_path, const char *ifname,
                                 const struct ethp_port_cfg *cfg, int *err);
void ethp_port_close(struct ethp_port *port);
int ethp_port_fd(const struct ethp_port *port);
int ethp_port_ifindex(const struct ethp_port *port);
/* Wait until a ring block is ready or timeout_ms passes (-1: forever).
 * Returns 1 if frames are ready, 0 on timeout, negative errno on error. */
int ethp_port_wait(struct ethp_port *port, int timeout_ms);
/* Copy up to n received frames into packets taken from pool. */
uint32_t ethp_port_rx_burst(struct ethp_port *port, struct ethp_pool *pool,
                            struct ethp_pkt **pkts, uint32_t n);
/* Send up to n frames in sendmmsg batches.  Returns how many were consumed:
 * sent, or refused by the kernel and counted in tx_errors.  The rest (socket
 * buffer full) are counted in tx_again and left for the caller to retry.
 * The caller keeps ownership of every packet. */
uint32_t ethp_port_tx_burst(struct ethp_port *port, struct ethp_pkt **pkts, uint32_t n);
/* Copy the counters (ETHP_PORT_NCOUNTERS values) into out. */
void ethp_port_counters(struct ethp_port *port, uint64_t *out);

/* ----------------------------------------------------------------- netns */

/* Make dir (e.g. /run/netns) a shared mount point, as iproute2 does. */
int ethp_netns_rundir_init(const char *dir);
/* Create a network namespace bound at path.  0 or negative errno. */
int ethp_netns_create(const char *path);
/* Unmount and unlink a namespace bind mount.  0 or negative errno. */
int ethp_netns_delete(const char *path);
/* Open a socket inside the namespace at path (the calling thread enters it
 * and returns).  Returns the fd or a negative errno. */
int ethp_netns_socket(const char *path, int domain, int type, int protocol);
/* Write value to /proc/sys/<key> as seen inside the namespace at path
 * (key like "net/ipv6/conf/all/disable_ipv6").  0 or negative errno. */
int ethp_netns_sysctl(const char *path, const char *key, const char *value);
/* Move the calling thread into the namespace at path for good, with a
 * private mount namespace whose /sys shows that network namespace (as
 * `ip netns exec` does).  For a process about to exec.  0 or negative errno. */
int ethp_netns_join(const char *path);
/* Switch off TSO, GSO, GRO, scatter-gather and checksum offloads of ifname,
 * through sock (a socket in the interface's namespace).  0 or negative errno. */
int ethp_if_offloads_off(int sock, const char *ifname);

#endif
