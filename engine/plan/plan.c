#include "engine/plan/plan.h"
#include "engine/step/step.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/size.h"
#include "base/util.h"
#include "cpu_adam/moments_convert.h"
#include "gpu/device.h"

#define PLAN_STR_(x) #x
#define PLAN_STR(x) PLAN_STR_(x) /* the value of a macro as a string literal */

strata_tier plan_grad_tier(const strata_config *cfg, strata_tier opt_tier)
{
    return opt_tier == STRATA_TIER_NVME && cfg->gradients_on_nvme == STRATA_SWITCH_ON ? STRATA_TIER_NVME
                                                                                        : STRATA_TIER_HOST;
}

void plan_choose_grad_tier(const strata_config *cfg, plan_input *in, size_t host_budget, plan *out)
{
    plan_compute(in, out);
    if (cfg->gradients_on_nvme != STRATA_SWITCH_AUTO || in->opt_tier != STRATA_TIER_NVME ||
        out->tier_bytes[STRATA_TIER_HOST] <= host_budget)
        return;
    in->grad_tier = STRATA_TIER_NVME;
    plan_compute(in, out);
}

int plan_swap_paths(const strata_config *cfg, const char *paths[PLAN_MAX_SWAP_PATHS])
{
    int n = 0;
    const strata_offload_config *blocks[2] = {&cfg->offload_optimizer, &cfg->offload_param};
    /* Offloaded activations have no path of their own: they share the swap space of both blocks. */
    bool acts = cfg->offload_activations == STRATA_TIER_NVME || cfg->offload_activations == STRATA_TIER_AUTO;
    for (int b = 0; b < 2; b++) {
        if (blocks[b]->device != STRATA_TIER_NVME && blocks[b]->device != STRATA_TIER_AUTO && !acts)
            continue;
        for (int i = 0; i < blocks[b]->nvme_path_count; i++) {
            bool seen = false;
            for (int j = 0; j < n; j++)
                seen |= strcmp(paths[j], blocks[b]->nvme_path[i]) == 0;
            if (!seen)
                paths[n++] = blocks[b]->nvme_path[i];
        }
    }
    return n;
}

void plan_windows(const strata_config *cfg, size_t param_bytes, size_t *prefetch_bytes, size_t *max_live_bytes)
{
    *prefetch_bytes = cfg->prefetch_bytes ? cfg->prefetch_bytes : cfg->prefetch_bucket_size * param_bytes;
    *max_live_bytes = cfg->max_live_bytes ? cfg->max_live_bytes : cfg->max_live_parameters * param_bytes;
}

size_t plan_act_max_bytes(const strata_config *cfg)
{
    return cfg->offloaded_activation_max_bytes ? cfg->offloaded_activation_max_bytes
                                               : cfg->offloaded_activation_bytes;
}

size_t plan_act_window_bytes(size_t max_bytes)
{
    return PLAN_ACT_RESTORED * align_up(max_bytes, DEV_ALIGN_BYTES);
}

size_t plan_host_budget(const strata_config *cfg)
{
    if (cfg->host_budget_bytes)
        return cfg->host_budget_bytes;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 4 * 3 : (size_t)8 << 30;
}

size_t plan_module_layout(const size_t *param_numel, const uint32_t *group, size_t nparams, size_t *offsets,
                          size_t *used_numel)
{
    size_t in = 0;
    for (size_t j = 0; j < nparams; j++) {
        bool new_group = group && j > 0 && group[j] != group[j - 1];
        in = align_up(in, new_group ? PLAN_GROUP_ALIGN : PLAN_PARAM_ALIGN);
        if (offsets)
            offsets[j] = in;
        in += param_numel[j];
    }
    if (used_numel)
        *used_numel = in;
    return align_up(MAX(in, (size_t)1), PLAN_MODULE_ALIGN);
}

static void add(plan *p, const char *what, strata_tier tier, size_t bytes, bool pinned)
{
    if (bytes == 0 || p->nlines >= PLAN_MAX_LINES)
        return;
    p->lines[p->nlines++] = (plan_line){what, tier, bytes, pinned};
    p->tier_bytes[tier] += bytes;
    if (pinned)
        p->pinned_pool_bytes += bytes;
}

size_t plan_opt_elem_bytes(strata_moments moments)
{
    return 4 + 2 * moments_elem_bytes(moments);
}

size_t plan_moment_scale_bytes(strata_moments moments, size_t numel)
{
    return 2 * 4 * moments_scale_count(moments, numel);
}

static const char *opt_line(strata_moments moments)
{
    return moments == STRATA_MOMENTS_BF16   ? "master weights (fp32) + Adam moments (bf16)"
           : moments == STRATA_MOMENTS_8BIT ? "master weights (fp32) + Adam moments (8-bit)"
                                            : "master weights + Adam moments (fp32)";
}

void plan_class_numel(const plan_input *in, size_t *param_numel, size_t *grad_numel, size_t *opt_numel)
{
    size_t n = in->total_numel, shard = n;
    if (in->world_size > 1)
        shard = in->shard_numel ? in->shard_numel
                                : align_up((n + (size_t)in->world_size - 1) / (size_t)in->world_size, PLAN_MODULE_ALIGN);
    size_t trained = n, trained_shard = shard;
    if (in->frozen) {
        trained = in->trained_numel;
        trained_shard = in->world_size > 1 ? in->shard_trained_numel : trained;
    }
    *opt_numel = in->zero_stage >= 1 ? trained_shard : trained;
    *grad_numel = in->zero_stage >= 2 ? trained_shard : trained;
    *param_numel = in->zero_stage >= 3 ? shard : n;
}

void plan_compute(const plan_input *in, plan *p)
{
    *p = (plan){0};
    size_t n = in->total_numel, big = in->largest_module_numel * in->param_bytes;
    size_t nparam = in->delayed ? 2 : 1, ngrad = in->delayed ? 2 : 1;
    size_t np, ng, no;
    plan_class_numel(in, &np, &ng, &no);
    /* The optimizer walks only this rank's slice, so its sub-groups are cut from that. */
    size_t sg = MIN(in->sub_group_numel, no);
    /* A speculating step in backward keeps the gradients its updates took: with ranks, the reduced fp32 parts. */
    size_t kept_bytes = in->world_size > 1 ? 4 : in->param_bytes;

    add(p, in->delayed ? "parameters (2 copies: delayed update)" : "parameters", in->param_tier,
        np * in->param_bytes * nparam, false);
    size_t opt_elem = plan_opt_elem_bytes(in->moments);
    add(p, opt_line(in->moments), in->opt_tier, no * opt_elem, false);
    add(p, "Adam moments' 8-bit block scales", STRATA_TIER_HOST, plan_moment_scale_bytes(in->moments, no), false);
    if (in->speculate) {
        add(p, "master weights + Adam moments: the copy a step in backward rolls back to", in->opt_tier,
            no * opt_elem, false);
        add(p, "Adam moments' 8-bit block scales: the copy a step in backward rolls back to", STRATA_TIER_HOST,
            plan_moment_scale_bytes(in->moments, no), false);
        p->kept_tier = in->opt_tier; /* on NVMe only if the host budget cannot hold them (plan_host_cache) */
        if (in->keep_grads && in->opt_tier != STRATA_TIER_NVME)
            add(p, "gradients kept for a redo (clipped step in backward)", in->opt_tier, no * kept_bytes, false);
    }
    /* The device share's state (unless it is the device-tier arrays), its gradients, and a parameter scratch unless
     * the step writes parameters straight into device-tier ones (not a rank's host shard of them: np != no). */
    size_t share_elem = (in->opt_tier == STRATA_TIER_DEVICE ? 4 : 16) +
                        (in->param_tier == STRATA_TIER_DEVICE && np == no ? 0 : in->param_bytes);
    add(p, "Twin-Flow share (ratio): master, m, v, grads",
        STRATA_TIER_DEVICE, in->opt_device_numel * share_elem, false);
    if (!in->step_in_backward)
        add(p, in->delayed ? "gradient stores (2, fp32)" : "gradient store (fp32)", in->grad_tier, ng * 4 * ngrad,
            false);
    if (in->world_size > 1) {
        /* The collectives' own memory (engine/ranks/ranks.c): stage 1 reduce-scatters the full gradient store into a
         * shard store the optimizer reads; stages 1 and 2 update a shard of the parameters before all-gathering
         * it; one module's gradients (fp32, whole and this rank's part) and parameters are scratch. */
        if (in->zero_stage == 1)
            add(p, "gradient store (this rank's shard, fp32)", in->grad_tier, no * 4, false);
        if (in->zero_stage == 1 || in->zero_stage == 2)
            add(p, "parameters (this rank's shard)", STRATA_TIER_HOST, no * in->param_bytes, false);
        add(p, "collective scratch (one module)", STRATA_TIER_HOST, in->largest_module_numel * (8 + in->param_bytes),
            false);
        if (in->zero_stage >= 2) /* grads.c: HANDOFF_SLOTS reduce-scatters in flight, whole and part, fp32 */
            add(p, "gradient reduce-scatters in flight (2)", STRATA_TIER_HOST, 2 * in->largest_module_numel * 8,
                false);
    }

    /* On the device: the modules the trainer holds and the prefetch window (when parameters are
     * not resident anyway), and one module's gradient buffers. */
    if (in->param_tier != STRATA_TIER_DEVICE) {
        /* Never more than the whole model: a small model needs no default-sized window. */
        size_t window = MAX(2 * big, MIN(MIN(in->max_live_bytes, in->prefetch_bytes + 2 * big), n * in->param_bytes));
        p->live_window_bytes += window;
        add(p, "fetched modules + prefetch window", STRATA_TIER_DEVICE, window, false);
    }
    /* Gradient buffers and their staging are a trained module's: frozen ones take none. */
    size_t grad_big = (in->frozen ? in->largest_trained_numel : in->largest_module_numel) * in->param_bytes;
    p->live_window_bytes += grad_big;
    add(p, "gradient buffers of one module", STRATA_TIER_DEVICE, grad_big, false);
    add(p, "trainer activations (strata.activation_bytes)", STRATA_TIER_DEVICE, in->activation_bytes, false);
    if (in->act_tier == STRATA_TIER_HOST || in->act_tier == STRATA_TIER_NVME) {
        size_t one = align_up(in->act_max_bytes, PLAN_ACT_ALIGN);
        p->act_window_bytes = plan_act_window_bytes(in->act_max_bytes);
        add(p, "offloaded activations (strata.offload_activations.bytes)", in->act_tier,
            align_up(in->act_bytes, PLAN_ACT_ALIGN), false);
        add(p, "restored activations (" PLAN_STR(PLAN_ACT_RESTORED) " x the largest)", STRATA_TIER_DEVICE,
            p->act_window_bytes, false);
        if (in->act_tier == STRATA_TIER_NVME)
            add(p, "pinned: activation staging (" PLAN_STR(PLAN_ACT_STAGING) " x the largest)", STRATA_TIER_HOST,
                PLAN_ACT_STAGING * one, false);
    }

    /* The pinned pool: staging for fetches from NVMe, gradient hand-offs, and the optimizer's
     * four sub-group slots (read k+1, compute k, write k-1 and k-2). */
    size_t *part = p->pool_part_bytes;
    if (in->param_tier == STRATA_TIER_NVME)
        part[0] = MIN(in->prefetch_bytes, n * in->param_bytes) + 2 * big;
    part[1] = 2 * grad_big;
    bool grad_nvme = in->grad_tier == STRATA_TIER_NVME && !in->step_in_backward;
    part[2] = grad_nvme ? grad_big / in->param_bytes * 4 : 0;
    size_t pstage = in->param_tier != STRATA_TIER_HOST ? sg * in->param_bytes : 0;
    size_t slot = (in->opt_tier == STRATA_TIER_NVME ? opt_elem * sg : 0) + (grad_nvme ? 4 * sg : 0);
    size_t kept = in->keep_grads && in->opt_tier == STRATA_TIER_NVME ? sg * kept_bytes : 0;
    part[3] = in->step_in_backward ? slot + pstage + kept : STEP_SLOTS * slot + 2 * pstage;
    add(p, "pinned: NVMe fetch staging", STRATA_TIER_HOST, part[0], true);
    add(p, "pinned: gradient staging", STRATA_TIER_HOST, part[1], true);
    add(p, "pinned: gradient accumulation (NVMe)", STRATA_TIER_HOST, part[2], true);
    add(p, in->step_in_backward ? "pinned: step in backward: master, m, v of one piece + parameter staging"
                                : "pinned: optimizer slots (" PLAN_STR(STEP_SLOTS) ") + parameter staging (2)",
        STRATA_TIER_HOST, part[3], true);
}

void plan_host_cache(const strata_config *cfg, const plan_input *in, size_t host_budget, plan *p)
{
    size_t np, ng, no;
    plan_class_numel(in, &np, &ng, &no);
    size_t copies = in->delayed ? 2 : 1;
    p->nvme_param_bytes = in->param_tier == STRATA_TIER_NVME ? np * in->param_bytes * copies : 0;
    p->nvme_opt_bytes = in->opt_tier == STRATA_TIER_NVME ? no * plan_opt_elem_bytes(in->moments) : 0;
    size_t used = p->tier_bytes[STRATA_TIER_HOST];
    size_t left = used < host_budget ? host_budget - used : 0;
    size_t max_params = cfg->param_max_in_cpu > SIZE_MAX / (in->param_bytes * copies)
                            ? SIZE_MAX : cfg->param_max_in_cpu * in->param_bytes * copies;
    p->cache_param_bytes = cfg->host_cache ? MIN(MIN(p->nvme_param_bytes, max_params), left) : 0;
    left -= p->cache_param_bytes;
    if (p->cache_param_bytes)
        add(p, "host cache of NVMe parameters", STRATA_TIER_HOST, p->cache_param_bytes, false);
    /* A speculating step in backward's kept gradients, when the optimizer state is on NVMe: with the host cache on,
     * in host memory if the budget holds them once the parameters (read twice a step: the better use of a byte) are
     * mirrored, which saves their NVMe write every step; else on NVMe. */
    if (in->keep_grads && in->opt_tier == STRATA_TIER_NVME) {
        size_t kept = no * (in->world_size > 1 ? 4 : in->param_bytes);
        p->kept_tier = cfg->host_cache && kept <= left ? STRATA_TIER_HOST : STRATA_TIER_NVME;
        left -= p->kept_tier == STRATA_TIER_HOST ? kept : 0;
        add(p, "gradients kept for a redo (clipped step in backward)", p->kept_tier, kept, false);
    }
    /* A speculating step in backward's copies of the optimizer state trade places every step: not cached. */
    p->cache_opt_bytes = cfg->host_cache && !in->speculate ? MIN(p->nvme_opt_bytes, left) : 0;
    if (p->cache_opt_bytes)
        add(p, "host cache of NVMe optimizer state", STRATA_TIER_HOST, p->cache_opt_bytes, false);
}

static strata_status over(const plan *p, strata_tier tier, size_t budget, const plan_input *in, const char *knob,
                          const char *hint)
{
    char need[32], allow[32], lines[768];
    size_t used = 0;
    lines[0] = '\0';
    for (int i = 0; i < p->nlines && used < sizeof lines; i++) {
        char b[32];
        if (p->lines[i].tier != tier)
            continue;
        used += (size_t)snprintf(lines + used, sizeof lines - used, "%s%s %s", used ? ", " : "", p->lines[i].what,
                                 size_format(p->lines[i].bytes, b, sizeof b));
    }
    /* In a world of ranks every rank checks its own plan against its own budgets; say so, since the
     * numbers are one rank's share, not the model's. */
    char world[96] = "";
    if (in->world_size > 1)
        snprintf(world, sizeof world, " (budgets and plan are per rank, in a world of %d at ZeRO stage %d)",
                 in->world_size, in->zero_stage);
    return err_set(STRATA_EBUDGET, "%s budget exceeded: the plan needs %s (%s) but %s allows %s; %s%s",
                   strata_tier_name(tier), size_format(p->tier_bytes[tier], need, sizeof need), lines, knob,
                   size_format(budget, allow, sizeof allow), hint, world);
}

strata_status plan_check(const plan *p, const plan_input *in, size_t device_budget, size_t host_budget)
{
    size_t big = in->largest_module_numel * in->param_bytes;
    if (in->param_tier != STRATA_TIER_DEVICE && in->max_live_bytes < 2 * big) {
        char a[32], b[32];
        return err_set(STRATA_EBUDGET, "the device residency cap (strata.max_live_bytes or "
                       "zero_optimization.stage3_max_live_parameters) allows %s but the largest module needs %s to "
                       "be held while the next one is fetched; raise the cap",
                       size_format(in->max_live_bytes, a, sizeof a), size_format(2 * big, b, sizeof b));
    }
    if (p->tier_bytes[STRATA_TIER_DEVICE] > device_budget)
        return over(p, STRATA_TIER_DEVICE, device_budget, in, "strata.device_budget_bytes",
                    in->param_tier == STRATA_TIER_DEVICE
                        ? "raise strata.device_budget_bytes, or set zero_optimization.offload_param.device to \"cpu\" "
                          "or \"nvme\""
                        : "raise strata.device_budget_bytes or lower zero_optimization.stage3_prefetch_bucket_size");
    if (p->tier_bytes[STRATA_TIER_HOST] > host_budget)
        return over(p, STRATA_TIER_HOST, host_budget, in, "strata.host_budget_bytes",
                    "raise strata.host_budget_bytes, move state to NVMe (offload_optimizer.device / "
                    "offload_param.device = \"nvme\"), or lower zero_optimization.sub_group_size");
    return STRATA_OK;
}
