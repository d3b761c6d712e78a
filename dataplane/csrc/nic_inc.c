/* nic_inc.c - the in-network all-reduce member (agg.c is the switch's side). */
#include <stdlib.h>

#include "nic_int.h"

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


void nic_inc_start(struct ethp_nic *n, struct nic_msg *m)
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
    nic_complete(n, m, status);
    if (g->head)
        nic_inc_start(n, g->head);
}

static void inc_send(struct ethp_nic *n, struct inc_agg *a, uint32_t psn, uint64_t chunk,
                     int retx)
{
    struct nic_inc *g = &n->inc;
    const struct nic_msg *m = g->head;
    uint64_t off = chunk * g->chunk_bytes;
    uint32_t len = (uint32_t)(m->len - off < g->chunk_bytes ? m->len - off : g->chunk_bytes);
    uint16_t ev = (uint16_t)((nic_rnd64(n) % n->cfg.n_evs) << 4 | a->plane);
    struct ethp_l2l3 l;
    nic_addr_to(n, a->plane, ETHP_AGG_NET + a->id, ev, &l);
    struct ethp_hdr_fields h = {
        .opcode = ETHP_OP_AGG, .flags = retx ? ETHP_F_RETX : 0, .entropy = ev,
        .src_ep = (uint16_t)n->cfg.ep, .dst_ep = (uint16_t)(ETHP_AGG_EP_BASE + a->id),
        .msg_id = a->group, .psn = psn, .offset_bytes = (uint32_t)off,
        .tag = a->members << 16 | a->index, .len_bytes = (uint16_t)len, .tos = 0x02,
        .ts_ns = (uint32_t)m->dtype << 24 | (uint32_t)m->op << 16 | g->window};
    if (nic_emit(n, a->plane, &l, &h, m->buf + off, len, NULL) > 0) {
        n->c[ETHP_NC_inc_tx_pkts]++;
        if (retx)
            n->c[ETHP_NC_inc_retx_pkts]++;
    }
    if (!a->deadline_ns)
        a->deadline_ns = ethp_now_ns() + a->rto_ns;
}

/* Resends first (oldest first), then new chunks while the window allows. */
void nic_pump_inc(struct ethp_nic *n, uint64_t now)
{
    struct nic_inc *g = &n->inc;
    if (!g->head)
        return;
    for (uint32_t i = 0; i < g->n_aggs; i++) {
        struct inc_agg *a = &g->agg[i];
        while (nic_port_free(n, a->plane, now)) {
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

void nic_on_agg_result(struct ethp_nic *n, const struct ethp_parsed *ps, const uint8_t *payload,
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

void nic_inc_timers(struct ethp_nic *n, uint64_t now)
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
uint64_t nic_inc_due(const struct ethp_nic *n)
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
            uint64_t f = nic_free_at(n, a->plane);
            if (f < t)
                t = f;
        }
    }
    return t;
}
