/* Offloaded activations: see act_store.h. */
#include "engine/act_store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/latch.h"
#include "base/size.h"
#include "base/util.h"
#include "engine/engine.h"

#define WRITE_SLOTS 2
#define READ_SLOTS (PLAN_ACT_STAGING - WRITE_SLOTS)

typedef struct act_entry {
    struct act_store *store;
    int index;                /* in the push order */
    uint32_t gen;             /* bumped at each drop: a stale handle no longer matches */
    bool kept;
    size_t bytes, span;       /* span: bytes rounded up to PLAN_ACT_ALIGN, what it takes in its tier */
    size_t offset;            /* in the host store or the swap extent */
    dev_event *copied;        /* on "act out", after the copy off the device */
    int wslot;                /* NVMe: the staging buffer its write went through, while that still holds it; -1 */
    strata_status lost;       /* NVMe: its write failed (restoring it fails with this) */
    uint64_t push_ns, restore_ns;

    /* The device copy: absent, or restoring/restored into dev (ready recorded after its copy). */
    void *dev;
    bool popped;
    dev_event *ready;
    int rslot;                /* NVMe: the read buffer it came through, until its copy is done; -1 */
    io_wait io;               /* NVMe: the read */
    bool copy_queued;         /* NVMe: the read landed and the copy to the device was queued (under store->lock) */
    err_latch read_failed;    /* NVMe: the read's failure, or its copy's queueing (set on an I/O thread) */
} act_entry;

typedef struct write_slot {
    void *buf;
    io_wait io;               /* the write of the entry it holds (with a guard while the copy runs) */
    act_entry *holds;         /* the entry written through it last, until the write is waited for */
} write_slot;

struct act_store {
    struct strata_engine *e;
    strata_tier tier;
    size_t capacity, max_bytes, window_bytes;
    dev_stream *out, *in;
    dev_event *pushed;        /* the compute stream at a push, for "act out" to wait on */
    void *host;               /* host tier: the store */
    swap_extent ext;          /* NVMe tier: the store */
    void *staging;            /* NVMe tier: WRITE_SLOTS + READ_SLOTS buffers of max span */
    write_slot wslots[WRITE_SLOTS];
    void *rbuf[READ_SLOTS];
    act_entry *rholder[READ_SLOTS];
    int next_wslot;

    act_entry **ents;         /* in push order; [0, top) are this round's */
    size_t nents, cap, top;
    size_t next_offset;       /* the end of the kept copies */
    size_t kept, kept_bytes, restored_bytes;
    act_entry *last_push;     /* its source is the trainer's again at the next push or pop */
    /* The order of the first pops, as push indices: the last round's (a round runs from an empty store to empty
     * again: a micro-batch, or a layer-wise pass) and this one's so far. */
    int *seen, *now;
    size_t nseen, nnow, seen_cap, now_cap;

    pthread_mutex_t lock;     /* copy_queued of NVMe restores (set on I/O threads) */
    pthread_cond_t cv;
    act_counters ctr;
};

/* ---------------------------------------------------------------- handles */

static strata_act handle_of(const act_entry *a)
{
    return ((uint64_t)a->gen << 32) | (uint64_t)(a->index + 1);
}

static act_entry *entry_of(act_store *s, strata_act h, const char *what)
{
    uint64_t idx = h & 0xffffffffu;
    if (h == 0 || idx == 0 || idx > s->top || s->ents[idx - 1]->gen != (uint32_t)(h >> 32) ||
        !s->ents[idx - 1]->kept) {
        err_set(STRATA_EINVAL, "%s: activation %llu is not kept (never pushed, or already dropped)", what,
                (unsigned long long)h);
        return NULL;
    }
    return s->ents[idx - 1];
}

/* ---------------------------------------------------------------- trace marks, on the streams */

static void mark(const act_entry *a, const char *what, uint64_t t0)
{
    char d[64];
    snprintf(d, sizeof d, "#%d %zu B", a->index, a->bytes);
    trace_event(a->store->e->trace, TRACK_ACTIVATIONS, what, d, t0, now_ns());
}

static strata_status mark_pushed(void *arg)
{
    const act_entry *a = arg;
    mark(a, "act offload", a->push_ns);
    return STRATA_OK;
}

static strata_status mark_restored(void *arg)
{
    const act_entry *a = arg;
    mark(a, "act restore", a->restore_ns);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- keeping */

/* Runs on "act out" once the copy into the staging buffer is done: queues its NVMe write and drops the guard the
 * push took, so the slot's io_wait covers copy and write. Host functions must not block: the write is queued. */
static strata_status write_staged(void *arg)
{
    act_entry *a = arg;
    act_store *s = a->store;
    write_slot *w = &s->wslots[a->wslot];
    strata_status st = swap_write(s->e->tiers.swap, &s->ext, a->offset, w->buf, a->span, &w->io);
    char why[ERR_MSG_BYTES];
    snprintf(why, sizeof why, "%s", st != STRATA_OK ? err_last() : "");
    if (st == STRATA_OK)
        atomic_fetch_add(&s->e->tiers.ctr.nvme_write_bytes, a->span);
    io_wait_finish(&w->io, st, why);
    return STRATA_OK;
}

/* Waits for a write slot's last write; a failure marks the activation it held as lost. */
static strata_status settle_write(write_slot *w)
{
    strata_status st = io_wait_wait(&w->io);
    if (st != STRATA_OK && w->holds) {
        w->holds->lost = st;
        st = err_set(st, "offloaded activation #%d: its NVMe write failed: %s", w->holds->index, err_last());
    }
    if (w->holds)
        w->holds->wslot = -1;
    w->holds = NULL;
    return st;
}

static strata_status keep(act_store *s, act_entry *a, const void *src)
{
    strata_engine *e = s->e;
    ERR_CHECK(dev_event_record(s->pushed, e->compute));
    ERR_CHECK(dev_stream_wait_event(s->out, s->pushed));
    a->push_ns = now_ns();
    if (s->tier == STRATA_TIER_HOST) {
        ERR_CHECK(dev_memcpy_async(s->out, (char *)s->host + a->offset, src, a->bytes));
    } else {
        int k = s->next_wslot;
        s->next_wslot = (k + 1) % WRITE_SLOTS;
        write_slot *w = &s->wslots[k];
        uint64_t t0 = now_ns();
        bool busy = !io_wait_idle(&w->io); /* the drive is behind: forward waits for it */
        ERR_CHECK(settle_write(w));
        if (busy)
            s->ctr.stall_ns += now_ns() - t0;
        a->wslot = k;
        w->holds = a;
        io_wait_add(&w->io, 1); /* the guard: dropped by write_staged, after the copy */
        strata_status st = dev_memcpy_async(s->out, w->buf, src, a->bytes);
        if (st == STRATA_OK)
            st = dev_host_fn(s->out, write_staged, a);
        if (st != STRATA_OK) {
            char why[ERR_MSG_BYTES];
            snprintf(why, sizeof why, "%s", err_last());
            io_wait_finish(&w->io, st, why);
            return err_set(st, "%s", why);
        }
    }
    if (e->trace)
        ERR_CHECK(dev_host_fn(s->out, mark_pushed, a));
    ERR_CHECK(dev_event_record(a->copied, s->out));
    atomic_fetch_add(&e->ctr.device_to_host, a->bytes);
    return STRATA_OK;
}

/* The contract of strata_act_push: the last push's source is the trainer's again once its next push or pop
 * returns, so work queued on the compute stream from then on waits for that copy. */
static strata_status hand_back_source(act_store *s)
{
    if (!s->last_push)
        return STRATA_OK;
    act_entry *a = s->last_push;
    s->last_push = NULL;
    bool done = false;
    uint64_t t0 = now_ns();
    strata_status st = dev_event_query(a->copied, &done);
    if (st == STRATA_OK)
        st = dev_stream_wait_event(s->e->compute, a->copied); /* blocks on the host backend, whose compute is us */
    if (!done)
        s->ctr.stall_ns += now_ns() - t0;
    return st;
}

static strata_status new_entry(act_store *s, act_entry **out)
{
    if (s->top < s->nents) {
        *out = s->ents[s->top++];
        return STRATA_OK;
    }
    if (!array_grow((void **)&s->ents, &s->cap, s->nents + 1, sizeof *s->ents))
        return err_set(STRATA_ENOMEM, "strata_act_push: out of host memory");
    act_entry *a = calloc(1, sizeof *a);
    if (!a)
        return err_set(STRATA_ENOMEM, "strata_act_push: out of host memory");
    a->store = s;
    a->index = (int)s->nents;
    a->wslot = a->rslot = -1;
    io_wait_init(&a->io);
    err_latch_init(&a->read_failed);
    strata_status st = dev_event_create(s->e->dev, &a->copied);
    if (st == STRATA_OK)
        st = dev_event_create(s->e->dev, &a->ready);
    if (st != STRATA_OK) {
        dev_event_destroy(a->copied);
        io_wait_destroy(&a->io);
        err_latch_destroy(&a->read_failed);
        free(a);
        return st;
    }
    s->ents[s->nents++] = a;
    s->top++;
    *out = a;
    return STRATA_OK;
}

static strata_status push(act_store *s, const void *src, size_t bytes, strata_act *out)
{
    char b1[32], b2[32], b3[32];
    if (bytes > s->max_bytes)
        return err_set(STRATA_EBUDGET, "strata_act_push: %s is larger than the largest activation the plan holds, "
                       "strata.offload_activations.max_bytes = %s; raise it", size_format(bytes, b1, sizeof b1),
                       size_format(s->max_bytes, b2, sizeof b2));
    size_t span = align_up(bytes, PLAN_ACT_ALIGN);
    if (s->next_offset + span > s->capacity)
        return err_set(STRATA_EBUDGET, "strata_act_push: keeping %s more (activations take whole 4 KiB pages) "
                       "would hold %s, but strata.offload_activations.bytes is %s; raise it, or drop activations "
                       "before pushing more", size_format(span, b1, sizeof b1),
                       size_format(s->next_offset + span, b2, sizeof b2), size_format(s->capacity, b3, sizeof b3));
    ERR_CHECK(hand_back_source(s));
    act_entry *a = NULL;
    ERR_CHECK(new_entry(s, &a));
    a->kept = true;
    a->bytes = bytes;
    a->span = span;
    a->offset = s->next_offset;
    a->lost = STRATA_OK;
    a->dev = NULL;
    a->popped = false;
    strata_status st = keep(s, a, src);
    if (st != STRATA_OK) {
        a->kept = false;
        a->gen++;
        s->top--;
        return err_set(st, "strata_act_push: %s", err_last());
    }
    s->next_offset += span;
    s->kept++;
    s->kept_bytes += span;
    s->ctr.pushes++;
    s->ctr.offload_bytes += bytes;
    s->ctr.kept_peak_bytes = MAX(s->ctr.kept_peak_bytes, s->kept_bytes);
    s->last_push = a;
    *out = handle_of(a);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- restoring */

/* Runs on an I/O thread when an NVMe restore's read has landed: queues the copy to the device (non-blocking). */
static void on_read(io_wait *w, void *ctx)
{
    act_entry *a = ctx;
    act_store *s = a->store;
    char msg[ERR_MSG_BYTES];
    strata_status st = io_wait_take_status(w, msg, sizeof msg);
    if (st == STRATA_OK) {
        atomic_fetch_add(&s->e->tiers.ctr.nvme_read_bytes, a->span);
        st = dev_memcpy_async(s->in, a->dev, s->rbuf[a->rslot], a->bytes);
        if (st == STRATA_OK && s->e->trace)
            st = dev_host_fn(s->in, mark_restored, a);
        if (st == STRATA_OK)
            st = dev_event_record(a->ready, s->in);
        if (st != STRATA_OK)
            snprintf(msg, sizeof msg, "%s", err_last());
    }
    err_latch_set(&a->read_failed, st, msg);
    pthread_mutex_lock(&s->lock);
    a->copy_queued = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
}

/* NVMe restores: waits (or polls) until the copy is queued; its read's failure. */
static strata_status copy_queued(act_store *s, act_entry *a, bool wait, bool *queued)
{
    pthread_mutex_lock(&s->lock);
    while (wait && !a->copy_queued)
        pthread_cond_wait(&s->cv, &s->lock);
    *queued = a->copy_queued;
    pthread_mutex_unlock(&s->lock);
    return *queued ? err_latch_raise(&a->read_failed, NULL) : STRATA_OK;
}

/* Gives back the read buffer of an NVMe restore once its copy to the device is done (wait: waiting for it). */
static strata_status free_read_slot(act_store *s, act_entry *a, bool wait)
{
    if (a->rslot < 0)
        return STRATA_OK;
    bool done;
    strata_status st = copy_queued(s, a, wait, &done);
    if (st == STRATA_OK && done)
        st = wait ? dev_event_sync(a->ready) : dev_event_query(a->ready, &done);
    if (st == STRATA_OK && !done)
        return STRATA_OK;
    s->rholder[a->rslot] = NULL;
    a->rslot = -1;
    return st;
}

/* A read buffer for an NVMe restore: a free one, one whose copy is done, or (demand) the one that frees first. */
static int take_read_slot(act_store *s, bool demand)
{
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < READ_SLOTS; k++) {
            if (s->rholder[k] && pass == 0)
                free_read_slot(s, s->rholder[k], false);
            else if (s->rholder[k] && demand)
                free_read_slot(s, s->rholder[k], true);
            if (!s->rholder[k])
                return k;
        }
    return -1;
}

static strata_status forget_device_copy(act_store *s, act_entry *a);

/* Frees the device copy of an activation restored ahead but not popped yet (backward went another way); false
 * when there is none. */
static bool evict_prefetched(act_store *s, const act_entry *keep)
{
    for (size_t i = 0; i < s->top; i++) {
        act_entry *b = s->ents[i];
        if (b != keep && b->kept && b->dev && !b->popped) {
            forget_device_copy(s, b);
            return true;
        }
    }
    return false;
}

/* Starts the device copy of a; demand: the trainer is waiting for it (a prefetch gives up instead of waiting
 * for memory, a read buffer or the activation's own NVMe write). */
static strata_status restore(act_store *s, act_entry *a, bool demand)
{
    strata_engine *e = s->e;
    if (a->lost != STRATA_OK)
        return err_set(a->lost, "offloaded activation #%d was lost: its NVMe write failed", a->index);
    if (a->wslot >= 0) { /* NVMe: its write must be on the drive before the read */
        write_slot *w = &s->wslots[a->wslot];
        if (!demand && !io_wait_idle(&w->io))
            return STRATA_OK;
        ERR_CHECK(settle_write(w));
    }
    int slot = -1;
    if (s->tier == STRATA_TIER_NVME && (slot = take_read_slot(s, demand)) < 0)
        return STRATA_OK; /* a prefetch: try again after the next pop */
    /* The plan's window holds the one in use and one ahead: a pop out of order makes room first. */
    while (demand && s->restored_bytes + align_up(a->bytes, DEV_ALIGN_BYTES) > s->window_bytes &&
           evict_prefetched(s, a))
        ;
    strata_status st;
    while ((st = dev_alloc(e->dev, a->bytes, &a->dev)) == STRATA_EBUDGET) {
        err_clear();
        if (!demand)
            return STRATA_OK;
        if (evict_prefetched(s, a))
            continue;
        if (deferred_pending(e->frees) == 0)
            return err_set(STRATA_EBUDGET, "no device memory to restore offloaded activation #%d (%zu B): "
                           "strata.offload_activations.max_bytes must cover the largest one", a->index, a->bytes);
        deferred_process(e->frees, true);
    }
    ERR_CHECK(st);
    s->restored_bytes += align_up(a->bytes, DEV_ALIGN_BYTES);
    s->ctr.device_peak_bytes = MAX(s->ctr.device_peak_bytes, s->restored_bytes);
    a->restore_ns = now_ns();
    ERR_CHECK(dev_stream_wait_event(s->in, a->copied));
    if (s->tier == STRATA_TIER_HOST) {
        ERR_CHECK(dev_memcpy_async(s->in, a->dev, (const char *)s->host + a->offset, a->bytes));
        if (e->trace)
            ERR_CHECK(dev_host_fn(s->in, mark_restored, a));
        ERR_CHECK(dev_event_record(a->ready, s->in));
    } else {
        a->rslot = slot;
        s->rholder[slot] = a;
        a->copy_queued = false;
        err_latch_take_copy(&a->read_failed, NULL, 0); /* the last restore's failure was reported */
        io_wait_set_notify(&a->io, on_read, a);
        io_wait_add(&a->io, 1); /* the guard: on_read may not run before every part of the read is queued */
        st = swap_read(e->tiers.swap, &s->ext, a->offset, s->rbuf[slot], a->span, &a->io);
        char why[ERR_MSG_BYTES];
        snprintf(why, sizeof why, "%s", st != STRATA_OK ? err_last() : "");
        io_wait_finish(&a->io, st, why);
    }
    atomic_fetch_add(&e->ctr.host_to_device, a->bytes);
    s->ctr.restore_bytes += a->bytes;
    return STRATA_OK;
}

/* Starts restoring b ahead of its pop when the window has room; *go_on: whether later ones may follow. */
static strata_status restore_ahead(act_store *s, act_entry *b, bool *go_on)
{
    *go_on = true;
    if (!b->kept || b->dev || b->popped)
        return STRATA_OK;
    *go_on = false;
    if (s->restored_bytes + align_up(b->bytes, DEV_ALIGN_BYTES) > s->window_bytes)
        return STRATA_OK;
    ERR_CHECK(restore(s, b, false));
    *go_on = b->dev != NULL; /* else no room or buffer yet */
    return STRATA_OK;
}

/* Restores what the next pops will ask for while the device window has room: the order the last round popped in
 * when this round has followed it so far (a layer-wise pass, or autograd's own order), else the activations
 * pushed before a, walking down (the reverse of the push order: a backward). */
static strata_status prefetch(act_store *s, const act_entry *a)
{
    bool go_on = true;
    size_t p = s->nnow;
    if (p <= s->nseen && s->seen[p - 1] == a->index) {
        for (size_t q = p; q < s->nseen && go_on; q++)
            if ((size_t)s->seen[q] < s->top)
                ERR_CHECK(restore_ahead(s, s->ents[s->seen[q]], &go_on));
        return STRATA_OK;
    }
    for (int i = a->index - 1; i >= 0 && go_on; i--)
        ERR_CHECK(restore_ahead(s, s->ents[i], &go_on));
    return STRATA_OK;
}

static strata_status pop(act_store *s, act_entry *a, const void **out)
{
    strata_engine *e = s->e;
    ERR_CHECK(hand_back_source(s));
    uint64_t t0 = now_ns();
    bool landed = false; /* the copy was on the device before this pop asked: no stall */
    if (a->dev && s->tier == STRATA_TIER_NVME)
        ERR_CHECK(copy_queued(s, a, false, &landed));
    if (a->dev && (landed || s->tier == STRATA_TIER_HOST))
        ERR_CHECK(dev_event_query(a->ready, &landed));
    if (!a->dev)
        ERR_CHECK(restore(s, a, true));
    if (s->tier == STRATA_TIER_NVME) {
        bool queued;
        ERR_CHECK(copy_queued(s, a, true, &queued));
    }
    ERR_CHECK(dev_stream_wait_event(e->compute, a->ready)); /* blocks on the host backend, whose compute is us */
    if (!landed && !a->popped) {
        uint64_t t1 = now_ns();
        s->ctr.stall_ns += t1 - t0;
        if (e->trace)
            trace_event(e->trace, TRACK_TRAINER, "act pop stall", NULL, t0, t1);
    }
    if (!a->popped) {
        if (!array_grow((void **)&s->now, &s->now_cap, s->nnow + 1, sizeof *s->now))
            return err_set(STRATA_ENOMEM, "strata_act_pop: out of host memory");
        s->now[s->nnow++] = a->index;
    }
    a->popped = true;
    *out = a->dev;
    return prefetch(s, a);
}

/* ---------------------------------------------------------------- dropping */

static strata_status forget_device_copy(act_store *s, act_entry *a)
{
    if (!a->dev)
        return STRATA_OK;
    strata_status st = STRATA_OK;
    if (s->tier == STRATA_TIER_NVME) {
        bool queued;
        st = copy_queued(s, a, true, &queued);
    }
    /* A copy the trainer never popped may still be landing: its stream must be past it too. */
    strata_status st2 = a->popped ? STRATA_OK : dev_event_sync(a->ready);
    strata_status st3 = free_read_slot(s, a, true);
    deferred_free_after(s->e->frees, a->dev, s->e->compute);
    s->restored_bytes -= align_up(a->bytes, DEV_ALIGN_BYTES);
    a->dev = NULL;
    return st != STRATA_OK ? st : st2 != STRATA_OK ? st2 : st3;
}

static strata_status drop(act_store *s, act_entry *a)
{
    strata_status st = forget_device_copy(s, a);
    /* Its space is reused by later pushes: an NVMe write still in flight there must land first. */
    if (a->wslot >= 0) {
        strata_status ws = settle_write(&s->wslots[a->wslot]);
        st = st != STRATA_OK ? st : ws;
    }
    if (s->last_push == a) {
        strata_status hs = hand_back_source(s);
        st = st != STRATA_OK ? st : hs;
    }
    a->kept = false;
    a->gen++;
    s->kept--;
    s->kept_bytes -= a->span;
    while (s->top > 0 && !s->ents[s->top - 1]->kept) { /* the top of the store is free again */
        s->top--;
        s->next_offset = s->ents[s->top]->offset;
    }
    if (s->top == 0 && s->nnow) { /* a round ended: its pops are the next round's guide */
        int *t = s->seen;
        size_t c = s->seen_cap;
        s->seen = s->now, s->seen_cap = s->now_cap, s->nseen = s->nnow;
        s->now = t, s->now_cap = c, s->nnow = 0;
    }
    return st;
}

/* ---------------------------------------------------------------- life */

strata_status act_store_create(strata_engine *e, strata_tier tier, const plan *pl, act_store **out)
{
    *out = NULL;
    if (tier != STRATA_TIER_HOST && tier != STRATA_TIER_NVME)
        return STRATA_OK;
    act_store *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(STRATA_ENOMEM, "offloaded activations: out of host memory");
    *out = s; /* act_store_destroy undoes a partial build */
    s->e = e;
    s->tier = tier;
    s->capacity = align_up(e->cfg.offloaded_activation_bytes, PLAN_ACT_ALIGN);
    s->max_bytes = plan_act_max_bytes(&e->cfg);
    s->window_bytes = pl->act_window_bytes;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int k = 0; k < WRITE_SLOTS; k++)
        io_wait_init(&s->wslots[k].io);
    ERR_CHECK(dev_stream_create(e->dev, "act out", &s->out));
    ERR_CHECK(dev_stream_create(e->dev, "act in", &s->in));
    ERR_CHECK(dev_event_create(e->dev, &s->pushed));
    if (tier == STRATA_TIER_HOST)
        return dev_host_alloc(e->dev, s->capacity, &s->host);
    ERR_CHECK(swap_alloc(e->tiers.swap, s->capacity, &s->ext));
    s->ext.what = "offloaded activations";
    size_t one = align_up(s->max_bytes, PLAN_ACT_ALIGN);
    ERR_CHECK(dev_host_alloc(e->dev, PLAN_ACT_STAGING * one, &s->staging));
    for (int k = 0; k < WRITE_SLOTS; k++)
        s->wslots[k].buf = (char *)s->staging + (size_t)k * one;
    for (int k = 0; k < READ_SLOTS; k++)
        s->rbuf[k] = (char *)s->staging + (size_t)(WRITE_SLOTS + k) * one;
    return STRATA_OK;
}

void act_store_destroy(strata_engine *e, act_store *s)
{
    if (!s)
        return;
    dev_stream_sync(s->out);
    for (int k = 0; k < WRITE_SLOTS; k++)
        settle_write(&s->wslots[k]);
    for (size_t i = 0; i < s->nents; i++) {
        act_entry *a = s->ents[i];
        if (a->dev) {
            forget_device_copy(s, a);
        }
        dev_event_destroy(a->copied);
        dev_event_destroy(a->ready);
        io_wait_destroy(&a->io);
        err_latch_destroy(&a->read_failed);
        free(a);
    }
    free(s->ents);
    free(s->seen);
    free(s->now);
    dev_stream_destroy(s->out);
    dev_stream_destroy(s->in);
    dev_event_destroy(s->pushed);
    dev_host_free(e->dev, s->host);
    dev_host_free(e->dev, s->staging);
    if (s->ext.bytes)
        swap_free(e->tiers.swap, s->ext);
    for (int k = 0; k < WRITE_SLOTS; k++)
        io_wait_destroy(&s->wslots[k].io);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cv);
    free(s);
    err_clear();
}

size_t act_store_kept(const act_store *s)
{
    return s ? s->kept : 0;
}

void act_store_counters(const act_store *s, act_counters *out)
{
    *out = s ? s->ctr : (act_counters){0};
}

/* ---------------------------------------------------------------- the public calls */

static strata_status require_store(strata_engine *e, const char *what)
{
    ERR_CHECK(engine_require_finalized(e, what));
    if (!e->acts)
        return err_set(STRATA_ESTATE, "%s: strata.offload_activations.device is \"none\"; set it to \"cpu\", "
                       "\"nvme\" or \"auto\" with strata.offload_activations.bytes (strata train: "
                       "--offload-activations host|nvme)", what);
    return STRATA_OK;
}

STRATA_API strata_status strata_act_push(strata_engine *e, const void *src, size_t bytes, strata_act *out)
{
    if (!e || !src || !out)
        return err_set(STRATA_EINVAL, "strata_act_push: engine, src and out must not be NULL");
    *out = 0;
    if (bytes == 0)
        return err_copy(&e->err, err_set(STRATA_EINVAL, "strata_act_push: bytes is 0"));
    strata_status st = require_store(e, "strata_act_push");
    if (st == STRATA_OK)
        st = push(e->acts, src, bytes, out);
    return err_copy(&e->err, st);
}

STRATA_API strata_status strata_act_pop(strata_engine *e, strata_act act, const void **out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_act_pop: engine and out must not be NULL");
    *out = NULL;
    strata_status st = require_store(e, "strata_act_pop");
    act_entry *a = st == STRATA_OK ? entry_of(e->acts, act, "strata_act_pop") : NULL;
    if (st == STRATA_OK && !a)
        st = STRATA_EINVAL;
    if (st == STRATA_OK)
        st = pop(e->acts, a, out);
    return err_copy(&e->err, st);
}

STRATA_API strata_status strata_act_drop(strata_engine *e, strata_act act)
{
    if (!e)
        return err_set(STRATA_EINVAL, "strata_act_drop: engine is NULL");
    strata_status st = require_store(e, "strata_act_drop");
    act_entry *a = st == STRATA_OK ? entry_of(e->acts, act, "strata_act_drop") : NULL;
    if (st == STRATA_OK && !a)
        st = STRATA_EINVAL;
    if (st == STRATA_OK)
        st = drop(e->acts, a);
    return err_copy(&e->err, st);
}
