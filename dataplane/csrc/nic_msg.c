/* nic_msg.c - an endpoint's messages: their handles, and a send or a
 * receive put on its peer's queues (posted by a caller as a command, or
 * made by the engine itself for a ring it runs). */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "nic_int.h"

/* A peer's send window (NIC_WIN packets, 640 KiB) is mapped, not
 * allocated: its pages stay untouched zero pages until packets use them, so
 * a rank sending to all 511 others of a 512-rank all-to-all holds a few
 * pages per peer, not 327 MiB (calloc from a heap zeroes every byte). */
struct tx_pkt *nic_win_alloc(void)
{
    void *w = mmap(NULL, NIC_WIN * sizeof(struct tx_pkt), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return w == MAP_FAILED ? NULL : w;
}

void nic_win_free(struct tx_pkt *w)
{
    if (w)
        munmap(w, NIC_WIN * sizeof(struct tx_pkt));
}

/* m into the endpoint's list of messages (a handle; freed with the NIC),
 * under its lock.  On failure m is freed. */
int64_t nic_msg_register_locked(struct ethp_nic *n, struct nic_msg *m)
{
    if (n->n_msgs == n->cap_msgs) {
        uint64_t cap = n->cap_msgs ? n->cap_msgs * 2 : 1024;
        struct nic_msg **a = realloc(n->msgs, cap * sizeof(*a));
        if (!a) {
            free(m);
            return -ENOMEM;
        }
        n->msgs = a;
        n->cap_msgs = cap;
    }
    n->msgs[n->n_msgs++] = m;
    m->handle = (int64_t)n->n_msgs;
    return m->handle;
}

int64_t nic_msg_register(struct ethp_nic *n, struct nic_msg *m)
{
    pthread_mutex_lock(&n->lock);
    int64_t h = nic_msg_register_locked(n, m);
    pthread_mutex_unlock(&n->lock);
    return h;
}

/* A send or a receive to its peer's queues (the engine's thread). */
void nic_bind(struct ethp_nic *n, struct nic_msg *m)
{
    m->seq = ++n->bind_seq;
    struct nic_peer *p = nic_peer_of(n, m->peer);
    if (!p) {
        nic_complete(n, m, -ENOMEM); /* known when posted: no memory for it */
        return;
    }
    if (m->is_send) {
        if (!p->win) {
            p->win = nic_win_alloc();
            if (!p->win) {
                nic_complete(n, m, -ENOMEM);
                return;
            }
        }
        m->msg_id = p->msg_id_next++;
        if (p->sq_tail)
            p->sq_tail->next = m;
        else
            p->sq_head = m;
        p->sq_tail = m;
        nic_activate(n, p);
    } else if (!nic_take_eager(n, p, m)) {
        if (p->rq_tail)
            p->rq_tail->next = m;
        else
            p->rq_head = m;
        p->rq_tail = m;
    }
}
