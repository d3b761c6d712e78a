/* agg.c - in-network aggregation: the all-reduce engine of a switch.
 *
 * SwitchML's and SHARP's scheme, for one aggregation point per chunk.  The
 * members of a group cut their buffer into chunks of one packet and send
 * each to an aggregator; chunk psn of a group takes slot psn mod window
 * there.  The slot adds up the members' payloads (element-wise, in the
 * chunk's type and operator: a group's calls may differ, a chunk's members
 * may not) in arrival order, remembers who has
 * contributed, and when the last member's part is in, the switch sends the
 * result to every member.  A member reuses a slot (psn + window) only once it
 * has that slot's result, so the aggregator keeps just the previous result
 * of each slot beside the current one: enough to answer any member that
 * lost its copy and sends its contribution again.
 *
 * Only groups the control plane registered (ethp_agg_register: its member
 * list and its job's slot quota) are aggregated: a member's return address
 * is the list's, never a frame's, and a contribution must come from the
 * member's own address (which the switches' source guard vouches for), so
 * a node cannot redirect results, start groups or squat slots.
 *
 * Slot memory is taken when a group first needs it, up to its quota, and
 * kept by the group until a group that needs slots finds the switch full.
 * Then a group whose registration the control plane withdrew (its job is
 * over) gives its slots up at once.  A registered group is never taken from
 * while its job may still need it: a member that lost a result resends its
 * part and finds the slot's state (the other members, who have the result,
 * do not resend theirs), so a group emptied under a live job would hang it.
 * Only a registered group silent for AGG_ORPHAN_NS (far past any member's
 * retry budget: its control plane died without withdrawing it) is taken.
 *
 * Trees (SHARP's): an aggregator the control plane told to (ethp_agg_join)
 * is an inner node of the group's tree.  When its members' parts of a
 * chunk are in, it sends the partial result up to its parent, as one member
 * there, and waits; the parent's result comes back down (ethp_agg_down) and
 * goes to its members.  A member that resends a chunk still waiting makes
 * it send the partial up again (the parent counts it once, or answers with
 * the result).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "ethp_int.h"

#define AGG_MAX_GROUPS 64
#define AGG_MAX_UPLINKS 256
#define AGG_MAX_REGS 256
#define AGG_ORPHAN_NS 600000000000ull
#define AGG_SEEN_WORDS (ETHP_AGG_MAX_MEMBERS / 64)

struct agg_slot {
    uint32_t psn, prev_psn;
    uint32_t count;
    uint32_t offset, prev_offset;
    uint16_t len, prev_len;
    uint8_t used, complete, has_prev;
    uint8_t dtype, op; /* the chunk's (one call's): calls of a group may differ */
    uint8_t up_sent; /* an inner node: the partial went up, the result is awaited */
    uint8_t *acc;  /* 2 x payload cap: a float32 accumulator for 16-bit types */
    uint8_t *res;  /* the current chunk's result, once complete */
    uint8_t *prev; /* the previous chunk's result */
    uint64_t seen[AGG_SEEN_WORDS];
    struct agg_slot *next_free;
};

/* Where an inner node of a tree sends a group's partial results. */
struct agg_uplink {
    uint32_t group, parent_id, parent_index, parent_members;
    uint8_t live;
};

/* A group as the control plane registered it. */
struct agg_reg {
    uint32_t group, members, quota;
    uint8_t live;
    struct ethp_agg_member *member;
};

struct agg_group {
    uint32_t id, members, window;
    uint32_t quota, held; /* slots it may hold, and holds */
    uint8_t live;
    struct agg_uplink up; /* up.live: an inner node of this group's tree */
    uint64_t touched_ns;
    struct ethp_agg_member *member;
    struct agg_slot **slot; /* window entries, NULL until first used */
};

struct ethp_agg {
    uint32_t n_slots, payload_cap;
    uint32_t n_taken; /* slots ever allocated */
    struct agg_slot *free_list;
    struct agg_group groups[AGG_MAX_GROUPS];
    struct agg_group *last; /* the group of the previous frame */
    pthread_mutex_t lock;   /* uplinks: written by the control thread */
    struct agg_uplink uplinks[AGG_MAX_UPLINKS];
    uint32_t next_uplink;
    struct agg_reg regs[AGG_MAX_REGS]; /* also under lock */
};

struct ethp_agg *ethp_agg_new(uint32_t slots, uint32_t payload_cap_bytes)
{
    struct ethp_agg *a = calloc(1, sizeof(*a));
    if (a) {
        a->n_slots = slots;
        a->payload_cap = payload_cap_bytes;
        pthread_mutex_init(&a->lock, NULL);
    }
    return a;
}

int ethp_agg_join(struct ethp_agg *a, uint32_t group, uint32_t parent_id, uint32_t parent_index,
                  uint32_t parent_members)
{
    if (parent_id >= ETHP_AGG_MAX_IDS || !parent_members ||
        parent_members > ETHP_AGG_MAX_MEMBERS || parent_index >= parent_members)
        return -1;
    pthread_mutex_lock(&a->lock);
    struct agg_uplink *u = NULL;
    for (int i = 0; i < AGG_MAX_UPLINKS && !u; i++)
        if (a->uplinks[i].live && a->uplinks[i].group == group)
            u = &a->uplinks[i];
    if (!u) /* the oldest entry makes room */
        u = &a->uplinks[a->next_uplink++ % AGG_MAX_UPLINKS];
    *u = (struct agg_uplink){.group = group, .parent_id = parent_id,
                             .parent_index = parent_index, .parent_members = parent_members,
                             .live = 1};
    pthread_mutex_unlock(&a->lock);
    return 0;
}

int ethp_agg_leave(struct ethp_agg *a, uint32_t group)
{
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < AGG_MAX_UPLINKS; i++)
        if (a->uplinks[i].live && a->uplinks[i].group == group)
            a->uplinks[i].live = 0;
    pthread_mutex_unlock(&a->lock);
    return 0;
}

int ethp_agg_register(struct ethp_agg *a, uint32_t group, const uint32_t *ips,
                      const uint32_t *eps, uint32_t n_members, uint32_t quota_slots)
{
    if (!n_members || n_members > ETHP_AGG_MAX_MEMBERS || !quota_slots)
        return -EINVAL;
    struct ethp_agg_member *m = calloc(n_members, sizeof(*m));
    if (!m)
        return -ENOMEM;
    for (uint32_t i = 0; i < n_members; i++) {
        if (eps[i] > 0xffff) {
            free(m);
            return -EINVAL;
        }
        m[i] = (struct ethp_agg_member){.ip = ips[i], .ep = (uint16_t)eps[i]};
    }
    pthread_mutex_lock(&a->lock);
    struct agg_reg *r = NULL;
    for (int i = 0; i < AGG_MAX_REGS && !r; i++)
        if (a->regs[i].live && a->regs[i].group == group)
            r = &a->regs[i];
    for (int i = 0; i < AGG_MAX_REGS && !r; i++)
        if (!a->regs[i].live)
            r = &a->regs[i];
    int rc = r ? 0 : -ENOSPC;
    if (r) {
        free(r->member);
        *r = (struct agg_reg){.group = group, .members = n_members, .quota = quota_slots,
                              .live = 1, .member = m};
    }
    pthread_mutex_unlock(&a->lock);
    if (rc)
        free(m);
    return rc;
}

int ethp_agg_unregister(struct ethp_agg *a, uint32_t group)
{
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < AGG_MAX_REGS; i++)
        if (a->regs[i].live && a->regs[i].group == group) {
            free(a->regs[i].member);
            a->regs[i] = (struct agg_reg){0};
        }
    pthread_mutex_unlock(&a->lock);
    return 0;
}

/* A copy of a registered group's member list (its quota in *quota), or
 * NULL if the group is not registered with that many members.  Nothing is
 * allocated for a group nobody registered: a node throwing frames at new
 * group ids costs the switch one table scan each. */
static struct ethp_agg_member *registered(struct ethp_agg *a, uint32_t group, uint32_t members,
                                          uint32_t *quota)
{
    struct ethp_agg_member *copy = NULL;
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < AGG_MAX_REGS && !copy; i++) {
        const struct agg_reg *r = &a->regs[i];
        if (r->live && r->group == group && r->members == members) {
            copy = malloc(members * sizeof(*copy));
            if (copy) {
                memcpy(copy, r->member, members * sizeof(*copy));
                *quota = r->quota;
            }
        }
    }
    pthread_mutex_unlock(&a->lock);
    return copy;
}

static struct agg_uplink uplink_of(struct ethp_agg *a, uint32_t group)
{
    struct agg_uplink found = {0};
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < AGG_MAX_UPLINKS; i++)
        if (a->uplinks[i].live && a->uplinks[i].group == group)
            found = a->uplinks[i];
    pthread_mutex_unlock(&a->lock);
    return found;
}

static void slot_free(struct agg_slot *s)
{
    free(s->acc);
    free(s->res);
    free(s->prev);
    free(s);
}

static void group_release(struct ethp_agg *a, struct agg_group *g)
{
    for (uint32_t i = 0; g->slot && i < g->window; i++)
        if (g->slot[i]) {
            g->slot[i]->next_free = a->free_list;
            a->free_list = g->slot[i];
        }
    free(g->slot);
    free(g->member);
    memset(g, 0, sizeof(*g));
    if (a->last == g)
        a->last = NULL;
}

void ethp_agg_free(struct ethp_agg *a)
{
    if (!a)
        return;
    for (int i = 0; i < AGG_MAX_GROUPS; i++)
        if (a->groups[i].live)
            group_release(a, &a->groups[i]);
    while (a->free_list) {
        struct agg_slot *s = a->free_list;
        a->free_list = s->next_free;
        slot_free(s);
    }
    for (int i = 0; i < AGG_MAX_REGS; i++)
        free(a->regs[i].member);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

static int is_registered(struct ethp_agg *a, uint32_t group)
{
    int found = 0;
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < AGG_MAX_REGS && !found; i++)
        found = a->regs[i].live && a->regs[i].group == group;
    pthread_mutex_unlock(&a->lock);
    return found;
}

/* The group to take slots from when the switch is full, or NULL: one whose
 * job is over (not registered any more), else one silent for AGG_ORPHAN_NS;
 * the least recently heard of them. */
static struct agg_group *spent_group(struct ethp_agg *a, uint64_t now)
{
    struct agg_group *best = NULL;
    int best_over = 0;
    for (int i = 0; i < AGG_MAX_GROUPS; i++) {
        struct agg_group *g = &a->groups[i];
        if (!g->live)
            continue;
        int over = !is_registered(a, g->id);
        if (!over && now - g->touched_ns < AGG_ORPHAN_NS)
            continue;
        if (!best || over > best_over ||
            (over == best_over && g->touched_ns < best->touched_ns)) {
            best = g;
            best_over = over;
        }
    }
    return best;
}

/* The live group id, or NULL (the previous frame's group first). */
static struct agg_group *find_group(struct ethp_agg *a, uint32_t id)
{
    if (a->last && a->last->live && a->last->id == id)
        return a->last;
    for (int i = 0; i < AGG_MAX_GROUPS; i++)
        if (a->groups[i].live && a->groups[i].id == id)
            return a->last = &a->groups[i];
    return NULL;
}

/* Is the frame from member index as the control plane listed it: its
 * endpoint (compact form) or its address (UDP form)?  The switches' source
 * guard makes a host's frames carry its own. */
static int from_member(const struct ethp_parsed *ps, const struct ethp_agg_member *m)
{
    return ps->kind == ETHP_KIND_ETHP_COMPACT ? ps->hdr.src_ep == m->ep
                                              : ps->addr.src_ip == m->ip;
}

/* The live group of a contribution from member index, made from its
 * registration on its first contribution; NULL and *action if it is not
 * registered, the frame is not from that member (checked before anything
 * of the frame is believed), or its fields are not the group's. */
static struct agg_group *group_of(struct ethp_agg *a, const struct ethp_parsed *ps,
                                  uint32_t members, uint32_t index, uint32_t window,
                                  uint64_t now, int *action)
{
    uint32_t id = ps->hdr.msg_id;
    struct agg_group *g = find_group(a, id);
    struct agg_group *empty = NULL;
    for (int i = 0; !g && !empty && i < AGG_MAX_GROUPS; i++)
        if (!a->groups[i].live)
            empty = &a->groups[i];
    if (g) {
        if (g->members != members || !from_member(ps, &g->member[index])) {
            *action = ETHP_AGG_FOREIGN;
            return NULL;
        }
        if (g->window != window) {
            *action = ETHP_AGG_BAD;
            return NULL;
        }
    } else {
        uint32_t quota = 0;
        struct ethp_agg_member *member = registered(a, id, members, &quota);
        if (!member || !from_member(ps, &member[index])) {
            free(member);
            *action = ETHP_AGG_FOREIGN; /* (or out of memory: the member resends) */
            return NULL;
        }
        if (!empty) {
            empty = spent_group(a, now);
            if (!empty) {
                free(member);
                *action = ETHP_AGG_FULL;
                return NULL;
            }
            group_release(a, empty);
        }
        g = empty;
        g->slot = calloc(window, sizeof(*g->slot));
        if (!g->slot) {
            free(member);
            memset(g, 0, sizeof(*g));
            *action = ETHP_AGG_FULL;
            return NULL;
        }
        *g = (struct agg_group){.id = id, .members = members, .window = window,
                                .live = 1, .member = member, .slot = g->slot,
                                .quota = quota, .up = uplink_of(a, id)};
    }
    g->touched_ns = now;
    a->last = g;
    return g;
}

static struct agg_slot *slot_take(struct ethp_agg *a, uint64_t now)
{
    struct agg_slot *s = a->free_list;
    if (!s && a->n_taken >= a->n_slots) {
        struct agg_group *g = spent_group(a, now);
        if (g) {
            group_release(a, g);
            s = a->free_list;
        }
    }
    if (s) {
        a->free_list = s->next_free;
    } else if (a->n_taken < a->n_slots) {
        s = calloc(1, sizeof(*s));
        if (s) {
            s->acc = malloc(2 * (size_t)a->payload_cap);
            s->res = malloc(a->payload_cap);
            s->prev = malloc(a->payload_cap);
            if (!s->acc || !s->res || !s->prev) {
                slot_free(s);
                return NULL;
            }
            a->n_taken++;
        }
    }
    if (s) {
        uint8_t *acc = s->acc, *res = s->res, *prev = s->prev;
        memset(s, 0, sizeof(*s));
        s->acc = acc;
        s->res = res;
        s->prev = prev;
    }
    return s;
}

/* ---------------------------------------------------------------- arithmetic
 * One loop per type and operator, over aligned copies, so that the compiler
 * vectorises them: a switch thread adds a 4 KiB chunk in well under a
 * microsecond.  16-bit types accumulate in float32 and are rounded once, at
 * the end (as hardware with wider accumulators does). */

#define AGG_HOT __attribute__((optimize("O3")))
#define AGG_MAX_ELEMS (9216 / 2)

static AGG_HOT void widen_bf16(float *out, const uint16_t *in, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)in[i] << 16;
        memcpy(&out[i], &u, 4);
    }
}

static AGG_HOT void narrow_bf16(uint16_t *out, const float *in, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4);
        u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even, as reference.py */
        out[i] = (uint16_t)(u >> 16);
    }
}

/* float16 <-> float32: the same loops, built with F16C (used when the CPU
 * has it) and without (a library call per element). */
#define AGG_CONVERT(name, attrs, T_OUT, T_IN)                                    \
    static AGG_HOT attrs void name(T_OUT *o, const T_IN *x, uint32_t n)          \
    {                                                                            \
        for (uint32_t i = 0; i < n; i++)                                         \
            o[i] = (T_OUT)x[i];                                                  \
    }
#define AGG_F16C __attribute__((target("f16c")))
AGG_CONVERT(widen_f16_hw, AGG_F16C, float, _Float16)
AGG_CONVERT(widen_f16_sw, , float, _Float16)
AGG_CONVERT(narrow_f16_hw, AGG_F16C, _Float16, float)
AGG_CONVERT(narrow_f16_sw, , _Float16, float)
#undef AGG_CONVERT
#undef AGG_F16C

static int have_f16c(void)
{
    static int known = -1;
    if (known < 0)
        known = __builtin_cpu_supports("f16c") ? 1 : 0;
    return known;
}

#define AGG_LOOP(T, d, x, n, op)                                                   \
    do {                                                                           \
        if ((op) == ETHP_AGG_MAX)                                                  \
            for (uint32_t i = 0; i < (n); i++)                                     \
                (d)[i] = (d)[i] > (x)[i] || (d)[i] != (d)[i] ? (d)[i] : (x)[i];   \
        else if ((op) == ETHP_AGG_MIN)                                             \
            for (uint32_t i = 0; i < (n); i++)                                     \
                (d)[i] = (d)[i] < (x)[i] || (d)[i] != (d)[i] ? (d)[i] : (x)[i];   \
        else                                                                       \
            for (uint32_t i = 0; i < (n); i++)                                     \
                (d)[i] = (T)((d)[i] + (x)[i]);                                     \
    } while (0)

/* acc = in (first) or acc (op) in, over n elements.  The accumulator is
 * int32 for int32 and float32 for every floating type.  (NaN wins a max or
 * min, as numpy's maximum and minimum.) */
static AGG_HOT void combine(uint8_t *acc, const uint8_t *in, uint32_t n, int dtype, int op,
                            int first)
{
    union {
        float f[AGG_MAX_ELEMS];
        int32_t i[AGG_MAX_ELEMS];
        uint16_t h[AGG_MAX_ELEMS];
        _Float16 e[AGG_MAX_ELEMS];
    } x, w;
    float *dst_f = first ? (float *)acc : w.f;
    if (dtype == ETHP_AGG_I32 || dtype == ETHP_AGG_F32) {
        if (first) {
            memcpy(acc, in, 4 * (size_t)n);
            return;
        }
        memcpy(x.f, in, 4 * (size_t)n);
        if (dtype == ETHP_AGG_I32) {
            uint32_t *d = (uint32_t *)acc; /* unsigned: wraps, as numpy's int32 */
            if (op == ETHP_AGG_SUM) {
                const uint32_t *u = (const uint32_t *)x.i;
                for (uint32_t i = 0; i < n; i++)
                    d[i] += u[i];
            } else {
                int32_t *s = (int32_t *)acc;
                AGG_LOOP(int32_t, s, x.i, n, op);
            }
        } else {
            float *d = (float *)acc;
            AGG_LOOP(float, d, x.f, n, op);
        }
        return;
    }
    memcpy(x.h, in, 2 * (size_t)n);
    if (dtype == ETHP_AGG_BF16)
        widen_bf16(dst_f, x.h, n);
    else if (have_f16c())
        widen_f16_hw(dst_f, x.e, n);
    else
        widen_f16_sw(dst_f, x.e, n);
    if (!first) {
        float *d = (float *)acc;
        AGG_LOOP(float, d, w.f, n, op);
    }
}
#undef AGG_LOOP

/* The accumulator in the group's own type. */
static void finish(uint8_t *out, const uint8_t *acc, uint32_t n, int dtype)
{
    union {
        uint16_t h[AGG_MAX_ELEMS];
        _Float16 e[AGG_MAX_ELEMS];
    } r;
    if (dtype == ETHP_AGG_I32 || dtype == ETHP_AGG_F32) {
        memcpy(out, acc, 4 * (size_t)n);
        return;
    }
    if (dtype == ETHP_AGG_BF16)
        narrow_bf16(r.h, (const float *)acc, n);
    else if (have_f16c())
        narrow_f16_hw(r.e, (const float *)acc, n);
    else
        narrow_f16_sw(r.e, (const float *)acc, n);
    memcpy(out, r.h, 2 * (size_t)n);
}


int ethp_reduce_into(uint8_t *dst, const uint8_t *src, uint64_t count, uint32_t dtype,
                     uint32_t op)
{
    if (op > ETHP_AGG_MIN || dtype > ETHP_AGG_I64)
        return -EINVAL;
    if (dtype == ETHP_AGG_I64) {
        for (uint64_t i = 0; i < count; i++) {
            int64_t a, b;
            memcpy(&a, dst + 8 * i, 8);
            memcpy(&b, src + 8 * i, 8);
            int64_t r = op == ETHP_AGG_SUM   ? (int64_t)((uint64_t)a + (uint64_t)b) /* wraps */
                        : op == ETHP_AGG_MAX ? (a > b ? a : b)
                                             : (a < b ? a : b);
            memcpy(dst + 8 * i, &r, 8);
        }
        return 0;
    }
    if (dtype == ETHP_AGG_F16 && op != ETHP_AGG_SUM) {
        /* numpy's float16 maximum and minimum keep the first on a tie
         * (+0 against -0), unlike its float32 ones */
        for (uint64_t i = 0; i < count; i++) {
            _Float16 a, b;
            memcpy(&a, dst + 2 * i, 2);
            memcpy(&b, src + 2 * i, 2);
            float fa = (float)a, fb = (float)b;
            int keep = (op == ETHP_AGG_MAX ? fa >= fb : fa <= fb) || fa != fa;
            memcpy(dst + 2 * i, keep ? &a : &b, 2);
        }
        return 0;
    }
    uint32_t item = ethp_agg_elem_bytes(dtype);
    float acc[AGG_MAX_ELEMS];
    for (uint64_t at = 0; at < count;) {
        uint32_t n = count - at < AGG_MAX_ELEMS ? (uint32_t)(count - at) : AGG_MAX_ELEMS;
        uint8_t *d = dst + at * item;
        if (dtype == ETHP_AGG_I32 || dtype == ETHP_AGG_F32) {
            combine(d, src + at * item, n, (int)dtype, (int)op, 0); /* in place */
        } else { /* widen dst, combine src in float32, round back once */
            combine((uint8_t *)acc, d, n, (int)dtype, (int)op, 1);
            combine((uint8_t *)acc, src + at * item, n, (int)dtype, (int)op, 0);
            finish(d, (const uint8_t *)acc, n, (int)dtype);
        }
        at += n;
    }
    return 0;
}

/* ---------------------------------------------------------------- contributions */

/* out (payload, psn, ...) goes up the tree: where, and as which member. */
static int up(const struct agg_group *g, struct ethp_agg_out *out)
{
    out->parent_id = g->up.parent_id;
    out->parent_tag = g->up.parent_members << 16 | g->up.parent_index;
    return ETHP_AGG_UP;
}

int ethp_agg_add(struct ethp_agg *a, const struct ethp_parsed *ps, const uint8_t *payload,
                 uint64_t now, struct ethp_agg_out *out)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    uint32_t members = h->tag >> 16, index = h->tag & 0xffff;
    uint8_t dtype = (uint8_t)(h->ts_ns >> 24), op = (uint8_t)(h->ts_ns >> 16);
    uint32_t window = h->ts_ns & 0xffff, len = h->len_bytes;
    if (!members || members > ETHP_AGG_MAX_MEMBERS || index >= members || !window ||
        window > ETHP_AGG_MAX_WINDOW || dtype > ETHP_AGG_BF16 || op > ETHP_AGG_MIN || !len ||
        len > a->payload_cap || len / ethp_agg_elem_bytes(dtype) > AGG_MAX_ELEMS ||
        len % ethp_agg_elem_bytes(dtype) || ps->payload_bytes != len || (h->flags & ETHP_F_TRIMMED))
        return ETHP_AGG_BAD;
    int action = ETHP_AGG_ABSORBED;
    struct agg_group *g = group_of(a, ps, members, index, window, now, &action);
    if (!g)
        return action;
    g->member[index].ev = h->entropy;
    uint32_t idx = h->psn % window;
    struct agg_slot *s = g->slot[idx];
    if (!s) {
        if (g->held >= g->quota)
            return ETHP_AGG_FULL; /* its job's share is taken */
        s = g->slot[idx] = slot_take(a, now);
        if (!s)
            return ETHP_AGG_FULL;
        g->held++;
    }
    *out = (struct ethp_agg_out){.group = g->id, .word = h->ts_ns, .members = members,
                                 .member = g->member, .to = index, .psn = h->psn};
    if (s->used && h->psn != s->psn) {
        int32_t ahead = (int32_t)(h->psn - s->psn);
        if (ahead < 0) {
            if (s->has_prev && h->psn == s->prev_psn) {
                out->again = 1;
                out->payload = s->prev;
                out->len_bytes = s->prev_len;
                out->offset_bytes = s->prev_offset;
                return ETHP_AGG_REPLY;
            }
            return ETHP_AGG_STALE;
        }
        /* The slot's next chunk: every member has this one's result (or an
         * unfinished one was abandoned by a group that started over). */
        if (s->complete) {
            uint8_t *t = s->prev;
            s->prev = s->res;
            s->res = t;
            s->prev_psn = s->psn;
            s->prev_len = s->len;
            s->prev_offset = s->offset;
            s->has_prev = 1;
        }
        s->used = 0;
    }
    if (!s->used) {
        s->used = 1;
        s->complete = 0;
        s->up_sent = 0;
        s->count = 0;
        s->psn = h->psn;
        s->len = (uint16_t)len;
        s->offset = h->offset_bytes;
        s->dtype = dtype;
        s->op = op;
        memset(s->seen, 0, sizeof(s->seen));
    } else if (len != s->len || dtype != s->dtype || op != s->op) {
        return ETHP_AGG_BAD; /* the members disagree on the chunk */
    }
    uint64_t bit = 1ull << (index % 64);
    out->payload = s->res;
    out->len_bytes = s->len;
    out->offset_bytes = s->offset;
    if (s->seen[index / 64] & bit) {
        out->again = 1;
        if (s->complete)
            return ETHP_AGG_REPLY;
        return s->up_sent ? up(g, out) : ETHP_AGG_DUP;
    }
    s->seen[index / 64] |= bit;
    combine(s->acc, payload, len / ethp_agg_elem_bytes(dtype), dtype, op, s->count == 0);
    if (++s->count < members)
        return ETHP_AGG_ABSORBED;
    finish(s->res, s->acc, len / ethp_agg_elem_bytes(dtype), dtype);
    if (g->up.live) {
        s->up_sent = 1;
        return up(g, out);
    }
    s->complete = 1;
    return ETHP_AGG_COMPLETE;
}

int ethp_agg_down(struct ethp_agg *a, const struct ethp_parsed *ps, const uint8_t *payload,
                  uint64_t now, struct ethp_agg_out *out)
{
    const struct ethp_hdr_fields *h = &ps->hdr;
    struct agg_group *g = find_group(a, h->msg_id);
    if (!g || !g->up.live)
        return ETHP_AGG_STALE;
    if (h->src_ep != ETHP_AGG_EP_BASE + g->up.parent_id ||
        (ps->kind != ETHP_KIND_ETHP_COMPACT && ps->addr.src_ip != ETHP_AGG_NET + g->up.parent_id))
        return ETHP_AGG_FOREIGN; /* only the parent answers */
    if (h->flags & ETHP_F_TRIMMED)
        return ETHP_AGG_BAD;
    g->touched_ns = now;
    struct agg_slot *s = g->slot[h->psn % g->window];
    if (!s || !s->used || s->psn != h->psn || !s->up_sent)
        return ETHP_AGG_STALE;
    if (s->complete)
        return ETHP_AGG_DUP;
    if (h->len_bytes != s->len || ps->payload_bytes != s->len)
        return ETHP_AGG_BAD;
    memcpy(s->res, payload, s->len);
    s->complete = 1;
    *out = (struct ethp_agg_out){.payload = s->res, .len_bytes = s->len, .psn = s->psn,
                                 .offset_bytes = s->offset, .group = g->id, .word = h->ts_ns,
                                 .members = g->members, .member = g->member};
    return ETHP_AGG_COMPLETE;
}
