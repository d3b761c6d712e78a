/* cc_dcqcn.c - DCQCN rate control (Zhu et al., SIGCOMM 2015; PROTOCOLS.md).
 *
 * Per queue pair.  The receiver turns CE marks into CNPs (at most one per
 * interval per QP: the engine does that).  On a CNP the sender cuts its rate:
 * target Rt = Rc, Rc *= (1 - alpha/2), alpha = (1-g) alpha + g.  Without
 * CNPs, alpha decays every timer period: alpha *= (1-g).  The rate recovers
 * in stages counted by a timer (one per period) and a byte counter (one per
 * byte_counter_bytes sent): while both counts are below F, fast recovery
 * Rc = (Rt + Rc) / 2; once one passes F, additive increase Rt += R_AI first;
 * once both do, hyper increase Rt += i x R_HAI; then Rc = (Rt + Rc) / 2.
 * All times are real (nominal x time scale) and rates real (nominal / k).
 *
 * State in s->algo: [0] target rate, [1] alpha (x 2^20), [2] last alpha
 * update, [3] last timer tick, [4] bytes since the last byte-counter stage,
 * [5] timer stages, [6] byte stages, [7] last CNP time.
 */
#include "cc.h"

#define A_ONE (1ull << 20)
enum { RT, ALPHA, T_ALPHA, T_INC, BYTES, ST_T, ST_B, T_CNP };

static void clamp(struct ethp_cc_state *s, const struct ethp_cc_params *pp)
{
    if (s->rate_bps > pp->line_rate_bps)
        s->rate_bps = pp->line_rate_bps;
    if (s->rate_bps < pp->min_rate_bps)
        s->rate_bps = pp->min_rate_bps;
    if (s->algo[RT] > pp->line_rate_bps)
        s->algo[RT] = pp->line_rate_bps;
}

static void dcqcn_init(struct ethp_cc_state *s, const struct ethp_cc_params *pp)
{
    *s = (struct ethp_cc_state){.cwnd_bytes = pp->max_cwnd_bytes, .rate_bps = pp->line_rate_bps};
    s->algo[RT] = pp->line_rate_bps;
    s->algo[ALPHA] = A_ONE;
}

static void dcqcn_on_ack(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                         uint64_t acked, uint64_t rtt_ns, int ecn, uint64_t now)
{
    (void)s, (void)pp, (void)acked, (void)rtt_ns, (void)ecn, (void)now; /* CNPs drive it */
}

static void dcqcn_on_loss(struct ethp_cc_state *s, const struct ethp_cc_params *pp, uint64_t now)
{
    (void)s, (void)pp, (void)now; /* go-back-N recovers; DCQCN reacts to CNPs only */
}

static int dcqcn_on_cnp(struct ethp_cc_state *s, const struct ethp_cc_params *pp, uint64_t now)
{
    uint64_t a = s->algo[ALPHA];
    s->algo[RT] = s->rate_bps;
    s->rate_bps = (uint64_t)((double)s->rate_bps * (1.0 - (double)a / (2.0 * A_ONE)));
    s->algo[ALPHA] = a - a / pp->g_inv + A_ONE / pp->g_inv;
    s->algo[T_ALPHA] = s->algo[T_INC] = s->algo[T_CNP] = now;
    s->algo[BYTES] = s->algo[ST_T] = s->algo[ST_B] = 0;
    s->last_decrease_ns = now;
    clamp(s, pp);
    return 1;
}

static void increase(struct ethp_cc_state *s, const struct ethp_cc_params *pp)
{
    uint64_t t = s->algo[ST_T], b = s->algo[ST_B];
    if (t > pp->f && b > pp->f) {
        uint64_t i = (t < b ? t : b) - pp->f;
        s->algo[RT] += i * pp->rhai_bps;
    } else if (t > pp->f || b > pp->f) {
        s->algo[RT] += pp->rai_bps;
    }
    s->rate_bps = (s->algo[RT] + s->rate_bps) / 2;
    clamp(s, pp);
}

static void dcqcn_on_tick(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                          uint64_t now, uint64_t sent)
{
    if (!s->algo[T_ALPHA]) { /* the first tick starts the clocks */
        s->algo[T_ALPHA] = s->algo[T_INC] = now;
        return;
    }
    while (now - s->algo[T_ALPHA] >= pp->timer_ns) { /* alpha decays without CNPs */
        s->algo[ALPHA] -= s->algo[ALPHA] / pp->g_inv;
        s->algo[T_ALPHA] += pp->timer_ns;
    }
    if (s->rate_bps >= pp->line_rate_bps && s->algo[RT] >= pp->line_rate_bps) {
        s->algo[T_INC] = now; /* at line rate: nothing to recover */
        s->algo[BYTES] = 0;
        return;
    }
    while (now - s->algo[T_INC] >= pp->timer_ns) {
        s->algo[T_INC] += pp->timer_ns;
        s->algo[ST_T]++;
        increase(s, pp);
    }
    s->algo[BYTES] += sent;
    while (s->algo[BYTES] >= pp->byte_counter_bytes) {
        s->algo[BYTES] -= pp->byte_counter_bytes;
        s->algo[ST_B]++;
        increase(s, pp);
    }
}

/* The time scale moved: the current and target rates are real rates, so
 * they scale; alpha, the stages and the timers' phases carry over. */
static void dcqcn_on_rescale(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                             double ratio)
{
    s->rate_bps = (uint64_t)((double)s->rate_bps / ratio);
    s->algo[RT] = (uint64_t)((double)s->algo[RT] / ratio);
    clamp(s, pp);
}

const struct ethp_cc_ops ethp_cc_dcqcn = {
    .name = "dcqcn",
    .init = dcqcn_init,
    .on_ack = dcqcn_on_ack,
    .on_nack = dcqcn_on_loss,
    .on_timeout = dcqcn_on_loss,
    .on_cnp = dcqcn_on_cnp,
    .on_tick = dcqcn_on_tick,
    .on_rescale = dcqcn_on_rescale,
};
