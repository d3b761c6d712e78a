/* nic_int.h - private to the NIC engine: its state and the interfaces
 * between its parts (docs/architecture.md, "The NIC engine by role").
 *
 *   nic.c          the engine: its thread and loop, frames in (who sent
 *                  them, epochs), timers, the time scale, the API
 *   nic_ethp.c     the ETH+ mode: spraying, SACK/RACK-like loss detection,
 *                  NACKs for trimmed packets (struct nic_mode_ops)
 *   nic_roce.c     the emulated RoCEv2 mode: queue pairs, go-back-N, CNPs
 *   nic_tx.c       what both modes' senders share: the window, sending and
 *                  resending a packet, plane failure, RNR, timeouts
 *   nic_rx.c       what both modes' receivers share: binding a message to a
 *                  posted receive, placing payloads, the eager buffer
 *   nic_credits.c  receiver credits (RCCC): a receiver's grants, a sender's
 *                  share of them
 *   nic_inc.c      the in-network all-reduce member
 *   nic_base.c     frames out (emit, addresses, control frames), the ports'
 *                  pacers, completions
 *
 * Calls go down this list only (nic.c calls a mode through its ops); no two
 * files call each other. */
#ifndef NIC_INT_H
#define NIC_INT_H

#include <pthread.h>

#include "cc.h"
#include "ethp_int.h"

struct nic_mode_ops;

#define NIC_WIN 16384u  /* packets in flight per peer; power of two */
#define NIC_RWIN 16384u /* receive bitmap window */
#define NIC_DUPTHRESH 3u
#define NIC_ACK_EVERY 8u
/* An engine that placed a data packet or got an ack within this many base
 * RTTs (twice the longest RNR backoff, the longest a sender told "not
 * ready" waits before it asks again) is busy: see nic_on_rnr. */
#define NIC_BUSY_RTTS 128u
#define NIC_BURST 64
#define NIC_SACK_BITS 64u
#define NIC_EVFD_TAG 1u
#define NIC_RING_TAG 0u
#define NIC_CATCHUP_NS 2000000ull
#define NIC_LATE_NS 100000ull /* as the switch's late_frames */
/* lateness over base RTT / this counts in the lab's union of stalls (at
 * the floor k of erack-8x4 about 0.2 ms real; see fidelity.ANY_BEHIND_MAX) */
#define NIC_STALL_RTT_DIV 100
/* a frame still unread this long after it came in (more than the RX ring's
 * block timer, a jiffy or two of up to 10 ms, and its timer's slack) means
 * the engine was not running: the rest of its wait counts in the union */
#define NIC_RX_STALL_NS 20000000ull
#define NIC_CLOCK_POLL_NS 50000000ull /* an idle engine's look at the clock */
#define NIC_EAGER_BYTES 64u /* a message this small may come before its receive */
#define NIC_EAGER_SLOTS 8u  /* ... this many per peer */
#define NIC_LOOKAHEAD_NS 20000ull /* a pacer wakes the engine this early */

enum { PKT_FREE = 0, PKT_INFLIGHT, PKT_ACKED, PKT_LOST };

struct nic_msg {
    int64_t handle; /* 0: a schedule's op (freed with its schedule's end) */
    uint32_t slot;  /* its handle's slot in n->slots */
    int released;   /* its caller will not wait on it again (ethp_nic_release) */
    int reaping;    /* on n->reap */
    uint64_t seq;   /* the order it was bound to its peer in */
    uint32_t peer, tag, msg_id;
    uint8_t *buf;
    uint64_t len;
    uint64_t done_bytes; /* recv: placed; send: acknowledged */
    uint64_t total;      /* recv: known once the last packet came */
    /* recv: where its packets may land (nic_rx.c, nic_fits): the PSN of
     * its first packet (packets carry consecutive PSNs, so a packet's PSN
     * gives its offset), the last packet's offset, and the end of the
     * furthest other packet placed */
    uint32_t psn_base;
    int psn_known;
    uint64_t last_off, end_bytes;
    uint64_t next_off;   /* send: next byte to packetize */
    int status;
    int is_send, bound, queued;
    int inc;                 /* an in-network all-reduce: dtype and op below */
    uint8_t dtype, op;
    struct nic_msg *next;
    /* a schedule the engine runs (nic_sched.c): its own handle (role
     * NIC_SCHED_WHOLE, posted as a command), or one of its ops (sched_idx) */
    struct nic_sched *sched;
    uint32_t sched_role, sched_idx;
    int sched_finished; /* counted by its schedule once (a receive may complete twice) */
    /* on the engine's list of finished schedule messages (an op), on
     * n->reap (a caller's), or on n->orphans */
    struct nic_msg *done_next;
};

enum { NIC_SCHED_NONE = 0, NIC_SCHED_WHOLE, NIC_SCHED_OP };

/* A caller's handle is (gen << 32) | (slot index + 1): a handle released
 * (or freed) and its slot reused answers ETHP_NIC_ERR_NO_SUCH, never the
 * new message. */
struct nic_slot {
    struct nic_msg *m; /* NULL: free (next_free links the free ones) */
    uint32_t gen;      /* 1 .. 2^31 - 1 */
    uint32_t next_free;
};

struct tx_pkt {
    struct nic_msg *m;
    uint64_t sent_ns;
    uint64_t nacked_ns; /* when a NACK declared it lost, or 0 */
    uint32_t off;
    uint16_t len;
    uint8_t state;
    uint8_t plane;
    uint16_t ev;
    uint8_t last, retx;
    uint8_t sub; /* the congestion-control sub-flow: the plane (ethplus) or the QP (roce) */
};

/* One plane towards one peer: a sub-flow with its own window (a slow or
 * congested plane must not throttle the others). */
struct nic_cc {
    struct ethp_cc_state st;
    uint64_t inflight;
    uint64_t next_tx_ns; /* its rate pacer, when the algorithm sets a rate (st.rate_bps) */
    uint64_t sent_bytes; /* since the last rate tick (DCQCN's byte counter) */
};

/* roce: one queue pair towards a peer */
struct nic_qp {
    uint32_t rcv_nxt;     /* recv: the next PSN expected on this QP */
    int nak_sent;         /* recv: a NAK for rcv_nxt is out */
    uint64_t last_cnp_ns; /* recv */
    uint16_t ev;          /* send: fixed entropy (UDP source port), plane in the low bits */
};

struct nic_peer {
    uint32_t ep;
    uint32_t ip[ETHP_NIC_MAX_PLANES];
    int active; /* on the engine's active list */
    int asleep; /* on its sleeping list instead (nic_sleep), at sleep_idx */
    uint32_t sleep_idx;
    /* send */
    struct tx_pkt *win;
    uint32_t snd_una, snd_nxt, high_sack;
    int have_sack;
    struct nic_msg *sq_head, *sq_tail;
    uint32_t msg_id_next;
    uint64_t inflight_bytes;    /* all planes */
    struct nic_cc cc[ETHP_NIC_MAX_PLANES]; /* one window per plane (a sub-flow) */
    uint64_t rto_ns, rto_deadline;
    uint32_t timeouts;
    uint32_t n_lost;
    uint64_t retx_due_ns; /* when a lost packet pump() passed over may go */
    uint64_t reo_ns; /* reordering window of the loss detector (RACK-like) */
    uint64_t rnr_until; /* the peer said "not ready": resend after this */
    uint64_t rnr_backoff_ns;
    uint64_t rnr_since_ns; /* the first "not ready" since the last progress (0: none) */
    /* rccc: what the receiver lets us have in flight (all planes), and its
     * share per plane; UINT64_MAX per plane without receiver credits */
    uint64_t credit_bytes, credit_sub_bytes;
    /* recv */
    uint32_t rcv_nxt;
    uint8_t *rbits;
    struct nic_msg *rq_head, *rq_tail; /* posted, not yet bound */
    struct nic_msg *bound[64];
    int ack_pending, ce_seen, dup_seen;
    uint32_t last_psn; /* the newest data PSN placed */
    uint32_t ack_count, ts_echo;
    uint16_t ev_echo;
    int int_have;                    /* hpcc: int_echo holds the newest packet's INT block */
    uint8_t int_echo[ETHP_INT_BYTES];
    /* recv: whole messages of at most NIC_EAGER_BYTES that came before a
     * receive for their tag was posted, kept (in order) for the next one:
     * the always-posted buffer a NIC keeps for control messages (NCCL's
     * clear-to-send FIFO), so that a rendezvous' "ready" to a rank not yet
     * in the collective is not turned away (RoCE would go back N for it) */
    struct {
        uint32_t tag;
        uint32_t len;
        uint8_t data[NIC_EAGER_BYTES];
    } eager[NIC_EAGER_SLOTS];
    uint32_t n_eager;
    struct nic_qp qp[ETHP_NIC_MAX_PLANES]; /* roce */
    uint32_t qp_ack_mask;                  /* roce: QPs owing a cumulative ack */
    uint32_t rx_open; /* recv: messages from it under way (bound, not complete) */
    uint32_t epoch;    /* its incarnation as last heard (0: never heard from it) */
    uint64_t hello_ns; /* when we last told it ours (at most one a base RTT) */
    uint64_t c[ETHP_NIC_NCOUNTERS];
};

struct nic_port {
    int ifindex;
    uint8_t mac[6], gw_mac[6];
    uint32_t ip;
    uint64_t next_tx_ns, paused_until;
    uint64_t avoid_until; /* marked, trimmed or lost here lately (adaptive); failed (both) */
    uint32_t fails;       /* loss events in a row (at most one per base RTT) */
    uint64_t fail_counted_ns;
    int up;
    struct ethp_pkt *txq[NIC_BURST];
    uint32_t ntx;
};

/* In-network all-reduce: one aggregator (a switch) and the chunks in flight
 * there.  Chunk sequence numbers (psn) run on across calls, so a slot there
 * is reused only once its last chunk's result is in. */
struct inc_agg {
    uint32_t id, plane;
    uint32_t group, members, index; /* this stream's group, and our place in it there */
    uint32_t una_psn, next_psn; /* results missing for [una, next) */
    uint32_t resend_psn;        /* after a timeout: resend from here up to next */
    uint64_t next_chunk;        /* the running call's next chunk for this aggregator */
    uint64_t *chunk;            /* window entries: chunk index + 1 while its result is out */
    uint64_t deadline_ns, rto_ns;
    uint32_t timeouts;
};

struct nic_inc {
    uint32_t window, n_aggs;
    struct inc_agg agg[ETHP_NIC_MAX_PLANES];
    struct nic_msg *head, *tail; /* posted calls; the head is running */
    uint32_t elem_bytes, chunk_bytes;
    uint64_t n_chunks, done_chunks;
};

struct ethp_nic {
    struct ethp_nic_cfg cfg;
    struct nic_inc inc;
    const struct ethp_cc_ops *cc;
    const struct nic_mode_ops *mode; /* ETH+ or RoCE */
    int credits;         /* rccc: windows capped by the receivers' grants */
    uint32_t epoch;      /* this endpoint's incarnation, in every frame it sends */
    uint64_t bdp_bytes;  /* of all planes: rate x planes x base RTT */
    uint32_t data_bytes; /* payload per data packet */
    struct ethp_nic_io io; /* its frames in and out: a port, or an in-memory fabric */
    struct ethp_pool *pool;
    int epfd, evfd, udp_fd;
    struct nic_port ports[ETHP_NIC_MAX_PLANES];
    uint32_t n_ports;
    /* Peers by endpoint.  ethp_nic_add_peer records one (peer_known
     * NIC_PEER_KNOWN, its addresses in peer_ips); its state in peers is
     * made on first use, by the engine's thread (nic_peer_of: then
     * NIC_PEER_MADE, and on the made list): a 512-rank job's rank talks to
     * a few peers in a ring or in-network all-reduce, and the untouched
     * entries (6.7 KB each, and a 2 KiB receive bitmap) are never mapped.
     * Nothing reads an entry before it is made (a read maps the zero page,
     * and the first write then copies it and flushes every CPU's TLB), and
     * whatever visits every peer's state walks the made list only. */
    struct nic_peer *peers;
    uint8_t *peer_known;
    uint32_t *peer_ips; /* max_peers x ETHP_NIC_MAX_PLANES */
    uint32_t n_known;
    uint32_t *made; /* the peers made, in the order they were */
    uint32_t n_made; /* written by the engine's thread (release), read by any */
    uint64_t first_credit_bytes; /* rccc: a new peer's credit until its first grant */
    uint32_t max_peers;
    /* Peers with something to send, to resend, to ack or a timer running:
     * the loop and the wake-up deadline look at these only. */
    uint32_t *active;
    uint32_t n_active;
    /* Busy peers that wait only for a frame from their peer or their
     * retransmit timer (everything sent, nothing to resend or ack): passes
     * leave them alone, a frame from the peer, a new message or the
     * earliest of their deadlines (sleep_due, never later than it) wakes
     * them.  A 512-rank all-to-all keeps 511 peers busy per rank for a
     * round trip, and every pass visited all of them. */
    uint32_t *sleeping;
    uint32_t n_sleeping;
    uint64_t sleep_due;
    uint32_t rr; /* which active peer is served first on the next pass */
    uint64_t rng;
    pthread_t thread;
    int started, stop;
    struct ethp_nic_group *group; /* its loop runs in the group's thread (or NULL: its own) */
    int group_ready;              /* the group's thread: its epoll set had events */
    uint64_t prev_pass_ns;        /* the loop's previous pass over it */
    /* posted from other threads */
    pthread_mutex_t lock;
    pthread_cond_t done;
    struct nic_msg *cmd_head, *cmd_tail;
    struct nic_msg *sched_done_head, *sched_done_tail; /* engine thread only */
    /* the callers' handles: a slot each (its index and generation make the
     * handle), reused once the message is freed */
    struct nic_slot *slots;
    uint32_t n_slots, cap_slots, free_slot; /* free_slot: index + 1 of a free slot, or 0 */
    struct nic_msg *reap; /* released by their caller and finished: freed by the engine */
    uint64_t held;        /* messages with a slot (posted and not yet freed) */
    uint64_t bind_seq;       /* engine thread only: the last message's seq */
    struct nic_msg *orphans; /* ops that outlived their schedule (bound, failed): freed at close */
    uint64_t c[ETHP_NIC_NCOUNTERS];
    /* nic_rx_busy: the work count (packets placed, acks received) when it
     * last changed, and when that was seen */
    uint64_t busy_work, busy_seen_ns;
    /* the lab's fabric clock: cfg is cfg0 at the clock's k (nic_rescale) */
    struct ethp_clock *clock;
    uint64_t clock_gen, ring_drops_reported, ring_drops_read_ns;
    uint64_t ahead_ns; /* port_ahead_ns at cfg's rate (set_ahead) */
    struct ethp_nic_cfg cfg0;
};

/* A transport mode: what the ETH+ and the RoCE engines do differently. */
struct nic_mode_ops {
    const char *name;
    uint16_t udp_port;   /* its frames' UDP destination port */
    uint8_t data_flags;  /* on every data packet (ETHP_F_TRIMMABLE: a switch may trim it) */
    uint8_t fails_planes; /* a plane that keeps losing is taken out (RoCE's QPs keep theirs) */
    /* congestion-control sub-flows per peer (p->cc): planes, or queue pairs */
    uint32_t (*subs)(const struct ethp_nic *n);
    /* 1: a frame of this mode; 0: not (the host's own); -1: to this mode's
     * port, but no valid header (malformed) */
    int (*takes)(int kind, const struct ethp_parsed *ps);
    void (*add_peer)(struct ethp_nic *n, struct nic_peer *p); /* may be NULL */
    void (*fresh)(struct ethp_nic *n, struct nic_peer *p);    /* may be NULL */
    /* a data packet's entropy value (the plane in its low 4 bits) */
    uint16_t (*data_ev)(struct ethp_nic *n, struct nic_peer *p, uint32_t psn, uint32_t plane);
    void (*pump)(struct ethp_nic *n, struct nic_peer *p, uint64_t now);
    /* when p's next packet can go (UINT64_MAX: not before a frame comes) */
    uint64_t (*due)(struct ethp_nic *n, struct nic_peer *p, uint64_t now);
    void (*tick)(struct ethp_nic *n, struct nic_peer *p, uint64_t now); /* may be NULL */
    void (*send_ack)(struct ethp_nic *n, struct nic_peer *p);
    void (*on_data)(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                    const uint8_t *payload, uint64_t now);
    void (*on_ack)(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                   const uint8_t *payload, uint64_t now);
    void (*on_nack)(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                    uint64_t now);
    /* the peer turned psn away (receiver not ready): what goes again */
    void (*refused)(struct ethp_nic *n, struct nic_peer *p, uint32_t psn);
};
extern const struct nic_mode_ops nic_mode_ethplus, nic_mode_roce;

static inline uint32_t nic_subs(const struct ethp_nic *n) { return n->mode->subs(n); }

static inline void nic_count(struct ethp_nic *n, struct nic_peer *p, int c, uint64_t v)
{
    n->c[c] += v;
    if (p)
        p->c[c] += v;
}

static inline uint64_t nic_rnd64(struct ethp_nic *n) { return ethp_rng_next(&n->rng); }

void nic_wake(struct ethp_nic *n, struct nic_peer *p);
void nic_wake_all(struct ethp_nic *n);

static inline void nic_activate(struct ethp_nic *n, struct nic_peer *p)
{
    if (p->asleep)
        nic_wake(n, p);
    if (!p->active) {
        p->active = 1;
        n->active[n->n_active++] = (uint32_t)(p - n->peers);
    }
}

enum { NIC_PEER_UNKNOWN, NIC_PEER_KNOWN, NIC_PEER_MADE };

/* Whether ep is a peer (its state made or not). */
static inline int nic_peer_known(const struct ethp_nic *n, uint32_t ep)
{
    return ep < n->max_peers && __atomic_load_n(&n->peer_known[ep], __ATOMIC_ACQUIRE);
}

/* A peer's state if it has been made (any thread), else NULL. */
static inline const struct nic_peer *nic_peer_if_made(const struct ethp_nic *n, uint32_t ep)
{
    if (ep >= n->max_peers ||
        __atomic_load_n(&n->peer_known[ep], __ATOMIC_ACQUIRE) != NIC_PEER_MADE)
        return NULL;
    return &n->peers[ep];
}

struct nic_peer *nic_peer_make(struct ethp_nic *n, uint32_t ep);

/* A known peer's state, made now if this is its first use (the engine's
 * thread only; NULL: unknown, or no memory for it). */
static inline struct nic_peer *nic_peer_of(struct ethp_nic *n, uint32_t ep)
{
    if (!nic_peer_known(n, ep))
        return NULL;
    return n->peer_known[ep] == NIC_PEER_MADE ? &n->peers[ep] : nic_peer_make(n, ep);
}

static inline uint64_t nic_ser_ns(const struct ethp_nic *n, uint32_t frame_bytes)
{
    return (uint64_t)ethp_wire_bytes(frame_bytes) * 8000000000ull / n->cfg.rate_bps;
}

/* When a pacer that was due at next_tx_ns lets a packet start, at now: the
 * switch's bounded burst, a late thread may make up NIC_CATCHUP_NS of the
 * time it lost while packets wait; a pacer idle longer earns no credit. */
static inline uint64_t nic_pacer_start(uint64_t next_tx_ns, uint64_t now)
{
    return next_tx_ns + NIC_CATCHUP_NS < now ? now : next_tx_ns;
}

/* SACK-inferred loss waits this long past a packet's send: half a base RTT,
 * at least twice the unscaled part of it (4 ms in a lab: this machine
 * reorders sprayed packets by a few ms, 1 ms ring timers per hop and late
 * thread wake-ups per plane; nothing on the in-memory fabric). */
static inline uint64_t nic_reorder_window_ns(const struct ethp_nic_cfg *c)
{
    uint64_t floor = 2 * c->unscaled_rtt_ns;
    return c->base_rtt_ns / 2 > floor ? c->base_rtt_ns / 2 : floor;
}

static inline int nic_peer_busy(const struct nic_peer *p)
{
    return p->sq_head || p->n_lost || p->snd_una != p->snd_nxt || p->ack_pending ||
           p->rto_deadline;
}

/* How early a pacer lets a packet go (ETHP_AHEAD_WIRE_BYTES): the engine
 * wakes when a packet is due, a lookahead early, and then sends what is
 * due within this (nic_set_ahead: once per rate). */
static inline uint64_t nic_port_ahead_ns(const struct ethp_nic *n) { return n->ahead_ns; }

/* nic_base.c */
void nic_addr_for(struct ethp_nic *n, uint32_t plane, const struct nic_peer *p, uint16_t ev,
                  struct ethp_l2l3 *a);
void nic_addr_to(struct ethp_nic *n, uint32_t plane, uint32_t dst_ip, uint16_t ev,
                 struct ethp_l2l3 *a);
struct ethp_cc_params nic_cc_params(const struct ethp_nic *n);
void nic_complete(struct ethp_nic *n, struct nic_msg *m, int status);
/* m, released and finished, onto n->reap for the engine to free (under n->lock) */
void nic_msg_reap_locked(struct ethp_nic *n, struct nic_msg *m);
int nic_emit(struct ethp_nic *n, uint32_t plane, const struct ethp_l2l3 *a,
             const struct ethp_hdr_fields *h, const uint8_t *payload, uint32_t len,
             const uint8_t *int_block);
void nic_flush_port(struct ethp_nic *n, struct nic_port *pt);
uint64_t nic_free_at(const struct ethp_nic *n, uint32_t plane);
void nic_on_pause(struct ethp_nic *n, const uint8_t *f, uint32_t len, int ifindex,
                  uint64_t now);
int nic_port_free(const struct ethp_nic *n, uint32_t plane, uint64_t now);
void nic_rotation(const struct ethp_nic *n, uint64_t *now, uint32_t *up, uint32_t *live);
void nic_send_ctl(struct ethp_nic *n, struct nic_peer *p, uint8_t op, uint32_t psn,
                  uint32_t aux, uint32_t tag, uint8_t flags, uint32_t ts, uint16_t ev,
                  const uint8_t *body, uint32_t len);
void nic_set_ahead(struct ethp_nic *n);
int nic_plane_failed(const struct nic_port *pt, uint64_t now);

/* nic_credits.c */
uint32_t nic_rx_grant(struct ethp_nic *n);
void nic_rx_open(struct ethp_nic *n, struct nic_peer *p, int delta);
void nic_set_credit(struct ethp_nic *n, struct nic_peer *p, uint64_t credit_bytes);

/* nic_tx.c */
void nic_acked(struct ethp_nic *n, struct nic_peer *p, struct tx_pkt *t, uint64_t *bytes);
void nic_avoid_plane(struct ethp_nic *n, uint32_t plane, uint64_t now);
struct tx_pkt *nic_mark_lost(struct nic_peer *p, uint32_t psn);
void nic_on_cnp(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                uint64_t now);
void nic_on_rnr(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                uint64_t now);
uint32_t nic_pick_plane(struct ethp_nic *n, const struct nic_peer *p, uint32_t psn,
                        int for_send);
void nic_plane_lost(struct ethp_nic *n, uint32_t plane, uint64_t now);
void nic_progress_made(struct ethp_nic *n, struct nic_peer *p, uint64_t now);
int nic_resend(struct ethp_nic *n, struct nic_peer *p, uint32_t psn, uint32_t plane,
               uint32_t sub, uint64_t now);
uint32_t nic_retx_plane(const struct ethp_nic *n, uint32_t old);
void nic_send_new(struct ethp_nic *n, struct nic_peer *p, uint32_t plane, uint32_t sub,
                  uint64_t now);
int nic_sub_free(const struct ethp_nic *n, const struct nic_peer *p, uint32_t sub, uint64_t now);
uint64_t nic_sub_free_at(const struct nic_peer *p, uint32_t sub);
void nic_timers(struct ethp_nic *n, struct nic_peer *p, uint64_t now);

/* nic_rx.c */
int nic_payload_whole(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps);
void nic_place(struct ethp_nic *n, struct nic_peer *p, struct nic_msg *m,
               const struct ethp_parsed *ps, const uint8_t *payload);
int nic_take_eager(struct ethp_nic *n, struct nic_peer *p, struct nic_msg *m);
int nic_rx_busy(struct ethp_nic *n, uint64_t now);
int nic_rx_take(struct ethp_nic *n, struct nic_peer *p, const struct ethp_parsed *ps,
                const uint8_t *payload, uint32_t aux, uint16_t ev, struct nic_msg **m);

/* nic_inc.c */
uint64_t nic_inc_due(const struct ethp_nic *n);
void nic_inc_start(struct ethp_nic *n, struct nic_msg *m);
void nic_inc_timers(struct ethp_nic *n, uint64_t now);
void nic_on_agg_result(struct ethp_nic *n, const struct ethp_parsed *ps, const uint8_t *payload,
                       uint32_t plane, uint64_t now);
void nic_pump_inc(struct ethp_nic *n, uint64_t now);


/* nic_msg.c: messages */
struct tx_pkt *nic_win_alloc(void);
void nic_win_free(struct tx_pkt *w);
int64_t nic_msg_register_locked(struct ethp_nic *n, struct nic_msg *m); /* under n->lock */
struct nic_msg *nic_msg_lookup_locked(struct ethp_nic *n, int64_t handle);
void nic_msg_unslot(struct ethp_nic *n, const struct nic_msg *list);
void nic_bind(struct ethp_nic *n, struct nic_msg *m);

/* nic_sched.c: the schedules the engine runs */
void nic_sched_start(struct ethp_nic *n, struct nic_msg *whole);
void nic_sched_pump(struct ethp_nic *n);
struct nic_sched *nic_sched_new(const struct ethp_sched_op *ops, uint32_t n_ops,
                                const uint32_t *succ, uint32_t n_succ, uint32_t dtype,
                                uint32_t op, int *err);
void nic_sched_free(struct nic_sched *sc);

#endif
