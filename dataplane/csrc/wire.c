/* wire.c - build and parse Ethernet / IPv4 / UDP / ETH+ frames. */
#include <arpa/inet.h>
#include <stddef.h>

#include "ethp_int.h"

uint32_t ethp_abi_version(void) { return ETHP_ABI_VERSION; }

uint16_t ethp_inet_csum(const uint8_t *data, size_t len)
{
    uint64_t sum = 0;
    size_t i = 0;
    for (; i + 1 < len; i += 2)
        sum += (uint32_t)data[i] << 8 | data[i + 1];
    if (i < len)
        sum += (uint32_t)data[i] << 8;
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return htons((uint16_t)~sum);
}

uint32_t ethp_wire_bytes(uint32_t frame_bytes)
{
    uint32_t with_fcs = frame_bytes + 4;
    if (with_fcs < 64)
        with_fcs = 64;
    return with_fcs + 8 + 12; /* preamble + SFD, inter-frame gap */
}

static void put_eth(uint8_t *out, const struct ethp_l2l3 *a, uint16_t ethertype)
{
    struct ethp_wire_eth *e = (struct ethp_wire_eth *)out;
    memcpy(e->dst, a->dst_mac, 6);
    memcpy(e->src, a->src_mac, 6);
    e->ethertype = htons(ethertype);
}

static void put_hdr(uint8_t *out, const struct ethp_hdr_fields *h)
{
    struct ethp_wire_hdr *w = (struct ethp_wire_hdr *)out;
    w->ver_op = (uint8_t)(ETHP_VERSION << 4 | (h->opcode & 0x0f));
    w->flags = h->flags;
    w->entropy = htons(h->entropy);
    w->src_ep = htons(h->src_ep);
    w->dst_ep = htons(h->dst_ep);
    w->msg_id = htonl(h->msg_id);
    w->psn = htonl(h->psn);
    w->offset = htonl(h->offset_bytes);
    w->tag = htonl(h->tag);
    w->len = htons(h->len_bytes);
    w->tos = h->tos;
    w->hops = h->hops;
    w->ts_ns = htonl(h->ts_ns);
    w->src_epoch = htonl(h->src_epoch);
    w->dst_epoch = htonl(h->dst_epoch);
}

static void get_hdr(const uint8_t *in, struct ethp_hdr_fields *h)
{
    const struct ethp_wire_hdr *w = (const struct ethp_wire_hdr *)in;
    h->opcode = w->ver_op & 0x0f;
    h->flags = w->flags;
    h->entropy = ntohs(w->entropy);
    h->src_ep = ntohs(w->src_ep);
    h->dst_ep = ntohs(w->dst_ep);
    h->msg_id = ntohl(w->msg_id);
    h->psn = ntohl(w->psn);
    h->offset_bytes = ntohl(w->offset);
    h->tag = ntohl(w->tag);
    h->len_bytes = ntohs(w->len);
    h->tos = w->tos;
    h->hops = w->hops;
    h->ts_ns = ntohl(w->ts_ns);
    h->src_epoch = ntohl(w->src_epoch);
    h->dst_epoch = ntohl(w->dst_epoch);
}

/* Bytes between the ETH+ header and the payload. */
static size_t int_bytes(const struct ethp_hdr_fields *h)
{
    return (h->flags & ETHP_F_INT) ? ETHP_INT_BYTES : 0;
}

/* An empty INT block, for the switches on the way to fill. */
static void put_int(uint8_t *out, const struct ethp_hdr_fields *h)
{
    if (!int_bytes(h))
        return;
    memset(out, 0, ETHP_INT_BYTES);
    ((struct ethp_wire_int *)out)->max_hops = ETHP_INT_MAX_HOPS;
}

uint32_t ethp_int_decode(const uint8_t *frame, uint32_t int_off, struct ethp_int_hop *hops)
{
    const struct ethp_wire_int *b = (const struct ethp_wire_int *)(frame + int_off);
    uint32_t n = b->n_hops < ETHP_INT_MAX_HOPS ? b->n_hops : ETHP_INT_MAX_HOPS;
    for (uint32_t i = 0; i < n; i++) {
        const struct ethp_wire_int_hop *w = &b->hop[i];
        hops[i] = (struct ethp_int_hop){
            .port_id = ntohs(w->port_id),
            .qlen_64b = ntohs(w->qlen_64b),
            .ts_ns = ntohl(w->ts_ns),
            .tx_bytes = ntohl(w->tx_bytes),
            .rate_kbps = ntohl(w->rate_kbps),
        };
    }
    return n;
}

static int check_build(size_t cap, size_t hdrs, size_t payload_bytes,
                       const uint8_t *payload)
{
    if (payload_bytes && !payload)
        return ETHP_ERR_ARG;
    if (hdrs + payload_bytes > ETHP_MAX_FRAME_BYTES || payload_bytes > 0xffff)
        return ETHP_ERR_OVERSIZE;
    if (hdrs + payload_bytes > cap)
        return ETHP_ERR_NOSPACE;
    return 0;
}

int ethp_build_udp(uint8_t *out, size_t cap, const struct ethp_l2l3 *a,
                   const struct ethp_hdr_fields *h, const uint8_t *payload,
                   size_t payload_bytes)
{
    const size_t hdrs = ETHP_ETH_HDR_BYTES + ETHP_IPV4_HDR_BYTES + ETHP_UDP_HDR_BYTES +
                        ETHP_HDR_BYTES + int_bytes(h);
    int rc = check_build(cap, hdrs, payload_bytes, payload);
    if (rc)
        return rc;
    put_eth(out, a, ETHP_ETHERTYPE_IPV4);

    struct ethp_wire_ipv4 *ip = (struct ethp_wire_ipv4 *)(out + ETHP_ETH_HDR_BYTES);
    size_t ip_len = hdrs - ETHP_ETH_HDR_BYTES + payload_bytes;
    ip->ver_ihl = 0x45;
    ip->tos = a->tos;
    ip->total_len = htons((uint16_t)ip_len);
    ip->id = htons(a->ip_id);
    ip->frag = htons(0x4000); /* DF */
    ip->ttl = a->ttl ? a->ttl : 64;
    ip->proto = 17;
    ip->csum = 0;
    ip->src = htonl(a->src_ip);
    ip->dst = htonl(a->dst_ip);
    ip->csum = ethp_inet_csum((const uint8_t *)ip, ETHP_IPV4_HDR_BYTES);

    struct ethp_wire_udp *udp = (struct ethp_wire_udp *)((uint8_t *)ip + ETHP_IPV4_HDR_BYTES);
    udp->src_port = htons(a->src_port);
    udp->dst_port = htons(a->dst_port ? a->dst_port : ETHP_UDP_PORT);
    udp->len = htons((uint16_t)(ip_len - ETHP_IPV4_HDR_BYTES));
    udp->csum = 0; /* optional in IPv4; the ETH+ payload is not checksummed */

    put_hdr((uint8_t *)udp + ETHP_UDP_HDR_BYTES, h);
    put_int((uint8_t *)udp + ETHP_UDP_HDR_BYTES + ETHP_HDR_BYTES, h);
    if (payload_bytes)
        memcpy(out + hdrs, payload, payload_bytes);
    return (int)(hdrs + payload_bytes);
}

int ethp_build_compact(uint8_t *out, size_t cap, const struct ethp_l2l3 *a,
                       const struct ethp_hdr_fields *h, const uint8_t *payload,
                       size_t payload_bytes)
{
    const size_t hdrs = ETHP_ETH_HDR_BYTES + ETHP_HDR_BYTES + int_bytes(h);
    int rc = check_build(cap, hdrs, payload_bytes, payload);
    if (rc)
        return rc;
    put_eth(out, a, ETHP_ETHERTYPE_COMPACT);
    put_hdr(out + ETHP_ETH_HDR_BYTES, h);
    put_int(out + ETHP_ETH_HDR_BYTES + ETHP_HDR_BYTES, h);
    if (payload_bytes)
        memcpy(out + hdrs, payload, payload_bytes);
    return (int)(hdrs + payload_bytes);
}

static int parse_ethp(const uint8_t *frame, size_t end, size_t off, struct ethp_parsed *p)
{
    if (end < off + ETHP_HDR_BYTES)
        return ETHP_ERR_TRUNCATED;
    if (frame[off] >> 4 != ETHP_VERSION)
        return ETHP_ERR_VERSION;
    get_hdr(frame + off, &p->hdr);
    p->hdr_off = (uint16_t)off;
    size_t hdrs = ETHP_HDR_BYTES + int_bytes(&p->hdr);
    if (end < off + hdrs)
        return ETHP_ERR_TRUNCATED;
    if (hdrs > ETHP_HDR_BYTES)
        p->int_off = (uint16_t)(off + ETHP_HDR_BYTES);
    p->payload_off = (uint16_t)(off + hdrs);
    p->payload_bytes = (uint16_t)(end - off - hdrs);
    /* A trimmed packet carries less than len_bytes; an intact one exactly that. */
    if (p->payload_bytes > p->hdr.len_bytes)
        return ETHP_ERR_OVERSIZE;
    if (!(p->hdr.flags & ETHP_F_TRIMMED) && p->payload_bytes != p->hdr.len_bytes)
        return ETHP_ERR_TRUNCATED;
    return 0;
}

int ethp_parse(const uint8_t *frame, size_t len, struct ethp_parsed *p)
{
    memset(p, 0, sizeof(*p));
    if (len < ETHP_ETH_HDR_BYTES)
        return p->kind = ETHP_ERR_TRUNCATED;
    if (len > ETHP_MAX_FRAME_BYTES)
        return p->kind = ETHP_ERR_OVERSIZE;
    const struct ethp_wire_eth *e = (const struct ethp_wire_eth *)frame;
    memcpy(p->addr.dst_mac, e->dst, 6);
    memcpy(p->addr.src_mac, e->src, 6);
    p->ethertype = ntohs(e->ethertype);
    p->l3_off = ETHP_ETH_HDR_BYTES;
    int rc;

    switch (p->ethertype) {
    case ETHP_ETHERTYPE_COMPACT:
        rc = parse_ethp(frame, len, ETHP_ETH_HDR_BYTES, p);
        if (rc)
            return p->kind = rc;
        p->ecn = p->hdr.tos & 3;
        return p->kind = ETHP_KIND_ETHP_COMPACT;
    case ETHP_ETHERTYPE_MACCTL:
        return p->kind = ETHP_KIND_MACCTL;
    case ETHP_ETHERTYPE_IPV4:
        break;
    default:
        return p->kind = ETHP_KIND_OTHER;
    }

    if (len < ETHP_ETH_HDR_BYTES + ETHP_IPV4_HDR_BYTES)
        return p->kind = ETHP_ERR_TRUNCATED;
    const struct ethp_wire_ipv4 *ip = (const struct ethp_wire_ipv4 *)(frame + ETHP_ETH_HDR_BYTES);
    size_t ihl = (size_t)(ip->ver_ihl & 0x0f) * 4;
    size_t total = ntohs(ip->total_len);
    if (ip->ver_ihl >> 4 != 4 || ihl < ETHP_IPV4_HDR_BYTES || total < ihl)
        return p->kind = ETHP_ERR_IPV4;
    if (ETHP_ETH_HDR_BYTES + ihl > len || ETHP_ETH_HDR_BYTES + total > len)
        return p->kind = ETHP_ERR_TRUNCATED;
    if (ethp_inet_csum((const uint8_t *)ip, ihl) != 0)
        return p->kind = ETHP_ERR_CSUM;
    size_t end = ETHP_ETH_HDR_BYTES + total; /* ignore Ethernet padding */
    p->addr.tos = ip->tos;
    p->addr.ttl = ip->ttl;
    p->addr.ip_id = ntohs(ip->id);
    p->addr.src_ip = ntohl(ip->src);
    p->addr.dst_ip = ntohl(ip->dst);
    p->ip_proto = ip->proto;
    p->ecn = ip->tos & 3;
    p->l4_off = (uint16_t)(ETHP_ETH_HDR_BYTES + ihl);
    p->payload_off = p->l4_off;
    p->payload_bytes = (uint16_t)(end - p->l4_off);
    int first_fragment = (ntohs(ip->frag) & 0x1fff) == 0;
    if ((ip->proto != 17 && ip->proto != 6) || !first_fragment)
        return p->kind = ETHP_KIND_IPV4;
    if (end < p->l4_off + 4u)
        return p->kind = ETHP_ERR_TRUNCATED;
    const uint16_t *ports = (const uint16_t *)(frame + p->l4_off);
    p->addr.src_port = ntohs(ports[0]);
    p->addr.dst_port = ntohs(ports[1]);
    int roce = p->addr.dst_port == ETHP_ROCE_UDP_PORT;
    if (ip->proto != 17 || (p->addr.dst_port != ETHP_UDP_PORT && !roce))
        return p->kind = ETHP_KIND_IPV4;
    if (end < p->l4_off + (size_t)ETHP_UDP_HDR_BYTES)
        return p->kind = ETHP_ERR_TRUNCATED;
    rc = parse_ethp(frame, end, p->l4_off + ETHP_UDP_HDR_BYTES, p);
    if (rc)
        return p->kind = roce ? ETHP_KIND_IPV4 : rc; /* to a switch, any UDP flow */
    return p->kind = roce ? ETHP_KIND_ROCE_UDP : ETHP_KIND_ETHP_UDP;
}

int ethp_build_pfc(uint8_t *out, size_t cap, const uint8_t *src_mac, uint8_t class_mask,
                   uint16_t quanta)
{
    /* 802.1Qbb: to 01:80:c2:00:00:01, MAC control, opcode 0x0101, class
     * enable vector, eight 16-bit quanta (unit: 512 bit times); padded to 60. */
    static const uint8_t dst[6] = {0x01, 0x80, 0xc2, 0x00, 0x00, 0x01};
    const size_t len = 60;
    if (cap < len)
        return ETHP_ERR_NOSPACE;
    memset(out, 0, len);
    memcpy(out, dst, 6);
    memcpy(out + 6, src_mac, 6);
    out[12] = 0x88;
    out[13] = 0x08;
    out[14] = 0x01;
    out[15] = 0x01;
    out[16] = 0;
    out[17] = class_mask;
    for (int c = 0; c < 8; c++) {
        if (class_mask & (1u << c)) {
            out[18 + 2 * c] = (uint8_t)(quanta >> 8);
            out[19 + 2 * c] = (uint8_t)quanta;
        }
    }
    return (int)len;
}
