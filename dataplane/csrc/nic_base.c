/* nic_base.c - what every part of the NIC engine uses: frames out (emit,
 * their addresses, control frames), the ports' pacers and pauses, the
 * planes in rotation, the congestion-control parameters, completions. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>

#include "nic_int.h"

/* A released message that has finished: onto the list the engine frees at
 * its next take of commands (under n->lock; once). */
void nic_msg_reap_locked(struct ethp_nic *n, struct nic_msg *m)
{
    if (m->reaping)
        return;
    m->reaping = 1;
    m->done_next = n->reap;
    n->reap = m;
}

void nic_complete(struct ethp_nic *n, struct nic_msg *m, int status)
{
    pthread_mutex_lock(&n->lock);
    m->status = status;
    if (m->released)
        nic_msg_reap_locked(n, m); /* freed after this pass, not while it may touch m */
    /* Only a caller waits on a message, and the caller of a schedule waits on
     * its whole: an op's completion wakes nobody (one futex wake and one
     * context switch saved per op; a waiter on an op's handle is still woken
     * by its schedule's end, which comes after every op's). */
    if (m->sched_role != NIC_SCHED_OP)
        pthread_cond_broadcast(&n->done);
    pthread_mutex_unlock(&n->lock);
    if (status == ETHP_NIC_OK && !m->inc && m->sched_role != NIC_SCHED_WHOLE)
        n->c[m->is_send ? ETHP_NC_msgs_sent : ETHP_NC_msgs_received]++;
    /* a schedule's message: its schedule goes on at the pass's next safe point
     * (nic_sched_pump), once per message (a receive may complete twice) */
    if (m->sched && m->sched_role != NIC_SCHED_WHOLE && !m->sched_finished) {
        m->sched_finished = 1;
        m->done_next = NULL;
        if (n->sched_done_tail)
            n->sched_done_tail->done_next = m;
        else
            n->sched_done_head = m;
        n->sched_done_tail = m;
    }
}

void nic_flush_port(struct ethp_nic *n, struct nic_port *pt)
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
int nic_emit(struct ethp_nic *n, uint32_t plane, const struct ethp_l2l3 *a,
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
    pt->next_tx_ns = nic_pacer_start(pt->next_tx_ns, ethp_now_ns()) + nic_ser_ns(n, (uint32_t)fl);
    pt->txq[pt->ntx++] = k;
    if (pt->ntx == NIC_BURST)
        nic_flush_port(n, pt);
    return fl;
}

/* A frame's addresses out of a plane's port to dst_ip (a peer's port on
 * that plane, or an aggregator). */
void nic_addr_to(struct ethp_nic *n, uint32_t plane, uint32_t dst_ip, uint16_t ev,
                 struct ethp_l2l3 *a)
{
    const struct nic_port *pt = &n->ports[plane];
    memset(a, 0, sizeof(*a));
    memcpy(a->dst_mac, pt->gw_mac, 6);
    memcpy(a->src_mac, pt->mac, 6);
    a->src_ip = pt->ip;
    a->dst_ip = dst_ip;
    a->src_port = (uint16_t)(0xC000 | (ev & 0x3fff)); /* entropy in the UDP source port */
    a->dst_port = n->mode->udp_port;
    a->tos = 0x02; /* ECT(0) */
    a->ttl = 64;
}

void nic_addr_for(struct ethp_nic *n, uint32_t plane, const struct nic_peer *p, uint16_t ev,
                  struct ethp_l2l3 *a)
{
    nic_addr_to(n, plane, p->ip[plane], ev, a);
}

/* A control frame to p (ack, NACK, CNP, RNR, HELLO): aux in the offset
 * field; tag: an ack's or NACK's credit grant (ETH+), else 0. */
void nic_send_ctl(struct ethp_nic *n, struct nic_peer *p, uint8_t op, uint32_t psn,
                  uint32_t aux, uint32_t tag, uint8_t flags, uint32_t ts, uint16_t ev,
                  const uint8_t *body, uint32_t len)
{
    uint32_t plane = ev % n->n_ports;
    for (uint32_t i = 0; i < n->n_ports && !n->ports[plane].up; i++)
        plane = (plane + 1) % n->n_ports;
    struct ethp_l2l3 a;
    nic_addr_for(n, plane, p, ev, &a);
    struct ethp_hdr_fields h = {.opcode = op, .flags = flags, .entropy = ev,
                                .src_ep = (uint16_t)n->cfg.ep, .dst_ep = (uint16_t)p->ep,
                                .psn = psn, .offset_bytes = aux, .tag = tag,
                                .len_bytes = (uint16_t)len,
                                .tos = 0x02, .ts_ns = ts, .src_epoch = n->epoch,
                                .dst_epoch = p->epoch};
    nic_emit(n, plane, &a, &h, body, len, p->int_echo);
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
int nic_plane_failed(const struct nic_port *pt, uint64_t now)
{
    return pt->fails >= 2 && pt->avoid_until > now;
}

/* The rotation a sender sprays over: the planes that are up and not
 * failing (all that are up if every one is failing).  Counts both; the
 * clock goes in *now only when some plane is failing (no clock read per
 * packet when all is well), else 0. */
void nic_rotation(const struct ethp_nic *n, uint64_t *now, uint32_t *up, uint32_t *live)
{
    int any_failing = 0;
    for (uint32_t i = 0; i < n->n_ports; i++)
        any_failing |= n->ports[i].fails >= 2;
    *now = any_failing ? ethp_now_ns() : 0;
    *up = *live = 0;
    for (uint32_t i = 0; i < n->n_ports; i++) {
        *up += n->ports[i].up != 0;
        *live += n->ports[i].up && !nic_plane_failed(&n->ports[i], *now);
    }
}

/* nic_port_ahead_ns, computed once per rate (start, a change of k), not
 * per packet */
void nic_set_ahead(struct ethp_nic *n)
{
    uint64_t t = (uint64_t)ETHP_AHEAD_WIRE_BYTES * 8000000000ull / n->cfg.rate_bps;
    n->ahead_ns = t > NIC_LOOKAHEAD_NS ? t : NIC_LOOKAHEAD_NS;
}

int nic_port_free(const struct ethp_nic *n, uint32_t plane, uint64_t now)
{
    const struct nic_port *pt = &n->ports[plane];
    return pt->up && now >= pt->paused_until && pt->next_tx_ns <= now + nic_port_ahead_ns(n);
}

struct ethp_cc_params nic_cc_params(const struct ethp_nic *n)
{
    const struct ethp_nic_cfg *c = &n->cfg;
    return (struct ethp_cc_params){
        .mss_bytes = c->payload_bytes,
        .max_cwnd_bytes = c->max_cwnd_bytes / nic_subs(n),
        .base_rtt_ns = c->base_rtt_ns, .line_rate_bps = c->rate_bps, .timer_ns = c->dcqcn_timer_ns,
        .byte_counter_bytes = c->dcqcn_byte_counter_bytes, .g_inv = c->dcqcn_g_inv,
        .rai_bps = c->dcqcn_rai_bps, .rhai_bps = c->dcqcn_rhai_bps,
        .min_rate_bps = c->dcqcn_min_rate_bps, .f = c->dcqcn_f};
}

void nic_on_pause(struct ethp_nic *n, const uint8_t *f, uint32_t len, int ifindex,
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

uint64_t nic_free_at(const struct ethp_nic *n, uint32_t plane)
{
    const struct nic_port *pt = &n->ports[plane];
    uint64_t t = pt->next_tx_ns > NIC_LOOKAHEAD_NS ? pt->next_tx_ns - NIC_LOOKAHEAD_NS : 0;
    return t > pt->paused_until ? t : pt->paused_until;
}

/* A sleeping peer (nic.c, nic_sleep) back on the active list. */
void nic_wake(struct ethp_nic *n, struct nic_peer *p)
{
    uint32_t last = n->sleeping[--n->n_sleeping];
    n->sleeping[p->sleep_idx] = last;
    n->peers[last].sleep_idx = p->sleep_idx;
    p->asleep = 0;
    nic_activate(n, p);
}

/* Every sleeping peer back on the active list: the clock changed their
 * deadlines, or a plane failed under their packets in flight. */
void nic_wake_all(struct ethp_nic *n)
{
    while (n->n_sleeping)
        nic_wake(n, &n->peers[n->sleeping[n->n_sleeping - 1]]);
}
