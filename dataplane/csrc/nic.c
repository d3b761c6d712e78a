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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nic_int.h"

#define ETHP_X_NAME(name, help) #name,
static const char *const nic_names[] = {ETHP_NIC_COUNTERS(ETHP_X_NAME)};
#undef ETHP_X_NAME
uint32_t ethp_nic_counter_count(void) { return ETHP_NIC_NCOUNTERS; }
const char *ethp_nic_counter_name(uint32_t i)
{
    return i < ETHP_NIC_NCOUNTERS ? nic_names[i] : NULL;
}

struct rx_ctx {
    struct ethp_nic *n;
    uint64_t now;
    int stamped;           /* the port gives arrival stamps */
    struct ethp_rx_clock clock; /* the stamps are set against it */
    uint64_t wait_sum_ns;  /* frames' waits in the ring before it (rx_wait_*) */
    uint64_t wait_frames;
    uint64_t wait_max_ns;  /* the longest of them */
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
    struct ethp_cc_params pp = nic_cc_params(n);
    for (uint32_t i = 0; i < nic_subs(n); i++) {
        p->cc[i] = (struct nic_cc){0};
        n->cc->init(&p->cc[i].st, &pp);
    }
    if (n->mode->fresh)
        n->mode->fresh(n, p);
    p->rto_ns = n->cfg.rto_ns;
}

/* Unfinished messages to and from p start over: sends from their first
 * byte (new message ids, from 0, in their order), receives unbound and
 * first in line again; sequence numbers, windows and timers as new. */
static void peer_reset(struct ethp_nic *n, struct nic_peer *p)
{
    nic_count(n, p, ETHP_NC_peer_resets, 1);
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
    if (p->win) /* back to untouched zero pages (cannot fail, unlike a new map) */
        madvise(p->win, NIC_WIN * sizeof(*p->win), MADV_DONTNEED);
    p->snd_una = p->snd_nxt = p->high_sack = 0;
    p->have_sack = 0;
    p->inflight_bytes = 0;
    p->n_lost = 0;
    p->retx_due_ns = 0;
    p->rto_ns = n->cfg.rto_ns;
    p->rto_deadline = 0;
    p->timeouts = 0;
    p->rnr_until = p->rnr_backoff_ns = 0;
    p->rnr_since_ns = 0;
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
        nic_rx_open(n, p, -1);
        if (m->status != ETHP_NIC_PENDING)
            continue; /* failed already (too small): nothing to redo */
        m->bound = 0;
        m->done_bytes = 0;
        m->total = UINT64_MAX;
        m->psn_known = 0; /* the peer's new incarnation numbers it anew */
        m->end_bytes = 0;
        int j = nb++;
        for (; j > 0 && back[j - 1]->seq > m->seq; j--)
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
    nic_activate(n, p);
}

/* 1 if a frame from p may go on: its epochs are current (see above). */
static int epoch_ok(struct ethp_nic *n, struct nic_peer *p, const struct ethp_hdr_fields *h,
                    uint64_t now)
{
    if (!h->src_epoch || (p->epoch && (int32_t)(h->src_epoch - p->epoch) < 0)) {
        nic_count(n, p, ETHP_NC_rx_stale_epoch, 1); /* its sender is gone (or never was one) */
        return 0;
    }
    if (h->src_epoch != p->epoch) {
        if (p->epoch)
            peer_reset(n, p); /* it restarted */
        p->epoch = h->src_epoch;
    }
    if (h->dst_epoch && h->dst_epoch != n->epoch) {
        nic_count(n, p, ETHP_NC_rx_stale_epoch, 1); /* meant for an earlier incarnation here */
        if (!p->hello_ns || now - p->hello_ns >= n->cfg.base_rtt_ns) {
            p->hello_ns = now;
            nic_send_ctl(n, p, ETHP_OP_HELLO, 0, 0, 0, 0, 0, 0, NULL, 0);
            nic_count(n, p, ETHP_NC_tx_hellos, 1);
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
    if (c->stamped) {
        uint64_t stamp = n->io.rx_stamp_ns(n->io.ctx);
        /* A frame that came in since the pass began is handled when it was
         * read, not at the pass's clock: before it came, had the thread
         * been stopped mid-read (an ack's RTT sample would leave the stop
         * out, and a pacer would not see the time that went by). */
        if (ethp_rx_clock_see(&c->clock, stamp))
            c->now = c->clock.mono_ns;
        if (stamp && stamp < c->clock.wall_ns) {
            uint64_t wait = c->clock.wall_ns - stamp;
            c->wait_sum_ns += wait;
            if (wait > c->wait_max_ns)
                c->wait_max_ns = wait;
            if (wait > n->c[ETHP_NC_rx_wait_max_ns])
                n->c[ETHP_NC_rx_wait_max_ns] = wait;
        }
        c->wait_frames += stamp != 0;
    }
    int kind = ethp_parse(data, len, &ps);
    if (kind == ETHP_KIND_MACCTL) {
        nic_on_pause(n, data, len, ifindex, c->now);
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
    int mine = n->mode->takes(kind, &ps);
    if (mine < 0) {
        n->c[ETHP_NC_rx_frames]++;
        n->c[ETHP_NC_rx_malformed]++; /* to the mode's port, but no valid header */
        return;
    }
    if (!mine)
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
        nic_on_agg_result(n, &ps, data + ps.payload_off, (uint32_t)plane, c->now);
        return;
    }
    struct nic_peer *p = nic_peer_of(n, ps.hdr.src_ep);
    if (!p || ps.hdr.dst_ep != n->cfg.ep) {
        n->c[ETHP_NC_rx_malformed]++;
        return;
    }
    if (kind != ETHP_KIND_ETHP_COMPACT && ps.addr.src_ip != p->ip[plane]) {
        nic_count(n, p, ETHP_NC_rx_spoofed, 1);
        return;
    }
    if (!epoch_ok(n, p, &ps.hdr, c->now))
        return;
    if (p->asleep)
        nic_wake(n, p); /* what it waited for, or news of it */
    const uint8_t *payload = data + ps.payload_off;
    switch (ps.hdr.opcode) {
    case ETHP_OP_DATA:
        n->mode->on_data(n, p, &ps, payload, c->now);
        break;
    case ETHP_OP_ACK:
        n->mode->on_ack(n, p, &ps, payload, c->now);
        break;
    case ETHP_OP_CNP:
        nic_on_cnp(n, p, &ps, c->now);
        break;
    case ETHP_OP_NACK:
        n->mode->on_nack(n, p, &ps, c->now);
        break;
    case ETHP_OP_RNR:
        nic_on_rnr(n, p, &ps, c->now);
        break;
    case ETHP_OP_HELLO: /* its epoch did all there is to do */
        nic_count(n, p, ETHP_NC_rx_hellos, 1);
        break;
    default:
        n->c[ETHP_NC_rx_malformed]++;
    }
}

/* Read every frame waiting; how long they waited in the ring (the kernel's
 * arrival stamps against the time reading began) is the engine's RX
 * backlog: time an engine kept from running by the machine adds to every
 * frame's delay, even when nothing it had to send was late.  A frame left
 * unread for longer than NIC_RX_STALL_NS puts the rest of its wait in the
 * lab's union of stalls (*stall_from, the earliest start of this pass's
 * stall): an engine stopped while it had nothing due (its process frozen,
 * say) is found out by what came in meanwhile.  Each frame is handled at
 * the pass's clock (now) or, if it came in since, when it was read; returns
 * the clock the pass goes on with. */
static uint64_t rx(struct ethp_nic *n, uint64_t now, uint64_t *stall_from)
{
    struct rx_ctx c = {.n = n, .now = now, .stamped = n->io.rx_stamp_ns != NULL};
    if (c.stamped)
        ethp_rx_clock_read(&c.clock);
    while (n->io.rx_each(n->io.ctx, NIC_BURST, on_frame, &c) == NIC_BURST)
        ;
    now = c.now;
    if (!c.wait_frames)
        return now;
    n->c[ETHP_NC_rx_wait_sum_ns] += c.wait_sum_ns;
    n->c[ETHP_NC_rx_wait_frames] += c.wait_frames;
    if (n->clock) {
        ethp_clock_report(n->clock, ETHP_CLOCK_R_RX_WAIT_SUM_NS, c.wait_sum_ns);
        ethp_clock_report(n->clock, ETHP_CLOCK_R_RX_WAIT_FRAMES, c.wait_frames);
    }
    uint64_t over = c.wait_max_ns > NIC_RX_STALL_NS ? c.wait_max_ns - NIC_RX_STALL_NS : 0;
    if (over && over < now && now - over < *stall_from)
        *stall_from = now - over;
    return now;
}

/* ---------------------------------------------------------------- timers, loop */

/* The engine thread: free what it took off n->reap -- finished before its
 * pass began, so nothing of the pass before holds it -- except a receive
 * that failed bound (too small: its packets keep coming and find it), kept
 * till the NIC's end as a schedule's are.  Their slots are free again. */
static void free_reaped(struct ethp_nic *n, struct nic_msg *list)
{
    if (!list)
        return;
    nic_msg_unslot(n, list);
    while (list) {
        struct nic_msg *m = list;
        list = m->done_next;
        if (m->bound) {
            m->done_next = n->orphans;
            n->orphans = m;
            continue;
        }
        if (m->sched_role == NIC_SCHED_WHOLE)
            nic_sched_free(m->sched); /* NULL once its schedule retired */
        free(m);
    }
}

/* The callers' posts, in order; then the messages they released that had
 * finished when this pass began (a message finished at its post, an empty
 * in-network all-reduce, is taken as a command first). */
static void take_commands(struct ethp_nic *n)
{
    pthread_mutex_lock(&n->lock);
    struct nic_msg *m = n->cmd_head, *reap = n->reap;
    n->cmd_head = n->cmd_tail = NULL;
    n->reap = NULL;
    pthread_mutex_unlock(&n->lock);
    while (m) {
        struct nic_msg *next = m->next;
        m->next = NULL;
        if (m->sched_role == NIC_SCHED_WHOLE) {
            nic_sched_start(n, m);
        } else if (m->inc) {
            struct nic_inc *g = &n->inc;
            if (m->status == ETHP_NIC_PENDING) { /* empty: done at once */
                if (g->tail) {
                    g->tail->next = m;
                } else {
                    g->head = m;
                    nic_inc_start(n, m);
                }
                g->tail = m;
            }
        } else {
            nic_bind(n, m);
        }
        m = next;
    }
    free_reaped(n, reap);
}

/* The earliest time something is due: a timeout, or the port the next
 * packet of some peer waits for. */
static uint64_t next_due(struct ethp_nic *n)
{
    uint64_t t = n->io.due_ns(n->io.ctx); /* an idle ring to take down, a frame due */
    uint64_t now = ethp_now_ns();
    if (n->n_sleeping && n->sleep_due < t)
        t = n->sleep_due;
    for (uint32_t k = 0; k < n->n_active; k++) {
        struct nic_peer *p = &n->peers[n->active[k]];
        if (p->rto_deadline && p->rto_deadline < t)
            t = p->rto_deadline;
        uint64_t d = n->mode->due(n, p, now);
        t = d < t ? d : t;
    }
    return t;
}

/* Did the engine run when its next packet or timer was due?  Lateness
 * against the earlier of the due time and the previous pass (each ns of it
 * counted once); what the pacers' catch-up cannot make up is link time
 * lost.  Lateness over a hundredth of the real base RTT also belongs in the
 * lab's union of stalls (returned: where the stall began, else UINT64_MAX;
 * nic_pass reports it): a collective waits for its slowest rank, so the
 * time any engine is behind holds every rank up.  The fidelity report's
 * verdict on the endpoints (fidelity.py). */
static uint64_t engine_lateness(struct ethp_nic *n, uint64_t due, uint64_t prev, uint64_t now)
{
    if (due == UINT64_MAX)
        return UINT64_MAX;
    uint64_t from = due > prev ? due : prev;
    if (now <= from + NIC_LATE_NS)
        return UINT64_MAX;
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
    return late > n->cfg.base_rtt_ns / NIC_STALL_RTT_DIV ? from : UINT64_MAX;
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
    nic_set_ahead(n);
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
    struct ethp_cc_params pp = nic_cc_params(n);
    uint32_t subs = c->roce ? c->qps : n->n_ports;
    for (uint32_t i = 0; i < n->n_made; i++) {
        struct nic_peer *p = &n->peers[n->made[i]];
        for (uint32_t j = 0; j < subs; j++)
            cc_rescale(n, &p->cc[j].st, &pp, r_step);
        p->reo_ns = nic_reorder_window_ns(c);
        p->rto_ns = c->rto_ns;
        if (p->rto_deadline)
            p->rto_deadline = now + p->rto_ns;
    }
    for (uint32_t i = 0; i < n->inc.n_aggs; i++) {
        n->inc.agg[i].rto_ns = c->rto_ns;
        if (n->inc.agg[i].deadline_ns)
            n->inc.agg[i].deadline_ns = now + c->rto_ns;
    }
    nic_wake_all(n); /* their deadlines moved */
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

/* When the engine's next pass is due (a packet, a timer, or, with a clock,
 * a look at it now and then: idle_wait). */
static uint64_t nic_due(struct ethp_nic *n, int *idle_wait)
{
    uint64_t due = next_due(n), due_inc = nic_inc_due(n);
    due = due < due_inc ? due : due_inc;
    /* an idle engine still looks at the clock now and then, so that it
     * is at the lab's k before its next message (and reports it) */
    uint64_t clock_due = n->clock ? ethp_now_ns() + NIC_CLOCK_POLL_NS : UINT64_MAX;
    *idle_wait = clock_due < due;
    return *idle_wait ? clock_due : due;
}

/* Off the active list until a frame from the peer, a message for it or
 * its retransmit timer (nic_activate, wake_due). */
static void nic_sleep(struct ethp_nic *n, struct nic_peer *p)
{
    p->active = 0;
    p->asleep = 1;
    p->sleep_idx = n->n_sleeping;
    n->sleeping[n->n_sleeping++] = (uint32_t)(p - n->peers);
    if (n->n_sleeping == 1 || p->rto_deadline < n->sleep_due)
        n->sleep_due = p->rto_deadline;
}

/* Wake the sleepers whose deadline has come; sleep_due becomes the
 * earliest of the others'. */
static void wake_due(struct ethp_nic *n, uint64_t now)
{
    if (!n->n_sleeping || now < n->sleep_due)
        return;
    uint64_t next = UINT64_MAX;
    for (uint32_t i = 0; i < n->n_sleeping;) {
        struct nic_peer *p = &n->peers[n->sleeping[i]];
        if (p->rto_deadline <= now) {
            nic_wake(n, p); /* the last moved into slot i */
            continue;
        }
        next = p->rto_deadline < next ? p->rto_deadline : next;
        i++;
    }
    n->sleep_due = next;
}

/* May a busy peer sleep: it waits for nothing but a frame from its peer or
 * its retransmit timer.  Not in a mode with per-pass timers (RoCE's
 * DCQCN). */
static int may_sleep(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    return !n->mode->tick && !p->ack_pending && !p->n_lost && p->rto_deadline &&
           n->mode->due(n, p, now) == UINT64_MAX;
}

/* Can a port take a packet now. */
static int any_port_free(const struct ethp_nic *n, uint64_t now)
{
    for (uint32_t i = 0; i < n->n_ports; i++)
        if (nic_port_free(n, i, now))
            return 1;
    return 0;
}

/* Has a peer nothing to do but send new packets: while no port can take
 * one, a pass leaves it be.  Measured: a late engine with 60 sends posted
 * visited every one on each pass while its ports' pacers let a few go
 * (a 64-peer fan-out: 126 visits idle, 826 on a loaded machine). */
static int waits_only_for_a_port(const struct ethp_nic *n, const struct nic_peer *p, uint64_t now)
{
    return !n->mode->tick && p->sq_head && !p->ack_pending && !p->n_lost &&
           (!p->rto_deadline || now < p->rto_deadline);
}

/* One pass of the engine, after its epoll set gave k events (evs): the
 * ports' events, commands, the clock, frames in, then every active peer. */
static void nic_pass(struct ethp_nic *n, const struct epoll_event *evs, int k, uint64_t due,
                     int idle_wait)
{
    for (int i = 0; i < k; i++)
        if ((uint32_t)evs[i].data.u64 != NIC_EVFD_TAG) {
            n->io.event(n->io.ctx, evs[i].data.u64);
        } else {
            uint64_t v;
            if (read(n->evfd, &v, sizeof(v)) < 0) { /* drained already */ }
        }
    take_commands(n);
    uint64_t now = ethp_now_ns();
    uint64_t stall_from = idle_wait ? UINT64_MAX : engine_lateness(n, due, n->prev_pass_ns, now);
    n->prev_pass_ns = now;
    if (n->clock)
        follow_clock(n, now);
    now = rx(n, now, &stall_from);
    if (n->clock && stall_from < now)
        ethp_clock_report_late(n->clock, stall_from, now);
    else if (n->clock)
        ethp_clock_flush_late(n->clock); /* spans kept while the union's lock was held */
    nic_sched_pump(n); /* schedules: reductions and next sends for what came in */
    wake_due(n, now);
    /* Peers take turns: the one served first moves on every pass, so a
     * port's free slots are shared among its peers (as a NIC's QP
     * scheduler shares them) rather than going to the first in the list. */
    uint32_t na = n->n_active, first = na ? n->rr++ % na : 0;
    int open = any_port_free(n, now);
    n->c[ETHP_NC_eng_passes]++;
    for (uint32_t i = 0; i < na; i++) {
        struct nic_peer *p = &n->peers[n->active[(first + i) % na]];
        if (!open && waits_only_for_a_port(n, p, now))
            continue; /* as a QP scheduler serves no QP while the port is full */
        n->c[ETHP_NC_eng_peer_visits]++;
        if (p->ack_pending)
            n->mode->send_ack(n, p);
        if (n->mode->tick)
            n->mode->tick(n, p, now);
        nic_timers(n, p, now);
        n->mode->pump(n, p, now);
        open = open && any_port_free(n, now);
    }
    uint32_t kept = 0;
    for (uint32_t j = 0; j < n->n_active; j++) {
        struct nic_peer *p = &n->peers[n->active[j]];
        if (!nic_peer_busy(p))
            p->active = 0;
        else if (may_sleep(n, p, now))
            nic_sleep(n, p);
        else
            n->active[kept++] = n->active[j];
    }
    n->n_active = kept;
    nic_sched_pump(n);
    nic_inc_timers(n, now);
    nic_pump_inc(n, now);
    for (uint32_t i = 0; i < n->n_ports; i++)
        if (n->ports[i].ntx)
            nic_flush_port(n, &n->ports[i]);
}

static void nic_thread_setup(void)
{
    prctl(PR_SET_TIMERSLACK, 1UL);
    /* cpu.NIC_THREAD: a rank's dataplane thread, whose CPU wait is judged */
    prctl(PR_SET_NAME, (unsigned long)"ethp-nic");
    /* this thread only (Linux: nice is per thread).  Measured on erack-8x4,
     * 16 MiB all-reduce at k 9600: the engines' union of late spans fell
     * from 0.016-0.037 of the window to 0.007-0.010 */
    if (setpriority(PRIO_PROCESS, 0, ETHP_NIC_NICE) < 0) {
        /* not allowed (a rootless lab): at the caller's priority */
    }
}

static void *nic_main(void *arg)
{
    struct ethp_nic *n = arg;
    struct epoll_event evs[8];
    nic_thread_setup();
    n->prev_pass_ns = ethp_now_ns();
    while (!__atomic_load_n(&n->stop, __ATOMIC_ACQUIRE)) {
        int idle_wait;
        uint64_t due = nic_due(n, &idle_wait);
        int k = ethp_epoll_until(n->epfd, evs, 8, due);
        nic_pass(n, evs, k, due, idle_wait);
    }
    return NULL;
}

/* ---------------------------------------------------------------- engine groups */

/* One thread runs the loops of many engines (a rank host's): it waits on
 * an epoll set that holds each member's own epoll set, and makes a pass
 * over a member when its set has events or its next pass is due.  Members
 * join and leave while it runs; a member leaving waits until the thread
 * has seen the list without it, so that it is never touched again. */
struct ethp_nic_group {
    pthread_t thread;
    int epfd, evfd;
    pthread_mutex_t lock;
    pthread_cond_t seen;
    struct ethp_nic *members[ETHP_NIC_GROUP_MAX];
    uint32_t n_members;
    uint64_t gen, seen_gen; /* list changes made, and seen by the thread */
    int stop;
};

#define NIC_GROUP_EVFD_TAG 0 /* a member's data.u64 is its address */

static void *group_main(void *arg)
{
    struct ethp_nic_group *g = arg;
    struct ethp_nic *live[ETHP_NIC_GROUP_MAX];
    uint64_t due[ETHP_NIC_GROUP_MAX];
    int idle[ETHP_NIC_GROUP_MAX];
    struct epoll_event gevs[64], evs[8];
    uint8_t stale[ETHP_NIC_GROUP_MAX];
    uint32_t n_live = 0;
    nic_thread_setup();
    for (;;) {
        pthread_mutex_lock(&g->lock);
        if (g->seen_gen != g->gen) {
            n_live = g->n_members;
            memcpy(live, g->members, n_live * sizeof(live[0]));
            memset(stale, 1, n_live);
            g->seen_gen = g->gen;
            pthread_cond_broadcast(&g->seen);
        }
        int stop = g->stop;
        pthread_mutex_unlock(&g->lock);
        if (stop)
            break;
        /* A member's next due time is an absolute time, and only its own
         * pass changes it (a command for it, or a frame, wakes its set and
         * so gets it a pass): worked out again after a pass only, not for
         * every member on every wake-up. */
        uint64_t first = UINT64_MAX;
        for (uint32_t i = 0; i < n_live; i++) {
            if (stale[i]) {
                due[i] = nic_due(live[i], &idle[i]);
                stale[i] = 0;
            }
            first = due[i] < first ? due[i] : first;
        }
        int k = ethp_epoll_until(g->epfd, gevs, 64, first);
        for (int i = 0; i < k; i++) {
            if (gevs[i].data.u64 == NIC_GROUP_EVFD_TAG) {
                uint64_t v;
                if (read(g->evfd, &v, sizeof(v)) < 0) { /* drained already */ }
                continue;
            }
            /* a member's set: it stays alive until the thread has copied
             * a list without it, after this pass at the earliest (a member
             * that joined since the copy is passed over on the next one) */
            ((struct ethp_nic *)(uintptr_t)gevs[i].data.u64)->group_ready = 1;
        }
        uint64_t now = ethp_now_ns();
        for (uint32_t i = 0; i < n_live; i++) {
            struct ethp_nic *n = live[i];
            if (!n->group_ready && due[i] > now)
                continue;
            int kk = n->group_ready ? epoll_wait(n->epfd, evs, 8, 0) : 0;
            n->group_ready = 0;
            nic_pass(n, evs, kk > 0 ? kk : 0, due[i], idle[i]);
            stale[i] = 1;
        }
    }
    return NULL;
}

struct ethp_nic_group *ethp_nic_group_new(int *err)
{
    struct ethp_nic_group *g = calloc(1, sizeof(*g));
    if (!g) {
        *err = -ENOMEM;
        return NULL;
    }
    g->epfd = epoll_create1(EPOLL_CLOEXEC);
    g->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->seen, NULL);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = NIC_GROUP_EVFD_TAG};
    int rc = g->epfd < 0 || g->evfd < 0 ? -errno : 0;
    if (!rc && epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->evfd, &ev) < 0)
        rc = -errno;
    if (!rc)
        rc = -pthread_create(&g->thread, NULL, group_main, g);
    if (rc) {
        if (g->epfd >= 0)
            close(g->epfd);
        if (g->evfd >= 0)
            close(g->evfd);
        free(g);
        *err = rc;
        return NULL;
    }
    *err = 0;
    return g;
}

/* The list changed: wait until the thread has seen it (lock held). */
static void group_changed(struct ethp_nic_group *g)
{
    uint64_t gen = ++g->gen;
    ethp_kick(g->evfd);
    while (g->seen_gen < gen && !g->stop)
        pthread_cond_wait(&g->seen, &g->lock);
}

static int group_join(struct ethp_nic_group *g, struct ethp_nic *n)
{
    pthread_mutex_lock(&g->lock);
    int rc = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)(uintptr_t)n};
    if (g->n_members == ETHP_NIC_GROUP_MAX || g->stop)
        rc = -ENOSPC;
    else if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, n->epfd, &ev) < 0)
        rc = -errno;
    if (!rc) {
        n->prev_pass_ns = ethp_now_ns();
        g->members[g->n_members++] = n;
        n->group = g;
        group_changed(g);
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static void group_leave(struct ethp_nic_group *g, struct ethp_nic *n)
{
    pthread_mutex_lock(&g->lock);
    for (uint32_t i = 0; i < g->n_members; i++)
        if (g->members[i] == n) {
            g->members[i] = g->members[--g->n_members];
            epoll_ctl(g->epfd, EPOLL_CTL_DEL, n->epfd, NULL);
            group_changed(g);
            break;
        }
    pthread_mutex_unlock(&g->lock);
}

uint32_t ethp_nic_group_members(struct ethp_nic_group *g)
{
    pthread_mutex_lock(&g->lock);
    uint32_t n = g->n_members;
    pthread_mutex_unlock(&g->lock);
    return n;
}

int ethp_nic_group_free(struct ethp_nic_group *g)
{
    if (!g)
        return 0;
    pthread_mutex_lock(&g->lock);
    if (g->n_members) {
        pthread_mutex_unlock(&g->lock);
        return -EBUSY;
    }
    g->stop = 1;
    ethp_kick(g->evfd);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    close(g->epfd);
    close(g->evfd);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->seen);
    free(g);
    return 0;
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

static uint64_t pio_rx_stamp_ns(void *ctx)
{
    return ethp_port_rx_stamp_ns(((struct nic_port_io *)ctx)->port);
}

static uint64_t pio_due_ns(void *ctx)
{
    return ethp_port_due_ns(((struct nic_port_io *)ctx)->port);
}

static int pio_watch(void *ctx, int epfd, uint32_t tag)
{
    return ethp_port_watch(((struct nic_port_io *)ctx)->port, epfd, tag);
}

static void pio_event(void *ctx, uint64_t data)
{
    ethp_port_event(((struct nic_port_io *)ctx)->port, data);
}

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
    nic_set_ahead(n);
    if (!(cfg->time_scale >= 1.0))
        n->cfg.time_scale = n->cfg0.time_scale = 1.0;
    n->epoch = new_epoch();
    n->cc = cfg->cc == ETHP_CCA_HPCC ? &ethp_cc_hpcc : &ethp_cc_nscc;
    n->credits = cfg->cc == ETHP_CCA_RCCC && !cfg->roce;
    n->mode = cfg->roce ? &nic_mode_roce : &nic_mode_ethplus;
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
    /* mapped, not calloc'd: its untouched entries stay zero pages (a heap
     * that had large blocks freed would hand back memory calloc zeroes) */
    n->peers = mmap(NULL, (size_t)max_peers * sizeof(*n->peers), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (n->peers == MAP_FAILED)
        n->peers = NULL;
    n->peer_known = calloc(max_peers, 1);
    n->made = calloc(max_peers, sizeof(*n->made));
    n->peer_ips = calloc((size_t)max_peers * ETHP_NIC_MAX_PLANES, sizeof(uint32_t));
    n->active = calloc(max_peers, sizeof(*n->active));
    n->sleeping = calloc(max_peers, sizeof(*n->sleeping));
    /* frames are built into the pool only to wait in a port's TX queue */
    n->pool = ethp_pool_new(ETHP_NIC_MAX_PLANES * NIC_BURST, cfg->payload_bytes + 256);
    n->epfd = epoll_create1(EPOLL_CLOEXEC);
    n->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int rc = 0;
    if (!n->peers || !n->peer_known || !n->made || !n->peer_ips || !n->active || !n->sleeping ||
        !n->pool || n->epfd < 0 || n->evfd < 0)
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
    uint32_t blocks = cfg->rx_ring_blocks ? cfg->rx_ring_blocks : 256;
    uint32_t timeout_ms = cfg->rx_ring_timeout_ms ? cfg->rx_ring_timeout_ms : 1;
    struct ethp_port_cfg pc = {.block_bytes = 1u << 16, .n_blocks = blocks,
                               .block_timeout_ms = timeout_ms, .sndbuf_bytes = 4u << 20,
                               .ring_idle_ms = cfg->ring_idle_ms};
    pio->port = ethp_port_open(netns_path, NULL, &pc, err);
    if (!pio->port) {
        free(pio);
        return NULL;
    }
    struct ethp_nic_io io = {.ctx = pio, .ifindex = pio_ifindex, .tx = pio_tx,
                             .wait_tx = pio_wait_tx, .rx_each = pio_rx_each,
                             .rx_stamp_ns = pio_rx_stamp_ns,
                             .due_ns = pio_due_ns, .watch = pio_watch, .event = pio_event,
                             .counters = pio_counters, .close = pio_close};
    struct ethp_nic *n = ethp_nic_new_io(cfg, &io, max_peers, err);
    if (n && !n->cfg.compact) {
        n->udp_fd = quiet_udp_port(netns_path, n->mode->udp_port);
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
    memcpy(&n->peer_ips[(size_t)ep * ETHP_NIC_MAX_PLANES], ips, count_ips * sizeof(uint32_t));
    n->n_known += !n->peer_known[ep];
    n->peer_known[ep] = NIC_PEER_KNOWN;
    return 0;
}

struct nic_peer *nic_peer_make(struct ethp_nic *n, uint32_t ep)
{
    struct nic_peer *p = &n->peers[ep];
    p->rbits = calloc(NIC_RWIN / 8, 1);
    if (!p->rbits)
        return NULL;
    p->ep = ep;
    memcpy(p->ip, &n->peer_ips[(size_t)ep * ETHP_NIC_MAX_PLANES], sizeof(p->ip));
    if (n->mode->add_peer)
        n->mode->add_peer(n, p);
    peer_fresh(n, p);
    p->reo_ns = nic_reorder_window_ns(&n->cfg);
    p->credit_sub_bytes = UINT64_MAX;
    nic_set_credit(n, p, n->first_credit_bytes);
    n->made[n->n_made] = ep;
    __atomic_store_n(&n->n_made, n->n_made + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&n->peer_known[ep], NIC_PEER_MADE, __ATOMIC_RELEASE);
    return p;
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

static int nic_ready(struct ethp_nic *n)
{
    if (n->started || !n->n_ports)
        return -EINVAL;
    /* Until a receiver's first grant, a sender assumes every peer sends to
     * that receiver too: a fan-in of all of them starts within its budget. */
    n->bdp_bytes = (uint64_t)((unsigned __int128)n->cfg.rate_bps * n->n_ports *
                              n->cfg.base_rtt_ns / 8 / 1000000000u);
    n->first_credit_bytes = n->bdp_bytes / (n->n_known ? n->n_known : 1);
    return 0;
}

int ethp_nic_start(struct ethp_nic *n)
{
    int rc = nic_ready(n);
    if (rc)
        return rc;
    rc = pthread_create(&n->thread, NULL, nic_main, n);
    if (rc)
        return -rc;
    n->started = 1;
    return 0;
}

int ethp_nic_start_in(struct ethp_nic *n, struct ethp_nic_group *g)
{
    int rc = nic_ready(n);
    if (rc)
        return rc;
    rc = group_join(g, n);
    if (rc)
        return rc;
    n->started = 1;
    return 0;
}

void ethp_nic_free(struct ethp_nic *n)
{
    if (!n)
        return;
    if (n->started && n->group) {
        group_leave(n->group, n);
    } else if (n->started) {
        __atomic_store_n(&n->stop, 1, __ATOMIC_RELEASE);
        ethp_kick(n->evfd);
        pthread_join(n->thread, NULL);
    }
    for (uint32_t i = 0; n->peers && n->made && i < n->n_made; i++) {
        nic_win_free(n->peers[n->made[i]].win);
        free(n->peers[n->made[i]].rbits);
    }
    for (uint32_t i = 0; i < n->n_slots; i++) {
        struct nic_msg *m = n->slots[i].m;
        if (m && m->sched_role == NIC_SCHED_WHOLE)
            nic_sched_free(m->sched);
        free(m);
    }
    while (n->orphans) {
        struct nic_msg *m = n->orphans;
        n->orphans = m->done_next;
        free(m);
    }
    for (uint32_t i = 0; i < n->inc.n_aggs; i++)
        free(n->inc.agg[i].chunk);
    free(n->slots);
    if (n->peers)
        munmap(n->peers, (size_t)n->max_peers * sizeof(*n->peers));
    free(n->peer_known);
    free(n->made);
    free(n->peer_ips);
    free(n->active);
    free(n->sleeping);
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
    if (!nic_peer_known(n, peer))
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
    int64_t h = nic_msg_register_locked(n, m);
    if (h < 0) {
        pthread_mutex_unlock(&n->lock);
        return h;
    }
    if (n->cmd_tail)
        n->cmd_tail->next = m;
    else
        n->cmd_head = m;
    n->cmd_tail = m;
    pthread_mutex_unlock(&n->lock);
    ethp_kick(n->evfd);
    return m->handle;
}

int64_t ethp_nic_post_sched(struct ethp_nic *n, const struct ethp_sched_op *ops, uint32_t n_ops,
                            const uint32_t *succ, uint32_t n_succ, uint32_t dtype, uint32_t op)
{
    if ((n_ops && !ops) || (n_succ && !succ) || n_ops > ETHP_SCHED_MAX_OPS ||
        n_succ > ETHP_SCHED_MAX_OPS || dtype > ETHP_AGG_I64 || op > ETHP_AGG_MIN)
        return -EINVAL;
    for (uint32_t i = 0; i < n_ops; i++)
        if (ops[i].kind <= ETHP_SCHED_RECV && !nic_peer_known(n, ops[i].peer))
            return ETHP_NIC_ERR_NO_SUCH;
    int err = 0;
    struct nic_sched *sc = nic_sched_new(ops, n_ops, succ, n_succ, dtype, op, &err);
    if (!sc)
        return err;
    struct nic_msg *m = calloc(1, sizeof(*m));
    if (!m) {
        nic_sched_free(sc);
        return -ENOMEM;
    }
    *m = (struct nic_msg){.status = ETHP_NIC_PENDING, .is_send = 1, .sched = sc,
                          .sched_role = NIC_SCHED_WHOLE};
    return queue_msg(n, m);
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
    struct nic_msg *m = nic_msg_lookup_locked(n, handle);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    dl.tv_sec += (time_t)(ns / 1000000000ull);
    dl.tv_nsec = (long)(ns % 1000000000ull);
    while (m && m->status == ETHP_NIC_PENDING && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&n->done, &n->lock);
        else if (pthread_cond_timedwait(&n->done, &n->lock, &dl) == ETIMEDOUT)
            break;
        n->c[ETHP_NC_caller_wakeups]++; /* under the lock: only callers write it */
        m = nic_msg_lookup_locked(n, handle); /* another thread may have released it */
    }
    int st = m ? m->status : ETHP_NIC_ERR_NO_SUCH;
    if (bytes)
        *bytes = !m ? 0 : m->is_send ? m->len : (m->total == UINT64_MAX ? 0 : m->total);
    pthread_mutex_unlock(&n->lock);
    return st;
}

int ethp_nic_short(struct ethp_nic *n, int64_t handle, uint32_t *peer, uint64_t *got_bytes,
                   uint64_t *posted_bytes)
{
    pthread_mutex_lock(&n->lock);
    struct nic_msg *m = nic_msg_lookup_locked(n, handle);
    int st = m && m->status == ETHP_NIC_ERR_SHORT ? ETHP_NIC_OK : ETHP_NIC_ERR_NO_SUCH;
    if (st == ETHP_NIC_OK) {
        *peer = m->peer;
        *got_bytes = m->total;
        *posted_bytes = m->len;
    }
    pthread_mutex_unlock(&n->lock);
    return st;
}

int ethp_nic_release(struct ethp_nic *n, int64_t handle)
{
    /* No kick: the engine frees it at its next pass, which the caller's
     * next post wakes it for anyway (a wake-up per collective saved). */
    pthread_mutex_lock(&n->lock);
    struct nic_msg *m = nic_msg_lookup_locked(n, handle);
    if (m) {
        m->released = 1;
        if (m->status != ETHP_NIC_PENDING)
            nic_msg_reap_locked(n, m);
    }
    pthread_mutex_unlock(&n->lock);
    return m ? ETHP_NIC_OK : ETHP_NIC_ERR_NO_SUCH;
}

uint64_t ethp_nic_held(struct ethp_nic *n)
{
    pthread_mutex_lock(&n->lock);
    uint64_t held = n->held;
    pthread_mutex_unlock(&n->lock);
    return held;
}

void ethp_nic_counters(struct ethp_nic *n, int32_t peer, uint64_t *out)
{
    /* made peers only: an entry never made is never read (nic_int.h) */
    const struct nic_peer *one = peer < 0 ? NULL : nic_peer_if_made(n, (uint32_t)peer);
    const uint64_t *c = peer < 0 ? n->c : one ? one->c : NULL;
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
        out[ETHP_NC_ring_backoffs] = io[ETHP_PC_ring_backoffs];
        out[ETHP_NC_rx_ring_drops] = io[ETHP_PC_rx_ring_drops];
        out[ETHP_NC_rate_bps] = 0;
    }
    uint32_t n_made = peer < 0 ? __atomic_load_n(&n->n_made, __ATOMIC_ACQUIRE) : one != NULL;
    for (uint32_t i = 0; i < n_made; i++) {
        const struct nic_peer *q = one ? one : &n->peers[n->made[i]];
        if (!one)
            out[ETHP_NC_rate_bps] += __atomic_load_n(&q->c[ETHP_NC_rate_bps], __ATOMIC_RELAXED);
        for (uint32_t j = 0; q->win && j < nic_subs(n); j++)
            out[ETHP_NC_cwnd_bytes] += __atomic_load_n(&q->cc[j].st.cwnd_bytes, __ATOMIC_RELAXED);
        out[ETHP_NC_credit_bytes] += __atomic_load_n(&q->credit_bytes, __ATOMIC_RELAXED);
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

void ethp_nic_config(const struct ethp_nic *n, struct ethp_nic_cfg *out) { *out = n->cfg0; }
