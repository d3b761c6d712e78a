/* port.c - an AF_PACKET port: TPACKET_V3 RX ring (or, while idle, a socket
 * read a frame at a time), TPACKET_V2 TX ring. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/eventfd.h>
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
/* The MTU cache's first size: a switch's single port sends on every one of
 * its interfaces (64 on erack-64x8's plane switches, 2..65), and a direct-
 * mapped cache of 16 missed on nearly every burst there (two ioctls each:
 * some 5% of its threads' CPU); it grows past half full. */
#define ETHP_MTU_CACHE_MIN 64u

#ifndef PACKET_FANOUT_FLAG_IGNORE_OUTGOING
#define PACKET_FANOUT_FLAG_IGNORE_OUTGOING 0x4000 /* Linux 6.9 */
#endif
/* A port with ring_idle_ms: frames first come one at a time.  This many
 * within ETHP_RING_WINDOW_NS call for the ring (8,000 a second, for 8 ms:
 * a burst shorter than that does not pay for a ring; with 8 in 1 ms
 * upn-512's NIC rings were set up in every burst of its all-to-all). */
#define ETHP_RING_AT_FRAMES 64
#define ETHP_RING_WINDOW_NS 8000000ull
#define ETHP_RING_RETRY_NS 1000000000ull /* after a failed set-up */
/* A ring whose blocks held fewer frames than this on average over
 * ring_idle_ms is taken down too: its blocks were retired by their timer,
 * each frame waiting for it, and one by one it would not wait at all. */
#define ETHP_RING_SPARSE_FRAMES_PER_BLOCK 2
/* A ring taken down for a trickle, or having carried fewer frames than
 * pay for it (ETHP_RING_PAID_*, below), was not worth setting up (the
 * kernel zeroes all of it: a switch's is up to 32 MiB), so
 * the next waits this long, twice as long after each such ring up to the
 * most; a ring that carried a run of traffic and went idle clears the
 * wait.  Measured: erack-64x8 at k 1.6e6, where a port's real traffic
 * comes in bursts a round trip of seconds apart, each burst set a ring up
 * that idled out after it (a plane switch: 100 in a 4 MiB all-reduce),
 * and the set-ups were a fifth of all the CPU of a 16 MiB all-reduce. */
#define ETHP_RING_BACKOFF_MIN_NS 250000000ull
#define ETHP_RING_BACKOFF_MAX_NS 4000000000ull
/* What a ring must carry in its life to have paid for its set-up: a frame
 * for each ETHP_RING_PAID_BYTES_PER_FRAME of it (the kernel zeroes it all)
 * and ETHP_RING_PAID_FRAMES_MIN more (its helper threads, the socket's
 * set-up and RCU waits).  At two frames a block a NIC's 1 MiB ring was
 * paid for after 32 frames, and cleared its backoff (upn-512's all-to-all
 * at k 3.28e6: 4,368 set-ups of 512 NIC rings in one job, some 15,000
 * helper threads, a tenth of the NIC threads' CPU). */
#define ETHP_RING_PAID_BYTES_PER_FRAME 4096u
#define ETHP_RING_PAID_FRAMES_MIN 256u
/* The socket frames come one by one to holds as many bytes as the port's
 * ring would (4 MiB at least): a burst that comes before the reader wakes,
 * or while the ring is being set up (zeroing it, then an RCU grace period:
 * tens of ms), is not lost for want of a buffer the ring would have had.
 * With 4 MiB for all (8 MiB as the kernel counts a socket's buffer), a
 * port held about 1,000 frames of 4 KB before its reader woke and lost the
 * rest; its ring held 16 MiB, a 512-port switch's 32 MiB. */
#define ETHP_ONE_BY_ONE_RCVBUF_MIN_BYTES (4u << 20)
#define ETHP_ONE_BY_ONE_RCVBUF_MAX_BYTES (256u << 20)
#define ETHP_RX_CHUNK 64 /* frames per recvmmsg */
/* data.u64 of a port's epoll events: the caller's tag | which socket << 32 */
#define ETHP_EV_ONE_BY_ONE 1ull
#define ETHP_EV_BELL 2ull

/* Where a port with ring_idle_ms stands.  The forwarding thread moves it
 * from FRAMES to BUILDING, JOINED to STEERING, RING to PARKING and PARKED to
 * CLOSING, starting the helper thread that does the slow part and moves it
 * on.  The thread reads the ring from JOINED on, before any frame can go
 * to it: a program swap takes effect at once, but the call returns only
 * after an RCU grace period (tens of ms), and frames left unread that long
 * would be invisible to PFC's accounting. */
enum ethp_rx_state {
    ETHP_RX_FRAMES,   /* no ring: frames one by one */
    ETHP_RX_BUILDING, /* helper: set the ring up and join it to the group */
    ETHP_RX_JOINED,   /* the thread starts reading the ring too */
    ETHP_RX_STEERING, /* helper: steer frames to the ring */
    ETHP_RX_RING,     /* frames go to the ring */
    ETHP_RX_PARKING,  /* helper: steer frames back, wait for the last block */
    ETHP_RX_PARKED,   /* the thread reads the ring dry, then lets it go */
    ETHP_RX_CLOSING,  /* helper: unmap and close the ring socket */
};

struct ethp_port {
    int fd;                  /* receives (the ring); POLLIN; -1 while it is down */
    int tx_fd;               /* transmits; nobody sleeps on it */
    uint8_t *tx_ring;
    uint32_t tx_head;        /* next slot to fill: the kernel's next to send */
    struct ethp_mtu_slot {
        int ifindex;         /* 0: empty */
        uint32_t max_frame_bytes;
    } *mtu;                  /* per egress interface, open addressing */
    uint32_t mtu_cap, mtu_used; /* slots (a power of two), taken */
    int ifindex;
    uint8_t *ring;
    size_t ring_bytes;
    uint32_t block_bytes;
    uint32_t n_blocks;
    uint32_t block;          /* block being read */
    uint32_t left_in_block;  /* frames not yet read from it */
    struct tpacket3_hdr *next; /* next frame in it */
    uint64_t c[ETHP_PORT_NCOUNTERS];
    struct ethp_port_cfg cfg;
    /* With cfg.ring_idle_ms only: */
    int one_fd;              /* frames one at a time; the fanout group's member 0 */
    int bell_fd;             /* an eventfd the helper writes after each change */
    int epfd;                /* where the sockets are watched (-1: nowhere) */
    uint32_t tag;
    int state;               /* enum ethp_rx_state; atomic */
    int ring_watched;        /* the ring is the thread's to read */
    int one_ready;           /* one_fd may hold frames */
    int one_first;           /* read one_fd before the ring: it holds older frames */
    uint32_t fanout_id;
    uint32_t window_frames;
    uint64_t window_ns, last_ring_ns, retry_ns, idle_ns;
    uint64_t ring_window_ns, ring_window_frames, ring_window_blocks; /* sparseness */
    /* the forwarding thread's: what the ring up now has carried, and the
     * wait before the next set-up after one that did not pay */
    uint64_t ring_life_frames, ring_backoff_ns, build_after_ns;
    pthread_t helper;
    int helper_live;
    pthread_mutex_t fd_lock; /* the ring socket, against a counters read */
    uint8_t *scratch;        /* ETHP_RX_CHUNK frames from one_fd */
    uint64_t one_wall_ns;    /* while one_fd's frames are visited: when the one visited came
                              * (its kernel stamp), else when it was read */
    int one_stamped;         /* ... and it was the kernel's stamp */
    /* Frames received into scratch and not yet visited: [held_next, held) */
    uint32_t held, held_next;
    uint32_t held_len[ETHP_RX_CHUNK];
    int held_ifindex[ETHP_RX_CHUNK];
    uint64_t held_stamp_ns[ETHP_RX_CHUNK]; /* the kernel's arrival stamps (0: none) */
    uint64_t held_wall_ns;                 /* when they were read */
    uint32_t held_until_block; /* parking: visit them once the ring's reader is past this */
    int parked_read;           /* parked: the block being filled was read in place */
    char netns_path[256];
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

/* A socket buffer of bytes: forced past net.core.{r,w}mem_max where the
 * caller may (CAP_NET_ADMIN over the host); without root (a user
 * namespace: EPERM) as large as those limits allow. */
static int set_buf(int fd, int force_opt, int opt, int bytes)
{
    if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof(bytes)) == 0)
        return 0;
    if (errno != EPERM)
        return -1;
    return setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof(bytes));
}

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
        if (set_buf(p->tx_fd, SO_SNDBUFFORCE, SO_SNDBUF, b) < 0)
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

static int fanout_arg(const struct ethp_port *p, int first)
{
    int flags = PACKET_FANOUT_CBPF | PACKET_FANOUT_FLAG_IGNORE_OUTGOING |
                (first ? PACKET_FANOUT_FLAG_UNIQUEID : 0);
    return (int)(p->fanout_id | (uint32_t)flags << 16);
}

/* Steer every frame to fanout member m (0: one_fd, 1: the ring).  The kernel
 * swaps the program at once, then waits out an RCU grace period. */
static int fanout_to(struct ethp_port *p, uint32_t m)
{
    struct sock_filter f[] = {BPF_STMT(BPF_RET | BPF_K, m)};
    struct sock_fprog prog = {.len = 1, .filter = f};
    return setsockopt(p->one_fd, SOL_PACKET, PACKET_FANOUT_DATA, &prog, sizeof(prog)) < 0
               ? -errno : 0;
}

/* The RX ring's socket, bound to the port's interface(s).  In a fanout group
 * (join) it takes a drop-all filter until it is in, so that no frame reaches
 * both it and one_fd; it gets frames once fanout_to(p, 1) steers them. */
static int ring_open(struct ethp_port *p, int join)
{
    const struct ethp_port_cfg *cfg = &p->cfg;
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int v3 = TPACKET_V3, one = 1, rc;
    struct sock_filter none[] = {BPF_STMT(BPF_RET | BPF_K, 0)};
    struct sock_fprog drop = {.len = 1, .filter = none};
    struct tpacket_req3 req = {
        .tp_block_size = cfg->block_bytes,
        .tp_block_nr = cfg->n_blocks,
        .tp_frame_size = 2048, /* only a hint for V3; frames are packed */
        .tp_frame_nr = (uint32_t)((uint64_t)cfg->block_bytes * cfg->n_blocks / 2048),
        .tp_retire_blk_tov = cfg->block_timeout_ms,
    };
    size_t bytes = (size_t)cfg->block_bytes * cfg->n_blocks;
    uint8_t *ring = NULL;
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v3, sizeof(v3)) < 0 ||
        (join && setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &drop, sizeof(drop)) < 0) ||
        setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)) < 0)
        goto fail;
    ring = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_LOCKED | MAP_POPULATE,
                fd, 0);
    /* Past the memory-lock limit (without root: RLIMIT_MEMLOCK, often 8 MiB
     * a process), a ring that is not locked: it could be paged out under
     * memory pressure, which a lab machine does not have. */
    if (ring == MAP_FAILED && (errno == EAGAIN || errno == EPERM || errno == ENOMEM))
        ring = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (ring == MAP_FAILED) {
        ring = NULL;
        goto fail;
    }
    /* A port never wants to read back what it sent itself. */
    if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) < 0)
        goto fail;
    struct sockaddr_ll sll = {
        .sll_family = AF_PACKET,
        .sll_protocol = htons(ETH_P_ALL),
        .sll_ifindex = p->ifindex,
    };
    if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0)
        goto fail;
    if (join) {
        int v = fanout_arg(p, 0);
        if (setsockopt(fd, SOL_PACKET, PACKET_FANOUT, &v, sizeof(v)) < 0 ||
            setsockopt(fd, SOL_SOCKET, SO_DETACH_FILTER, &one, sizeof(one)) < 0)
            goto fail;
    }
    pthread_mutex_lock(&p->fd_lock);
    p->fd = fd;
    p->ring = ring;
    p->ring_bytes = bytes;
    p->block_bytes = cfg->block_bytes;
    p->n_blocks = cfg->n_blocks;
    p->block = p->left_in_block = 0;
    pthread_mutex_unlock(&p->fd_lock);
    return 0;
fail:
    rc = -errno;
    if (ring)
        munmap(ring, bytes);
    close(fd);
    return rc;
}

/* Fold a socket's kernel drop count into rx_ring_drops, and into
 * rx_one_by_one_drops for the socket frames come one by one to (the kernel
 * resets its statistics on every read). */
static void fold_drops(struct ethp_port *p, int fd)
{
    struct tpacket_stats_v3 st; /* tp_drops sits where struct tpacket_stats has it */
    socklen_t sl = sizeof(st);
    if (fd >= 0 && getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &st, &sl) == 0) {
        p->c[ETHP_PC_rx_ring_drops] += st.tp_drops;
        if (fd == p->one_fd)
            p->c[ETHP_PC_rx_one_by_one_drops] += st.tp_drops;
    }
}

static void ring_close(struct ethp_port *p)
{
    pthread_mutex_lock(&p->fd_lock);
    int fd = p->fd;
    uint8_t *ring = p->ring;
    fold_drops(p, fd);
    p->fd = -1;
    p->ring = NULL;
    pthread_mutex_unlock(&p->fd_lock);
    if (ring)
        munmap(ring, p->ring_bytes);
    if (fd >= 0)
        close(fd);
}

/* The socket frames come to one at a time: the first member of the port's
 * fanout group (a unique id the kernel picks), with every frame steered to
 * it.  -EINVAL from a kernel that refuses PACKET_FANOUT_FLAG_IGNORE_OUTGOING;
 * one that ignored it would hand the group the port's own frames, so both
 * receive paths also drop any frame marked outgoing.  Each frame carries
 * the kernel's arrival stamp (SO_TIMESTAMPNS), as the ring's do: how long
 * it waited before a thread read it is the reader's lateness. */
static int one_by_one_open(struct ethp_port *p)
{
    uint64_t ring_bytes = (uint64_t)p->cfg.block_bytes * p->cfg.n_blocks;
    if (ring_bytes < ETHP_ONE_BY_ONE_RCVBUF_MIN_BYTES)
        ring_bytes = ETHP_ONE_BY_ONE_RCVBUF_MIN_BYTES;
    if (ring_bytes > ETHP_ONE_BY_ONE_RCVBUF_MAX_BYTES)
        ring_bytes = ETHP_ONE_BY_ONE_RCVBUF_MAX_BYTES;
    int one = 1, b = (int)ring_bytes;
    p->one_fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (p->one_fd < 0)
        return -errno;
    struct sockaddr_ll sll = {
        .sll_family = AF_PACKET,
        .sll_protocol = htons(ETH_P_ALL),
        .sll_ifindex = p->ifindex,
    };
    int v = fanout_arg(p, 1), id = 0;
    socklen_t sl = sizeof(id);
    if (set_buf(p->one_fd, SO_RCVBUFFORCE, SO_RCVBUF, b) < 0 ||
        setsockopt(p->one_fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) < 0 ||
        setsockopt(p->one_fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) < 0 ||
        bind(p->one_fd, (struct sockaddr *)&sll, sizeof(sll)) < 0 ||
        setsockopt(p->one_fd, SOL_PACKET, PACKET_FANOUT, &v, sizeof(v)) < 0 ||
        getsockopt(p->one_fd, SOL_PACKET, PACKET_FANOUT, &id, &sl) < 0)
        return -errno;
    p->fanout_id = (uint32_t)id & 0xffff;
    p->bell_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->bell_fd < 0)
        return -errno;
    p->scratch = malloc((size_t)ETHP_RX_CHUNK * ETHP_MAX_FRAME_BYTES);
    if (!p->scratch)
        return -ENOMEM;
    return fanout_to(p, 0);
}

static int setup_sockets(struct ethp_port *p, const char *ifname)
{
    p->ifindex = 0; /* every interface */
    if (ifname) {
        p->ifindex = (int)if_nametoindex(ifname);
        if (!p->ifindex)
            return -errno;
    }
    int rc = 0;
    if (p->cfg.ring_idle_ms) {
        rc = one_by_one_open(p);
        if (rc == -EINVAL) { /* an older kernel: the ring stays up */
            close(p->one_fd);
            p->one_fd = -1;
            p->cfg.ring_idle_ms = 0;
            rc = 0;
        }
    }
    if (!rc && !p->cfg.ring_idle_ms) {
        rc = ring_open(p, 0);
        p->ring_watched = !rc;
    }
    return rc ? rc : setup_tx_socket(p, &p->cfg);
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
    if (!cfg_valid(cfg) ||
        (netns_path && strlen(netns_path) >= sizeof(((struct ethp_port *)0)->netns_path))) {
        *err = -EINVAL;
        return NULL;
    }
    struct ethp_port *p = calloc(1, sizeof(*p));
    if (!p) {
        *err = -ENOMEM;
        return NULL;
    }
    p->fd = p->tx_fd = p->one_fd = p->bell_fd = p->epfd = -1;
    p->cfg = *cfg;
    p->idle_ns = (uint64_t)cfg->ring_idle_ms * 1000000ull;
    pthread_mutex_init(&p->fd_lock, NULL);
    snprintf(p->netns_path, sizeof(p->netns_path), "%s", netns_path ? netns_path : "");
    int saved, rc = ethp_netns_enter(netns_path, &saved);
    if (!rc) {
        rc = setup_sockets(p, ifname);
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
    if (p->helper_live)
        pthread_join(p->helper, NULL);
    ring_close(p);
    if (p->tx_ring)
        munmap(p->tx_ring, (size_t)ETHP_TX_BLOCK_BYTES * ETHP_TX_BLOCKS);
    if (p->tx_fd >= 0)
        close(p->tx_fd);
    if (p->one_fd >= 0)
        close(p->one_fd);
    if (p->bell_fd >= 0)
        close(p->bell_fd);
    pthread_mutex_destroy(&p->fd_lock);
    free(p->scratch);
    free(p->mtu);
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

/* Frames in the block the kernel is filling (it hands the block over when
 * full or on its timer).  Once no frame can come to the ring, the count and
 * the frames are final: the kernel fills a block under the fanout program's
 * RCU read lock, and fanout_to waits those readers out. */
static uint32_t block_filling(struct ethp_port *p)
{
    struct tpacket_block_desc *b = block_at(p, p->block);
    return __atomic_load_n(&b->hdr.bh1.num_pkts, __ATOMIC_ACQUIRE);
}

/* Frames received from one_fd while parking wait for the older ones the
 * ring's block being filled at the time holds (read after the receive, the
 * count includes every frame of their flows that came before them). */
static int held_blocked(struct ethp_port *p)
{
    return p->ring_watched && p->block == p->held_until_block && !p->left_in_block &&
           !p->parked_read && block_filling(p);
}

int ethp_port_wait(struct ethp_port *p, int timeout_ms)
{
    if (p->ring_watched && (p->left_in_block || block_ready(p)))
        return 1;
    if (p->held_next < p->held && !held_blocked(p))
        return 1;
    struct pollfd pfd[2] = {
        {.fd = p->ring_watched ? p->fd : -1, .events = POLLIN | POLLERR},
        {.fd = p->one_fd, .events = POLLIN | POLLERR},
    };
    int n = poll(pfd, 2, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    return (p->ring_watched && block_ready(p)) || (pfd[1].revents & POLLIN);
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

/* Visit up to n frames of the ring, if it is the thread's to read. */
static uint32_t ring_each(struct ethp_port *p, uint32_t n, ethp_frame_fn fn, void *ctx)
{
    uint32_t seen = 0;
    if (!p->ring_watched)
        return 0;
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
        if (sll->sll_pkttype != PACKET_OUTGOING) /* never ours to take (see one_by_one_open) */
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
    struct ethp_pkt *k = ethp_pool_get_for(c->pool, len);
    if (!k) {
        p->c[ETHP_PC_rx_no_buf]++;
    } else if (len > k->cap) {
        p->c[ETHP_PC_rx_truncated]++;
        ethp_pool_put(c->pool, &k, 1);
    } else {
        memcpy(k->data, data, len);
        k->len = len;
        k->ts_ns = c->now; /* monotonic, unlike the ring's timestamps */
        k->ifindex = ifindex;
        /* p->next is the ring frame being visited until fn returns */
        if (c->wall_ns)
            c->wall_ns[c->got] = p->one_wall_ns ? p->one_wall_ns
                                                : (uint64_t)p->next->tp_sec * 1000000000ull +
                                                      p->next->tp_nsec;
        c->pkts[c->got++] = k;
        p->c[ETHP_PC_rx_frames]++;
        p->c[ETHP_PC_rx_bytes] += len;
    }
}

/* ------------------------------------------------ frames one by one */

static void *helper_main(void *arg);

/* Hand the slow part of a state change to a helper thread (the last one
 * has finished: it moved the state on, which is how we got here). */
static void helper_start(struct ethp_port *p, int job)
{
    if (p->helper_live) {
        pthread_join(p->helper, NULL);
        p->helper_live = 0;
    }
    __atomic_store_n(&p->state, job, __ATOMIC_RELEASE);
    if (pthread_create(&p->helper, NULL, helper_main, p) == 0)
        p->helper_live = 1;
    else
        helper_main(p); /* slow, but right */
}

static void *helper_main(void *arg)
{
    struct ethp_port *p = arg;
    int next, rc = 0;
    uint64_t one = 1;
    switch (__atomic_load_n(&p->state, __ATOMIC_ACQUIRE)) {
    case ETHP_RX_BUILDING: {
        int saved;
        rc = ethp_netns_enter(p->netns_path[0] ? p->netns_path : NULL, &saved);
        if (!rc) {
            rc = ring_open(p, 1);
            ethp_netns_leave(saved);
        }
        if (rc) {
            p->c[ETHP_PC_ring_failures]++;
            p->retry_ns = ethp_now_ns() + ETHP_RING_RETRY_NS;
        }
        next = rc ? ETHP_RX_FRAMES : ETHP_RX_JOINED;
        break;
    }
    case ETHP_RX_STEERING:
        rc = fanout_to(p, 1);
        if (rc) { /* the ring gets nothing: let it go again */
            p->c[ETHP_PC_ring_failures]++;
            p->retry_ns = ethp_now_ns() + ETHP_RING_RETRY_NS;
        }
        next = rc ? ETHP_RX_PARKED : ETHP_RX_RING;
        break;
    case ETHP_RX_PARKING:
        /* Once the kernel has swapped the program and waited out the
         * readers of the old one, no frame goes to the ring: what its
         * current block holds is all it will hold (see rx_mixed). */
        rc = fanout_to(p, 0);
        next = rc ? ETHP_RX_RING : ETHP_RX_PARKED;
        break;
    case ETHP_RX_CLOSING:
        ring_close(p);
        p->c[ETHP_PC_ring_parks]++;
        next = ETHP_RX_FRAMES;
        break;
    default:
        return NULL;
    }
    __atomic_store_n(&p->state, next, __ATOMIC_RELEASE);
    if (write(p->bell_fd, &one, sizeof(one)) < 0) { /* the state says it all */ }
    return NULL;
}

static int watch_fd(struct ethp_port *p, int fd, uint64_t which, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.u64 = p->tag | which << 32};
    if (p->epfd < 0 || fd < 0)
        return 0;
    return epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

int ethp_port_watch(struct ethp_port *p, int epfd, uint32_t tag)
{
    p->epfd = epfd;
    p->tag = tag;
    /* Edge-triggered: a receive call reads each socket dry (and a socket
     * whose namespace was deleted must not keep the thread spinning). */
    int rc = p->ring_watched ? watch_fd(p, p->fd, 0, EPOLLIN | EPOLLET) : 0;
    if (!rc)
        rc = watch_fd(p, p->one_fd, ETHP_EV_ONE_BY_ONE, EPOLLIN | EPOLLET);
    if (!rc)
        rc = watch_fd(p, p->bell_fd, ETHP_EV_BELL, EPOLLIN);
    return rc;
}

void ethp_port_event(struct ethp_port *p, uint64_t data)
{
    uint64_t v;
    if (data >> 32 == ETHP_EV_ONE_BY_ONE)
        p->one_ready = 1;
    else if (data >> 32 == ETHP_EV_BELL && read(p->bell_fd, &v, sizeof(v)) < 0) {
        /* already read */
    }
}

uint64_t ethp_port_due_ns(const struct ethp_port *p)
{
    if (p->one_fd < 0 || !p->ring_watched ||
        __atomic_load_n(&p->state, __ATOMIC_ACQUIRE) != ETHP_RX_RING)
        return UINT64_MAX;
    return p->last_ring_ns + p->idle_ns;
}

int ethp_port_ring_up(const struct ethp_port *p)
{
    return p->one_fd < 0 || __atomic_load_n(&p->state, __ATOMIC_ACQUIRE) == ETHP_RX_RING;
}

/* The state changes that are the receiving thread's to make. */
static void rx_step(struct ethp_port *p, uint64_t now)
{
    switch (__atomic_load_n(&p->state, __ATOMIC_ACQUIRE)) {
    case ETHP_RX_FRAMES:
        if (p->window_frames >= ETHP_RING_AT_FRAMES && now >= p->retry_ns &&
            now >= p->build_after_ns) {
            p->window_frames = 0;
            helper_start(p, ETHP_RX_BUILDING);
        }
        break;
    case ETHP_RX_JOINED:
        /* one_fd will hold the frames from before the switch: older */
        p->ring_watched = p->one_first = p->one_ready = 1;
        p->last_ring_ns = p->ring_window_ns = now;
        p->ring_window_frames = p->ring_life_frames = 0;
        p->ring_window_blocks = p->c[ETHP_PC_rx_blocks];
        p->c[ETHP_PC_ring_builds]++;
        watch_fd(p, p->fd, 0, EPOLLIN | EPOLLET);
        helper_start(p, ETHP_RX_STEERING);
        break;
    case ETHP_RX_RING: {
        uint64_t blocks = p->c[ETHP_PC_rx_blocks] - p->ring_window_blocks;
        int sparse = now - p->ring_window_ns >= p->idle_ns && blocks &&
                     p->ring_window_frames < ETHP_RING_SPARSE_FRAMES_PER_BLOCK * blocks;
        if (now - p->last_ring_ns >= p->idle_ns || sparse) {
            /* worth its set-up: a run of traffic that went idle, and as
             * many frames as ETHP_RING_PAID_* ask */
            uint64_t ring_bytes = (uint64_t)p->block_bytes * p->n_blocks;
            int paid = p->ring_life_frames >=
                       ring_bytes / ETHP_RING_PAID_BYTES_PER_FRAME + ETHP_RING_PAID_FRAMES_MIN;
            if (!sparse && paid)
                p->ring_backoff_ns = 0;
            else if (p->ring_backoff_ns < ETHP_RING_BACKOFF_MAX_NS)
                p->ring_backoff_ns = p->ring_backoff_ns ? 2 * p->ring_backoff_ns
                                                        : ETHP_RING_BACKOFF_MIN_NS;
            p->build_after_ns = now + p->ring_backoff_ns;
            p->c[ETHP_PC_ring_backoffs] += p->ring_backoff_ns != 0;
            p->last_ring_ns = p->ring_window_ns = now; /* should parking fail */
            p->ring_window_frames = 0;
            p->ring_window_blocks = p->c[ETHP_PC_rx_blocks];
            helper_start(p, ETHP_RX_PARKING);
        } else if (now - p->ring_window_ns >= p->idle_ns) {
            p->ring_window_ns = now;
            p->ring_window_frames = 0;
            p->ring_window_blocks = p->c[ETHP_PC_rx_blocks];
        }
        break;
    }
    }
}

/* Receive one chunk from one_fd into the port's scratch slots (held until
 * visited).  Returns how many came; fewer than asked: one_fd is dry. */
static uint32_t one_by_one_recv(struct ethp_port *p, uint64_t now)
{
    struct mmsghdr mm[ETHP_RX_CHUNK];
    struct iovec iov[ETHP_RX_CHUNK];
    struct sockaddr_ll from[ETHP_RX_CHUNK];
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } ctl[ETHP_RX_CHUNK];
    for (uint32_t i = 0; i < ETHP_RX_CHUNK; i++) {
        iov[i] = (struct iovec){.iov_base = p->scratch + (size_t)i * ETHP_MAX_FRAME_BYTES,
                                .iov_len = ETHP_MAX_FRAME_BYTES};
        mm[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof(from[i]),
                                        .msg_iov = &iov[i], .msg_iovlen = 1,
                                        .msg_control = ctl[i].buf,
                                        .msg_controllen = sizeof(ctl[i].buf)};
    }
    int r = recvmmsg(p->one_fd, mm, ETHP_RX_CHUNK, MSG_DONTWAIT, NULL);
    uint32_t got = r > 0 ? (uint32_t)r : 0;
    if (got) /* for a frame the kernel did not stamp */
        p->held_wall_ns = ethp_wall_ns();
    p->held = p->held_next = 0;
    for (uint32_t i = 0; i < got; i++) {
        if (from[i].sll_pkttype == PACKET_OUTGOING) /* never ours to take */
            continue;
        if (mm[i].msg_hdr.msg_flags & MSG_TRUNC) {
            p->c[ETHP_PC_rx_truncated]++;
            continue;
        }
        if (p->held != i)
            memmove(p->scratch + (size_t)p->held * ETHP_MAX_FRAME_BYTES, iov[i].iov_base,
                    mm[i].msg_len);
        p->held_len[p->held] = mm[i].msg_len;
        p->held_stamp_ns[p->held] = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mm[i].msg_hdr); cm;
             cm = CMSG_NXTHDR(&mm[i].msg_hdr, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS &&
                cm->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(cm), sizeof(ts));
                p->held_stamp_ns[p->held] = (uint64_t)ts.tv_sec * 1000000000ull +
                                            (uint64_t)ts.tv_nsec;
            }
        p->held_ifindex[p->held++] = from[i].sll_ifindex;
    }
    if (now - p->window_ns >= ETHP_RING_WINDOW_NS) {
        p->window_ns = now;
        p->window_frames = 0;
    }
    p->window_frames += got;
    if (got < ETHP_RX_CHUNK)
        p->one_ready = p->one_first = 0;
    return got;
}

/* Visit up to n of the held frames. */
static uint32_t held_visit(struct ethp_port *p, uint32_t n, ethp_frame_fn fn, void *ctx)
{
    uint32_t seen = 0;
    for (; seen < n && p->held_next < p->held; seen++, p->held_next++) {
        uint32_t i = p->held_next;
        p->one_stamped = p->held_stamp_ns[i] != 0;
        p->one_wall_ns = p->one_stamped ? p->held_stamp_ns[i] : p->held_wall_ns;
        fn(ctx, p->scratch + (size_t)i * ETHP_MAX_FRAME_BYTES, p->held_len[i],
           p->held_ifindex[i]);
        p->c[ETHP_PC_rx_one_by_one]++;
    }
    p->one_wall_ns = 0;
    return seen;
}

/* Visit up to n frames from one_fd: those held first, then more received. */
static uint32_t one_by_one(struct ethp_port *p, uint32_t n, ethp_frame_fn fn, void *ctx,
                           uint64_t now)
{
    uint32_t seen = held_visit(p, n, fn, ctx);
    while (seen < n && (p->one_ready || p->one_first || p->epfd < 0)) {
        uint32_t got = one_by_one_recv(p, now);
        seen += held_visit(p, n - seen, fn, ctx);
        if (got < ETHP_RX_CHUNK)
            break;
    }
    return seen;
}

/* A port with ring_idle_ms: one_fd and the ring, whichever hold frames, in
 * the order they came.  Frames go to one socket at a time, and the switch is
 * a moment: every frame the old one holds is older than any the new one
 * gets.  So while the ring is joined (JOINED, STEERING, RING) one_fd is read
 * dry before the ring (a frame in the ring means the switch is past, and
 * nothing more comes to one_fd); while it is parked (PARKING, PARKED) a
 * frame from one_fd waits until the ring's older ones are read (below). */
static uint32_t rx_mixed(struct ethp_port *p, uint32_t n, ethp_frame_fn fn, void *ctx)
{
    uint64_t now = ethp_now_ns();
    uint32_t seen = 0;
    rx_step(p, now);
    uint32_t st = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
    if (!p->ring_watched || (st != ETHP_RX_PARKING && st != ETHP_RX_PARKED)) {
        seen += one_by_one(p, n, fn, ctx, now); /* joining: one_fd's frames are older */
        if (p->ring_watched && seen < n) {
            uint32_t r = ring_each(p, n - seen, fn, ctx);
            seen += r;
            p->ring_window_frames += r;
            p->ring_life_frames += r;
            if (r)
                p->last_ring_ns = now;
        }
        return seen;
    }
    /* Parking: frames now go to one_fd, and the ring holds older ones, the
     * last of them maybe in the block the kernel is filling, which its timer
     * hands over within the block timeout.  A frame in one_fd comes after
     * everything of its flow in the ring (the kernel put those there first),
     * so a chunk of one_fd is received, then the ring read as far as it
     * goes, and the chunk is visited only once the reader is past the block
     * that was being filled when it came.  (Waiting out the synchronisation
     * that ends PARKING instead would hold frames 10 ms or more.)  Once
     * PARKED, nothing more comes to the ring: the block being filled is
     * final and is read where it is, and then the ring is let go. */
    while (seen < n) {
        if (p->left_in_block || block_ready(p)) {
            seen += ring_each(p, n - seen, fn, ctx);
            continue;
        }
        /* (Past a block read in place the reader is ahead of the kernel,
         * and the next block's count is a stale one: nothing is left.) */
        uint32_t filling = p->parked_read ? 0 : block_filling(p);
        if (st == ETHP_RX_PARKED && filling) {
            struct tpacket_block_desc *b = block_at(p, p->block);
            p->left_in_block = filling;
            p->next = (struct tpacket3_hdr *)((uint8_t *)b + b->hdr.bh1.offset_to_first_pkt);
            p->parked_read = 1;
            continue;
        }
        if (p->held_next < p->held) {
            if (held_blocked(p))
                break; /* until the kernel's timer hands the block over */
            seen += held_visit(p, n - seen, fn, ctx);
            continue;
        }
        if ((p->one_ready || p->epfd < 0) && one_by_one_recv(p, now)) {
            p->held_until_block = p->block;
            continue;
        }
        if (st == ETHP_RX_PARKED) { /* read dry: let it go */
            if (p->epfd >= 0)
                epoll_ctl(p->epfd, EPOLL_CTL_DEL, p->fd, NULL);
            p->ring_watched = 0;
            p->parked_read = 0;
            helper_start(p, ETHP_RX_CLOSING);
            p->one_ready = 1;
            seen += one_by_one(p, n - seen, fn, ctx, now);
        }
        break;
    }
    return seen;
}

uint32_t ethp_port_rx_each(struct ethp_port *p, uint32_t n, ethp_frame_fn fn, void *ctx)
{
    return p->one_fd >= 0 ? rx_mixed(p, n, fn, ctx) : ring_each(p, n, fn, ctx);
}

uint64_t ethp_port_rx_stamp_ns(const struct ethp_port *p)
{
    if (p->one_wall_ns) /* read one by one: its kernel stamp, if it had one */
        return p->one_stamped ? p->one_wall_ns : 0;
    return p->next ? (uint64_t)p->next->tp_sec * 1000000000ull + p->next->tp_nsec : 0;
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

/* Where ifindex's answer is in the MTU cache t, or the empty slot it
 * would take. */
static struct ethp_mtu_slot *mtu_slot(struct ethp_mtu_slot *t, uint32_t cap, int ifindex)
{
    uint32_t i = ((uint32_t)ifindex * 2654435761u) & (cap - 1);
    while (t[i].ifindex && t[i].ifindex != ifindex)
        i = (i + 1) & (cap - 1);
    return &t[i];
}

/* Room for one more interface in the MTU cache (0: out of memory). */
static int mtu_room(struct ethp_port *p)
{
    if (p->mtu && 2 * (p->mtu_used + 1) <= p->mtu_cap)
        return 1;
    uint32_t cap = p->mtu ? 2 * p->mtu_cap : ETHP_MTU_CACHE_MIN;
    struct ethp_mtu_slot *t = calloc(cap, sizeof(*t));
    if (!t)
        return 0;
    for (uint32_t i = 0; p->mtu && i < p->mtu_cap; i++)
        if (p->mtu[i].ifindex)
            *mtu_slot(t, cap, p->mtu[i].ifindex) = p->mtu[i];
    free(p->mtu);
    p->mtu = t;
    p->mtu_cap = cap;
    return 1;
}

/* The largest frame the interface takes (its MTU plus the Ethernet header),
 * or 0 if it cannot be asked. */
static uint32_t max_frame_bytes(struct ethp_port *p, int ifindex)
{
    if (p->mtu) {
        const struct ethp_mtu_slot *e = mtu_slot(p->mtu, p->mtu_cap, ifindex);
        if (e->ifindex == ifindex)
            return e->max_frame_bytes;
    }
    struct ifreq ifr = {.ifr_ifindex = ifindex};
    if (ioctl(p->tx_fd, SIOCGIFNAME, &ifr) < 0 || ioctl(p->tx_fd, SIOCGIFMTU, &ifr) < 0)
        return 0;
    uint32_t bytes = (uint32_t)ifr.ifr_mtu + ETHP_ETH_HDR_BYTES;
    if (ifindex > 0 && mtu_room(p)) {
        *mtu_slot(p->mtu, p->mtu_cap, ifindex) = (struct ethp_mtu_slot){ifindex, bytes};
        p->mtu_used++;
    }
    return bytes;
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
    pthread_mutex_lock(&p->fd_lock);
    fold_drops(p, p->fd);
    fold_drops(p, p->one_fd);
    pthread_mutex_unlock(&p->fd_lock);
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
