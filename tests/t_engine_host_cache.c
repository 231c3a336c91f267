/*
 * The host cache of NVMe-homed state (strata.host_cache, offload_param.max_in_cpu) must change where bytes come
 * from, never what is computed, and must never serve what the drive does not hold:
 *  - traffic: with all of it mirrored, the drive serves no read after finalize (the mirror serves every fetch and
 *    every sub-group of the step) while the weights equal the uncached run's bit for bit; with part of the
 *    parameters mirrored, the drive serves less than uncached and more than nothing;
 *  - after a load: a fresh engine (whose mirrors hold its initial state) loads a checkpoint and trains on; it must
 *    end where the uninterrupted run ends (a mirror serving the initial state would not);
 *  - writes: the mirrors hold their writes (the drive takes none of a mirrored module's or sub-group's updates);
 *    what the drive took and what the mirrors held are together exactly the uncached run's writes;
 *  - after a failed step (an injected I/O error on the write-back of optimizer state the cache has no room for,
 *    seen by the step or by the first call that waits for it): loading the checkpoint from before the fault and
 *    training on equals a clean engine doing the same (t_tier_cache shows what a forget keeps and drops).
 * The placements sweep of t_engine_equivalence covers bit-identity for every placement with the cache none,
 * partial and all.
 */
#include <stdlib.h>
#include <string.h>

#include "nvme/fault.h"
#include "synth.h"
#include "testlib.h"

static const char *dir;

static strata_config nvme_config(bool cache, size_t max_in_cpu)
{
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    synth_use_nvme(&c, dir, true, true);
    c.gradients_on_nvme = STRATA_SWITCH_AUTO;
    c.host_cache = cache;
    c.param_max_in_cpu = max_in_cpu;
    return c;
}

static float *train(const synth_opts *o, const strata_config *c, size_t *n, strata_stats *s, const char *what)
{
    float *w = NULL;
    strata_status st = synth_train(o, c, &w, n, NULL, s);
    T_CHECK(st == STRATA_OK, "%s: training failed: %s: %s", what, strata_status_name(st), strata_last_error(NULL));
    return w;
}

static void same_weights(const char *what, const float *a, const float *b, size_t n)
{
    size_t first, diffs = synth_count_diff(a, b, n, &first);
    T_CHECK(diffs == 0, "%s: %zu of %zu weights differ; first at %zu: %.9g vs %.9g", what, diffs, n, first,
            first < n ? (double)a[first] : 0.0, first < n ? (double)b[first] : 0.0);
}

static void traffic(void)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    size_t n0 = 0, n1 = 0, n2 = 0;
    strata_stats none, all, part;
    strata_config off = nvme_config(false, 0), on = nvme_config(true, 1000000000), some = nvme_config(true, 12288);
    float *w0 = train(&o, &off, &n0, &none, "uncached");
    float *w1 = train(&o, &on, &n1, &all, "all mirrored");
    float *w2 = train(&o, &some, &n2, &part, "part mirrored");
    if (w0 && w1 && w2 && n0 == n1 && n0 == n2) {
        same_weights("all mirrored vs uncached", w0, w1, n0);
        same_weights("part mirrored vs uncached", w0, w2, n0);
    }
    printf("NVMe bytes read: uncached %llu, part mirrored %llu, all mirrored %llu; host cache %zu / %zu bytes, "
           "%llu / %llu hits\n", (unsigned long long)none.nvme_to_host_bytes,
           (unsigned long long)part.nvme_to_host_bytes, (unsigned long long)all.nvme_to_host_bytes,
           part.host_cache_bytes, all.host_cache_bytes, (unsigned long long)part.host_cache_hits,
           (unsigned long long)all.host_cache_hits);
    T_CHECK(none.host_cache_bytes == 0 && none.host_cache_hits == 0, "cache off: %zu bytes mirrored, %llu hits",
            none.host_cache_bytes, (unsigned long long)none.host_cache_hits);
    T_CHECK(none.nvme_to_host_bytes > 0, "uncached: the drive served nothing");
    T_CHECK(all.nvme_to_host_bytes == 0, "all mirrored: the drive still served %llu bytes",
            (unsigned long long)all.nvme_to_host_bytes);
    T_CHECK(all.host_cache_read_bytes >= none.nvme_to_host_bytes,
            "all mirrored: the mirror served %llu bytes, the uncached drive %llu",
            (unsigned long long)all.host_cache_read_bytes, (unsigned long long)none.nvme_to_host_bytes);
    T_CHECK(part.nvme_to_host_bytes > 0 && part.nvme_to_host_bytes < none.nvme_to_host_bytes,
            "part mirrored: the drive served %llu bytes (uncached %llu): must be between",
            (unsigned long long)part.nvme_to_host_bytes, (unsigned long long)none.nvme_to_host_bytes);
    T_CHECK(part.host_cache_bytes > 0 && part.host_cache_bytes < all.host_cache_bytes,
            "part mirrored: %zu bytes mirrored, all: %zu", part.host_cache_bytes, all.host_cache_bytes);
    /* Every write the uncached drive took went to the drive or was held, none twice, and holding saved the drive
     * something. */
    const strata_stats *runs[] = {&all, &part};
    const char *names[] = {"all mirrored", "part mirrored"};
    for (int i = 0; i < 2; i++)
        T_CHECK(runs[i]->host_to_nvme_bytes + runs[i]->host_cache_held_bytes == none.host_to_nvme_bytes &&
                    runs[i]->host_cache_held_bytes > 0,
                "%s: the drive took %llu bytes and the cache held %llu; the uncached drive took %llu", names[i],
                (unsigned long long)runs[i]->host_to_nvme_bytes, (unsigned long long)runs[i]->host_cache_held_bytes,
                (unsigned long long)none.host_to_nvme_bytes);
    T_CHECK(none.host_cache_held_bytes == 0 && part.host_cache_held_bytes < all.host_cache_held_bytes,
            "held bytes: uncached %llu, part mirrored %llu, all mirrored %llu",
            (unsigned long long)none.host_cache_held_bytes, (unsigned long long)part.host_cache_held_bytes,
            (unsigned long long)all.host_cache_held_bytes);
    free(w0);
    free(w1);
    free(w2);
}

static void after_load(void)
{
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-load", dir);
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.steps = 6;
    o.save_dir = ckpt;
    o.save_after = 3;
    strata_config c = nvme_config(true, 1000000000);
    size_t n = 0, nr = 0;
    strata_stats s;
    float *straight = train(&o, &c, &n, &s, "straight, saving after 3 steps");
    synth_opts r = o;
    r.save_dir = NULL;
    r.save_after = 0;
    r.load_dir = ckpt;
    r.first_step = 3;
    r.steps = 3;
    float *resumed = train(&r, &c, &nr, &s, "fresh engine, load, 3 steps");
    T_CHECK(s.host_cache_hits > 0, "resumed: the cache served nothing (%llu hits)", (unsigned long long)s.host_cache_hits);
    if (straight && resumed && n == nr)
        same_weights("load into a cached engine, 3 more steps vs 6 straight", straight, resumed, n);
    free(straight);
    free(resumed);
}

static void after_failed_step(void)
{
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-fault", dir);
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    strata_config c = nvme_config(true, 1000000000);
    strata_engine *e = NULL, *clean = NULL;
    /* Everything mirrored, a step writes nothing to the drive: give the cache half its room, so the optimizer state
     * is mirrored in part and the step's write-back of the rest meets the injected fault. */
    strata_stats probe;
    T_OK(synth_engine(&o, &c, &e));
    T_OK(strata_stats_get(e, &probe));
    strata_engine_destroy(e);
    e = NULL;
    c.host_budget_bytes = probe.host_peak_bytes - probe.host_cache_bytes / 2;
    T_OK(synth_engine(&o, &c, &e));
    T_OK(synth_engine(&o, &c, &clean));
    if (!e || !clean)
        goto out;
    T_OK(strata_step(e, NULL, NULL));
    T_OK(strata_save(e, ckpt));
    /* The write-back is asynchronous (its first write may be submitted after the step returns): the step or the
     * sync that waits for it reports the fault. */
    nvme_fault_inject(1, NVME_FAULT_EIO);
    strata_status st = strata_step(e, NULL, NULL), waited = STRATA_OK;
    if (st == STRATA_OK)
        waited = strata_sync(e);
    nvme_fault_inject(0, NVME_FAULT_NONE);
    T_CHECK(st == STRATA_EIO || waited == STRATA_EIO,
            "a step whose write-back had an injected I/O error returned %s, the sync after it %s",
            strata_status_name(st), strata_status_name(waited));
    strata_stats s;
    T_OK(strata_stats_get(e, &s));
    T_CHECK(s.host_cache_bytes > 0 && s.host_cache_bytes < probe.host_cache_bytes,
            "half the cache's room: %zu bytes mirrored (all: %zu)", s.host_cache_bytes, probe.host_cache_bytes);
    T_OK(strata_load(e, ckpt));
    T_OK(strata_load(clean, ckpt));
    T_OK(strata_step(e, NULL, NULL));
    T_OK(strata_step(clean, NULL, NULL));
    /* The first layer's weights (parameter 0), as synth_train reads them. */
    size_t nw = (size_t)o.width[0] * o.width[1];
    float *a = calloc(nw, sizeof *a), *b = calloc(nw, sizeof *b);
    if (a && b) {
        T_OK(strata_param_read_master(e, 0, 0, nw, a));
        T_OK(strata_param_read_master(clean, 0, 0, nw, b));
        same_weights("failed step, load, step vs a clean engine's load, step (the first layer)", a, b, nw);
    }
    free(a);
    free(b);
out:
    strata_engine_destroy(e);
    strata_engine_destroy(clean);
}

int main(void)
{
    t_rng_seed();
    dir = t_scratch_dir("t_engine_host_cache");
    traffic();
    after_load();
    after_failed_step();
    return t_done();
}
