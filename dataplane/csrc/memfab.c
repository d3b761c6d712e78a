/* memfab.c - an in-memory fabric: NIC engines of one process joined by a
 * switch that lives in memory, so that the engine's transport (SACK,
 * selective retransmit, loss detection, trimming, credits, RNR, go-back-N)
 * can be tested without root, namespaces or rings.
 *
 * Each endpoint has one downlink per plane, with a data queue drained at
 * rate_bps: a data frame leaves it when the frames before it have, and
 * arrives delay_ns later.  Control frames (acks, NACKs, CNPs, trimmed
 * headers) go ahead of the queue, as a switch's strict priority sends them.
 * A full queue trims a trimmable frame or drops it; a queue over ecn_bytes
 * marks it CE.  Frames may also be lost at random, vanish on a silent plane,
 * or be held back by up to `reorder` frame times, so that later frames
 * overtake them.  Endpoints' engine threads call in here from their own
 * threads: one lock guards the fabric. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>

#include "ethp_int.h"

#define MF_BURST 64u

struct mf_frame {
    struct mf_frame *next;
    uint64_t due_ns, seq; /* seq: data frames' order sent in (0: control) */
    uint32_t plane, len;
    uint8_t data[];
};

/* One endpoint's side of the fabric: its downlinks and what is on them. */
struct mf_ep {
    struct ethp_memfab *fab;
    uint32_t ep;
    int attached, evfd;
    struct mf_frame *head; /* on the way to it, by due time */
    struct mf_frame *tail; /* the last of them: most frames go after it */
    uint64_t free_ns[ETHP_NIC_MAX_PLANES]; /* when each downlink's data queue is empty */
    uint64_t max_seq; /* of the data frames delivered so far */
};

struct ethp_memfab {
    struct ethp_memfab_cfg cfg;
    pthread_mutex_t lock;
    uint64_t rng, seq;
    uint32_t up_mask;
    struct mf_ep *eps;
    uint64_t c[ETHP_MEMFAB_NCOUNTERS];
};

#define ETHP_X_NAME(name, help) #name,
static const char *const mf_names[] = {ETHP_MEMFAB_COUNTERS(ETHP_X_NAME)};
#undef ETHP_X_NAME

uint32_t ethp_memfab_counter_count(void) { return ETHP_MEMFAB_NCOUNTERS; }
const char *ethp_memfab_counter_name(uint32_t i)
{
    return i < ETHP_MEMFAB_NCOUNTERS ? mf_names[i] : NULL;
}

static double mf_uniform(struct ethp_memfab *fab)
{
    return (double)(ethp_rng_next(&fab->rng) >> 11) * 0x1.0p-53;
}

/* Endpoint ep's port on plane: its MAC, its IPv4 address, the fabric's MAC. */
static void mf_mac(uint32_t plane, uint32_t ep, uint8_t *mac)
{
    const uint8_t m[6] = {0x02, 0, 0, (uint8_t)plane, (uint8_t)(ep >> 8), (uint8_t)ep};
    memcpy(mac, m, 6);
}

static uint32_t mf_ip(uint32_t plane, uint32_t ep) { return 10u << 24 | plane << 16 | (ep + 1); }

static void mf_gw_mac(uint32_t plane, uint8_t *mac)
{
    const uint8_t m[6] = {0x02, 0xef, 0, 0, 0, (uint8_t)plane};
    memcpy(mac, m, 6);
}

static uint64_t mf_ser_ns(const struct ethp_memfab *fab, uint32_t len)
{
    return (uint64_t)ethp_wire_bytes(len) * 8000000000ull / fab->cfg.rate_bps;
}

/* Queue a copy of frame (sent out of plane) towards the endpoint it names.
 * Under the lock. */
static void mf_send(struct ethp_memfab *fab, uint32_t plane, const uint8_t *data, uint32_t len,
                    uint64_t now)
{
    fab->c[ETHP_MF_frames]++;
    struct ethp_parsed ps;
    int kind = ethp_parse(data, len, &ps);
    int ethp = kind == ETHP_KIND_ETHP_UDP || kind == ETHP_KIND_ETHP_COMPACT;
    if ((!ethp && kind != ETHP_KIND_ROCE_UDP) || ps.hdr.dst_ep >= fab->cfg.endpoints ||
        !fab->eps[ps.hdr.dst_ep].attached) {
        fab->c[ETHP_MF_misrouted]++;
        return;
    }
    if (!(fab->up_mask >> plane & 1)) {
        fab->c[ETHP_MF_silenced]++;
        return;
    }
    if (fab->cfg.loss > 0 && mf_uniform(fab) < fab->cfg.loss) {
        fab->c[ETHP_MF_lost]++;
        return;
    }
    struct mf_frame *f = malloc(sizeof(*f) + len);
    if (!f) {
        fab->c[ETHP_MF_dropped]++;
        return;
    }
    memcpy(f->data, data, len);
    f->len = len;
    f->plane = plane;
    struct mf_ep *to = &fab->eps[ps.hdr.dst_ep];
    mf_mac(plane, to->ep, f->data);
    mf_gw_mac(plane, f->data + 6);
    /* as a switch classes it: control ahead of data; RoCE is all data */
    int bulk = ps.hdr.opcode == ETHP_OP_DATA || ps.hdr.opcode == ETHP_OP_AGG ||
               ps.hdr.opcode == ETHP_OP_AGG_RESULT;
    int data_cls = !ethp || (bulk && !(ps.hdr.flags & ETHP_F_TRIMMED));
    uint64_t arrive = now + fab->cfg.delay_ns;
    if (data_cls) {
        uint64_t free_ns = to->free_ns[plane];
        uint64_t backlog = free_ns > arrive
                               ? (free_ns - arrive) * fab->cfg.rate_bps / 8000000000ull
                               : 0;
        if (backlog + len > fab->cfg.buffer_bytes) {
            if (fab->cfg.trimming && ethp && (ps.hdr.flags & ETHP_F_TRIMMABLE)) {
                ethp_frame_trim(f->data, &f->len, &ps, kind);
                fab->c[ETHP_MF_trimmed]++;
                data_cls = 0;
            } else {
                free(f);
                fab->c[ETHP_MF_dropped]++;
                return;
            }
        } else if (fab->cfg.ecn_bytes && backlog > fab->cfg.ecn_bytes) {
            fab->c[ETHP_MF_marked] += (uint64_t)ethp_frame_mark_ce(f->data, &ps, kind);
        }
    }
    f->seq = data_cls ? ++fab->seq : 0;
    uint64_t ser = mf_ser_ns(fab, f->len);
    if (data_cls) {
        uint64_t start = to->free_ns[plane] > arrive ? to->free_ns[plane] : arrive;
        to->free_ns[plane] = start + ser;
        f->due_ns = start + ser;
    } else {
        f->due_ns = arrive + ser;
    }
    if (fab->cfg.reorder) /* held back: up to `reorder` frames overtake it */
        f->due_ns += ethp_rng_next(&fab->rng) % (fab->cfg.reorder * ser + 1);
    /* in due order, equal times in arrival order: most frames are due
     * after every frame queued (a walk from the head per frame made a
     * 256-endpoint all-to-all the fabric's, not the engines') */
    struct mf_frame **pp = to->tail && to->tail->due_ns <= f->due_ns ? &to->tail->next : &to->head;
    while (*pp && (*pp)->due_ns <= f->due_ns)
        pp = &(*pp)->next;
    f->next = *pp;
    *pp = f;
    if (!f->next)
        to->tail = f;
    if (pp == &to->head)
        ethp_kick(to->evfd); /* its engine may sleep past the new head's time */
}

static int mf_ifindex(void *ctx, const char *ifname)
{
    const struct mf_ep *me = ctx;
    unsigned plane;
    char rest;
    if (sscanf(ifname, "plane%u%c", &plane, &rest) != 1 || plane >= me->fab->cfg.planes)
        return -ENODEV;
    return (int)plane + 1;
}

static uint32_t mf_tx(void *ctx, struct ethp_pkt **pkts, uint32_t k, int ifindex)
{
    struct mf_ep *me = ctx;
    struct ethp_memfab *fab = me->fab;
    uint64_t now = ethp_now_ns();
    pthread_mutex_lock(&fab->lock);
    for (uint32_t i = 0; i < k; i++)
        if (ifindex >= 1 && (uint32_t)ifindex <= fab->cfg.planes)
            mf_send(fab, (uint32_t)ifindex - 1, pkts[i]->data, pkts[i]->len, now);
    pthread_mutex_unlock(&fab->lock);
    return k;
}

static void mf_wait_tx(void *ctx, int timeout_ms)
{
    (void)ctx;
    (void)timeout_ms; /* the fabric takes every frame at once */
}

static uint32_t mf_rx_each(void *ctx, uint32_t k, ethp_frame_fn fn, void *arg)
{
    struct mf_ep *me = ctx;
    struct ethp_memfab *fab = me->fab;
    struct mf_frame *got[MF_BURST];
    uint32_t m = 0;
    uint64_t now = ethp_now_ns();
    pthread_mutex_lock(&fab->lock);
    while (m < k && m < MF_BURST && me->head && me->head->due_ns <= now) {
        struct mf_frame *f = me->head;
        me->head = f->next;
        if (!me->head)
            me->tail = NULL;
        if (f->seq && f->seq < me->max_seq)
            fab->c[ETHP_MF_reordered]++;
        else if (f->seq)
            me->max_seq = f->seq;
        fab->c[ETHP_MF_delivered]++;
        got[m++] = f;
    }
    pthread_mutex_unlock(&fab->lock);
    for (uint32_t i = 0; i < m; i++) {
        fn(arg, got[i]->data, got[i]->len, (int)got[i]->plane + 1);
        free(got[i]);
    }
    return m;
}

static uint64_t mf_due_ns(void *ctx)
{
    struct mf_ep *me = ctx;
    pthread_mutex_lock(&me->fab->lock);
    uint64_t t = me->head ? me->head->due_ns : UINT64_MAX;
    pthread_mutex_unlock(&me->fab->lock);
    return t;
}

static int mf_watch(void *ctx, int epfd, uint32_t tag)
{
    struct mf_ep *me = ctx;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, me->evfd, &ev) < 0 ? -errno : 0;
}

static void mf_event(void *ctx, uint64_t data)
{
    struct mf_ep *me = ctx;
    uint64_t v;
    (void)data;
    if (read(me->evfd, &v, sizeof(v)) < 0) { /* drained already */ }
}

static void mf_counters(void *ctx, uint64_t *out)
{
    (void)ctx;
    memset(out, 0, ETHP_PORT_NCOUNTERS * sizeof(*out)); /* no ring, no drops */
}

static void mf_drain(struct mf_ep *me)
{
    me->tail = NULL;
    while (me->head) {
        struct mf_frame *f = me->head;
        me->head = f->next;
        free(f);
    }
}

static void mf_close(void *ctx)
{
    struct mf_ep *me = ctx;
    pthread_mutex_lock(&me->fab->lock);
    mf_drain(me);
    me->attached = 0;
    close(me->evfd);
    me->evfd = -1;
    pthread_mutex_unlock(&me->fab->lock);
}

struct ethp_memfab *ethp_memfab_new(const struct ethp_memfab_cfg *cfg, int *err)
{
    if (!cfg->planes || cfg->planes > ETHP_NIC_MAX_PLANES || !cfg->endpoints ||
        cfg->endpoints > 4096 || !cfg->rate_bps || !cfg->buffer_bytes ||
        !(cfg->loss >= 0 && cfg->loss <= 1)) {
        *err = -EINVAL;
        return NULL;
    }
    struct ethp_memfab *fab = calloc(1, sizeof(*fab));
    if (fab)
        fab->eps = calloc(cfg->endpoints, sizeof(*fab->eps));
    if (!fab || !fab->eps) {
        free(fab);
        *err = -ENOMEM;
        return NULL;
    }
    fab->cfg = *cfg;
    fab->rng = ethp_rng_seed(cfg->seed);
    fab->up_mask = (uint32_t)((1ull << cfg->planes) - 1);
    pthread_mutex_init(&fab->lock, NULL);
    for (uint32_t e = 0; e < cfg->endpoints; e++) {
        fab->eps[e].fab = fab;
        fab->eps[e].ep = e;
        fab->eps[e].evfd = -1;
    }
    *err = 0;
    return fab;
}

void ethp_memfab_free(struct ethp_memfab *fab)
{
    if (!fab)
        return;
    for (uint32_t e = 0; e < fab->cfg.endpoints; e++) {
        mf_drain(&fab->eps[e]);
        if (fab->eps[e].evfd >= 0)
            close(fab->eps[e].evfd);
    }
    pthread_mutex_destroy(&fab->lock);
    free(fab->eps);
    free(fab);
}

struct ethp_nic *ethp_memfab_nic(struct ethp_memfab *fab, const struct ethp_nic_cfg *cfg,
                                 int *err)
{
    if (cfg->ep >= fab->cfg.endpoints || fab->eps[cfg->ep].attached) {
        *err = -EINVAL;
        return NULL;
    }
    struct mf_ep *me = &fab->eps[cfg->ep];
    int evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (evfd < 0) {
        *err = -errno;
        return NULL;
    }
    pthread_mutex_lock(&fab->lock);
    me->evfd = evfd;
    me->attached = 1;
    pthread_mutex_unlock(&fab->lock);
    struct ethp_nic_io io = {.ctx = me, .ifindex = mf_ifindex, .tx = mf_tx,
                             .wait_tx = mf_wait_tx, .rx_each = mf_rx_each, .due_ns = mf_due_ns,
                             .watch = mf_watch, .event = mf_event, .counters = mf_counters,
                             .close = mf_close};
    struct ethp_nic *n = ethp_nic_new_io(cfg, &io, fab->cfg.endpoints, err);
    if (!n)
        return NULL;
    uint32_t planes = fab->cfg.planes, ips[ETHP_NIC_MAX_PLANES];
    for (uint32_t p = 0; p < planes && !*err; p++) {
        uint8_t mac[6], gw[6];
        char name[16];
        snprintf(name, sizeof(name), "plane%u", p);
        mf_mac(p, cfg->ep, mac);
        mf_gw_mac(p, gw);
        int rc = ethp_nic_add_port(n, name, mac, gw, mf_ip(p, cfg->ep));
        *err = rc < 0 ? rc : 0;
    }
    for (uint32_t e = 0; e < fab->cfg.endpoints && !*err; e++) {
        if (e == cfg->ep)
            continue;
        for (uint32_t p = 0; p < planes; p++)
            ips[p] = mf_ip(p, e);
        *err = ethp_nic_add_peer(n, e, ips, planes);
    }
    if (*err) {
        ethp_nic_free(n);
        return NULL;
    }
    return n;
}

void ethp_memfab_set_loss(struct ethp_memfab *fab, double loss)
{
    pthread_mutex_lock(&fab->lock);
    fab->cfg.loss = loss < 0 ? 0 : loss > 1 ? 1 : loss;
    pthread_mutex_unlock(&fab->lock);
}

int ethp_memfab_set_plane(struct ethp_memfab *fab, uint32_t plane, uint32_t up)
{
    if (plane >= fab->cfg.planes)
        return -EINVAL;
    pthread_mutex_lock(&fab->lock);
    fab->up_mask = up ? fab->up_mask | 1u << plane : fab->up_mask & ~(1u << plane);
    pthread_mutex_unlock(&fab->lock);
    return 0;
}

void ethp_memfab_counters(struct ethp_memfab *fab, uint64_t *out)
{
    pthread_mutex_lock(&fab->lock);
    memcpy(out, fab->c, sizeof(fab->c));
    pthread_mutex_unlock(&fab->lock);
}
