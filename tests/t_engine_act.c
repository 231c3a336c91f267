/*
 * Offloaded activations (strata_act_push / pop / drop), host and NVMe tiers: every activation comes back bit for bit
 * (the oracle: a host copy of what was pushed) whether it is popped in the reverse of the push order (backward,
 * prefetched), in a random order, or dropped unpopped; the source buffer is the trainer's again after the next
 * push, as strata.h promises, so overwriting it then changes nothing kept. An order that repeats is learned: its
 * second round restores each activation exactly once. The stats count what moved.
 * Bad input: an activation larger than max_bytes, more than bytes kept, unknown and dropped handles, pushes without
 * offloading configured, a step with activations still kept, configs missing a size or a swap directory, and an
 * NVMe write that fails (its pop reports it). "auto" puts them on NVMe when the host budget cannot hold them.
 */
#include <stdlib.h>
#include <string.h>

#include "nvme/fault.h"
#include "synth.h"
#include "testlib.h"

#define MAX_BYTES ((size_t)20000)
#define KEEP_BYTES ((size_t)6 * 20480) /* six of the largest, each rounded up to 4 KiB */
#define COUNT 6

static const char *tier_label(strata_tier t)
{
    return t == STRATA_TIER_HOST ? "host" : "nvme";
}

static strata_config config(strata_tier acts)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 8u << 20;
    c.host_budget_bytes = 64u << 20;
    c.activation_bytes = 2 * MAX_BYTES + 4096;
    c.offload_activations = acts;
    c.offloaded_activation_bytes = KEEP_BYTES;
    c.offloaded_activation_max_bytes = MAX_BYTES;
    synth_nvme_path(&c, t_scratch_dir("engine_act"), false, true);
    return c;
}

static strata_engine *engine(const strata_config *c)
{
    strata_engine *e = NULL;
    strata_module_id m;
    T_OK(strata_engine_create(c, &e));
    T_OK(strata_module_add(e, "m", &m));
    T_OK(strata_param_add(e, m, "w", 4096, NULL, NULL, &(strata_param_id){0}));
    T_OK(strata_engine_finalize(e));
    return e;
}

/* Pushes COUNT activations of random sizes and contents from two device buffers used in turn, overwriting each
 * buffer as soon as strata.h says it is the trainer's again; expect[k] keeps what act[k] must come back as. */
static void push_all(strata_engine *e, void *buf[2], strata_act act[COUNT], unsigned char *expect[COUNT],
                     size_t size[COUNT])
{
    for (int k = 0; k < COUNT; k++) {
        size[k] = (size_t)t_rand_range(1, MAX_BYTES);
        t_rand_bytes(expect[k], size[k]);
        memcpy(buf[k % 2], expect[k], size[k]); /* the host backend's device memory is host memory */
        T_OK(strata_act_push(e, buf[k % 2], size[k], &act[k]));
        if (k > 0) /* act[k - 1]'s source is the trainer's again: scribble over it */
            memset(buf[(k - 1) % 2], 0xa5, MAX_BYTES);
    }
}

static void check_pop(strata_engine *e, strata_act a, const unsigned char *expect, size_t size, const char *what)
{
    const void *p = NULL;
    T_OK(strata_act_pop(e, a, &p));
    size_t first = size;
    for (size_t i = 0; i < size && p; i++)
        if (((const unsigned char *)p)[i] != expect[i]) {
            first = i;
            break;
        }
    T_CHECK(p && first == size, "%s: restored activation (%zu B) differs from what was pushed at byte %zu: %02x vs "
            "%02x", what, size, first, p && first < size ? ((const unsigned char *)p)[first] : 0,
            first < size ? expect[first] : 0);
}

static void round_trips(strata_tier tier)
{
    strata_config c = config(tier);
    strata_engine *e = engine(&c);
    void *buf[2];
    T_OK(strata_device_alloc(e, MAX_BYTES, &buf[0]));
    T_OK(strata_device_alloc(e, MAX_BYTES, &buf[1]));
    strata_act act[COUNT];
    unsigned char *expect[COUNT];
    size_t size[COUNT], total = 0, pushed = 0;
    for (int k = 0; k < COUNT; k++)
        expect[k] = malloc(MAX_BYTES);
    char what[64];

    /* Backward's order: the reverse of the pushes, each popped, used, dropped. */
    push_all(e, buf, act, expect, size);
    for (int k = 0; k < COUNT; k++)
        pushed += size[k];
    T_STATUS(strata_step(e, NULL, NULL), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "not dropped");
    for (int k = COUNT - 1; k >= 0; k--) {
        snprintf(what, sizeof what, "%s, reverse order, #%d", tier_label(tier), k);
        check_pop(e, act[k], expect[k], size[k], what);
        T_OK(strata_act_drop(e, act[k]));
        total += size[k];
    }
    T_OK(strata_step(e, NULL, NULL));

    /* Any order, one dropped without a pop; a second pop gives the same copy. */
    push_all(e, buf, act, expect, size);
    for (int k = 0; k < COUNT; k++)
        pushed += size[k];
    int order[COUNT];
    for (int k = 0; k < COUNT; k++)
        order[k] = k;
    for (int k = COUNT - 1; k > 0; k--) {
        int j = (int)t_rand_range(0, (uint64_t)k), x = order[k];
        order[k] = order[j];
        order[j] = x;
    }
    for (int i = 0; i < COUNT; i++) {
        int k = order[i];
        if (i == 2) {
            T_OK(strata_act_drop(e, act[k]));
            continue;
        }
        snprintf(what, sizeof what, "%s, random order, #%d", tier_label(tier), k);
        check_pop(e, act[k], expect[k], size[k], what);
        check_pop(e, act[k], expect[k], size[k], what);
        T_OK(strata_act_drop(e, act[k]));
        total += size[k];
    }
    /* An order that repeats is learned: the second round in the same shuffled order restores each activation once,
     * ahead of its pop (walking down the push order instead, the prefetches would be wrong and thrown away). */
    for (int round = 0; round < 2; round++) {
        strata_stats before;
        T_OK(strata_stats_get(e, &before));
        size_t round_bytes = 0;
        push_all(e, buf, act, expect, size);
        for (int i = 0; i < COUNT; i++) {
            int k = order[i];
            snprintf(what, sizeof what, "%s, repeated order, round %d, #%d", tier_label(tier), round, k);
            check_pop(e, act[k], expect[k], size[k], what);
            T_OK(strata_act_drop(e, act[k]));
            round_bytes += size[k];
        }
        pushed += round_bytes;
        total += round_bytes;
        strata_stats after;
        T_OK(strata_stats_get(e, &after));
        if (round == 1)
            T_CHECK(after.act_restore_bytes - before.act_restore_bytes == round_bytes,
                    "%s: the repeated order restored %llu B for %zu B of activations", tier_label(tier),
                    (unsigned long long)(after.act_restore_bytes - before.act_restore_bytes), round_bytes);
    }

    /* Dropped handles are refused, and so are made-up ones. */
    const void *p;
    T_STATUS(strata_act_pop(e, act[order[0]], &p), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "not kept");
    T_STATUS(strata_act_drop(e, act[order[0]]), STRATA_EINVAL);
    T_STATUS(strata_act_pop(e, 0, &p), STRATA_EINVAL);
    T_STATUS(strata_act_pop(e, 12345, &p), STRATA_EINVAL);

    strata_stats s;
    T_OK(strata_stats_get(e, &s));
    /* Restores ahead that the order did not use (the one dropped unpopped, the shuffled round's) count too. */
    T_CHECK(s.act_pushes == 4 * COUNT && s.act_offload_bytes == pushed && s.act_restore_bytes >= total &&
                s.act_kept_peak_bytes <= KEEP_BYTES &&
            s.act_device_peak_bytes <= 2 * MAX_BYTES + 512,
            "%s: stats: %llu pushes (expected %d) of %llu B (expected %zu), %llu B restored (expected at least the "
            "%zu popped), kept peak %zu, device peak %zu", tier_label(tier), (unsigned long long)s.act_pushes,
            4 * COUNT, (unsigned long long)s.act_offload_bytes, pushed, (unsigned long long)s.act_restore_bytes, total,
            s.act_kept_peak_bytes, s.act_device_peak_bytes);
    if (tier == STRATA_TIER_NVME)
        T_CHECK(s.host_to_nvme_bytes >= s.act_offload_bytes && s.nvme_to_host_bytes >= total,
                "nvme: %llu B written and %llu B read for %llu B offloaded and %zu B restored",
                (unsigned long long)s.host_to_nvme_bytes, (unsigned long long)s.nvme_to_host_bytes,
                (unsigned long long)s.act_offload_bytes, total);
    printf("%s: %llu pushes, %llu B off the device, %llu B back, kept at most %zu B; stall %.3f ms\n",
           tier_label(tier), (unsigned long long)s.act_pushes, (unsigned long long)s.act_offload_bytes,
           (unsigned long long)s.act_restore_bytes, s.act_kept_peak_bytes, (double)s.act_stall_ns / 1e6);

    /* Budgets: nothing is pushed when refused. */
    strata_act a;
    T_STATUS(strata_act_push(e, buf[0], MAX_BYTES + 1, &a), STRATA_EBUDGET);
    T_CONTAINS(strata_last_error(e), "max_bytes");
    int kept = 0;
    strata_status st = STRATA_OK;
    strata_act many[16];
    while (kept < 16 && (st = strata_act_push(e, buf[kept % 2], MAX_BYTES, &many[kept])) == STRATA_OK)
        kept++;
    T_CHECK(st == STRATA_EBUDGET && kept == (int)(KEEP_BYTES / 20480), "%s: %d of the largest kept before %s; "
            "expected %zu then STRATA_EBUDGET", tier_label(tier), kept, strata_status_name(st), KEEP_BYTES / 20480);
    T_CONTAINS(strata_last_error(e), "strata.offload_activations.bytes");
    for (int k = kept - 1; k >= 0; k--)
        T_OK(strata_act_drop(e, many[k]));
    T_STATUS(strata_act_push(e, buf[0], 0, &a), STRATA_EINVAL);
    T_OK(strata_step(e, NULL, NULL));

    for (int k = 0; k < COUNT; k++)
        free(expect[k]);
    T_OK(strata_device_free(e, buf[0]));
    T_OK(strata_device_free(e, buf[1]));
    strata_engine_destroy(e);
}

/* A failed NVMe write of a kept activation: its pop fails with the drive's error; the engine goes on. */
static void write_fault(void)
{
    strata_config c = config(STRATA_TIER_NVME);
    strata_engine *e = engine(&c);
    void *buf;
    T_OK(strata_device_alloc(e, MAX_BYTES, &buf));
    t_rand_bytes(buf, MAX_BYTES);
    strata_act a, b;
    nvme_fault_inject(1, NVME_FAULT_EIO);
    T_OK(strata_act_push(e, buf, MAX_BYTES, &a));
    const void *p;
    strata_status st = strata_act_pop(e, a, &p);
    nvme_fault_inject(0, NVME_FAULT_NONE);
    T_CHECK(st == STRATA_EIO, "pop of an activation whose write failed: %s (%s), expected STRATA_EIO",
            strata_status_name(st), strata_last_error(e));
    T_CONTAINS(strata_last_error(e), "NVMe write failed");
    T_OK(strata_act_drop(e, a));
    T_OK(strata_act_push(e, buf, MAX_BYTES, &b)); /* the next one is kept and comes back */
    unsigned char *copy = malloc(MAX_BYTES);
    memcpy(copy, buf, MAX_BYTES);
    check_pop(e, b, copy, MAX_BYTES, "after a write fault");
    T_OK(strata_act_drop(e, b));
    free(copy);
    T_OK(strata_device_free(e, buf));
    strata_engine_destroy(e);
}

static void bad_configs(void)
{
    char err[1024];
    strata_config c = config(STRATA_TIER_HOST);
    c.offloaded_activation_bytes = 0;
    T_STATUS(strata_config_validate(&c, err, sizeof err), STRATA_ECONFIG);
    T_CONTAINS(err, "strata.offload_activations.bytes");
    c = config(STRATA_TIER_HOST);
    c.offloaded_activation_max_bytes = KEEP_BYTES + 1;
    T_STATUS(strata_config_validate(&c, err, sizeof err), STRATA_ECONFIG);
    T_CONTAINS(err, "max_bytes");
    c = config(STRATA_TIER_NVME);
    c.offload_optimizer.nvme_path_count = 0;
    T_STATUS(strata_config_validate(&c, err, sizeof err), STRATA_ECONFIG);
    T_CONTAINS(err, "nvme_path");
    c = config(STRATA_TIER_HOST);
    c.offloaded_activation_bytes = (size_t)1 << 40; /* more than the host budget */
    strata_engine *e = NULL;
    strata_module_id m;
    T_OK(strata_engine_create(&c, &e));
    T_OK(strata_module_add(e, "m", &m));
    T_OK(strata_param_add(e, m, "w", 4096, NULL, NULL, &(strata_param_id){0}));
    T_STATUS(strata_engine_finalize(e), STRATA_EBUDGET);
    T_CONTAINS(strata_last_error(e), "offloaded activations");
    strata_engine_destroy(e);

    /* Without offloading configured, the calls say how to turn it on. */
    c = config(STRATA_TIER_DEVICE);
    e = engine(&c);
    strata_act a;
    T_STATUS(strata_act_push(e, &c, 16, &a), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata.offload_activations.device");
    strata_engine_destroy(e);

    /* auto: host memory when the host budget holds them, else NVMe. */
    strata_stats s;
    c = config(STRATA_TIER_AUTO);
    e = engine(&c);
    T_OK(strata_stats_get(e, &s));
    T_CHECK(s.nvme_peak_bytes == 0, "auto under a %zu B host budget: %zu B on NVMe, expected none",
            c.host_budget_bytes, s.nvme_peak_bytes);
    size_t with_acts = s.host_peak_bytes; /* the plan's host bytes */
    strata_engine_destroy(e);
    c.host_budget_bytes = with_acts - KEEP_BYTES / COUNT; /* NVMe staging (4 x 20 KiB) still fits, all six do not */
    e = engine(&c);
    T_OK(strata_stats_get(e, &s));
    T_CHECK(s.nvme_peak_bytes >= KEEP_BYTES, "auto under a %zu B host budget: %zu B on NVMe, expected the %zu B of "
            "activations", c.host_budget_bytes, s.nvme_peak_bytes, KEEP_BYTES);
    strata_engine_destroy(e);
}

int main(void)
{
    round_trips(STRATA_TIER_HOST);
    round_trips(STRATA_TIER_NVME);
    write_fault();
    bad_configs();
    t_scratch_cleanup();
    return t_done();
}
