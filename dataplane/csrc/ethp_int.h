/* ethp_int.h - private to the C core: on-wire layouts and small helpers. */
#ifndef ETHP_INT_H
#define ETHP_INT_H

#include <arpa/inet.h>
#include <assert.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "ethp.h"

#define ETHP_PACKED __attribute__((packed))

/* All multi-byte fields are in network byte order. */
struct ethp_wire_eth {
    uint8_t dst[6];
    uint8_t src[6];
    uint16_t ethertype;
} ETHP_PACKED;

struct ethp_wire_ipv4 {
    uint8_t ver_ihl;
    uint8_t tos;
    uint16_t total_len;
    uint16_t id;
    uint16_t frag;
    uint8_t ttl;
    uint8_t proto;
    uint16_t csum;
    uint32_t src;
    uint32_t dst;
} ETHP_PACKED;

struct ethp_wire_udp {
    uint16_t src_port;
    uint16_t dst_port;
    uint16_t len;
    uint16_t csum;
} ETHP_PACKED;

/* The ETH+ header: docs/wire-format.md documents every byte. */
struct ethp_wire_hdr {
    uint8_t ver_op;     /* version << 4 | opcode */
    uint8_t flags;
    uint16_t entropy;
    uint16_t src_ep;
    uint16_t dst_ep;
    uint32_t msg_id;
    uint32_t psn;
    uint32_t offset;
    uint32_t tag;
    uint16_t len;
    uint8_t tos;
    uint8_t hops;
    uint32_t ts_ns;
    uint32_t src_epoch;
    uint32_t dst_epoch;
} ETHP_PACKED;

/* The INT block (ETHP_F_INT): a count, then one record per switch hop. */
struct ethp_wire_int_hop {
    uint16_t port_id;
    uint16_t qlen_64b;
    uint32_t ts_ns;
    uint32_t tx_bytes;
    uint32_t rate_kbps;
} ETHP_PACKED;

struct ethp_wire_int {
    uint8_t n_hops;   /* records written */
    uint8_t max_hops; /* ETHP_INT_MAX_HOPS */
    uint16_t reserved;
    struct ethp_wire_int_hop hop[ETHP_INT_MAX_HOPS];
} ETHP_PACKED;

static_assert(sizeof(struct ethp_wire_int_hop) == ETHP_INT_HOP_BYTES, "int hop layout");
static_assert(sizeof(struct ethp_wire_int) == ETHP_INT_BYTES, "int layout");
static_assert(sizeof(struct ethp_wire_eth) == ETHP_ETH_HDR_BYTES, "eth layout");
static_assert(sizeof(struct ethp_wire_ipv4) == ETHP_IPV4_HDR_BYTES, "ipv4 layout");
static_assert(sizeof(struct ethp_wire_udp) == ETHP_UDP_HDR_BYTES, "udp layout");
static_assert(sizeof(struct ethp_wire_hdr) == ETHP_HDR_BYTES, "eth+ layout");
static_assert(offsetof(struct ethp_wire_hdr, ts_ns) == 28, "eth+ ts offset");

/* A wake of a switch or NIC thread serves every frame due within the time
 * ETHP_AHEAD_WIRE_BYTES (half a 4 KiB packet) take on its link: ports'
 * departures are staggered, and a wake (a timer, a context switch) per
 * frame was most of the CPU at a small k.  Fixed in nominal terms (41 ns
 * at 400 Gbit/s), so it does not move with k; docs/performance.md. */
#define ETHP_AHEAD_WIRE_BYTES 2048u

static inline uint64_t ethp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_REALTIME in ns: the clock of the kernel's arrival stamps. */
static inline uint64_t ethp_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A reader's clocks for the kernel's arrival stamps (CLOCK_REALTIME), and
 * the loop's clock beside it: read as a round of reading begins, and again
 * for a frame stamped after them (ethp_rx_clock_see).  The reader may have
 * been stopped mid-read (its process frozen, a busy machine), and a frame
 * that came meanwhile waited until it was read, not until reading began. */
struct ethp_rx_clock {
    uint64_t wall_ns, mono_ns;
};

static inline void ethp_rx_clock_read(struct ethp_rx_clock *c)
{
    c->wall_ns = ethp_wall_ns();
    c->mono_ns = ethp_now_ns();
}

/* Before a frame's stamp is set against c.  Returns 1 if c was read again. */
static inline int ethp_rx_clock_see(struct ethp_rx_clock *c, uint64_t stamp_ns)
{
    if (stamp_ns < c->wall_ns)
        return 0;
    ethp_rx_clock_read(c);
    return 1;
}

/* Wake a dataplane thread sleeping in epoll on its eventfd. */
static inline void ethp_kick(int evfd)
{
    uint64_t one = 1;
    if (write(evfd, &one, sizeof(one)) < 0) { /* counter saturated: it is awake anyway */ }
}

/* Sleep in epoll until an event or the monotonic time due (UINT64_MAX: no
 * deadline).  Returns what epoll_pwait2 returns. */
static inline int ethp_epoll_until(int epfd, struct epoll_event *evs, int max, uint64_t due)
{
    struct timespec ts, *tp = NULL;
    if (due != UINT64_MAX) {
        uint64_t now = ethp_now_ns();
        uint64_t wait = due > now ? due - now : 0;
        ts.tv_sec = (time_t)(wait / 1000000000ull);
        ts.tv_nsec = (long)(wait % 1000000000ull);
        tp = &ts;
    }
    return epoll_pwait2(epfd, evs, max, tp, NULL);
}

/* Enter the network namespace at path on the calling thread (NULL: stay).
 * *saved receives the fd to go back with; see ethp_netns_leave. */
int ethp_netns_enter(const char *path, int *saved);
void ethp_netns_leave(int saved);

/* Visit up to n received frames in place, in arrival order (fn must not
 * keep the pointer: the ring block, or the scratch slot a frame received one
 * by one was read into, is reused afterwards).  Returns how many frames were
 * visited.  Not counted in rx_frames: the visitor counts.  A ring_idle_ms
 * port also makes its mode changes here. */
typedef void (*ethp_frame_fn)(void *ctx, const uint8_t *data, uint32_t len, int ifindex);
uint32_t ethp_port_rx_each(struct ethp_port *port, uint32_t n, ethp_frame_fn fn, void *ctx);
/* While ethp_port_rx_each visits a frame from the ring: when the kernel
 * received it (CLOCK_REALTIME ns); 0 for a frame read one by one (its
 * arrival is not known, and its wait is not counted as none). */
uint64_t ethp_port_rx_stamp_ns(const struct ethp_port *port);

/* A 64-bit mixer (MurmurHash3's finaliser): hashes and seeds. */
static inline uint64_t ethp_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* xorshift64*: small, fast, deterministic for a given state. */
static inline uint64_t ethp_rng_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Its state from a seed, mixed first: from a small seed (1, 1000004) the
 * generator's first dozen or so outputs stay skewed (one switch drew 19
 * values above 0.24 in a row, so a 20% fault did nothing for 19 frames). */
static inline uint64_t ethp_rng_seed(uint64_t seed)
{
    uint64_t x = ethp_mix64(seed ^ 0x9E3779B97F4A7C15ull);
    return x ? x : 0x9E3779B97F4A7C15ull;
}

/* ---------------------------------------------------------------- aggregator
 * A switch's in-network aggregation engine (agg.c), driven by its thread. */
struct ethp_agg;
/* What a contribution did, and the result frames the switch must send. */
enum ethp_agg_action {
    ETHP_AGG_ABSORBED = 0, /* counted; the chunk still waits for others */
    ETHP_AGG_COMPLETE,     /* the last one: send the result to every member */
    ETHP_AGG_REPLY,        /* a member resent a finished chunk: send it the result */
    ETHP_AGG_DUP,          /* already counted, chunk not finished: nothing to send */
    ETHP_AGG_UP,           /* an inner node of a tree: send the partial result up */
    ETHP_AGG_STALE,        /* a chunk this aggregator no longer holds */
    ETHP_AGG_FULL,         /* no free slot */
    ETHP_AGG_BAD,          /* fields out of range, or not the group's */
    ETHP_AGG_FOREIGN,      /* a group nobody registered, or not from the member's address */
};
struct ethp_agg_member {
    uint32_t ip;  /* its address (UDP form), from the control plane's member list */
    uint16_t ep;  /* its endpoint (compact form), from the same list */
    uint16_t ev;  /* entropy of its last contribution: the result goes back the same way */
};
/* The result to send: payload and the header fields that vary. */
struct ethp_agg_out {
    const uint8_t *payload;
    uint32_t len_bytes;
    uint32_t psn, offset_bytes, group, word; /* word: the ts_ns field */
    uint32_t members;
    const struct ethp_agg_member *member; /* members entries */
    uint32_t to; /* ETHP_AGG_REPLY: the member to answer */
    uint32_t parent_id, parent_tag; /* ETHP_AGG_UP: where the partial goes, and its tag */
    uint8_t again; /* sent because a member resent its contribution */
};
/* Bytes of one element of an enum ethp_agg_dtype. */
static inline uint32_t ethp_agg_elem_bytes(uint32_t dtype)
{
    return dtype == ETHP_AGG_F16 || dtype == ETHP_AGG_BF16 ? 2 : 4;
}
struct ethp_agg *ethp_agg_new(uint32_t slots, uint32_t payload_cap_bytes);
void ethp_agg_free(struct ethp_agg *agg);
/* One contribution (ps parsed, its payload at payload).  now: monotonic ns. */
int ethp_agg_add(struct ethp_agg *agg, const struct ethp_parsed *ps, const uint8_t *payload,
                 uint64_t now, struct ethp_agg_out *out);
/* A result from this aggregator's parent in a tree: ETHP_AGG_COMPLETE (send
 * it to every member), ETHP_AGG_DUP (had it already) or ETHP_AGG_STALE. */
int ethp_agg_down(struct ethp_agg *agg, const struct ethp_parsed *ps, const uint8_t *payload,
                  uint64_t now, struct ethp_agg_out *out);
/* Trees, set from the control thread: group's partial results go to
 * aggregator parent_id, as its child parent_index of parent_members. */
int ethp_agg_join(struct ethp_agg *agg, uint32_t group, uint32_t parent_id, uint32_t parent_index,
                  uint32_t parent_members);
int ethp_agg_leave(struct ethp_agg *agg, uint32_t group);
/* The control plane's member list of a group (member i: ips[i], eps[i]) and
 * the most slots it may hold at once (its job's quota).  Contributions to a
 * group it never registered, or from anywhere but the member's own address,
 * are refused.  0, -EINVAL or -ENOSPC (every entry taken by live groups). */
int ethp_agg_register(struct ethp_agg *agg, uint32_t group, const uint32_t *ips,
                      const uint32_t *eps, uint32_t n_members, uint32_t quota_slots);
int ethp_agg_unregister(struct ethp_agg *agg, uint32_t group);

/* What a switch does to a frame on its way (ps: the frame parsed, kind:
 * what ethp_parse returned), for switch.c and memfab.c; inline, as the
 * switch's enqueue had them.  Trim: cut the payload, flag the header
 * ETHP_F_TRIMMED, fix the IPv4/UDP lengths.  Mark: set CE on an
 * ECN-capable frame; 1 if it was marked. */
static inline void ethp_ipv4_fix_csum(uint8_t *ip)
{
    ip[10] = ip[11] = 0;
    uint16_t c = ethp_inet_csum(ip, ETHP_IPV4_HDR_BYTES);
    memcpy(ip + 10, &c, 2);
}

static inline void ethp_frame_trim(uint8_t *data, uint32_t *len, const struct ethp_parsed *ps, int kind)
{
    *len = ps->payload_off;
    data[ps->hdr_off + 1] |= ETHP_F_TRIMMED;
    if (kind == ETHP_KIND_ETHP_UDP) {
        uint8_t *ip = data + ETHP_ETH_HDR_BYTES;
        uint16_t total = htons((uint16_t)(*len - ETHP_ETH_HDR_BYTES));
        uint16_t udp_len = htons((uint16_t)(*len - ps->l4_off));
        memcpy(ip + 2, &total, 2);
        memcpy(data + ps->l4_off + 4, &udp_len, 2);
        ethp_ipv4_fix_csum(ip);
    }
}

static inline int ethp_frame_mark_ce(uint8_t *data, const struct ethp_parsed *ps, int kind)
{
    uint8_t *tos = kind == ETHP_KIND_ETHP_COMPACT ? data + ps->hdr_off + 26
                                                  : data + ETHP_ETH_HDR_BYTES + 1;
    if (!(*tos & 3) || (*tos & 3) == 3)
        return 0; /* not ECN-capable, or already marked */
    *tos |= 3;
    if (kind != ETHP_KIND_ETHP_COMPACT)
        ethp_ipv4_fix_csum(data + ETHP_ETH_HDR_BYTES);
    return 1;
}

/* nic.c: where a NIC engine's frames go and come from.  A port (AF_PACKET in
 * the node's namespace) in a lab; an in-memory fabric (memfab.c) in tests,
 * so that engines run in one process, without root.  The engine owns it
 * (close at ethp_nic_free, or when ethp_nic_new_io fails). */
struct ethp_nic_io {
    void *ctx;
    /* the ifindex frames on interface ifname come in with, or a negative errno */
    int (*ifindex)(void *ctx, const char *ifname);
    /* send up to n frames out of ifindex (copied); how many were taken */
    uint32_t (*tx)(void *ctx, struct ethp_pkt **pkts, uint32_t n, int ifindex);
    void (*wait_tx)(void *ctx, int timeout_ms);
    uint32_t (*rx_each)(void *ctx, uint32_t n, ethp_frame_fn fn, void *arg);
    /* while rx_each visits a frame: when the kernel received it (CLOCK_REALTIME
     * ns), or 0 if not known; NULL: never known */
    uint64_t (*rx_stamp_ns)(void *ctx);
    /* when the engine must look again with no event (UINT64_MAX: never) */
    uint64_t (*due_ns)(void *ctx);
    int (*watch)(void *ctx, int epfd, uint32_t tag);
    void (*event)(void *ctx, uint64_t data);
    void (*counters)(void *ctx, uint64_t *out); /* ETHP_PORT_NCOUNTERS of them */
    void (*close)(void *ctx);
};
struct ethp_nic *ethp_nic_new_io(const struct ethp_nic_cfg *cfg, const struct ethp_nic_io *io,
                                 uint32_t max_peers, int *err);

/* The live counters of a port (ETHP_PORT_NCOUNTERS), for its owner thread. */
const uint64_t *ethp_port_counters_ref(const struct ethp_port *port);

/* clock.c: an engine attaches to its lab's clock (counted while mapped). */
void ethp_clock_attach_engine(struct ethp_clock *c);

#endif
