/* pool.c - a fixed pool of packet buffers, allocated once, used in bursts.
 * Two sizes of buffer: full-size ones (buf_bytes), and optionally small
 * ones (small_bytes) that a received frame short enough is copied into, so
 * that a burst of small frames (acks, handshakes, short messages) takes
 * small buffers and does not empty the pool of full-size ones.  Not
 * thread-safe: each dataplane thread owns its pools. */
#include <stdlib.h>

#include "ethp_int.h"

struct ethp_pool {
    struct ethp_pkt *pkts;        /* n full-size descriptors, then n_small small ones */
    struct ethp_pkt **free;       /* stack of free full-size descriptors */
    struct ethp_pkt **free_small; /* stack of free small ones */
    uint8_t *slab;                /* every buffer, one allocation */
    uint32_t n, n_free, buf_bytes;
    uint32_t n_small, n_free_small, small_bytes;
};

static uint32_t aligned(uint32_t bytes) { return (bytes + 63u) & ~63u; } /* cache lines */

struct ethp_pool *ethp_pool_new_sized(uint32_t n_pkts, uint32_t buf_bytes, uint32_t n_small,
                                      uint32_t small_bytes)
{
    if (!n_pkts || !buf_bytes || (n_small && (!small_bytes || small_bytes >= buf_bytes)))
        return NULL;
    struct ethp_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    buf_bytes = aligned(buf_bytes);
    small_bytes = n_small ? aligned(small_bytes) : 0;
    size_t big_total = (size_t)n_pkts * buf_bytes;
    p->pkts = calloc((size_t)n_pkts + n_small, sizeof(*p->pkts));
    p->free = calloc(n_pkts, sizeof(*p->free));
    p->free_small = calloc(n_small ? n_small : 1, sizeof(*p->free_small));
    if (posix_memalign((void **)&p->slab, 64, big_total + (size_t)n_small * small_bytes))
        p->slab = NULL;
    if (!p->pkts || !p->free || !p->free_small || !p->slab) {
        ethp_pool_free(p);
        return NULL;
    }
    p->n = n_pkts;
    p->buf_bytes = buf_bytes;
    p->n_small = n_small;
    p->small_bytes = small_bytes;
    for (uint32_t i = 0; i < n_pkts + n_small; i++) {
        struct ethp_pkt *k = &p->pkts[i];
        int small = i >= n_pkts;
        k->data = small ? p->slab + big_total + (size_t)(i - n_pkts) * small_bytes
                        : p->slab + (size_t)i * buf_bytes;
        k->cap = small ? small_bytes : buf_bytes;
        k->in_pool = 1;
        if (small) /* hand out in address order */
            p->free_small[n_small - 1 - (i - n_pkts)] = k;
        else
            p->free[n_pkts - 1 - i] = k;
    }
    p->n_free = n_pkts;
    p->n_free_small = n_small;
    return p;
}

struct ethp_pool *ethp_pool_new(uint32_t n_pkts, uint32_t buf_bytes)
{
    return ethp_pool_new_sized(n_pkts, buf_bytes, 0, 0);
}

void ethp_pool_free(struct ethp_pool *p)
{
    if (!p)
        return;
    free(p->pkts);
    free(p->free);
    free(p->free_small);
    free(p->slab);
    free(p);
}

static struct ethp_pkt *take(struct ethp_pkt *k)
{
    k->in_pool = 0;
    k->origin = 0;
    k->len = 0;
    return k;
}

uint32_t ethp_pool_get(struct ethp_pool *p, struct ethp_pkt **pkts, uint32_t n)
{
    if (n > p->n_free)
        n = p->n_free;
    for (uint32_t i = 0; i < n; i++)
        pkts[i] = take(p->free[--p->n_free]);
    return n;
}

struct ethp_pkt *ethp_pool_get_for(struct ethp_pool *p, uint32_t len)
{
    if (len <= p->small_bytes && p->n_free_small)
        return take(p->free_small[--p->n_free_small]);
    return p->n_free ? take(p->free[--p->n_free]) : NULL;
}

uint32_t ethp_pool_put(struct ethp_pool *p, struct ethp_pkt **pkts, uint32_t n)
{
    uint32_t taken = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct ethp_pkt *k = pkts[i];
        if (k < p->pkts || k >= p->pkts + p->n + p->n_small || k->in_pool)
            continue;
        k->in_pool = 1;
        if (k < p->pkts + p->n)
            p->free[p->n_free++] = k;
        else
            p->free_small[p->n_free_small++] = k;
        taken++;
    }
    return taken;
}

uint32_t ethp_pool_available(const struct ethp_pool *p) { return p->n_free + p->n_free_small; }
uint32_t ethp_pool_size(const struct ethp_pool *p) { return p->n + p->n_small; }
