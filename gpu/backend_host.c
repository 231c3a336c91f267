/*
 * The host backend (see device.h): device memory is host memory, a stream is a worker thread
 * that runs its queue in order, an event is a pair of sequence numbers with a condition variable.
 *
 * It exists so that the engine runs and is tested on machines without a GPU, and it is faithful
 * where that matters: streams really run concurrently, waits really order them, and freed device
 * memory can be poisoned.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/big_alloc.h"
#include "base/error.h"
#include "base/size.h"
#include "cpu_adam/adam.h"
#include "gpu/device.h"

struct dev_impl {
    int unused;
};

/* An event: `recorded` counts recordings queued, `completed` is the newest one a stream reached.
 * Queued items hold references, so that destroying an event with work pending is safe. */
struct dev_impl_event {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t recorded, completed;
    int refs;
    bool dead;
};

typedef enum item_kind { ITEM_COPY, ITEM_SET, ITEM_CALL, ITEM_RECORD, ITEM_WAIT } item_kind;

typedef struct item item;
struct item {
    item_kind kind;
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    void (*fn)(void *);
    void *arg;
    dev_impl_event *ev;
    uint64_t gen; /* the recording an ITEM_RECORD completes or an ITEM_WAIT waits for */
    item *next;
};

/* A stream is a worker thread, or (wrapped) the calling thread, which runs each item as it is queued. */
struct dev_impl_stream {
    bool inline_run;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t more; /* work queued, or stop */
    pthread_cond_t idle; /* an item finished */
    item *head, *tail;
    uint64_t queued, finished;
    bool stop;
};

/* ---------------------------------------------------------------- events */

static void event_unref(dev_impl_event *e)
{
    pthread_mutex_lock(&e->lock);
    bool last = --e->refs == 0 && e->dead;
    pthread_mutex_unlock(&e->lock);
    if (last) {
        pthread_cond_destroy(&e->cond);
        pthread_mutex_destroy(&e->lock);
        free(e);
    }
}

static strata_status host_event_create(dev_impl *d, dev_impl_event **out)
{
    dev_impl_event *e = calloc(1, sizeof *e);
    if (!e)
        return err_set(STRATA_ENOMEM, "dev_event_create: out of host memory");
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->cond, NULL);
    e->refs = 1; /* the caller's */
    *out = e;
    return STRATA_OK;
}

static void host_event_destroy(dev_impl *d, dev_impl_event *e)
{
    pthread_mutex_lock(&e->lock);
    e->dead = true;
    pthread_mutex_unlock(&e->lock);
    event_unref(e);
}

static strata_status host_event_query(dev_impl *d, dev_impl_event *e, bool *done)
{
    pthread_mutex_lock(&e->lock);
    *done = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->lock);
    return STRATA_OK;
}

/* Blocks until recording gen of e has been reached. */
static void event_wait_for(dev_impl_event *e, uint64_t gen)
{
    pthread_mutex_lock(&e->lock);
    while (e->completed < gen)
        pthread_cond_wait(&e->cond, &e->lock);
    pthread_mutex_unlock(&e->lock);
}

static strata_status host_event_sync(dev_impl *d, dev_impl_event *e)
{
    pthread_mutex_lock(&e->lock);
    uint64_t gen = e->recorded;
    pthread_mutex_unlock(&e->lock);
    event_wait_for(e, gen);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- streams */

static void run_item(item *it)
{
    switch (it->kind) {
    case ITEM_COPY:
        memmove(it->dst, it->src, it->bytes);
        break;
    case ITEM_SET:
        memset(it->dst, it->value, it->bytes);
        break;
    case ITEM_CALL:
        it->fn(it->arg);
        break;
    case ITEM_RECORD:
        pthread_mutex_lock(&it->ev->lock);
        if (it->gen > it->ev->completed)
            it->ev->completed = it->gen;
        pthread_cond_broadcast(&it->ev->cond);
        pthread_mutex_unlock(&it->ev->lock);
        event_unref(it->ev);
        break;
    case ITEM_WAIT:
        event_wait_for(it->ev, it->gen);
        event_unref(it->ev);
        break;
    }
}

static void *stream_main(void *arg)
{
    dev_impl_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->more, &s->lock);
        if (!s->head)
            break; /* stopping, and the queue is drained */
        item *it = s->head;
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->lock);
        run_item(it);
        free(it);
        pthread_mutex_lock(&s->lock);
        s->finished++;
        pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static strata_status host_stream_create(dev_impl *d, const char *name, dev_impl_stream **out)
{
    dev_impl_stream *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(STRATA_ENOMEM, "dev_stream_create: out of host memory");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->more, NULL);
    pthread_cond_init(&s->idle, NULL);
    int rc = pthread_create(&s->thread, NULL, stream_main, s);
    if (rc != 0) {
        char eb[64];
        pthread_cond_destroy(&s->idle);
        pthread_cond_destroy(&s->more);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return err_set(STRATA_ENOMEM, "dev_stream_create(\"%s\"): pthread_create failed: %s", name,
                       err_errno_str(rc, eb, sizeof eb));
    }
    char tname[16];
    snprintf(tname, sizeof tname, "strata-%s", name);
    pthread_setname_np(s->thread, tname);
    *out = s;
    return STRATA_OK;
}

static strata_status host_stream_wrap(dev_impl *d, void *native, const char *name, dev_impl_stream **out)
{
    if (native)
        return err_set(STRATA_EINVAL,
                       "dev_stream_wrap(\"%s\"): the host backend has no native streams (got %p); pass NULL to "
                       "wrap the calling thread",
                       name, native);
    dev_impl_stream *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(STRATA_ENOMEM, "dev_stream_wrap: out of host memory");
    s->inline_run = true;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->more, NULL);
    pthread_cond_init(&s->idle, NULL);
    *out = s;
    return STRATA_OK;
}

static void host_stream_destroy(dev_impl *d, dev_impl_stream *s, bool wrapped)
{
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_signal(&s->more);
    pthread_mutex_unlock(&s->lock);
    if (!s->inline_run)
        pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->more);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static strata_status push(dev_impl_stream *s, const item *proto)
{
    if (s->inline_run) {
        item now = *proto;
        run_item(&now);
        return STRATA_OK;
    }
    item *it = malloc(sizeof *it);
    if (!it)
        return err_set(STRATA_ENOMEM, "stream: out of host memory for a queue item");
    *it = *proto;
    it->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    s->queued++;
    pthread_cond_signal(&s->more);
    pthread_mutex_unlock(&s->lock);
    return STRATA_OK;
}

static strata_status host_memcpy_async(dev_impl *d, dev_impl_stream *s, void *dst, const void *src, size_t bytes)
{
    return push(s, &(item){.kind = ITEM_COPY, .dst = dst, .src = src, .bytes = bytes});
}

static strata_status host_memset_async(dev_impl *d, dev_impl_stream *s, void *dst, int value, size_t bytes)
{
    return push(s, &(item){.kind = ITEM_SET, .dst = dst, .value = value, .bytes = bytes});
}

static strata_status host_host_fn(dev_impl *d, dev_impl_stream *s, void (*fn)(void *), void *arg)
{
    return push(s, &(item){.kind = ITEM_CALL, .fn = fn, .arg = arg});
}

/* A device Adam: the CPU kernel chosen for this machine (cpu_adam/dispatch.c; STRATA_ISA=ref forces the scalar
 * reference), one thread, run on the stream's thread (device memory is host memory). Every kernel gives the bits
 * of adam_step_ref (tests/t_adam_kernels.c), so this is the contract's arithmetic, at the speed of one core. */
typedef struct host_adam {
    adam_step_fn step;
    adam_consts c;
    adam_arrays a;
    size_t n;
} host_adam;

static void run_adam(void *arg)
{
    host_adam *h = arg;
    h->step(&h->c, &h->a, 0, h->n);
    free(h);
}

static strata_status host_adam_step(dev_impl *d, dev_impl_stream *s, const adam_consts *c, const dev_adam_arrays *a,
                                    size_t n)
{
    const adam_ops *ops;
    ERR_CHECK(adam_ops_default(&ops));
    host_adam *h = malloc(sizeof *h);
    if (!h)
        return err_set(STRATA_ENOMEM, "dev_adam_step: out of host memory for a queue item");
    *h = (host_adam){.step = ops->step, .c = *c, .n = n,
                     .a = {.master = a->master, .exp_avg = a->exp_avg, .exp_avg_sq = a->exp_avg_sq, .grad = a->grad,
                           .param = a->param, .grad_dtype = STRATA_DTYPE_FP32, .param_dtype = a->param_dtype}};
    strata_status st = push(s, &(item){.kind = ITEM_CALL, .fn = run_adam, .arg = h});
    if (st != STRATA_OK)
        free(h);
    return st;
}

static strata_status host_stream_sync(dev_impl *d, dev_impl_stream *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t target = s->queued;
    while (s->finished < target)
        pthread_cond_wait(&s->idle, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return STRATA_OK;
}

static strata_status host_event_record(dev_impl *d, dev_impl_event *e, dev_impl_stream *s)
{
    pthread_mutex_lock(&e->lock);
    uint64_t gen = ++e->recorded;
    e->refs++;
    pthread_mutex_unlock(&e->lock);
    strata_status st = push(s, &(item){.kind = ITEM_RECORD, .ev = e, .gen = gen});
    if (st != STRATA_OK) {
        /* Nothing will complete this recording: mark it reached so that waiters do not hang. */
        pthread_mutex_lock(&e->lock);
        if (e->completed < gen)
            e->completed = gen;
        pthread_cond_broadcast(&e->cond);
        pthread_mutex_unlock(&e->lock);
        event_unref(e);
    }
    return st;
}

static strata_status host_stream_wait_event(dev_impl *d, dev_impl_stream *s, dev_impl_event *e)
{
    pthread_mutex_lock(&e->lock);
    uint64_t gen = e->recorded;
    bool reached = e->completed >= gen;
    if (!reached)
        e->refs++;
    pthread_mutex_unlock(&e->lock);
    if (reached)
        return STRATA_OK; /* CUDA semantics: only the latest recording at call time counts */
    strata_status st = push(s, &(item){.kind = ITEM_WAIT, .ev = e, .gen = gen});
    if (st != STRATA_OK)
        event_unref(e);
    return st;
}

/* ---------------------------------------------------------------- device and memory */

static strata_status host_probe(char *detail, size_t len)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t ram = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    char b[32];
    snprintf(detail, len, "host: %ld cores, %s RAM (device memory is host memory)", cores, size_format(ram, b, sizeof b));
    return STRATA_OK;
}

static strata_status host_create(const dev_options *opt, dev_impl **out, char *name, size_t name_len)
{
    dev_impl *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(STRATA_ENOMEM, "dev_create(host): out of host memory");
    snprintf(name, name_len, "host");
    *out = d;
    return STRATA_OK;
}

static void host_destroy(dev_impl *d)
{
    free(d);
}

static strata_status host_arena_reserve(dev_impl *d, size_t *bytes, void **base)
{
    size_t want = *bytes ? *bytes : DEV_HOST_DEFAULT_BUDGET_BYTES;
    /* MAP_NORESERVE: pages cost nothing until touched, so a generous budget is free. */
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        char eb[64], b[32];
        int e = errno;
        return err_set(STRATA_ENOMEM,
                       "host backend: mmap of a %s device arena failed: %s; lower strata.device_budget_bytes",
                       size_format(want, b, sizeof b), err_errno_str(e, eb, sizeof eb));
    }
    *bytes = want;
    *base = p;
    return STRATA_OK;
}

static void host_arena_release(dev_impl *d, void *base, size_t bytes)
{
    munmap(base, bytes);
}

static strata_status host_poison(dev_impl *d, void *ptr, size_t bytes)
{
    uint32_t *w = ptr;
    for (size_t i = 0; i < bytes / sizeof *w; i++)
        w[i] = DEV_POISON_WORD;
    return STRATA_OK;
}

static strata_status host_host_alloc(dev_impl *d, size_t bytes, void **out)
{
    /* Page-aligned heap memory: the "pinned" buffers of this backend. mlock is skipped on purpose,
     * since locking gigabytes would only compete with the rest of the machine for nothing. The state
     * arrays Adam streams are large: those get huge pages (base/big_alloc.h). */
    int rc = 0;
    if (bytes >= BIG_ALLOC_PAGE)
        rc = (*out = big_alloc(bytes)) ? 0 : ENOMEM;
    else
        rc = posix_memalign(out, DEV_HOST_ALIGN_BYTES, bytes);
    if (rc != 0) {
        char b[32];
        *out = NULL;
        return err_set(STRATA_ENOMEM, "dev_host_alloc: %s of pinned host memory refused (posix_memalign)",
                       size_format(bytes, b, sizeof b));
    }
    return STRATA_OK;
}

static void host_host_free(dev_impl *d, void *ptr)
{
    free(ptr);
}

static strata_status host_host_register(dev_impl *d, void *ptr, size_t bytes)
{
    return STRATA_OK;
}

static void host_host_unregister(dev_impl *d, void *ptr)
{
}

const dev_ops dev_ops_host = {
    .name = "host",
    .kind = STRATA_BACKEND_HOST,
    .probe = host_probe,
    .create = host_create,
    .destroy = host_destroy,
    .arena_reserve = host_arena_reserve,
    .arena_release = host_arena_release,
    .poison = host_poison,
    .host_alloc = host_host_alloc,
    .host_free = host_host_free,
    .host_register = host_host_register,
    .host_unregister = host_host_unregister,
    .stream_create = host_stream_create,
    .stream_wrap = host_stream_wrap,
    .stream_destroy = host_stream_destroy,
    .memcpy_async = host_memcpy_async,
    .memset_async = host_memset_async,
    .host_fn = host_host_fn,
    .stream_sync = host_stream_sync,
    .adam_step = host_adam_step,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .stream_wait_event = host_stream_wait_event,
    .event_query = host_event_query,
    .event_sync = host_event_sync,
};
