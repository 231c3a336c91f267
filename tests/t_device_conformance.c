/*
 * The device contract (gpu/device.h), written once and run on every backend present: host always,
 * CUDA where a device answers (otherwise skipped with dev_probe's reason). Proves ordering within a
 * stream, ordering across streams through events without blocking the host, real concurrency of
 * streams, the budget and its message, arena coalescing on real memory, poisoning, asynchronous
 * errors surfacing at the next sync, and destroy with work in flight.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/util.h"
#include "gpu/device.h"
#include "tests/helpers/testlib.h"

#define MiB ((size_t)1 << 20)

static strata_backend_kind kind_now;

static device *open_dev(size_t budget, bool poison)
{
    dev_options o = DEV_OPTIONS_INIT;
    o.budget_bytes = budget;
    o.poison_on_free = poison;
    device *d = NULL;
    T_OK(dev_create(kind_now, &o, &d));
    if (!d) {
        fprintf(stderr, "cannot open the device; stopping\n");
        t_done();
        exit(1);
    }
    T_EQ_INT(dev_kind(d), kind_now);
    return d;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------- ordering within a stream */

#define STEPS 200
#define SLOT 64

typedef struct order_ctx {
    unsigned char *out; /* pinned, STEPS * SLOT */
    atomic_int next;    /* the step the next host function must be */
    atomic_int wrong;
} order_ctx;

typedef struct step_arg {
    order_ctx *ctx;
    int step;
} step_arg;

/* Runs after step's memset and D2H copy: both must have landed, and no later step may have. */
static strata_status check_step(void *p)
{
    step_arg *a = p;
    order_ctx *c = a->ctx;
    if (atomic_load(&c->next) != a->step)
        atomic_fetch_add(&c->wrong, 1);
    for (int i = 0; i < SLOT; i++)
        if (c->out[a->step * SLOT + i] != (unsigned char)(a->step * 7 + 1))
            atomic_fetch_add(&c->wrong, 1);
    atomic_fetch_add(&c->next, 1);
    return STRATA_OK;
}

static void test_stream_order(void)
{
    device *d = open_dev(64 * MiB, false);
    dev_stream *s;
    T_OK(dev_stream_create(d, "order", &s));
    static step_arg args[STEPS];
    order_ctx c = {0};
    void *dbuf = NULL;
    T_OK(dev_alloc(d, SLOT, &dbuf));
    T_OK(dev_host_alloc(d, STEPS * SLOT, (void **)&c.out));
    memset(c.out, 0, STEPS * SLOT);
    for (int i = 0; i < STEPS; i++) {
        args[i] = (step_arg){&c, i};
        T_OK(dev_memset_async(s, dbuf, i * 7 + 1, SLOT));
        T_OK(dev_memcpy_async(s, c.out + i * SLOT, dbuf, SLOT));
        T_OK(dev_host_fn(s, check_step, &args[i]));
    }
    T_OK(dev_stream_sync(s));
    T_EQ_INT(atomic_load(&c.next), STEPS);
    T_EQ_INT(atomic_load(&c.wrong), 0);

    /* A chain of device-to-device copies: each must read what the previous one wrote. */
    enum { HOPS = 8 };
    size_t n = 1 * MiB + 4096 + 3;
    unsigned char *src, *dst;
    void *hop[HOPS];
    T_OK(dev_host_alloc(d, n, (void **)&src));
    T_OK(dev_host_alloc(d, n, (void **)&dst));
    t_rand_bytes(src, n);
    memset(dst, 0, n);
    for (int i = 0; i < HOPS; i++)
        T_OK(dev_alloc(d, n, &hop[i]));
    T_OK(dev_memcpy_async(s, hop[0], src, n));
    for (int i = 1; i < HOPS; i++)
        T_OK(dev_memcpy_async(s, hop[i], hop[i - 1], n));
    T_OK(dev_memcpy_async(s, dst, hop[HOPS - 1], n));
    T_OK(dev_stream_sync(s));
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
        if (src[i] != dst[i])
            first = i;
    T_CHECK(first == n, "copy chain: first wrong byte at %zu of %zu", first, n);
    dev_destroy(d); /* frees hops, pinned buffers and the stream it still owns */
}

/* ---------------------------------------------------------------- events across streams */

/* Two streams (the second created, or wrapping the caller's own), two events, pinned src (random) and
 * dst (zero) and a device buffer of n bytes (none when n is 0). dev_destroy(r->d) frees it all. */
typedef struct rig {
    device *d;
    dev_stream *a, *b;
    dev_event *ev, *done_b;
    unsigned char *src, *dst;
    void *buf;
    size_t n;
} rig;

static void rig_open(rig *r, size_t n, bool wrap_b, const char *name_a, const char *name_b)
{
    memset(r, 0, sizeof *r);
    r->d = open_dev(64 * MiB, false);
    r->n = n;
    T_OK(dev_stream_create(r->d, name_a, &r->a));
    T_OK(wrap_b ? dev_stream_wrap(r->d, NULL, name_b, &r->b) : dev_stream_create(r->d, name_b, &r->b));
    T_OK(dev_event_create(r->d, &r->ev));
    T_OK(dev_event_create(r->d, &r->done_b));
    if (n == 0)
        return;
    T_OK(dev_host_alloc(r->d, n, (void **)&r->src));
    T_OK(dev_host_alloc(r->d, n, (void **)&r->dst));
    T_OK(dev_alloc(r->d, n, &r->buf));
    t_rand_bytes(r->src, n);
    memset(r->dst, 0, n);
}

static strata_status slow_fn(void *p)
{
    sleep_ms(*(int *)p);
    return STRATA_OK;
}

/* Stream b waits on an event recorded after slow work and a copy on stream a, then reads the copy.
 * With wrap_b, b is the caller's own stream: how the trainer's compute is ordered after a prefetch
 * (on the host backend, the calling thread itself waits). */
static void test_cross_stream(bool wrap_b)
{
    rig r;
    rig_open(&r, 4 * MiB, wrap_b, "a", wrap_b ? "compute" : "b");
    T_OK(dev_memset_async(r.a, r.buf, 0, r.n));
    T_OK(dev_stream_sync(r.a));
    bool done = false;
    T_OK(dev_event_query(r.ev, &done));
    T_CHECK(done, "a never-recorded event must count as complete");

    static int delay_ms = 150;
    uint64_t t0 = now_ns();
    T_OK(dev_host_fn(r.a, slow_fn, &delay_ms));
    T_OK(dev_memcpy_async(r.a, r.buf, r.src, r.n));
    T_OK(dev_event_record(r.ev, r.a));
    T_OK(dev_stream_wait_event(r.b, r.ev));
    T_OK(dev_memcpy_async(r.b, r.dst, r.buf, r.n));
    T_OK(dev_event_record(r.done_b, r.b));
    if (!wrap_b) {
        double enqueue_ms = (double)(now_ns() - t0) / 1e6;
        T_CHECK(enqueue_ms < delay_ms / 2.0, "queuing the cross-stream wait blocked the host for %.1f ms", enqueue_ms);
        T_OK(dev_event_query(r.ev, &done));
        T_CHECK(!done, "the event reports done while its stream still sleeps (%.1f ms in)", (now_ns() - t0) / 1e6);
    }
    T_OK(dev_event_sync(r.done_b));
    T_OK(dev_event_query(r.ev, &done));
    T_CHECK(done, "stream b finished, so the event it waited on must be done");
    T_CHECK(memcmp(r.dst, r.src, r.n) == 0, "stream b did not see stream a's copy: dst[0] = %#x, src[0] = %#x",
            r.dst[0], r.src[0]);
    double total_ms = (double)(now_ns() - t0) / 1e6;
    T_CHECK(total_ms >= delay_ms * 0.9, "the wait finished after %.1f ms, before the %d ms of work on stream a",
            total_ms, delay_ms);
    if (wrap_b && kind_now == STRATA_BACKEND_HOST) {
        int x;
        dev_stream *bad = NULL;
        T_STATUS(dev_stream_wrap(r.d, &x, "compute", &bad), STRATA_EINVAL);
        T_CONTAINS(strata_last_error(NULL), "the host backend has no native streams");
        T_CHECK(bad == NULL, "out-param set on failure");
    }
    dev_event_destroy(r.ev);
    dev_event_destroy(r.done_b);
    dev_stream_destroy(r.a);
    dev_stream_destroy(r.b); /* a wrapped stream is only forgotten: it stays the caller's */
    dev_destroy(r.d);
}

/* ---------------------------------------------------------------- streams run concurrently */

typedef struct gate {
    atomic_int open;
    atomic_int done;
} gate;

/* Holds its stream until the main thread opens the gate (or 5 s pass). */
static strata_status hold_until_open(void *p)
{
    gate *g = p;
    uint64_t deadline = now_ns() + 5000000000ull;
    while (!atomic_load(&g->open) && now_ns() < deadline)
        sleep_ms(1);
    atomic_store(&g->done, 1);
    return STRATA_OK;
}

/* Stream a is held by a host function; copies on stream b must still finish meanwhile. A backend that
 * ran streams one after the other would finish b only after a's 5 s timeout. */
static void test_concurrency(void)
{
    rig r;
    rig_open(&r, MiB, false, "left", "right");
    T_CHECK((dev_stream_native(r.a) != NULL) == (kind_now == STRATA_BACKEND_CUDA),
            "dev_stream_native is %p on backend %d", dev_stream_native(r.a), (int)kind_now);
    gate g = {0, 0};
    T_OK(dev_host_fn(r.a, hold_until_open, &g));
    T_OK(dev_memcpy_async(r.b, r.buf, r.src, r.n));
    T_OK(dev_memcpy_async(r.b, r.dst, r.buf, r.n));
    T_OK(dev_event_record(r.done_b, r.b));
    uint64_t t0 = now_ns();
    T_OK(dev_event_sync(r.done_b));
    double ms = (double)(now_ns() - t0) / 1e6;
    bool a_still_held = !atomic_load(&g.done);
    atomic_store(&g.open, 1);
    T_OK(dev_stream_sync(r.a));
    T_OK(dev_stream_sync(r.b));
    T_CHECK(a_still_held, "stream b's copies finished only after stream a's held work (%.0f ms): streams are serialised",
            ms);
    T_CHECK(memcmp(r.dst, r.src, r.n) == 0, "stream b's copies are wrong");
    dev_destroy(r.d);
}

/* ---------------------------------------------------------------- memory */

static void test_budget(void)
{
    device *d = open_dev(128 * MiB, false);
    dev_mem_stats st;
    dev_mem_stats_get(d, &st);
    T_EQ_INT(st.budget_bytes, 128 * MiB);
    void *p64 = NULL, *p96 = (void *)1;
    T_OK(dev_alloc(d, 64 * MiB, &p64));
    T_STATUS(dev_alloc(d, 96 * MiB, &p96), STRATA_EBUDGET);
    T_CHECK(p96 == NULL, "out-param not NULL after a failed dev_alloc");
    T_CONTAINS(strata_last_error(NULL), "device budget exceeded: asked 96.00 MiB, free 64.00 MiB of 128.00 MiB "
                                        "(largest free block 64.00 MiB); raise strata.device_budget_bytes");
    T_STATUS(dev_alloc(d, 0, &p96), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "dev_alloc: 0 bytes");
    dev_mem_stats_get(d, &st);
    T_EQ_INT(st.used_bytes, 64 * MiB);
    T_EQ_INT(st.peak_bytes, 64 * MiB);
    T_EQ_INT(st.live_allocs, 1);
    T_OK(dev_free(d, p64));
    dev_mem_stats_get(d, &st);
    T_EQ_INT(st.used_bytes, 0);
    T_EQ_INT(st.peak_bytes, 64 * MiB);
    dev_reset_peak(d);
    dev_mem_stats_get(d, &st);
    T_EQ_INT(st.peak_bytes, 0);
    dev_destroy(d);

    if (kind_now == STRATA_BACKEND_HOST) {
        d = open_dev(0, false);
        dev_mem_stats_get(d, &st);
        T_EQ_INT(st.budget_bytes, DEV_HOST_DEFAULT_BUDGET_BYTES);
        dev_destroy(d);
    }
}

/* Random blocks filled with distinct bytes until the arena refuses; every block must read back its own
 * byte (no overlap on real memory); freeing all in random order leaves one block of the full budget. */
static void test_fragmentation(void)
{
    enum { MAXB = 400 };
    size_t budget = 16 * MiB;
    device *d = open_dev(budget, false);
    dev_stream *s;
    T_OK(dev_stream_create(d, "frag", &s));
    void *blk[MAXB];
    size_t len[MAXB];
    int nb = 0;
    while (nb < MAXB) {
        size_t n = t_rand_range(1, budget / 40);
        void *p = NULL;
        strata_status st = dev_alloc(d, n, &p);
        if (st == STRATA_EBUDGET) {
            if (nb > 4 && t_rand_unit() < 0.3)
                break;
            int i = (int)t_rand_range(0, (size_t)nb - 1); /* free one to fragment further */
            T_OK(dev_free(d, blk[i]));
            blk[i] = blk[--nb];
            len[i] = len[nb];
            continue;
        }
        T_CHECK(st == STRATA_OK, "dev_alloc(%zu): %s", n, strata_last_error(NULL));
        T_CHECK((uintptr_t)p % DEV_ALIGN_BYTES == 0, "dev_alloc returned %p, not %d-aligned", p, DEV_ALIGN_BYTES);
        blk[nb] = p;
        len[nb++] = n;
    }
    for (int i = 0; i < nb; i++)
        T_OK(dev_memset_async(s, blk[i], i % 251, len[i]));
    unsigned char *back;
    T_OK(dev_host_alloc(d, budget, (void **)&back));
    int wrong = 0;
    for (int i = 0; i < nb; i++) {
        T_OK(dev_memcpy_async(s, back, blk[i], len[i]));
        T_OK(dev_stream_sync(s));
        for (size_t j = 0; j < len[i]; j++) {
            if (back[j] != i % 251) {
                wrong++;
                break;
            }
        }
    }
    T_CHECK(wrong == 0, "%d of %d blocks did not keep their own bytes: blocks overlap", wrong, nb);
    while (nb) {
        int i = (int)t_rand_range(0, (size_t)nb - 1);
        T_OK(dev_free(d, blk[i]));
        blk[i] = blk[--nb];
    }
    dev_mem_stats st;
    dev_mem_stats_get(d, &st);
    T_EQ_INT(st.free_blocks, 1);
    T_EQ_INT(st.largest_free_bytes, budget);
    void *all = NULL;
    T_OK(dev_alloc(d, budget, &all));
    T_OK(dev_free(d, all));
    dev_destroy(d);
}

static void test_poison(void)
{
    size_t n = 1 * MiB;
    device *d = open_dev(16 * MiB, true);
    T_CHECK(dev_poisons(d), "poison_on_free was asked for, but the device does not poison");
    dev_stream *s;
    T_OK(dev_stream_create(d, "poison", &s));
    void *buf;
    uint32_t *back;
    T_OK(dev_alloc(d, n, &buf));
    T_OK(dev_host_alloc(d, n, (void **)&back));
    T_OK(dev_memset_async(s, buf, 0x11, n));
    T_OK(dev_stream_sync(s));
    T_OK(dev_free(d, buf));
    /* The memory stays in the arena: reading it back after free shows what a stale user would see. */
    T_OK(dev_memcpy_async(s, back, buf, n));
    T_OK(dev_stream_sync(s));
    size_t not_nan = 0;
    for (size_t i = 0; i < n / 4; i++) {
        float f;
        memcpy(&f, &back[i], sizeof f);
        not_nan += back[i] != DEV_POISON_WORD || !isnan(f);
    }
    T_CHECK(not_nan == 0, "%zu of %zu words of a freed block are not the NaN poison (first: %#x)", not_nan, n / 4,
            back[0]);
    dev_destroy(d);

    /* STRATA_POISON overrides the build default both ways; the option always wins. */
    const char *old = getenv("STRATA_POISON");
    char *saved = old ? strdup(old) : NULL;
    setenv("STRATA_POISON", "0", 1);
    d = open_dev(MiB, false);
    T_CHECK(!dev_poisons(d), "STRATA_POISON=0 did not turn poisoning off");
    dev_destroy(d);
    d = open_dev(MiB, true);
    T_CHECK(dev_poisons(d), "STRATA_POISON=0 overrode poison_on_free");
    dev_destroy(d);
    setenv("STRATA_POISON", "1", 1);
    d = open_dev(MiB, false);
    T_CHECK(dev_poisons(d), "STRATA_POISON=1 did not turn poisoning on");
    dev_destroy(d);
    if (saved)
        setenv("STRATA_POISON", saved, 1);
    else
        unsetenv("STRATA_POISON");
    free(saved);
}

/* ---------------------------------------------------------------- errors */

static strata_status failing_fn(void *p)
{
    return err_set(STRATA_EIO, "simulated NVMe read failure at offset %d", *(int *)p);
}

static strata_status count_fn(void *p)
{
    atomic_fetch_add((atomic_int *)p, 1);
    return STRATA_OK;
}

static void test_async_error(void)
{
    rig r;
    rig_open(&r, 0, false, "h2d", "other");
    device *d = r.d;
    dev_stream *s = r.a, *other = r.b;
    dev_event *before = r.ev, *after = r.done_b;
    static int where = 4096;
    static int slow = 50;
    atomic_int ran = 0;
    T_OK(dev_host_fn(s, slow_fn, &slow));
    T_OK(dev_event_record(before, s));
    T_OK(dev_host_fn(s, failing_fn, &where));
    T_OK(dev_host_fn(s, count_fn, &ran));
    T_OK(dev_event_record(after, s));
    T_OK(dev_stream_wait_event(other, after));

    T_OK(dev_event_sync(before)); /* recorded before the failure: clean */
    T_STATUS(dev_event_sync(after), STRATA_EIO);
    T_CONTAINS(strata_last_error(NULL), "stream \"h2d\"");
    T_CONTAINS(strata_last_error(NULL), "host function failed: simulated NVMe read failure at offset 4096");
    bool done = false;
    T_STATUS(dev_event_query(after, &done), STRATA_EIO);
    T_CHECK(done, "the failed work is finished, so the event is done");
    T_OK(dev_stream_sync(other)); /* errors stay with their stream */
    T_STATUS(dev_stream_sync(s), STRATA_EIO);
    T_CONTAINS(strata_last_error(NULL), "simulated NVMe read failure");
    T_EQ_INT(atomic_load(&ran), 1);
    T_OK(dev_stream_sync(s)); /* reported once, then cleared */

    /* Errors at enqueue and misuse name the call and the pointer. */
    T_STATUS(dev_memcpy_async(s, NULL, &where, 4), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "dev_memcpy_async on stream \"h2d\": NULL dst");
    int local = 0;
    T_STATUS(dev_free(d, &local), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "is not device memory of");
    void *p;
    T_OK(dev_alloc(d, 1000, &p));
    T_STATUS(dev_free(d, (char *)p + 256), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "is not a live allocation");
    T_OK(dev_free(d, p));
    T_STATUS(dev_free(d, p), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "freed twice");
    T_OK(dev_free(d, NULL));
    void *heap = malloc(8192);
    T_STATUS(dev_host_free(d, heap), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "was not allocated by dev_host_alloc()");
    T_STATUS(dev_host_unregister(d, heap), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "is not registered with");
    T_OK(dev_host_register(d, heap, 8192));
    dev_mem_stats st;
    dev_mem_stats_get(d, &st);
    T_EQ_INT(st.registered_bytes, 8192);
    T_OK(dev_host_unregister(d, heap));
    free(heap);
    dev_destroy(d);
}

/* ---------------------------------------------------------------- destroy with work in flight */

static void test_destroy_in_flight(void)
{
    enum { NS = 3, PER = 40 };
    device *d = open_dev(64 * MiB, true);
    dev_stream *s[NS];
    dev_event *ev[NS];
    atomic_int ran = 0;
    static int ms = 1;
    size_t n = 256 * 1024;
    void *src, *dst[NS];
    T_OK(dev_host_alloc(d, n, &src));
    for (int i = 0; i < NS; i++) {
        T_OK(dev_stream_create(d, "busy", &s[i]));
        T_OK(dev_event_create(d, &ev[i]));
        T_OK(dev_alloc(d, n, &dst[i]));
    }
    for (int k = 0; k < PER; k++) {
        for (int i = 0; i < NS; i++) {
            T_OK(dev_host_fn(s[i], slow_fn, &ms));
            T_OK(dev_memcpy_async(s[i], dst[i], src, n));
            T_OK(dev_host_fn(s[i], count_fn, &ran));
            T_OK(dev_event_record(ev[i], s[i]));
            T_OK(dev_stream_wait_event(s[(i + 1) % NS], ev[i]));
        }
    }
    /* No sync, no frees: destroy must drain, then free streams, events, blocks and pinned memory. */
    dev_destroy(d);
    T_EQ_INT(atomic_load(&ran), NS * PER);
}

/* ---------------------------------------------------------------- selection */

static void test_selection(void)
{
    char why[256];
    strata_status cuda = dev_probe(STRATA_BACKEND_CUDA, why, sizeof why);
    printf("probe cuda: %s: %s\n", strata_status_name(cuda), why);
    T_CHECK(strncmp(why, "cuda: ", 6) == 0, "CUDA probe detail does not start with \"cuda: \": \"%s\"", why);
    if (cuda != STRATA_OK)
        T_CHECK(strstr(why, "no device (") || strstr(why, "not built (nvcc was not found"),
                "CUDA probe failed without saying why: \"%s\"", why);
    char other[256];
    T_OK(dev_probe(STRATA_BACKEND_HOST, other, sizeof other));
    T_CONTAINS(other, "host: ");
    T_OK(dev_probe(STRATA_BACKEND_AUTO, NULL, 0));
    T_STATUS(dev_probe((strata_backend_kind)42, other, sizeof other), STRATA_EINVAL);

    device *d = NULL;
    dev_options o = DEV_OPTIONS_INIT;
    o.budget_bytes = MiB;
    T_OK(dev_create(STRATA_BACKEND_AUTO, &o, &d));
    if (d)
        T_EQ_INT(dev_kind(d), cuda == STRATA_OK ? STRATA_BACKEND_CUDA : STRATA_BACKEND_HOST);
    dev_destroy(d);
    dev_destroy(NULL);
    if (cuda != STRATA_OK) {
        T_CHECK(dev_create(STRATA_BACKEND_CUDA, &o, &d) != STRATA_OK, "dev_create(cuda) succeeded with no device");
        T_CHECK(d == NULL, "out-param set on failure");
        T_CONTAINS(strata_last_error(NULL), why);
        T_CONTAINS(strata_last_error(NULL), "backend \"host\"");
    }
    T_STATUS(dev_create((strata_backend_kind)42, &o, &d), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "unknown backend kind 42");
    o.device_id = -1;
    T_STATUS(dev_create(STRATA_BACKEND_HOST, &o, &d), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "device_id = -1");
    o.device_id = 0;
    o.budget_bytes = 100;
    T_STATUS(dev_create(STRATA_BACKEND_HOST, &o, &d), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "budget_bytes = 100 is below one 256-byte block; set strata.device_budget_bytes");
    /* More address space than x86-64 has: the host arena's reservation is refused with a hint. */
    o.budget_bytes = (size_t)1 << 62;
    T_STATUS(dev_create(STRATA_BACKEND_HOST, &o, &d), STRATA_ENOMEM);
    T_CONTAINS(strata_last_error(NULL), "host backend: mmap of a 4096.00 PiB device arena failed: Cannot allocate memory (ENOMEM); lower strata.device_budget_bytes");
    T_CHECK(d == NULL, "out-param set on failure");
}

int main(void)
{
    test_selection();
    static const strata_backend_kind kinds[] = {STRATA_BACKEND_HOST, STRATA_BACKEND_CUDA};
    static const char *const names[] = {"host", "cuda"};
    int ran = 0;
    for (size_t k = 0; k < ARRAY_LEN(kinds); k++) {
        char why[256];
        if (dev_probe(kinds[k], why, sizeof why) != STRATA_OK) {
            printf("backend %s: skipped: %s\n", names[k], why);
            continue;
        }
        printf("backend %s: %s\n", names[k], why);
        kind_now = kinds[k];
        int before = t_failures;
        test_stream_order();
        test_cross_stream(false);
        test_cross_stream(true);
        test_concurrency();
        test_budget();
        test_fragmentation();
        test_poison();
        test_async_error();
        test_destroy_in_flight();
        printf("backend %s: %s\n", names[k], t_failures == before ? "passed" : "FAILED");
        ran++;
    }
    if (!ran)
        t_skip("no device backend could run here");
    return t_done();
}
