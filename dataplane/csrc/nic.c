/* nic.c - the ETH+ software NIC: a transport engine in one thread.
 *
 * Sender: messages are cut into packets of payload_bytes (less the INT block
 * when the packets carry one, so that frames stay within the MTU), each with its own
 * PSN (per peer), sprayed over the planes (ports) and entropy values, paced
 * per port at the link's real rate and limited by a congestion window per
 * peer.  Loss is inferred from SACKs (a packet 3 PSNs below the highest
 * SACKed one), signalled at once by a NACK when a switch trimmed a packet,
 * and caught by a retransmit timeout as a last resort; a retransmission takes
 * another plane and entropy value.
 *
 * Receiver: every payload goes straight to its offset in the posted buffer,
 * whatever the arrival order; a bitmap per peer discards duplicates; acks
 * carry the cumulative PSN and a 64-bit SACK bitmap, echo the sender's
 * timestamp, entropy value and CE marks, and are coalesced per burst.
 *
 * Congestion control: one window per plane towards each peer, run by the
 * algorithm behind struct ethp_cc_ops (cc.h): NSCC-like (cc_nscc.c) or
 * HPCC-like (cc_hpcc.c), for which data packets carry an INT block the
 * switches fill and acks echo it.
 *
 * RoCE mode (cfg.roce, the emulated RoCEv2 baseline): the same engine with
 * RoCE's semantics.  Packet i of a peer belongs to queue pair i mod qps; a QP
 * keeps one plane and one UDP source port, so switches hash it onto one path
 * (UDP port 4791: to a switch, an ordinary flow).  The receiver accepts only
 * the next PSN of each QP; on a gap it NAKs once and discards until that PSN
 * arrives; acks are cumulative per QP; the sender goes back to the NAKed (or
 * timed-out) PSN and resends everything after it on that QP.  Rate control is
 * DCQCN (cc_dcqcn.c), one rate per QP: the receiver turns CE marks into CNPs,
 * at most one per QP per cnp_interval_ns.  PSNs are assigned across QPs in
 * turn, so a QP that may not send holds the next ones back (NCCL, too, splits
 * a message evenly over its QPs and waits for the slowest).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cc.h"
#include "ethp_int.h"

#define NIC_WIN 16384u  /* packets in flight per peer; power of two */
#define NIC_RWIN 16384u /* receive bitmap window */
#define NIC_DUPTHRESH 3u
#define NIC_ACK_EVERY 8u
#define NIC_BURST 64
#define NIC_SACK_BITS 64u
#define NIC_EVFD_TAG 1u
#define NIC_RING_TAG 0u
#define NIC_CATCHUP_NS 2000000ull
#define NIC_LATE_NS 100000ull /* as the switch's late_frames */
#define NIC_CLOCK_POLL_NS 50000000ull /* an idle engine's look at the clock */
#define NIC_EAGER_BYTES 64u /* a message this small may come before its receive */
#define NIC_EAGER_SLOTS 8u  /* ... this many per peer */

enum { PKT_FREE = 0, PKT_INFLIGHT, PKT_ACKED, PKT_LOST };

struct nic_msg {
    int64_t handle;
    uint32_t peer, tag, msg_id;
    uint8_t *buf;
    uint64_t len;
    uint64_t done_bytes; /* recv: placed; send: acknowledged */
    uint64_t total;      /* recv: known once the last packet came */
    uint64_t next_off;   /* send: next byte to packetize */
    int status;
    int is_send, bound, queued;
    int inc;                 /* an in-network all-reduce: dtype and op below */
    uint8_t dtype, op;
    struct nic_msg *next;
};

struct tx_pkt {
    struct nic_msg *m;
    uint64_t sent_ns;
    uint64_t nacked_ns; /* when a NACK declared it lost, or 0 */
    uint32_t off;
    uint16_t len;
    uint8_t state;
    uint8_t plane;
    uint16_t ev;
    uint8_t last, retx;
    uint8_t sub; /* the congestion-control sub-flow: the plane (ethplus) or the QP (roce) */
};

/* One plane towards one peer: a sub-flow with its own window (a slow or
 * congested plane must not throttle the others). */
struct nic_cc {
    struct ethp_cc_state st;
    uint64_t inflight;
    uint64_t next_tx_ns; /* its rate pacer, when the algorithm sets a rate (st.rate_bps) */
};

/* roce: one queue pair towards a peer */
struct nic_qp {
    uint32_t rcv_nxt;     /* recv: the next PSN expected on this QP */
    int nak_sent;         /* recv: a NAK for rcv_nxt is out */
    uint64_t last_cnp_ns; /* recv */
    uint64_t sent_bytes;  /* send: since the last DCQCN tick */
    uint16_t ev;          /* send: fixed entropy (UDP source port), plane in the low bits */
};

struct nic_peer {
    uint32_t ep;
    uint32_t ip[ETHP_NIC_MAX_PLANES];
    int known;
    int active; /* on the engine's active list */
    /* send */
    struct tx_pkt *win;
    uint32_t snd_una, snd_nxt, high_sack;
    int have_sack;
    struct nic_msg *sq_head, *sq_tail;
    uint32_t msg_id_next;
    uint64_t inflight_bytes;    /* all planes */
    struct nic_cc cc[ETHP_NIC_MAX_PLANES]; /* one window per plane (a sub-flow) */
    uint64_t rto_ns, rto_deadline;
    uint32_t timeouts;
    uint32_t n_lost;
    uint64_t retx_due_ns; /* when a lost packet pump() passed over may go */
    uint64_t reo_ns; /* reordering window of the loss detector (RACK-like) */
    uint64_t rnr_until; /* the peer said "not ready": resend after this */
    uint64_t rnr_backoff_ns;
    uint32_t rnr_rounds;
    int rnr_since_progress;
    /* rccc: what the receiver lets us have in flight (all planes), and its
     * share per plane; UINT64_MAX per plane without receiver credits */
    uint64_t credit_bytes, credit_sub_bytes;
    /* recv */
    uint32_t rcv_nxt;
    uint8_t *rbits;
    struct nic_msg *rq_head, *rq_tail; /* posted, not yet bound */
    struct nic_msg *bound[64];
    int ack_pending, ce_seen, dup_seen;
    uint32_t last_psn; /* the newest data PSN placed */
    uint32_t ack_count, ts_echo;
    uint16_t ev_echo;
    int int_have;                    /* hpcc: int_echo holds the newest packet's INT block */
    uint8_t int_echo[ETHP_INT_BYTES];
    /* recv: whole messages of at most NIC_EAGER_BYTES that came before a
     * receive for their tag was posted, kept (in order) for the next one:
     * the always-posted buffer a NIC keeps for control messages (NCCL's
     * clear-to-send FIFO), so that a rendezvous' "ready" to a rank not yet
     * in the collective is not turned away (RoCE would go back N for it) */
    struct {
        uint32_t tag;
        uint32_t len;
        uint8_t data[NIC_EAGER_BYTES];
    } eager[NIC_EAGER_SLOTS];
    uint32_t n_eager;
    struct nic_qp qp[ETHP_NIC_MAX_PLANES]; /* roce */
    uint32_t qp_ack_mask;                  /* roce: QPs owing a cumulative ack */
    uint32_t rx_open; /* recv: messages from it under way (bound, not complete) */
    uint32_t epoch;    /* its incarnation as last heard (0: never heard from it) */
    uint64_t hello_ns; /* when we last told it ours (at most one a base RTT) */
    uint64_t c[ETHP_NIC_NCOUNTERS];
};

struct nic_port {
    int ifindex;
    uint8_t mac[6], gw_mac[6];
    uint32_t ip;
    uint64_t next_tx_ns, paused_until;
    uint64_t avoid_until; /* marked, trimmed or lost here lately (adaptive); failed (both) */
    uint32_t fails;       /* loss events in a row (at most one per base RTT) */
    uint64_t fail_counted_ns;
    int up;
    struct ethp_pkt *txq[NIC_BURST];
    uint32_t ntx;
};

/* In-network all-reduce: one aggregator (a switch) and the chunks in flight
 * there.  Chunk sequence numbers (psn) run on across calls, so a slot there
 * is reused only once its last chunk's result is in. */
struct inc_agg {
    uint32_t id, plane;
    uint32_t group, members, index; /* this stream's group, and our place in it there */
    uint32_t una_psn, next_psn; /* results missing for [una, next) */
    uint32_t resend_psn;        /* after a timeout: resend from here up to next */
    uint64_t next_chunk;        /* the running call's next chunk for this aggregator */
    uint64_t *chunk;            /* window entries: chunk index + 1 while its result is out */
    uint64_t deadline_ns, rto_ns;
    uint32_t timeouts;
};

struct nic_inc {
    uint32_t window, n_aggs;
    struct inc_agg agg[ETHP_NIC_MAX_PLANES];
    struct nic_msg *head, *tail; /* posted calls; the head is running */
    uint32_t elem_bytes, chunk_bytes;
    uint64_t n_chunks, done_chunks;
};

struct ethp_nic {
    struct ethp_nic_cfg cfg;
    struct nic_inc inc;
    const struct ethp_cc_ops *cc;
    int credits;         /* rccc: windows capped by the receivers' grants */
    uint32_t epoch;      /* this endpoint's incarnation, in every frame it sends */
    uint64_t bdp_bytes;  /* of all planes: rate x planes x base RTT */
    uint32_t data_bytes; /* payload per data packet */
    struct ethp_nic_io io; /* its frames in and out: a port, or an in-memory fabric */
    struct ethp_pool *pool;
    int epfd, evfd, udp_fd;
    struct nic_port ports[ETHP_NIC_MAX_PLANES];
    uint32_t n_ports;
    struct nic_peer *peers;
    uint32_t max_peers;
    /* Peers with something to send, to resend, to ack or a timer running:
     * the loop and the wake-up deadline look at these only. */
    uint32_t *active;
    uint32_t n_active;
    uint32_t rr; /* which active peer is served first on the next pass */
    uint64_t rng;
    pthread_t thread;
    int started, stop;
    /* posted from other threads */
    pthread_mutex_t lock;
    pthread_cond_t done;
    struct nic_msg *cmd_head, *cmd_tail;
    struct nic_msg **msgs;
    uint64_t n_msgs, cap_msgs;
    uint64_t c[ETHP_NIC_NCOUNTERS];
    /* the lab's fabric clock: cfg is cfg0 at the clock's k (nic_rescale) */
    struct ethp_clock *clock;
    uint64_t clock_gen, ring_drops_reported, ring_drops_read_ns;
    uint64_t ahead_ns; /* port_ahead_ns at cfg's rate (set_ahead) */
    struct ethp_nic_cfg cfg0;
};

#define ETHP_X_NAME(name, help) #name,
static const char *const nic_names[] = {ETHP_NIC_COUNTERS(ETHP_X_NAME)};
#undef ETHP_X_NAME
uint32_t ethp_nic_counter_count(void) { return ETHP_NIC_NCOUNTERS; }
const char *ethp_nic_counter_name(uint32_t i)
{
    return i < ETHP_NIC_NCOUNTERS ? nic_names[i] : NULL;
}

static void activate(struct ethp_nic *n, struct nic_peer *p)
{
    if (!p->active) {
        p->active = 1;
        n->active[n->n_active++] = (uint32_t)(p - n->peers);
    }
}

static int peer_busy(const struct nic_peer *p)
{
    return p->sq_head || p->n_lost || p->snd_una != p->snd_nxt || p->ack_pending ||
           p->rto_deadline;
}

static uint64_t rnd64(struct ethp_nic *n) { return ethp_rng_next(&n->rng); }

static void count(struct ethp_nic *n, struct nic_peer *p, int c, uint64_t v)
{
    n->c[c] += v;
    if (p)
        p->c[c] += v;
}

/* ---------------------------------------------------------------- completion */

static void complete(struct ethp_nic *n, struct nic_msg *m, int status)
{
    pthread_mutex_lock(&n->lock);
    m->status = status;
    pthread_cond_broadcast(&n->done);
    pthread_mutex_unlock(&n->lock);
    if (status == ETHP_NIC_OK && !m->inc)
        n->c[m->is_send ? ETHP_NC_msgs_sent : ETHP_NC_msgs_received]++;
}

/* ---------------------------------------------------------------- transmit */

static uint64_t ser_ns(const struct ethp_nic *n, uint32_t frame_bytes)
{
    return (uint64_t)ethp_wire_bytes(frame_bytes) * 8000000000ull / n->cfg.rate_bps;
}

/* SACK-inferred loss waits this long past a packet's send: half a base RTT,
 * at least twice the unscaled part of it (4 ms in a lab: this machine
 * reorders sprayed packets by a few ms, 1 ms ring timers per hop and late
 * thread wake-ups per plane; nothing on the in-memory fabric). */
static uint64_t reorder_window_ns(const struct ethp_nic_cfg *c)
{
    uint64_t floor = 2 * c->unscaled_rtt_ns;
    return c->base_rtt_ns / 2 > floor ? c->base_rtt_ns / 2 : floor;
}

/* When a pacer that was due at next_tx_ns lets a packet start, at now: the
 * switch's bounded burst, a late thread may make up NIC_CATCHUP_NS of the
 * time it lost while packets wait; a pacer idle longer earns no credit. */
static uint64_t pacer_start(uint64_t next_tx_ns, uint64_t now)
{
    return next_tx_ns + NIC_CATCHUP_NS < now ? now : next_tx_ns;
}

static void flush_port(struct ethp_nic *n, struct nic_port *pt)
{
    uint32_t done = 0;
    while (done < pt->ntx) {
        uint32_t k = n->io.tx(n->io.ctx, pt->txq + done, pt->ntx - done, pt->ifindex);
        if (!k) {
            n->c[ETHP_NC_tx_again]++;
            n->io.wait_tx(n->io.ctx, 1);
            continue;
        }
        done += k;
    }
    ethp_pool_put(n->pool, pt->txq, pt->ntx);
    pt->ntx = 0;
}

/* Build and queue one frame.  int_block: the INT block to carry (an ack's
 * echo), or NULL for an empty one (a data packet's, with ETHP_F_INT).
 * Returns the frame's length or a negative error. */
static int emit(struct ethp_nic *n, uint32_t plane, const struct ethp_l2l3 *a,
                const struct ethp_hdr_fields *h, const uint8_t *payload, uint32_t len,
                const uint8_t *int_block)
{
    struct nic_port *pt = &n->ports[plane];
    struct ethp_pkt *k;
    if (ethp_pool_get(n->pool, &k, 1) != 1)
        return -ENOBUFS;
    int fl = n->cfg.compact ? ethp_build_compact(k->data, k->cap, a, h, payload, len)
                            : ethp_build_udp(k->data, k->cap, a, h, payload, len);
    if (fl < 0) {
        ethp_pool_put(n->pool, &k, 1);
        return fl;
    }
    k->len = (uint32_t)fl;
    if (int_block && (h->flags & ETHP_F_INT))
        memcpy(k->data + fl - len - ETHP_INT_BYTES, int_block, ETHP_INT_BYTES);
    pt->next_tx_ns = pacer_start(pt->next_tx_ns, ethp_now_ns()) + ser_ns(n, (uint32_t)fl);
    pt->txq[pt->ntx++] = k;
    if (pt->ntx == NIC_BURST)
        flush_port(n, pt);
    return fl;
}

/* A frame's addresses out of a plane's port to dst_ip (a peer's port on
 * that plane, or an aggregator). */
static void addr_to(struct ethp_nic *n, uint32_t plane, uint32_t dst_ip, uint16_t ev,
                    struct ethp_l2l3 *a)
{
    const struct nic_port *pt = &n->ports[plane];
    memset(a, 0, sizeof(*a));
    memcpy(a->dst_mac, pt->gw_mac, 6);
    memcpy(a->src_mac, pt->mac, 6);
    a->src_ip = pt->ip;
    a->dst_ip = dst_ip;
    a->src_port = (uint16_t)(0xC000 | (ev & 0x3fff)); /* entropy in the UDP source port */
    a->dst_port = n->cfg.roce ? ETHP_ROCE_UDP_PORT : ETHP_UDP_PORT;
    a->tos = 0x02; /* ECT(0) */
    a->ttl = 64;
}

static void addr_for(struct ethp_nic *n, uint32_t plane, const struct nic_peer *p, uint16_t ev,
                     struct ethp_l2l3 *a)
{
    addr_to(n, plane, p->ip[plane], ev, a);
}

/* ---------------------------------------------------------------- receiver credits */

/* A message from p got under way here (its first packet bound it to a
 * posted receive), or finished: p is one of this receiver's senders while
 * any is under way.  (One that failed for a too-small buffer stays bound,
 * and counted, as its packets keep coming.) */
static void rx_open(struct ethp_nic *n, struct nic_peer *p, int delta)
{
    uint32_t before = p->rx_open;
    p->rx_open += (uint32_t)delta;
    if (!before && p->rx_open)
        n->c[ETHP_NC_rx_senders]++; /* the grants' divisor */
    else if (before && !p->rx_open)
        n->c[ETHP_NC_rx_senders]--;
}

/* The receiver's grant to each of its senders (every ack and NACK carries
 * it): its own BDP over all planes, shared equally among the peers with a
 * message under way, so that an incast keeps about what its downlinks carry
 * in one base RTT in flight towards it, whatever the fan-in, and queues
 * little in the fabric. */
static uint32_t rx_grant(struct ethp_nic *n)
{
    uint64_t senders = n->c[ETHP_NC_rx_senders] ? n->c[ETHP_NC_rx_senders] : 1;
    uint64_t g = n->bdp_bytes / senders, floor = (uint64_t)n->cfg.payload_bytes * n->n_ports;
    g = g > floor ? g : floor;
    return g > UINT32_MAX ? UINT32_MAX : (uint32_t)g;
}

static void rotation(const struct ethp_nic *n, uint64_t *now, uint32_t *up, uint32_t *live);

/* A sender takes the grant an ack or NACK from p carries, shared over the
 * planes it sends on (a lost plane's share goes to the others). */
static void set_credit(struct ethp_nic *n, struct nic_peer *p, uint64_t credit_bytes)
{
    if (!n->credits || !credit_bytes)
        return;
    uint64_t now;
    uint32_t up, live;
    rotation(n, &now, &up, &live);
    uint32_t planes = live ? live : up ? up : 1;
    uint64_t sub = credit_bytes / planes;
    p->credit_bytes = credit_bytes;
    p->credit_sub_bytes = sub > n->cfg.payload_bytes ? sub : n->cfg.payload_bytes;
}

static void send_ctl(struct ethp_nic *n, struct nic_peer *p, uint8_t op, uint32_t psn,
                     uint32_t aux, uint8_t flags, uint32_t ts, uint16_t ev, const uint8_t *body,
                     uint32_t len)
{
    uint32_t plane = ev % n->n_ports;
    for (uint32_t i = 0; i < n->n_ports && !n->ports[plane].up; i++)
        plane = (plane + 1) % n->n_ports;
    struct ethp_l2l3 a;
    addr_for(n, plane, p, ev, &a);
    struct ethp_hdr_fields h = {.opcode = op, .flags = flags, .entropy = ev,
                                .src_ep = (uint16_t)n->cfg.ep, .dst_ep = (uint16_t)p->ep,
                                .psn = psn, .offset_bytes = aux, .len_bytes = (uint16_t)len,
                                .tos = 0x02, .ts_ns = ts, .src_epoch = n->epoch,
                                .dst_epoch = p->epoch};
    if (!n->cfg.roce && (op == ETHP_OP_ACK || op == ETHP_OP_NACK))
        h.tag = rx_grant(n); /* receiver credits */
    emit(n, plane, &a, &h, body, len, p->int_echo);
}

static void add_inflight(struct nic_peer *p, const struct tx_pkt *t)
{
    p->inflight_bytes += t->len;
    p->cc[t->sub].inflight += t->len;
}

static void sub_inflight(struct nic_peer *p, const struct tx_pkt *t)
{
    p->inflight_bytes -= t->len;
    p->cc[t->sub].inflight -= t->len;
}

static int has_window(const struct nic_peer *p, uint32_t plane)
{
    uint64_t inflight = p->cc[plane].inflight;
    return inflight < p->cc[plane].st.cwnd_bytes && inflight < p->credit_sub_bytes;
}

/* The in-flight packet psn, now marked lost; NULL if it was not in flight. */
static struct tx_pkt *mark_lost(struct nic_peer *p, uint32_t psn)
{
    if (!p->win || psn - p->snd_una >= p->snd_nxt - p->snd_una)
        return NULL;
    struct tx_pkt *t = &p->win[psn % NIC_WIN];
    if (t->state != PKT_INFLIGHT)
        return NULL;
    sub_inflight(p, t);
    t->state = PKT_LOST;
    p->n_lost++;
    return t;
}

static void avoid_plane(struct ethp_nic *n, uint32_t plane, uint64_t now)
{
    if (plane < n->n_ports)
        n->ports[plane].avoid_until = now + n->cfg.base_rtt_ns;
}

/* A plane that loses packets again and again (a failed switch, a dead
 * link) is taken out of the rotation for one base RTT, doubling per loss
 * event (at most one per base RTT) up to 64, and from the second event on
 * its packets in flight are resent elsewhere at once: a failure costs a few
 * RTTs, not a retransmit timeout per message.  An unmarked ack of a packet
 * sent there puts it back.  Both spraying modes do this: oblivious spraying
 * is blind to load, not to a dead path (before, a dead plane held an
 * oblivious sender's round robin back until timeouts freed its window, and
 * a 64 MiB transfer took 100 s instead of 4).  RoCE's queue pairs keep their
 * one path each, as RoCE does. */
static int plane_failed(const struct nic_port *pt, uint64_t now)
{
    return pt->fails >= 2 && pt->avoid_until > now;
}

static void plane_lost(struct ethp_nic *n, uint32_t plane, uint64_t now)
{
    if (n->cfg.roce || plane >= n->n_ports)
        return;
    struct nic_port *pt = &n->ports[plane];
    if (pt->fails && now - pt->fail_counted_ns < n->cfg.base_rtt_ns)
        return;
    pt->fail_counted_ns = now;
    uint32_t f = ++pt->fails < 6 ? pt->fails : 6;
    pt->avoid_until = now + (n->cfg.base_rtt_ns << f);
    if (pt->fails < 2)
        return;
    n->c[ETHP_NC_plane_failures]++;
    for (uint32_t k = 0; k < n->n_active; k++) {
        struct nic_peer *p = &n->peers[n->active[k]];
        for (uint32_t psn = p->snd_una; p->win && psn != p->snd_nxt; psn++)
            if (p->win[psn % NIC_WIN].state == PKT_INFLIGHT && p->win[psn % NIC_WIN].plane == plane)
                mark_lost(p, psn);
    }
}

/* The rotation a sender sprays over: the planes that are up and not
 * failing (all that are up if every one is failing).  Counts both; the
 * clock goes in *now only when some plane is failing (no clock read per
 * packet when all is well), else 0. */
static void rotation(const struct ethp_nic *n, uint64_t *now, uint32_t *up, uint32_t *live)
{
    int any_failing = 0;
    for (uint32_t i = 0; i < n->n_ports; i++)
        any_failing |= n->ports[i].fails >= 2;
    *now = any_failing ? ethp_now_ns() : 0;
    *up = *live = 0;
    for (uint32_t i = 0; i < n->n_ports; i++) {
        *up += n->ports[i].up != 0;
        *live += n->ports[i].up && !plane_failed(&n->ports[i], *now);
    }
}

static uint32_t pick_plane(struct ethp_nic *n, const struct nic_peer *p, uint32_t psn,
                           int for_send)
{
    /* Oblivious: strict round robin over the planes that are up; a plane
     * whose window is full holds the rest back.  Adaptive (REPS-like): the
     * plane that frees first among those with window and no recent ECN mark,
     * trim or loss; any plane with window if all had one. */
    uint32_t best = UINT32_MAX;
    if (n->cfg.adaptive) {
        uint64_t now = ethp_now_ns(), t = UINT64_MAX, t_any = UINT64_MAX;
        uint32_t any = UINT32_MAX;
        for (uint32_t i = 0; i < n->n_ports; i++) {
            const struct nic_port *pt = &n->ports[i];
            if (!pt->up || !has_window(p, i))
                continue;
            if (pt->next_tx_ns < t_any) {
                t_any = pt->next_tx_ns;
                any = i;
            }
            if (pt->avoid_until <= now && pt->next_tx_ns < t) {
                t = pt->next_tx_ns;
                best = i;
            }
        }
        if (best == UINT32_MAX)
            return any;
        if (for_send && best != any)
            n->c[ETHP_NC_plane_avoided]++;
        return best;
    }
    uint64_t now;
    uint32_t up, live;
    rotation(n, &now, &up, &live);
    if (!up)
        return UINT32_MAX;
    uint32_t k = psn % (live ? live : up);
    for (uint32_t i = 0; i < n->n_ports; i++)
        if (n->ports[i].up && !(live && plane_failed(&n->ports[i], now)) && k-- == 0)
            return has_window(p, i) ? i : UINT32_MAX;
    return UINT32_MAX;
}

#define NIC_LOOKAHEAD_NS 20000ull

/* A sub-flow's rate pacer: when it lets the next packet go, a lookahead early. */
static uint64_t sub_free_at(const struct nic_peer *p, uint32_t sub)
{
    uint64_t t = p->cc[sub].next_tx_ns;
    return t > NIC_LOOKAHEAD_NS ? t - NIC_LOOKAHEAD_NS : 0;
}

/* How early a pacer lets a packet go (ETHP_AHEAD_WIRE_BYTES): the engine
 * wakes when a packet is due, a lookahead early, and then sends what is
 * due within this. */
static uint64_t port_ahead_ns(const struct ethp_nic *n) { return n->ahead_ns; }

/* ... computed once per rate (start, a change of k), not per packet */
static void set_ahead(struct ethp_nic *n)
{
    uint64_t t = (uint64_t)ETHP_AHEAD_WIRE_BYTES * 8000000000ull / n->cfg.rate_bps;
    n->ahead_ns = t > NIC_LOOKAHEAD_NS ? t : NIC_LOOKAHEAD_NS;
}

static int sub_free(const struct ethp_nic *n, const struct nic_peer *p, uint32_t sub, uint64_t now)
{
    return p->cc[sub].next_tx_ns <= now + port_ahead_ns(n);
}

static int port_free(const struct ethp_nic *n, uint32_t plane, uint64_t now)
{
    const struct nic_port *pt = &n->ports[plane];
    return pt->up && now >= pt->paused_until && pt->next_tx_ns <= now + port_ahead_ns(n);
}

/* A retransmission goes out on the up plane that frees first, other than
 * the one that lost it when there is a choice. */
static uint32_t retx_plane(const struct ethp_nic *n, uint32_t old)
{
    uint32_t best = UINT32_MAX;
    uint64_t t = UINT64_MAX;
    uint64_t now = ethp_now_ns();
    /* leave out planes taken out (adaptive) or failing (both), if any other
     * is left */
    int healthy = 0;
    for (uint32_t i = 0; i < n->n_ports; i++)
        healthy += n->ports[i].up && !n->ports[i].fails &&
                   (!n->cfg.adaptive || n->ports[i].avoid_until <= now);
    for (uint32_t i = 0; i < n->n_ports; i++) {
        const struct nic_port *pt = &n->ports[i];
        if (healthy && (pt->fails || (n->cfg.adaptive && pt->avoid_until > now)))
            continue;
        uint64_t free_at = pt->next_tx_ns > pt->paused_until ? pt->next_tx_ns : pt->paused_until;
        if (pt->up && (i != old || best == UINT32_MAX) && (free_at < t || best == old)) {
            t = free_at;
            best = i;
        }
    }
    return best;
}

static int send_pkt(struct ethp_nic *n, struct nic_peer *p, uint32_t psn, uint32_t plane,
                    uint64_t now)
{
    struct tx_pkt *t = &p->win[psn % NIC_WIN];
    /* The entropy value carries the plane in its low 4 bits, so an ack that
     * echoes it says which plane the acked packet took.  A RoCE QP keeps its
     * own, so that its packets keep one path. */
    if (n->cfg.roce && !n->cfg.roce_spray)
        t->ev = p->qp[psn % n->cfg.qps].ev;
    else
        t->ev = (uint16_t)((rnd64(n) % n->cfg.n_evs) << 4 | plane);
    t->plane = (uint8_t)plane;
    t->sent_ns = now;
    struct ethp_l2l3 a;
    addr_for(n, plane, p, t->ev, &a);
    uint8_t flags = (n->cfg.roce ? 0 : ETHP_F_TRIMMABLE) | (t->last ? ETHP_F_LAST : 0) |
                    (t->retx ? ETHP_F_RETX : 0) | (n->cc->on_int ? ETHP_F_INT : 0);
    struct ethp_hdr_fields h = {.opcode = ETHP_OP_DATA, .flags = flags, .entropy = t->ev,
                                .src_ep = (uint16_t)n->cfg.ep, .dst_ep = (uint16_t)p->ep,
                                .msg_id = t->m->msg_id, .psn = psn, .offset_bytes = t->off,
                                .tag = t->m->tag, .len_bytes = t->len, .tos = 0x02,
                                .ts_ns = (uint32_t)now, .src_epoch = n->epoch,
                                .dst_epoch = p->epoch};
    int fl = 0; /* the frame's length; 0: dropped by fault injection */
    if (n->cfg.drop_psn_plus1 && psn + 1 == n->cfg.drop_psn_plus1 && !t->retx) {
        n->cfg.drop_psn_plus1 = 0; /* lost on the wire, once */
        count(n, p, ETHP_NC_tx_injected_drops, 1);
    } else {
        fl = emit(n, plane, &a, &h, t->m->buf + t->off, t->len, NULL);
    }
    if (fl < 0)
        return fl;
    count(n, p, ETHP_NC_tx_data_pkts, 1);
    count(n, p, ETHP_NC_tx_data_bytes, t->len);
    /* the sub-flow's rate pacer: DCQCN's rate, HPCC's W / T */
    struct nic_cc *c = &p->cc[t->sub];
    if (c->st.rate_bps && fl)
        c->next_tx_ns = pacer_start(c->next_tx_ns, now) +
                        ser_ns(n, (uint32_t)fl) * n->cfg.rate_bps / c->st.rate_bps;
    if (n->cfg.roce)
        p->qp[psn % n->cfg.qps].sent_bytes += t->len;
    if (!p->rto_deadline)
        p->rto_deadline = now + p->rto_ns;
    return 0;
}

/* Cut the next packet off the send queue as PSN snd_nxt, in flight on plane
 * (window sub), and send it. */
static void send_new(struct ethp_nic *n, struct nic_peer *p, uint32_t plane, uint32_t sub,
                     uint64_t now)
{
    struct nic_msg *m = p->sq_head;
    uint32_t len = (uint32_t)(m->len - m->next_off < n->data_bytes ? m->len - m->next_off
                                                                   : n->data_bytes);
    uint32_t psn = p->snd_nxt++;
    struct tx_pkt *t = &p->win[psn % NIC_WIN];
    *t = (struct tx_pkt){.m = m, .off = (uint32_t)m->next_off, .len = (uint16_t)len,
                         .state = PKT_INFLIGHT, .plane = (uint8_t)plane, .sub = (uint8_t)sub};
    m->next_off += len;
    t->last = m->next_off >= m->len;
    if (t->last) {
        p->sq_head = m->next;
        if (!p->sq_head)
            p->sq_tail = NULL;
    }
    add_inflight(p, t);
    send_pkt(n, p, psn, plane, now);
}

/* Put lost packet psn back in flight on plane (window sub) and resend it;
 * 0 if the frame went out. */
static int resend(struct ethp_nic *n, struct nic_peer *p, uint32_t psn, uint32_t plane,
                  uint32_t sub, uint64_t now)
{
    struct tx_pkt *t = &p->win[psn % NIC_WIN];
    t->retx = 1;
    t->state = PKT_INFLIGHT;
    p->n_lost--;
    t->plane = (uint8_t)plane;
    t->sub = (uint8_t)sub;
    add_inflight(p, t);
    int rc = send_pkt(n, p, psn, plane, now);
    if (rc == 0) {
        count(n, p, ETHP_NC_retx_pkts, 1);
        count(n, p, ETHP_NC_retx_bytes, t->len);
    }
    return rc;
}

/* roce: the plane a packet of QP q takes: its own, unless spraying, when
 * a QP's successive packets rotate over the planes */
static uint32_t roce_plane(const struct ethp_nic *n, uint32_t psn)
{
    uint32_t q = psn % n->cfg.qps;
    if (!n->cfg.roce_spray)
        return q % n->n_ports;
    return (q + psn / n->cfg.qps) % n->n_ports;
}

static int qp_ready(const struct ethp_nic *n, const struct nic_peer *p, uint32_t psn,
                    uint64_t now)
{
    uint32_t q = psn % n->cfg.qps;
    return port_free(n, roce_plane(n, psn), now) && sub_free(n, p, q, now) &&
           p->cc[q].inflight < p->cc[q].st.cwnd_bytes;
}

static void pump_roce(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    uint32_t blocked = 0; /* QPs that cannot send now: their later PSNs wait */
    for (uint32_t psn = p->snd_una; p->n_lost && now >= p->rnr_until && psn != p->snd_nxt;
         psn++) {
        struct tx_pkt *t = &p->win[psn % NIC_WIN];
        uint32_t q = psn % n->cfg.qps;
        if (t->state != PKT_LOST || (blocked & (1u << q)))
            continue;
        if (!qp_ready(n, p, psn, now)) {
            blocked |= 1u << q;
            continue;
        }
        if (resend(n, p, psn, roce_plane(n, psn), psn % n->cfg.qps, now) == 0)
            count(n, p, ETHP_NC_retx_gbn, 1);
    }
    if (p->n_lost && now < p->rnr_until)
        return;
    while (p->sq_head && p->snd_nxt - p->snd_una < NIC_WIN) {
        uint32_t psn = p->snd_nxt;
        if ((blocked & (1u << (psn % n->cfg.qps))) || !qp_ready(n, p, psn, now))
            return;
        send_new(n, p, roce_plane(n, psn), psn % n->cfg.qps, now);
    }
}

/* when plane's pacer frees (or its pause ends) */
static uint64_t free_at(const struct ethp_nic *n, uint32_t plane);

static void pump(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    if (n->cfg.roce) {
        pump_roce(n, p, now);
        return;
    }
    /* retransmissions first (unless the peer asked us to wait), in PSN
     * order; one waiting for a plane other than the one that lost it does
     * not hold up a later one whose plane is free now */
    uint32_t all = (1u << n->n_ports) - 1, busy = 0; /* planes known not free now */
    uint32_t waiting = 0;                              /* lost packets passed over */
    p->retx_due_ns = UINT64_MAX;
    for (uint32_t psn = p->snd_una;
         p->n_lost > waiting && now >= p->rnr_until && psn != p->snd_nxt; psn++) {
        struct tx_pkt *t = &p->win[psn % NIC_WIN];
        if (t->state != PKT_LOST)
            continue;
        uint32_t plane = retx_plane(n, t->plane);
        if (plane == UINT32_MAX)
            return;
        if ((busy >> plane & 1) || !port_free(n, plane, now)) {
            /* it took the plane freeing first: the others but its old one
             * are not free either */
            busy |= (all & ~(1u << t->plane)) | 1u << plane;
            if (free_at(n, plane) < p->retx_due_ns)
                p->retx_due_ns = free_at(n, plane);
            if (busy == all) { /* the rest wait too: wake when a plane frees */
                for (uint32_t i = 0; i < n->n_ports; i++)
                    if (n->ports[i].up && free_at(n, i) < p->retx_due_ns)
                        p->retx_due_ns = free_at(n, i);
                return;
            }
            waiting++;
            continue;
        }
        uint64_t nacked = t->nacked_ns;
        t->nacked_ns = 0;
        if (resend(n, p, psn, plane, plane, now) == 0) {
            if (nacked && now - nacked > p->c[ETHP_NC_nack_retx_max_ns]) {
                p->c[ETHP_NC_nack_retx_max_ns] = now - nacked;
                if (now - nacked > n->c[ETHP_NC_nack_retx_max_ns])
                    n->c[ETHP_NC_nack_retx_max_ns] = now - nacked;
            }
        }
    }
    if (waiting)
        return; /* new packets wait for the lost ones, as they did */
    /* new packets, each on its plane when that plane's pacer is free */
    while (p->sq_head && p->snd_nxt - p->snd_una < NIC_WIN) {
        uint32_t plane = pick_plane(n, p, p->snd_nxt, 1);
        if (plane == UINT32_MAX || !port_free(n, plane, now) || !sub_free(n, p, plane, now))
            return;
        send_new(n, p, plane, plane, now);
    }
}

/* ---------------------------------------------------------------- congestion control */

static struct ethp_cc_params cc_params(const struct ethp_nic *n)
{
    const struct ethp_nic_cfg *c = &n->cfg;
    return (struct ethp_cc_params){
        .mss_bytes = c->payload_bytes,
        .max_cwnd_bytes = c->max_cwnd_bytes / (c->roce ? c->qps : n->n_ports),
        .base_rtt_ns = c->base_rtt_ns, .line_rate_bps = c->rate_bps, .timer_ns = c->dcqcn_timer_ns,
        .byte_counter_bytes = c->dcqcn_byte_counter_bytes, .g_inv = c->dcqcn_g_inv,
        .rai_bps = c->dcqcn_rai_bps, .rhai_bps = c->dcqcn_rhai_bps,
        .min_rate_bps = c->dcqcn_min_rate_bps, .f = c->dcqcn_f};
}

/* ---------------------------------------------------------------- receive */

static struct nic_peer *peer_of(struct ethp_nic *n, uint32_t ep)
{
    return ep < n->max_peers && n->peers[ep].known ? &n->peers[ep] : NULL;
}

static void send_ack_roce(struct ethp_nic *n, struct nic_peer *p)
{
    /* cumulative per QP: the next PSN expected there, the QP in aux */
    for (uint32_t q = 0; q < n->cfg.qps; q++)
        if (p->qp_ack_mask & (1u << q)) {
            send_ctl(n, p, ETHP_OP_ACK, p->qp[q].rcv_nxt, q, 0, p->ts_echo, p->qp[q].ev, NULL, 0);
            count(n, p, ETHP_NC_tx_acks, 1);
        }
    p->qp_ack_mask = 0;
    p->ack_pending = 0;
    p->ack_count = 0;
}

static void send_ack(struct ethp_nic *n, struct nic_peer *p)
{
    if (n->cfg.roce) {
        send_ack_roce(n, p);
        return;
    }
    /* The SACK window starts right after the cumulative PSN, unless the
     * newest arrival lies beyond it: then it ends at the newest arrival, so
     * every packet is SACKed by the ack it draws even when a slow plane
     * holds the cumulative PSN back by hundreds of packets. */
    uint32_t base = p->rcv_nxt + 1;
    if ((int32_t)(p->last_psn - base) >= (int32_t)NIC_SACK_BITS)
        base = p->last_psn - (NIC_SACK_BITS - 1);
    uint8_t body[8];
    uint64_t bits = 0;
    for (uint32_t i = 0; i < NIC_SACK_BITS; i++) {
        uint32_t psn = base + i;
        if (p->rbits[(psn % NIC_RWIN) / 8] & (1u << (psn % 8)))
            bits |= 1ull << i;
    }
    for (int i = 0; i < 8; i++)
        body[i] = (uint8_t)(bits >> (56 - 8 * i));
    /* RETX on an ack: a duplicate arrived, the sender's loss guess was wrong */
    uint8_t flags = (p->ce_seen ? ETHP_F_ECN_ECHO : 0) | (p->dup_seen ? ETHP_F_RETX : 0) |
                    (p->int_have ? ETHP_F_INT : 0);
    send_ctl(n, p, ETHP_OP_ACK, p->rcv_nxt, base, flags, p->ts_echo, p->ev_echo, body, 8);
    count(n, p, ETHP_NC_tx_acks, 1);
    p->ack_pending = 0;
    p->ack_count = 0;
    p->ce_seen = 0;
    p->dup_seen = 0;
}

/* The posted receive a data packet belongs to: the message its msg_id is
 * bound to, else the first receive posted for its tag, bound now.  NULL
 * when none is posted (*refused 0) or when the msg_id is bound to a message
 * of another tag (*refused 1: forged or broken, counted). */
static struct nic_msg *bind_msg(struct ethp_nic *n, struct nic_peer *p, uint32_t msg_id,
                                uint32_t tag, int *refused)
{
    *refused = 0;
    for (int i = 0; i < 64; i++)
        if (p->bound[i] && p->bound[i]->msg_id == msg_id) {
            if (p->bound[i]->tag == tag)
                return p->bound[i];
            count(n, p, ETHP_NC_rx_malformed, 1);
            *refused = 1;
            return NULL;
        }
    struct nic_msg *prev = NULL;
    for (struct nic_msg *m = p->rq_head; m; prev = m, m = m->next) {
        if (m->tag != tag)
            continue;
        for (int i = 0; i < 64; i++) {
            if (p->bound[i])
                continue;
            if (prev)
                prev->next = m->next;
            else
                p->rq_head = m->next;
            if (p->rq_tail == m)
                p->rq_tail = prev;
            m->next = NULL;
            m->msg_id = msg_id;
            m->bound = 1;
            p->bound[i] = m;
            rx_open(n, p, 1);
            return m;
        }
        return NULL;
    }
    return NULL;
}

/* A message with no receive posted for its tag: keep it if it is whole in
 * this one packet, small, and a slot is free (1), else 0 (the caller says
 * receiver-not-ready).  Its length is the packet's, checked whole. */
static int keep_eager(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                      const uint8_t *payload)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    if (!(h->flags & ETHP_F_LAST) || h->offset_bytes || ps->payload_bytes != h->len_bytes ||
        h->len_bytes > NIC_EAGER_BYTES || p->n_eager >= NIC_EAGER_SLOTS)
        return 0;
    for (struct nic_msg *m = p->rq_head; m; m = m->next)
        if (m->tag == h->tag)
            return 0; /* posted, but no slot to bind it: it waits for one */
    p->eager[p->n_eager].tag = h->tag;
    p->eager[p->n_eager].len = h->len_bytes;
    memcpy(p->eager[p->n_eager].data, payload, h->len_bytes);
    p->n_eager++;
    count(n, p, ETHP_NC_rx_data_bytes, h->len_bytes);
    count(n, p, ETHP_NC_rx_data_pkts, 1);
    return 1;
}

/* A receive just posted: the oldest kept message of its tag completes it
 * (1), or there is none (0). */
static int take_eager(struct ethp_nic *n, struct nic_peer *p, struct nic_msg *m)
{
    for (uint32_t i = 0; i < p->n_eager; i++) {
        if (p->eager[i].tag != m->tag)
            continue;
        uint32_t len = p->eager[i].len;
        if (len > m->len) {
            complete(n, m, ETHP_NIC_ERR_TOO_SMALL);
        } else {
            memcpy(m->buf, p->eager[i].data, len);
            m->done_bytes = m->total = len;
            complete(n, m, ETHP_NIC_OK);
        }
        p->n_eager--;
        memmove(&p->eager[i], &p->eager[i + 1], (p->n_eager - i) * sizeof(p->eager[0]));
        return 1;
    }
    return 0;
}

static void unbind(struct ethp_nic *n, struct nic_peer *p, struct nic_msg *m)
{
    for (int i = 0; i < 64; i++)
        if (p->bound[i] == m) {
            p->bound[i] = NULL;
            rx_open(n, p, -1);
        }
}

/* A data frame's payload must be whole: exactly len_bytes, present in the
 * frame (a trimmed packet is answered, never placed).  Returns 0 and counts
 * the frame as malformed otherwise. */
static int payload_whole(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps)
{
    if (!(ps->hdr.flags & ETHP_F_TRIMMED) && ps->payload_bytes == ps->hdr.len_bytes)
        return 1;
    count(n, p, ETHP_NC_rx_malformed, 1);
    return 0;
}

static void place(struct ethp_nic *n, struct nic_peer *p, struct nic_msg *m,
                  const struct ethp_parsed *ps, const uint8_t *payload)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    if (m->status != ETHP_NIC_PENDING) {
        /* a message that already failed (buffer too small): swallow the rest */
    } else if ((uint64_t)h->offset_bytes + h->len_bytes > m->len) {
        complete(n, m, ETHP_NIC_ERR_TOO_SMALL); /* stays bound: its packets keep coming */
    } else {
        memcpy(m->buf + h->offset_bytes, payload, ps->payload_bytes); /* == len_bytes */
        m->done_bytes += h->len_bytes;
        if (h->flags & ETHP_F_LAST)
            m->total = (uint64_t)h->offset_bytes + h->len_bytes;
        count(n, p, ETHP_NC_rx_data_bytes, h->len_bytes);
        if (m->done_bytes == m->total) {
            unbind(n, p, m);
            complete(n, m, ETHP_NIC_OK);
        }
    }
    count(n, p, ETHP_NC_rx_data_pkts, 1);
}

static void on_data_roce(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                         const uint8_t *payload, uint64_t now)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    if (!payload_whole(n, p, ps))
        return; /* RoCE has no trimming: a short payload is forged or broken */
    uint32_t q = h->psn % n->cfg.qps;
    struct nic_qp *qp = &p->qp[q];
    if (ps->ecn == 3) {
        count(n, p, ETHP_NC_rx_ce_pkts, 1);
        if (n->cfg.dcqcn && (!qp->last_cnp_ns || now - qp->last_cnp_ns >= n->cfg.cnp_interval_ns)) {
            send_ctl(n, p, ETHP_OP_CNP, h->psn, q, 0, h->ts_ns, h->entropy, NULL, 0);
            count(n, p, ETHP_NC_tx_cnps, 1);
            qp->last_cnp_ns = now;
        }
    }
    p->ts_echo = h->ts_ns;
    activate(n, p);
    int32_t d = (int32_t)(h->psn - qp->rcv_nxt);
    if (d < 0) { /* a duplicate: ack again, its ack may have been lost */
        count(n, p, ETHP_NC_rx_dup_pkts, 1);
        p->qp_ack_mask |= 1u << q;
        p->ack_pending = 1;
        return;
    }
    if (d > 0) { /* a gap: NAK once, discard until the expected PSN comes */
        count(n, p, ETHP_NC_rx_oos_drops, 1);
        if (!qp->nak_sent) {
            send_ctl(n, p, ETHP_OP_NACK, qp->rcv_nxt, q, 0, h->ts_ns, qp->ev, NULL, 0);
            count(n, p, ETHP_NC_tx_nacks, 1);
            qp->nak_sent = 1;
        }
        return;
    }
    int refused;
    struct nic_msg *m = bind_msg(n, p, h->msg_id, h->tag, &refused);
    if (refused)
        return;
    if (!m && !keep_eager(n, p, ps, payload)) {
        count(n, p, ETHP_NC_rx_unexpected_pkts, 1);
        send_ctl(n, p, ETHP_OP_RNR, h->psn, q, 0, h->ts_ns, qp->ev, NULL, 0);
        count(n, p, ETHP_NC_tx_rnrs, 1);
        return;
    }
    if (m)
        place(n, p, m, ps, payload);
    qp->rcv_nxt += n->cfg.qps;
    qp->nak_sent = 0;
    p->qp_ack_mask |= 1u << q;
    p->ack_pending = 1;
    if (++p->ack_count >= NIC_ACK_EVERY || (h->flags & ETHP_F_LAST))
        send_ack(n, p);
}

static void on_data(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                    const uint8_t *payload)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    if (h->flags & ETHP_F_TRIMMED) {
        count(n, p, ETHP_NC_rx_trimmed_pkts, 1);
        send_ctl(n, p, ETHP_OP_NACK, h->psn, 0, 0, h->ts_ns, h->entropy, NULL, 0);
        count(n, p, ETHP_NC_tx_nacks, 1);
        return;
    }
    if (!payload_whole(n, p, ps))
        return;
    if (ps->ecn == 3) {
        /* A CE mark is acked on its own, so that the echoed entropy value
         * (and with it the plane) is the marked packet's: flush the ack of
         * the unmarked packets before it first. */
        if (p->ack_pending && !p->ce_seen)
            send_ack(n, p);
        p->ce_seen = 1;
        count(n, p, ETHP_NC_rx_ce_pkts, 1);
    }
    uint32_t d = h->psn - p->rcv_nxt;
    int dup = d >= 0x80000000u || (p->rbits[(h->psn % NIC_RWIN) / 8] & (1u << (h->psn % 8)));
    p->ts_echo = h->ts_ns;
    p->ev_echo = h->entropy;
    p->int_have = ps->int_off != 0;
    if (p->int_have) /* the ack echoes this packet's INT records */
        memcpy(p->int_echo, payload - ps->payload_off + ps->int_off, ETHP_INT_BYTES);
    p->ack_pending = 1;
    activate(n, p);
    if (dup) {
        count(n, p, ETHP_NC_rx_dup_pkts, 1);
        p->dup_seen = 1;
        return;
    }
    if (d >= NIC_RWIN) {
        count(n, p, ETHP_NC_rx_beyond_window, 1); /* the sender will resend */
        return;
    }
    int refused;
    struct nic_msg *m = bind_msg(n, p, h->msg_id, h->tag, &refused);
    if (refused)
        return;
    if (!m && !keep_eager(n, p, ps, payload)) {
        /* no receive posted for this tag yet: not acked; say so, so that the
         * sender backs off and retries instead of waiting for a timeout */
        count(n, p, ETHP_NC_rx_unexpected_pkts, 1);
        send_ctl(n, p, ETHP_OP_RNR, h->psn, 0, 0, h->ts_ns, h->entropy, NULL, 0);
        count(n, p, ETHP_NC_tx_rnrs, 1);
        return;
    }
    if (m)
        place(n, p, m, ps, payload);
    p->rbits[(h->psn % NIC_RWIN) / 8] |= (uint8_t)(1u << (h->psn % 8));
    if ((int32_t)(h->psn - p->last_psn) > 0 || p->c[ETHP_NC_rx_data_pkts] == 1)
        p->last_psn = h->psn;
    while (p->rbits[(p->rcv_nxt % NIC_RWIN) / 8] & (1u << (p->rcv_nxt % 8))) {
        p->rbits[(p->rcv_nxt % NIC_RWIN) / 8] &= (uint8_t)~(1u << (p->rcv_nxt % 8));
        p->rcv_nxt++;
    }
    if (++p->ack_count >= NIC_ACK_EVERY || (h->flags & ETHP_F_LAST) || p->ce_seen)
        send_ack(n, p);
}

static void acked(struct ethp_nic *n, struct nic_peer *p, struct tx_pkt *t, uint64_t *bytes)
{
    if (t->state == PKT_INFLIGHT)
        sub_inflight(p, t);
    else if (t->state == PKT_LOST)
        p->n_lost--;
    else
        return;
    t->state = PKT_ACKED;
    bytes[t->sub] += t->len;
    struct nic_msg *m = t->m;
    m->done_bytes += t->len;
    if (m->done_bytes == m->len && m->status == ETHP_NIC_PENDING)
        complete(n, m, ETHP_NIC_OK);
}

static void progress_made(struct ethp_nic *n, struct nic_peer *p, uint64_t now);

static void on_ack(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                   const uint8_t *payload, uint64_t now)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    count(n, p, ETHP_NC_rx_acks, 1);
    if (ps->payload_bytes < 8 || !p->win)
        return;
    uint64_t bits = 0;
    for (int i = 0; i < 8; i++)
        bits = bits << 8 | payload[i];
    uint32_t cum = h->psn;
    if (cum - p->snd_una > p->snd_nxt - p->snd_una)
        return; /* stale or bogus */
    set_credit(n, p, h->tag);
    uint64_t bytes[ETHP_NIC_MAX_PLANES] = {0};
    int progress = cum != p->snd_una;
    for (; p->snd_una != cum; p->snd_una++) {
        struct tx_pkt *t = &p->win[p->snd_una % NIC_WIN];
        acked(n, p, t, bytes);
        t->state = PKT_FREE;
    }
    uint32_t base = h->offset_bytes; /* where the SACK bitmap starts */
    for (uint32_t i = 0; i < NIC_SACK_BITS; i++) {
        if (!(bits & (1ull << i)))
            continue;
        uint32_t psn = base + i;
        if (psn - p->snd_una >= p->snd_nxt - p->snd_una)
            continue;
        progress |= p->win[psn % NIC_WIN].state == PKT_INFLIGHT ||
                    p->win[psn % NIC_WIN].state == PKT_LOST;
        acked(n, p, &p->win[psn % NIC_WIN], bytes);
        if (!p->have_sack || (int32_t)(psn - p->high_sack) > 0) {
            p->high_sack = psn;
            p->have_sack = 1;
        }
    }
    /* SACK-inferred loss, RACK-like: in flight, DUPTHRESH PSNs below the
     * highest SACK, and sent a reordering window before it.  Spraying over
     * planes with unequal queues reorders by more than a few PSNs; the window
     * (a quarter of the base RTT, at least 2 ms for the unscaled ring and
     * scheduling latency of this machine) keeps that from looking like loss. */
    if (h->flags & ETHP_F_RETX) /* a spurious retransmission: widen the window */
        p->reo_ns = p->reo_ns * 2 < p->rto_ns / 2 ? p->reo_ns * 2 : p->rto_ns / 2;
    if (p->have_sack && (int32_t)(p->high_sack - p->snd_una) > 0) {
        uint64_t reo_ns = p->reo_ns;
        uint64_t hs_sent = p->win[p->high_sack % NIC_WIN].sent_ns;
        hs_sent = hs_sent > reo_ns ? hs_sent - reo_ns : 0;
        int lost = 0;
        for (uint32_t psn = p->snd_una; (int32_t)(p->high_sack - psn) >= (int32_t)NIC_DUPTHRESH;
             psn++) {
            struct tx_pkt *t = &p->win[psn % NIC_WIN];
            if (t->state == PKT_INFLIGHT && t->sent_ns < hs_sent) {
                mark_lost(p, psn);
                avoid_plane(n, t->plane, now);
                plane_lost(n, t->plane, now);
                count(n, p, ETHP_NC_retx_sack, 1);
                struct ethp_cc_params pp = cc_params(n);
                n->cc->on_nack(&p->cc[t->sub].st, &pp, now);
                lost = 1;
            }
        }
        (void)lost;
    }
    uint32_t rtt = (uint32_t)now - h->ts_ns;
    count(n, p, ETHP_NC_rtt_samples, 1);
    p->c[ETHP_NC_rtt_last_ns] = n->c[ETHP_NC_rtt_last_ns] = rtt;
    int ecn = (h->flags & ETHP_F_ECN_ECHO) != 0;
    uint32_t echo_plane = h->entropy & 0xf; /* the plane of the packet that drew this ack */
    if (echo_plane < n->n_ports)
        p->cc[echo_plane].st.rtt_ns = rtt;
    if (ecn) {
        count(n, p, ETHP_NC_ecn_echoes, 1);
        avoid_plane(n, echo_plane, now);
    } else if (echo_plane < n->n_ports && n->ports[echo_plane].fails) {
        n->ports[echo_plane].fails = 0; /* it delivers again */
        n->ports[echo_plane].avoid_until = 0;
    }
    struct ethp_cc_params pp = cc_params(n);
    if (ps->int_off && n->cc->on_int && echo_plane < n->n_ports) {
        struct ethp_int_hop hops[ETHP_INT_MAX_HOPS];
        uint32_t nh = ethp_int_decode(payload - ps->payload_off, ps->int_off, hops);
        n->cc->on_int(&p->cc[echo_plane].st, &pp, hops, nh, h->ts_ns, now);
        count(n, p, ETHP_NC_int_acks, 1);
        if (nh > p->c[ETHP_NC_int_hops_max])
            p->c[ETHP_NC_int_hops_max] = nh;
        if (nh > n->c[ETHP_NC_int_hops_max])
            n->c[ETHP_NC_int_hops_max] = nh;
    }
    for (uint32_t i = 0; i < n->n_ports; i++)
        if (bytes[i])
            n->cc->on_ack(&p->cc[i].st, &pp, bytes[i],
                          p->cc[i].st.rtt_ns ? p->cc[i].st.rtt_ns : rtt, ecn && i == echo_plane,
                          now);
    if (progress)
        progress_made(n, p, now);
}

static void progress_made(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    p->rnr_since_progress = 0;
    p->rnr_rounds = 0;
    p->rnr_backoff_ns = 0;
    /* the peer is taking data again: packets it turned away go now, not
     * after the backoff (which could outlast the fresh deadline below) */
    p->rnr_until = 0;
    p->timeouts = 0;
    p->rto_ns = n->cfg.rto_ns;
    p->rto_deadline = p->snd_una != p->snd_nxt ? now + p->rto_ns : 0;
}

static void on_ack_roce(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                        uint64_t now)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    count(n, p, ETHP_NC_rx_acks, 1);
    uint32_t q = h->offset_bytes, next = h->psn;
    if (!p->win || q >= n->cfg.qps)
        return;
    uint64_t bytes[ETHP_NIC_MAX_PLANES] = {0};
    int progress = 0;
    uint32_t qps = n->cfg.qps, first = p->snd_una + (q + qps - p->snd_una % qps) % qps;
    for (uint32_t psn = first; (int32_t)(p->snd_nxt - psn) > 0 && (int32_t)(next - psn) > 0;
         psn += qps) /* this QP's PSNs only */
        if (p->win[psn % NIC_WIN].state != PKT_ACKED) {
            acked(n, p, &p->win[psn % NIC_WIN], bytes);
            progress = 1;
        }
    while (p->snd_una != p->snd_nxt && p->win[p->snd_una % NIC_WIN].state == PKT_ACKED)
        p->win[p->snd_una++ % NIC_WIN].state = PKT_FREE;
    uint32_t rtt = (uint32_t)now - h->ts_ns;
    count(n, p, ETHP_NC_rtt_samples, 1);
    p->c[ETHP_NC_rtt_last_ns] = n->c[ETHP_NC_rtt_last_ns] = rtt;
    if (progress)
        progress_made(n, p, now);
}

/* roce: go back to psn on its QP: it and every later packet of that QP are
 * resent. */
static void go_back(struct ethp_nic *n, struct nic_peer *p, uint32_t psn)
{
    if (!p->win || psn - p->snd_una >= p->snd_nxt - p->snd_una)
        return;
    for (; (int32_t)(p->snd_nxt - psn) > 0; psn += n->cfg.qps) /* this QP's PSNs only */
        mark_lost(p, psn);
}

static void on_cnp(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                   uint64_t now)
{
    count(n, p, ETHP_NC_rx_cnps, 1);
    uint32_t q = ps->hdr.offset_bytes;
    if (!n->cfg.dcqcn || q >= n->cfg.qps || !n->cc->on_cnp)
        return;
    struct ethp_cc_params pp = cc_params(n);
    if (n->cc->on_cnp(&p->cc[q].st, &pp, now))
        count(n, p, ETHP_NC_rate_cuts, 1);
}

static void on_nack(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                    uint64_t now)
{
    count(n, p, ETHP_NC_rx_nacks, 1);
    if (n->cfg.roce) {
        go_back(n, p, ps->hdr.psn);
        return;
    }
    set_credit(n, p, ps->hdr.tag);
    struct tx_pkt *t = mark_lost(p, ps->hdr.psn);
    if (!t)
        return;
    t->nacked_ns = now;
    avoid_plane(n, t->plane, now);
    count(n, p, ETHP_NC_retx_nack, 1);
    struct ethp_cc_params pp = cc_params(n);
    n->cc->on_nack(&p->cc[t->sub].st, &pp, now);
}

static void fail_peer(struct ethp_nic *n, struct nic_peer *p);

static void on_rnr(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                   uint64_t now)
{
    count(n, p, ETHP_NC_rx_rnrs, 1);
    int first = p->win && ps->hdr.psn - p->snd_una < p->snd_nxt - p->snd_una &&
                p->win[ps->hdr.psn % NIC_WIN].state == PKT_INFLIGHT;
    if (n->cfg.roce)
        go_back(n, p, ps->hdr.psn);
    else
        mark_lost(p, ps->hdr.psn);
    if (!first)
        return;
    p->rnr_since_progress = 1;
    /* The peer is alive but has no receive posted: retry after a backoff
     * that starts at one base RTT and doubles per round (like InfiniBand's
     * RNR NAK); the peer's answers hold off the retransmit timeout; the
     * retry budget counts rounds. */
    p->rto_deadline = now + p->rto_ns + p->rnr_backoff_ns;
    if (now < p->rnr_until)
        return; /* this round is already counted */
    if (!p->rnr_backoff_ns)
        p->rnr_backoff_ns = n->cfg.base_rtt_ns;
    p->rnr_until = now + p->rnr_backoff_ns;
    if (p->rnr_backoff_ns < 64 * n->cfg.base_rtt_ns)
        p->rnr_backoff_ns *= 2;
    if (++p->rnr_rounds > n->cfg.max_retries)
        fail_peer(n, p);
}

static void on_pause(struct ethp_nic *n, const uint8_t *f, uint32_t len, int ifindex,
                     uint64_t now)
{
    for (uint32_t i = 0; i < n->n_ports; i++) {
        struct nic_port *pt = &n->ports[i];
        if (pt->ifindex != ifindex || len < 20 + 2 * ETHP_CLS_DATA)
            continue;
        uint16_t q = (uint16_t)(f[18 + 2 * ETHP_CLS_DATA] << 8 | f[19 + 2 * ETHP_CLS_DATA]);
        if (!(f[17] & (1u << ETHP_CLS_DATA)))
            return;
        pt->paused_until = q ? now + (uint64_t)q * 512ull * 1000000000ull / n->cfg.rate_bps : now;
        n->c[ETHP_NC_pauses_rx]++;
    }
}

/* ---------------------------------------------------------------- in-network all-reduce
 *
 * The member's side of agg.c's scheme.  A call's buffer is cut into chunks of
 * one packet; chunk c goes to stream c mod n_aggs (a group at the aggregator
 * this member sends to: the stream's root, or its tree's inner node here),
 * at most window chunks at a time per stream.  The aggregator's result for a chunk overwrites
 * it in place, and frees its slot for the next chunk.  A chunk whose result
 * has not come within the aggregator's timeout is sent again (the
 * aggregator counts each member once, and answers a resent chunk it has
 * finished with the result).  Contributions are paced by the port like any
 * packet; their window, not a congestion window, bounds what is in flight,
 * as in SwitchML. */

static void inc_start(struct ethp_nic *n, struct nic_msg *m)
{
    struct nic_inc *g = &n->inc;
    g->elem_bytes = ethp_agg_elem_bytes(m->dtype);
    g->chunk_bytes = n->cfg.payload_bytes / g->elem_bytes * g->elem_bytes;
    g->n_chunks = (m->len + g->chunk_bytes - 1) / g->chunk_bytes;
    g->done_chunks = 0;
    for (uint32_t a = 0; a < g->n_aggs; a++)
        g->agg[a].next_chunk = a;
}

static void inc_finish(struct ethp_nic *n, int status)
{
    struct nic_inc *g = &n->inc;
    struct nic_msg *m = g->head;
    g->head = m->next;
    if (!g->head)
        g->tail = NULL;
    complete(n, m, status);
    if (g->head)
        inc_start(n, g->head);
}

static void inc_send(struct ethp_nic *n, struct inc_agg *a, uint32_t psn, uint64_t chunk,
                     int retx)
{
    struct nic_inc *g = &n->inc;
    const struct nic_msg *m = g->head;
    uint64_t off = chunk * g->chunk_bytes;
    uint32_t len = (uint32_t)(m->len - off < g->chunk_bytes ? m->len - off : g->chunk_bytes);
    uint16_t ev = (uint16_t)((rnd64(n) % n->cfg.n_evs) << 4 | a->plane);
    struct ethp_l2l3 l;
    addr_to(n, a->plane, ETHP_AGG_NET + a->id, ev, &l);
    struct ethp_hdr_fields h = {
        .opcode = ETHP_OP_AGG, .flags = retx ? ETHP_F_RETX : 0, .entropy = ev,
        .src_ep = (uint16_t)n->cfg.ep, .dst_ep = (uint16_t)(ETHP_AGG_EP_BASE + a->id),
        .msg_id = a->group, .psn = psn, .offset_bytes = (uint32_t)off,
        .tag = a->members << 16 | a->index, .len_bytes = (uint16_t)len, .tos = 0x02,
        .ts_ns = (uint32_t)m->dtype << 24 | (uint32_t)m->op << 16 | g->window};
    if (emit(n, a->plane, &l, &h, m->buf + off, len, NULL) > 0) {
        n->c[ETHP_NC_inc_tx_pkts]++;
        if (retx)
            n->c[ETHP_NC_inc_retx_pkts]++;
    }
    if (!a->deadline_ns)
        a->deadline_ns = ethp_now_ns() + a->rto_ns;
}

/* Resends first (oldest first), then new chunks while the window allows. */
static void pump_inc(struct ethp_nic *n, uint64_t now)
{
    struct nic_inc *g = &n->inc;
    if (!g->head)
        return;
    for (uint32_t i = 0; i < g->n_aggs; i++) {
        struct inc_agg *a = &g->agg[i];
        while (port_free(n, a->plane, now)) {
            if (a->resend_psn != a->next_psn) {
                uint32_t psn = a->resend_psn++;
                uint64_t c = a->chunk[psn % g->window];
                if (c)
                    inc_send(n, a, psn, c - 1, 1);
            } else if (a->next_psn - a->una_psn < g->window && a->next_chunk < g->n_chunks) {
                uint32_t psn = a->next_psn++;
                a->resend_psn = a->next_psn;
                a->chunk[psn % g->window] = a->next_chunk + 1;
                inc_send(n, a, psn, a->next_chunk, 0);
                a->next_chunk += g->n_aggs;
            } else {
                break;
            }
        }
    }
}

static void on_agg_result(struct ethp_nic *n, const struct ethp_parsed *ps, const uint8_t *payload,
                          uint32_t plane, uint64_t now)
{
    struct nic_inc *g = &n->inc;
    struct inc_agg *a = NULL;
    for (uint32_t i = 0; i < g->n_aggs && !a; i++)
        if (g->agg[i].group == ps->hdr.msg_id)
            a = &g->agg[i];
    if (!a || ps->hdr.src_ep != ETHP_AGG_EP_BASE + a->id) {
        n->c[ETHP_NC_rx_malformed]++;
        return;
    }
    /* from its aggregator, on the plane this stream uses */
    if (plane != a->plane ||
        (ps->kind != ETHP_KIND_ETHP_COMPACT && ps->addr.src_ip != ETHP_AGG_NET + a->id)) {
        n->c[ETHP_NC_rx_spoofed]++;
        return;
    }
    uint32_t psn = ps->hdr.psn;
    uint64_t *slot = &a->chunk[psn % g->window];
    if (!g->head || psn - a->una_psn >= a->next_psn - a->una_psn || !*slot) {
        n->c[ETHP_NC_inc_dup_results]++;
        return;
    }
    uint64_t off = (*slot - 1) * g->chunk_bytes;
    uint64_t len = g->head->len - off < g->chunk_bytes ? g->head->len - off : g->chunk_bytes;
    if (ps->payload_bytes != len || ps->hdr.offset_bytes != (uint32_t)off) {
        n->c[ETHP_NC_rx_malformed]++;
        return;
    }
    memcpy(g->head->buf + off, payload, len);
    *slot = 0;
    n->c[ETHP_NC_inc_rx_results]++;
    while (a->una_psn != a->next_psn && !a->chunk[a->una_psn % g->window])
        a->una_psn++;
    if (a->resend_psn - a->una_psn > a->next_psn - a->una_psn)
        a->resend_psn = a->una_psn; /* (never behind the window) */
    a->timeouts = 0;
    a->rto_ns = n->cfg.rto_ns;
    a->deadline_ns = a->una_psn != a->next_psn ? now + a->rto_ns : 0;
    if (++g->done_chunks == g->n_chunks)
        inc_finish(n, ETHP_NIC_OK);
}

static void inc_timers(struct ethp_nic *n, uint64_t now)
{
    struct nic_inc *g = &n->inc;
    for (uint32_t i = 0; g->head && i < g->n_aggs; i++) {
        struct inc_agg *a = &g->agg[i];
        if (!a->deadline_ns || now < a->deadline_ns)
            continue;
        if (a->una_psn == a->next_psn) {
            a->deadline_ns = 0;
            continue;
        }
        n->c[ETHP_NC_inc_timeouts]++;
        if (++a->timeouts > n->cfg.max_retries) {
            /* The aggregator is gone (or a member is): give up on the call.
             * Its chunks stay out; the next call's take the slots after them. */
            for (uint32_t k = 0; k < g->n_aggs; k++) {
                struct inc_agg *b = &g->agg[k];
                for (uint32_t psn = b->una_psn; psn != b->next_psn; psn++)
                    b->chunk[psn % g->window] = 0;
                b->una_psn = b->resend_psn = b->next_psn;
                b->deadline_ns = 0;
                b->timeouts = 0;
                b->rto_ns = n->cfg.rto_ns;
            }
            inc_finish(n, ETHP_NIC_ERR_UNREACHABLE);
            return;
        }
        a->resend_psn = a->una_psn;
        a->rto_ns = a->rto_ns * 2 > n->cfg.rto_ns * 64 ? n->cfg.rto_ns * 64 : a->rto_ns * 2;
        a->deadline_ns = now + a->rto_ns;
    }
}

/* The earliest time the running call needs the thread: a timeout, or a
 * port it has a chunk for becoming free. */
static uint64_t inc_due(const struct ethp_nic *n)
{
    const struct nic_inc *g = &n->inc;
    uint64_t t = UINT64_MAX;
    for (uint32_t i = 0; g->head && i < g->n_aggs; i++) {
        const struct inc_agg *a = &g->agg[i];
        if (a->deadline_ns && a->deadline_ns < t)
            t = a->deadline_ns;
        int more = a->resend_psn != a->next_psn ||
                   (a->next_psn - a->una_psn < g->window && a->next_chunk < g->n_chunks);
        if (more && n->ports[a->plane].up) {
            uint64_t f = free_at(n, a->plane);
            if (f < t)
                t = f;
        }
    }
    return t;
}

struct rx_ctx {
    struct ethp_nic *n;
    uint64_t now;
};

/* ---------------------------------------------------------------- connection epochs
 *
 * Every frame carries its sender's incarnation (src_epoch, set when the
 * endpoint is made, increasing across restarts) and the receiver's as the
 * sender last heard it (dst_epoch, 0 before it heard any).  A frame from an
 * incarnation older than the one heard is refused; a newer one means the
 * peer restarted: its state here starts over (peer_reset).  A frame for an
 * earlier incarnation of this endpoint is refused and answered with a
 * HELLO, from which its sender learns ours and starts over too. */

static uint32_t new_epoch(void)
{
    static uint32_t last; /* two endpoints made in one ms by one process */
    uint32_t e = (uint32_t)(ethp_now_ns() / 1000000u);
    uint32_t prev = __atomic_load_n(&last, __ATOMIC_RELAXED);
    if ((int32_t)(e - prev) <= 0)
        e = prev + 1;
    __atomic_store_n(&last, e, __ATOMIC_RELAXED);
    return e ? e : 1;
}

/* A peer's congestion state, queue pairs' sequence state and retransmit
 * timeout as when it was added (and again after it restarts). */
static void peer_fresh(struct ethp_nic *n, struct nic_peer *p)
{
    struct ethp_cc_params pp = cc_params(n);
    uint32_t subs = n->cfg.roce ? n->cfg.qps : n->n_ports;
    for (uint32_t i = 0; i < subs; i++) {
        p->cc[i] = (struct nic_cc){0};
        n->cc->init(&p->cc[i].st, &pp);
    }
    for (uint32_t q = 0; n->cfg.roce && q < n->cfg.qps; q++) {
        uint16_t ev = p->qp[q].ev; /* a QP keeps its path */
        p->qp[q] = (struct nic_qp){.rcv_nxt = q, .ev = ev};
    }
    p->rto_ns = n->cfg.rto_ns;
}

/* Unfinished messages to and from p start over: sends from their first
 * byte (new message ids, from 0, in their order), receives unbound and
 * first in line again; sequence numbers, windows and timers as new. */
static void peer_reset(struct ethp_nic *n, struct nic_peer *p)
{
    count(n, p, ETHP_NC_peer_resets, 1);
    /* send: the messages of the window (in PSN order), then the queue */
    struct nic_msg *head = NULL, *tail = NULL;
    for (uint32_t psn = p->snd_una; p->win && psn != p->snd_nxt; psn++) {
        struct nic_msg *m = p->win[psn % NIC_WIN].m;
        if (!m || m == tail || m == p->sq_head || m->status != ETHP_NIC_PENDING)
            continue;
        m->next = NULL;
        if (tail)
            tail->next = m;
        else
            head = m;
        tail = m;
    }
    if (tail)
        tail->next = p->sq_head;
    else
        head = p->sq_head;
    for (tail = head; tail && tail->next; tail = tail->next)
        ;
    p->sq_head = head;
    p->sq_tail = tail;
    p->msg_id_next = 0;
    for (struct nic_msg *m = head; m; m = m->next) {
        m->next_off = 0;
        m->done_bytes = 0;
        m->msg_id = p->msg_id_next++;
    }
    if (p->win)
        memset(p->win, 0, NIC_WIN * sizeof(*p->win));
    p->snd_una = p->snd_nxt = p->high_sack = 0;
    p->have_sack = 0;
    p->inflight_bytes = 0;
    p->n_lost = 0;
    p->retx_due_ns = 0;
    p->rto_ns = n->cfg.rto_ns;
    p->rto_deadline = 0;
    p->timeouts = 0;
    p->rnr_until = p->rnr_backoff_ns = 0;
    p->rnr_rounds = 0;
    p->rnr_since_progress = 0;
    p->n_eager = 0; /* kept for an incarnation that is gone */
    peer_fresh(n, p);
    /* receive: bound messages back in line, in the order they were posted */
    struct nic_msg *back[64];
    int nb = 0;
    for (int i = 0; i < 64; i++) {
        struct nic_msg *m = p->bound[i];
        if (!m)
            continue;
        p->bound[i] = NULL;
        rx_open(n, p, -1);
        if (m->status != ETHP_NIC_PENDING)
            continue; /* failed already (too small): nothing to redo */
        m->bound = 0;
        m->done_bytes = 0;
        m->total = UINT64_MAX;
        int j = nb++;
        for (; j > 0 && back[j - 1]->handle > m->handle; j--)
            back[j] = back[j - 1];
        back[j] = m;
    }
    for (int i = nb - 1; i >= 0; i--) {
        back[i]->next = p->rq_head;
        p->rq_head = back[i];
        if (!p->rq_tail)
            p->rq_tail = back[i];
    }
    p->rcv_nxt = p->last_psn = 0;
    memset(p->rbits, 0, NIC_RWIN / 8);
    p->ack_pending = p->ack_count = 0;
    p->ce_seen = p->dup_seen = p->int_have = 0;
    p->qp_ack_mask = 0;
    activate(n, p);
}

/* 1 if a frame from p may go on: its epochs are current (see above). */
static int epoch_ok(struct ethp_nic *n, struct nic_peer *p, const struct ethp_hdr_fields *h,
                    uint64_t now)
{
    if (!h->src_epoch || (p->epoch && (int32_t)(h->src_epoch - p->epoch) < 0)) {
        count(n, p, ETHP_NC_rx_stale_epoch, 1); /* its sender is gone (or never was one) */
        return 0;
    }
    if (h->src_epoch != p->epoch) {
        if (p->epoch)
            peer_reset(n, p); /* it restarted */
        p->epoch = h->src_epoch;
    }
    if (h->dst_epoch && h->dst_epoch != n->epoch) {
        count(n, p, ETHP_NC_rx_stale_epoch, 1); /* meant for an earlier incarnation here */
        if (!p->hello_ns || now - p->hello_ns >= n->cfg.base_rtt_ns) {
            p->hello_ns = now;
            send_ctl(n, p, ETHP_OP_HELLO, 0, 0, 0, 0, 0, NULL, 0);
            count(n, p, ETHP_NC_tx_hellos, 1);
        }
        return 0;
    }
    return 1;
}

static int port_of_ifindex(const struct ethp_nic *n, int ifindex)
{
    for (uint32_t i = 0; i < n->n_ports; i++)
        if (n->ports[i].ifindex == ifindex)
            return (int)i;
    return -1;
}

/* One received frame, read in place from the ring: payloads go straight
 * from the ring to the posted buffer, with no copy in between. */
static void on_frame(void *arg, const uint8_t *data, uint32_t len, int ifindex)
{
    struct rx_ctx *c = arg;
    struct ethp_nic *n = c->n;
    struct ethp_parsed ps;
    int kind = ethp_parse(data, len, &ps);
    if (kind == ETHP_KIND_MACCTL) {
        on_pause(n, data, len, ifindex, c->now);
        return;
    }
    int ethertype_ethp = ps.ethertype == ETHP_ETHERTYPE_COMPACT;
    int udp_ethp = ps.ethertype == ETHP_ETHERTYPE_IPV4 && ps.ip_proto == 17 &&
                   ps.addr.dst_port == ETHP_UDP_PORT;
    /* From here on, every frame taken (rx_frames) ends in exactly one rx_
     * counter: malformed, spoofed, stale epoch, or its opcode's fate. */
    if (kind < 0 && (ethertype_ethp || udp_ethp || ps.l4_off == 0)) {
        if (ethertype_ethp || udp_ethp || ps.ethertype == ETHP_ETHERTYPE_IPV4) {
            n->c[ETHP_NC_rx_frames]++;
            n->c[ETHP_NC_rx_malformed]++;
        }
        return;
    }
    if (n->cfg.roce && kind == ETHP_KIND_IPV4 && ps.ip_proto == 17 &&
        ps.addr.dst_port == ETHP_ROCE_UDP_PORT) {
        n->c[ETHP_NC_rx_frames]++;
        n->c[ETHP_NC_rx_malformed]++; /* to the RoCE port, but no valid header */
        return;
    }
    if (n->cfg.roce ? kind != ETHP_KIND_ROCE_UDP
                    : kind != ETHP_KIND_ETHP_UDP && kind != ETHP_KIND_ETHP_COMPACT)
        return; /* the host's own traffic */
    n->c[ETHP_NC_rx_frames]++;
    /* Who sent it: a frame counts only on one of this NIC's ports (never
     * lo), from its switch (the MAC it rewrote), to this port's address,
     * and from the address the claimed sender has on that plane.  The
     * switches refuse a host's frame whose source is not that host's
     * (switch.c, source guard), so a third node can forge neither. */
    int plane = port_of_ifindex(n, ifindex);
    if (plane < 0 || memcmp(ps.addr.src_mac, n->ports[plane].gw_mac, 6) ||
        (kind != ETHP_KIND_ETHP_COMPACT && ps.addr.dst_ip != n->ports[plane].ip)) {
        n->c[ETHP_NC_rx_spoofed]++;
        return;
    }
    if (ps.hdr.opcode == ETHP_OP_AGG_RESULT && ps.hdr.dst_ep == n->cfg.ep) {
        on_agg_result(n, &ps, data + ps.payload_off, (uint32_t)plane, c->now);
        return;
    }
    struct nic_peer *p = peer_of(n, ps.hdr.src_ep);
    if (!p || ps.hdr.dst_ep != n->cfg.ep) {
        n->c[ETHP_NC_rx_malformed]++;
        return;
    }
    if (kind != ETHP_KIND_ETHP_COMPACT && ps.addr.src_ip != p->ip[plane]) {
        count(n, p, ETHP_NC_rx_spoofed, 1);
        return;
    }
    if (!epoch_ok(n, p, &ps.hdr, c->now))
        return;
    const uint8_t *payload = data + ps.payload_off;
    switch (ps.hdr.opcode) {
    case ETHP_OP_DATA:
        if (n->cfg.roce)
            on_data_roce(n, p, &ps, payload, c->now);
        else
            on_data(n, p, &ps, payload);
        break;
    case ETHP_OP_ACK:
        if (n->cfg.roce)
            on_ack_roce(n, p, &ps, c->now);
        else
            on_ack(n, p, &ps, payload, c->now);
        break;
    case ETHP_OP_CNP:
        on_cnp(n, p, &ps, c->now);
        break;
    case ETHP_OP_NACK:
        on_nack(n, p, &ps, c->now);
        break;
    case ETHP_OP_RNR:
        on_rnr(n, p, &ps, c->now);
        break;
    case ETHP_OP_HELLO: /* its epoch did all there is to do */
        count(n, p, ETHP_NC_rx_hellos, 1);
        break;
    default:
        n->c[ETHP_NC_rx_malformed]++;
    }
}

static void rx(struct ethp_nic *n, uint64_t now)
{
    struct rx_ctx c = {.n = n, .now = now};
    while (n->io.rx_each(n->io.ctx, NIC_BURST, on_frame, &c) == NIC_BURST)
        ;
}

/* ---------------------------------------------------------------- timers, loop */

static void fail_peer(struct ethp_nic *n, struct nic_peer *p)
{
    int why = p->rnr_since_progress ? ETHP_NIC_ERR_NO_RECEIVE : ETHP_NIC_ERR_UNREACHABLE;
    for (uint32_t psn = p->snd_una; psn != p->snd_nxt; psn++) {
        struct tx_pkt *t = &p->win[psn % NIC_WIN];
        if (t->m->status == ETHP_NIC_PENDING)
            complete(n, t->m, why);
        t->state = PKT_FREE;
    }
    for (struct nic_msg *m = p->sq_head; m; m = m->next)
        if (m->status == ETHP_NIC_PENDING)
            complete(n, m, why);
    p->sq_head = p->sq_tail = NULL;
    p->snd_una = p->snd_nxt;
    p->inflight_bytes = 0;
    for (uint32_t i = 0; i < ETHP_NIC_MAX_PLANES; i++)
        p->cc[i].inflight = 0;
    p->n_lost = 0;
    p->rto_deadline = 0;
}

static void timers(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    if (!p->rto_deadline || now < p->rto_deadline)
        return;
    if (p->snd_una == p->snd_nxt) {
        p->rto_deadline = 0;
        return;
    }
    if (++p->timeouts > n->cfg.max_retries) {
        fail_peer(n, p);
        return;
    }
    for (uint32_t psn = p->snd_una; psn != p->snd_nxt; psn++) {
        struct tx_pkt *t = mark_lost(p, psn);
        if (t) {
            count(n, p, ETHP_NC_retx_timeout, 1);
            plane_lost(n, t->plane, now);
        }
    }
    struct ethp_cc_params pp = cc_params(n);
    for (uint32_t i = 0; i < (n->cfg.roce ? n->cfg.qps : n->n_ports); i++)
        n->cc->on_timeout(&p->cc[i].st, &pp, now);
    p->rto_ns = p->rto_ns * 2 > n->cfg.rto_ns * 64 ? n->cfg.rto_ns * 64 : p->rto_ns * 2;
    p->rto_deadline = now + p->rto_ns;
}

static void take_commands(struct ethp_nic *n)
{
    pthread_mutex_lock(&n->lock);
    struct nic_msg *m = n->cmd_head;
    n->cmd_head = n->cmd_tail = NULL;
    pthread_mutex_unlock(&n->lock);
    while (m) {
        struct nic_msg *next = m->next;
        struct nic_peer *p = &n->peers[m->peer];
        m->next = NULL;
        if (m->inc) {
            struct nic_inc *g = &n->inc;
            if (m->status != ETHP_NIC_PENDING) { /* empty: done at once */
                m = next;
                continue;
            }
            if (g->tail) {
                g->tail->next = m;
            } else {
                g->head = m;
                inc_start(n, m);
            }
            g->tail = m;
        } else if (m->is_send) {
            if (!p->win) {
                p->win = calloc(NIC_WIN, sizeof(*p->win));
                if (!p->win) {
                    complete(n, m, -ENOMEM);
                    m = next;
                    continue;
                }
            }
            m->msg_id = p->msg_id_next++;
            if (p->sq_tail)
                p->sq_tail->next = m;
            else
                p->sq_head = m;
            p->sq_tail = m;
            activate(n, p);
        } else if (!take_eager(n, p, m)) {
            if (p->rq_tail)
                p->rq_tail->next = m;
            else
                p->rq_head = m;
            p->rq_tail = m;
        }
        m = next;
    }
}

static uint64_t free_at(const struct ethp_nic *n, uint32_t plane)
{
    const struct nic_port *pt = &n->ports[plane];
    uint64_t t = pt->next_tx_ns > NIC_LOOKAHEAD_NS ? pt->next_tx_ns - NIC_LOOKAHEAD_NS : 0;
    return t > pt->paused_until ? t : pt->paused_until;
}

/* roce: when a packet pump_roce would send next can go: the first lost
 * packet of each QP, and the next new one (new packets go in PSN order, so
 * no other QP's pacer matters to them).  A QP whose window is full waits
 * for an ack (a frame wakes the engine), not for a pacer time long past:
 * that would spin, and with the pacers' catch-up a QP not in turn often
 * has one. */
static uint64_t roce_free_at(const struct ethp_nic *n, const struct nic_peer *p, uint32_t psn)
{
    uint32_t q = psn % n->cfg.qps;
    if (p->cc[q].inflight >= p->cc[q].st.cwnd_bytes)
        return UINT64_MAX;
    uint64_t f = free_at(n, roce_plane(n, psn)), r = sub_free_at(p, q);
    return r > f ? r : f;
}

static uint64_t roce_due(const struct ethp_nic *n, const struct nic_peer *p)
{
    uint64_t t = UINT64_MAX;
    uint32_t seen = 0, lost = 0, all = (1u << n->cfg.qps) - 1;
    for (uint32_t psn = p->snd_una; lost < p->n_lost && seen != all && psn != p->snd_nxt; psn++)
        if (p->win[psn % NIC_WIN].state == PKT_LOST) {
            lost++;
            uint32_t q = psn % n->cfg.qps;
            if (!(seen >> q & 1)) {
                seen |= 1u << q;
                uint64_t d = roce_free_at(n, p, psn);
                t = d < t ? d : t;
            }
        }
    if (p->sq_head && p->snd_nxt - p->snd_una < NIC_WIN) {
        uint64_t d = roce_free_at(n, p, p->snd_nxt);
        t = d < t ? d : t;
    }
    return t;
}

/* The earliest time something is due: a timeout, or the port the next
 * packet of some peer waits for. */
static uint64_t next_due(struct ethp_nic *n)
{
    uint64_t t = n->io.due_ns(n->io.ctx); /* an idle ring to take down, a frame due */
    for (uint32_t k = 0; k < n->n_active; k++) {
        struct nic_peer *p = &n->peers[n->active[k]];
        if (p->rto_deadline && p->rto_deadline < t)
            t = p->rto_deadline;
        uint32_t plane = UINT32_MAX;
        if (n->cfg.roce && (p->n_lost || p->sq_head) && ethp_now_ns() >= p->rnr_until) {
            uint64_t r = roce_due(n, p);
            t = r < t ? r : t;
            continue;
        }
        if (p->n_lost && ethp_now_ns() < p->rnr_until) {
            if (p->rnr_until < t)
                t = p->rnr_until;
        } else if (p->n_lost) {
            /* as pump() left it: a free plane may be one the waiting
             * packets must not take (the one that lost them) */
            if (p->retx_due_ns < t)
                t = p->retx_due_ns;
            continue;
        } else if (p->sq_head && p->snd_nxt - p->snd_una < NIC_WIN) {
            plane = pick_plane(n, p, p->snd_nxt, 0);
            /* a new packet also waits for its sub-flow's pacer */
            if (plane != UINT32_MAX && sub_free_at(p, plane) > free_at(n, plane)) {
                if (sub_free_at(p, plane) < t)
                    t = sub_free_at(p, plane);
                continue;
            }
        }
        if (plane != UINT32_MAX && free_at(n, plane) < t)
            t = free_at(n, plane);
    }
    return t;
}

/* Did the engine run when its next packet or timer was due?  Lateness
 * against the earlier of the due time and the previous pass (each ns of it
 * counted once); what the pacers' catch-up cannot make up is link time
 * lost.  The fidelity report's verdict on the endpoints (fidelity.py). */
static void engine_lateness(struct ethp_nic *n, uint64_t due, uint64_t prev, uint64_t now)
{
    if (due == UINT64_MAX)
        return;
    uint64_t from = due > prev ? due : prev;
    if (now <= from + NIC_LATE_NS)
        return;
    uint64_t late = now - from;
    n->c[ETHP_NC_eng_late_wakeups]++;
    n->c[ETHP_NC_eng_late_sum_ns] += late;
    if (late > n->c[ETHP_NC_eng_late_max_ns])
        n->c[ETHP_NC_eng_late_max_ns] = late;
    if (late > NIC_CATCHUP_NS)
        n->c[ETHP_NC_eng_lost_ns] += late - NIC_CATCHUP_NS;
    if (n->clock) {
        ethp_clock_report(n->clock, ETHP_CLOCK_R_LATE_WAKEUPS, 1);
        ethp_clock_report(n->clock, ETHP_CLOCK_R_LATE_SUM_NS, late);
        if (late > NIC_CATCHUP_NS)
            ethp_clock_report(n->clock, ETHP_CLOCK_R_LOST_NS, late - NIC_CATCHUP_NS);
    }
}

/* ---------------------------------------------------------------- time scale */

static uint64_t scaled_ns(uint64_t t, double r) { return (uint64_t)((double)t * r); }

static uint64_t scaled_bps(uint64_t bps, double r)
{
    uint64_t v = (uint64_t)((double)bps / r);
    return v ? v : 1;
}

/* A congestion control's state at a new k: its own way, or its rate scaled
 * and its window kept within the new maximum. */
static void cc_rescale(struct ethp_nic *n, struct ethp_cc_state *st,
                       const struct ethp_cc_params *pp, double ratio)
{
    if (n->cc->on_rescale) {
        n->cc->on_rescale(st, pp, ratio);
        return;
    }
    if (st->rate_bps)
        st->rate_bps = scaled_bps(st->rate_bps, ratio);
    if (st->cwnd_bytes > pp->max_cwnd_bytes)
        st->cwnd_bytes = pp->max_cwnd_bytes;
}

/* The lab's clock moved to k: every real setting from cfg0 (made at
 * cfg0.time_scale) by the ratio, and the state that holds real times or
 * rates moved with it (congestion control's rates scaled, its window kept
 * within the new maximum, retransmit timers re-armed).  Packets already paced keep
 * their times; nothing in flight is lost or resent for it. */
static void nic_rescale(struct ethp_nic *n, double k, uint64_t now)
{
    const struct ethp_nic_cfg *c0 = &n->cfg0;
    struct ethp_nic_cfg *c = &n->cfg;
    double r = k / c0->time_scale, r_step = k / c->time_scale;
    uint64_t un = c0->unscaled_rtt_ns < c0->base_rtt_ns ? c0->unscaled_rtt_ns : c0->base_rtt_ns;
    c->time_scale = k;
    c->rate_bps = scaled_bps(c0->rate_bps, r);
    set_ahead(n);
    c->base_rtt_ns = scaled_ns(c0->base_rtt_ns - un, r) + un;
    c->rto_ns = scaled_ns(c0->rto_ns, r);
    if (c->rto_ns < c0->rto_floor_ns)
        c->rto_ns = c0->rto_floor_ns;
    c->cnp_interval_ns = scaled_ns(c0->cnp_interval_ns, r);
    c->dcqcn_timer_ns = scaled_ns(c0->dcqcn_timer_ns, r) ? scaled_ns(c0->dcqcn_timer_ns, r) : 1;
    c->dcqcn_rai_bps = scaled_bps(c0->dcqcn_rai_bps, r);
    c->dcqcn_rhai_bps = scaled_bps(c0->dcqcn_rhai_bps, r);
    c->dcqcn_min_rate_bps = scaled_bps(c0->dcqcn_min_rate_bps, r);
    /* the window is a BDP: it changes only by the unscaled part of the RTT */
    double bdp_ratio = (double)c->base_rtt_ns / r / (double)c0->base_rtt_ns;
    c->max_cwnd_bytes = (uint64_t)((double)c0->max_cwnd_bytes * bdp_ratio);
    if (c->max_cwnd_bytes < 8ull * c->payload_bytes)
        c->max_cwnd_bytes = 8ull * c->payload_bytes;
    n->bdp_bytes = (uint64_t)((unsigned __int128)c->rate_bps * n->n_ports * c->base_rtt_ns / 8 /
                              1000000000u);
    struct ethp_cc_params pp = cc_params(n);
    uint32_t subs = c->roce ? c->qps : n->n_ports;
    for (uint32_t i = 0; i < n->max_peers; i++) {
        struct nic_peer *p = &n->peers[i];
        if (!p->known)
            continue;
        for (uint32_t j = 0; j < subs; j++)
            cc_rescale(n, &p->cc[j].st, &pp, r_step);
        p->reo_ns = reorder_window_ns(c);
        p->rto_ns = c->rto_ns;
        if (p->rto_deadline)
            p->rto_deadline = now + p->rto_ns;
    }
    for (uint32_t i = 0; i < n->inc.n_aggs; i++) {
        n->inc.agg[i].rto_ns = c->rto_ns;
        if (n->inc.agg[i].deadline_ns)
            n->inc.agg[i].deadline_ns = now + c->rto_ns;
    }
    n->c[ETHP_NC_rescales]++;
}

/* Once a pass: a new k on the clock; every NIC_CLOCK_POLL_NS, ring drops
 * to report. */
static void follow_clock(struct ethp_nic *n, uint64_t now)
{
    uint64_t g = ethp_clock_gen(n->clock);
    if (g != n->clock_gen) {
        n->clock_gen = g;
        double k = ethp_clock_k(n->clock);
        if (k != n->cfg.time_scale)
            nic_rescale(n, k, now);
    }
    /* ring drops are read from the kernel (two getsockopts): not every pass */
    if (now < n->ring_drops_read_ns + NIC_CLOCK_POLL_NS)
        return;
    n->ring_drops_read_ns = now;
    uint64_t io[ETHP_PORT_NCOUNTERS];
    n->io.counters(n->io.ctx, io);
    if (io[ETHP_PC_rx_ring_drops] != n->ring_drops_reported) {
        ethp_clock_report(n->clock, ETHP_CLOCK_R_RING_DROPS,
                          io[ETHP_PC_rx_ring_drops] - n->ring_drops_reported);
        n->ring_drops_reported = io[ETHP_PC_rx_ring_drops];
    }
}

static void *nic_main(void *arg)
{
    struct ethp_nic *n = arg;
    struct epoll_event evs[8];
    prctl(PR_SET_TIMERSLACK, 1UL);
    /* cpu.NIC_THREAD: a rank's dataplane thread, whose CPU wait is judged */
    prctl(PR_SET_NAME, (unsigned long)"ethp-nic");
    uint64_t prev = ethp_now_ns();
    while (!__atomic_load_n(&n->stop, __ATOMIC_ACQUIRE)) {
        uint64_t due = next_due(n), due_inc = inc_due(n);
        due = due < due_inc ? due : due_inc;
        /* an idle engine still looks at the clock now and then, so that it
         * is at the lab's k before its next message (and reports it) */
        uint64_t clock_due = n->clock ? ethp_now_ns() + NIC_CLOCK_POLL_NS : UINT64_MAX;
        int idle_wait = clock_due < due;
        due = idle_wait ? clock_due : due;
        int k = ethp_epoll_until(n->epfd, evs, 8, due);
        for (int i = 0; i < k; i++)
            if ((uint32_t)evs[i].data.u64 != NIC_EVFD_TAG) {
                n->io.event(n->io.ctx, evs[i].data.u64);
            } else {
                uint64_t v;
                if (read(n->evfd, &v, sizeof(v)) < 0) { /* drained already */ }
            }
        take_commands(n);
        uint64_t now = ethp_now_ns();
        if (!idle_wait)
            engine_lateness(n, due, prev, now);
        prev = now;
        if (n->clock)
            follow_clock(n, now);
        rx(n, now);
        /* Peers take turns: the one served first moves on every pass, so a
         * port's free slots are shared among its peers (as a NIC's QP
         * scheduler shares them) rather than going to the first in the list. */
        uint32_t na = n->n_active, first = na ? n->rr++ % na : 0;
        for (uint32_t i = 0; i < na; i++) {
            struct nic_peer *p = &n->peers[n->active[(first + i) % na]];
            if (p->ack_pending)
                send_ack(n, p);
            if (n->cfg.roce && n->cfg.dcqcn) {
                struct ethp_cc_params pp = cc_params(n);
                uint64_t rate = 0;
                for (uint32_t q = 0; q < n->cfg.qps; q++) {
                    n->cc->on_tick(&p->cc[q].st, &pp, now, p->qp[q].sent_bytes);
                    p->qp[q].sent_bytes = 0;
                    rate += p->cc[q].st.rate_bps;
                }
                p->c[ETHP_NC_rate_bps] = rate;
            }
            timers(n, p, now);
            pump(n, p, now);
        }
        uint32_t kept = 0;
        for (uint32_t k = 0; k < n->n_active; k++) {
            struct nic_peer *p = &n->peers[n->active[k]];
            if (peer_busy(p))
                n->active[kept++] = n->active[k];
            else
                p->active = 0;
        }
        n->n_active = kept;
        inc_timers(n, now);
        pump_inc(n, now);
        for (uint32_t i = 0; i < n->n_ports; i++)
            if (n->ports[i].ntx)
                flush_port(n, &n->ports[i]);
    }
    return NULL;
}

/* ---------------------------------------------------------------- API */

static int quiet_udp_port(const char *netns_path, uint16_t port)
{
    /* A UDP socket on the ETH+ port whose filter drops everything: the host's
     * kernel then has a listener and never answers ETH+ frames with ICMP
     * port unreachable, and never queues them either. */
    int fd = ethp_netns_socket(netns_path, AF_INET, SOCK_DGRAM, 0);
    if (fd < 0)
        return fd;
    struct sock_filter drop = BPF_STMT(BPF_RET | BPF_K, 0);
    struct sock_fprog prog = {.len = 1, .filter = &drop};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)) < 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

/* The engine's I/O in a lab: one AF_PACKET port bound to every interface
 * of the node's namespace. */
struct nic_port_io {
    struct ethp_port *port;
    char netns_path[256];
};

static int pio_ifindex(void *ctx, const char *ifname)
{
    const struct nic_port_io *io = ctx;
    return ethp_netns_ifindex(io->netns_path[0] ? io->netns_path : NULL, ifname);
}

static uint32_t pio_tx(void *ctx, struct ethp_pkt **pkts, uint32_t k, int ifindex)
{
    return ethp_port_tx_burst_to(((struct nic_port_io *)ctx)->port, pkts, k, ifindex);
}

static void pio_wait_tx(void *ctx, int timeout_ms)
{
    ethp_port_wait_tx(((struct nic_port_io *)ctx)->port, timeout_ms);
}

static uint32_t pio_rx_each(void *ctx, uint32_t k, ethp_frame_fn fn, void *arg)
{
    return ethp_port_rx_each(((struct nic_port_io *)ctx)->port, k, fn, arg);
}

static uint64_t pio_due_ns(void *ctx) { return ethp_port_due_ns(((struct nic_port_io *)ctx)->port); }

static int pio_watch(void *ctx, int epfd, uint32_t tag)
{
    return ethp_port_watch(((struct nic_port_io *)ctx)->port, epfd, tag);
}

static void pio_event(void *ctx, uint64_t data) { ethp_port_event(((struct nic_port_io *)ctx)->port, data); }

static void pio_counters(void *ctx, uint64_t *out)
{
    ethp_port_counters(((struct nic_port_io *)ctx)->port, out);
}

static void pio_close(void *ctx)
{
    struct nic_port_io *io = ctx;
    ethp_port_close(io->port);
    free(io);
}

struct ethp_nic *ethp_nic_new_io(const struct ethp_nic_cfg *cfg, const struct ethp_nic_io *io,
                                 uint32_t max_peers, int *err)
{
    if (!cfg->rate_bps || cfg->payload_bytes <= ETHP_INT_BYTES || cfg->payload_bytes > 9000 ||
        !cfg->n_evs || cfg->cc > ETHP_CCA_RCCC || !max_peers || max_peers > 65536 ||
        (cfg->roce && (!cfg->qps || cfg->qps > ETHP_NIC_MAX_PLANES || !cfg->dcqcn_g_inv ||
                       !cfg->dcqcn_timer_ns || !cfg->dcqcn_byte_counter_bytes))) {
        io->close(io->ctx);
        *err = -EINVAL;
        return NULL;
    }
    struct ethp_nic *n = calloc(1, sizeof(*n));
    if (!n) {
        io->close(io->ctx);
        *err = -ENOMEM;
        return NULL;
    }
    n->io = *io;
    n->cfg = n->cfg0 = *cfg;
    set_ahead(n);
    if (!(cfg->time_scale >= 1.0))
        n->cfg.time_scale = n->cfg0.time_scale = 1.0;
    n->epoch = new_epoch();
    n->cc = cfg->cc == ETHP_CCA_HPCC ? &ethp_cc_hpcc : &ethp_cc_nscc;
    n->credits = cfg->cc == ETHP_CCA_RCCC && !cfg->roce;
    if (cfg->roce) {
        n->cc = &ethp_cc_dcqcn;
        n->cfg.compact = 0; /* RoCEv2 is IPv4/UDP */
    }
    n->data_bytes = cfg->payload_bytes - (n->cc->on_int ? ETHP_INT_BYTES : 0);
    n->max_peers = max_peers;
    n->udp_fd = -1;
    n->rng = ethp_rng_seed(cfg->seed);
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->done, NULL);
    n->peers = calloc(max_peers, sizeof(*n->peers));
    n->active = calloc(max_peers, sizeof(*n->active));
    n->pool = ethp_pool_new(8192, cfg->payload_bytes + 256);
    n->epfd = epoll_create1(EPOLL_CLOEXEC);
    n->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int rc = 0;
    if (!n->peers || !n->active || !n->pool || n->epfd < 0 || n->evfd < 0)
        rc = -ENOMEM;
    if (!rc) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = NIC_EVFD_TAG};
        rc = n->io.watch(n->io.ctx, n->epfd, NIC_RING_TAG);
        if (!rc && epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->evfd, &ev) < 0)
            rc = -errno;
    }
    if (rc) {
        ethp_nic_free(n);
        *err = rc;
        return NULL;
    }
    *err = 0;
    return n;
}

struct ethp_nic *ethp_nic_new(const struct ethp_nic_cfg *cfg, const char *netns_path,
                              uint32_t max_peers, int *err)
{
    struct nic_port_io *pio = calloc(1, sizeof(*pio));
    if (!pio) {
        *err = -ENOMEM;
        return NULL;
    }
    snprintf(pio->netns_path, sizeof(pio->netns_path), "%s", netns_path ? netns_path : "");
    struct ethp_port_cfg pc = {.block_bytes = 1u << 16, .n_blocks = 256, .block_timeout_ms = 1,
                               .sndbuf_bytes = 4u << 20, .ring_idle_ms = cfg->ring_idle_ms};
    pio->port = ethp_port_open(netns_path, NULL, &pc, err);
    if (!pio->port) {
        free(pio);
        return NULL;
    }
    struct ethp_nic_io io = {.ctx = pio, .ifindex = pio_ifindex, .tx = pio_tx,
                             .wait_tx = pio_wait_tx, .rx_each = pio_rx_each,
                             .due_ns = pio_due_ns, .watch = pio_watch, .event = pio_event,
                             .counters = pio_counters, .close = pio_close};
    struct ethp_nic *n = ethp_nic_new_io(cfg, &io, max_peers, err);
    if (n && !n->cfg.compact) {
        n->udp_fd = quiet_udp_port(netns_path, cfg->roce ? ETHP_ROCE_UDP_PORT : ETHP_UDP_PORT);
        if (n->udp_fd < 0) {
            *err = n->udp_fd;
            ethp_nic_free(n);
            return NULL;
        }
    }
    return n;
}

int ethp_nic_add_port(struct ethp_nic *n, const char *ifname, const uint8_t *mac,
                      const uint8_t *gw_mac, uint32_t ip)
{
    if (n->started || n->n_ports >= ETHP_NIC_MAX_PLANES)
        return -EINVAL;
    int ifx = n->io.ifindex(n->io.ctx, ifname);
    if (ifx < 0)
        return ifx;
    struct nic_port *pt = &n->ports[n->n_ports];
    pt->ifindex = ifx;
    memcpy(pt->mac, mac, 6);
    memcpy(pt->gw_mac, gw_mac, 6);
    pt->ip = ip;
    pt->up = 1;
    return (int)n->n_ports++;
}

int ethp_nic_add_peer(struct ethp_nic *n, uint32_t ep, const uint32_t *ips, uint32_t count_ips)
{
    if (n->started || ep >= n->max_peers || ep == n->cfg.ep || count_ips != n->n_ports)
        return -EINVAL;
    struct nic_peer *p = &n->peers[ep];
    p->ep = ep;
    memcpy(p->ip, ips, count_ips * sizeof(uint32_t));
    p->rbits = calloc(NIC_RWIN / 8, 1);
    if (!p->rbits)
        return -ENOMEM;
    for (uint32_t q = 0; n->cfg.roce && q < n->cfg.qps; q++) {
        /* a fixed UDP source port per QP (the ECMP hash input), its plane in the low bits */
        uint64_t h = (uint64_t)n->cfg.ep * 0x9E3779B97F4A7C15ull ^ (uint64_t)(ep * 64 + q) * 0xC2B2AE3D27D4EB4Full;
        p->qp[q].ev = (uint16_t)(((h >> 32) % n->cfg.n_evs) << 4 | (q % n->n_ports));
    }
    peer_fresh(n, p);
    p->reo_ns = reorder_window_ns(&n->cfg);
    p->known = 1;
    return 0;
}

int ethp_nic_set_clock(struct ethp_nic *n, struct ethp_clock *clock)
{
    if (n->started || !clock)
        return -EINVAL;
    n->clock = clock;
    ethp_clock_attach_engine(clock);
    return 0;
}

double ethp_nic_time_scale(const struct ethp_nic *n)
{
    return *(volatile const double *)&n->cfg.time_scale; /* the engine's; a torn read is harmless */
}

int ethp_nic_start(struct ethp_nic *n)
{
    if (n->started || !n->n_ports)
        return -EINVAL;
    /* Until a receiver's first grant, a sender assumes every peer sends to
     * that receiver too: a fan-in of all of them starts within its budget. */
    n->bdp_bytes = (uint64_t)((unsigned __int128)n->cfg.rate_bps * n->n_ports *
                              n->cfg.base_rtt_ns / 8 / 1000000000u);
    uint32_t known = 0;
    for (uint32_t i = 0; i < n->max_peers; i++)
        known += n->peers[i].known;
    for (uint32_t i = 0; i < n->max_peers; i++) {
        n->peers[i].credit_sub_bytes = UINT64_MAX;
        if (n->peers[i].known)
            set_credit(n, &n->peers[i], n->bdp_bytes / (known ? known : 1));
    }
    int rc = pthread_create(&n->thread, NULL, nic_main, n);
    if (rc)
        return -rc;
    n->started = 1;
    return 0;
}

void ethp_nic_free(struct ethp_nic *n)
{
    if (!n)
        return;
    if (n->started) {
        __atomic_store_n(&n->stop, 1, __ATOMIC_RELEASE);
        ethp_kick(n->evfd);
        pthread_join(n->thread, NULL);
    }
    for (uint32_t i = 0; n->peers && i < n->max_peers; i++) {
        free(n->peers[i].win);
        free(n->peers[i].rbits);
    }
    for (uint64_t i = 0; i < n->n_msgs; i++)
        free(n->msgs[i]);
    for (uint32_t i = 0; i < n->inc.n_aggs; i++)
        free(n->inc.agg[i].chunk);
    free(n->msgs);
    free(n->peers);
    free(n->active);
    if (n->io.close)
        n->io.close(n->io.ctx);
    ethp_pool_free(n->pool);
    if (n->udp_fd >= 0)
        close(n->udp_fd);
    if (n->epfd >= 0)
        close(n->epfd);
    if (n->evfd >= 0)
        close(n->evfd);
    pthread_mutex_destroy(&n->lock);
    pthread_cond_destroy(&n->done);
    free(n);
}

static int64_t queue_msg(struct ethp_nic *n, struct nic_msg *m);

static int64_t post(struct ethp_nic *n, uint32_t peer, uint32_t tag, uint8_t *buf, uint64_t len,
                    int is_send)
{
    if (!peer_of(n, peer))
        return ETHP_NIC_ERR_NO_SUCH;
    if (len > 0xffffffffull || (len && !buf))
        return -EINVAL;
    struct nic_msg *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    *m = (struct nic_msg){.peer = peer, .tag = tag, .buf = buf, .len = len, .is_send = is_send,
                          .status = ETHP_NIC_PENDING, .total = is_send ? len : UINT64_MAX};
    return queue_msg(n, m);
}

int64_t ethp_nic_post_allreduce(struct ethp_nic *n, uint8_t *buf, uint64_t count, uint32_t dtype,
                                uint32_t op)
{
    if (!n->inc.window)
        return ETHP_NIC_ERR_NO_GROUP;
    if (dtype > ETHP_AGG_BF16 || op > ETHP_AGG_MIN || (count && !buf))
        return -EINVAL;
    struct nic_msg *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    uint64_t len = count * ethp_agg_elem_bytes(dtype);
    *m = (struct nic_msg){.buf = buf, .len = len, .is_send = 1, .inc = 1, .dtype = (uint8_t)dtype,
                          .op = (uint8_t)op, .status = ETHP_NIC_PENDING, .total = len};
    if (!len) {
        m->status = ETHP_NIC_OK; /* nothing to reduce */
    }
    return queue_msg(n, m);
}

int ethp_nic_inc_setup(struct ethp_nic *n, const struct ethp_nic_agg *aggs, uint32_t n_aggs,
                       uint32_t window)
{
    if (n->started || n->cfg.roce || n->inc.n_aggs || !n_aggs || n_aggs > ETHP_NIC_MAX_PLANES ||
        !window || window > ETHP_AGG_MAX_WINDOW)
        return -EINVAL;
    struct nic_inc *g = &n->inc;
    for (uint32_t i = 0; i < n_aggs; i++) {
        const struct ethp_nic_agg *x = &aggs[i];
        if (x->plane >= n->n_ports || x->id >= ETHP_AGG_MAX_IDS || !x->members ||
            x->members > ETHP_AGG_MAX_MEMBERS || x->index >= x->members)
            return -EINVAL;
    }
    for (uint32_t i = 0; i < n_aggs; i++) {
        const struct ethp_nic_agg *x = &aggs[i];
        g->agg[i] = (struct inc_agg){.id = x->id, .plane = x->plane, .group = x->group,
                                     .members = x->members, .index = x->index,
                                     .rto_ns = n->cfg.rto_ns,
                                     .chunk = calloc(window, sizeof(uint64_t))};
        g->n_aggs = i + 1;
        if (!g->agg[i].chunk)
            return -ENOMEM;
    }
    g->window = window;
    return 0;
}

static int64_t queue_msg(struct ethp_nic *n, struct nic_msg *m)
{
    pthread_mutex_lock(&n->lock);
    if (n->n_msgs == n->cap_msgs) {
        uint64_t cap = n->cap_msgs ? n->cap_msgs * 2 : 1024;
        struct nic_msg **a = realloc(n->msgs, cap * sizeof(*a));
        if (!a) {
            pthread_mutex_unlock(&n->lock);
            free(m);
            return -ENOMEM;
        }
        n->msgs = a;
        n->cap_msgs = cap;
    }
    n->msgs[n->n_msgs++] = m;
    m->handle = (int64_t)n->n_msgs;
    if (n->cmd_tail)
        n->cmd_tail->next = m;
    else
        n->cmd_head = m;
    n->cmd_tail = m;
    pthread_mutex_unlock(&n->lock);
    ethp_kick(n->evfd);
    return m->handle;
}

int64_t ethp_nic_post_send(struct ethp_nic *n, uint32_t peer, uint32_t tag, const uint8_t *buf,
                           uint64_t len)
{
    return post(n, peer, tag, (uint8_t *)buf, len, 1);
}

int64_t ethp_nic_post_recv(struct ethp_nic *n, uint32_t peer, uint32_t tag, uint8_t *buf,
                           uint64_t len)
{
    return post(n, peer, tag, buf, len, 0);
}

int ethp_nic_wait(struct ethp_nic *n, int64_t handle, int timeout_ms, uint64_t *bytes)
{
    pthread_mutex_lock(&n->lock);
    if (handle < 1 || (uint64_t)handle > n->n_msgs) {
        pthread_mutex_unlock(&n->lock);
        return ETHP_NIC_ERR_NO_SUCH;
    }
    struct nic_msg *m = n->msgs[handle - 1];
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    dl.tv_sec += (time_t)(ns / 1000000000ull);
    dl.tv_nsec = (long)(ns % 1000000000ull);
    while (m->status == ETHP_NIC_PENDING && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&n->done, &n->lock);
        else if (pthread_cond_timedwait(&n->done, &n->lock, &dl) == ETIMEDOUT)
            break;
    }
    int st = m->status;
    if (bytes)
        *bytes = m->is_send ? m->len : (m->total == UINT64_MAX ? 0 : m->total);
    pthread_mutex_unlock(&n->lock);
    return st;
}

void ethp_nic_counters(struct ethp_nic *n, int32_t peer, uint64_t *out)
{
    const uint64_t *c = peer < 0 ? n->c : (peer_of(n, (uint32_t)peer) ? n->peers[peer].c : NULL);
    for (int i = 0; i < ETHP_NIC_NCOUNTERS; i++)
        out[i] = c ? __atomic_load_n(&c[i], __ATOMIC_RELAXED) : 0;
    /* the window and the rate are state, not counters: summed here, on read */
    out[ETHP_NC_cwnd_bytes] = out[ETHP_NC_credit_bytes] = 0;
    if (peer < 0) { /* the port's receive mode, from its own counters */
        uint64_t io[ETHP_PORT_NCOUNTERS];
        n->io.counters(n->io.ctx, io);
        out[ETHP_NC_rx_one_by_one] = io[ETHP_PC_rx_one_by_one];
        out[ETHP_NC_ring_builds] = io[ETHP_PC_ring_builds];
        out[ETHP_NC_ring_parks] = io[ETHP_PC_ring_parks];
        out[ETHP_NC_rx_ring_drops] = io[ETHP_PC_rx_ring_drops];
        out[ETHP_NC_rate_bps] = 0;
        for (uint32_t i = 0; i < n->max_peers; i++)
            out[ETHP_NC_rate_bps] += __atomic_load_n(&n->peers[i].c[ETHP_NC_rate_bps], __ATOMIC_RELAXED);
    }
    for (uint32_t i = peer < 0 ? 0 : (uint32_t)peer; c && i < n->max_peers; i++) {
        const struct nic_peer *q = &n->peers[i];
        for (uint32_t j = 0; q->known && q->win && j < (n->cfg.roce ? n->cfg.qps : n->n_ports); j++)
            out[ETHP_NC_cwnd_bytes] += __atomic_load_n(&q->cc[j].st.cwnd_bytes, __ATOMIC_RELAXED);
        if (q->known)
            out[ETHP_NC_credit_bytes] += __atomic_load_n(&q->credit_bytes, __ATOMIC_RELAXED);
        if (peer >= 0)
            break;
    }
}

int ethp_nic_set_plane(struct ethp_nic *n, uint32_t plane, uint32_t up)
{
    if (plane >= n->n_ports)
        return -EINVAL;
    __atomic_store_n(&n->ports[plane].up, up ? 1 : 0, __ATOMIC_RELEASE);
    ethp_kick(n->evfd);
    return 0;
}

uint32_t ethp_nic_epoch(const struct ethp_nic *n) { return n->epoch; }
