/* nic_roce.c - the emulated RoCEv2 mode: queue pairs that keep one path
 * each, go-back-N, cumulative acks per QP, CNPs for DCQCN (see nic.c). */
#include "nic_int.h"

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
    return nic_port_free(n, roce_plane(n, psn), now) && nic_sub_free(n, p, q, now) &&
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
        if (nic_resend(n, p, psn, roce_plane(n, psn), psn % n->cfg.qps, now) == 0)
            nic_count(n, p, ETHP_NC_retx_gbn, 1);
    }
    if (p->n_lost && now < p->rnr_until)
        return;
    while (p->sq_head && p->snd_nxt - p->snd_una < NIC_WIN) {
        uint32_t psn = p->snd_nxt;
        if ((blocked & (1u << (psn % n->cfg.qps))) || !qp_ready(n, p, psn, now))
            return;
        nic_send_new(n, p, roce_plane(n, psn), psn % n->cfg.qps, now);
    }
}

static void send_ack_roce(struct ethp_nic *n, struct nic_peer *p)
{
    /* cumulative per QP: the next PSN expected there, the QP in aux */
    for (uint32_t q = 0; q < n->cfg.qps; q++)
        if (p->qp_ack_mask & (1u << q)) {
            nic_send_ctl(n, p, ETHP_OP_ACK, p->qp[q].rcv_nxt, q, 0, 0, p->ts_echo, p->qp[q].ev,
                         NULL, 0);
            nic_count(n, p, ETHP_NC_tx_acks, 1);
        }
    p->qp_ack_mask = 0;
    p->ack_pending = 0;
    p->ack_count = 0;
}

static void on_data_roce(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                         const uint8_t *payload, uint64_t now)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    if (!nic_payload_whole(n, p, ps))
        return; /* RoCE has no trimming: a short payload is forged or broken */
    uint32_t q = h->psn % n->cfg.qps;
    struct nic_qp *qp = &p->qp[q];
    if (ps->ecn == 3) {
        nic_count(n, p, ETHP_NC_rx_ce_pkts, 1);
        if (n->cfg.dcqcn && (!qp->last_cnp_ns || now - qp->last_cnp_ns >= n->cfg.cnp_interval_ns)) {
            nic_send_ctl(n, p, ETHP_OP_CNP, h->psn, q, 0, 0, h->ts_ns, h->entropy, NULL, 0);
            nic_count(n, p, ETHP_NC_tx_cnps, 1);
            qp->last_cnp_ns = now;
        }
    }
    p->ts_echo = h->ts_ns;
    nic_activate(n, p);
    int32_t d = (int32_t)(h->psn - qp->rcv_nxt);
    if (d < 0) { /* a duplicate: ack again, its ack may have been lost */
        nic_count(n, p, ETHP_NC_rx_dup_pkts, 1);
        p->qp_ack_mask |= 1u << q;
        p->ack_pending = 1;
        return;
    }
    if (d > 0) { /* a gap: NAK once, discard until the expected PSN comes */
        nic_count(n, p, ETHP_NC_rx_oos_drops, 1);
        if (!qp->nak_sent) {
            nic_send_ctl(n, p, ETHP_OP_NACK, qp->rcv_nxt, q, 0, 0, h->ts_ns, qp->ev, NULL, 0);
            nic_count(n, p, ETHP_NC_tx_nacks, 1);
            qp->nak_sent = 1;
        }
        return;
    }
    struct nic_msg *m;
    if (!nic_rx_take(n, p, ps, payload, q, qp->ev, &m))
        return;
    if (m)
        nic_place(n, p, m, ps, payload);
    qp->rcv_nxt += n->cfg.qps;
    qp->nak_sent = 0;
    p->qp_ack_mask |= 1u << q;
    p->ack_pending = 1;
    if (++p->ack_count >= NIC_ACK_EVERY || (h->flags & ETHP_F_LAST))
        send_ack_roce(n, p);
}

static void on_ack_roce(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                        const uint8_t *payload, uint64_t now)
{
    (void)payload; /* cumulative per QP: no SACK bitmap */
    const struct ethp_hdr_fields *h = &ps->hdr;
    nic_count(n, p, ETHP_NC_rx_acks, 1);
    uint32_t q = h->offset_bytes, next = h->psn;
    if (!p->win || q >= n->cfg.qps)
        return;
    uint64_t bytes[ETHP_NIC_MAX_PLANES] = {0};
    int progress = 0;
    uint32_t qps = n->cfg.qps, first = p->snd_una + (q + qps - p->snd_una % qps) % qps;
    for (uint32_t psn = first; (int32_t)(p->snd_nxt - psn) > 0 && (int32_t)(next - psn) > 0;
         psn += qps) /* this QP's PSNs only */
        if (p->win[psn % NIC_WIN].state != PKT_ACKED) {
            nic_acked(n, p, &p->win[psn % NIC_WIN], bytes);
            progress = 1;
        }
    while (p->snd_una != p->snd_nxt && p->win[p->snd_una % NIC_WIN].state == PKT_ACKED)
        p->win[p->snd_una++ % NIC_WIN].state = PKT_FREE;
    uint32_t rtt = (uint32_t)now - h->ts_ns;
    nic_count(n, p, ETHP_NC_rtt_samples, 1);
    p->c[ETHP_NC_rtt_last_ns] = n->c[ETHP_NC_rtt_last_ns] = rtt;
    if (progress)
        nic_progress_made(n, p, now);
}

/* roce: go back to psn on its QP: it and every later packet of that QP are
 * resent. */
static void go_back(struct ethp_nic *n, struct nic_peer *p, uint32_t psn)
{
    if (!p->win || psn - p->snd_una >= p->snd_nxt - p->snd_una)
        return;
    for (; (int32_t)(p->snd_nxt - psn) > 0; psn += n->cfg.qps) /* this QP's PSNs only */
        nic_mark_lost(p, psn);
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
    uint64_t f = nic_free_at(n, roce_plane(n, psn)), r = nic_sub_free_at(p, q);
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

/* ---------------------------------------------------------------- the mode */

static uint32_t subs(const struct ethp_nic *n) { return n->cfg.qps; } /* a rate per QP */

static int takes(int kind, const struct ethp_parsed *ps)
{
    if (kind == ETHP_KIND_ROCE_UDP)
        return 1;
    return kind == ETHP_KIND_IPV4 && ps->ip_proto == 17 && ps->addr.dst_port == ETHP_ROCE_UDP_PORT
               ? -1
               : 0;
}

/* a fixed UDP source port per QP (the ECMP hash input), its plane in the low bits */
static void add_peer(struct ethp_nic *n, struct nic_peer *p)
{
    for (uint32_t q = 0; q < n->cfg.qps; q++) {
        uint64_t h = (uint64_t)n->cfg.ep * 0x9E3779B97F4A7C15ull ^
                     (uint64_t)(p->ep * 64 + q) * 0xC2B2AE3D27D4EB4Full;
        p->qp[q].ev = (uint16_t)(((h >> 32) % n->cfg.n_evs) << 4 | (q % n->n_ports));
    }
}

/* the QPs' sequence state as new; a QP keeps its path */
static void fresh(struct ethp_nic *n, struct nic_peer *p)
{
    for (uint32_t q = 0; q < n->cfg.qps; q++) {
        uint16_t ev = p->qp[q].ev;
        p->qp[q] = (struct nic_qp){.rcv_nxt = q, .ev = ev};
    }
}

/* a QP keeps its own, so that its packets keep one path (unless spraying) */
static uint16_t data_ev(struct ethp_nic *n, struct nic_peer *p, uint32_t psn, uint32_t plane)
{
    if (!n->cfg.roce_spray)
        return p->qp[psn % n->cfg.qps].ev;
    return (uint16_t)((nic_rnd64(n) % n->cfg.n_evs) << 4 | plane);
}

static uint64_t due(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    if (p->n_lost && now < p->rnr_until)
        return p->rnr_until; /* the peer asked us to wait */
    return p->n_lost || p->sq_head ? roce_due(n, p) : UINT64_MAX;
}

/* DCQCN's timers, and the rate the QPs have now */
static void tick(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    if (!n->cfg.dcqcn)
        return;
    struct ethp_cc_params pp = nic_cc_params(n);
    uint64_t rate = 0;
    for (uint32_t q = 0; q < n->cfg.qps; q++) {
        n->cc->on_tick(&p->cc[q].st, &pp, now, p->cc[q].sent_bytes);
        p->cc[q].sent_bytes = 0;
        rate += p->cc[q].st.rate_bps;
    }
    p->c[ETHP_NC_rate_bps] = rate;
}

static void on_nack(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                    uint64_t now)
{
    (void)now;
    nic_count(n, p, ETHP_NC_rx_nacks, 1);
    go_back(n, p, ps->hdr.psn);
}

const struct nic_mode_ops nic_mode_roce = {
    .name = "roce", .udp_port = ETHP_ROCE_UDP_PORT, .data_flags = 0,
    .fails_planes = 0, .subs = subs, .takes = takes, .add_peer = add_peer, .fresh = fresh,
    .data_ev = data_ev, .pump = pump_roce, .due = due, .tick = tick, .send_ack = send_ack_roce,
    .on_data = on_data_roce, .on_ack = on_ack_roce, .on_nack = on_nack, .refused = go_back,
};
