/* strata_stats_get: what each part of the engine counted, in one snapshot. */
#include <string.h>

#include "engine/engine.h"
#include "engine/ranks.h"
#include "engine/train_step.h"

STRATA_API strata_status strata_stats_get(strata_engine *e, strata_stats *out)
{
    if (!e || !out)
        return err_set(STRATA_EINVAL, "strata_stats_get: engine and out must not be NULL");
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
    out->nvme_to_host_bytes = atomic_load(&e->ctr.nvme_to_host);
    out->host_to_device_bytes = atomic_load(&e->ctr.host_to_device);
    out->device_to_host_bytes = atomic_load(&e->ctr.device_to_host);
    out->host_to_nvme_bytes = atomic_load(&e->ctr.host_to_nvme);
    if (e->dev) {
        dev_mem_stats ds;
        dev_mem_stats_get(e->dev, &ds);
        out->device_peak_bytes = ds.peak_bytes;
        out->device_budget_bytes = ds.budget_bytes;
    }
    out->host_peak_bytes = e->tiers.host_tier_bytes;
    out->host_budget_bytes = e->finalized ? e->cfg.host_budget_bytes : 0;
    out->rank = e->rank;
    out->world_size = e->world;
    out->comm_bytes = ranks_comm_bytes(e->ranks);
    if (e->tiers.swap)
        out->nvme_peak_bytes = swap_capacity(e->tiers.swap) - swap_free_bytes(e->tiers.swap);
    return STRATA_OK;
}
