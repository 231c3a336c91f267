/* Placement: fixed or "auto", fastest first; see plan_auto.h for the order and why. */
#include "engine/plan/plan_auto.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/size.h"

typedef struct candidate {
    strata_tier param, opt;
} candidate;

/* Both classes "auto", fastest first (plan_auto.h says why). */
static const candidate both_auto[] = {
    {STRATA_TIER_DEVICE, STRATA_TIER_DEVICE}, {STRATA_TIER_DEVICE, STRATA_TIER_HOST},
    {STRATA_TIER_HOST, STRATA_TIER_HOST},     {STRATA_TIER_DEVICE, STRATA_TIER_NVME},
    {STRATA_TIER_HOST, STRATA_TIER_NVME},     {STRATA_TIER_NVME, STRATA_TIER_NVME},
};
#define MAX_CANDIDATES (sizeof both_auto / sizeof both_auto[0])

static void appendf(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char *out, size_t len, const char *fmt, ...)
{
    size_t used = strlen(out);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, len - used, fmt, ap);
    va_end(ap);
}

static void name_of(candidate c, char *buf, size_t len)
{
    snprintf(buf, len, "parameters %s + optimizer %s", strata_tier_name(c.param), strata_tier_name(c.opt));
}

/* Why a candidate cannot be tried at all, or NULL. */
static const char *unusable(const strata_config *cfg, const plan_input *in, bool opt_on_device, candidate c)
{
    if (c.opt == STRATA_TIER_DEVICE && !opt_on_device)
        return "the optimizer runs on the CPU, so its state cannot live in GPU memory";
    if (c.param != STRATA_TIER_DEVICE && in->zero_stage != 3)
        return "parameters leave the device only at ZeRO stage 3";
    if (c.param == STRATA_TIER_NVME && cfg->offload_param.nvme_path_count == 0)
        return "offload_param has no nvme_path";
    if (c.opt == STRATA_TIER_NVME && cfg->offload_optimizer.nvme_path_count == 0)
        return "offload_optimizer has no nvme_path";
    return NULL;
}

/* The plan of one placement into *p (in's tiers set to it) and whether it fits. */
static strata_status try_one(const strata_config *cfg, candidate c, plan_input *in, size_t device_budget,
                             size_t host_budget, plan *p)
{
    in->param_tier = c.param;
    in->opt_tier = c.opt;
    in->grad_tier = plan_grad_tier(cfg, c.opt);
    plan_choose_grad_tier(cfg, in, host_budget, p);
    plan_host_cache(cfg, in, host_budget, p);
    return plan_check(p, in, device_budget, host_budget);
}

/* What overflowed in a plan that plan_check refused, short. */
static void why_not(const plan *p, size_t device_budget, size_t host_budget, char *buf, size_t len)
{
    char need[32], allow[32];
    strata_tier t = p->tier_bytes[STRATA_TIER_DEVICE] > device_budget ? STRATA_TIER_DEVICE : STRATA_TIER_HOST;
    size_t budget = t == STRATA_TIER_DEVICE ? device_budget : host_budget;
    if (p->tier_bytes[t] > budget)
        snprintf(buf, len, "needs %s of %s memory, budget %s", size_format(p->tier_bytes[t], need, sizeof need),
                 strata_tier_name(t), size_format(budget, allow, sizeof allow));
    else
        snprintf(buf, len, "the device residency cap is below two of the largest module");
}

/* How far a plan is from fitting: the bytes over budget, device and host together. */
static size_t overflow(const plan *p, size_t device_budget, size_t host_budget)
{
    size_t d = p->tier_bytes[STRATA_TIER_DEVICE], h = p->tier_bytes[STRATA_TIER_HOST];
    return (d > device_budget ? d - device_budget : 0) + (h > host_budget ? h - host_budget : 0);
}

static void fill(plan_placement *out, const plan_input *in)
{
    out->placed = true;
    out->param_tier = in->param_tier;
    out->opt_tier = in->opt_tier;
    out->grad_tier = in->grad_tier;
}

static strata_status place_states(const strata_config *cfg, bool opt_on_device, plan_input *in,
                                  size_t device_budget, size_t host_budget, plan_placement *out, plan *p)
{
    *out = (plan_placement){.asked_param = cfg->offload_param.device, .asked_opt = cfg->offload_optimizer.device};
    bool param_auto = out->asked_param == STRATA_TIER_AUTO, opt_auto = out->asked_opt == STRATA_TIER_AUTO;
    if (out->asked_opt == STRATA_TIER_DEVICE && !opt_on_device)
        return err_set(STRATA_EUNSUPPORTED, "zero_optimization.offload_optimizer.device = \"none\" keeps the "
                       "optimizer state on the GPU, but strata's optimizer runs on the CPU; set it to \"cpu\", "
                       "\"nvme\" or \"auto\"");
    if (!param_auto && !opt_auto) {
        strata_status st = try_one(cfg, (candidate){out->asked_param, out->asked_opt}, in, device_budget, host_budget,
                                   p);
        if (st == STRATA_OK)
            fill(out, in);
        return st;
    }

    /* Both "auto": the table above; one class fixed: the other tries device, host, NVMe. */
    candidate list[MAX_CANDIDATES];
    size_t n = 0;
    if (param_auto && opt_auto) {
        memcpy(list, both_auto, sizeof both_auto);
        n = MAX_CANDIDATES;
    } else {
        for (int t = STRATA_TIER_DEVICE; t <= STRATA_TIER_NVME; t++)
            list[n++] = (candidate){param_auto ? (strata_tier)t : out->asked_param,
                                    opt_auto ? (strata_tier)t : out->asked_opt};
    }

    char tried[PLAN_REASON_BYTES] = "", nm[96], why[128];
    int closest = -1; /* of the candidates whose plan was computed, the one least over its budgets */
    size_t closest_over = 0;
    bool no_nvme = false;
    for (size_t i = 0; i < n; i++) {
        name_of(list[i], nm, sizeof nm);
        const char *skip = unusable(cfg, in, opt_on_device, list[i]);
        if (skip) {
            no_nvme |= strstr(skip, "nvme_path") != NULL;
            appendf(tried, sizeof tried, "%s%s: not tried, %s", tried[0] ? "; " : "", nm, skip);
            continue;
        }
        if (try_one(cfg, list[i], in, device_budget, host_budget, p) == STRATA_OK) {
            fill(out, in);
            snprintf(out->reason, sizeof out->reason, "auto: %s, gradients %s: ", nm,
                     strata_tier_name(in->grad_tier));
            if (tried[0])
                appendf(out->reason, sizeof out->reason, "faster placements ruled out: %s", tried);
            else
                appendf(out->reason, sizeof out->reason, "the fastest placement auto tries, and it fits");
            char b1[32], b2[32];
            if (p->nvme_param_bytes + p->nvme_opt_bytes)
                appendf(out->reason, sizeof out->reason, "; the host cache mirrors %s of the %s on NVMe",
                        size_format(p->cache_param_bytes + p->cache_opt_bytes, b1, sizeof b1),
                        size_format(p->nvme_param_bytes + p->nvme_opt_bytes, b2, sizeof b2));
            return STRATA_OK;
        }
        why_not(p, device_budget, host_budget, why, sizeof why);
        appendf(tried, sizeof tried, "%s%s: %s", tried[0] ? "; " : "", nm, why);
        size_t over = overflow(p, device_budget, host_budget);
        if (closest < 0 || over < closest_over) {
            closest = (int)i;
            closest_over = over;
        }
    }
    const char *hint = no_nvme ? " (NVMe was not tried: give offload_optimizer and offload_param an nvme_path to let "
                                 "auto use a drive)" : "";
    if (closest < 0)
        return err_set(STRATA_EBUDGET, "offload device \"auto\": no placement can be tried: %s%s", tried, hint);
    /* The closest placement's own message: what it needs line by line and which knob to turn. (in and *p are
     * left holding its plan, for a caller that prints it.) */
    char msg[ERR_MSG_BYTES];
    try_one(cfg, list[closest], in, device_budget, host_budget, p);
    snprintf(msg, sizeof msg, "%s", err_last());
    name_of(list[closest], nm, sizeof nm);
    return err_set(STRATA_EBUDGET, "offload device \"auto\" tried every placement and none fits%s; the closest, "
                   "%s: %s [tried: %s]", hint, nm, msg, tried);
}

strata_status plan_place(const strata_config *cfg, bool opt_on_device, plan_input *in, size_t device_budget,
                         size_t host_budget, plan_placement *out, plan *p)
{
    bool act_auto = cfg->offload_activations == STRATA_TIER_AUTO;
    in->act_tier = act_auto ? STRATA_TIER_HOST : cfg->offload_activations;
    in->act_bytes = cfg->offloaded_activation_bytes;
    in->act_max_bytes = plan_act_max_bytes(cfg);
    strata_status st = place_states(cfg, opt_on_device, in, device_budget, host_budget, out, p);
    const char *paths[PLAN_MAX_SWAP_PATHS];
    if (act_auto && st == STRATA_EBUDGET && plan_swap_paths(cfg, paths) > 0) {
        err_clear();
        in->act_tier = STRATA_TIER_NVME;
        st = place_states(cfg, opt_on_device, in, device_budget, host_budget, out, p);
    }
    out->asked_act = cfg->offload_activations;
    out->act_tier = in->act_tier;
    return st;
}
