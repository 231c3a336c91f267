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

#include "base/nearest.h"
#include "base/size.h"
#include "gpu/device.h"
#include "model/data.h"
#include "model/gpt_engine.h"
#include "model/gpt_pass.h"
#include "strata.h"
#include "tools/cli.h"
#include "tools/gpt_shape.h"
#include "tools/train_msg.h"
#include "tools/trainer.h"

#define BUILTIN_DATA_BYTES (4u << 20)

/* The range of a rate flag, from its entry in the option table below. */
static const char *rate_range(const char *flag, char *buf, size_t len);

static void usage(FILE *out)
{
    char lr[32], min_lr[32];
    fprintf(out,
            "usage: strata train [--model PRESET] [--layers N] [--heads N] [--hidden N] [--vocab N] [--context N]\n"
            "                    [--config FILE] [--data FILE] [--steps N] [--batch N] [--grad-accum N] [--seq N]\n"
            "                    [--schedule ordinary|layerwise]\n"
            "                    [--lr X] [--min-lr X] [--warmup N] [--seed N] [--device auto|host|cuda]\n"
            "                    [--dtype fp32|bf16|fp16]\n"
            "                    [--offload device|host|nvme] [--nvme-dir DIR] [--device-budget SIZE]\n"
            "                    [--host-budget SIZE] [--prefetch SIZE] [--delayed-update] [--delayed-warmup N]\n"
            "                    [--step-in-backward] [--activation-checkpointing]\n"
            "                    [--offload-activations host|nvme|auto]\n"
            "                    [--threads N] [--trace FILE] [--log-jsonl FILE]\n"
            "                    [--dump-weights FILE] [--save DIR] [--save-every K] [--keep N]\n"
            "                    [--resume DIR] [--quiet]\n\n"
            "Trains a GPT-2 style model (byte-level tokens) with strata holding its parameters and optimizer state.\n"
            "Under `mpirun -np N` it trains as N data-parallel ranks (ZeRO stage from the config; --offload host|nvme\n"
            "means stage 3): --batch and --grad-accum are per rank, rank r takes micro-batches r, N + r, 2N + r, ...\n"
            "of each step, so N ranks x grad-accum k train as 1 rank x N*k. Only rank 0 prints (errors excepted);\n"
            "--save writes sharded checkpoints (each rank its own files), which any number of ranks can --resume.\n"
            "  --model PRESET     %s (default tiny); --layers/--heads/--hidden/--vocab/--context override it\n"
            "  --config FILE      a DeepSpeed-style JSON config; the flags below override it\n"
            "  --data FILE        training text (default: a built-in generated English-like corpus)\n"
            "  --steps N          optimizer steps (default 100); --batch sequences per micro-batch (default 8);\n"
            "                     --grad-accum micro-batches per step and rank (default 1); --seq tokens per sequence\n"
            "                     (default: the model's context)\n"
            "  --schedule S       ordinary (default): each micro-batch goes through all modules before the next;\n"
            "                     layerwise: the step's --grad-accum micro-batches go through each module together,\n"
            "                     so a step fetches every module once forward, once for the head and once backward\n"
            "                     instead of grad-accum times each, for grad-accum times the activation memory; the\n"
            "                     weights are the ordinary schedule's bit for bit\n"
            "  --lr X             peak learning rate in %s (default 1e-3 or the config's); linear warmup over\n"
            "                     --warmup steps (default steps/10), then cosine down to --min-lr X in %s\n"
            "                     (default lr/10)\n"
            "  --device KIND      where the model computes: cuda, host, or auto (default: cuda when a GPU answers)\n"
            "  --dtype D          parameter and gradient dtype on the device (default bf16 on cuda, fp32 on host)\n"
            "  --offload TIER     where parameters and optimizer state live: device (default), host or nvme;\n"
            "                     on cuda the optimizer state stays in host memory for device\n"
            "                     (nvme needs --nvme-dir DIR, a scratch directory for the swap files)\n"
            "  --device-budget, --host-budget SIZE  memory strata may use per tier; --prefetch SIZE the bytes\n"
            "                     of parameters fetched ahead\n"
            "  --delayed-update   ZeRO-Offload's one-step-delayed optimizer step, after --delayed-warmup N steps\n"
            "  --step-in-backward each module's optimizer update as soon as its gradients are complete, during\n"
            "                     backward, without a gradient store (strata.step_in_backward; --grad-accum 1)\n"
            "  --activation-checkpointing  each block keeps only its input and runs its forward again in backward:\n"
            "                     2/3 of a block forward more per block, its internals held once instead of per block\n"
            "  --offload-activations T  checkpointing, with the block inputs kept in host memory or on NVMe (the\n"
            "                     swap space of --nvme-dir or the config's nvme_path; auto: host if the budget holds\n"
            "                     them) instead of the device, restored ahead of backward (strata.offload_activations)\n"
            "  --trace FILE       Chrome trace-event JSON of every transfer and step (open in ui.perfetto.dev)\n"
            "  --log-jsonl FILE   one JSON object per step (loss, lr, tokens/s, stall, bytes per link, comm bytes, peak\n"
            "                     bytes per tier, fetches); with N ranks each rank logs its own: rank 0 to FILE,\n"
            "                     rank r to FILE.rank<r> (bytes are the rank's; loss and tokens/s the world's)\n"
            "  --dump-weights F   write the final fp32 master weights (raw, model order) to F (rank 0 writes)\n"
            "  --save DIR         checkpoints to DIR/step-N at the end, every --save-every K steps and on\n"
            "                     SIGINT/SIGTERM, keeping the last --keep (default 2); --resume DIR continues.\n"
            "                     DIR is checked and locked for the run at the start (a second run is refused);\n"
            "                     a save that finds the disk full warns and training goes on, exit status 1\n"
            "SIZE takes bytes or strings like 2GiB.\n",
            gpt_preset_names(), rate_range("--lr", lr, sizeof lr), rate_range("--min-lr", min_lr, sizeof min_lr));
}

typedef struct args {
    const char *model, *config, *data, *offload, *nvme_dir, *trace, *dtype, *device, *schedule, *offload_acts;
    const char *device_budget, *host_budget, *prefetch;
    int layers, heads, hidden, vocab, context, batch, grad_accum, seq, threads, keep, delayed_warmup;
    long long steps, warmup, save_every, seed;
    double lr, min_lr;
    bool delayed, quiet, step_in_backward, checkpointing;
    trainer_opts topts;
} args;

/* What a flag's value is: none (a switch), text kept as given, an int or a long long in [lo, hi], or a rate in
 * [lo, hi) — (lo, hi) with open_lo. */
typedef enum opt_kind { OPT_SWITCH, OPT_TEXT, OPT_INT, OPT_LL, OPT_RATE } opt_kind;

typedef struct opt {
    const char *flag;
    opt_kind kind;
    size_t offset; /* of the destination in args */
    double lo, hi;
    bool open_lo;
} opt;

/* Every flag of `strata train`, one entry each: the parser, its range messages, --help's ranges and "did you mean"
 * read this table. */
#define SWITCH(flag, field) {flag, OPT_SWITCH, offsetof(args, field), 0, 0, false}
#define TEXT(flag, field) {flag, OPT_TEXT, offsetof(args, field), 0, 0, false}
#define NUM(flag, kind, field, lo, hi) {flag, kind, offsetof(args, field), lo, hi, false}
static const opt opts[] = {
    SWITCH("--delayed-update", delayed), SWITCH("--step-in-backward", step_in_backward),
    SWITCH("--activation-checkpointing", checkpointing), SWITCH("--quiet", quiet),
    NUM("--layers", OPT_INT, layers, 1, 4096), NUM("--heads", OPT_INT, heads, 1, 1024),
    NUM("--hidden", OPT_INT, hidden, 1, 65536), NUM("--vocab", OPT_INT, vocab, 256, 1 << 22),
    NUM("--context", OPT_INT, context, 1, 1 << 20), NUM("--batch", OPT_INT, batch, 1, 1 << 20),
    NUM("--grad-accum", OPT_INT, grad_accum, 1, 1 << 20), NUM("--seq", OPT_INT, seq, 1, 1 << 20),
    NUM("--threads", OPT_INT, threads, 1, 4096), NUM("--keep", OPT_INT, keep, 1, 1000),
    NUM("--delayed-warmup", OPT_INT, delayed_warmup, 0, 1 << 30),
    NUM("--steps", OPT_LL, steps, 1, 1e15), NUM("--warmup", OPT_LL, warmup, 0, 1e15),
    NUM("--save-every", OPT_LL, save_every, 0, 1e15), NUM("--seed", OPT_LL, seed, 0, 1e15),
    /* The engine refuses an lr of 0 (optimizer.params.lr is in (0, 1e6]); the cosine may end at 0. */
    {"--lr", OPT_RATE, offsetof(args, lr), 0, 10, true}, NUM("--min-lr", OPT_RATE, min_lr, 0, 10),
    TEXT("--model", model), TEXT("--config", config), TEXT("--data", data), TEXT("--offload", offload),
    TEXT("--offload-activations", offload_acts), TEXT("--nvme-dir", nvme_dir), TEXT("--trace", trace),
    TEXT("--dtype", dtype), TEXT("--device", device), TEXT("--schedule", schedule),
    TEXT("--device-budget", device_budget), TEXT("--host-budget", host_budget), TEXT("--prefetch", prefetch),
    TEXT("--log-jsonl", topts.log_jsonl), TEXT("--dump-weights", topts.dump_weights),
    TEXT("--save", topts.save_dir), TEXT("--resume", topts.resume_dir),
};
#undef SWITCH
#undef TEXT
#undef NUM

static const opt *opt_find(const char *flag)
{
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
        if (strcmp(opts[k].flag, flag) == 0)
            return &opts[k];
    return NULL;
}

/* A rate flag's range as --help and its error say it: "(0, 10)", "[0, 10)". */
static const char *rate_range(const char *flag, char *buf, size_t len)
{
    const opt *o = opt_find(flag);
    snprintf(buf, len, "%c%g, %g)", o->open_lo ? '(' : '[', o->lo, o->hi);
    return buf;
}

static int bad(const char *flag, const char *value, const char *why)
{
    train_err("%s \"%s\": %s", flag, value, why);
    return CLI_EXIT_USAGE;
}

static bool parse_ll(const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    long long v = strtoll(text, &end, 10);
    if (!*text || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* An unknown flag, with the known one nearest to it when one is close (the config keys' rule, base/nearest.h). */
static int unknown_option(const char *f)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        size_t d = nearest_distance(f + 2, opts[k].flag + 2);
        if (d < best_d) {
            best_d = d;
            best = opts[k].flag;
        }
    }
    if (f[2] && best && nearest_is_close(f + 2, best_d))
        train_err("unknown option %s; did you mean %s? (see `strata train --help`)", f, best);
    else
        train_err("unknown option %s; see `strata train --help`", f);
    return CLI_EXIT_USAGE;
}

/* Stores v, the value of flag o, into a; 0 or an exit code. */
static int set_value(const opt *o, const char *v, args *a)
{
    void *dst = (char *)a + o->offset;
    long long n = 0;
    switch (o->kind) {
    case OPT_INT:
    case OPT_LL:
        if (!parse_ll(v, (long long)o->lo, (long long)o->hi, &n)) {
            if (o->kind == OPT_INT)
                train_err("%s \"%s\" must be a whole number in [%.0f, %.0f]", o->flag, v, o->lo, o->hi);
            else
                train_err("%s \"%s\" must be a whole number of at least %.0f", o->flag, v, o->lo);
            return CLI_EXIT_USAGE;
        }
        if (o->kind == OPT_INT)
            *(int *)dst = (int)n;
        else
            *(long long *)dst = n;
        return 0;
    case OPT_RATE: {
        char *end, range[32], why[64];
        double x = strtod(v, &end);
        if (!*v || *end || !(o->open_lo ? x > o->lo : x >= o->lo) || !(x < o->hi)) {
            snprintf(why, sizeof why, "must be a learning rate in %s", rate_range(o->flag, range, sizeof range));
            return bad(o->flag, v, why);
        }
        *(double *)dst = x;
        return 0;
    }
    case OPT_TEXT:
        *(const char **)dst = v;
        return 0;
    case OPT_SWITCH:
        break;
    }
    *(bool *)dst = true;
    return 0;
}

/* Reads argv into a; returns 0 or an exit code. */
static int parse(int argc, char **argv, args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strncmp(f, "--", 2) != 0)
            return bad("argument", f, "unexpected; see `strata train --help`");
        const opt *o = opt_find(f);
        if (!o)
            return unknown_option(f);
        if (o->kind == OPT_SWITCH) {
            set_value(o, NULL, a);
            continue;
        }
        if (i + 1 >= argc) {
            train_err("%s needs a value; see `strata train --help`", f);
            return CLI_EXIT_USAGE;
        }
        int rc = set_value(o, argv[++i], a);
        if (rc)
            return rc;
    }
    return 0;
}

static void place(strata_offload_config *o, strata_tier tier, const char *dir)
{
    o->device = tier;
    if (tier == STRATA_TIER_NVME) {
        snprintf(o->nvme_path[0], STRATA_PATH_BYTES, "%s", dir);
        o->nvme_path_count = 1;
    }
}

/* The config: defaults, then --config, then the flags. Returns 0 or an exit code. */
static int build_config(args *a, strata_config *cfg)
{
    strata_config_init(cfg);
    cfg->lr = 1e-3f;
    cfg->weight_decay = 0.0f;
    if (a->config) {
        char err[4096];
        if (strata_config_load_json(cfg, a->config, err, sizeof err) != STRATA_OK) {
            train_err("--config \"%s\":\n%s", a->config, err);
            return CLI_EXIT_USAGE;
        }
    }
    if (a->lr >= 0) /* both spellings of the lr (strata.h, lr_exact): messages then show the value as given */
        cfg->lr = (float)(cfg->lr_exact = a->lr);
    if (a->offload) {
        strata_tier t;
        if (strcmp(a->offload, "device") == 0)
            t = STRATA_TIER_DEVICE;
        else if (strcmp(a->offload, "host") == 0)
            t = STRATA_TIER_HOST;
        else if (strcmp(a->offload, "nvme") == 0)
            t = STRATA_TIER_NVME;
        else
            return bad("--offload", a->offload, "allowed: device, host, nvme");
        if (t == STRATA_TIER_NVME && !a->nvme_dir)
            return bad("--offload", a->offload, "needs --nvme-dir DIR, a directory for the swap files");
        place(&cfg->offload_param, t, a->nvme_dir);
        place(&cfg->offload_optimizer, t, a->nvme_dir);
        if (t != STRATA_TIER_DEVICE)
            cfg->zero_stage = 3;
    }
    if (a->offload_acts) {
        if (strcmp(a->offload_acts, "host") == 0)
            cfg->offload_activations = STRATA_TIER_HOST;
        else if (strcmp(a->offload_acts, "nvme") == 0 || strcmp(a->offload_acts, "auto") == 0)
            cfg->offload_activations = a->offload_acts[0] == 'n' ? STRATA_TIER_NVME : STRATA_TIER_AUTO;
        else
            return bad("--offload-activations", a->offload_acts, "allowed: host, nvme, auto");
        if (a->nvme_dir && cfg->offload_optimizer.nvme_path_count == 0) { /* the swap space's directory */
            snprintf(cfg->offload_optimizer.nvme_path[0], STRATA_PATH_BYTES, "%s", a->nvme_dir);
            cfg->offload_optimizer.nvme_path_count = 1;
        }
    }
    if (a->device) {
        if (strcmp(a->device, "auto") == 0)
            cfg->backend = STRATA_BACKEND_AUTO;
        else if (strcmp(a->device, "host") == 0)
            cfg->backend = STRATA_BACKEND_HOST;
        else if (strcmp(a->device, "cuda") == 0)
            cfg->backend = STRATA_BACKEND_CUDA;
        else
            return bad("--device", a->device, "allowed: auto, host, cuda");
    }
    /* Resolved here rather than in the engine so that the dtype default can follow it. */
    if (cfg->backend == STRATA_BACKEND_AUTO)
        cfg->backend = dev_probe(STRATA_BACKEND_CUDA, NULL, 0) == STRATA_OK ? STRATA_BACKEND_CUDA : STRATA_BACKEND_HOST;
    if (cfg->backend == STRATA_BACKEND_CUDA && cfg->param_dtype == STRATA_DTYPE_FP32)
        cfg->param_dtype = STRATA_DTYPE_BF16; /* tensor cores; --dtype fp32 below still overrides */
    if (cfg->backend == STRATA_BACKEND_CUDA && cfg->offload_optimizer.device == STRATA_TIER_DEVICE)
        cfg->offload_optimizer.device = STRATA_TIER_HOST; /* the optimizer runs on the CPU: its state lives there */
    if (a->dtype) {
        int k = 0;
        while (k < 3 && strcmp(a->dtype, strata_dtype_name((strata_dtype)k)) != 0)
            k++;
        if (k == 3)
            return bad("--dtype", a->dtype, "allowed: fp32, bf16, fp16");
        cfg->param_dtype = (strata_dtype)k;
    }
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
    if (a->threads)
        cfg->cpu_threads = a->threads;
    if (a->trace)
        snprintf(cfg->trace_path, sizeof cfg->trace_path, "%s", a->trace);
    /* The activations, sized from the model, in the dtype settled above. */
    trainer_opts *t = &a->topts;
    t->act_mode = cfg->offload_activations != STRATA_TIER_DEVICE ? GPT_ACT_OFFLOAD
                  : a->checkpointing                              ? GPT_ACT_CHECKPOINT
                                                                  : GPT_ACT_KEEP;
    gpt_engine_reserve(&t->dims, t->batch, t->seq, trainer_pass_micro_batches(t), t->act_mode, cfg);
    char err[4096];
    if (strata_config_validate(cfg, err, sizeof err) != STRATA_OK) {
        train_err("the configuration is not valid:\n%s", err);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* What the schedule costs in activation memory (the model's reserve adds fp32 conversion buffers for bf16/fp16). */
static void print_schedule(const trainer_opts *t)
{
    int held = trainer_pass_micro_batches(t);
    gpt_pass_size size = gpt_pass_bytes(&t->dims, t->batch, t->seq, held, t->act_mode);
    double mib = 1048576;
    if (t->act_mode != GPT_ACT_KEEP) {
        size_t full = gpt_pass_bytes(&t->dims, t->batch, t->seq, held, GPT_ACT_KEEP).total;
        size_t one = gpt_block_input_bytes(&t->dims, t->batch, t->seq);
        printf("  activation checkpointing: each block keeps its input (%.2f MiB) and runs its forward again in "
               "backward; activations %.2f MiB instead of %.2f MiB%s\n", (double)one / mib, (double)size.total / mib,
               (double)full / mib, t->act_mode == GPT_ACT_OFFLOAD ? "; the block inputs are offloaded "
                                                                    "(strata.offload_activations), two on the device"
                                                                  : "");
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
    bool custom = a->layers || a->heads || a->hidden || a->vocab || a->context;
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
    if (world > 1)
        printf("  world %d ranks (MPI), ZeRO stage %d; this is rank 0; batch and grad-accum are per rank\n", world,
               cfg->zero_stage);
    else
        printf("  world 1 rank, ZeRO stage %d\n", cfg->zero_stage);
    printf("  lr %.3g (warmup %lld, cosine to %.3g); computes on %s; params %s %s, optimizer %s; delayed update %s%s\n",
           cfg->lr, (long long)t->warmup, t->min_lr, cfg->backend == STRATA_BACKEND_CUDA ? "cuda" : "host",
           strata_dtype_name(cfg->param_dtype), strata_tier_name(cfg->offload_param.device),
           strata_tier_name(cfg->offload_optimizer.device),
           cfg->delayed_update ? "on" : "off", cfg->step_in_backward ? "; step in backward" : "");
    print_schedule(t);
    /* ZeRO's accounting of model states: parameters and gradients in the device dtype, fp32 master and moments. */
    size_t pbytes = strata_dtype_bytes(cfg->param_dtype);
    double states = (double)gpt_numel(d) * (double)(2 * pbytes + 12);
    printf("  model states %.1f MiB (parameters, gradients, master weights, Adam moments)", states / 1048576);
    if (cfg->device_budget_bytes)
        printf(" = %.1fx the device budget of %.1f MiB", states / (double)cfg->device_budget_bytes,
               (double)cfg->device_budget_bytes / 1048576);
    printf("\n");
    fflush(stdout);
}

/* *training is set once the ranks start to work together: a failure before that is one every rank meets alike (the
 * same command line and files), a failure after may be this rank's alone. */
static int train(int argc, char **argv, strata_comm *comm, bool *training)
{
    args a = {.batch = 8, .grad_accum = 1, .steps = 100, .warmup = -1, .lr = -1, .min_lr = -1, .keep = 2,
              .delayed_warmup = -1};
    int rc = parse(argc, argv, &a);
    if (rc)
        return rc;
    if (a.schedule && strcmp(a.schedule, "ordinary") != 0 && strcmp(a.schedule, "layerwise") != 0)
        return bad("--schedule", a.schedule, "allowed: ordinary, layerwise (layerwise runs the --grad-accum "
                   "micro-batches through each module together: fewer fetches, more activation memory)");
    const gpt_shape *preset = gpt_preset(a.model ? a.model : "tiny");
    if (!preset) {
        train_err("--model \"%s\" is not a preset; allowed: %s", a.model, gpt_preset_names());
        return CLI_EXIT_USAGE;
    }
    trainer_opts *t = &a.topts;
    t->dims = gpt_shape_dims(preset);
    int *over[] = {&a.layers, &a.heads, &a.hidden, &a.vocab, &a.context};
    int *dims[] = {&t->dims.layers, &t->dims.heads, &t->dims.hidden, &t->dims.vocab, &t->dims.seq};
    for (int k = 0; k < 5; k++)
        if (*over[k])
            *dims[k] = *over[k];
    const char *why = gpt_dims_check(&t->dims);
    if (why) {
        train_err("--model/--layers/--heads/--hidden: %s", why);
        return CLI_EXIT_USAGE;
    }
    t->seq = a.seq ? a.seq : t->dims.seq;
    if (t->seq > t->dims.seq) {
        train_err("--seq %d is longer than the model's context %d (set --context)", t->seq,
                t->dims.seq);
        return CLI_EXIT_USAGE;
    }
    t->batch = a.batch;
    t->grad_accum = a.grad_accum;
    t->layerwise = a.schedule && strcmp(a.schedule, "layerwise") == 0;
    strata_config cfg;
    if ((rc = build_config(&a, &cfg)))
        return rc;
    gpt_data data;
    char msg[600];
    strata_status st = a.data ? data_load(a.data, &data, msg, sizeof msg) : data_builtin(BUILTIN_DATA_BYTES, &data);
    if (st != STRATA_OK) {
        train_err("%s", a.data ? msg : "out of memory for the built-in corpus");
        return a.data ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    }
    if (data.len <= (size_t)t->seq) {
        train_err("--seq %d is larger than the data (\"%s\", %zu bytes); it needs at least "
                        "--seq + 1 bytes", t->seq, a.data ? a.data : "built-in", data.len);
        data_free(&data);
        return CLI_EXIT_USAGE;
    }
    t->data = &data;
    t->comm = comm;
    t->steps = a.steps;
    t->warmup = a.warmup >= 0 ? a.warmup : a.steps / 10;
    t->lr = cfg.lr;
    t->min_lr = a.min_lr >= 0 ? a.min_lr : cfg.lr / 10;
    t->seed = a.seed;
    t->save_every = a.save_every;
    t->keep = a.keep;
    t->quiet = a.quiet;
    if (a.threads) {
        /* The model's kernels; the engine takes its own thread count from cpu_threads. */
        omp_set_num_threads(a.threads);
        openblas_set_num_threads(a.threads);
    }
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
        usage(stdout);
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
