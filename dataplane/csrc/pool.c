/* pool.c - a fixed pool of packet buffers, allocated once, used in bursts.
 * Not thread-safe: each dataplane thread owns its pools. */
#include <stdlib.h>

#include "ethp_int.h"

struct ethp_pool {
    struct ethp_pkt *pkts;   /* n descriptors */
    struct ethp_pkt **free;  /* stack of free descriptors */
    uint8_t *slab;           /* n * buf_bytes, one allocation */
    uint32_t n;
    uint32_t n_free;
    uint32_t buf_bytes;
};

struct ethp_pool *ethp_pool_new(uint32_t n_pkts, uint32_t buf_bytes)
{
    if (!n_pkts || !buf_bytes)
        return NULL;
    struct ethp_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    buf_bytes = (buf_bytes + 63u) & ~63u; /* keep every buffer cache-line aligned */
    p->pkts = calloc(n_pkts, sizeof(*p->pkts));
    p->free = calloc(n_pkts, sizeof(*p->free));
    if (posix_memalign((void **)&p->slab, 64, (size_t)n_pkts * buf_bytes))
        p->slab = NULL;
    if (!p->pkts || !p->free || !p->slab) {
        ethp_pool_free(p);
        return NULL;
    }
    p->n = n_pkts;
    p->buf_bytes = buf_bytes;
    for (uint32_t i = 0; i < n_pkts; i++) {
        struct ethp_pkt *k = &p->pkts[i];
        k->data = p->slab + (size_t)i * buf_bytes;
        k->cap = buf_bytes;
        k->in_pool = 1;
        p->free[n_pkts - 1 - i] = k; /* hand out in address order */
    }
    p->n_free = n_pkts;
    return p;
}

void ethp_pool_free(struct ethp_pool *p)
{
    if (!p)
        return;
    free(p->pkts);
    free(p->free);
    free(p->slab);
    free(p);
}

uint32_t ethp_pool_get(struct ethp_pool *p, struct ethp_pkt **pkts, uint32_t n)
{
    if (n > p->n_free)
        n = p->n_free;
    for (uint32_t i = 0; i < n; i++) {
        struct ethp_pkt *k = p->free[--p->n_free];
        k->in_pool = 0;
        k->origin = 0;
        k->len = 0;
        pkts[i] = k;
    }
    return n;
}

uint32_t ethp_pool_put(struct ethp_pool *p, struct ethp_pkt **pkts, uint32_t n)
{
    uint32_t taken = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct ethp_pkt *k = pkts[i];
        if (k < p->pkts || k >= p->pkts + p->n || k->in_pool)
            continue;
        k->in_pool = 1;
        p->free[p->n_free++] = k;
        taken++;
    }
    return taken;
}

uint32_t ethp_pool_available(const struct ethp_pool *p) { return p->n_free; }
uint32_t ethp_pool_size(const struct ethp_pool *p) { return p->n; }
