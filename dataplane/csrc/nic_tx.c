/* nic_tx.c - what the ETH+ and RoCE senders share: the window and its
 * accounting, sending and resending one packet, the planes' rotation and
 * their failure, the sub-flows' pacers, receiver-not-ready backoff,
 * retransmit timeouts. */
#include "nic_int.h"

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
struct tx_pkt *nic_mark_lost(struct nic_peer *p, uint32_t psn)
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

void nic_avoid_plane(struct ethp_nic *n, uint32_t plane, uint64_t now)
{
    if (plane < n->n_ports)
        n->ports[plane].avoid_until = now + n->cfg.base_rtt_ns;
}


void nic_plane_lost(struct ethp_nic *n, uint32_t plane, uint64_t now)
{
    if (!n->mode->fails_planes || plane >= n->n_ports)
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
    nic_wake_all(n); /* their packets on it are lost too */
    for (uint32_t k = 0; k < n->n_active; k++) {
        struct nic_peer *p = &n->peers[n->active[k]];
        for (uint32_t psn = p->snd_una; p->win && psn != p->snd_nxt; psn++)
            if (p->win[psn % NIC_WIN].state == PKT_INFLIGHT && p->win[psn % NIC_WIN].plane == plane)
                nic_mark_lost(p, psn);
    }
}

uint32_t nic_pick_plane(struct ethp_nic *n, const struct nic_peer *p, uint32_t psn,
                        int for_send)
{
    /* Oblivious: strict round robin over the planes that are up, each
     * peer's starting where the pair (this endpoint, that one) puts it; a
     * plane whose window is full holds the rest back.  (Every peer's first
     * packet took plane 0: a fan-out of one-packet messages used one plane
     * and left the others idle.)  Adaptive (REPS-like): the
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
    nic_rotation(n, &now, &up, &live);
    if (!up)
        return UINT32_MAX;
    uint32_t k = (psn + n->cfg.ep + p->ep) % (live ? live : up);
    for (uint32_t i = 0; i < n->n_ports; i++)
        if (n->ports[i].up && !(live && nic_plane_failed(&n->ports[i], now)) && k-- == 0)
            return has_window(p, i) ? i : UINT32_MAX;
    return UINT32_MAX;
}

/* A sub-flow's rate pacer: when it lets the next packet go, a lookahead early. */
uint64_t nic_sub_free_at(const struct nic_peer *p, uint32_t sub)
{
    uint64_t t = p->cc[sub].next_tx_ns;
    return t > NIC_LOOKAHEAD_NS ? t - NIC_LOOKAHEAD_NS : 0;
}

int nic_sub_free(const struct ethp_nic *n, const struct nic_peer *p, uint32_t sub, uint64_t now)
{
    return p->cc[sub].next_tx_ns <= now + nic_port_ahead_ns(n);
}

/* A retransmission goes out on the up plane that frees first, other than
 * the one that lost it when there is a choice. */
uint32_t nic_retx_plane(const struct ethp_nic *n, uint32_t old)
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
     * echoes it says which plane the acked packet took. */
    t->ev = n->mode->data_ev(n, p, psn, plane);
    t->plane = (uint8_t)plane;
    t->sent_ns = now;
    struct ethp_l2l3 a;
    nic_addr_for(n, plane, p, t->ev, &a);
    uint8_t flags = n->mode->data_flags | (t->last ? ETHP_F_LAST : 0) |
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
        nic_count(n, p, ETHP_NC_tx_injected_drops, 1);
    } else {
        fl = nic_emit(n, plane, &a, &h, t->m->buf + t->off, t->len, NULL);
    }
    if (fl < 0)
        return fl;
    nic_count(n, p, ETHP_NC_tx_data_pkts, 1);
    nic_count(n, p, ETHP_NC_tx_data_bytes, t->len);
    /* the sub-flow's rate pacer: DCQCN's rate, HPCC's W / T */
    struct nic_cc *c = &p->cc[t->sub];
    if (c->st.rate_bps && fl)
        c->next_tx_ns = nic_pacer_start(c->next_tx_ns, now) +
                        nic_ser_ns(n, (uint32_t)fl) * n->cfg.rate_bps / c->st.rate_bps;
    c->sent_bytes += t->len;
    if (!p->rto_deadline)
        p->rto_deadline = now + p->rto_ns;
    return 0;
}

/* Cut the next packet off the send queue as PSN snd_nxt, in flight on plane
 * (window sub), and send it. */
void nic_send_new(struct ethp_nic *n, struct nic_peer *p, uint32_t plane, uint32_t sub,
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
int nic_resend(struct ethp_nic *n, struct nic_peer *p, uint32_t psn, uint32_t plane,
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
        nic_count(n, p, ETHP_NC_retx_pkts, 1);
        nic_count(n, p, ETHP_NC_retx_bytes, t->len);
    }
    return rc;
}

void nic_acked(struct ethp_nic *n, struct nic_peer *p, struct tx_pkt *t, uint64_t *bytes)
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
    t->m = NULL; /* never sent again: its message may end (and be freed) */
    m->done_bytes += t->len;
    if (m->done_bytes == m->len && m->status == ETHP_NIC_PENDING)
        nic_complete(n, m, ETHP_NIC_OK);
}

void nic_progress_made(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
{
    p->rnr_since_ns = 0;
    p->rnr_backoff_ns = 0;
    /* the peer is taking data again: packets it turned away go now, not
     * after the backoff (which could outlast the fresh deadline below) */
    p->rnr_until = 0;
    p->timeouts = 0;
    p->rto_ns = n->cfg.rto_ns;
    p->rto_deadline = p->snd_una != p->snd_nxt ? now + p->rto_ns : 0;
}

void nic_on_cnp(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                uint64_t now)
{
    nic_count(n, p, ETHP_NC_rx_cnps, 1);
    uint32_t q = ps->hdr.offset_bytes;
    if (!n->cfg.dcqcn || q >= n->cfg.qps || !n->cc->on_cnp)
        return;
    struct ethp_cc_params pp = nic_cc_params(n);
    if (n->cc->on_cnp(&p->cc[q].st, &pp, now))
        nic_count(n, p, ETHP_NC_rate_cuts, 1);
}

static void fail_peer(struct ethp_nic *n, struct nic_peer *p)
{
    int why = p->rnr_since_ns ? ETHP_NIC_ERR_NO_RECEIVE : ETHP_NIC_ERR_UNREACHABLE;
    for (uint32_t psn = p->snd_una; psn != p->snd_nxt; psn++) {
        struct tx_pkt *t = &p->win[psn % NIC_WIN];
        if (t->m && t->m->status == ETHP_NIC_PENDING)
            nic_complete(n, t->m, why);
        t->state = PKT_FREE;
    }
    for (struct nic_msg *m = p->sq_head; m; m = m->next)
        if (m->status == ETHP_NIC_PENDING)
            nic_complete(n, m, why);
    p->sq_head = p->sq_tail = NULL;
    p->snd_una = p->snd_nxt;
    p->inflight_bytes = 0;
    for (uint32_t i = 0; i < ETHP_NIC_MAX_PLANES; i++)
        p->cc[i].inflight = 0;
    p->n_lost = 0;
    p->rto_deadline = 0;
}

void nic_on_rnr(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                uint64_t now)
{
    nic_count(n, p, ETHP_NC_rx_rnrs, 1);
    int first = p->win && ps->hdr.psn - p->snd_una < p->snd_nxt - p->snd_una &&
                p->win[ps->hdr.psn % NIC_WIN].state == PKT_INFLIGHT;
    n->mode->refused(n, p, ps->hdr.psn);
    if (!first)
        return;
    /* The peer is alive but has no receive posted: retry after a backoff
     * that starts at one base RTT and doubles per round up to 64 (like
     * InfiniBand's RNR NAK); the peer's answers hold off the retransmit
     * timeout.  It may stay not ready for rnr_timeout_ns of real time (a
     * receiver computing before it posts is late by the program's time,
     * whatever the time scale), not a count of rounds; while it says it is
     * busy taking other data (ETHP_F_BUSY: an incast, a rank still in its
     * previous collective) its wait is the fabric's time, which grows with
     * k, and does not count: at k 51,200 a RoCE incast's lagging receiver
     * took more than 60 s of real time to get to its next receive. */
    p->rto_deadline = now + p->rto_ns + p->rnr_backoff_ns;
    if (!p->rnr_since_ns || (ps->hdr.flags & ETHP_F_BUSY))
        p->rnr_since_ns = now; /* CLOCK_MONOTONIC: never 0 */
    if (n->cfg.rnr_timeout_ns && now - p->rnr_since_ns >= n->cfg.rnr_timeout_ns) {
        fail_peer(n, p);
        return;
    }
    if (now < p->rnr_until)
        return; /* this round's backoff is already set */
    if (!p->rnr_backoff_ns)
        p->rnr_backoff_ns = n->cfg.base_rtt_ns;
    p->rnr_until = now + p->rnr_backoff_ns;
    if (p->rnr_backoff_ns < 64 * n->cfg.base_rtt_ns)
        p->rnr_backoff_ns *= 2;
}

void nic_timers(struct ethp_nic *n, struct nic_peer *p, uint64_t now)
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
        struct tx_pkt *t = nic_mark_lost(p, psn);
        if (t) {
            nic_count(n, p, ETHP_NC_retx_timeout, 1);
            nic_plane_lost(n, t->plane, now);
        }
    }
    struct ethp_cc_params pp = nic_cc_params(n);
    for (uint32_t i = 0; i < nic_subs(n); i++)
        n->cc->on_timeout(&p->cc[i].st, &pp, now);
    p->rto_ns = p->rto_ns * 2 > n->cfg.rto_ns * 64 ? n->cfg.rto_ns * 64 : p->rto_ns * 2;
    p->rto_deadline = now + p->rto_ns;
}
