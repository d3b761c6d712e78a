/* nic_rx.c - what the ETH+ and RoCE receivers share: a data packet's
 * message (bound to a posted receive by msg_id and tag), its payload placed
 * at its offset straight from the ring, the eager buffer for small messages
 * that come before their receive. */
#include "nic_int.h"

/* The posted receive a data packet belongs to: the message its msg_id is
 * bound to, else the first receive posted for its tag, bound now.  NULL
 * when none is posted (*refused 0) or when the msg_id is bound to a message
 * of another tag (*refused 1: forged or broken, counted). */
static struct nic_msg *nic_bind_msg(struct ethp_nic *n, struct nic_peer *p, uint32_t msg_id,
                                    uint32_t tag, int *refused)
{
    *refused = 0;
    for (int i = 0; i < 64; i++)
        if (p->bound[i] && p->bound[i]->msg_id == msg_id) {
            if (p->bound[i]->tag == tag)
                return p->bound[i];
            nic_count(n, p, ETHP_NC_rx_malformed, 1);
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
            nic_rx_open(n, p, 1);
            return m;
        }
        return NULL;
    }
    return NULL;
}

/* A message with no receive posted for its tag: keep it if it is whole in
 * this one packet, small, and a slot is free (1), else 0 (the caller says
 * receiver-not-ready).  Its length is the packet's, checked whole. */
static int nic_keep_eager(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
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
    nic_count(n, p, ETHP_NC_rx_data_bytes, h->len_bytes);
    nic_count(n, p, ETHP_NC_rx_data_pkts, 1);
    return 1;
}

/* How a receive whose message came whole ends: OK, its length for its
 * caller to see (ethp_nic_wait's *bytes: a caller may post a larger buffer
 * than the message); but a schedule's receive is sized to its message, so
 * a shorter one fails the schedule (ETHP_NIC_ERR_SHORT, ethp_nic_short). */
static int nic_whole_status(const struct nic_msg *m)
{
    return m->sched && m->total < m->len ? ETHP_NIC_ERR_SHORT : ETHP_NIC_OK;
}

/* A receive just posted: the oldest kept message of its tag completes it
 * (1), or there is none (0). */
int nic_take_eager(struct ethp_nic *n, struct nic_peer *p, struct nic_msg *m)
{
    for (uint32_t i = 0; i < p->n_eager; i++) {
        if (p->eager[i].tag != m->tag)
            continue;
        uint32_t len = p->eager[i].len;
        if (len > m->len) {
            nic_complete(n, m, ETHP_NIC_ERR_TOO_SMALL);
        } else {
            memcpy(m->buf, p->eager[i].data, len);
            m->done_bytes = m->total = len;
            nic_complete(n, m, nic_whole_status(m));
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
            m->bound = 0;
            nic_rx_open(n, p, -1);
        }
}

/* A data frame's payload must be whole: exactly len_bytes, present in the
 * frame (a trimmed packet is answered, never placed).  Returns 0 and counts
 * the frame as malformed otherwise. */
int nic_payload_whole(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps)
{
    if (!(ps->hdr.flags & ETHP_F_TRIMMED) && ps->payload_bytes == ps->hdr.len_bytes)
        return 1;
    nic_count(n, p, ETHP_NC_rx_malformed, 1);
    return 0;
}

/* May this data packet land in m?  Its sender cuts a message into packets
 * of the engines' payload size (the last one shorter or equal) under
 * consecutive PSNs, so a packet's offset is its PSN's distance from the
 * message's first PSN times that size.  A packet that says otherwise, or
 * that lies past the message's last packet (or a last packet before
 * another packet's end), would overlap other data or leave the count of
 * placed bytes past the message's length: refused (rx_overlap).  Every
 * PSN is taken once (the receive window), so with these rules a message
 * completes exactly when each of its bytes has come once. */
static int nic_fits(struct ethp_nic *n, struct nic_msg *m, const struct ethp_hdr_fields *h)
{
    uint64_t seg = n->data_bytes, off = h->offset_bytes, len = h->len_bytes;
    int last = (h->flags & ETHP_F_LAST) != 0;
    if (off % seg || len > seg || (!last && len != seg))
        return 0;
    uint32_t idx = (uint32_t)(off / seg);
    if (m->psn_known && h->psn - m->psn_base != idx)
        return 0;
    if (last ? m->total != UINT64_MAX || m->end_bytes > off
             : m->total != UINT64_MAX && off + len > m->last_off)
        return 0;
    if (!m->psn_known) {
        m->psn_base = h->psn - idx;
        m->psn_known = 1;
    }
    if (last) {
        m->last_off = off;
        m->total = off + len;
    } else if (off + len > m->end_bytes) {
        m->end_bytes = off + len;
    }
    return 1;
}

void nic_place(struct ethp_nic *n, struct nic_peer *p, struct nic_msg *m,
               const struct ethp_parsed *ps, const uint8_t *payload)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    if (m->status != ETHP_NIC_PENDING) {
        /* a message that already failed (buffer too small): swallow the rest */
    } else if ((uint64_t)h->offset_bytes + h->len_bytes > m->len) {
        nic_complete(n, m, ETHP_NIC_ERR_TOO_SMALL); /* stays bound: its packets keep coming */
    } else if (!nic_fits(n, m, h)) {
        nic_count(n, p, ETHP_NC_rx_overlap, 1);
        return;
    } else {
        memcpy(m->buf + h->offset_bytes, payload, ps->payload_bytes); /* == len_bytes */
        m->done_bytes += h->len_bytes;
        nic_count(n, p, ETHP_NC_rx_data_bytes, h->len_bytes);
        if (m->done_bytes == m->total) {
            unbind(n, p, m);
            nic_complete(n, m, nic_whole_status(m));
        }
    }
    nic_count(n, p, ETHP_NC_rx_data_pkts, 1);
}

/* Is the engine taking data: did it place a data packet or get an ack in
 * the last NIC_BUSY_RTTS base RTTs (at the fabric clock's k)?  Asked when
 * it turns a packet away, which a refused sender makes happen at least
 * every longest backoff, so a change is seen within that.  A receiver busy
 * with other peers' data (an incast, a rank still in its previous
 * collective) will post its receive when its own program gets there: its
 * sender's wait is the fabric's time, not a missing receive. */
int nic_rx_busy(struct ethp_nic *n, uint64_t now)
{
    uint64_t work = n->c[ETHP_NC_rx_data_pkts] + n->c[ETHP_NC_rx_acks];
    if (work != n->busy_work) {
        n->busy_work = work;
        n->busy_seen_ns = now;
        return 1;
    }
    return n->busy_seen_ns && now - n->busy_seen_ns < NIC_BUSY_RTTS * n->cfg.base_rtt_ns;
}

/* A data packet's message, or room in the eager buffer: 1 if the packet is
 * taken (*m: its message; NULL: kept eager), 0 if not (refused, or no
 * receive posted for its tag: then it is not acked, and the sender is told
 * so, to back off and retry rather than wait for a timeout; aux and ev as
 * the mode puts them in its control frames). */
int nic_rx_take(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                const uint8_t *payload, uint32_t aux, uint16_t ev, struct nic_msg **m)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    int refused;
    *m = nic_bind_msg(n, p, h->msg_id, h->tag, &refused);
    if (refused)
        return 0;
    if (!*m && !nic_keep_eager(n, p, ps, payload)) {
        nic_count(n, p, ETHP_NC_rx_unexpected_pkts, 1);
        uint8_t busy = nic_rx_busy(n, ethp_now_ns()) ? ETHP_F_BUSY : 0;
        nic_send_ctl(n, p, ETHP_OP_RNR, h->psn, aux, 0, busy, h->ts_ns, ev, NULL, 0);
        nic_count(n, p, ETHP_NC_tx_rnrs, 1);
        return 0;
    }
    return 1;
}
