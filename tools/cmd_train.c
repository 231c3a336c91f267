/* `strata train`: train a GPT model through the public API (tools/trainer.c runs the loop). This file joins the
 * launcher's world (one rank, or N under mpirun), turns the command line and an optional JSON config into a
 * strata_config and trainer options, and rejects bad input with exit code 2 and a message that names the argument. */
#include <cblas.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/size.h"
#include "engine/plan/plan.h"
#include "gpu/device.h"
#include "model/data.h"
#include "model/gpt_engine.h"
#include "model/gpt_pass.h"
#include "strata.h"
#include "tools/cli.h"
#include "tools/gpt_shape.h"
#include "tools/options.h"
#include "tools/train_msg.h"
#include "tools/trainer.h"

#define BUILTIN_DATA_BYTES (4u << 20)

typedef struct args {
    const char *model, *config, *data, *nvme_dir, *trace;
    const char *device_budget, *host_budget, *prefetch;
    gpt_shape shape; /* the dimensions given (0 = the preset's) */
    int offload, offload_acts, device, dtype, schedule; /* indices among their choices; -1 = not given */
    int batch, grad_accum, seq, threads, keep, delayed_warmup;
    long long steps, warmup, save_every, seed;
    double lr, min_lr;
    bool delayed, quiet, step_in_backward, norm_pass, checkpointing;
    gpt_head_need embedding_need; /* the least device memory, embedding whole and tiled (gpt_engine_head_rows) */
    trainer_opts topts;
} args;

#define SWITCH(flag, field, text) {.name = flag, .kind = CLI_SWITCH, .offset = offsetof(args, field), .help = text}
#define TEXT(flag, field, meta_, text) \
    {.name = flag, .kind = CLI_TEXT, .offset = offsetof(args, field), .meta = meta_, .help = text}
#define CHOICE(flag, field, list, text) \
    {.name = flag, .kind = CLI_CHOICE, .offset = offsetof(args, field), .choices = list, .meta = list, .help = text}
#define NUM(flag, kind_, field, lo_, hi_, text) \
    {.name = flag, .kind = kind_, .offset = offsetof(args, field), .lo = lo_, .hi = hi_, .meta = "N", .help = text}
#define RATE(flag, field, open, text)                                                                                 \
    {.name = flag, .kind = CLI_REAL, .offset = offsetof(args, field), .lo = 0, .hi = 10, .open_lo = open,            \
     .open_hi = true, .meta = "X", .what = "a learning rate", .help = text}

/* Every flag of `strata train`, one entry each (the model shape's in tools/gpt_shape.h, the weight decay's in
 * tools/decay_recipe.h): the parser, its messages, --help and "did you mean" read this table. */
static const cli_opt model_opts[] = {
    TEXT("--model", model, "PRESET", GPT_PRESET_NAMES " (default tiny); the shape flags below override it"),
};
static const cli_opt train_opts[] = {
    GPT_SHAPE_CONTEXT_OPT("--context", offsetof(args, shape)),
    TEXT("--config", config, "FILE", "a DeepSpeed-style JSON config; the flags override it"),
    TEXT("--data", data, "FILE", "training text (default: a built-in generated English-like corpus)"),
    NUM("--steps", CLI_LL, steps, 1, 1e15, "optimizer steps, {} (default 100)"),
    NUM("--batch", CLI_INT, batch, 1, 1 << 20, "sequences per micro-batch, {} (default 8)"),
    NUM("--grad-accum", CLI_INT, grad_accum, 1, 1 << 20, "micro-batches per step and rank, {} (default 1)"),
    NUM("--seq", CLI_INT, seq, 1, 1 << 20, "tokens per sequence, {} (default: the model's context)"),
    {.name = "--schedule", .kind = CLI_CHOICE, .offset = offsetof(args, schedule), .choices = "ordinary|layerwise",
     .meta = "S", .hint = "layerwise runs the --grad-accum micro-batches through each module together: fewer fetches, "
                          "more activation memory",
     .help = "ordinary (default): each micro-batch goes through all modules before the next; layerwise: the step's "
           "--grad-accum micro-batches go through each module together, so a step fetches every module once forward, "
           "once for the head and once backward instead of grad-accum times each, for grad-accum times the "
           "activation memory; the weights are the ordinary schedule's bit for bit"},
    /* The engine refuses an lr of 0 (optimizer.params.lr is in (0, 1e6]); the cosine may end at 0. */
    RATE("--lr", lr, true, "peak learning rate in {} (default 1e-3 or the config's); linear warmup over --warmup "
                           "steps, then cosine down to --min-lr"),
    RATE("--min-lr", min_lr, false, "the learning rate the cosine ends at, in {} (default lr/10)"),
    NUM("--warmup", CLI_LL, warmup, 0, 1e15, "warmup steps, {} (default steps/10)"),
};
static const cli_opt run_opts[] = {
    NUM("--seed", CLI_LL, seed, 0, 1e15, "the seed of the weights and the data order, {} (default 0)"),
    CHOICE("--device", device, "auto|host|cuda",
           "where the model computes: cuda, host, or auto (default: cuda when a GPU answers)"),
    CHOICE("--dtype", dtype, "fp32|bf16|fp16",
           "parameter and gradient dtype on the device (default bf16 on cuda, fp32 on host)"),
    CHOICE("--offload", offload, "device|host|nvme",
           "where parameters and optimizer state live: device (default), host or nvme; on cuda the optimizer "
           "state stays in host memory for device (nvme needs --nvme-dir DIR)"),
    TEXT("--nvme-dir", nvme_dir, "DIR", "a scratch directory for the swap files"),
    TEXT("--device-budget", device_budget, "SIZE", "device memory strata may use"),
    TEXT("--host-budget", host_budget, "SIZE", "host memory strata may use"),
    TEXT("--prefetch", prefetch, "SIZE", "the bytes of parameters fetched ahead"),
    SWITCH("--delayed-update", delayed, "ZeRO-Offload's one-step-delayed optimizer step, after --delayed-warmup"),
    NUM("--delayed-warmup", CLI_INT, delayed_warmup, 0, 1 << 30, "steps before the delayed update starts, {}"),
    SWITCH("--step-in-backward", step_in_backward,
           "each module's optimizer update as soon as its gradients are complete, during backward, without a "
           "gradient store (strata.step_in_backward; --grad-accum 1)"),
    SWITCH("--norm-pass", norm_pass,
           "with --step-in-backward and gradient clipping: each step's forward and backward run twice, the first "
           "measuring the gradient norm, so the updates in backward run clipped at once, with no second copy of the "
           "optimizer state and no kept gradients (strata.norm_pass)"),
    SWITCH("--activation-checkpointing", checkpointing,
           "each block keeps only its input and runs its forward again in backward: 2/3 of a block forward more "
           "per block, its internals held once instead of per block"),
    CHOICE("--offload-activations", offload_acts, "host|nvme|auto",
           "checkpointing, with the block inputs kept in host memory or on NVMe (the swap space of --nvme-dir or "
           "the config's nvme_path; auto: host if the budget holds them) instead of the device, restored ahead of "
           "backward (strata.offload_activations)"),
    NUM("--threads", CLI_INT, threads, 1, 4096, "CPU threads of the model's kernels and the engine, {}"),
    TEXT("--trace", trace, "FILE", "Chrome trace-event JSON of every transfer and step (open in ui.perfetto.dev)"),
    TEXT("--log-jsonl", topts.log_jsonl, "FILE",
         "one JSON object per step (loss, lr, tokens/s, stall, bytes per link, comm bytes, peak bytes per tier, "
         "fetches); with N ranks each rank logs its own: rank 0 to FILE, rank r to FILE.rank<r> (bytes are the "
         "rank's; loss and tokens/s the world's)"),
    TEXT("--dump-weights", topts.dump_weights, "FILE",
         "write the final fp32 master weights (raw, model order) to FILE (rank 0 writes)"),
    TEXT("--save", topts.save_dir, "DIR",
         "checkpoints to DIR/step-N at the end, every --save-every K steps and on SIGINT/SIGTERM, keeping the last "
         "--keep; DIR is checked and locked for the run at the start (a second run is refused); a save that finds "
         "the disk full warns and training goes on, exit status 1"),
    NUM("--save-every", CLI_LL, save_every, 0, 1e15, "steps between checkpoints, {} (0: only at the end)"),
    NUM("--keep", CLI_INT, keep, 1, 1000, "checkpoints kept, {} (default 2)"),
    TEXT("--resume", topts.resume_dir, "DIR", "continue from the newest checkpoint in DIR"),
    TEXT("--init-from", topts.init_from, "FILE|DIR",
         "start from these weights instead of --seed's: safetensors from `strata ckpt export` or Hugging Face GPT-2 "
         "(a .safetensors file, a save_pretrained directory, or a sharded model.safetensors.index.json); the model's "
         "shape flags must match them"),
    SWITCH("--quiet", quiet, "no per-step lines"),
};
#undef SWITCH
#undef TEXT
#undef CHOICE
#undef NUM
#undef RATE

static const cli_opt_group train_opt_groups[] = {
    CLI_GROUP(model_opts), GPT_SHAPE_GROUP(offsetof(args, shape)), CLI_GROUP(train_opts),
    DECAY_RECIPE_GROUP(offsetof(args, topts) + offsetof(trainer_opts, decay)), CLI_GROUP(run_opts)};
static const cli_spec train_spec = {
    .command = "train", .groups = train_opt_groups, .ngroups = sizeof train_opt_groups / sizeof train_opt_groups[0],
    .footer = "SIZE takes bytes or strings like 2GiB.",
    .about = "Trains a GPT-2 style model (byte-level tokens) with strata holding its parameters and optimizer state.\n"
             "Under `mpirun -np N` it trains as N data-parallel ranks (ZeRO stage from the config; --offload host|nvme\n"
             "means stage 3): --batch and --grad-accum are per rank, rank r takes micro-batches r, N + r, 2N + r, ...\n"
             "of each step, so N ranks x grad-accum k train as 1 rank x N*k. Only rank 0 prints (errors excepted);\n"
             "--save writes sharded checkpoints (each rank its own files), which any number of ranks can --resume."};

static int bad(const char *flag, const char *value, const char *why)
{
    train_err("%s \"%s\": %s", flag, value, why);
    return CLI_EXIT_USAGE;
}

/* Reads argv into a; returns 0 or an exit code. */
static int parse(int argc, char **argv, args *a)
{
    char err[1024];
    int rc = cli_parse(&train_spec, argc, argv, a, NULL, 0, NULL, err, sizeof err);
    if (rc)
        train_err("%s", err);
    else if (a->topts.init_from && a->topts.resume_dir)
        rc = bad("--init-from", a->topts.init_from, "and --resume both give the weights; a resumed run continues "
                 "from its checkpoint's, so drop one of them");
    return rc;
}

static void place(strata_offload_config *o, strata_tier tier, const char *dir)
{
    o->device = tier;
    if (tier == STRATA_TIER_NVME) {
        snprintf(o->nvme_path[0], STRATA_PATH_BYTES, "%s", dir);
        o->nvme_path_count = 1;
    }
}

/* The config's defaults, then --config, then --lr and the weight decay (--weight-decay, else the config's); 0 or an
 * exit code. */
static int load_config(args *a, strata_config *cfg)
{
    strata_config_init(cfg);
    cfg->lr = 1e-3f;
    decay_recipe_config_init(cfg);
    if (a->config) {
        char err[4096];
        if (strata_config_load_json(cfg, a->config, err, sizeof err) != STRATA_OK) {
            train_err("--config \"%s\":\n%s", a->config, err);
            return CLI_EXIT_USAGE;
        }
    }
    if (a->lr >= 0) /* both spellings of the lr (strata.h, lr_exact): messages then show the value as given */
        cfg->lr = (float)(cfg->lr_exact = a->lr);
    char err[512];
    if (!decay_recipe_settle(&a->topts.decay, cfg, err, sizeof err)) {
        train_err("%s", err);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* --offload and --offload-activations; 0 or an exit code. */
static int apply_offload(const args *a, strata_config *cfg)
{
    static const strata_tier tiers[] = {STRATA_TIER_DEVICE, STRATA_TIER_HOST, STRATA_TIER_NVME};
    static const strata_tier act_tiers[] = {STRATA_TIER_HOST, STRATA_TIER_NVME, STRATA_TIER_AUTO};
    if (a->offload >= 0) {
        strata_tier t = tiers[a->offload];
        if (t == STRATA_TIER_NVME && !a->nvme_dir)
            return bad("--offload", "nvme", "needs --nvme-dir DIR, a directory for the swap files");
        place(&cfg->offload_param, t, a->nvme_dir);
        place(&cfg->offload_optimizer, t, a->nvme_dir);
        if (t != STRATA_TIER_DEVICE)
            cfg->zero_stage = 3;
    }
    if (a->offload_acts >= 0) {
        cfg->offload_activations = act_tiers[a->offload_acts];
        if (a->nvme_dir && cfg->offload_optimizer.nvme_path_count == 0) { /* the swap space's directory */
            snprintf(cfg->offload_optimizer.nvme_path[0], STRATA_PATH_BYTES, "%s", a->nvme_dir);
            cfg->offload_optimizer.nvme_path_count = 1;
        }
    }
    return 0;
}

/* --device, and the dtype that follows from it unless --dtype says otherwise. */
static void apply_device(const args *a, strata_config *cfg)
{
    static const strata_backend_kind backends[] = {STRATA_BACKEND_AUTO, STRATA_BACKEND_HOST, STRATA_BACKEND_CUDA};
    if (a->device >= 0)
        cfg->backend = backends[a->device];
    /* Resolved here rather than in the engine so that the dtype default can follow it. */
    if (cfg->backend == STRATA_BACKEND_AUTO)
        cfg->backend = dev_probe(STRATA_BACKEND_CUDA, NULL, 0) == STRATA_OK ? STRATA_BACKEND_CUDA : STRATA_BACKEND_HOST;
    if (cfg->backend == STRATA_BACKEND_CUDA && cfg->param_dtype == STRATA_DTYPE_FP32)
        cfg->param_dtype = STRATA_DTYPE_BF16; /* tensor cores; --dtype fp32 below still overrides */
    if (cfg->backend == STRATA_BACKEND_CUDA && cfg->offload_optimizer.device == STRATA_TIER_DEVICE)
        cfg->offload_optimizer.device = STRATA_TIER_HOST; /* the optimizer runs on the CPU: its state lives there */
    if (a->dtype >= 0) /* the choices are in strata_dtype's order */
        cfg->param_dtype = (strata_dtype)a->dtype;
}

/* The budgets, the engine's switches and the trace; 0 or an exit code. */
static int apply_engine_flags(const args *a, strata_config *cfg)
{
    const char *sizes[] = {a->device_budget, a->host_budget, a->prefetch};
    const char *flags[] = {"--device-budget", "--host-budget", "--prefetch"};
    size_t *fields[] = {&cfg->device_budget_bytes, &cfg->host_budget_bytes, &cfg->prefetch_bytes};
    for (int k = 0; k < 3; k++)
        if (sizes[k] && !size_parse(sizes[k], fields[k]))
            return bad(flags[k], sizes[k], "is not a size (e.g. 512MiB, 2GiB)");
    if (a->delayed)
        cfg->delayed_update = true;
    if (a->delayed_warmup >= 0)
        cfg->delayed_warmup_steps = a->delayed_warmup;
    if (a->step_in_backward)
        cfg->step_in_backward = true;
    if (a->norm_pass)
        cfg->norm_pass = true;
    if (a->threads)
        cfg->cpu_threads = a->threads;
    if (a->trace)
        snprintf(cfg->trace_path, sizeof cfg->trace_path, "%s", a->trace);
    return 0;
}

/* The config: defaults, then --config, then the flags, then the activations sized from the model in the dtype
 * settled by then. Returns 0 or an exit code. */
static int build_config(args *a, strata_config *cfg)
{
    int rc = load_config(a, cfg);
    if (rc || (rc = apply_offload(a, cfg)))
        return rc;
    apply_device(a, cfg);
    if ((rc = apply_engine_flags(a, cfg)))
        return rc;
    trainer_opts *t = &a->topts;
    t->act_mode = cfg->offload_activations != STRATA_TIER_DEVICE ? GPT_ACT_OFFLOAD
                  : a->checkpointing                              ? GPT_ACT_CHECKPOINT
                                                                  : GPT_ACT_KEEP;
    t->dims.head_rows = gpt_engine_head_rows(&t->dims, t->batch, t->seq, t->act_mode, cfg, &a->embedding_need);
    if (t->dims.head_rows && trainer_pass_micro_batches(t) > 1) {
        train_err("--schedule layerwise: with the token embedding whole the plan needs at least %.2f MiB of the device "
                  "budget's %.2f MiB, and the layer-wise schedule cannot compute it in tiles (each micro-batch's head "
                  "gradient would be kept whole); use --schedule ordinary, or raise --device-budget",
                  (double)a->embedding_need.whole / 1048576, (double)cfg->device_budget_bytes / 1048576);
        return CLI_EXIT_USAGE;
    }
    gpt_engine_reserve(&t->dims, t->batch, t->seq, trainer_pass_micro_batches(t), t->act_mode, cfg);
    gpt_act_format acts;
    const char *why;
    if (gpt_engine_acts(cfg->backend, cfg->param_dtype, &acts, &why) != STRATA_OK) {
        train_err("%s", why);
        return CLI_EXIT_USAGE;
    }
    char err[4096];
    if (strata_config_validate(cfg, err, sizeof err) != STRATA_OK) {
        train_err("the configuration is not valid:\n%s", err);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* The token embedding's tiles, if any, and what the schedule costs in activation memory (the model's reserve adds
 * fp32 conversion buffers for bf16/fp16). */
static void print_schedule(const args *a, const strata_config *cfg)
{
    const trainer_opts *t = &a->topts;
    int held = trainer_pass_micro_batches(t);
    gpt_act_format fmt = gpt_engine_config_acts(cfg);
    gpt_pass_size size = gpt_pass_bytes(&t->dims, t->batch, t->seq, held, t->act_mode, fmt);
    double mib = 1048576;
    if (t->act_mode != GPT_ACT_KEEP) {
        size_t full = gpt_pass_bytes(&t->dims, t->batch, t->seq, held, GPT_ACT_KEEP, fmt).total;
        size_t one = gpt_block_input_bytes(&t->dims, t->batch, t->seq, fmt);
        printf("  activation checkpointing: each block keeps its input (%.2f MiB) and runs its forward again in "
               "backward; activations %.2f MiB instead of %.2f MiB%s\n", (double)one / mib, (double)size.total / mib,
               (double)full / mib, t->act_mode == GPT_ACT_OFFLOAD ? "; the block inputs are offloaded "
                                                                    "(strata.offload_activations), two on the device"
                                                                  : "");
    }
    if (t->dims.head_rows) {
        int v0, v1;
        gpt_head_tile_rows(&t->dims, gpt_head_tiles(&t->dims) - 1, &v0, &v1);
        double pb = (double)strata_dtype_bytes(cfg->param_dtype), budget = (double)cfg->device_budget_bytes;
        double tile = (double)t->dims.head_rows * t->dims.hidden * pb;
        double block = (double)gpt_module_numel(&t->dims, 1) * pb;
        printf("  token embedding in %d vocabulary tiles of %d rows (the last %d), %.2f MiB each: whole it needs at "
               "least %.2f MiB of the %.2f MiB device budget; each tile is fetched for the embeddings, three times for "
               "the head (max, sum, gradient) and once for their backward, with the whole embedding's results\n",
               gpt_head_tiles(&t->dims), t->dims.head_rows, v1 - v0, tile / mib, (double)a->embedding_need.whole / mib,
               budget / mib);
        /* The tiles lower what the embedding needs, down to one piece; the largest module is still fetched whole. */
        if ((double)a->embedding_need.tiled > budget) {
            if (block >= tile)
                printf("  tiled it still needs at least %.2f MiB: each block (%.2f MiB) is fetched whole",
                       (double)a->embedding_need.tiled / mib, block / mib);
            else
                printf("  tiled it still needs at least %.2f MiB: each tile (%.2f MiB, one %d-row piece at the least) "
                       "is fetched whole", (double)a->embedding_need.tiled / mib, tile / mib, GPT_HEAD_PIECE);
            printf(", with the next one ahead and its gradients (a narrower model, or --activation-checkpointing, "
                   "needs less)\n");
        }
    }
    if (held == 1) {
        printf("  schedule %s: one micro-batch at a time through all modules; activations %.2f MiB\n",
               t->layerwise ? "layerwise (grad-accum 1, so the ordinary one)" : "ordinary",
               (double)size.per_micro_batch / mib);
        return;
    }
    printf("  schedule layerwise: %d micro-batches through each module together; activations %d x %.2f MiB + %d kept "
           "head gradients x %.2f MiB = %.2f MiB\n", held, held, (double)size.per_micro_batch / mib, held - 1,
           (double)size.head_grad / mib, (double)size.total / mib);
}

static void print_setup(const args *a, const strata_config *cfg, const trainer_opts *t, const char *data_name)
{
    int world = strata_comm_size(t->comm);
    if (!train_msg_root())
        return;
    bool custom = a->shape.layers || a->shape.heads || a->shape.hidden || a->shape.vocab || a->shape.seq;
    const gpt_dims *d = &t->dims;
    printf("strata train: model %s (layers %d, heads %d, hidden %d, vocab %d, context %d) = %.1fM parameters\n",
           custom ? "custom" : a->model ? a->model : "tiny", d->layers, d->heads, d->hidden, d->vocab, d->seq,
           (double)gpt_numel(d) / 1e6);
    char ranks[32] = "";
    if (world > 1)
        snprintf(ranks, sizeof ranks, " x %d ranks", world);
    printf("  data %s (%zu bytes); batch %d x seq %d x grad-accum %d%s = %lld tokens/step; %lld steps, seed %llu\n",
           data_name, t->data->len, t->batch, t->seq, t->grad_accum, ranks,
           (long long)t->batch * t->seq * t->grad_accum * world, (long long)t->steps, (unsigned long long)t->seed);
    if (t->init_from)
        printf("  initial weights from --init-from %s (the seed orders the data only)\n", t->init_from);
    if (world > 1)
        printf("  world %d ranks (MPI), ZeRO stage %d; this is rank 0; batch and grad-accum are per rank\n", world,
               cfg->zero_stage);
    else
        printf("  world 1 rank, ZeRO stage %d\n", cfg->zero_stage);
    printf("  lr %.3g (warmup %lld, cosine to %.3g); computes on %s in %s activations; params %s %s, optimizer %s; "
           "delayed update %s%s\n",
           cfg->lr, (long long)t->warmup, t->min_lr, cfg->backend == STRATA_BACKEND_CUDA ? "cuda" : "host",
           gpt_act_format_name(gpt_engine_config_acts(cfg)), strata_dtype_name(cfg->param_dtype),
           strata_tier_name(cfg->offload_param.device), strata_tier_name(cfg->offload_optimizer.device),
           cfg->delayed_update ? "on" : "off",
           cfg->step_in_backward ? (cfg->norm_pass ? "; step in backward after a norm pass" : "; step in backward")
                                 : "");
    char decay[512];
    decay_recipe_describe(d, &t->decay, cfg, decay, sizeof decay);
    printf("  %s\n", decay);
    print_schedule(a, cfg);
    /* ZeRO's accounting of model states: parameters and gradients in the device dtype, fp32 master weights and the
     * moments in their form (12, 8 or 6 bytes of optimizer state an element). */
    size_t pbytes = strata_dtype_bytes(cfg->param_dtype);
    double states = (double)gpt_numel(d) * (double)(2 * pbytes + plan_opt_elem_bytes(cfg->optimizer_moments));
    printf("  model states %.1f MiB (parameters, gradients, master weights, Adam moments%s)", states / 1048576,
           cfg->optimizer_moments == STRATA_MOMENTS_BF16   ? " in bf16"
           : cfg->optimizer_moments == STRATA_MOMENTS_8BIT ? " in 8 bits"
                                                           : "");
    if (cfg->device_budget_bytes)
        printf(" = %.1fx the device budget of %.1f MiB", states / (double)cfg->device_budget_bytes,
               (double)cfg->device_budget_bytes / 1048576);
    printf("\n");
    fflush(stdout);
}

/* The model (--model's preset with the shape flags given) and the sequence length into a->topts; 0 or an exit
 * code. */
static int settle_model(args *a)
{
    const gpt_shape *preset = gpt_preset(a->model ? a->model : "tiny");
    if (!preset) {
        train_err("--model \"%s\" is not a preset; allowed: %s", a->model, gpt_preset_names());
        return CLI_EXIT_USAGE;
    }
    trainer_opts *t = &a->topts;
    t->dims = gpt_shape_dims(preset);
    const gpt_shape *g = &a->shape;
    int *dims[] = {&t->dims.layers, &t->dims.heads, &t->dims.hidden, &t->dims.vocab, &t->dims.seq};
    const int given[] = {g->layers, g->heads, g->hidden, g->vocab, g->seq};
    for (int k = 0; k < 5; k++)
        if (given[k])
            *dims[k] = given[k];
    const char *why = gpt_dims_check(&t->dims);
    if (why) {
        train_err("--model/--layers/--heads/--hidden: %s", why);
        return CLI_EXIT_USAGE;
    }
    t->seq = a->seq ? a->seq : t->dims.seq;
    if (t->seq > t->dims.seq) {
        train_err("--seq %d is longer than the model's context %d (set --context)", t->seq, t->dims.seq);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* --data, or the built-in corpus, long enough for one sequence; 0 or an exit code. */
static int load_data(const args *a, int seq, gpt_data *data)
{
    char msg[600];
    strata_status st = a->data ? data_load(a->data, data, msg, sizeof msg) : data_builtin(BUILTIN_DATA_BYTES, data);
    if (st != STRATA_OK) {
        train_err("%s", a->data ? msg : "out of memory for the built-in corpus");
        return a->data ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    }
    if (data->len <= (size_t)seq) {
        train_err("--seq %d is larger than the data (\"%s\", %zu bytes); it needs at least --seq + 1 bytes", seq,
                  a->data ? a->data : "built-in", data->len);
        data_free(data);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* The run's schedule, from the flags and the settled config. */
static void fill_run(const args *a, const strata_config *cfg, trainer_opts *t)
{
    t->steps = a->steps;
    t->warmup = a->warmup >= 0 ? a->warmup : a->steps / 10;
    t->lr = cfg->lr;
    t->min_lr = a->min_lr >= 0 ? a->min_lr : cfg->lr / 10;
    t->seed = a->seed;
    t->save_every = a->save_every;
    t->keep = a->keep;
    t->quiet = a->quiet;
    if (a->threads) {
        /* The model's kernels; the engine takes its own thread count from cpu_threads. */
        omp_set_num_threads(a->threads);
        openblas_set_num_threads(a->threads);
    }
}

/* *training is set once the ranks start to work together: a failure before that is one every rank meets alike (the
 * same command line and files), a failure after may be this rank's alone. */
static int train(int argc, char **argv, strata_comm *comm, bool *training)
{
    args a = {.batch = 8, .grad_accum = 1, .steps = 100, .warmup = -1, .lr = -1, .min_lr = -1, .keep = 2,
              .delayed_warmup = -1, .offload = -1, .offload_acts = -1, .device = -1, .dtype = -1, .schedule = -1,
              .topts = {.decay = DECAY_RECIPE_INIT}};
    int rc = parse(argc, argv, &a);
    if (rc || (rc = settle_model(&a)))
        return rc;
    trainer_opts *t = &a.topts;
    t->batch = a.batch;
    t->grad_accum = a.grad_accum;
    t->layerwise = a.schedule == 1;
    strata_config cfg;
    gpt_data data;
    if ((rc = build_config(&a, &cfg)) || (rc = load_data(&a, t->seq, &data)))
        return rc;
    t->data = &data;
    t->comm = comm;
    fill_run(&a, &cfg, t);
    print_setup(&a, &cfg, t, a.data ? a.data : "built-in corpus");
    *training = true;
    bool world_done;
    rc = trainer_run(t, &cfg, &world_done);
    if (world_done)
        *training = false; /* the ranks agreed on rc after their last collective: nobody waits for this one */
    data_free(&data);
    return rc;
}

int cmd_train(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        cli_print_help(&train_spec, stdout);
        return CLI_EXIT_OK;
    }
    /* Under mpirun: MPI, one rank per process; otherwise a world of one, as without MPI. */
    strata_comm *comm;
    if (strata_comm_create(&comm) != STRATA_OK) {
        train_err("joining the launcher's world (strata_comm_create) failed: %s", strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    train_msg_world(strata_comm_rank(comm), strata_comm_size(comm));
    bool training = false;
    int rc = train(argc, argv, comm, &training);
    /* The other ranks may be waiting for this one in a collective: tell them, so that they fail at once with this
     * rank named instead of timing out. (An engine call that failed has told them already.) */
    if (rc != 0 && training)
        strata_comm_abort(comm, train_last_error());
    strata_comm_destroy(comm);
    return rc;
}
