/* nic_credits.c - receiver credits (RCCC-like), beside the congestion
 * control as htsim keeps its pull pacer apart from source and sink: a
 * receiver grants each sender with a message under way a share of its own
 * BDP (every ack and NACK carries it), and a sender keeps what it has in
 * flight within the newest grant, shared over its planes. */
#include "nic_int.h"

/* A message from p got under way here (its first packet bound it to a
 * posted receive), or finished: p is one of this receiver's senders while
 * any is under way.  (One that failed for a too-small buffer stays bound,
 * and counted, as its packets keep coming.) */
void nic_rx_open(struct ethp_nic *n, struct nic_peer *p, int delta)
{
    uint32_t before = p->rx_open;
    p->rx_open += (uint32_t)delta;
    if (!before && p->rx_open)
        n->c[ETHP_NC_rx_senders]++; /* the grants' divisor */
    else if (before && !p->rx_open)
        n->c[ETHP_NC_rx_senders]--;
}

/* The receiver's grant to each of its senders (every ack and NACK carries
 * it): its own BDP over all planes, shared equally among the peers with a
 * message under way, so that an incast keeps about what its downlinks carry
 * in one base RTT in flight towards it, whatever the fan-in, and queues
 * little in the fabric. */
uint32_t nic_rx_grant(struct ethp_nic *n)
{
    uint64_t senders = n->c[ETHP_NC_rx_senders] ? n->c[ETHP_NC_rx_senders] : 1;
    uint64_t g = n->bdp_bytes / senders, floor = (uint64_t)n->cfg.payload_bytes * n->n_ports;
    g = g > floor ? g : floor;
    return g > UINT32_MAX ? UINT32_MAX : (uint32_t)g;
}

/* A sender takes the grant an ack or NACK from p carries, shared over the
 * planes it sends on (a lost plane's share goes to the others). */
void nic_set_credit(struct ethp_nic *n, struct nic_peer *p, uint64_t credit_bytes)
{
    if (!n->credits || !credit_bytes)
        return;
    uint64_t now;
    uint32_t up, live;
    nic_rotation(n, &now, &up, &live);
    uint32_t planes = live ? live : up ? up : 1;
    uint64_t sub = credit_bytes / planes;
    p->credit_bytes = credit_bytes;
    p->credit_sub_bytes = sub > n->cfg.payload_bytes ? sub : n->cfg.payload_bytes;
}
