/* nic_sched.c - collectives the engine runs by itself: a schedule of
 * sends, receives, reductions and copies with dependencies (run.schedule),
 * posted in one call.  An op starts when the ops it depends on have
 * finished; a reduction runs in the engine thread (ethp_reduce_into, as
 * numpy does); Python waits once.  Every send and receive is an ordinary
 * message of the endpoint (same tags and matching), so a schedule on one
 * rank talks to plain sends and receives on another. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nic_int.h"

struct nic_sched {
    struct nic_msg *whole; /* the handle its poster waits on */
    struct ethp_sched_op *ops;
    struct nic_msg **msgs;              /* each send's and receive's message, once posted */
    uint32_t *succ, *deps_left, *ready; /* ready: a FIFO of ops to start */
    uint32_t n_ops, ready_head, ready_tail;
    uint32_t finished; /* ops done */
    uint32_t pending;  /* messages posted and not finished */
    uint32_t dtype, op;
    int failed; /* the first error of any of its messages */
};

static uint32_t dtype_bytes(uint32_t dtype)
{
    return dtype == ETHP_AGG_I64 ? 8 : dtype == ETHP_AGG_F32 || dtype == ETHP_AGG_I32 ? 4 : 2;
}

/* Every index in range, every n_deps its op's in-degree, no cycle (Kahn's
 * order reaches every op), lengths whole elements: else -EINVAL. */
static int sched_check(const struct ethp_sched_op *ops, uint32_t n_ops, const uint32_t *succ,
                       uint32_t n_succ, uint32_t dtype, uint32_t *indeg, uint32_t *order)
{
    memset(indeg, 0, n_ops * sizeof(*indeg));
    for (uint32_t i = 0; i < n_ops; i++) {
        const struct ethp_sched_op *o = &ops[i];
        if (o->kind > ETHP_SCHED_COPY || o->succ_first > n_succ ||
            o->succ_count > n_succ - o->succ_first)
            return -EINVAL;
        if ((o->kind == ETHP_SCHED_REDUCE && o->len % dtype_bytes(dtype)) ||
            (o->len && !o->buf) || (o->kind >= ETHP_SCHED_REDUCE && o->len && !o->src))
            return -EINVAL;
        for (uint32_t k = 0; k < o->succ_count; k++) {
            uint32_t j = succ[o->succ_first + k];
            if (j >= n_ops)
                return -EINVAL;
            indeg[j]++;
        }
    }
    uint32_t head = 0, tail = 0;
    for (uint32_t i = 0; i < n_ops; i++) {
        if (indeg[i] != ops[i].n_deps)
            return -EINVAL;
        if (!indeg[i])
            order[tail++] = i;
    }
    while (head < tail) {
        const struct ethp_sched_op *o = &ops[order[head++]];
        for (uint32_t k = 0; k < o->succ_count; k++)
            if (!--indeg[succ[o->succ_first + k]])
                order[tail++] = succ[o->succ_first + k];
    }
    return tail == n_ops ? 0 : -EINVAL;
}

struct nic_sched *nic_sched_new(const struct ethp_sched_op *ops, uint32_t n_ops,
                                const uint32_t *succ, uint32_t n_succ, uint32_t dtype,
                                uint32_t op, int *err)
{
    struct nic_sched *sc = calloc(1, sizeof(*sc));
    if (sc) {
        sc->ops = malloc((size_t)n_ops * sizeof(*ops));
        sc->succ = malloc(((size_t)n_succ + 1) * sizeof(*succ));
        sc->deps_left = malloc((size_t)n_ops * sizeof(uint32_t));
        sc->ready = malloc((size_t)n_ops * sizeof(uint32_t));
        sc->msgs = calloc((size_t)n_ops + 1, sizeof(*sc->msgs));
    }
    if (!sc || !sc->ops || !sc->succ || !sc->deps_left || !sc->ready || !sc->msgs) {
        nic_sched_free(sc);
        *err = -ENOMEM;
        return NULL;
    }
    /* checked with the schedule's own scratch arrays, then those reset */
    *err = sched_check(ops, n_ops, succ, n_succ, dtype, sc->deps_left, sc->ready);
    if (*err) {
        nic_sched_free(sc);
        return NULL;
    }
    memcpy(sc->ops, ops, (size_t)n_ops * sizeof(*ops));
    memcpy(sc->succ, succ, (size_t)n_succ * sizeof(*succ));
    for (uint32_t i = 0; i < n_ops; i++) {
        sc->deps_left[i] = ops[i].n_deps;
        if (!ops[i].n_deps)
            sc->ready[sc->ready_tail++] = i;
    }
    sc->n_ops = n_ops, sc->dtype = dtype, sc->op = op;
    return sc;
}

/* With its messages: the NIC's end (nothing of the engine refers to them
 * any more), or a schedule that never started. */
void nic_sched_free(struct nic_sched *sc)
{
    if (sc) {
        for (uint32_t i = 0; sc->msgs && i < sc->n_ops; i++)
            free(sc->msgs[i]);
        free(sc->msgs);
        free(sc->ops);
        free(sc->succ);
        free(sc->deps_left);
        free(sc->ready);
    }
    free(sc);
}

/* A send or receive of the schedule, bound to its peer at once. */
static void post_op(struct ethp_nic *n, struct nic_sched *sc, uint32_t i)
{
    const struct ethp_sched_op *o = &sc->ops[i];
    int is_send = o->kind == ETHP_SCHED_SEND;
    struct nic_msg *m = calloc(1, sizeof(*m));
    if (!m) {
        sc->failed = sc->failed ? sc->failed : -ENOMEM;
        return;
    }
    *m = (struct nic_msg){.peer = o->peer, .tag = o->tag, .buf = o->buf, .len = o->len,
                          .is_send = is_send, .status = ETHP_NIC_PENDING,
                          .total = is_send ? o->len : UINT64_MAX, .sched = sc,
                          .sched_role = NIC_SCHED_OP, .sched_idx = i};
    sc->msgs[i] = m;
    sc->pending++;
    nic_bind(n, m);
}

static void finish_op(struct nic_sched *sc, uint32_t i)
{
    const struct ethp_sched_op *o = &sc->ops[i];
    sc->finished++;
    for (uint32_t k = 0; k < o->succ_count; k++) {
        uint32_t j = sc->succ[o->succ_first + k];
        if (!--sc->deps_left[j])
            sc->ready[sc->ready_tail++] = j; /* each op once: the FIFO never wraps */
    }
}

/* A schedule at its end: its messages and arrays freed, so that a job of
 * many collectives holds only each one's handle (a caller waits on that).
 * None of its messages is pending, and a finished one is not referred to
 * by the engine (an acknowledged packet drops its message: nic_acked; a
 * received message is unbound), except a receive that failed bound (too
 * small: its packets keep coming): kept till the NIC's end. */
static void retire(struct ethp_nic *n, struct nic_sched *sc)
{
    for (uint32_t i = 0; i < sc->n_ops; i++) {
        struct nic_msg *m = sc->msgs[i];
        if (m && m->bound) { /* out of the schedule, onto the NIC's list */
            m->done_next = n->orphans;
            n->orphans = m;
            sc->msgs[i] = NULL;
        }
    }
    sc->whole->sched = NULL;
    nic_sched_free(sc); /* the rest of its messages with it */
}

/* Start every op that is ready, in the order they became so; reductions
 * and copies finish at once and may make more ready. */
static void run_ready(struct ethp_nic *n, struct nic_sched *sc)
{
    while (sc->ready_head < sc->ready_tail && !sc->failed) {
        uint32_t i = sc->ready[sc->ready_head++];
        const struct ethp_sched_op *o = &sc->ops[i];
        if (o->kind == ETHP_SCHED_REDUCE) {
            ethp_reduce_into(o->buf, o->src, o->len / dtype_bytes(sc->dtype), sc->dtype, sc->op);
        } else if (o->kind == ETHP_SCHED_COPY) {
            if (o->len)
                memmove(o->buf, o->src, o->len);
        } else if (o->len) {
            post_op(n, sc, i);
            continue;
        }
        finish_op(sc, i);
    }
    if (sc->pending)
        return;
    if (!sc->failed && sc->finished != sc->n_ops)
        return; /* not reached: a checked schedule always has a next op */
    n->c[ETHP_NC_scheds_run] += !sc->failed;
    nic_complete(n, sc->whole, sc->failed ? sc->failed : ETHP_NIC_OK);
    retire(n, sc);
}

void nic_sched_start(struct ethp_nic *n, struct nic_msg *whole)
{
    whole->sched->whole = whole;
    run_ready(n, whole->sched);
}

/* What its finished messages let each schedule do next. */
void nic_sched_pump(struct ethp_nic *n)
{
    while (n->sched_done_head) {
        struct nic_msg *m = n->sched_done_head;
        n->sched_done_head = m->done_next;
        if (!n->sched_done_head)
            n->sched_done_tail = NULL;
        struct nic_sched *sc = m->sched;
        sc->pending--;
        if (m->status == ETHP_NIC_OK) {
            finish_op(sc, m->sched_idx);
        } else if (!sc->failed) {
            sc->failed = m->status;
            /* its handle tells which message failed (ethp_nic_short) */
            sc->whole->peer = m->peer;
            sc->whole->total = m->total;
            sc->whole->len = m->len;
        }
        run_ready(n, sc);
    }
}
