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

/* m a handle (a slot of the endpoint's), under its lock.  On failure m is
 * freed. */
int64_t nic_msg_register_locked(struct ethp_nic *n, struct nic_msg *m)
{
    if (!n->free_slot) {
        if (n->n_slots == n->cap_slots) {
            uint32_t cap = n->cap_slots ? n->cap_slots * 2 : 1024;
            struct nic_slot *a = cap > n->cap_slots ? realloc(n->slots, (size_t)cap * sizeof(*a)) : NULL;
            if (!a) {
                free(m);
                return -ENOMEM;
            }
            n->slots = a;
            n->cap_slots = cap;
        }
        n->slots[n->n_slots] = (struct nic_slot){.gen = 1, .next_free = 0};
        n->free_slot = ++n->n_slots;
    }
    uint32_t i = n->free_slot - 1;
    struct nic_slot *s = &n->slots[i];
    n->free_slot = s->next_free;
    s->m = m;
    m->slot = i;
    m->handle = (int64_t)((uint64_t)s->gen << 32 | (uint64_t)(i + 1));
    n->held++;
    return m->handle;
}

/* The message a caller's handle names, or NULL (unknown, stale, released). */
struct nic_msg *nic_msg_lookup_locked(struct ethp_nic *n, int64_t handle)
{
    if (handle < 1)
        return NULL;
    uint64_t i = ((uint64_t)handle & 0xffffffffu) - 1;
    if (i >= n->n_slots)
        return NULL;
    const struct nic_slot *s = &n->slots[i];
    return s->m && s->gen == (uint64_t)handle >> 32 && !s->m->released ? s->m : NULL;
}

/* The slots of a list of messages (linked by done_next) free again, their
 * handles unknown from now on, whatever reuses them. */
void nic_msg_unslot(struct ethp_nic *n, const struct nic_msg *list)
{
    pthread_mutex_lock(&n->lock);
    for (const struct nic_msg *m = list; m; m = m->done_next) {
        struct nic_slot *s = &n->slots[m->slot];
        s->m = NULL;
        s->gen = s->gen >= 0x7fffffffu ? 1 : s->gen + 1;
        s->next_free = n->free_slot;
        n->free_slot = m->slot + 1;
        n->held--;
    }
    pthread_mutex_unlock(&n->lock);
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
