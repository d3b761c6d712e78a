/* nic_sched.c - collectives the engine runs by itself: a pipelined ring
 * (collectives.Comm._ring's schedule) posted in one call.  The engine posts
 * its receives, reduces each slice as it arrives (ethp_reduce_into, as
 * numpy does) and sends the next step's slice, without a return to Python
 * per step; Python waits once.  Every message of a ring is an ordinary
 * message of the endpoint (same tags and matching), so a ring on one rank
 * talks to plain sends and receives on another. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nic_int.h"

static const uint8_t ready_one = 1; /* the rendezvous' "ready" */

struct nic_sched {
    struct nic_msg *whole; /* the handle its poster waits on */
    struct ethp_ring_step *plan;
    uint32_t left, right, tag0, steps, slices, dtype, op, ready_tag, ready_flags;
    uint32_t pending; /* its messages posted and not finished */
    int failed;       /* the first error of any of its messages */
    uint8_t ready_byte;
};

struct nic_sched *nic_sched_new(uint32_t left, uint32_t right, uint32_t tag0, uint32_t steps,
                                uint32_t slices, const struct ethp_ring_step *plan,
                                uint32_t dtype, uint32_t op, uint32_t ready_tag,
                                uint32_t ready_flags)
{
    struct nic_sched *sc = calloc(1, sizeof(*sc));
    size_t bytes = (size_t)steps * slices * sizeof(*plan);
    if (!sc || !(sc->plan = malloc(bytes))) {
        free(sc);
        return NULL;
    }
    memcpy(sc->plan, plan, bytes);
    sc->left = left, sc->right = right, sc->tag0 = tag0, sc->steps = steps;
    sc->slices = slices, sc->dtype = dtype, sc->op = op, sc->ready_tag = ready_tag;
    sc->ready_flags = ready_flags;
    return sc;
}

void nic_sched_free(struct nic_sched *sc)
{
    if (sc)
        free(sc->plan);
    free(sc);
}

/* One of the ring's messages, bound to its peer at once (engine thread). */
static void post_one(struct ethp_nic *n, struct nic_sched *sc, uint32_t role, uint32_t idx,
                     uint32_t peer, uint32_t tag, const uint8_t *buf, uint64_t len)
{
    struct nic_msg *m = calloc(1, sizeof(*m));
    int is_send = role == NIC_SCHED_SEND || role == NIC_SCHED_TOLD;
    if (!m) {
        sc->failed = sc->failed ? sc->failed : -ENOMEM;
        return;
    }
    *m = (struct nic_msg){.peer = peer, .tag = tag, .buf = (uint8_t *)buf, .len = len,
                          .is_send = is_send, .status = ETHP_NIC_PENDING,
                          .total = is_send ? len : UINT64_MAX, .sched = sc,
                          .sched_role = role, .sched_idx = idx};
    if (nic_msg_register(n, m) < 0) { /* m freed */
        sc->failed = sc->failed ? sc->failed : -ENOMEM;
        return;
    }
    sc->pending++;
    nic_bind(n, m);
}

static void send_slice(struct ethp_nic *n, struct nic_sched *sc, uint32_t s, uint32_t j)
{
    const struct ethp_ring_step *st = &sc->plan[(size_t)s * sc->slices + j];
    post_one(n, sc, NIC_SCHED_SEND, s * sc->slices + j, sc->right, sc->tag0 + s * sc->slices + j,
             st->send_buf, st->send_bytes);
}

static void start_sends(struct ethp_nic *n, struct nic_sched *sc)
{
    for (uint32_t j = 0; j < sc->slices && !sc->failed; j++)
        send_slice(n, sc, 0, j);
}

static void maybe_done(struct ethp_nic *n, struct nic_sched *sc)
{
    if (sc->pending)
        return;
    n->c[ETHP_NC_rings_run] += !sc->failed;
    nic_complete(n, sc->whole, sc->failed ? sc->failed : ETHP_NIC_OK);
}

void nic_sched_start(struct ethp_nic *n, struct nic_msg *whole)
{
    struct nic_sched *sc = whole->sched;
    sc->whole = whole;
    uint32_t total = sc->steps * sc->slices;
    for (uint32_t i = 0; i < total && !sc->failed; i++)
        post_one(n, sc, NIC_SCHED_RECV, i, sc->left, sc->tag0 + i, sc->plan[i].recv_buf,
                 sc->plan[i].recv_bytes);
    if ((sc->ready_flags & ETHP_RING_WAIT_READY) && !sc->failed)
        post_one(n, sc, NIC_SCHED_READY, 0, sc->right, sc->ready_tag, &sc->ready_byte, 1);
    if ((sc->ready_flags & ETHP_RING_TELL_READY) && !sc->failed)
        post_one(n, sc, NIC_SCHED_TOLD, 0, sc->left, sc->ready_tag, &ready_one, 1);
    if (!(sc->ready_flags & ETHP_RING_WAIT_READY) && !sc->failed)
        start_sends(n, sc);
    maybe_done(n, sc); /* nothing posted (no memory): done, failed */
}

/* What its finished messages let each ring do next: a received slice is
 * reduced and the next step's slice leaves; "ready" starts step 0. */
void nic_sched_pump(struct ethp_nic *n)
{
    while (n->sched_done_head) {
        struct nic_msg *m = n->sched_done_head;
        n->sched_done_head = m->done_next;
        if (!n->sched_done_head)
            n->sched_done_tail = NULL;
        struct nic_sched *sc = m->sched;
        if (m->status != ETHP_NIC_OK) {
            sc->failed = sc->failed ? sc->failed : m->status;
        } else if (!sc->failed && m->sched_role == NIC_SCHED_READY) {
            start_sends(n, sc);
        } else if (!sc->failed && m->sched_role == NIC_SCHED_RECV) {
            uint32_t s = m->sched_idx / sc->slices, j = m->sched_idx % sc->slices;
            const struct ethp_ring_step *st = &sc->plan[m->sched_idx];
            if (st->red_count)
                ethp_reduce_into(st->red_dst, st->red_src, st->red_count, sc->dtype, sc->op);
            if (s + 1 < sc->steps)
                send_slice(n, sc, s + 1, j);
        }
        sc->pending--;
        maybe_done(n, sc);
    }
}
