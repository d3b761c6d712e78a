/* cc_nscc.c - NSCC-like window control (UEC; PROTOCOLS.md, "Algorithms").
 *
 * On each ack with queueing delay d and ECN mark e, against the target delay
 * T (1.0 x base RTT: the sender does not know whether the fabric trims):
 *   no ECN, d < T:  proportional increase, (T - d) / T x max_cwnd / 4 per
 *                   window acked: proportional to the headroom and the same
 *                   for every flow (an increase proportional to the flow's
 *                   own window kept whatever split two flows started with);
 *   no ECN, d >= T: fair additive increase, one MSS per window acked;
 *   ECN, d < T:     no change (the engine moves traffic off that path);
 *   ECN, d >= T:    cwnd *= max(1 - 0.8 (d - T) / d, 0.5), once per RTT.
 * On a trim or loss: cwnd = bytes acked in the last RTT.  Window between one
 * MSS and max_cwnd_bytes; it starts at the max.
 */
#include "cc.h"

static void clamp(struct ethp_cc_state *s, const struct ethp_cc_params *pp)
{
    if (s->cwnd_bytes > pp->max_cwnd_bytes)
        s->cwnd_bytes = pp->max_cwnd_bytes;
    if (s->cwnd_bytes < pp->mss_bytes)
        s->cwnd_bytes = pp->mss_bytes;
}

static void nscc_init(struct ethp_cc_state *s, const struct ethp_cc_params *pp)
{
    *s = (struct ethp_cc_state){.cwnd_bytes = pp->max_cwnd_bytes};
    clamp(s, pp);
}

static void nscc_on_ack(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                        uint64_t acked, uint64_t rtt_ns, int ecn, uint64_t now)
{
    uint64_t base = pp->base_rtt_ns, T = base;
    uint64_t d = rtt_ns > base ? rtt_ns - base : 0;
    s->acked_epoch_bytes += acked;
    if (now - s->rtt_epoch_ns > base) {
        s->acked_last_rtt_bytes = s->acked_epoch_bytes;
        s->acked_epoch_bytes = 0;
        s->rtt_epoch_ns = now;
    }
    if (!ecn && d < T) {
        /* per window acked, the same for every flow (see above) */
        uint64_t w = s->cwnd_bytes ? s->cwnd_bytes : 1;
        s->cwnd_bytes += acked * (T - d) / T * (pp->max_cwnd_bytes / 4) / w;
    } else if (!ecn) {
        s->cwnd_bytes += pp->mss_bytes * acked / (s->cwnd_bytes ? s->cwnd_bytes : 1);
    } else if (d >= T && now - s->last_decrease_ns > rtt_ns) {
        double f = 1.0 - 0.8 * (double)(d - T) / (double)d;
        if (f < 0.5)
            f = 0.5;
        s->cwnd_bytes = (uint64_t)((double)s->cwnd_bytes * f);
        s->last_decrease_ns = now;
    }
    clamp(s, pp);
}

static void nscc_on_nack(struct ethp_cc_state *s, const struct ethp_cc_params *pp, uint64_t now)
{
    if (now - s->last_decrease_ns < pp->base_rtt_ns)
        return;
    uint64_t w = s->acked_last_rtt_bytes > pp->mss_bytes ? s->acked_last_rtt_bytes
                                                         : pp->mss_bytes;
    if (w < s->cwnd_bytes)
        s->cwnd_bytes = w;
    s->last_decrease_ns = now;
}

static void nscc_on_timeout(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                            uint64_t now)
{
    (void)now;
    if (s->cwnd_bytes > 2 * pp->mss_bytes)
        s->cwnd_bytes = 2 * pp->mss_bytes;
}

const struct ethp_cc_ops ethp_cc_nscc = {
    .name = "nscc",
    .init = nscc_init,
    .on_ack = nscc_on_ack,
    .on_nack = nscc_on_nack,
    .on_timeout = nscc_on_timeout,
};
