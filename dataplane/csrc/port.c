/* port.c - an AF_PACKET port: TPACKET_V3 RX ring, TPACKET_V2 TX ring. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/if.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ethp_int.h"

#define ETHP_TX_BURST_MAX 64
#define ETHP_BLAST_BURST 32 /* frames per paced burst */
#define ETHP_BLAST_CATCHUP_NS 2000000ull
/* The transmit ring: fixed slots, each a tpacket2_hdr, the frame's data
 * from ETHP_TX_DATA_OFF (the kernel's fixed offset without
 * PACKET_TX_HAS_OFF): a virtio-net header, then the frame. */
#define ETHP_TX_DATA_OFF (TPACKET2_HDRLEN - sizeof(struct sockaddr_ll))
#define ETHP_TX_SLOT_BYTES \
    TPACKET_ALIGN(ETHP_TX_DATA_OFF + sizeof(struct virtio_net_hdr) + ETHP_MAX_FRAME_BYTES)
#define ETHP_TX_BLOCK_BYTES (1u << 16)
#define ETHP_TX_SLOTS_PER_BLOCK (ETHP_TX_BLOCK_BYTES / ETHP_TX_SLOT_BYTES)
#define ETHP_TX_BLOCKS 19 /* 133 slots: two switch bursts; 1.2 MiB */
#define ETHP_TX_SLOTS (ETHP_TX_SLOTS_PER_BLOCK * ETHP_TX_BLOCKS)
#define ETHP_MTU_CACHE 16

struct ethp_port {
    int fd;                  /* receives (the ring); POLLIN */
    int tx_fd;               /* transmits; nobody sleeps on it */
    uint8_t *tx_ring;
    uint32_t tx_head;        /* next slot to fill: the kernel's next to send */
    struct {
        int ifindex;
        uint32_t max_frame_bytes;
    } mtu[ETHP_MTU_CACHE];   /* per egress interface, direct-mapped */
    int ifindex;
    uint8_t *ring;
    size_t ring_bytes;
    uint32_t block_bytes;
    uint32_t n_blocks;
    uint32_t block;          /* block being read */
    uint32_t left_in_block;  /* frames not yet read from it */
    struct tpacket3_hdr *next; /* next frame in it */
    uint64_t c[ETHP_PORT_NCOUNTERS];
};

#define ETHP_X_NAME(name, help) #name,
#define ETHP_X_HELP(name, help) help,
static const char *const counter_names[] = {ETHP_PORT_COUNTERS(ETHP_X_NAME)};
static const char *const counter_help[] = {ETHP_PORT_COUNTERS(ETHP_X_HELP)};
static_assert(sizeof(counter_names) / sizeof(counter_names[0]) == ETHP_PORT_NCOUNTERS,
              "one name per counter");

uint32_t ethp_port_counter_count(void) { return ETHP_PORT_NCOUNTERS; }
const char *ethp_port_counter_name(uint32_t i)
{
    return i < ETHP_PORT_NCOUNTERS ? counter_names[i] : NULL;
}
const char *ethp_port_counter_help(uint32_t i)
{
    return i < ETHP_PORT_NCOUNTERS ? counter_help[i] : NULL;
}

/* Transmit through a TX ring on a socket of its own.
 *
 * The ring: one send() hands the kernel every frame queued since the last,
 * where sendmmsg costs a message header, an iovec and an address copied in
 * per frame.  The virtio-net header's hdr_len covers the whole frame, so the
 * kernel copies it into the skb's linear data, as sendmsg does, rather than
 * pointing the skb at the ring's pages: those would be copied anyway where
 * the frame crosses into the peer's namespace, a page at a time.
 *
 * Its own socket: every sent skb, when freed, wakes whoever sleeps on its
 * socket, and the receive socket always has a sleeper (the thread's epoll).
 * Bound with protocol 0, it receives nothing. */
static int setup_tx_socket(struct ethp_port *p, const struct ethp_port_cfg *cfg)
{
    int one = 1, v2 = TPACKET_V2;
    p->tx_fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (p->tx_fd < 0)
        return -errno;
    /* Straight to the driver: a port paces itself, and a lab veth has no
     * queue worth going through (tc shapes only hosts' own kernel traffic). */
    if (setsockopt(p->tx_fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one)) < 0 ||
        setsockopt(p->tx_fd, SOL_PACKET, PACKET_VERSION, &v2, sizeof(v2)) < 0 ||
        setsockopt(p->tx_fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) < 0 ||
        /* a frame the kernel refuses is skipped, not left blocking the ring */
        setsockopt(p->tx_fd, SOL_PACKET, PACKET_LOSS, &one, sizeof(one)) < 0)
        return -errno;
    if (cfg->sndbuf_bytes) {
        int b = (int)cfg->sndbuf_bytes;
        if (setsockopt(p->tx_fd, SOL_SOCKET, SO_SNDBUFFORCE, &b, sizeof(b)) < 0)
            return -errno;
    }
    struct tpacket_req req = {
        .tp_block_size = ETHP_TX_BLOCK_BYTES,
        .tp_block_nr = ETHP_TX_BLOCKS,
        .tp_frame_size = ETHP_TX_SLOT_BYTES,
        .tp_frame_nr = ETHP_TX_SLOTS,
    };
    if (setsockopt(p->tx_fd, SOL_PACKET, PACKET_TX_RING, &req, sizeof(req)) < 0)
        return -errno;
    p->tx_ring = mmap(NULL, (size_t)ETHP_TX_BLOCK_BYTES * ETHP_TX_BLOCKS,
                      PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, p->tx_fd, 0);
    if (p->tx_ring == MAP_FAILED) {
        p->tx_ring = NULL;
        return -errno;
    }
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_ifindex = p->ifindex};
    if (bind(p->tx_fd, (struct sockaddr *)&sll, sizeof(sll)) < 0)
        return -errno;
    return 0;
}

static int setup_socket(struct ethp_port *p, const char *ifname,
                        const struct ethp_port_cfg *cfg)
{
    /* Protocol 0 until bind: a socket bound to ETH_P_ALL before bind would
     * see every interface's frames. */
    p->fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (p->fd < 0)
        return -errno;
    p->ifindex = 0; /* every interface */
    if (ifname) {
        p->ifindex = (int)if_nametoindex(ifname);
        if (!p->ifindex)
            return -errno;
    }
    int v3 = TPACKET_V3, one = 1;
    if (setsockopt(p->fd, SOL_PACKET, PACKET_VERSION, &v3, sizeof(v3)) < 0)
        return -errno;
    struct tpacket_req3 req = {
        .tp_block_size = cfg->block_bytes,
        .tp_block_nr = cfg->n_blocks,
        .tp_frame_size = 2048, /* only a hint for V3; frames are packed */
        .tp_frame_nr = (uint32_t)((uint64_t)cfg->block_bytes * cfg->n_blocks / 2048),
        .tp_retire_blk_tov = cfg->block_timeout_ms,
        .tp_sizeof_priv = 0,
        .tp_feature_req_word = 0,
    };
    if (setsockopt(p->fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)) < 0)
        return -errno;
    p->block_bytes = cfg->block_bytes;
    p->n_blocks = cfg->n_blocks;
    p->ring_bytes = (size_t)cfg->block_bytes * cfg->n_blocks;
    p->ring = mmap(NULL, p->ring_bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_LOCKED | MAP_POPULATE, p->fd, 0);
    if (p->ring == MAP_FAILED) {
        p->ring = NULL;
        return -errno;
    }
    /* A port never wants to read back what it sent itself. */
    if (setsockopt(p->fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) < 0)
        return -errno;
    struct sockaddr_ll sll = {
        .sll_family = AF_PACKET,
        .sll_protocol = htons(ETH_P_ALL),
        .sll_ifindex = p->ifindex,
    };
    if (bind(p->fd, (struct sockaddr *)&sll, sizeof(sll)) < 0)
        return -errno;
    return setup_tx_socket(p, cfg);
}

static int cfg_valid(const struct ethp_port_cfg *cfg)
{
    long page = sysconf(_SC_PAGESIZE);
    uint32_t b = cfg->block_bytes;
    return b >= (uint32_t)page && (b & (b - 1)) == 0 && cfg->n_blocks > 0 &&
           b >= ETHP_MAX_FRAME_BYTES + 128;
}

struct ethp_port *ethp_port_open(const char *netns_path, const char *ifname,
                                 const struct ethp_port_cfg *cfg, int *err)
{
    if (!cfg_valid(cfg)) {
        *err = -EINVAL;
        return NULL;
    }
    struct ethp_port *p = calloc(1, sizeof(*p));
    if (!p) {
        *err = -ENOMEM;
        return NULL;
    }
    p->fd = p->tx_fd = -1;
    int saved, rc = ethp_netns_enter(netns_path, &saved);
    if (!rc) {
        rc = setup_socket(p, ifname, cfg);
        ethp_netns_leave(saved);
    }
    if (rc) {
        ethp_port_close(p);
        *err = rc;
        return NULL;
    }
    *err = 0;
    return p;
}

void ethp_port_close(struct ethp_port *p)
{
    if (!p)
        return;
    if (p->ring)
        munmap(p->ring, p->ring_bytes);
    if (p->tx_ring)
        munmap(p->tx_ring, (size_t)ETHP_TX_BLOCK_BYTES * ETHP_TX_BLOCKS);
    if (p->fd >= 0)
        close(p->fd);
    if (p->tx_fd >= 0)
        close(p->tx_fd);
    free(p);
}

int ethp_port_fd(const struct ethp_port *p) { return p->fd; }
int ethp_port_ifindex(const struct ethp_port *p) { return p->ifindex; }

static struct tpacket_block_desc *block_at(struct ethp_port *p, uint32_t i)
{
    return (struct tpacket_block_desc *)(p->ring + (size_t)i * p->block_bytes);
}

static int block_ready(struct ethp_port *p)
{
    struct tpacket_block_desc *b = block_at(p, p->block);
    return (__atomic_load_n(&b->hdr.bh1.block_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER) != 0;
}

int ethp_port_wait(struct ethp_port *p, int timeout_ms)
{
    if (p->left_in_block || block_ready(p))
        return 1;
    struct pollfd pfd = {.fd = p->fd, .events = POLLIN | POLLERR};
    int n = poll(&pfd, 1, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    return block_ready(p);
}

void ethp_port_wait_tx(struct ethp_port *p, int timeout_ms)
{
    struct pollfd pfd = {.fd = p->tx_fd, .events = POLLOUT};
    poll(&pfd, 1, timeout_ms);
}

static void release_block(struct ethp_port *p)
{
    struct tpacket_block_desc *b = block_at(p, p->block);
    __atomic_store_n(&b->hdr.bh1.block_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
    p->block = (p->block + 1) % p->n_blocks;
    p->c[ETHP_PC_rx_blocks]++;
}

uint32_t ethp_port_rx_each(struct ethp_port *p, uint32_t n, ethp_frame_fn fn, void *ctx)
{
    uint32_t seen = 0;
    while (seen < n) {
        if (!p->left_in_block) {
            if (!block_ready(p))
                break;
            struct tpacket_block_desc *b = block_at(p, p->block);
            p->left_in_block = b->hdr.bh1.num_pkts;
            p->next = (struct tpacket3_hdr *)((uint8_t *)b + b->hdr.bh1.offset_to_first_pkt);
            if (!p->left_in_block) {
                release_block(p);
                continue;
            }
        }
        struct tpacket3_hdr *f = p->next;
        const struct sockaddr_ll *sll =
            (const struct sockaddr_ll *)((const uint8_t *)f + TPACKET_ALIGN(sizeof(*f)));
        fn(ctx, (const uint8_t *)f + f->tp_mac, f->tp_snaplen, sll->sll_ifindex);
        seen++;
        p->next = (struct tpacket3_hdr *)((uint8_t *)f + f->tp_next_offset);
        if (--p->left_in_block == 0)
            release_block(p);
    }
    return seen;
}

struct copy_ctx {
    struct ethp_port *port;
    struct ethp_pool *pool;
    struct ethp_pkt **pkts;
    uint32_t got;
    uint64_t now;
    uint64_t *wall_ns; /* NULL, or where the kernel's arrival stamps go */
};

static void copy_out(void *arg, const uint8_t *data, uint32_t len, int ifindex)
{
    struct copy_ctx *c = arg;
    struct ethp_port *p = c->port;
    struct ethp_pkt *k;
    if (ethp_pool_get(c->pool, &k, 1) != 1) {
        p->c[ETHP_PC_rx_no_buf]++;
    } else if (len > k->cap) {
        p->c[ETHP_PC_rx_truncated]++;
        ethp_pool_put(c->pool, &k, 1);
    } else {
        memcpy(k->data, data, len);
        k->len = len;
        k->ts_ns = c->now; /* monotonic, unlike the ring's timestamps */
        k->ifindex = ifindex;
        if (c->wall_ns) /* p->next is the frame being visited until fn returns */
            c->wall_ns[c->got] = (uint64_t)p->next->tp_sec * 1000000000ull + p->next->tp_nsec;
        c->pkts[c->got++] = k;
        p->c[ETHP_PC_rx_frames]++;
        p->c[ETHP_PC_rx_bytes] += len;
    }
}

uint32_t ethp_port_rx_burst_stamped(struct ethp_port *p, struct ethp_pool *pool,
                                    struct ethp_pkt **pkts, uint64_t *wall_ns, uint32_t n)
{
    struct copy_ctx c = {
        .port = p, .pool = pool, .pkts = pkts, .now = ethp_now_ns(), .wall_ns = wall_ns};
    while (c.got < n && ethp_port_rx_each(p, n - c.got, copy_out, &c))
        ;
    return c.got;
}

uint32_t ethp_port_rx_burst(struct ethp_port *p, struct ethp_pool *pool,
                            struct ethp_pkt **pkts, uint32_t n)
{
    return ethp_port_rx_burst_stamped(p, pool, pkts, NULL, n);
}

uint32_t ethp_port_tx_burst(struct ethp_port *p, struct ethp_pkt **pkts, uint32_t n)
{
    return ethp_port_tx_burst_to(p, pkts, n, 0);
}

static struct tpacket2_hdr *tx_slot(const struct ethp_port *p, uint32_t i)
{
    uint32_t block = i / ETHP_TX_SLOTS_PER_BLOCK, in_block = i % ETHP_TX_SLOTS_PER_BLOCK;
    return (struct tpacket2_hdr *)(p->tx_ring + (size_t)block * ETHP_TX_BLOCK_BYTES +
                                   (size_t)in_block * ETHP_TX_SLOT_BYTES);
}

static uint32_t tx_status(const struct tpacket2_hdr *h)
{
    return __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE);
}

/* The largest frame the interface takes (its MTU plus the Ethernet header),
 * or 0 if it cannot be asked. */
static uint32_t max_frame_bytes(struct ethp_port *p, int ifindex)
{
    unsigned k = (unsigned)ifindex % ETHP_MTU_CACHE;
    if (p->mtu[k].ifindex == ifindex && p->mtu[k].max_frame_bytes)
        return p->mtu[k].max_frame_bytes;
    struct ifreq ifr = {.ifr_ifindex = ifindex};
    if (ioctl(p->tx_fd, SIOCGIFNAME, &ifr) < 0 || ioctl(p->tx_fd, SIOCGIFMTU, &ifr) < 0)
        return 0;
    p->mtu[k].ifindex = ifindex;
    p->mtu[k].max_frame_bytes = (uint32_t)ifr.ifr_mtu + ETHP_ETH_HDR_BYTES;
    return p->mtu[k].max_frame_bytes;
}

uint32_t ethp_port_tx_burst_to(struct ethp_port *p, struct ethp_pkt **pkts, uint32_t n,
                               int ifindex)
{
    int dev = ifindex ? ifindex : p->ifindex;
    uint32_t limit = max_frame_bytes(p, dev), first = p->tx_head, queued = 0, taken = 0;
    /* Into the ring, in order, until it is full.  A frame the interface
     * cannot carry is counted and consumed, as the kernel would refuse it. */
    for (; taken < n; taken++) {
        const struct ethp_pkt *k = pkts[taken];
        if (k->len < ETHP_ETH_HDR_BYTES || k->len > ETHP_MAX_FRAME_BYTES || (limit && k->len > limit)) {
            if (queued)
                break; /* sent first: the frames queued stay one run */
            p->c[ETHP_PC_tx_errors]++;
            continue;
        }
        struct tpacket2_hdr *h = tx_slot(p, p->tx_head);
        if (tx_status(h) != TP_STATUS_AVAILABLE)
            break;
        uint8_t *d = (uint8_t *)h + ETHP_TX_DATA_OFF;
        struct virtio_net_hdr vh = {.hdr_len = (uint16_t)k->len};
        memcpy(d, &vh, sizeof(vh));
        memcpy(d + sizeof(vh), k->data, k->len);
        h->tp_len = (uint32_t)(sizeof(vh) + k->len);
        __atomic_store_n(&h->tp_status, TP_STATUS_SEND_REQUEST, __ATOMIC_RELEASE);
        p->tx_head = (p->tx_head + 1) % ETHP_TX_SLOTS;
        queued++;
    }
    if (!queued)
        return taken;
    struct sockaddr_ll to = {.sll_family = AF_PACKET, .sll_ifindex = ifindex, .sll_halen = 6};
    ssize_t r = ifindex ? sendto(p->tx_fd, NULL, 0, MSG_DONTWAIT, (struct sockaddr *)&to,
                                 sizeof(to))
                        : send(p->tx_fd, NULL, 0, MSG_DONTWAIT);
    p->c[ETHP_PC_tx_batches]++;
    /* The interface is gone or down: the kernel took nothing and never
     * will.  The frames are refused, as sendmsg would refuse them, not left
     * to be retried in a loop. */
    int refused = r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS &&
                  errno != EINTR;
    /* The kernel sends in ring order and stops at the first frame it cannot
     * take (socket buffer full): that frame and the rest are taken back. */
    uint32_t done = 0;
    while (done < queued &&
           tx_status(tx_slot(p, (first + done) % ETHP_TX_SLOTS)) != TP_STATUS_SEND_REQUEST)
        done++;
    for (uint32_t i = done; i < queued; i++)
        __atomic_store_n(&tx_slot(p, (first + i) % ETHP_TX_SLOTS)->tp_status,
                         TP_STATUS_AVAILABLE, __ATOMIC_RELEASE);
    p->tx_head = (first + done) % ETHP_TX_SLOTS;
    /* pkts[taken - queued .. taken) were queued; those after done are not sent */
    uint32_t base = taken - queued;
    for (uint32_t i = 0; i < done; i++)
        p->c[ETHP_PC_tx_bytes] += pkts[base + i]->len;
    p->c[ETHP_PC_tx_frames] += done;
    if (refused) {
        p->c[ETHP_PC_tx_errors] += queued - done;
        return taken;
    }
    uint32_t sent = base + done;
    if (sent < n)
        p->c[ETHP_PC_tx_again] += n - sent;
    return sent;
}

const uint64_t *ethp_port_counters_ref(const struct ethp_port *p) { return p->c; }

void ethp_port_counters(struct ethp_port *p, uint64_t *out)
{
    struct tpacket_stats_v3 st;
    socklen_t sl = sizeof(st);
    /* The kernel resets its statistics on every read: accumulate them. */
    if (getsockopt(p->fd, SOL_PACKET, PACKET_STATISTICS, &st, &sl) == 0)
        p->c[ETHP_PC_rx_ring_drops] += st.tp_drops;
    memcpy(out, p->c, sizeof(p->c));
}

uint64_t ethp_port_relay(struct ethp_port *in, struct ethp_port *out, uint32_t duration_ms)
{
    struct ethp_pool *pool = ethp_pool_new(ETHP_TX_BURST_MAX, ETHP_MAX_FRAME_BYTES);
    if (!pool)
        return 0;
    struct ethp_pkt *b[ETHP_TX_BURST_MAX];
    uint32_t have = 0, sent = 0;
    uint64_t moved = 0, end = ethp_now_ns() + (uint64_t)duration_ms * 1000000ull;
    while (ethp_now_ns() < end) {
        if (sent == have) {
            ethp_pool_put(pool, b, have);
            sent = 0;
            have = ethp_port_rx_burst(in, pool, b, ETHP_TX_BURST_MAX);
            if (!have) {
                ethp_port_wait(in, 10);
                continue;
            }
        }
        uint32_t k = ethp_port_tx_burst(out, b + sent, have - sent);
        sent += k;
        moved += k;
        if (sent < have)
            ethp_port_wait_tx(out, 10);
    }
    ethp_pool_put(pool, b, have);
    ethp_pool_free(pool);
    return moved;
}

uint64_t ethp_port_blast(struct ethp_port *p, const uint8_t *frame, uint32_t len,
                         uint64_t n_frames, uint32_t vary_off, uint32_t timeout_ms,
                         uint64_t rate_pps)
{
    if (!len || len > ETHP_MAX_FRAME_BYTES || (vary_off && vary_off + 2 > len))
        return 0;
    struct ethp_pool *pool = ethp_pool_new(ETHP_TX_BURST_MAX, len);
    if (!pool)
        return 0;
    struct ethp_pkt *b[ETHP_TX_BURST_MAX];
    uint32_t nb = ethp_pool_get(pool, b, ETHP_TX_BURST_MAX);
    for (uint32_t i = 0; i < nb; i++) {
        memcpy(b[i]->data, frame, len);
        b[i]->len = len;
    }
    uint16_t v = vary_off ? (uint16_t)(frame[vary_off] << 8 | frame[vary_off + 1]) : 0;
    uint64_t start = ethp_now_ns(), sent = 0;
    uint64_t deadline = start + (uint64_t)timeout_ms * 1000000ull;
    /* Paced: bursts of ETHP_BLAST_BURST, each due at start + sent / rate.  A
     * late wake-up is made up by sending the late bursts back to back, up
     * to ETHP_BLAST_CATCHUP_NS of them; beyond that the schedule restarts
     * (no catch-up storm after a long stall).  Sleeps with 1 ns of timer
     * slack: the default 50 us would pace slower than asked. */
    uint32_t unit = rate_pps ? ETHP_BLAST_BURST : nb;
    if (unit > nb)
        unit = nb;
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (rate_pps)
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    while (sent < n_frames && ethp_now_ns() < deadline) {
        if (rate_pps) {
            uint64_t due = start + sent * 1000000000ull / rate_pps, now = ethp_now_ns();
            if (due > now) {
                struct timespec ts = {.tv_sec = (time_t)((due - now) / 1000000000ull),
                                      .tv_nsec = (long)((due - now) % 1000000000ull)};
                nanosleep(&ts, NULL);
            } else if (now - due > ETHP_BLAST_CATCHUP_NS) {
                start = now - sent * 1000000000ull / rate_pps; /* fell behind: rebase */
            }
        }
        uint32_t m = n_frames - sent < unit ? (uint32_t)(n_frames - sent) : unit;
        if (vary_off)
            for (uint32_t i = 0; i < m; i++, v++) {
                b[i]->data[vary_off] = (uint8_t)(v >> 8);
                b[i]->data[vary_off + 1] = (uint8_t)v;
            }
        uint32_t k = ethp_port_tx_burst(p, b, m);
        sent += k;
        if (vary_off)
            v = (uint16_t)(v - (m - k)); /* resend the unsent values */
        if (k < m)
            ethp_port_wait_tx(p, 10);
    }
    if (rate_pps && slack > 0)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    ethp_pool_put(pool, b, nb);
    ethp_pool_free(pool);
    return sent;
}
