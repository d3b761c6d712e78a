/* cc_hpcc.c - HPCC-like window control (Li et al., SIGCOMM 2019;
 * PROTOCOLS.md, "Algorithms": HPCC).
 *
 * Every switch a data packet leaves appends its egress port's record (INT:
 * queue length, wire bytes sent, a timestamp, the link rate); the ack echoes
 * them.  Per ack, for each hop whose port was seen before:
 *   txRate = (tx_bytes - tx_bytes') / (ts - ts'),
 *   u      = min(qlen, qlen') / (B T) + txRate / B,
 * the largest u over the hops (tau: that hop's time step, at most T) feeds
 *   U = (1 - tau / T) U + tau / T u,
 * and the window follows the reference window W_c:
 *   U >= eta, or maxStage additive steps done: W = W_c / (U / eta) + W_AI,
 *   otherwise:                                 W = W_c + W_AI,
 * W_c taking W's value once per round (on the first ack of a packet sent
 * after the last change); the sub-flow is paced at R = W / T.  eta = 0.95, maxStage = 5 (the paper's),
 * W_AI = BDP (1 - eta) / N with N = 16 flows per link.
 *
 * T is the base RTT, or the lowest RTT this window has seen if that is
 * longer: in the emulator every round trip also carries unscaled latency
 * (ring timers, scheduling, a packet's serialisation at a slowed-down
 * rate), and with the configured T alone the window would stop short of
 * filling the pipe.  The window stays between one MSS and 1.5 BDP (of that
 * T); it starts at one BDP.
 *
 * Spraying: a sub-flow's packets cross different switches (a Clos spine
 * per entropy value), so the previous record is kept per egress port (by
 * its id, in a small direct-mapped table), not per position on the path.
 * Loss or a trim (the paper's fabric is lossless): W_c and W halve, at most
 * once per base RTT; a timeout leaves one MSS.
 */
#include <assert.h>

#include "cc.h"

#define HPCC_ETA 0.95
#define HPCC_MAX_STAGE 5u
#define HPCC_FLOWS 16.0
#define HPCC_SLOTS 8u

struct hpcc_link {
    uint16_t id, valid;
    uint32_t ts_ns, tx_bytes, qlen_64b;
};

struct hpcc {
    double w_c; /* reference window, bytes */
    double u;   /* normalised inflight bytes of the most loaded hop, averaged */
    uint64_t min_rtt_ns;
    uint32_t stage;
    uint32_t updated;        /* W_c has changed at least once */
    uint32_t last_update_ts; /* sender clock (mod 2^32) when W_c last changed */
    struct hpcc_link link[HPCC_SLOTS];
};

static_assert(sizeof(struct hpcc) <= sizeof(((struct ethp_cc_state *)0)->algo), "hpcc state");

static struct hpcc *state(struct ethp_cc_state *s) { return (struct hpcc *)s->algo; }

static double base_rtt(struct ethp_cc_state *s, const struct ethp_cc_params *pp)
{
    uint64_t m = state(s)->min_rtt_ns;
    return (double)(m > pp->base_rtt_ns ? m : pp->base_rtt_ns);
}

/* max_cwnd_bytes is 1.5 BDP at the configured base RTT */
static double bdp_bytes(struct ethp_cc_state *s, const struct ethp_cc_params *pp)
{
    return (double)pp->max_cwnd_bytes / 1.5 * base_rtt(s, pp) / (double)pp->base_rtt_ns;
}

static double clamp(struct ethp_cc_state *s, const struct ethp_cc_params *pp, double w)
{
    double top = 1.5 * bdp_bytes(s, pp);
    if (w > top)
        return top;
    return w < (double)pp->mss_bytes ? (double)pp->mss_bytes : w;
}

/* The window, and the pacing rate that goes with it: R = W / T. */
static void set_window(struct ethp_cc_state *s, const struct ethp_cc_params *pp, double w)
{
    s->cwnd_bytes = (uint64_t)w;
    double r = w * 8e9 / base_rtt(s, pp);
    s->rate_bps = r < (double)pp->line_rate_bps ? (uint64_t)r : pp->line_rate_bps;
}

static void hpcc_init(struct ethp_cc_state *s, const struct ethp_cc_params *pp)
{
    *s = (struct ethp_cc_state){0};
    struct hpcc *h = state(s);
    h->u = 1.0;
    h->w_c = clamp(s, pp, bdp_bytes(s, pp));
    set_window(s, pp, h->w_c);
}

/* The paper's MeasureInflight; returns 0 when no hop had an earlier record. */
static int measure(struct hpcc *h, double T, const struct ethp_int_hop *hops, uint32_t n)
{
    double u_max = -1.0, tau = T;
    for (uint32_t i = 0; i < n; i++) {
        const struct ethp_int_hop *r = &hops[i];
        struct hpcc_link *l = &h->link[r->port_id % HPCC_SLOTS];
        int32_t dt = (int32_t)(r->ts_ns - l->ts_ns);
        if (l->valid && l->id == r->port_id && dt > 0 && r->rate_kbps) {
            double B = (double)r->rate_kbps / 8e6; /* bytes per ns */
            double rate = (double)(uint32_t)(r->tx_bytes - l->tx_bytes) / dt;
            uint32_t q = r->qlen_64b < l->qlen_64b ? r->qlen_64b : l->qlen_64b;
            double u = (double)q * 64.0 / (B * T) + rate / B;
            if (u > u_max) {
                u_max = u;
                tau = dt;
            }
        }
        *l = (struct hpcc_link){.id = r->port_id, .valid = 1, .ts_ns = r->ts_ns,
                                .tx_bytes = r->tx_bytes, .qlen_64b = r->qlen_64b};
    }
    if (u_max < 0)
        return 0;
    if (tau > T)
        tau = T;
    h->u = (1.0 - tau / T) * h->u + tau / T * u_max;
    return 1;
}

static void hpcc_on_int(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                        const struct ethp_int_hop *hops, uint32_t n, uint32_t sent_ts_ns,
                        uint64_t now)
{
    struct hpcc *h = state(s);
    if (!measure(h, base_rtt(s, pp), hops, n))
        return;
    /* a new round: the acked packet left after the last change of W_c */
    int update = !h->updated || (int32_t)(sent_ts_ns - h->last_update_ts) > 0;
    double w_ai = bdp_bytes(s, pp) * (1.0 - HPCC_ETA) / HPCC_FLOWS, w;
    if (h->u >= HPCC_ETA || h->stage >= HPCC_MAX_STAGE) {
        double u = h->u > 1e-3 ? h->u : 1e-3;
        w = h->w_c / (u / HPCC_ETA) + w_ai;
        if (update)
            h->stage = 0;
    } else {
        w = h->w_c + w_ai;
        if (update)
            h->stage++;
    }
    w = clamp(s, pp, w);
    if (update) {
        h->w_c = w;
        h->updated = 1;
        h->last_update_ts = (uint32_t)now;
    }
    set_window(s, pp, w);
}

static void hpcc_on_ack(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                        uint64_t acked, uint64_t rtt_ns, int ecn, uint64_t now)
{
    /* the window moves on INT (hpcc_on_int); acks only teach T */
    (void)pp, (void)acked, (void)ecn, (void)now;
    struct hpcc *h = state(s);
    if (rtt_ns && (!h->min_rtt_ns || rtt_ns < h->min_rtt_ns))
        h->min_rtt_ns = rtt_ns;
}

static void cut(struct ethp_cc_state *s, const struct ethp_cc_params *pp, double f,
                uint64_t now)
{
    struct hpcc *h = state(s);
    h->w_c = clamp(s, pp, h->w_c * f);
    h->stage = 0;
    h->updated = 1;
    h->last_update_ts = (uint32_t)now;
    set_window(s, pp, h->w_c);
    s->last_decrease_ns = now;
}

static void hpcc_on_nack(struct ethp_cc_state *s, const struct ethp_cc_params *pp, uint64_t now)
{
    if (now - s->last_decrease_ns >= pp->base_rtt_ns)
        cut(s, pp, 0.5, now);
}

static void hpcc_on_timeout(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                            uint64_t now)
{
    cut(s, pp, 0.0, now); /* one MSS, then INT says how much room there is */
}

const struct ethp_cc_ops ethp_cc_hpcc = {
    .name = "hpcc",
    .init = hpcc_init,
    .on_ack = hpcc_on_ack,
    .on_nack = hpcc_on_nack,
    .on_timeout = hpcc_on_timeout,
    .on_int = hpcc_on_int,
};
