/* nic_ethp.c - the ETH+ transport mode: packets sprayed over the planes,
 * selective acks (cumulative PSN and a 64-bit SACK bitmap), loss inferred
 * RACK-like from SACKs, NACKs for trimmed packets, credits on acks. */
#include "nic_int.h"

static void pump(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
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
        uint32_t plane = nic_retx_plane(n, t->plane);
        if (plane == UINT32_MAX)
            return;
        if ((busy >> plane & 1) || !nic_port_free(n, plane, now)) {
            /* it took the plane freeing first: the others but its old one
             * are not free either */
            busy |= (all & ~(1u << t->plane)) | 1u << plane;
            if (nic_free_at(n, plane) < p->retx_due_ns)
                p->retx_due_ns = nic_free_at(n, plane);
            if (busy == all) { /* the rest wait too: wake when a plane frees */
                for (uint32_t i = 0; i < n->n_ports; i++)
                    if (n->ports[i].up && nic_free_at(n, i) < p->retx_due_ns)
                        p->retx_due_ns = nic_free_at(n, i);
                return;
            }
            waiting++;
            continue;
        }
        uint64_t nacked = t->nacked_ns;
        t->nacked_ns = 0;
        if (nic_resend(n, p, psn, plane, plane, now) == 0) {
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
        uint32_t plane = nic_pick_plane(n, p, p->snd_nxt, 1);
        if (plane == UINT32_MAX || !nic_port_free(n, plane, now) || !nic_sub_free(n, p, plane, now))
            return;
        nic_send_new(n, p, plane, plane, now);
    }
}

static void send_ack(struct ethp_nic *n, struct nic_peer *p)
{
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
    nic_send_ctl(n, p, ETHP_OP_ACK, p->rcv_nxt, base, nic_rx_grant(n), flags, p->ts_echo,
                 p->ev_echo, body, 8);
    nic_count(n, p, ETHP_NC_tx_acks, 1);
    p->ack_pending = 0;
    p->ack_count = 0;
    p->ce_seen = 0;
    p->dup_seen = 0;
}

static void on_data(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                    const uint8_t *payload)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    if (h->flags & ETHP_F_TRIMMED) {
        nic_count(n, p, ETHP_NC_rx_trimmed_pkts, 1);
        nic_send_ctl(n, p, ETHP_OP_NACK, h->psn, 0, nic_rx_grant(n), 0, h->ts_ns, h->entropy,
                     NULL, 0);
        nic_count(n, p, ETHP_NC_tx_nacks, 1);
        return;
    }
    if (!nic_payload_whole(n, p, ps))
        return;
    if (ps->ecn == 3) {
        /* A CE mark is acked on its own, so that the echoed entropy value
         * (and with it the plane) is the marked packet's: flush the ack of
         * the unmarked packets before it first. */
        if (p->ack_pending && !p->ce_seen)
            send_ack(n, p);
        p->ce_seen = 1;
        nic_count(n, p, ETHP_NC_rx_ce_pkts, 1);
    }
    uint32_t d = h->psn - p->rcv_nxt;
    int dup = d >= 0x80000000u || (p->rbits[(h->psn % NIC_RWIN) / 8] & (1u << (h->psn % 8)));
    p->ts_echo = h->ts_ns;
    p->ev_echo = h->entropy;
    p->int_have = ps->int_off != 0;
    if (p->int_have) /* the ack echoes this packet's INT records */
        memcpy(p->int_echo, payload - ps->payload_off + ps->int_off, ETHP_INT_BYTES);
    p->ack_pending = 1;
    nic_activate(n, p);
    if (dup) {
        nic_count(n, p, ETHP_NC_rx_dup_pkts, 1);
        p->dup_seen = 1;
        return;
    }
    if (d >= NIC_RWIN) {
        nic_count(n, p, ETHP_NC_rx_beyond_window, 1); /* the sender will resend */
        return;
    }
    struct nic_msg *m;
    if (!nic_rx_take(n, p, ps, payload, 0, h->entropy, &m))
        return;
    if (m)
        nic_place(n, p, m, ps, payload);
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

static void on_ack(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                   const uint8_t *payload, uint64_t now)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    nic_count(n, p, ETHP_NC_rx_acks, 1);
    if (ps->payload_bytes < 8 || !p->win)
        return;
    uint64_t bits = 0;
    for (int i = 0; i < 8; i++)
        bits = bits << 8 | payload[i];
    uint32_t cum = h->psn;
    if (cum - p->snd_una > p->snd_nxt - p->snd_una)
        return; /* stale or bogus */
    nic_set_credit(n, p, h->tag);
    uint64_t bytes[ETHP_NIC_MAX_PLANES] = {0};
    int progress = cum != p->snd_una;
    for (; p->snd_una != cum; p->snd_una++) {
        struct tx_pkt *t = &p->win[p->snd_una % NIC_WIN];
        nic_acked(n, p, t, bytes);
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
        nic_acked(n, p, &p->win[psn % NIC_WIN], bytes);
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
                nic_mark_lost(p, psn);
                nic_avoid_plane(n, t->plane, now);
                nic_plane_lost(n, t->plane, now);
                nic_count(n, p, ETHP_NC_retx_sack, 1);
                struct ethp_cc_params pp = nic_cc_params(n);
                n->cc->on_nack(&p->cc[t->sub].st, &pp, now);
                lost = 1;
            }
        }
        (void)lost;
    }
    uint32_t rtt = (uint32_t)now - h->ts_ns;
    nic_count(n, p, ETHP_NC_rtt_samples, 1);
    p->c[ETHP_NC_rtt_last_ns] = n->c[ETHP_NC_rtt_last_ns] = rtt;
    int ecn = (h->flags & ETHP_F_ECN_ECHO) != 0;
    uint32_t echo_plane = h->entropy & 0xf; /* the plane of the packet that drew this ack */
    if (echo_plane < n->n_ports)
        p->cc[echo_plane].st.rtt_ns = rtt;
    if (ecn) {
        nic_count(n, p, ETHP_NC_ecn_echoes, 1);
        nic_avoid_plane(n, echo_plane, now);
    } else if (echo_plane < n->n_ports && n->ports[echo_plane].fails) {
        n->ports[echo_plane].fails = 0; /* it delivers again */
        n->ports[echo_plane].avoid_until = 0;
    }
    struct ethp_cc_params pp = nic_cc_params(n);
    if (ps->int_off && n->cc->on_int && echo_plane < n->n_ports) {
        struct ethp_int_hop hops[ETHP_INT_MAX_HOPS];
        uint32_t nh = ethp_int_decode(payload - ps->payload_off, ps->int_off, hops);
        n->cc->on_int(&p->cc[echo_plane].st, &pp, hops, nh, h->ts_ns, now);
        nic_count(n, p, ETHP_NC_int_acks, 1);
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
        nic_progress_made(n, p, now);
}

static void on_nack(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                    uint64_t now)
{
    nic_count(n, p, ETHP_NC_rx_nacks, 1);
    nic_set_credit(n, p, ps->hdr.tag);
    struct tx_pkt *t = nic_mark_lost(p, ps->hdr.psn);
    if (!t)
        return;
    t->nacked_ns = now;
    nic_avoid_plane(n, t->plane, now);
    nic_count(n, p, ETHP_NC_retx_nack, 1);
    struct ethp_cc_params pp = nic_cc_params(n);
    n->cc->on_nack(&p->cc[t->sub].st, &pp, now);
}

/* ---------------------------------------------------------------- the mode */

static uint32_t subs(const struct ethp_nic *n) { return n->n_ports; } /* a window per plane */

static int takes(int kind, const struct ethp_parsed *ps)
{
    (void)ps;
    return kind == ETHP_KIND_ETHP_UDP || kind == ETHP_KIND_ETHP_COMPACT;
}

/* sprayed: a random entropy value (a path of the plane) per packet */
static uint16_t data_ev(struct ethp_nic *n, struct nic_peer *p, uint32_t psn, uint32_t plane)
{
    (void)p;
    (void)psn;
    return (uint16_t)((nic_rnd64(n) % n->cfg.n_evs) << 4 | plane);
}

static uint64_t due(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    if (p->n_lost)
        /* waiting for the peer to be ready; or as pump() left it: a free
         * plane may be one the waiting packets must not take (the one that
         * lost them) */
        return now < p->rnr_until ? p->rnr_until : p->retx_due_ns;
    if (!p->sq_head || p->snd_nxt - p->snd_una >= NIC_WIN)
        return UINT64_MAX;
    uint32_t plane = nic_pick_plane(n, p, p->snd_nxt, 0);
    if (plane == UINT32_MAX)
        return UINT64_MAX;
    /* a new packet waits for its plane's pacer and its sub-flow's */
    uint64_t port = nic_free_at(n, plane), sub = nic_sub_free_at(p, plane);
    return sub > port ? sub : port;
}

static void data_in(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                    const uint8_t *payload, uint64_t now)
{
    (void)now;
    on_data(n, p, ps, payload);
}

static void refused(struct ethp_nic *n, struct nic_peer *p, uint32_t psn)
{
    (void)n;
    nic_mark_lost(p, psn); /* that packet alone */
}

const struct nic_mode_ops nic_mode_ethplus = {
    .name = "ethplus", .udp_port = ETHP_UDP_PORT, .data_flags = ETHP_F_TRIMMABLE,
    .fails_planes = 1, .subs = subs, .takes = takes, .data_ev = data_ev,
    .pump = pump, .due = due, .send_ack = send_ack, .on_data = data_in, .on_ack = on_ack,
    .on_nack = on_nack, .refused = refused,
};
