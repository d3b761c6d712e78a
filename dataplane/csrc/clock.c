/* clock.c - the fabric clock: a shared page holding the time scale.
 *
 * One writer (the fabric), any number of readers (NIC engines, workers,
 * the bench).  A reader never trusts the page blindly: k is checked to be
 * in range, and a read that keeps racing the writer gives up on the last
 * consistent value it saw. */
#include "ethp_int.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CLOCK_MAGIC 0x3230636f6c636874ull /* "thcloc02" (02: late spans kept, not an end) */
#define CLOCK_LATE_SPANS 64
#define CLOCK_PAGE_BYTES 32768
#define K_MAX 1e9

struct clock_page {
    uint64_t magic;
    uint64_t seq; /* odd while the writer is in the middle of a change */
    uint64_t gen;
    uint64_t k_bits; /* the double k */
    uint64_t anchor_real_ns, anchor_nominal_ns;
    uint64_t reports[ETHP_CLOCK_NREPORTS];
    uint64_t engines_attached; /* slots handed out so far (they wrap) */
    /* The union of engines' late spans so far: its latest disjoint spans,
     * in order (older ones folded into the first), under a process-shared
     * robust mutex (a process killed holding it leaves it to the next). */
    pthread_mutex_t late_lock;
    uint32_t n_late;
    uint64_t late_from_ns[CLOCK_LATE_SPANS], late_to_ns[CLOCK_LATE_SPANS];
    /* each engine's own lost and late time (its per-engine reports) */
    uint64_t engine[ETHP_CLOCK_MAX_ENGINES][ETHP_CLOCK_PER_ENGINE];
};

_Static_assert(sizeof(struct clock_page) <= CLOCK_PAGE_BYTES, "clock page too small");

#define CLOCK_PENDING_SPANS 8

struct ethp_clock {
    struct clock_page *pg;
    int engine;        /* counted in ETHP_CLOCK_R_ENGINES */
    uint32_t slot;     /* its row in engine[] */
    /* late spans not in the union yet: its lock was held (never waited for:
     * the holder may be a process stopped mid-report) */
    uint32_t n_pending;
    uint64_t pending_from_ns[CLOCK_PENDING_SPANS], pending_to_ns[CLOCK_PENDING_SPANS];
};

static int k_ok(double k) { return isfinite(k) && k >= 1.0 && k <= K_MAX; }

static double bits_k(uint64_t b)
{
    double k;
    memcpy(&k, &b, sizeof(k));
    return k;
}

static uint64_t k_bits(double k)
{
    uint64_t b;
    memcpy(&b, &k, sizeof(b));
    return b;
}

struct clock_view {
    double k;
    uint64_t gen, anchor_real_ns, anchor_nominal_ns;
};

static struct clock_view clock_read(const struct clock_page *pg)
{
    struct clock_view v = {1.0, 0, 0, 0};
    for (int tries = 0; tries < 1000; tries++) {
        uint64_t s0 = __atomic_load_n(&pg->seq, __ATOMIC_ACQUIRE);
        if (s0 & 1)
            continue;
        struct clock_view t = {
            .k = bits_k(__atomic_load_n(&pg->k_bits, __ATOMIC_RELAXED)),
            .gen = __atomic_load_n(&pg->gen, __ATOMIC_RELAXED),
            .anchor_real_ns = __atomic_load_n(&pg->anchor_real_ns, __ATOMIC_RELAXED),
            .anchor_nominal_ns = __atomic_load_n(&pg->anchor_nominal_ns, __ATOMIC_RELAXED),
        };
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&pg->seq, __ATOMIC_RELAXED) == s0) {
            if (k_ok(t.k))
                v = t;
            return v;
        }
    }
    return v;
}

struct ethp_clock *ethp_clock_map(const char *path, int create, double k, int *err)
{
    if (create && !k_ok(k)) {
        *err = -EINVAL;
        return NULL;
    }
    int fd = create ? open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)
                    : open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        *err = -errno;
        return NULL;
    }
    struct stat st;
    if (create && ftruncate(fd, CLOCK_PAGE_BYTES) < 0)
        goto fail;
    if (fstat(fd, &st) < 0)
        goto fail;
    if (!S_ISREG(st.st_mode) || st.st_size != CLOCK_PAGE_BYTES || st.st_uid != geteuid()) {
        errno = EINVAL;
        goto fail;
    }
    void *m = mmap(NULL, CLOCK_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        goto fail;
    close(fd);
    struct ethp_clock *c = calloc(1, sizeof(*c));
    if (!c) {
        munmap(m, CLOCK_PAGE_BYTES);
        *err = -ENOMEM;
        return NULL;
    }
    c->pg = m;
    if (create) {
        pthread_mutexattr_t a;
        int rc = pthread_mutexattr_init(&a);
        if (!rc)
            rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        if (!rc)
            rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        if (!rc)
            rc = pthread_mutex_init(&c->pg->late_lock, &a);
        pthread_mutexattr_destroy(&a);
        if (rc) {
            ethp_clock_unmap(c);
            *err = -rc;
            return NULL;
        }
        c->pg->k_bits = k_bits(k);
        c->pg->anchor_real_ns = ethp_now_ns();
        c->pg->gen = 1;
        __atomic_store_n(&c->pg->magic, CLOCK_MAGIC, __ATOMIC_RELEASE);
    } else if (__atomic_load_n(&c->pg->magic, __ATOMIC_ACQUIRE) != CLOCK_MAGIC) {
        ethp_clock_unmap(c);
        *err = -EINVAL;
        return NULL;
    }
    return c;
fail:
    *err = -errno;
    close(fd);
    return NULL;
}

void ethp_clock_unmap(struct ethp_clock *c)
{
    if (!c)
        return;
    ethp_clock_flush_late(c);
    if (c->engine)
        __atomic_fetch_sub(&c->pg->reports[ETHP_CLOCK_R_ENGINES], 1, __ATOMIC_RELAXED);
    munmap(c->pg, CLOCK_PAGE_BYTES);
    free(c);
}

static uint64_t nominal_at(const struct clock_view *v, uint64_t real_ns)
{
    if (real_ns <= v->anchor_real_ns)
        return v->anchor_nominal_ns;
    return v->anchor_nominal_ns + (uint64_t)((double)(real_ns - v->anchor_real_ns) / v->k);
}

int ethp_clock_set_k(struct ethp_clock *c, double k)
{
    if (!k_ok(k))
        return -EINVAL;
    struct clock_page *pg = c->pg;
    struct clock_view v = clock_read(pg);
    uint64_t now = ethp_now_ns();
    uint64_t s = __atomic_load_n(&pg->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&pg->seq, s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&pg->anchor_nominal_ns, nominal_at(&v, now), __ATOMIC_RELAXED);
    __atomic_store_n(&pg->anchor_real_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&pg->k_bits, k_bits(k), __ATOMIC_RELAXED);
    __atomic_store_n(&pg->gen, v.gen + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&pg->seq, s + 2, __ATOMIC_RELEASE);
    return 0;
}

double ethp_clock_k(const struct ethp_clock *c) { return clock_read(c->pg).k; }

uint64_t ethp_clock_gen(const struct ethp_clock *c)
{
    return __atomic_load_n(&c->pg->gen, __ATOMIC_ACQUIRE);
}

uint64_t ethp_clock_nominal_ns(const struct ethp_clock *c)
{
    return ethp_clock_nominal_at_ns(c, ethp_now_ns());
}

uint64_t ethp_clock_nominal_at_ns(const struct ethp_clock *c, uint64_t real_ns)
{
    struct clock_view v = clock_read(c->pg);
    return nominal_at(&v, real_ns);
}

void ethp_clock_reports(const struct ethp_clock *c, uint64_t *out)
{
    for (int i = 0; i < ETHP_CLOCK_NREPORTS; i++)
        out[i] = __atomic_load_n(&c->pg->reports[i], __ATOMIC_RELAXED);
}

void ethp_clock_report(struct ethp_clock *c, uint32_t which, uint64_t v)
{
    if (which >= ETHP_CLOCK_NREPORTS || !v)
        return;
    __atomic_fetch_add(&c->pg->reports[which], v, __ATOMIC_RELAXED);
    if (which < ETHP_CLOCK_PER_ENGINE && c->engine)
        __atomic_fetch_add(&c->pg->engine[c->slot][which], v, __ATOMIC_RELAXED);
}

uint32_t ethp_clock_engines(const struct ethp_clock *c, uint32_t which, uint64_t *out, uint32_t n)
{
    if (which >= ETHP_CLOCK_PER_ENGINE)
        return 0;
    uint64_t used = __atomic_load_n(&c->pg->engines_attached, __ATOMIC_RELAXED);
    uint32_t k = used < ETHP_CLOCK_MAX_ENGINES ? (uint32_t)used : ETHP_CLOCK_MAX_ENGINES;
    k = k < n ? k : n;
    for (uint32_t i = 0; i < k; i++)
        out[i] = __atomic_load_n(&c->pg->engine[i][which], __ATOMIC_RELAXED);
    return k;
}

/* An engine attaches: counted until it unmaps. */
void ethp_clock_attach_engine(struct ethp_clock *c)
{
    if (!c->engine) {
        c->engine = 1;
        c->slot = (uint32_t)(__atomic_fetch_add(&c->pg->engines_attached, 1, __ATOMIC_RELAXED) %
                             ETHP_CLOCK_MAX_ENGINES);
        __atomic_fetch_add(&c->pg->reports[ETHP_CLOCK_R_ENGINES], 1, __ATOMIC_RELAXED);
    }
}

/* A span into the union's list (lock held): returns the part of it no
 * span there covered.  Spans overlapping or touching it become one; past
 * CLOCK_LATE_SPANS the two oldest are folded into one (the gap between
 * them then counts as covered: a slight undercount, for a span reported
 * that far out of order). */
static uint64_t late_spans_add(struct clock_page *pg, uint64_t from, uint64_t to)
{
    uint32_t n = pg->n_late, i = 0, j;
    uint64_t lo = from, hi = to, covered = 0;
    while (i < n && pg->late_to_ns[i] < from)
        i++;
    for (j = i; j < n && pg->late_from_ns[j] <= to; j++) {
        uint64_t a = from > pg->late_from_ns[j] ? from : pg->late_from_ns[j];
        uint64_t b = to < pg->late_to_ns[j] ? to : pg->late_to_ns[j];
        covered += b > a ? b - a : 0;
        lo = pg->late_from_ns[j] < lo ? pg->late_from_ns[j] : lo;
        hi = pg->late_to_ns[j] > hi ? pg->late_to_ns[j] : hi;
    }
    /* spans [i, j) become [lo, hi], at i */
    uint32_t tail = n - j, m = n - (j - i) + 1;
    memmove(&pg->late_from_ns[i + 1], &pg->late_from_ns[j], tail * sizeof(uint64_t));
    memmove(&pg->late_to_ns[i + 1], &pg->late_to_ns[j], tail * sizeof(uint64_t));
    pg->late_from_ns[i] = lo;
    pg->late_to_ns[i] = hi;
    if (m > CLOCK_LATE_SPANS - 1) { /* keep one free for the next insertion */
        pg->late_to_ns[0] = pg->late_to_ns[1];
        memmove(&pg->late_from_ns[1], &pg->late_from_ns[2], (m - 2) * sizeof(uint64_t));
        memmove(&pg->late_to_ns[1], &pg->late_to_ns[2], (m - 2) * sizeof(uint64_t));
        m--;
    }
    pg->n_late = m;
    return to - from - covered;
}

/* The list as a process killed mid-change, or a stray write (the page is
 * every engine's to write), left it: kept if whole and in order, else
 * started again (what it held stays counted). */
static void late_spans_repair(struct clock_page *pg)
{
    uint32_t n = pg->n_late;
    int ok = n < CLOCK_LATE_SPANS;
    for (uint32_t i = 0; ok && i < n; i++)
        ok = pg->late_from_ns[i] < pg->late_to_ns[i] &&
             (i == 0 || pg->late_to_ns[i - 1] < pg->late_from_ns[i]);
    if (!ok)
        pg->n_late = 0;
}

/* The union of every engine's late spans: what a span adds is the part no
 * span reported before covers, whatever order they come in (a frozen
 * engine reports its stall when it wakes, after others' later spans).
 * The lock is never waited for: a span that finds it held is kept here
 * and added at the engine's next report or flush. */
void ethp_clock_report_late(struct ethp_clock *c, uint64_t from_ns, uint64_t now_ns)
{
    if (now_ns <= from_ns)
        return;
    uint32_t i = c->n_pending;
    if (i && c->pending_to_ns[i - 1] >= from_ns && c->pending_from_ns[i - 1] <= now_ns) {
        i--; /* overlaps the last one kept: one span */
        c->pending_from_ns[i] = from_ns < c->pending_from_ns[i] ? from_ns : c->pending_from_ns[i];
        c->pending_to_ns[i] = now_ns > c->pending_to_ns[i] ? now_ns : c->pending_to_ns[i];
    } else {
        if (i == CLOCK_PENDING_SPANS) { /* full: the last one stretches */
            i--;
            from_ns = c->pending_from_ns[i] < from_ns ? c->pending_from_ns[i] : from_ns;
        }
        c->pending_from_ns[i] = from_ns;
        c->pending_to_ns[i] = now_ns;
        c->n_pending = i + 1;
    }
    ethp_clock_flush_late(c);
}

void ethp_clock_flush_late(struct ethp_clock *c)
{
    if (!c->n_pending)
        return;
    struct clock_page *pg = c->pg;
    int rc = pthread_mutex_trylock(&pg->late_lock);
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(&pg->late_lock);
    else if (rc)
        return; /* EBUSY: another time */
    late_spans_repair(pg);
    uint64_t added = 0;
    for (uint32_t i = 0; i < c->n_pending; i++)
        added += late_spans_add(pg, c->pending_from_ns[i], c->pending_to_ns[i]);
    c->n_pending = 0;
    pthread_mutex_unlock(&pg->late_lock);
    __atomic_fetch_add(&pg->reports[ETHP_CLOCK_R_ANY_LATE_NS], added, __ATOMIC_RELAXED);
}
