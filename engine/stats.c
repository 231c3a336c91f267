/* strata_stats_get: what each part of the engine counted, in one snapshot. */
#include <stddef.h>
#include <string.h>

#include "engine/act_store.h"
#include "engine/engine.h"
#include "engine/plan/host_cache.h"
#include "engine/ranks/ranks.h"
#include "engine/step/train_step.h"

/* The struct as the first release had it: ends after comm_bytes. */
#define STATS_MIN_BYTES (offsetof(strata_stats, comm_bytes) + sizeof(uint64_t))

STRATA_API strata_status strata_stats_get_sized(strata_engine *e, strata_stats *caller, size_t size)
{
    if (!e || !caller)
        return err_set(STRATA_EINVAL, "strata_stats_get: engine and out must not be NULL");
    if (size < STATS_MIN_BYTES)
        return err_set(STRATA_EINVAL, "strata_stats_get_sized: size %zu is smaller than any strata_stats (%zu bytes); "
                       "pass sizeof(strata_stats)", size, (size_t)STATS_MIN_BYTES);
    strata_stats all, *out = &all;
    memset(out, 0, sizeof *out);
    if (e->driver) {
        train_progress p;
        driver_progress(e->driver, &p);
        out->steps = p.steps;
        out->skipped_steps = p.skipped_steps;
    }
    out->step_ns = driver_step_ns(e->driver);
    residency_stats(e->res, &out->fetches, &out->prefetch_hits, &out->stall_ns);
    out->adam_ns = atomic_load(&e->ctr.adam_ns);
    out->step_io_wait_ns = atomic_load(&e->ctr.step_io_wait_ns);
    out->steps_redone = atomic_load(&e->ctr.steps_redone);
    out->redo_ns = atomic_load(&e->ctr.redo_ns);
    out->redo_nvme_bytes = atomic_load(&e->ctr.redo_nvme_bytes);
    out->nvme_to_host_bytes = atomic_load(&e->tiers.ctr.nvme_read_bytes);
    out->host_to_device_bytes = atomic_load(&e->ctr.host_to_device);
    out->device_to_host_bytes = atomic_load(&e->ctr.device_to_host);
    out->host_to_nvme_bytes = atomic_load(&e->tiers.ctr.nvme_write_bytes);
    out->host_cache_hits = atomic_load(&e->tiers.ctr.cache_hits);
    out->host_cache_read_bytes = atomic_load(&e->tiers.ctr.cache_read_bytes);
    out->host_cache_held_bytes = atomic_load(&e->tiers.ctr.cache_held_bytes);
    out->norm_passes = atomic_load(&e->ctr.norm_passes);
    out->norm_pass_ns = atomic_load(&e->ctr.norm_pass_ns);
    out->finalize_alloc_ns = e->ctr.finalize_alloc_ns;
    out->finalize_init_ns = e->ctr.finalize_init_ns;
    out->host_cache_bytes = host_cache_bytes(e);
    act_counters ac;
    act_store_counters(e->acts, &ac);
    out->act_pushes = ac.pushes;
    out->act_offload_bytes = ac.offload_bytes;
    out->act_restore_bytes = ac.restore_bytes;
    out->act_stall_ns = ac.stall_ns;
    out->act_kept_peak_bytes = ac.kept_peak_bytes;
    out->act_device_peak_bytes = ac.device_peak_bytes;
    if (e->dev) {
        dev_mem_stats ds;
        dev_mem_stats_get(e->dev, &ds);
        out->device_peak_bytes = ds.peak_bytes;
        out->device_budget_bytes = ds.budget_bytes;
        out->pinned_host_bytes = ds.pinned_bytes + ds.registered_bytes;
    }
    out->host_peak_bytes = e->tiers.host_tier_bytes;
    out->host_budget_bytes = e->finalized ? e->cfg.host_budget_bytes : 0;
    out->rank = e->rank;
    out->world_size = e->world;
    out->comm_bytes = ranks_comm_bytes(e->ranks);
    out->adam_threads = e->cfg.cpu_threads;
    if (e->node)
        adam_cores_format(node_adam_cores(e->node), out->adam_cores, sizeof out->adam_cores);
    if (e->tiers.swap)
        out->nvme_peak_bytes = swap_capacity(e->tiers.swap) - swap_free_bytes(e->tiers.swap);
    memcpy(caller, out, size < sizeof *out ? size : sizeof *out);
    return STRATA_OK;
}
