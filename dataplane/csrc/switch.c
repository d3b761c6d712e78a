/* switch.c - a software switch: one thread, many AF_PACKET ports.
 *
 * Per frame, in bursts: parse -> forward (exact host lookup to an equal-cost
 * group, ECMP / spray / adaptive choice) -> enqueue (ECN RED marking,
 * trimming, tail drop, PFC accounting) -> schedule (strict priority between
 * two classes, honouring the peer's pauses) -> shape (a pacer on the
 * monotonic clock: each frame occupies the link for its wire bytes at the
 * link's real rate) -> delay (a timestamped FIFO released at departure +
 * delay) -> transmit (a TX ring).  The thread sleeps in epoll_pwait2 until a
 * ring block is ready or the next frame is due; idle, it does not wake.
 *
 * Link directions: a frame crossing a link from switch to anything is shaped,
 * delayed and subjected to the link's faults at the sending switch port.  A
 * frame from a host (whose kernel or NIC does the shaping) gets the link's
 * delay and faults at the receiving switch port.  So each direction of each
 * link is played exactly once.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "ethp_int.h"

#define SW_BURST 64
#define SW_RX_TURN 256 /* frames read from the ring per turn of the loop */
#define SW_LATE_NS 100000ull
#define SW_EVFD_TAG 0xffffffffu
#define SW_LAB_NET 0xC612u /* 198.18.0.0/16, the accelerator ports */
#define SW_LLR_MAX_REPLAYS 8 /* then the frame is dropped, as a link giving up */
/* PFC headroom: how long after a pause leaves the upstream device may still
 * send, beyond the two link delays: its receive ring's block timeout (1 ms),
 * its thread's wake-up and the frames already paced out (the emulator's own
 * latency, not time-scaled), with room for a busy machine: the test suite
 * on two cores saw engines react 17 ms late (5 ms of room dropped 22-34
 * frames in a lossless incast).  Only a late reaction ever uses it. */
#define SW_PFC_RESPONSE_NS 50000000ull

struct pktq {
    struct ethp_pkt *head, *tail;
    /* head->ts_ns while there is a head: each turn asks every busy port's
     * delay lines when their next frame is due, and reading that from the
     * frame was a cache miss a port (upn-512: a third of the switch loop's
     * own time, itself an eighth of its threads' CPU) */
    uint64_t head_ts_ns;
    uint64_t bytes;
    uint32_t frames;
};

static void q_push(struct pktq *q, struct ethp_pkt *p)
{
    p->next = NULL;
    if (q->tail) {
        q->tail->next = p;
    } else {
        q->head = p;
        q->head_ts_ns = p->ts_ns;
    }
    q->tail = p;
    q->bytes += p->len;
    q->frames++;
}

static void q_push_front(struct pktq *q, struct ethp_pkt *p)
{
    p->next = q->head;
    q->head = p;
    q->head_ts_ns = p->ts_ns;
    if (!q->tail)
        q->tail = p;
    q->bytes += p->len;
    q->frames++;
}

static struct ethp_pkt *q_pop(struct pktq *q)
{
    struct ethp_pkt *p = q->head;
    if (!p)
        return NULL;
    q->head = p->next;
    if (!q->head)
        q->tail = NULL;
    else
        q->head_ts_ns = q->head->ts_ns;
    q->bytes -= p->len;
    q->frames--;
    p->next = NULL;
    return p;
}

struct sw_port {
    int ifindex;
    struct ethp_link_state link;
    struct pktq q[ETHP_NCLASSES]; /* egress queues */
    struct pktq wire;             /* egress delay line: ts_ns = due at the peer */
    struct pktq in_wire;          /* ingress delay line (a host's delay; a burst spread out) */
    uint64_t in_free_ns;          /* the ingress link delivers no sooner than then */
    uint64_t next_tx_ns;          /* the link is busy until then */
    uint64_t lost_debt_ns;        /* link time lost beyond catch-up since the queue was empty */
    uint64_t ahead_ns;            /* frames due this soon are handled now (set_link) */
    uint64_t sched_wire_bytes;    /* wire bytes put on the link so far (INT's tx_bytes) */
    uint64_t paused_until[ETHP_NCLASSES];
    uint64_t paused_since[ETHP_NCLASSES];
    uint64_t pause_began[ETHP_NCLASSES];      /* the peer's unbroken pause started, or 0 */
    uint64_t pfc_ignore_until[ETHP_NCLASSES]; /* the watchdog released it: pauses ignored */
    uint64_t pfc_in_bytes[ETHP_NCLASSES]; /* buffered here, came in on this port */
    uint64_t pfc_refresh_ns[ETHP_NCLASSES]; /* 0: the peer is not paused by us */
    uint64_t pfc_headroom_bytes; /* lossless: what may come in past XOFF (set_link) */
    uint64_t c[ETHP_SW_NCOUNTERS];
    uint64_t cc[ETHP_NCLASSES][ETHP_SW_NCLASS_COUNTERS];
    struct ethp_link_state pending;
    int has_pending;
    int active; /* on the switch's active list */
};

struct sw_group {
    uint16_t n;
    uint16_t *ports;
};

struct ethp_switch {
    struct ethp_switch_cfg cfg;
    /* One AF_PACKET socket bound to every interface of the switch's
     * namespace: one RX ring (one retire timer, one wake-up) for all ports. */
    struct ethp_port *io;
    char netns_path[256];
    uint16_t *port_of_if; /* ifindex -> port index + 1 */
    uint64_t foreign;     /* frames from an interface that is no port */
    struct sw_port *ports;
    /* Ports with anything queued, on a wire or a pause to refresh: the loop
     * and the wake-up deadline look at these only, not at every port. */
    uint16_t *active;
    uint32_t n_active;
    uint16_t *cand; /* scratch for release_ingress_all */
    uint32_t n_ports, max_ports;
    struct ethp_pool *pool;
    uint16_t *route_ip; /* 65536 entries: group index + 1, 0 = no route */
    uint16_t *route_ep;
    struct sw_group *groups;
    uint32_t n_groups, cap_groups;
    pthread_t thread;
    int started;
    int epfd, evfd;
    int stop;            /* atomic */
    uint32_t up;         /* atomic */
    int have_pending;    /* atomic */
    pthread_mutex_t lock;
    uint64_t rng;
    uint64_t wakeups;
    uint64_t now_ns; /* the loop's real time: what a pacer's catch-up is bounded by */
    uint64_t buffer_used_bytes; /* in every egress queue; atomic for readers */
    uint64_t buffer_hwm_bytes;
    struct ethp_agg *agg; /* in-network aggregation, or NULL */
    uint32_t agg_ip;
    uint16_t agg_ep;
};

/* ---------------------------------------------------------------- names */

#define ETHP_X_NAME(name, help) #name,
static const char *const sw_names[] = {ETHP_SW_COUNTERS(ETHP_X_NAME)};
static const char *const sw_class_names[] = {ETHP_SW_CLASS_COUNTERS(ETHP_X_NAME)};
#undef ETHP_X_NAME

uint32_t ethp_sw_counter_count(void) { return ETHP_SW_NCOUNTERS; }
const char *ethp_sw_counter_name(uint32_t i) { return i < ETHP_SW_NCOUNTERS ? sw_names[i] : NULL; }
uint32_t ethp_sw_class_counter_count(void) { return ETHP_SW_NCLASS_COUNTERS; }
const char *ethp_sw_class_counter_name(uint32_t i)
{
    return i < ETHP_SW_NCLASS_COUNTERS ? sw_class_names[i] : NULL;
}

/* ---------------------------------------------------------------- helpers */

static double rnd(struct ethp_switch *sw)
{
    return (double)(ethp_rng_next(&sw->rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* Time on the link of wire_bytes (ethp_wire_bytes of a frame). */
static uint64_t ser_ns(const struct ethp_link_state *l, uint32_t wire_bytes)
{
    return (uint64_t)wire_bytes * 8ull * 1000000000ull / l->rate_bps;
}

/* Onto a delay line, due at ts_ns, or with the frame before it if that is
 * later: a link delays frames by different amounts (jitter, a replay) but
 * never reorders them. */
static void wire_push(struct pktq *line, struct ethp_pkt *p, uint64_t ts_ns)
{
    p->ts_ns = line->tail && line->tail->ts_ns > ts_ns ? line->tail->ts_ns : ts_ns;
    q_push(line, p);
}

/* The link's delay for one frame: its propagation delay, plus a uniform
 * draw in [0, jitter_ns] when it jitters. */
static uint64_t frame_delay_ns(struct ethp_switch *sw, const struct ethp_link_state *l)
{
    return l->delay_ns + (l->jitter_ns ? (uint64_t)(rnd(sw) * (double)(l->jitter_ns + 1)) : 0);
}

static void drop(struct ethp_switch *sw, struct sw_port *port, struct ethp_pkt *p, int reason)
{
    port->c[reason]++;
    ethp_pool_put(sw->pool, &p, 1);
}

static void activate(struct ethp_switch *sw, struct sw_port *e)
{
    if (!e->active) {
        e->active = 1;
        sw->active[sw->n_active++] = (uint16_t)(e - sw->ports);
    }
}

static int port_busy(const struct sw_port *e)
{
    return e->q[0].frames || e->q[1].frames || e->wire.head || e->in_wire.head ||
           e->pfc_refresh_ns[0] || e->pfc_refresh_ns[1];
}

/* ---------------------------------------------------------------- PFC */

static void pfc_send(struct ethp_switch *sw, struct sw_port *port, int cls, uint16_t quanta,
                     uint64_t now)
{
    struct ethp_pkt *p;
    if (ethp_pool_get(sw->pool, &p, 1) != 1)
        return;
    p->len = (uint32_t)ethp_build_pfc(p->data, p->cap, port->link.mac, (uint8_t)(1u << cls), quanta);
    ethp_port_tx_burst_to(sw->io, &p, 1, port->ifindex);
    ethp_pool_put(sw->pool, &p, 1);
    port->c[ETHP_SC_pause_tx]++;
    /* Refresh a pause at half its lifetime while the queue stays above XON. */
    uint64_t life_ns = (uint64_t)quanta * 512ull * 1000000000ull / port->link.rate_bps;
    port->pfc_refresh_ns[cls] = quanta ? now + life_ns / 2 + 1 : 0;
    if (quanta)
        activate(sw, port);
}

/* A pause or resume from the port's peer.  The watchdog: a class the peer
 * has held paused for longer than pfc_watchdog_ns without a break is
 * released and ignores the peer's pauses for as long again (a storm of
 * pauses from a broken or hostile peer cannot stop the port forever). */
static void pfc_receive(const struct ethp_switch *sw, struct sw_port *port, const uint8_t *f,
                        uint32_t len, uint64_t now)
{
    port->c[ETHP_SC_pause_rx]++;
    if (len < 18 + 16)
        return;
    uint16_t opcode = (uint16_t)(f[14] << 8 | f[15]);
    uint16_t mask = opcode == 0x0001 ? 0xff : (uint16_t)(f[16] << 8 | f[17]);
    uint64_t wd = sw->cfg.pfc_watchdog_ns;
    for (int c = 0; c < ETHP_NCLASSES; c++) {
        if (!(mask & (1u << c)))
            continue;
        uint16_t quanta = opcode == 0x0001 ? (uint16_t)(f[16] << 8 | f[17])
                                           : (uint16_t)(f[18 + 2 * c] << 8 | f[19 + 2 * c]);
        if (now < port->pfc_ignore_until[c])
            continue;
        if (now >= port->paused_until[c] || !quanta)
            port->pause_began[c] = quanta ? now : 0; /* a new pause, or none */
        if (wd && quanta && port->pause_began[c] && now - port->pause_began[c] > wd) {
            port->c[ETHP_SC_pfc_watchdog]++;
            port->pfc_ignore_until[c] = now + wd;
            port->pause_began[c] = 0;
            quanta = 0; /* released at once */
        }
        if (port->paused_until[c] > port->paused_since[c]) {
            uint64_t end = now < port->paused_until[c] ? now : port->paused_until[c];
            port->cc[c][ETHP_CC_paused_ns] += end - port->paused_since[c];
        }
        port->paused_since[c] = now;
        port->paused_until[c] =
            quanta ? now + (uint64_t)quanta * 512ull * 1000000000ull / port->link.rate_bps : now;
    }
}

/* ---------------------------------------------------------------- enqueue */

static int is_ethp(int kind)
{
    return kind == ETHP_KIND_ETHP_UDP || kind == ETHP_KIND_ETHP_COMPACT;
}

/* Opcodes that carry payload: the data class.  The rest (acks, nacks,
 * CNPs) is control and goes ahead of it. */
static int is_bulk(uint8_t opcode)
{
    return opcode == ETHP_OP_DATA || opcode == ETHP_OP_AGG || opcode == ETHP_OP_AGG_RESULT;
}

/* RED: no mark below Kmin, probability rising to Pmax at Kmax, all above. */
static int red_mark(struct ethp_switch *sw, uint64_t q)
{
    const struct ethp_switch_cfg *c = &sw->cfg;
    if (q <= c->ecn_kmin_bytes)
        return 0;
    if (q >= c->ecn_kmax_bytes)
        return 1;
    double prob = c->ecn_pmax * (double)(q - c->ecn_kmin_bytes) /
                  (double)(c->ecn_kmax_bytes - c->ecn_kmin_bytes);
    return rnd(sw) < prob;
}

static void schedule_until(struct ethp_switch *sw, struct sw_port *e, uint64_t until);

/* Of a queue of q bytes at egress e, what the fabric would hold: less what
 * the link would have sent in the time its thread lost beyond catch-up
 * since the queue was last empty (lost_debt_ns). */
static uint64_t nominal_q(const struct sw_port *e, uint64_t q)
{
    if (!e->lost_debt_ns) /* on time: the queue as it is (per frame: no arithmetic) */
        return q;
    uint64_t owed = (uint64_t)((double)e->lost_debt_ns * (double)e->link.rate_bps / 8e9);
    return q > owed ? q - owed : 0;
}

/* Queue frame p at egress e; now is when it arrived (a frame a late thread
 * took off a delay line arrived when it was due there, not when the thread
 * got to it). */
static void enqueue(struct ethp_switch *sw, struct sw_port *e, struct ethp_pkt *p,
                    const struct ethp_parsed *ps, int kind, uint64_t now)
{
    if (!e->link.up) {
        drop(sw, e, p, ETHP_SC_drop_link_down);
        return;
    }
    /* The queue this frame joins is the one when it arrived: frames that
     * had started on the link by then leave it first.  A thread that woke
     * late forwards what came in before it serves the egress, and would
     * otherwise judge (mark, trim, drop) by a queue the link had drained:
     * the machine's lateness, not the fabric's. */
    schedule_until(sw, e, now + e->ahead_ns);
    int cls = ETHP_CLS_DATA;
    if (is_ethp(kind) && (!is_bulk(ps->hdr.opcode) || (ps->hdr.flags & ETHP_F_TRIMMED)))
        cls = ETHP_CLS_HIGH;
    uint64_t qb = e->q[0].bytes + e->q[1].bytes;
    if (cls == ETHP_CLS_DATA) {
        /* Marks and trims judge the queue the fabric would have: a thread
         * that lost link time beyond its catch-up (the machine's lateness,
         * counted as lost_link_ns) still holds what the link would have
         * sent in it, and one ECN mark for that halves a DCQCN sender's
         * rate (seen: 3-4 CNPs a 16 MiB all-reduce at k 12800, 4-5% of
         * RoCE's busbw, none at 4x the k).  Drops still judge the buffer
         * the frames take here. */
        uint64_t qn = nominal_q(e, qb), qdata = nominal_q(e, e->q[ETHP_CLS_DATA].bytes);
        if (sw->cfg.trimming && is_ethp(kind) && (ps->hdr.flags & ETHP_F_TRIMMABLE) &&
            qdata > sw->cfg.trim_threshold_bytes) {
            ethp_frame_trim(p->data, &p->len, ps, kind);
            e->c[ETHP_SC_trimmed]++;
            cls = ETHP_CLS_HIGH;
        } else if (sw->cfg.ecn && red_mark(sw, qn)) {
            e->c[ETHP_SC_ecn_marked] += (uint64_t)ethp_frame_mark_ce(p->data, ps, kind);
        }
    }
    int full = -1;
    if (sw->cfg.lossless && !p->origin) {
        /* Lossless: no tail drop at the egress, as a switch's lossless
         * classes have none.  What a port may have buffered here is bounded
         * at its ingress instead: XOFF, then the headroom for what arrives
         * while its pause travels and takes effect. */
        const struct sw_port *in = &sw->ports[p->port];
        if (in->pfc_in_bytes[cls] + p->len > sw->cfg.pfc_xoff_bytes + in->pfc_headroom_bytes)
            full = ETHP_SC_drop_headroom;
    } else if (qb + p->len > e->link.buffer_bytes) {
        full = ETHP_SC_drop_queue_full;
    } else if (sw->cfg.shared_buffer_bytes) {
        /* Dynamic threshold (Choudhury and Hahne): the more of the buffer
         * is taken, the less any one queue may take.  One congested queue
         * settles at alpha / (1 + alpha) of the buffer, n of them at
         * alpha / (1 + n alpha) each, and some is always left for the next
         * queue that starts. */
        uint64_t used = sw->buffer_used_bytes, shared = sw->cfg.shared_buffer_bytes;
        uint64_t free_bytes = used < shared ? shared - used : 0; /* lossless may overrun */
        if (p->len > free_bytes ||
            (double)(e->q[cls].bytes + p->len) > sw->cfg.dt_alpha * (double)free_bytes)
            full = ETHP_SC_drop_shared_full;
    }
    if (full >= 0) {
        e->cc[cls][ETHP_CC_drop_queue_full]++;
        drop(sw, e, p, full);
        return;
    }
    uint64_t used = sw->buffer_used_bytes + p->len;
    __atomic_store_n(&sw->buffer_used_bytes, used, __ATOMIC_RELAXED);
    if (used > sw->buffer_hwm_bytes)
        __atomic_store_n(&sw->buffer_hwm_bytes, used, __ATOMIC_RELAXED);
    p->cls = (uint8_t)cls;
    p->ts_ns = now; /* when it joined the queue: it cannot start on the link before */
    p->int_off = is_ethp(kind) && ps->hdr.opcode == ETHP_OP_DATA ? ps->int_off : 0;
    q_push(&e->q[cls], p);
    activate(sw, e);
    e->cc[cls][ETHP_CC_enq_frames]++;
    /* the queues a user reads (lab stats, the deepest queue a run left):
     * the fabric's, as marks judge them (nominal_q) */
    uint64_t qc = nominal_q(e, e->q[cls].bytes), qp = nominal_q(e, qb + p->len);
    e->cc[cls][ETHP_CC_q_bytes] = qc;
    if (qc > e->cc[cls][ETHP_CC_q_hwm_bytes])
        e->cc[cls][ETHP_CC_q_hwm_bytes] = qc;
    e->c[ETHP_SC_q_frames]++;
    e->c[ETHP_SC_q_bytes] = qp;
    if (qp > e->c[ETHP_SC_q_hwm_bytes])
        e->c[ETHP_SC_q_hwm_bytes] = qp;
    if (sw->cfg.lossless && !p->origin) {
        struct sw_port *in = &sw->ports[p->port];
        in->pfc_in_bytes[cls] += p->len;
        if (in->pfc_in_bytes[cls] > sw->cfg.pfc_xoff_bytes && !in->pfc_refresh_ns[cls])
            pfc_send(sw, in, cls, 0xffff, now);
    }
}

/* ---------------------------------------------------------------- forward */

static uint16_t choose(struct ethp_switch *sw, const struct sw_group *g,
                       const struct ethp_parsed *ps, int kind)
{
    if (g->n == 1)
        return g->ports[0];
    uint64_t seed = sw->cfg.seed;
    if (is_ethp(kind) && sw->cfg.forwarding == ETHP_FWD_ADAPTIVE) {
        uint32_t start = (uint32_t)(ethp_mix64(seed ^ ps->hdr.entropy) % g->n);
        uint16_t best = g->ports[start];
        uint64_t best_q = UINT64_MAX;
        for (uint32_t i = 0; i < g->n; i++) {
            uint16_t cand = g->ports[(start + i) % g->n];
            struct sw_port *e = &sw->ports[cand];
            uint64_t q = e->link.up ? e->q[0].bytes + e->q[1].bytes : UINT64_MAX - 1;
            if (q < best_q) {
                best_q = q;
                best = cand;
            }
        }
        return best;
    }
    uint64_t h;
    if (is_ethp(kind) && sw->cfg.forwarding == ETHP_FWD_SPRAY)
        h = ethp_mix64(seed ^ ((uint64_t)ps->hdr.entropy << 16 | ps->hdr.dst_ep));
    else
        h = ethp_mix64(seed ^ ((uint64_t)ps->addr.src_ip << 32 | ps->addr.dst_ip)) ^
            ethp_mix64((uint64_t)ps->ip_proto << 32 | (uint32_t)ps->addr.src_port << 16 |
                  ps->addr.dst_port);
    return g->ports[h % g->n];
}

static void forward(struct ethp_switch *sw, struct ethp_pkt *p, uint64_t now);

/* Source guard (strict reverse path, as a ToR's IP source guard does): a
 * frame a host sends must come from an address (IPv4) or endpoint (compact
 * form) this switch routes back out of the port it came in on.  A lab node
 * then cannot pass itself off as another accelerator or an aggregator. */
static int host_source_ok(const struct ethp_switch *sw, uint16_t in_port,
                          const struct ethp_parsed *ps, int kind)
{
    uint16_t gi = 0;
    if (kind == ETHP_KIND_ETHP_COMPACT)
        gi = sw->route_ep[ps->hdr.src_ep];
    else if (kind == ETHP_KIND_OTHER)
        return 1; /* nothing routes it: dropped as no route */
    else if (ps->addr.src_ip >> 16 == SW_LAB_NET)
        gi = sw->route_ip[ps->addr.src_ip & 0xffff];
    if (!gi)
        return 0;
    const struct sw_group *g = &sw->groups[gi - 1];
    for (uint16_t i = 0; i < g->n; i++)
        if (g->ports[i] == in_port)
            return 1;
    return 0;
}

/* ---------------------------------------------------------------- aggregation */

/* A frame the aggregator originates, into the pipeline as if it had arrived
 * on port in_port: the result of a finished (or resent) chunk to member i,
 * or (up) the partial result of an inner node of a tree to its parent. */
static void agg_emit(struct ethp_switch *sw, const struct ethp_agg_out *o, uint32_t i, int up,
                     int kind, uint16_t in_port, uint64_t now)
{
    struct ethp_pkt *r;
    if (ethp_pool_get(sw->pool, &r, 1) != 1)
        return; /* the member times out and asks again */
    const struct ethp_agg_member *m = up ? NULL : &o->member[i];
    uint16_t ev = m ? m->ev : (uint16_t)(ethp_mix64((uint64_t)o->group << 32 | o->psn) & 0xfff0);
    struct ethp_l2l3 a = {.src_ip = sw->agg_ip, .dst_ip = m ? m->ip : ETHP_AGG_NET + o->parent_id,
                          .src_port = (uint16_t)(0xC000 | (ev & 0x3fff)),
                          .dst_port = ETHP_UDP_PORT, .tos = 0x02, .ttl = 64};
    struct ethp_hdr_fields h = {
        .opcode = up ? ETHP_OP_AGG : ETHP_OP_AGG_RESULT, .entropy = ev, .src_ep = sw->agg_ep,
        .dst_ep = m ? m->ep : (uint16_t)(ETHP_AGG_EP_BASE + o->parent_id), .msg_id = o->group,
        .psn = o->psn, .offset_bytes = o->offset_bytes,
        .tag = up ? o->parent_tag : o->members << 16 | i, .len_bytes = (uint16_t)o->len_bytes,
        .tos = 0x02, .ts_ns = o->word};
    int len = kind == ETHP_KIND_ETHP_COMPACT
                  ? ethp_build_compact(r->data, r->cap, &a, &h, o->payload, o->len_bytes)
                  : ethp_build_udp(r->data, r->cap, &a, &h, o->payload, o->len_bytes);
    if (len < 0) {
        ethp_pool_put(sw->pool, &r, 1);
        return;
    }
    r->len = (uint32_t)len;
    r->port = in_port; /* counted there; charged to no ingress port's PFC account */
    r->origin = 1;
    sw->ports[in_port].c[ETHP_SC_agg_results]++;
    forward(sw, r, now);
}

static void agg_multicast(struct ethp_switch *sw, const struct ethp_agg_out *o, int kind,
                          uint16_t in_port, uint64_t now)
{
    for (uint32_t i = 0; i < o->members; i++)
        agg_emit(sw, o, i, 0, kind, in_port, now);
}

static const int8_t agg_dropped[] = {
    [ETHP_AGG_BAD] = ETHP_SC_drop_malformed,
    [ETHP_AGG_FULL] = ETHP_SC_drop_agg_full,
    [ETHP_AGG_STALE] = ETHP_SC_drop_agg_stale,
    [ETHP_AGG_FOREIGN] = ETHP_SC_drop_agg_foreign,
};

/* A contribution (op agg) or, at an inner node of a tree, the parent's
 * result (op agg result), addressed to this switch's aggregator. */
static void aggregate(struct ethp_switch *sw, struct sw_port *in, struct ethp_pkt *p,
                      const struct ethp_parsed *ps, int kind, uint64_t now)
{
    struct ethp_agg_out o;
    const uint8_t *payload = p->data + ps->payload_off;
    int down = ps->hdr.opcode == ETHP_OP_AGG_RESULT;
    int act = down ? ethp_agg_down(sw->agg, ps, payload, now, &o)
                   : ethp_agg_add(sw->agg, ps, payload, now, &o);
    if (act >= ETHP_AGG_STALE) {
        drop(sw, in, p, agg_dropped[act]);
        return;
    }
    uint16_t in_port = p->port;
    drop(sw, in, p, ETHP_SC_agg_consumed);
    if (!down && (act == ETHP_AGG_DUP || o.again))
        in->c[ETHP_SC_agg_dup]++;
    if (!down && o.again && act != ETHP_AGG_DUP)
        in->c[ETHP_SC_agg_replies]++;
    if (act == ETHP_AGG_REPLY) {
        agg_emit(sw, &o, o.to, 0, kind, in_port, now);
    } else if (act == ETHP_AGG_UP) {
        agg_emit(sw, &o, 0, 1, kind, in_port, now);
    } else if (act == ETHP_AGG_COMPLETE) {
        agg_multicast(sw, &o, kind, in_port, now);
    }
}

static void forward(struct ethp_switch *sw, struct ethp_pkt *p, uint64_t now)
{
    struct sw_port *in = &sw->ports[p->port];
    struct ethp_parsed ps;
    int kind = ethp_parse(p->data, p->len, &ps);
    if (kind < 0) {
        drop(sw, in, p, ETHP_SC_drop_malformed);
        return;
    }
    int from_host = in->link.peer_is_host && !p->origin;
    if (kind == ETHP_KIND_MACCTL) {
        if (from_host && !sw->cfg.hosts_may_pause)
            in->c[ETHP_SC_pause_ignored]++;
        else
            pfc_receive(sw, in, p->data, p->len, now);
        drop(sw, in, p, ETHP_SC_ctl_consumed);
        return;
    }
    if (from_host && !host_source_ok(sw, p->port, &ps, kind)) {
        drop(sw, in, p, ETHP_SC_drop_spoofed);
        return;
    }
    if (sw->agg && is_ethp(kind) &&
        (ps.hdr.opcode == ETHP_OP_AGG || ps.hdr.opcode == ETHP_OP_AGG_RESULT) &&
        (kind == ETHP_KIND_ETHP_COMPACT ? ps.hdr.dst_ep == sw->agg_ep
                                        : ps.addr.dst_ip == sw->agg_ip)) {
        aggregate(sw, in, p, &ps, kind, now);
        return;
    }
    uint16_t gi = 0;
    int ip_kind = kind == ETHP_KIND_IPV4 || kind == ETHP_KIND_ETHP_UDP || kind == ETHP_KIND_ROCE_UDP;
    if (ip_kind && ps.addr.dst_ip >> 16 == SW_LAB_NET)
        gi = sw->route_ip[ps.addr.dst_ip & 0xffff];
    else if (ip_kind && ps.addr.dst_ip - ETHP_AGG_NET < ETHP_AGG_MAX_IDS) /* an aggregator */
        gi = sw->route_ep[ETHP_AGG_EP_BASE + (ps.addr.dst_ip - ETHP_AGG_NET)];
    else if (kind == ETHP_KIND_ETHP_COMPACT)
        gi = sw->route_ep[ps.hdr.dst_ep];
    if (!gi) {
        drop(sw, in, p, ETHP_SC_drop_no_route);
        return;
    }
    struct sw_port *e = &sw->ports[choose(sw, &sw->groups[gi - 1], &ps, kind)];
    memcpy(p->data, e->link.peer_mac, 6);
    memcpy(p->data + 6, e->link.mac, 6);
    if (is_ethp(kind))
        p->data[ps.hdr_off + 27]++; /* hops */
    enqueue(sw, e, p, &ps, kind, now);
}

/* ---------------------------------------------------------------- rx / tx */

static int fault(struct ethp_switch *sw, const struct ethp_link_state *l)
{
    if (!__atomic_load_n(&sw->up, __ATOMIC_RELAXED))
        return ETHP_SC_drop_node_down;
    if (!l->up)
        return ETHP_SC_drop_link_down;
    if (l->loss > 0 && rnd(sw) < l->loss)
        return ETHP_SC_drop_loss;
    if (l->corrupt > 0 && rnd(sw) < l->corrupt)
        return ETHP_SC_drop_corrupt;
    return -1;
}

/* Link-level retry, as the two ends of a link run it: the far end finds a
 * bad FCS (or a gap in the per-hop sequence) and NACKs, and the frame goes
 * again once the NACK is back, a link round trip after it went out.  It is
 * go-back-N: what the link carried in between is discarded and replayed
 * behind it, so the link did no useful work for that time and order holds.
 * *why is the fault drawn for the first try; on return, the one that stands
 * after the replays (-1: none).  Returns the link time the replays took. */
static uint64_t llr_replay(struct ethp_switch *sw, struct sw_port *port, uint32_t len, int *why)
{
    uint64_t spent = 0;
    for (int i = 0; i < SW_LLR_MAX_REPLAYS && port->link.llr &&
                    (*why == ETHP_SC_drop_corrupt || *why == ETHP_SC_drop_loss);
         i++) {
        spent += 2 * port->link.delay_ns + ser_ns(&port->link, ethp_wire_bytes(len));
        port->c[ETHP_SC_llr_replays]++;
        *why = fault(sw, &port->link);
    }
    port->c[ETHP_SC_llr_replay_ns] += spent;
    return spent;
}

static void admit(struct ethp_switch *sw, struct sw_port *port, struct ethp_pkt *p, uint64_t now)
{
    if (!__atomic_load_n(&sw->up, __ATOMIC_RELAXED)) {
        drop(sw, port, p, ETHP_SC_drop_node_down);
        return;
    }
    uint64_t delay_ns = 0;
    if (port->link.peer_is_host) {
        int why = fault(sw, &port->link);
        uint64_t replay_ns = llr_replay(sw, port, p->len, &why);
        if (why >= 0) {
            drop(sw, port, p, why);
            return;
        }
        /* The frames behind a replayed one wait for it (the line releases in
         * order), as the host's go-back-N resends them after it. */
        delay_ns = frame_delay_ns(sw, &port->link) + replay_ns;
    }
    /* A link delivers no faster than its rate.  A sender whose thread woke
     * late makes up the link time it lost (its pacer's bounded burst) by
     * sending what was due back to back; spaced out again here, the burst
     * does not reach the egress queues as one (to be marked or trimmed for
     * the machine's lateness). */
    uint64_t start = port->in_free_ns > now ? port->in_free_ns : now;
    /* ... by at most a pacer's catch-up: what comes faster for longer (a
     * node that floods its veth) is not the lateness of a paced sender, and
     * must not pile up here unbounded */
    if (start > now + sw->cfg.catchup_ns)
        start = now + sw->cfg.catchup_ns;
    port->in_free_ns = start + ser_ns(&port->link, ethp_wire_bytes(p->len));
    if (delay_ns || start > now || port->in_wire.head) {
        wire_push(&port->in_wire, p, start + delay_ns);
        activate(sw, port);
        port->c[ETHP_SC_wire_frames]++;
        return;
    }
    forward(sw, p, now);
}

/* When a frame the ring stamped at wall_ns (the kernel's real-time clock,
 * as the frame reached the ring) arrived, on the loop's clock: a frame that
 * waited in the ring (a partly filled block until its timer, a late thread)
 * is forwarded as it came, not as the thread got to it (every hop's ring
 * wait was added to the frame's path, unscaled).  At most back_ns back: a
 * wait longer than a pacer's catch-up is the machine's lateness, which the
 * ingress spacing (admit) spreads out from there; in ring order, one
 * nanosecond apart at least, never after now; without a stamp: now. */
static uint64_t arrival(uint64_t now, uint64_t mono_at, uint64_t wall_at, uint64_t wall_ns,
                        uint64_t back_ns, uint64_t *prev)
{
    uint64_t t = now;
    if (wall_ns && wall_ns <= wall_at && mono_at > wall_at - wall_ns)
        t = mono_at - (wall_at - wall_ns);
    if (now > back_ns && t < now - back_ns)
        t = now - back_ns;
    if (t <= *prev)
        t = *prev + 1;
    if (t > now)
        t = now > *prev ? now : *prev + 1;
    *prev = t;
    return t;
}

/* Take up to SW_RX_TURN frames off the ring.  Returns 1 if that used the
 * whole turn (more may be waiting), 0 if the ring ran dry. */
static int rx(struct ethp_switch *sw, uint64_t now)
{
    struct ethp_pkt *pk[SW_BURST];
    uint64_t wall[SW_BURST];
    struct ethp_rx_clock clock;
    ethp_rx_clock_read(&clock);
    uint64_t prev = 0;
    for (uint32_t turn = 0; turn < SW_RX_TURN; turn += SW_BURST) {
        uint32_t n = ethp_port_rx_burst_stamped(sw->io, sw->pool, pk, wall, SW_BURST);
        for (uint32_t i = 0; i < n; i++) {
            struct ethp_pkt *p = pk[i];
            int ifx = p->ifindex;
            uint16_t idx1 = ifx > 0 && ifx < 65536 ? sw->port_of_if[ifx] : 0;
            if (!idx1) {
                sw->foreign++;
                ethp_pool_put(sw->pool, &p, 1);
                continue;
            }
            struct sw_port *port = &sw->ports[idx1 - 1];
            port->c[ETHP_SC_rx_frames]++;
            port->c[ETHP_SC_rx_bytes] += p->len;
            p->port = (uint16_t)(idx1 - 1);
            /* in ring (arrival) order across the whole turn: the ingress
             * delay lines then release it as it arrived, not port by port */
            if (ethp_rx_clock_see(&clock, wall[i]))
                now = clock.mono_ns; /* (never after now, the one of this frame) */
            admit(sw, port, p,
                  arrival(now, clock.mono_ns, clock.wall_ns, wall[i], sw->cfg.catchup_ns, &prev));
        }
        if (n < SW_BURST)
            return 0;
    }
    return 1;
}

/* When a frame leaving an ingress delay line arrived: when it was due, if
 * that has passed (a late thread), else now (it leaves a little early). */
static uint64_t arrived(const struct ethp_pkt *p, uint64_t now)
{
    return p->ts_ns < now ? p->ts_ns : now;
}

static void release_ingress(struct ethp_switch *sw, struct sw_port *port, uint64_t now)
{
    while (port->in_wire.head && port->in_wire.head_ts_ns <= now + port->ahead_ns) {
        struct ethp_pkt *p = q_pop(&port->in_wire);
        port->c[ETHP_SC_wire_frames]--;
        forward(sw, p, arrived(p, now));
    }
}

/* Frames leave the ingress delay lines in the order they arrived, across
 * ports: going port by port would always queue port 0's frames first, and
 * near a full buffer the later ports' frames would be the ones dropped or
 * trimmed, every time. */
static void release_ingress_all(struct ethp_switch *sw, uint64_t now)
{
    uint16_t *cand = sw->cand;
    uint32_t nc = 0;
    for (uint32_t k = 0; k < sw->n_active; k++) {
        uint16_t i = sw->active[k];
        if (sw->ports[i].in_wire.head && sw->ports[i].in_wire.head_ts_ns <= now + sw->ports[i].ahead_ns)
            cand[nc++] = i;
    }
    if (nc == 1) {
        release_ingress(sw, &sw->ports[cand[0]], now);
        return;
    }
    while (nc) {
        uint32_t best = 0;
        for (uint32_t j = 1; j < nc; j++)
            if (sw->ports[cand[j]].in_wire.head_ts_ns < sw->ports[cand[best]].in_wire.head_ts_ns)
                best = j;
        struct sw_port *e = &sw->ports[cand[best]];
        struct ethp_pkt *p = q_pop(&e->in_wire);
        e->c[ETHP_SC_wire_frames]--;
        forward(sw, p, arrived(p, now));
        if (!e->in_wire.head || e->in_wire.head_ts_ns > now + e->ahead_ns)
            cand[best] = cand[--nc];
    }
}

static int next_class(const struct sw_port *e, uint64_t now)
{
    for (int c = 0; c < ETHP_NCLASSES; c++)
        if (e->q[c].frames && now >= e->paused_until[c])
            return c;
    return -1;
}

/* INT (HPCC): this port's record, appended to the packet's block as the
 * packet leaves the queue: the link's clock when its last bit is out, the
 * port's wire bytes so far, the queue left behind it, the link's rate. */
static void int_stamp(struct ethp_switch *sw, struct sw_port *e, struct ethp_pkt *p)
{
    struct ethp_wire_int *b = (struct ethp_wire_int *)(p->data + p->int_off);
    if (b->n_hops >= ETHP_INT_MAX_HOPS)
        return;
    uint64_t q64 = nominal_q(e, e->q[0].bytes + e->q[1].bytes) / 64; /* as marks judge it */
    struct ethp_wire_int_hop *h = &b->hop[b->n_hops++];
    h->port_id = htons((uint16_t)(sw->cfg.int_id * 1024 + (uint32_t)(e - sw->ports)));
    h->qlen_64b = htons((uint16_t)(q64 > 0xffff ? 0xffff : q64));
    h->ts_ns = htonl((uint32_t)e->next_tx_ns);
    h->tx_bytes = htonl((uint32_t)e->sched_wire_bytes);
    h->rate_kbps = htonl((uint32_t)(e->link.rate_bps / 1000 > 0xffffffffu
                                        ? 0xffffffffu
                                        : e->link.rate_bps / 1000));
    e->c[ETHP_SC_int_stamped]++;
}

/* Put on the link every frame that starts by until; a late thread's
 * catch-up is bounded by the loop's real time, sw->now_ns. */
static void schedule_until(struct ethp_switch *sw, struct sw_port *e, uint64_t until)
{
    int c;
    uint64_t now = sw->now_ns;
    while ((c = next_class(e, now)) >= 0 && e->next_tx_ns <= until) {
        struct ethp_pkt *p = q_pop(&e->q[c]);
        __atomic_store_n(&sw->buffer_used_bytes, sw->buffer_used_bytes - p->len, __ATOMIC_RELAXED);
        e->cc[c][ETHP_CC_tx_frames]++;
        e->cc[c][ETHP_CC_q_bytes] = nominal_q(e, e->q[c].bytes);
        e->c[ETHP_SC_q_frames]--;
        e->c[ETHP_SC_q_bytes] = nominal_q(e, e->q[0].bytes + e->q[1].bytes);
        if (sw->cfg.lossless && !p->origin) {
            struct sw_port *in = &sw->ports[p->port];
            in->pfc_in_bytes[c] -= p->len;
            if (in->pfc_refresh_ns[c] && in->pfc_in_bytes[c] < sw->cfg.pfc_xon_bytes)
                pfc_send(sw, in, c, 0, now);
        }
        /* A pacer with a bounded burst: a thread that woke late may make up
         * to catchup_ns of link time it lost, but a frame never starts before
         * it was queued (an idle link earns no credit) or the link was free. */
        uint64_t floor = now > sw->cfg.catchup_ns ? now - sw->cfg.catchup_ns : 0;
        uint64_t start = e->next_tx_ns;
        if (p->ts_ns > start)
            start = p->ts_ns;
        /* a class held by PFC could not use the link before its pause ended:
         * that wait is the fabric's, not link time the thread lost */
        if (e->paused_until[c] > start && e->paused_until[c] <= now)
            start = e->paused_until[c];
        if (floor > start) {
            e->c[ETHP_SC_lost_link_ns] += floor - start;
            e->lost_debt_ns += floor - start;
            start = floor;
        }
        if (!e->q[0].bytes && !e->q[1].bytes)
            e->lost_debt_ns = 0; /* drained: the link is on its schedule again */
        uint32_t wire = ethp_wire_bytes(p->len);
        e->next_tx_ns = start + ser_ns(&e->link, wire);
        e->sched_wire_bytes += wire;
        int why = fault(sw, &e->link);
        e->next_tx_ns += llr_replay(sw, e, p->len, &why);
        if (why >= 0) {
            drop(sw, e, p, why);
            continue;
        }
        if (p->int_off)
            int_stamp(sw, e, p);
        wire_push(&e->wire, p, e->next_tx_ns + frame_delay_ns(sw, &e->link));
        e->c[ETHP_SC_wire_frames]++;
    }
}

static void schedule(struct ethp_switch *sw, struct sw_port *e, uint64_t now)
{
    schedule_until(sw, e, now + (e->ahead_ns > sw->cfg.lookahead_ns ? e->ahead_ns
                                                                     : sw->cfg.lookahead_ns));
}

static void release_egress(struct ethp_switch *sw, struct sw_port *e, uint64_t now)
{
    const uint64_t *io = ethp_port_counters_ref(sw->io);
    uint64_t until = now + e->ahead_ns;
    while (e->wire.head && e->wire.head_ts_ns <= until) {
        struct ethp_pkt *b[SW_BURST];
        uint32_t n = 0;
        while (n < SW_BURST && e->wire.head && e->wire.head_ts_ns <= until)
            b[n++] = q_pop(&e->wire);
        uint64_t err_before = io[ETHP_PC_tx_errors];
        uint32_t sent = ethp_port_tx_burst_to(sw->io, b, n, e->ifindex);
        uint64_t errs = io[ETHP_PC_tx_errors] - err_before;
        for (uint32_t i = n; i > sent; i--) /* socket buffer full: retry later, in order */
            q_push_front(&e->wire, b[i - 1]);
        e->c[ETHP_SC_tx_again] += n - sent;
        e->c[ETHP_SC_tx_frames] += sent - errs;
        e->c[ETHP_SC_drop_tx_error] += errs;
        e->c[ETHP_SC_wire_frames] -= sent;
        for (uint32_t i = 0; i < sent; i++) {
            e->c[ETHP_SC_tx_bytes] += b[i]->len;
            uint64_t late = now > b[i]->ts_ns ? now - b[i]->ts_ns : 0;
            e->c[ETHP_SC_late_sum_ns] += late;
            if (late > e->c[ETHP_SC_late_max_ns])
                e->c[ETHP_SC_late_max_ns] = late;
            if (late > SW_LATE_NS)
                e->c[ETHP_SC_late_frames]++;
        }
        ethp_pool_put(sw->pool, b, sent);
        if (sent < n)
            return;
    }
}

static void pfc_refresh(struct ethp_switch *sw, struct sw_port *port, uint64_t now)
{
    for (int c = 0; c < ETHP_NCLASSES; c++)
        if (port->pfc_refresh_ns[c] && now >= port->pfc_refresh_ns[c])
            pfc_send(sw, port, c, 0xffff, now);
}

/* The earliest time anything is due, or UINT64_MAX. */
static uint64_t next_due(const struct ethp_switch *sw, uint64_t now)
{
    uint64_t t = ethp_port_due_ns(sw->io);
#define ETHP_MIN(x) do { uint64_t v_ = (x); if (v_ < t) t = v_; } while (0)
    for (uint32_t k = 0; k < sw->n_active; k++) {
        const struct sw_port *e = &sw->ports[sw->active[k]];
        /* due when its first frame is; the wake then serves the port's
         * next ahead_ns too (a window that slid with the due time would
         * wake once a frame all the same) */
        if (e->in_wire.head)
            ETHP_MIN(e->in_wire.head_ts_ns);
        if (e->wire.head)
            ETHP_MIN(e->wire.head_ts_ns);
        for (int c = 0; c < ETHP_NCLASSES; c++) {
            if (!e->q[c].frames)
                continue;
            if (now < e->paused_until[c])
                ETHP_MIN(e->paused_until[c]);
            else
                ETHP_MIN(e->next_tx_ns > sw->cfg.lookahead_ns ? e->next_tx_ns - sw->cfg.lookahead_ns : 0);
        }
        for (int c = 0; c < ETHP_NCLASSES; c++)
            if (e->pfc_refresh_ns[c])
                ETHP_MIN(e->pfc_refresh_ns[c]);
    }
#undef ETHP_MIN
    return t;
}

/* A port's link, and what follows from it: the PFC headroom, what the
 * upstream device sends after XOFF before its pause takes effect (the
 * link's rate over the pause's way there, the last frame's way back and the
 * device's response, plus a frame being sent at each end). */
static void set_link(struct ethp_switch *sw, struct sw_port *e, const struct ethp_link_state *link)
{
    e->link = *link;
    e->ahead_ns = ser_ns(link, ETHP_AHEAD_WIRE_BYTES);
    uint64_t ns = 2 * (link->delay_ns + link->jitter_ns) + SW_PFC_RESPONSE_NS;
    e->pfc_headroom_bytes =
        sw->cfg.pfc_headroom_bytes
            ? sw->cfg.pfc_headroom_bytes
            : (uint64_t)((unsigned __int128)link->rate_bps * ns / 8000000000u) +
                  2 * ETHP_MAX_FRAME_BYTES;
}

static void apply_pending(struct ethp_switch *sw)
{
    if (!__atomic_exchange_n(&sw->have_pending, 0, __ATOMIC_ACQ_REL))
        return;
    pthread_mutex_lock(&sw->lock);
    for (uint32_t i = 0; i < sw->n_ports; i++) {
        struct sw_port *e = &sw->ports[i];
        if (e->has_pending) {
            set_link(sw, e, &e->pending);
            e->has_pending = 0;
        }
    }
    pthread_mutex_unlock(&sw->lock);
}

static void *sw_main(void *arg)
{
    struct ethp_switch *sw = arg;
    struct epoll_event evs[64];
    prctl(PR_SET_TIMERSLACK, 1UL); /* wake when asked, not 50 us later */
    /* cpu.SWITCH_THREAD: its CPU is the frames', apart from the fabric's Python */
    prctl(PR_SET_NAME, (unsigned long)"ethp-sw");
    int more = 0; /* the ring held more than a turn's frames: do not sleep */
    while (!__atomic_load_n(&sw->stop, __ATOMIC_ACQUIRE)) {
        apply_pending(sw);
        int ring = more;
        if (!more) {
            int n = ethp_epoll_until(sw->epfd, evs, 64, next_due(sw, ethp_now_ns()));
            sw->wakeups++;
            if (ethp_now_ns() >= ethp_port_due_ns(sw->io))
                ring = 1; /* the port has a change to make */
            for (int i = 0; i < n; i++) {
                if ((uint32_t)evs[i].data.u64 != SW_EVFD_TAG) {
                    ring = 1;
                    ethp_port_event(sw->io, evs[i].data.u64);
                } else {
                    uint64_t v;
                    if (read(sw->evfd, &v, sizeof(v)) < 0) { /* nothing to do */ }
                }
            }
        }
        /* A turn at a time: what came in is forwarded and sent before more
         * is read, so few frames (and the buffers they touch) are in flight
         * and none waits behind a whole ring's worth. */
        sw->now_ns = ethp_now_ns();
        more = ring ? rx(sw, sw->now_ns) : 0;
        uint64_t now = sw->now_ns = ethp_now_ns();
        release_ingress_all(sw, now);
        uint32_t kept = 0;
        for (uint32_t k = 0; k < sw->n_active; k++) {
            struct sw_port *e = &sw->ports[sw->active[k]];
            schedule(sw, e, now);
            release_egress(sw, e, now);
            pfc_refresh(sw, e, now);
            if (port_busy(e))
                sw->active[kept++] = sw->active[k];
            else
                e->active = 0;
        }
        sw->n_active = kept;
    }
    return NULL;
}

/* ---------------------------------------------------------------- API */

struct ethp_switch *ethp_switch_new(const struct ethp_switch_cfg *cfg, uint32_t max_ports)
{
    struct ethp_switch *sw = calloc(1, sizeof(*sw));
    if (!sw)
        return NULL;
    sw->cfg = *cfg;
    sw->max_ports = max_ports;
    sw->ports = calloc(max_ports, sizeof(*sw->ports));
    sw->route_ip = calloc(65536, sizeof(uint16_t));
    sw->route_ep = calloc(65536, sizeof(uint16_t));
    sw->port_of_if = calloc(65536, sizeof(uint16_t));
    sw->active = calloc(max_ports ? max_ports : 1, sizeof(uint16_t));
    sw->cand = calloc(max_ports ? max_ports : 1, sizeof(uint16_t));
    sw->pool =
        ethp_pool_new_sized(cfg->pool_pkts, cfg->buf_bytes, cfg->pool_small_pkts, cfg->small_buf_bytes);
    sw->epfd = epoll_create1(EPOLL_CLOEXEC);
    sw->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    sw->rng = ethp_rng_seed(cfg->seed);
    sw->up = 1;
    pthread_mutex_init(&sw->lock, NULL);
    if (cfg->agg_slots && cfg->agg_id < ETHP_AGG_MAX_IDS) {
        sw->agg = ethp_agg_new(cfg->agg_slots, cfg->buf_bytes);
        sw->agg_ep = (uint16_t)(ETHP_AGG_EP_BASE + cfg->agg_id);
        sw->agg_ip = ETHP_AGG_NET + cfg->agg_id;
    }
    if ((cfg->agg_slots && !sw->agg) || !sw->ports || !sw->route_ip || !sw->route_ep || !sw->port_of_if || !sw->active ||
        !sw->cand || !sw->pool ||
        sw->epfd < 0 || sw->evfd < 0) {
        ethp_switch_free(sw);
        return NULL;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = SW_EVFD_TAG};
    epoll_ctl(sw->epfd, EPOLL_CTL_ADD, sw->evfd, &ev);
    return sw;
}

static int open_ring(struct ethp_switch *sw, const char *netns_path)
{
    /* 64 KiB blocks, 4 per port (16 to 512): each 1 ms retire timeout uses a
     * block however few frames it holds, so many small blocks ride out a
     * stalled thread better than a few large ones. */
    uint32_t blocks = sw->max_ports * 4;
    blocks = blocks < 16 ? 16 : blocks > 512 ? 512 : blocks;
    struct ethp_port_cfg pc = {.block_bytes = 1u << 16, .n_blocks = blocks,
                               .block_timeout_ms = 1, .sndbuf_bytes = 4u << 20,
                               .ring_idle_ms = sw->cfg.ring_idle_ms};
    int err;
    sw->io = ethp_port_open(netns_path, NULL, &pc, &err);
    if (!sw->io)
        return err;
    err = ethp_port_watch(sw->io, sw->epfd, 0);
    if (err)
        return err;
    snprintf(sw->netns_path, sizeof(sw->netns_path), "%s", netns_path ? netns_path : "");
    return 0;
}

int ethp_switch_add_port(struct ethp_switch *sw, const char *netns_path, const char *ifname,
                         const struct ethp_link_state *link)
{
    if (sw->started || sw->n_ports >= sw->max_ports || !link->rate_bps)
        return -EINVAL;
    if (!sw->io) {
        int rc = open_ring(sw, netns_path);
        if (rc)
            return rc;
    } else if (strcmp(sw->netns_path, netns_path ? netns_path : "") != 0) {
        return -EXDEV; /* every port of a switch lives in its namespace */
    }
    int ifx = ethp_netns_ifindex(netns_path, ifname);
    if (ifx < 0)
        return ifx;
    if (ifx >= 65536 || sw->port_of_if[ifx])
        return -EINVAL;
    uint32_t idx = sw->n_ports;
    sw->ports[idx].ifindex = ifx;
    set_link(sw, &sw->ports[idx], link);
    sw->port_of_if[ifx] = (uint16_t)(idx + 1);
    sw->n_ports++;
    return (int)idx;
}

int ethp_switch_add_route(struct ethp_switch *sw, uint32_t kind, uint32_t key,
                          const uint16_t *ports, uint32_t n_ports)
{
    if (sw->started || !n_ports || n_ports > ETHP_MAX_GROUP_PORTS)
        return -EINVAL;
    if (kind == ETHP_ROUTE_IPV4 && key >> 16 != SW_LAB_NET)
        return -EINVAL;
    if (kind > ETHP_ROUTE_EP || (kind == ETHP_ROUTE_EP && key > 0xffff))
        return -EINVAL;
    for (uint32_t i = 0; i < n_ports; i++)
        if (ports[i] >= sw->n_ports)
            return -EINVAL;
    if (sw->n_groups == 0xffff)
        return -ENOSPC;
    if (sw->n_groups == sw->cap_groups) {
        uint32_t cap = sw->cap_groups ? sw->cap_groups * 2 : 64;
        struct sw_group *g = realloc(sw->groups, cap * sizeof(*g));
        if (!g)
            return -ENOMEM;
        sw->groups = g;
        sw->cap_groups = cap;
    }
    struct sw_group *g = &sw->groups[sw->n_groups];
    g->ports = malloc(n_ports * sizeof(uint16_t));
    if (!g->ports)
        return -ENOMEM;
    memcpy(g->ports, ports, n_ports * sizeof(uint16_t));
    g->n = (uint16_t)n_ports;
    sw->n_groups++;
    uint16_t *table = kind == ETHP_ROUTE_IPV4 ? sw->route_ip : sw->route_ep;
    table[key & 0xffff] = (uint16_t)sw->n_groups;
    return 0;
}

int ethp_switch_start(struct ethp_switch *sw)
{
    if (sw->started)
        return -EALREADY;
    int rc = pthread_create(&sw->thread, NULL, sw_main, sw);
    if (rc)
        return -rc;
    sw->started = 1;
    return 0;
}

static void free_queue(struct ethp_switch *sw, struct pktq *q)
{
    struct ethp_pkt *p;
    while ((p = q_pop(q)))
        ethp_pool_put(sw->pool, &p, 1);
}

void ethp_switch_free(struct ethp_switch *sw)
{
    if (!sw)
        return;
    if (sw->started) {
        __atomic_store_n(&sw->stop, 1, __ATOMIC_RELEASE);
        ethp_kick(sw->evfd);
        pthread_join(sw->thread, NULL);
    }
    for (uint32_t i = 0; i < sw->n_ports && sw->ports; i++) {
        struct sw_port *e = &sw->ports[i];
        for (int c = 0; c < ETHP_NCLASSES; c++)
            free_queue(sw, &e->q[c]);
        free_queue(sw, &e->wire);
        free_queue(sw, &e->in_wire);
    }
    ethp_port_close(sw->io);
    free(sw->port_of_if);
    free(sw->active);
    free(sw->cand);
    for (uint32_t i = 0; i < sw->n_groups; i++)
        free(sw->groups[i].ports);
    free(sw->groups);
    free(sw->ports);
    free(sw->route_ip);
    free(sw->route_ep);
    ethp_pool_free(sw->pool);
    ethp_agg_free(sw->agg);
    if (sw->epfd >= 0)
        close(sw->epfd);
    if (sw->evfd >= 0)
        close(sw->evfd);
    pthread_mutex_destroy(&sw->lock);
    free(sw);
}

int ethp_switch_set_link(struct ethp_switch *sw, uint32_t port, const struct ethp_link_state *link)
{
    if (port >= sw->n_ports || !link->rate_bps)
        return -EINVAL;
    if (!sw->started) {
        set_link(sw, &sw->ports[port], link);
        return 0;
    }
    pthread_mutex_lock(&sw->lock);
    sw->ports[port].pending = *link;
    sw->ports[port].has_pending = 1;
    pthread_mutex_unlock(&sw->lock);
    __atomic_store_n(&sw->have_pending, 1, __ATOMIC_RELEASE);
    ethp_kick(sw->evfd);
    return 0;
}

void ethp_switch_set_up(struct ethp_switch *sw, uint32_t up)
{
    __atomic_store_n(&sw->up, up ? 1u : 0u, __ATOMIC_RELEASE);
    ethp_kick(sw->evfd);
}

int ethp_switch_agg_join(struct ethp_switch *sw, uint32_t group, uint32_t parent_id,
                         uint32_t parent_index, uint32_t parent_members)
{
    /* (a switch that were its own parent would send its partials to itself) */
    if (!sw->agg || parent_id == sw->cfg.agg_id ||
        ethp_agg_join(sw->agg, group, parent_id, parent_index, parent_members) < 0)
        return -EINVAL;
    return 0;
}

int ethp_switch_agg_leave(struct ethp_switch *sw, uint32_t group)
{
    return sw->agg ? ethp_agg_leave(sw->agg, group) : -EINVAL;
}

int ethp_switch_agg_register(struct ethp_switch *sw, uint32_t group, const uint32_t *ips,
                             const uint32_t *eps, uint32_t n_members, uint32_t quota_slots)
{
    return sw->agg ? ethp_agg_register(sw->agg, group, ips, eps, n_members, quota_slots) : -EINVAL;
}

int ethp_switch_agg_unregister(struct ethp_switch *sw, uint32_t group)
{
    return sw->agg ? ethp_agg_unregister(sw->agg, group) : -EINVAL;
}

uint32_t ethp_switch_port_count(const struct ethp_switch *sw) { return sw->n_ports; }

void ethp_switch_ring_counters(struct ethp_switch *sw, uint64_t *out)
{
    uint64_t io[ETHP_PORT_NCOUNTERS];
    ethp_port_counters(sw->io, io); /* folds the kernel's ring drops in */
    out[0] = io[ETHP_PC_rx_ring_drops];
    out[1] = io[ETHP_PC_rx_no_buf] + io[ETHP_PC_rx_truncated];
    out[2] = __atomic_load_n(&sw->foreign, __ATOMIC_RELAXED);
    out[3] = io[ETHP_PC_rx_one_by_one];
    out[4] = io[ETHP_PC_ring_builds];
    out[5] = io[ETHP_PC_ring_parks];
    out[6] = io[ETHP_PC_ring_failures];
    out[7] = (uint64_t)ethp_port_ring_up(sw->io);
    out[8] = io[ETHP_PC_ring_backoffs];
    out[9] = io[ETHP_PC_rx_one_by_one_drops];
}
void ethp_switch_buffer(const struct ethp_switch *sw, uint64_t *used_bytes, uint64_t *hwm_bytes)
{
    *used_bytes = __atomic_load_n(&sw->buffer_used_bytes, __ATOMIC_RELAXED);
    *hwm_bytes = __atomic_load_n(&sw->buffer_hwm_bytes, __ATOMIC_RELAXED);
}
uint64_t ethp_switch_wakeups(const struct ethp_switch *sw)
{
    return __atomic_load_n(&sw->wakeups, __ATOMIC_RELAXED);
}

void ethp_switch_counters(struct ethp_switch *sw, uint32_t port, uint64_t *out, uint64_t *cls_out)
{
    if (port >= sw->n_ports)
        return;
    struct sw_port *e = &sw->ports[port];
    for (int i = 0; i < ETHP_SW_NCOUNTERS; i++)
        out[i] = __atomic_load_n(&e->c[i], __ATOMIC_RELAXED);
    for (int c = 0; c < ETHP_NCLASSES; c++)
        for (int i = 0; i < ETHP_SW_NCLASS_COUNTERS; i++)
            cls_out[c * ETHP_SW_NCLASS_COUNTERS + i] = __atomic_load_n(&e->cc[c][i], __ATOMIC_RELAXED);
}

int ethp_switch_counters_of_all(struct ethp_switch *sw, const uint32_t *which, uint32_t n_which,
                                uint64_t *out, uint32_t n_ports)
{
    if (n_ports != sw->n_ports)
        return -EINVAL;
    for (uint32_t i = 0; i < n_which; i++)
        if (which[i] >= ETHP_SW_NCOUNTERS)
            return -EINVAL;
    for (uint32_t p = 0; p < sw->n_ports; p++)
        for (uint32_t i = 0; i < n_which; i++)
            out[(size_t)p * n_which + i] = __atomic_load_n(&sw->ports[p].c[which[i]],
                                                           __ATOMIC_RELAXED);
    return (int)sw->n_ports;
}

void ethp_switch_config(const struct ethp_switch *sw, struct ethp_switch_cfg *out)
{
    *out = sw->cfg;
}
