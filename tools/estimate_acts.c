/* `strata estimate`'s activations block: see estimate_acts.h. */
#include "tools/estimate_acts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/size.h"
#include "model/gpt_engine.h"

const cli_opt estimate_acts_opts[ESTIMATE_ACTS_NOPTS] = {
    {.name = "--seq-len", .kind = CLI_INT, .offset = offsetof(estimate_acts, seq_len), .lo = 1, .hi = 1 << 24,
     .meta = "T", .help = "tokens per sequence, {} (default the model's context)"},
    {.name = "--activation-checkpointing", .kind = CLI_SWITCH, .offset = offsetof(estimate_acts, checkpointing),
     .help = "each block keeps only its input; backward runs its forward again"},
    {.name = "--offload-activations", .kind = CLI_CHOICE, .offset = offsetof(estimate_acts, offload),
     .choices = "host|nvme|auto", .meta = "host|nvme|auto",
     .help = "checkpointing, the block inputs kept off the device (strata.offload_activations; nvme needs an "
             "nvme_path in the config)"},
};

static const char *const mode_names[] = {"every activation", "checkpointing", "checkpointing + offload"};

static strata_tier offload_tier(const strata_config *cfg)
{
    return cfg->offload_activations == STRATA_TIER_DEVICE ? STRATA_TIER_HOST : cfg->offload_activations;
}

bool estimate_acts_apply(estimate_acts *a, const gpt_dims *dims, strata_config *cfg)
{
    a->mode = a->offload >= 0 ? GPT_ACT_OFFLOAD : a->checkpointing ? GPT_ACT_CHECKPOINT : GPT_ACT_KEEP;
    if (!a->seq_len)
        a->seq_len = dims->seq;
    if (a->seq_len > dims->seq) {
        fprintf(stderr, "strata estimate: --seq-len %d is longer than the model's context %d\n", a->seq_len,
                dims->seq);
        return false;
    }
    if (a->mode == GPT_ACT_OFFLOAD)
        cfg->offload_activations = offload_tier(cfg);
    a->base = *cfg; /* the table's other ways start from the config as given */
    if (a->active)
        gpt_engine_reserve(dims, a->batch, a->seq_len, 1, a->mode, cfg);
    return true;
}

/* Whether batch sequences fit the budgets in mode, placed as finalize places, sized as strata train sizes them from
 * the config as given (base). */
static bool fits(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, const strata_config *base,
                 const plan_input *in, bool opt_on_device)
{
    strata_config c = *base;
    c.offload_activations = mode == GPT_ACT_OFFLOAD ? offload_tier(base) : STRATA_TIER_DEVICE;
    gpt_engine_reserve(d, batch, seq, 1, mode, &c);
    plan_input i = *in;
    i.activation_bytes = c.activation_bytes;
    plan p;
    plan_placement pp;
    bool ok = plan_place(&c, opt_on_device, &i, c.device_budget_bytes, plan_host_budget(&c), &pp, &p) == STRATA_OK;
    err_clear();
    return ok;
}

/* The largest batch that fits (0: not even one), by bisection: memory grows with the batch. */
static int largest_batch(const gpt_dims *d, int seq, gpt_act_mode mode, const strata_config *cfg,
                         const plan_input *in, bool opt_on_device)
{
    int lo = 0, hi = 1;
    while (hi < (1 << 20) && fits(d, hi, seq, mode, cfg, in, opt_on_device))
        lo = hi, hi *= 2;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (fits(d, mid, seq, mode, cfg, in, opt_on_device))
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

void estimate_acts_print(const estimate_acts *a, const gpt_dims *dims, const strata_config *cfg, const plan_input *in,
                         bool opt_on_device)
{
    char b1[32], b2[32], b3[32];
    int T = a->seq_len;
    gpt_act_format fmt = gpt_engine_config_acts(cfg);
    size_t one = gpt_block_input_bytes(dims, a->batch, T, fmt);
    printf("\nACTIVATIONS of a micro-batch of %d x %d tokens (%s%s), as strata train keeps them; each block input "
           "is %s\n", a->batch, T, gpt_act_format_name(fmt),
           cfg->param_dtype == STRATA_DTYPE_FP32 ? "" : ", with the fp32 conversion buffers",
           size_format(one, b1, sizeof b1));
    printf("%-25s %14s %14s %12s  %s\n", "KEPT", "ON DEVICE", "OFFLOADED", "BATCH FITS",
           cfg->device_budget_bytes ? "largest batch of this seq-len within the budgets" : "(no device budget given)");
    for (int m = GPT_ACT_KEEP; m <= GPT_ACT_OFFLOAD; m++) {
        size_t dev = gpt_engine_activation_bytes(dims, a->batch, T, 1, (gpt_act_mode)m, fmt, cfg->param_dtype),
               kept = 0, largest = 0;
        if (m == GPT_ACT_OFFLOAD) {
            gpt_engine_offload_bytes(dims, a->batch, T, 1, fmt, &kept, &largest);
            dev += plan_act_window_bytes(largest);
        }
        char fit[32] = "-";
        if (cfg->device_budget_bytes)
            snprintf(fit, sizeof fit, "%d", largest_batch(dims, T, (gpt_act_mode)m, &a->base, in, opt_on_device));
        printf("%-25s %14s %14s %12s%s\n", mode_names[m], size_format(dev, b2, sizeof b2),
               m == GPT_ACT_OFFLOAD ? size_format(kept, b3, sizeof b3) : "-", fit,
               m == (int)a->mode ? "  <- the plan above" : "");
    }
    if (a->mode == GPT_ACT_OFFLOAD)
        printf("(offloaded: %d block inputs to %s; the device holds %d of them while restoring)\n", dims->layers,
               strata_tier_name(offload_tier(cfg)), PLAN_ACT_RESTORED);
}
