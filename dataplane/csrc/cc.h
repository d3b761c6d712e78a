/* cc.h - the congestion-control interface of the NIC (private to the core).
 *
 * An algorithm is a set of callbacks over one window's state, one file per
 * algorithm (cc_nscc.c, cc_dcqcn.c, cc_hpcc.c).  The engine calls them per plane towards each peer; the state is
 * opaque to it except for cwnd_bytes, the window it enforces.
 */
#ifndef ETHP_CC_H
#define ETHP_CC_H

#include <stdint.h>

#include "ethp.h"

struct ethp_cc_params {
    uint64_t mss_bytes;
    uint64_t max_cwnd_bytes;   /* this window's share of 1.5 x BDP */
    uint64_t base_rtt_ns;      /* real */
    /* rate-based algorithms (DCQCN) */
    uint64_t line_rate_bps;    /* real */
    uint64_t timer_ns, byte_counter_bytes, g_inv, rai_bps, rhai_bps, min_rate_bps;
    uint32_t f;
};

struct ethp_cc_state {
    uint64_t cwnd_bytes;
    uint64_t rate_bps; /* a rate-based algorithm's sending rate; 0: window only */
    uint64_t rtt_ns; /* last sample */
    uint64_t rtt_epoch_ns, acked_epoch_bytes, acked_last_rtt_bytes, last_decrease_ns;
    uint64_t algo[24]; /* the algorithm's own (an algorithm may lay a struct over it) */
};

struct ethp_cc_ops {
    const char *name;
    void (*init)(struct ethp_cc_state *s, const struct ethp_cc_params *pp);
    /* acked_bytes newly acknowledged on this window; the RTT sample and ECN
     * echo belong to it when ecn_here says so */
    void (*on_ack)(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                   uint64_t acked_bytes, uint64_t rtt_ns, int ecn, uint64_t now_ns);
    /* a packet of this window was trimmed (NACK) or inferred lost */
    void (*on_nack)(struct ethp_cc_state *s, const struct ethp_cc_params *pp, uint64_t now_ns);
    void (*on_timeout)(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                       uint64_t now_ns);
    /* rate-based only (NULL otherwise): a congestion notification arrived;
     * and the clock, with the bytes sent since the last call (timers and
     * byte counter).  on_cnp returns 1 if it cut the rate. */
    int (*on_cnp)(struct ethp_cc_state *s, const struct ethp_cc_params *pp, uint64_t now_ns);
    void (*on_tick)(struct ethp_cc_state *s, const struct ethp_cc_params *pp, uint64_t now_ns,
                    uint64_t sent_bytes);
    /* INT-driven only (NULL otherwise): an ack echoed the n_hops INT records
     * of the data packet that drew it, which this window sent at sent_ts_ns
     * (the sender's clock, mod 2^32). */
    void (*on_int)(struct ethp_cc_state *s, const struct ethp_cc_params *pp,
                   const struct ethp_int_hop *hops, uint32_t n_hops, uint32_t sent_ts_ns,
                   uint64_t now_ns);
    /* The lab's time scale moved by ratio (new k / old k); pp is already at
     * the new k.  NULL: rate_bps divided by ratio, the window clamped. */
    void (*on_rescale)(struct ethp_cc_state *s, const struct ethp_cc_params *pp, double ratio);
};

extern const struct ethp_cc_ops ethp_cc_nscc;
extern const struct ethp_cc_ops ethp_cc_dcqcn;
extern const struct ethp_cc_ops ethp_cc_hpcc;

#endif
