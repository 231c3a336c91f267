/* `strata estimate`: the memory plan per tier for a model shape and a config, without allocating. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "base/size.h"
#include "base/util.h"
#include "engine/config/config.h"
#include "engine/plan/plan.h"
#include "engine/plan/plan_auto.h"
#include "engine/plan/plan_ranks.h"
#include "engine/step/twin_flow.h"
#include "gpu/device.h"
#include "strata.h"
#include "tools/cli.h"
#include "tools/decay_recipe.h"
#include "tools/estimate_acts.h"
#include "tools/estimate_moves.h"
#include "tools/estimate_ranks.h"
#include "tools/estimate_speed.h"
#include "tools/gpt_shape.h"
#include "tools/options.h"

/* The command line: the shape given (0 = the preset's), the budgets, the world's, the activations' and the speed's
 * options; and what settle_args made of them that the printers say. */
typedef struct estimate_args {
    const char *model, *config;
    gpt_shape shape;
    size_t device_budget, host_budget;
    int batch;         /* 0 = not given */
    int device, dtype; /* indices among their choices; -1 = not given */
    estimate_ranks ranks;
    estimate_acts acts;
    estimate_speed speed;
    decay_recipe decay;      /* strata train's weight-decay groups, whose boundaries the layout pads */
    const char *device_why;  /* where the backend planned for came from */
    bool auto_unplaced;      /* the config names no placement, so both devices are "auto" */
} estimate_args;

#define SIZE_OPT(flag, field, text)                                                                                  \
    {.name = flag, .kind = CLI_SIZE, .offset = offsetof(estimate_args, field), .meta = "SIZE", .help = text,        \
     .hint = "write bytes or e.g. 2GiB"}
static const cli_opt model_opts[] = {
    {.name = "--model", .kind = CLI_TEXT, .offset = offsetof(estimate_args, model), .meta = "PRESET",
     .help = GPT_PRESET_NAMES " (default 1.5B); the shape flags change those dimensions of the preset, or describe a "
             "model of their own with --layers and --hidden"},
};
static const cli_opt estimate_opts[] = {
    GPT_SHAPE_CONTEXT_OPT("--seq", offsetof(estimate_args, shape)),
    {.name = "--config", .kind = CLI_TEXT, .offset = offsetof(estimate_args, config), .meta = "FILE",
     .help = "a DeepSpeed-style JSON config"},
    SIZE_OPT("--device-budget", device_budget, "device memory strata may use (default: the config's)"),
    SIZE_OPT("--host-budget", host_budget, "host memory strata may use (default: the config's)"),
    {.name = "--batch", .kind = CLI_INT, .offset = offsetof(estimate_args, batch), .lo = 1, .hi = 1000000,
     .meta = "N", .help = "sequences per rank per micro-batch, {} (default 1): the activations' and the world's",
     .hint = "sequences per rank per micro-batch"},
    {.name = "--device", .kind = CLI_CHOICE, .offset = offsetof(estimate_args, device), .choices = "auto|host|cuda",
     .meta = "auto|host|cuda",
     .help = "the backend to plan for (default: the config's strata.backend); auto: cuda when a device budget is "
             "given (the GPU being sized need not be in this machine), else what training here would take",
     .hint = "cuda: a GPU, whose optimizer state lives off it; host: device memory is RAM"},
    {.name = "--dtype", .kind = CLI_CHOICE, .offset = offsetof(estimate_args, dtype), .choices = "fp32|bf16|fp16",
     .meta = "fp32|bf16|fp16",
     .help = "the parameters' and gradients' dtype on the device, as strata train's --dtype (default: the config's "
             "bf16.enabled / fp16.enabled, else fp32); it overrides the config",
     .hint = "the parameters' dtype on the device"},
};
#undef SIZE_OPT
static const cli_opt_group estimate_groups[] = {
    CLI_GROUP(model_opts), GPT_SHAPE_GROUP(offsetof(estimate_args, shape)), CLI_GROUP(estimate_opts),
    DECAY_RECIPE_GROUP(offsetof(estimate_args, decay)), ESTIMATE_ACTS_GROUP(offsetof(estimate_args, acts)),
    ESTIMATE_RANKS_GROUP(offsetof(estimate_args, ranks)), ESTIMATE_SPEED_GROUP(offsetof(estimate_args, speed)),
};
static const cli_spec estimate_spec = {
    .command = "estimate", .groups = estimate_groups, .ngroups = sizeof estimate_groups / sizeof estimate_groups[0],
    .about = "Prints how many bytes each tier (device, host, NVMe) needs to train a GPT-style model with the\n"
             "config, with the largest module and the prefetch window in flight, and whether the budgets hold it.\n"
             "Where the config names no placement (zero_optimization.offload_param.device, offload_optimizer.device),\n"
             "or says \"auto\", it places the state classes as \"auto\" training would (the fastest placement that\n"
             "fits the budgets) and says why; a placement the config names is estimated as it stands. A plan that\n"
             "does not fit lists the moves that make it fit, cheapest first: the optimizer state, then the gradients,\n"
             "then the parameters. With --tflops it says at which batch the CPU's Adam hides behind the GPU's\n"
             "compute. Nothing is allocated. SIZE takes bytes or strings like 2GiB."};

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

/* Whether the config file names a placement (either device key). The loaded config cannot say: a key's default
 * ("none") is a value a user may write. The loader has read the file already, so it parses. */
static bool config_places(const char *path)
{
    json_error_t e;
    json_t *root = path ? json_load_file(path, 0, &e) : NULL;
    json_t *z = json_object_get(root, "zero_optimization");
    bool named = json_object_get(json_object_get(z, "offload_param"), "device") ||
                 json_object_get(json_object_get(z, "offload_optimizer"), "device");
    json_decref(root);
    return named;
}

/* The backend to plan for into cfg: --device (choice, -1 = not given), else the config's strata.backend. "auto" is
 * CUDA when a device budget is given, since a budget sizes a GPU that need not be in this machine; else what training
 * here takes (a GPU answers or not), as the estimate always did. Returns what decided it, for the printout. */
static const char *settle_backend(int choice, strata_config *cfg)
{
    static const strata_backend_kind backends[] = {STRATA_BACKEND_AUTO, STRATA_BACKEND_HOST, STRATA_BACKEND_CUDA};
    if (choice >= 0)
        cfg->backend = backends[choice];
    if (cfg->backend != STRATA_BACKEND_AUTO)
        return choice >= 0 ? "--device" : "the config's strata.backend";
    if (cfg->device_budget_bytes) {
        cfg->backend = STRATA_BACKEND_CUDA;
        return "a device budget was given: planned for a GPU, in this machine or not; --device host plans the host "
               "backend";
    }
    bool gpu = dev_probe(STRATA_BACKEND_CUDA, NULL, 0) == STRATA_OK;
    cfg->backend = gpu ? STRATA_BACKEND_CUDA : STRATA_BACKEND_HOST;
    return gpu ? "a GPU answered, as training here takes it" : "no GPU answered and no device budget was given, as "
                 "training here takes it; --device cuda plans for a GPU";
}

/* The command line into a, cfg and the shape to estimate (named into name); 0 or an exit code. */
static int settle_args(int argc, char **argv, estimate_args *a, strata_config *cfg, const gpt_shape **shape,
                       char *name, size_t name_bytes)
{
    int rc = cli_parse_or_say(&estimate_spec, argc, argv, a);
    if (rc)
        return rc;
    const gpt_shape *preset = a->model ? gpt_preset(a->model) : NULL;
    if (a->model && !preset) {
        fprintf(stderr, "strata estimate: --model \"%s\" is not a preset; allowed: %s\n", a->model, gpt_preset_names());
        return CLI_EXIT_USAGE;
    }
    char err[4096];
    decay_recipe_config_init(cfg); /* strata train's default, which the config and --weight-decay change */
    if (a->config && strata_config_load_json(cfg, a->config, err, sizeof err) != STRATA_OK) {
        fprintf(stderr, "%s\n", err);
        return CLI_EXIT_USAGE;
    }
    if (!decay_recipe_settle(&a->decay, cfg, err, sizeof err)) {
        fprintf(stderr, "strata estimate: %s\n", err);
        return CLI_EXIT_USAGE;
    }
    if (a->batch) { /* --batch is both the activations' and the world's */
        a->acts.batch = a->ranks.batch = a->batch;
        a->acts.active = a->ranks.active = true;
    }
    if (!(*shape = settle_shape(preset, &a->shape, name, name_bytes)))
        return CLI_EXIT_USAGE;
    if (a->device_budget)
        cfg->device_budget_bytes = a->device_budget;
    if (a->host_budget)
        cfg->host_budget_bytes = a->host_budget;
    /* No placement in the config: plan as "auto" does, the question being where the state should go. */
    a->auto_unplaced = !config_places(a->config);
    if (a->auto_unplaced)
        cfg->offload_param.device = cfg->offload_optimizer.device = STRATA_TIER_AUTO;
    a->device_why = settle_backend(a->device, cfg);
    if (a->dtype >= 0) /* the choices are in strata_dtype's order */
        cfg->param_dtype = (strata_dtype)a->dtype;
    if (a->speed.tflops > 0)
        a->ranks.tflops = a->speed.tflops;
    if (!estimate_ranks_settle(&a->ranks, cfg))
        return CLI_EXIT_USAGE;
    if (a->acts.active && a->ranks.params) {
        fprintf(stderr, "strata estimate: activations need a model shape (--model or --layers/--hidden), not --params\n");
        return CLI_EXIT_USAGE;
    }
    if (decay_recipe_on(&a->decay) && a->ranks.params) {
        fprintf(stderr, "strata estimate: the weight decay's parameter groups need a model shape (--model or "
                "--layers/--hidden), not --params\n");
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* What the plan is made of: this rank's shard of each module of the shape (or of the equal modules of a bare
 * count). *nmodules and *tied_numel (the embeddings, which the GPT's head fetches once more) are for the printers. */
static plan_input plan_input_of(const estimate_ranks *ranks, const strata_config *cfg, const gpt_shape *shape,
                                const decay_recipe *decay, size_t *nmodules, size_t *tied_numel)
{
    plan_input in = {.param_bytes = strata_dtype_bytes(cfg->param_dtype), .delayed = cfg->delayed_update,
                     .sub_group_numel = align_up(cfg->sub_group_size, PLAN_MODULE_ALIGN),
                     .activation_bytes = cfg->activation_bytes, .world_size = ranks->world_size,
                     .zero_stage = ranks->zero_stage, .step_in_backward = cfg->step_in_backward,
                     .speculate = cfg_speculates(cfg), .keep_grads = cfg_keeps_grads(cfg),
                     .moments = cfg->optimizer_moments};
    plan_windows(cfg, in.param_bytes, &in.prefetch_bytes, &in.max_live_bytes);
    /* Each module is partitioned on its own (a rank owns a slice of every module, so a fetch gathers one
     * module), so this rank's shard is the sum of its module slices; a bare count is cut into equal modules. The
     * GPT's embeddings (module 0) are also its head: fetched and handed over once more per micro-batch. */
    size_t module_params = ranks->params ? estimate_ranks_module_params(ranks) : 0;
    /* With --trainable-params the count's trained part comes first, in modules of its own (as the engine lays out
     * trained modules before frozen ones), and the rest is frozen. */
    size_t trained = ranks->trainable ? ranks->trainable : ranks->params;
    size_t ntrained = ranks->params ? (trained + module_params - 1) / module_params : 0;
    size_t nfrozen = ranks->params ? (ranks->params - trained + module_params - 1) / module_params : 0;
    *tied_numel = 0;
    *nmodules = ranks->params ? ntrained + nfrozen : (size_t)gpt_module_count(shape);
    in.frozen = nfrozen > 0;
    gpt_dims dims = gpt_shape_dims(shape);
    for (size_t m = 0; m < *nmodules; m++) {
        bool frozen = m >= ntrained && ranks->params;
        size_t first = frozen ? (m - ntrained) * module_params : m * module_params;
        size_t part = frozen ? ranks->params - trained : trained;
        size_t sizes[GPT_MAX_MODULE_PARAMS] = {MIN(module_params, part - MIN(part, first))};
        uint32_t groups[GPT_MAX_MODULE_PARAMS] = {0};
        int n = ranks->params ? 1 : gpt_module_params(shape, (int)m, sizes);
        if (!ranks->params) /* the groups strata train makes: their boundaries are padded */
            decay_recipe_module_groups(&dims, (int)m, decay, groups);
        size_t numel = plan_module_layout(sizes, groups, (size_t)n, NULL, NULL);
        size_t shard = align_up(plan_rank_slice_numel(numel, ranks->world_size), PLAN_MODULE_ALIGN);
        in.total_numel += numel;
        in.shard_numel += shard;
        if (!frozen) {
            in.trained_numel += numel;
            in.shard_trained_numel += shard;
            in.largest_trained_numel = MAX(in.largest_trained_numel, numel);
        }
        in.largest_module_numel = MAX(in.largest_module_numel, numel);
        if (!ranks->params && m == 0)
            *tied_numel = shard * (size_t)ranks->world_size;
    }
    size_t param_numel, grad_numel, opt_numel;
    plan_class_numel(&in, &param_numel, &grad_numel, &opt_numel);
    in.opt_device_numel = opt_numel - twin_flow_split(opt_numel, MIN(in.sub_group_numel, opt_numel),
                                                      cfg->offload_optimizer_ratio); /* as finalize's plan_input_of */
    return in;
}

/* The plan placed as finalize places it (plan_place). */
typedef struct placed {
    plan p;
    plan_placement place;
    strata_status st;
    char msg[1024]; /* why it does not fit, when st is not STRATA_OK */
    bool is_auto, opt_on_device;
} placed;

/* The budgets the plan is placed within: an unknown device budget holds anything. */
static size_t device_budget_of(const strata_config *cfg)
{
    return cfg->device_budget_bytes ? cfg->device_budget_bytes : SIZE_MAX;
}

/* "auto" keeps the optimizer state on the device only where the device is the host backend's RAM (settle_backend
 * resolved the backend); a config that fixes it there is estimated as it says. */
static void place_plan(const strata_config *cfg, plan_input *in, placed *out)
{
    out->is_auto = cfg->offload_param.device == STRATA_TIER_AUTO || cfg->offload_optimizer.device == STRATA_TIER_AUTO;
    out->opt_on_device = cfg->offload_optimizer.device == STRATA_TIER_DEVICE || cfg->backend == STRATA_BACKEND_HOST;
    out->st = plan_place(cfg, out->opt_on_device, in, device_budget_of(cfg), plan_host_budget(cfg), &out->place,
                         &out->p);
    snprintf(out->msg, sizeof out->msg, "%s", out->st == STRATA_OK ? "" : strata_last_error(NULL));
}

/* The lines above the tables: the world, the model and where the state classes went. */
static void print_model(const estimate_args *a, const strata_config *cfg, const gpt_shape *shape,
                        const plan_input *in, const placed *pl, size_t psi, size_t nmodules)
{
    const estimate_ranks *ranks = &a->ranks;
    const decay_recipe *decay = &a->decay;
    double count = (double)psi;
    if (ranks->active)
        printf("world   %d rank%s at ZeRO stage %d: every number below is per rank; no ranks are started\n",
               ranks->world_size, ranks->world_size == 1 ? "" : "s", ranks->zero_stage);
    if (ranks->params)
        printf("model   %zu parameters as %zu module%s of %zu (--module-params): a bare count has no layers, so the "
               "plan takes equal modules, no tied embeddings and no activations (%zu elements padded)\n", psi,
               nmodules, nmodules == 1 ? "" : "s", estimate_ranks_module_params(ranks), in->total_numel);
    if (ranks->trainable)
        printf("frozen  %zu of them trained (--trainable-params; %zu elements padded), the other %zu frozen: "
               "parameters only, no gradients or optimizer state\n", ranks->trainable, in->trained_numel,
               psi - ranks->trainable);
    else if (!ranks->params)
        printf("model   gpt %s: %d layers, hidden %d, vocab %d, seq %d: %.3g%s parameters (%zu elements padded)\n",
               shape->name, shape->layers, shape->hidden, shape->vocab, shape->seq,
               count >= 1e9 ? count / 1e9 : count / 1e6, count >= 1e9 ? " billion" : " million", in->total_numel);
    if (decay_recipe_on(decay)) {
        char text[512];
        gpt_dims dims = gpt_shape_dims(shape);
        decay_recipe_describe(&dims, decay, cfg, text, sizeof text);
        printf("groups  %s, as strata train makes them: a parameter of another group than the one before it starts on "
               "%zu elements\n", text, PLAN_GROUP_ALIGN);
    }
    bool hint_bf16 = cfg->backend == STRATA_BACKEND_CUDA && cfg->param_dtype == STRATA_DTYPE_FP32 && a->dtype < 0;
    printf("device  %s (%s)%s\n", strata_backend_name(cfg->backend), a->device_why,
           hint_bf16 ? "; fp32 parameters: strata train on cuda makes them bf16, --dtype bf16 plans that" : "");
    printf("tiers   parameters %s (%s), optimizer state %s, gradients %s; largest module %zu elements\n",
           strata_tier_name(in->param_tier), strata_dtype_name(cfg->param_dtype),
           strata_tier_name(in->opt_tier), strata_tier_name(in->grad_tier), in->largest_module_numel);
    if (pl->is_auto && pl->st == STRATA_OK)
        printf("        %s%s\n", pl->place.reason, cfg->device_budget_bytes ? "" : " (no device budget given: "
               "--device-budget or strata.device_budget_bytes; the device was taken to hold anything)");
    else if (pl->is_auto)
        printf("        auto: no placement fits the budgets; below is the one closest to fitting\n");
    if (a->auto_unplaced)
        printf("        (the config names no placement, so this is \"auto\"'s: to train so, set "
               "zero_optimization.offload_param.device and offload_optimizer.device to \"auto\" or to these)\n");
    printf("\n");
}

/* The moves that make the plan fit, cheapest first, into moves and how many, when it overflows the device or the host
 * budget; -1 when it overflows neither. */
static int find_moves(const strata_config *cfg, const plan_input *in, const placed *pl, estimate_move *moves)
{
    const plan *p = &pl->p;
    if (p->tier_bytes[STRATA_TIER_DEVICE] <= device_budget_of(cfg) &&
        p->tier_bytes[STRATA_TIER_HOST] <= plan_host_budget(cfg))
        return -1;
    return estimate_moves_find(cfg, in, pl->opt_on_device, device_budget_of(cfg), plan_host_budget(cfg), moves);
}

/* The plan's lines, what each tier needs against what it has, why a tier misfits and what to move, and the host
 * cache. */
static void print_tiers(const strata_config *cfg, const plan_input *in, const placed *pl)
{
    const plan *p = &pl->p;
    char b1[32], b2[32], b3[32], b4[32];
    printf("%-7s %-45s %14s\n", "TIER", "WHAT", "BYTES");
    for (int i = 0; i < p->nlines; i++)
        printf("%-7s %-45s %14s\n", strata_tier_name(p->lines[i].tier), p->lines[i].what,
               size_format(p->lines[i].bytes, b1, sizeof b1));
    size_t budgets[3] = {cfg->device_budget_bytes, plan_host_budget(cfg), nvme_free(cfg)};
    printf("\n%-7s %14s %14s  %s\n", "TIER", "NEEDED", "AVAILABLE", "FITS");
    for (int t = 0; t < 3; t++) {
        bool known = budgets[t] > 0;
        printf("%-7s %14s %14s  %s\n", strata_tier_name((strata_tier)t), size_format(p->tier_bytes[t], b2, sizeof b2),
               known ? size_format(budgets[t], b3, sizeof b3) : t == 0 ? "all free" : "unknown",
               !known ? "-" : p->tier_bytes[t] <= budgets[t] ? "yes" : "NO");
    }
    print_misfits(p, in, budgets);
    estimate_move moves[ESTIMATE_MAX_MOVES];
    int nmoves = find_moves(cfg, in, pl, moves);
    if (nmoves >= 0)
        estimate_moves_print(moves, nmoves, device_budget_of(cfg), plan_host_budget(cfg));
    if (p->nvme_param_bytes || p->nvme_opt_bytes)
        printf("\nhost cache (strata.host_cache%s): mirrors %s of %s of NVMe parameters (read at every fetch, written at every "
               "update: a mirrored module does neither on NVMe) and %s of %s of NVMe optimizer state (read once per "
               "step, written at every update: a mirrored sub-group does neither on NVMe), from what the host budget "
               "leaves\n",
               cfg->host_cache ? "" : " = false", size_format(p->cache_param_bytes, b1, sizeof b1),
               size_format(p->nvme_param_bytes, b2, sizeof b2), size_format(p->cache_opt_bytes, b3, sizeof b3),
               size_format(p->nvme_opt_bytes, b4, sizeof b4));
}

/* The speed block's view of the step: the CPU's Adam updates this rank's optimizer state, on a GPU unless it is on
 * the device (Twin-Flow's device share is the device's Adam's); on the host backend all of it. */
static speed_step speed_step_of(const estimate_args *a, const strata_config *cfg, const plan_input *in, size_t psi,
                                int seq)
{
    size_t np, ng, no;
    plan_class_numel(in, &np, &ng, &no);
    size_t on_cpu = cfg->backend != STRATA_BACKEND_CUDA ? no
                    : in->opt_tier == STRATA_TIER_DEVICE ? 0 : no - in->opt_device_numel;
    return (speed_step){.params = (double)psi, .adam_numel = (double)on_cpu,
                        .seq = a->ranks.params ? seq : a->acts.seq_len, .batch = a->ranks.batch,
                        .tokens = a->ranks.tokens, .grad_accum = a->ranks.grad_accum,
                        .recompute = !a->ranks.params && a->acts.mode != GPT_ACT_KEEP};
}

/* --json: the world's object (estimate_ranks_json) with the placement, the moves of a plan that does not fit and the
 * speed block added. */
static void print_json(const estimate_args *a, const strata_config *cfg, const plan_input *in, const placed *pl,
                       size_t psi, int seq, size_t tied_numel)
{
    json_t *o = estimate_ranks_json(&a->ranks, in, &pl->p, psi, seq, tied_numel);
    json_object_set_new(o, "placement", json_pack("{s:s, s:s, s:s, s:s, s:s, s:b, s:b, s:s}", "backend",
                                                  strata_backend_name(cfg->backend), "dtype",
                                                  strata_dtype_name(cfg->param_dtype), "params",
                                                  strata_tier_name(in->param_tier), "optimizer",
                                                  strata_tier_name(in->opt_tier), "gradients",
                                                  strata_tier_name(in->grad_tier), "auto", pl->is_auto, "fits",
                                                  pl->st == STRATA_OK, "reason", pl->place.reason));
    estimate_move moves[ESTIMATE_MAX_MOVES];
    int nmoves = find_moves(cfg, in, pl, moves);
    if (nmoves >= 0)
        json_object_set_new(o, "moves", estimate_moves_json(moves, nmoves));
    if (a->speed.active) {
        speed_step st = speed_step_of(a, cfg, in, psi, seq);
        json_object_set_new(o, "speed", estimate_speed_json(&a->speed, &st, cfg->backend == STRATA_BACKEND_CUDA));
    }
    json_dumpf(o, stdout, JSON_INDENT(2));
    printf("\n");
    json_decref(o);
}

int cmd_estimate(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        cli_print_help(&estimate_spec, stdout);
        return CLI_EXIT_OK;
    }
    estimate_args a = {.device = -1, .dtype = -1, .ranks = ESTIMATE_RANKS_INIT, .acts = ESTIMATE_ACTS_INIT,
                       .speed = ESTIMATE_SPEED_INIT, .decay = DECAY_RECIPE_INIT};
    strata_config cfg;
    strata_config_init(&cfg);
    const gpt_shape *shape;
    char shape_name[96];
    int rc = settle_args(argc, argv, &a, &cfg, &shape, shape_name, sizeof shape_name);
    if (rc)
        return rc;
    gpt_dims dims = gpt_shape_dims(shape);
    if (!a.ranks.params && !estimate_acts_apply(&a.acts, &dims, &cfg))
        return CLI_EXIT_USAGE;
    size_t nmodules, tied_numel;
    plan_input in = plan_input_of(&a.ranks, &cfg, shape, &a.decay, &nmodules, &tied_numel);
    placed pl;
    place_plan(&cfg, &in, &pl);
    size_t psi = a.ranks.params ? a.ranks.params : gpt_param_count(shape);
    int seq = a.ranks.params ? 1024 : shape->seq;
    if (a.ranks.json) {
        print_json(&a, &cfg, &in, &pl, psi, seq, tied_numel);
        return CLI_EXIT_OK;
    }
    print_model(&a, &cfg, shape, &in, &pl, psi, nmodules);
    print_tiers(&cfg, &in, &pl);
    if (a.ranks.active)
        estimate_ranks_print(&a.ranks, &cfg, &in, psi, seq, tied_numel);
    if (a.acts.active)
        estimate_acts_print(&a.acts, &dims, &cfg, &in, pl.opt_on_device);
    if (a.speed.active) {
        speed_step st = speed_step_of(&a, &cfg, &in, psi, seq);
        estimate_speed_print(&a.speed, &st, cfg.backend == STRATA_BACKEND_CUDA);
    }
    /* Without a device budget nothing is judged, unless auto had to choose by the host budget. */
    if ((cfg.device_budget_bytes || pl.is_auto) && pl.st != STRATA_OK) {
        printf("\n%s\n", pl.msg);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
