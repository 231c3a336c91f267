/* `strata estimate`: the memory plan per tier for a model shape and a config, without allocating. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "base/size.h"
#include "base/util.h"
#include "engine/plan.h"
#include "engine/plan_auto.h"
#include "engine/plan_ranks.h"
#include "engine/twin_flow.h"
#include "gpu/device.h"
#include "strata.h"
#include "tools/cli.h"
#include "tools/estimate_acts.h"
#include "tools/estimate_ranks.h"
#include "tools/gpt_shape.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata estimate [--model PRESET] [--layers N] [--hidden N] [--heads N] [--vocab N] [--seq N]\n"
            "                       [--config FILE] [--device-budget SIZE] [--host-budget SIZE]\n\n"
            "Prints how many bytes each tier (device, host, NVMe) needs to train a GPT-style model with the\n"
            "config, with the largest module and the prefetch window in flight, and whether the budgets hold it.\n"
            "With zero_optimization.offload_param.device or offload_optimizer.device \"auto\" in the config it\n"
            "places them as training would (the fastest placement that fits the budgets) and says why.\n"
            "Nothing is allocated. Presets: %s (default 1.5B); --layers, --hidden, --heads, --vocab and --seq\n"
            "change those dimensions of the preset, or describe a model of their own with --layers and --hidden.\n"
            "SIZE takes bytes or strings like 2GiB.\n\n%s\n%s", gpt_preset_names(), estimate_ranks_usage,
            estimate_acts_usage);
}

static bool parse_int(const char *flag, const char *text, int *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (*end || v <= 0 || v > 1000000) {
        fprintf(stderr, "strata estimate: %s \"%s\" must be a whole number in [1, 1000000]\n", flag, text);
        return false;
    }
    *out = (int)v;
    return true;
}

/* The smallest free space among the NVMe paths of the config, or 0 when none can be read. */
static size_t nvme_free(const strata_config *cfg)
{
    size_t best = 0;
    bool any = false;
    const char *paths[PLAN_MAX_SWAP_PATHS];
    int n = plan_swap_paths(cfg, paths);
    for (int i = 0; i < n; i++) {
        struct statvfs v;
        if (statvfs(paths[i], &v) == 0) {
            size_t f = (size_t)v.f_bavail * v.f_frsize;
            best = any ? MIN(best, f) : f;
            any = true;
        }
    }
    return best;
}

/* The shape to estimate: preset with the dimensions given in custom changed (named e.g. "124M, seq 512"), the
 * default preset when nothing is given, or custom alone when it has --layers and --hidden; NULL with a message. */
static const gpt_shape *settle_shape(const gpt_shape *preset, gpt_shape *custom, char *name, size_t name_bytes)
{
    static const char *flags[] = {"layers", "heads", "hidden", "vocab", "seq"};
    int *given[] = {&custom->layers, &custom->heads, &custom->hidden, &custom->vocab, &custom->seq};
    bool any = false;
    for (int i = 0; i < 5; i++)
        any |= *given[i] != 0;
    if (!any)
        return preset ? preset : gpt_preset("1.5B");
    if (!preset && (!custom->layers || !custom->hidden)) {
        fprintf(stderr, "strata estimate: a model of its own needs --layers and --hidden (--heads, --vocab 50257 and "
                "--seq 1024 are optional); to change one dimension of a preset, name it: e.g. --model 124M --seq 512 "
                "(presets: %s)\n", gpt_preset_names());
        return NULL;
    }
    gpt_shape base = preset ? *preset : (gpt_shape){"custom", 0, 0, 0, 50257, 1024};
    const int *base_dims[] = {&base.layers, &base.heads, &base.hidden, &base.vocab, &base.seq};
    size_t used = (size_t)snprintf(name, name_bytes, "%s", base.name);
    for (int i = 0; i < 5; i++) {
        if (*given[i] && preset && used < name_bytes)
            used += (size_t)snprintf(name + used, name_bytes - used, ", %s %d", flags[i], *given[i]);
        if (!*given[i])
            *given[i] = *base_dims[i];
    }
    custom->name = name;
    if (custom->heads && custom->hidden % custom->heads) {
        fprintf(stderr, "strata estimate: --hidden %d is not a multiple of %d heads; give --heads that divides it\n",
                custom->hidden, custom->heads);
        return NULL;
    }
    return custom;
}

/* Below the tier table: for each tier that does not fit, which budget and which knob (the planner's own words). */
static void print_misfits(const plan *p, const plan_input *in, const size_t budgets[3])
{
    char b1[32], b2[32];
    for (int t = 0; t < 3; t++) {
        if (!budgets[t] || p->tier_bytes[t] <= budgets[t])
            continue;
        if (t == STRATA_TIER_NVME) {
            printf("why     nvme: the plan needs %s on NVMe but the emptiest nvme_path has %s free; free space there or "
                   "add paths (zero_optimization.offload_optimizer.nvme_path / offload_param.nvme_path take a list, "
                   "striped)\n", size_format(p->tier_bytes[t], b1, sizeof b1), size_format(budgets[t], b2, sizeof b2));
            continue;
        }
        plan_input only = *in;
        only.max_live_bytes = SIZE_MAX; /* the residency cap is not a tier's budget */
        if (plan_check(p, &only, t == STRATA_TIER_DEVICE ? budgets[t] : SIZE_MAX,
                       t == STRATA_TIER_HOST ? budgets[t] : SIZE_MAX) != STRATA_OK)
            printf("why     %s: %s\n", strata_tier_name((strata_tier)t), strata_last_error(NULL));
    }
}

int cmd_estimate(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    /* The dimensions given on the command line (0 = not given) change those of --model's preset, or of none. */
    gpt_shape custom = {"custom", 0, 0, 0, 0, 0};
    const gpt_shape *preset = NULL;
    strata_config cfg;
    strata_config_init(&cfg);
    size_t dev_budget = 0, host_budget = 0;
    estimate_ranks ranks = ESTIMATE_RANKS_INIT;
    estimate_acts acts = ESTIMATE_ACTS_INIT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool used;
        int took = estimate_acts_option(&acts, a, v, &used);
        if (took < 0)
            return CLI_EXIT_USAGE;
        if (took) {
            i += used;
            continue;
        }
        if (strcmp(a, "--json") == 0) {
            estimate_ranks_option(&ranks, a, NULL);
            continue;
        }
        if (!v) {
            fprintf(stderr, "strata estimate: %s needs a value (see --help)\n", a);
            return CLI_EXIT_USAGE;
        }
        i++;
        int taken = estimate_ranks_option(&ranks, a, v);
        if (taken < 0)
            return CLI_EXIT_USAGE;
        if (taken)
            continue;
        if (strcmp(a, "--model") == 0) {
            if (!(preset = gpt_preset(v))) {
                fprintf(stderr, "strata estimate: --model \"%s\" is not a preset; allowed: %s\n", v, gpt_preset_names());
                return CLI_EXIT_USAGE;
            }
        } else if (strcmp(a, "--layers") == 0 || strcmp(a, "--hidden") == 0 || strcmp(a, "--heads") == 0 ||
                   strcmp(a, "--vocab") == 0 || strcmp(a, "--seq") == 0) {
            int *field = a[2] == 'l' ? &custom.layers : a[3] == 'i' ? &custom.hidden : a[2] == 'h' ? &custom.heads
                         : a[2] == 'v' ? &custom.vocab : &custom.seq;
            if (!parse_int(a, v, field))
                return CLI_EXIT_USAGE;
        } else if (strcmp(a, "--config") == 0) {
            char err[4096];
            if (strata_config_load_json(&cfg, v, err, sizeof err) != STRATA_OK) {
                fprintf(stderr, "%s\n", err);
                return CLI_EXIT_USAGE;
            }
        } else if (strcmp(a, "--device-budget") == 0 || strcmp(a, "--host-budget") == 0) {
            size_t *dst = a[2] == 'd' ? &dev_budget : &host_budget;
            if (!size_parse(v, dst)) {
                fprintf(stderr, "strata estimate: %s \"%s\" is not a size; write bytes or e.g. 2GiB\n", a, v);
                return CLI_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "strata estimate: unknown option \"%s\" (see --help)\n", a);
            return CLI_EXIT_USAGE;
        }
    }
    char shape_name[96];
    const gpt_shape *shape = settle_shape(preset, &custom, shape_name, sizeof shape_name);
    if (!shape)
        return CLI_EXIT_USAGE;
    if (dev_budget)
        cfg.device_budget_bytes = dev_budget;
    if (host_budget)
        cfg.host_budget_bytes = host_budget;
    if (!estimate_ranks_settle(&ranks, &cfg))
        return CLI_EXIT_USAGE;
    if (acts.active && ranks.params) {
        fprintf(stderr, "strata estimate: activations need a model shape (--model or --layers/--hidden), not --params\n");
        return CLI_EXIT_USAGE;
    }
    gpt_dims dims = gpt_shape_dims(shape);
    if (!ranks.params && !estimate_acts_apply(&acts, &dims, &cfg))
        return CLI_EXIT_USAGE;

    plan_input in = {.param_bytes = strata_dtype_bytes(cfg.param_dtype), .delayed = cfg.delayed_update,
                     .sub_group_numel = align_up(cfg.sub_group_size, PLAN_MODULE_ALIGN),
                     .activation_bytes = cfg.activation_bytes, .world_size = ranks.world_size,
                     .zero_stage = ranks.zero_stage, .step_in_backward = cfg.step_in_backward};
    plan_windows(&cfg, in.param_bytes, &in.prefetch_bytes, &in.max_live_bytes);
    /* Each module is partitioned on its own (a rank owns a slice of every module, so a fetch gathers one
     * module), so this rank's shard is the sum of its module slices; a bare count is cut into equal modules. The
     * GPT's embeddings (module 0) are also its head: fetched and handed over once more per micro-batch. */
    size_t module_params = ranks.params ? estimate_ranks_module_params(&ranks) : 0, tied_numel = 0;
    size_t nmodules = ranks.params ? (ranks.params + module_params - 1) / module_params : (size_t)gpt_module_count(shape);
    for (size_t m = 0; m < nmodules; m++) {
        size_t sizes[16] = {MIN(module_params, ranks.params - MIN(ranks.params, m * module_params))};
        int n = ranks.params ? 1 : gpt_module_params(shape, (int)m, sizes);
        size_t numel = plan_module_layout(sizes, (size_t)n, NULL, NULL);
        size_t shard = align_up(plan_rank_slice_numel(numel, ranks.world_size), PLAN_MODULE_ALIGN);
        in.total_numel += numel;
        in.shard_numel += shard;
        in.largest_module_numel = MAX(in.largest_module_numel, numel);
        if (!ranks.params && m == 0)
            tied_numel = shard * (size_t)ranks.world_size;
    }
    size_t param_numel, grad_numel, opt_numel;
    plan_class_numel(&in, &param_numel, &grad_numel, &opt_numel);
    in.opt_device_numel = opt_numel - twin_flow_split(opt_numel, MIN(in.sub_group_numel, opt_numel),
                                                      cfg.offload_optimizer_ratio); /* as finalize's plan_input_of */
    /* Placed as finalize places (plan_place): an unknown device budget holds anything, and "auto" keeps the
     * optimizer state on the device only where the device is the host backend's RAM (a config that fixes it there
     * is estimated as it says). */
    bool is_auto = cfg.offload_param.device == STRATA_TIER_AUTO || cfg.offload_optimizer.device == STRATA_TIER_AUTO;
    bool opt_on_device = cfg.offload_optimizer.device == STRATA_TIER_DEVICE || cfg.backend == STRATA_BACKEND_HOST;
    if (cfg.offload_optimizer.device == STRATA_TIER_AUTO && cfg.backend == STRATA_BACKEND_AUTO)
        opt_on_device = dev_probe(STRATA_BACKEND_CUDA, NULL, 0) != STRATA_OK; /* as training resolves the backend */
    plan p;
    plan_placement place;
    strata_status placed = plan_place(&cfg, opt_on_device, &in,
                                      cfg.device_budget_bytes ? cfg.device_budget_bytes : SIZE_MAX,
                                      plan_host_budget(&cfg), &place, &p);
    char placed_msg[1024];
    snprintf(placed_msg, sizeof placed_msg, "%s", placed == STRATA_OK ? "" : strata_last_error(NULL));
    size_t psi = ranks.params ? ranks.params : gpt_param_count(shape);
    int seq = ranks.params ? 1024 : shape->seq;
    if (ranks.json) {
        estimate_ranks_print(&ranks, &cfg, &in, &p, psi, seq, tied_numel);
        return CLI_EXIT_OK;
    }

    char b1[32], b2[32], b3[32], b4[32];
    double count = (double)psi;
    if (ranks.active)
        printf("world   %d rank%s at ZeRO stage %d: every number below is per rank; no ranks are started\n",
               ranks.world_size, ranks.world_size == 1 ? "" : "s", ranks.zero_stage);
    if (ranks.params)
        printf("model   %zu parameters as %zu module%s of %zu (--module-params): a bare count has no layers, so the "
               "plan takes equal modules, no tied embeddings and no activations (%zu elements padded)\n", psi,
               nmodules, nmodules == 1 ? "" : "s", module_params, in.total_numel);
    else
        printf("model   gpt %s: %d layers, hidden %d, vocab %d, seq %d: %.3g%s parameters (%zu elements padded)\n",
               shape->name, shape->layers, shape->hidden, shape->vocab, shape->seq,
               count >= 1e9 ? count / 1e9 : count / 1e6, count >= 1e9 ? " billion" : " million", in.total_numel);
    printf("tiers   parameters %s (%s), optimizer state %s, gradients %s; largest module %zu elements\n",
           strata_tier_name(in.param_tier), strata_dtype_name(cfg.param_dtype),
           strata_tier_name(in.opt_tier), strata_tier_name(in.grad_tier), in.largest_module_numel);
    if (is_auto && placed == STRATA_OK)
        printf("        %s%s\n", place.reason, cfg.device_budget_bytes ? "" : " (no device budget given: "
               "--device-budget or strata.device_budget_bytes; the device was taken to hold anything)");
    else if (is_auto)
        printf("        auto: no placement fits the budgets; below is the one closest to fitting\n");
    printf("\n");
    printf("%-7s %-45s %14s\n", "TIER", "WHAT", "BYTES");
    for (int i = 0; i < p.nlines; i++)
        printf("%-7s %-45s %14s\n", strata_tier_name(p.lines[i].tier), p.lines[i].what,
               size_format(p.lines[i].bytes, b1, sizeof b1));
    size_t budgets[3] = {cfg.device_budget_bytes, plan_host_budget(&cfg), nvme_free(&cfg)};
    printf("\n%-7s %14s %14s  %s\n", "TIER", "NEEDED", "AVAILABLE", "FITS");
    for (int t = 0; t < 3; t++) {
        bool known = budgets[t] > 0;
        printf("%-7s %14s %14s  %s\n", strata_tier_name((strata_tier)t), size_format(p.tier_bytes[t], b2, sizeof b2),
               known ? size_format(budgets[t], b3, sizeof b3) : t == 0 ? "all free" : "unknown",
               !known ? "-" : p.tier_bytes[t] <= budgets[t] ? "yes" : "NO");
    }
    print_misfits(&p, &in, budgets);
    if (p.nvme_param_bytes || p.nvme_opt_bytes)
        printf("\nhost cache (strata.host_cache%s): mirrors %s of %s of NVMe parameters (read at every fetch) and %s of "
               "%s of NVMe optimizer state (read once per step), from what the host budget leaves\n",
               cfg.host_cache ? "" : " = false", size_format(p.cache_param_bytes, b1, sizeof b1),
               size_format(p.nvme_param_bytes, b2, sizeof b2), size_format(p.cache_opt_bytes, b3, sizeof b3),
               size_format(p.nvme_opt_bytes, b4, sizeof b4));
    if (ranks.active)
        estimate_ranks_print(&ranks, &cfg, &in, &p, psi, seq, tied_numel);
    if (acts.active)
        estimate_acts_print(&acts, &dims, &cfg, &in, opt_on_device);
    /* Without a device budget nothing is judged, unless auto had to choose by the host budget. */
    if ((cfg.device_budget_bytes || is_auto) && placed != STRATA_OK) {
        printf("\n%s\n", placed_msg);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
