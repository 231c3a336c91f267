/* `strata estimate`'s advice for a plan that does not fit: see estimate_moves.h. */
#include "tools/estimate_moves.h"

#include <stdio.h>

#include "base/error.h"
#include "base/size.h"
#include "engine/plan/plan_auto.h"

enum { CLASS_OPT, CLASS_GRAD, CLASS_PARAM };

typedef struct move_rule {
    int cls;
    strata_tier from, to;
    const char *what, *setting;
} move_rule;

/* Cheapest first (estimate_moves.h says why). The gradient store leaves host memory only for NVMe, and only beside
 * an optimizer state there (plan_grad_tier). */
static const move_rule rules[] = {
    {CLASS_OPT, STRATA_TIER_DEVICE, STRATA_TIER_HOST, "the optimizer state to host memory",
     "zero_optimization.offload_optimizer.device = \"cpu\""},
    {CLASS_OPT, STRATA_TIER_HOST, STRATA_TIER_NVME, "the optimizer state to NVMe",
     "zero_optimization.offload_optimizer.device = \"nvme\""},
    {CLASS_GRAD, STRATA_TIER_HOST, STRATA_TIER_NVME, "the gradient store to NVMe", "strata.gradients_on_nvme = true"},
    {CLASS_PARAM, STRATA_TIER_DEVICE, STRATA_TIER_HOST, "the parameters to host memory",
     "zero_optimization.offload_param.device = \"cpu\""},
    {CLASS_PARAM, STRATA_TIER_HOST, STRATA_TIER_NVME, "the parameters to NVMe",
     "zero_optimization.offload_param.device = \"nvme\""},
};
#define NRULES (sizeof rules / sizeof rules[0])

static strata_tier tier_of(const plan_input *in, int cls)
{
    return cls == CLASS_OPT ? in->opt_tier : cls == CLASS_GRAD ? in->grad_tier : in->param_tier;
}

/* The first rule that relieves a tier that overflows, or NULL. */
static const move_rule *next_rule(const plan_input *in, const plan *p, size_t device_budget, size_t host_budget)
{
    bool over[2] = {p->tier_bytes[STRATA_TIER_DEVICE] > device_budget, p->tier_bytes[STRATA_TIER_HOST] > host_budget};
    for (size_t i = 0; i < NRULES; i++) {
        const move_rule *r = &rules[i];
        if (tier_of(in, r->cls) != r->from || !over[r->from])
            continue;
        if (r->cls == CLASS_GRAD && in->opt_tier != STRATA_TIER_NVME)
            continue;
        if (r->cls == CLASS_PARAM && in->zero_stage != 3)
            continue;
        return r;
    }
    return NULL;
}

int estimate_moves_find(const strata_config *cfg, const plan_input *in, bool opt_on_device, size_t device_budget,
                        size_t host_budget, estimate_move moves[ESTIMATE_MAX_MOVES])
{
    /* The placement as fixed devices, so that plan_place computes exactly it. */
    strata_config c = *cfg;
    plan_input cur = *in;
    c.offload_param.device = in->param_tier;
    c.offload_optimizer.device = in->opt_tier;
    if (in->grad_tier == STRATA_TIER_NVME)
        c.gradients_on_nvme = STRATA_SWITCH_ON;
    plan p;
    plan_placement pp;
    bool fits = plan_place(&c, opt_on_device, &cur, device_budget, host_budget, &pp, &p) == STRATA_OK;
    int n = 0;
    const move_rule *r;
    while (!fits && n < ESTIMATE_MAX_MOVES && (r = next_rule(&cur, &p, device_budget, host_budget))) {
        if (r->cls == CLASS_OPT)
            c.offload_optimizer.device = r->to;
        else if (r->cls == CLASS_PARAM)
            c.offload_param.device = r->to;
        else
            c.gradients_on_nvme = STRATA_SWITCH_ON;
        fits = plan_place(&c, opt_on_device, &cur, device_budget, host_budget, &pp, &p) == STRATA_OK;
        const strata_offload_config *block = r->cls == CLASS_PARAM ? &c.offload_param : &c.offload_optimizer;
        moves[n++] = (estimate_move){
            .what = r->what, .setting = r->setting, .param_tier = cur.param_tier, .opt_tier = cur.opt_tier,
            .grad_tier = cur.grad_tier, .device_bytes = p.tier_bytes[STRATA_TIER_DEVICE],
            .host_bytes = p.tier_bytes[STRATA_TIER_HOST], .fits = fits,
            .needs = r->to == STRATA_TIER_NVME && block->nvme_path_count == 0
                         ? r->cls == CLASS_PARAM ? "zero_optimization.offload_param.nvme_path"
                                                 : "zero_optimization.offload_optimizer.nvme_path"
                         : NULL};
    }
    err_clear(); /* the tries' messages are not the command's */
    return n;
}

/* "27.10 GiB of 78.00 GiB", or the bytes alone under an unknown budget. */
static const char *against(size_t bytes, size_t budget, char *buf, size_t len)
{
    char b1[32], b2[32];
    if (budget == SIZE_MAX)
        snprintf(buf, len, "%s", size_format(bytes, b1, sizeof b1));
    else
        snprintf(buf, len, "%s of %s", size_format(bytes, b1, sizeof b1), size_format(budget, b2, sizeof b2));
    return buf;
}

void estimate_moves_print(const estimate_move *moves, int n, size_t device_budget, size_t host_budget)
{
    if (n == 0) {
        printf("moves   none left: no state class on a full tier can move to a slower one (parameters leave the "
               "device only at ZeRO stage 3); raise the budget\n");
        return;
    }
    printf("moves   cheapest first (the optimizer state, then the gradients, then the parameters), each with the ones "
           "above it:\n");
    for (int i = 0; i < n; i++) {
        const estimate_move *m = &moves[i];
        char dev[64], host[64];
        printf("        %d. %s (%s%s%s): then parameters %s + optimizer %s, gradients %s: device %s, host %s: %s\n",
               i + 1, m->what, m->setting, m->needs ? ", with " : "", m->needs ? m->needs : "",
               strata_tier_name(m->param_tier), strata_tier_name(m->opt_tier), strata_tier_name(m->grad_tier),
               against(m->device_bytes, device_budget, dev, sizeof dev),
               against(m->host_bytes, host_budget, host, sizeof host), m->fits ? "fits" : "does not fit yet");
    }
}

json_t *estimate_moves_json(const estimate_move *moves, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        const estimate_move *m = &moves[i];
        json_array_append_new(a, json_pack("{s:s, s:s, s:s?, s:s, s:s, s:s, s:I, s:I, s:b}", "move", m->what,
                                           "setting", m->setting, "needs", m->needs, "params",
                                           strata_tier_name(m->param_tier), "optimizer", strata_tier_name(m->opt_tier),
                                           "gradients", strata_tier_name(m->grad_tier), "device_bytes",
                                           (json_int_t)m->device_bytes, "host_bytes", (json_int_t)m->host_bytes,
                                           "fits", m->fits));
    }
    return a;
}
