/* The training loop of `strata train` (see trainer.h). */
#include "tools/trainer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/stream.h"
#include "engine/config/config.h"
#include "model/gpt_engine.h"
#include "model/gpt_weights.h"
#include "tools/ckpt_locate.h"
#include "tools/train_groups.h"
#include "tools/train_hf_config.h"
#include "tools/train_msg.h"
#include "tools/train_report.h"
#include "tools/train_saves.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    stop_signal = sig;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int trainer_pass_micro_batches(const trainer_opts *o)
{
    return o->layerwise ? o->grad_accum : 1;
}

double trainer_lr(const trainer_opts *o, int64_t s)
{
    if (s < o->warmup)
        return o->lr * (double)(s + 1) / (double)o->warmup;
    int64_t span = o->steps - o->warmup;
    double progress = span > 1 ? (double)(s - o->warmup) / (double)(span - 1) : 1.0;
    return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * progress));
}

/* ---------------------------------------------------------------- the loop */

static int fail(strata_engine *e, const char *what)
{
    train_err("%s failed: %s", what, strata_last_error(e));
    return 1;
}

/* Every rank reads (a partitioned model's master weights are gathered from all ranks); rank 0 writes the file.
 * 0, or the exit code with the failure said. */
static int dump_weights(strata_engine *e, gpt_model *m, const trainer_opts *o)
{
    size_t n = gpt_numel(&o->dims);
    float *w = malloc(n * sizeof(float));
    if (!w) {
        train_err("--dump-weights: out of memory for %zu weights", n);
        return 1;
    }
    if (gpt_model_read_weights(m, w) != STRATA_OK) {
        free(w);
        return fail(e, "--dump-weights: reading the weights (gpt_model_read_weights)");
    }
    int err = 0;
    if (train_msg_root()) {
        FILE *f = fopen(o->dump_weights, "wb");
        err = !f ? errno : fwrite(w, sizeof(float), n, f) != n ? errno : 0;
        /* The last bytes reach the file only at fclose, and so may fail only there (a full disk). */
        int close_err = f ? stream_close_errno(f) : 0;
        if (!err)
            err = close_err;
        if (err)
            train_err("--dump-weights \"%s\": cannot write: %s", o->dump_weights, strerror(err));
    }
    free(w);
    return err ? 1 : 0;
}

/* What one run holds; run_close frees it. */
typedef struct run {
    strata_engine *e;
    gpt_model *m;
    FILE *jsonl;
    char jsonl_path[4096];
    bool outputs_failed;           /* the trace or the log was not written: the run exits 1 at the end */
    train_saves saves;             /* --save: the root checked and locked, and the saves' record */
    train_groups groups;           /* the optimizer's parameter groups (the weight-decay recipe's) */
    int32_t *tokens, *targets;     /* the micro-batches of one pass, one after the other */
    double *losses;                /* their losses */
    double startup_s;              /* engine creation to the model's buffers: plan, allocation, initial state */
} run;

/* --log-jsonl FILE: rank 0 writes FILE (what world 1 writes, so readers of FILE keep working), rank r > 0
 * FILE.rank<r>. 0, or the exit code. */
static int open_jsonl(run *r, const trainer_opts *o)
{
    if (!o->log_jsonl)
        return 0;
    char *path = r->jsonl_path;
    size_t len = sizeof r->jsonl_path;
    int rank = strata_comm_rank(o->comm);
    if (rank == 0)
        snprintf(path, len, "%s", o->log_jsonl);
    else
        snprintf(path, len, "%s.rank%d", o->log_jsonl, rank);
    if (!(r->jsonl = fopen(path, "w"))) {
        train_err("--log-jsonl \"%s\": cannot open: %s", path, strerror(errno));
        return 2;
    }
    return 0;
}

/* The flag that sets a model dimension. */
static const char *dim_flag(gpt_weights_dim dim)
{
    switch (dim) {
    case GPT_DIM_LAYERS: return "--layers";
    case GPT_DIM_HIDDEN: return "--hidden";
    case GPT_DIM_VOCAB: return "--vocab";
    case GPT_DIM_CONTEXT: return "--context";
    default: return NULL;
    }
}

/* --init-from: every parameter's initial values from the file, read during finalize; 0, or the exit code. */
static int init_from(run *r, const trainer_opts *o)
{
    gpt_weights_report rep;
    strata_status st = gpt_model_load_weights(r->m, o->init_from, &rep);
    if (st != STRATA_OK) {
        const char *flag = dim_flag(rep.dim);
        if (flag)
            train_err("--init-from \"%s\": %s; set %s %ld (or --model) to match the weights", o->init_from, rep.why,
                      flag, rep.file_value);
        else
            train_err("--init-from \"%s\": %s", o->init_from, rep.why);
        return st == STRATA_ENOTFOUND ? 2 : 1;
    }
    char config[4200], why[4400], heads[4400] = "";
    hf_heads_verdict v = hf_config_check_heads(o->init_from, gpt_model_dims(r->m)->heads, config, sizeof config, why,
                                               sizeof why);
    if (v == HF_HEADS_DIFFER) {
        train_err("--init-from \"%s\": %s", o->init_from, why);
        return 2;
    }
    if (v == HF_HEADS_AGREE)
        snprintf(heads, sizeof heads, "; %d heads, as %s says", gpt_model_dims(r->m)->heads, config);
    else
        snprintf(heads, sizeof heads, "; the heads (%d) not checked: no head count in %s, and the tensors cannot "
                 "show it: --heads must be the model's", gpt_model_dims(r->m)->heads, config);
    if (train_msg_root()) {
        printf("  weights from %s: %s layout, %zu parameters from %zu tensors%s (read while strata places them)%s\n",
               o->init_from, gpt_weights_layout_name(rep.layout), rep.loaded, rep.tensors,
               rep.layout == GPT_WEIGHTS_HF ? "; Conv1D weights transposed, lm_head tied to wte" : "", heads);
        fflush(stdout);
    }
    return 0;
}

/* Engine, model and activations; 0, or the exit code. */
static int run_open(run *r, const trainer_opts *o, strata_config *cfg)
{
    double t0 = now_s();
    int rc;
    int held = trainer_pass_micro_batches(o);
    size_t ntok = (size_t)o->batch * o->seq * held;
    r->tokens = malloc(ntok * sizeof(int32_t));
    r->targets = malloc(ntok * sizeof(int32_t));
    r->losses = malloc((size_t)held * sizeof(double));
    if (!r->tokens || !r->targets || !r->losses) {
        train_err("out of memory");
        return 1;
    }
    if (strata_engine_create_ranked(cfg, o->comm, NULL, &r->e) != STRATA_OK)
        return fail(NULL, "creating the engine");
    if (gpt_model_register(r->e, &o->dims, o->seed, &r->m) != STRATA_OK)
        return fail(r->e, "registering the model");
    if (o->init_from && (rc = init_from(r, o)) != 0)
        return rc;
    /* What every rank must be given alike beyond the config, the model and the parameter groups (the weight-decay
     * recipe's), which finalize compares itself: a rank with other steps, batches or schedule would train other math,
     * or wait for collectives that never come. */
    const struct {
        const char *flag;
        double value;
    } agreed[] = {{"--steps", (double)o->steps}, {"--grad-accum", o->grad_accum}, {"--batch", o->batch},
                  {"--seq", o->seq}, {"--seed", (double)o->seed}, {"--lr", o->lr}, {"--min-lr", o->min_lr},
                  {"--warmup", (double)o->warmup}, {"--schedule layerwise", o->layerwise},
                  /* chosen from each rank's own --device-budget */
                  {"embedding tile rows (--device-budget)", o->dims.head_rows},
                  /* an environment variable, which mpirun does not carry to other hosts unless told (-x) */
                  {"STRATA_MODEL_ACTS=bf16", gpt_engine_config_acts(cfg) == GPT_ACTS_BF16}};
    for (size_t i = 0; i < sizeof agreed / sizeof agreed[0]; i++)
        if (strata_engine_agree_on(r->e, agreed[i].flag, agreed[i].value) != STRATA_OK)
            return fail(r->e, "declaring what the ranks must agree on (strata_engine_agree_on)");
    if (train_groups_make(&r->groups, r->e, r->m, &o->decay) != STRATA_OK)
        return fail(r->e, "making the optimizer's parameter groups (strata_group_add)");
    /* Step in backward must know from the first step that the head's hand-over of the embeddings is not their last. */
    if (cfg->step_in_backward && gpt_model_declare_order(r->m) != STRATA_OK)
        return fail(r->e, "declaring the fetch order (strata_module_order)");
    if (strata_engine_finalize(r->e) != STRATA_OK)
        return fail(r->e, "planning the memory (strata_engine_finalize)");
    /* The header named the offload devices as configured; "auto" is settled only now. */
    char why[1024];
    if (strata_engine_placement(r->e, NULL, NULL, NULL, why, sizeof why) == STRATA_OK && why[0] && train_msg_root()) {
        printf("  placement %s\n", why);
        fflush(stdout);
    }
    strata_status st = gpt_model_prepare(r->m, o->batch, o->seq, held, o->act_mode, cfg->param_dtype);
    if (st == STRATA_EUNSUPPORTED) {
        train_err("this build has no CUDA kernels for the model (nvcc was not found when it "
                        "was configured); use --device host");
        return 1;
    }
    if (st != STRATA_OK && *gpt_model_error(r->m)) {
        train_err("the model's kernels cannot start: %s", gpt_model_error(r->m));
        return 1;
    }
    if (st != STRATA_OK)
        return fail(r->e, "allocating the activations (strata_device_alloc)");
    r->startup_s = now_s() - t0;
    return open_jsonl(r, o);
}

static void run_close(run *r)
{
    if (r->jsonl)
        fclose(r->jsonl);
    gpt_model_destroy(r->m);
    strata_engine_destroy(r->e);
    free(r->tokens);
    free(r->targets);
    free(r->losses);
}

/* --resume: loads the checkpoint and sets *start to where its data continues; 0, or the exit code. */
static int resume(run *r, const trainer_opts *o, int64_t *start)
{
    char buf[4096];
    const char *path = ckpt_locate(o->resume_dir, buf, sizeof buf);
    if (!path) {
        train_err("--resume \"%s\": no checkpoint there: %s; %s", o->resume_dir,
                strata_last_error(NULL), CKPT_LOCATE_EXPECTED);
        return 2;
    }
    double saved_decay;
    int rc = train_groups_check_checkpoint(&r->groups, path, &saved_decay);
    if (rc)
        return rc;
    if (strata_load(r->e, path) != STRATA_OK)
        return fail(r->e, "resuming (strata_load)");
    /* The data continues where the saved run's strata_step calls stopped. */
    strata_checkpoint_info info;
    if (strata_checkpoint_inspect(path, &info) != STRATA_OK)
        return fail(NULL, "reading the resumed checkpoint's manifest (strata_checkpoint_inspect)");
    *start = info.iterations;
    if (train_msg_root())
        printf("resumed from %s at step %lld\n", path, (long long)*start);
    if (train_msg_root() && saved_decay != o->decay.weight_decay)
        printf("  weight decay %.6g from here on; the checkpoint's run had %.6g\n", o->decay.weight_decay,
               saved_decay);
    return 0;
}

/* Step s's micro-batches' forward and backward, a pass of trainer_pass_micro_batches at a time; *loss: this rank's
 * mean. 0, or the exit code. */
static int forward_backward(run *r, const trainer_opts *o, int64_t s, double *loss)
{
    int world = strata_comm_size(o->comm), rank = strata_comm_rank(o->comm), held = trainer_pass_micro_batches(o);
    size_t ntok = (size_t)o->batch * o->seq;
    *loss = 0;
    for (int first = 0; first < o->grad_accum; first += held) {
        /* The ranks split the step's micro-batches round robin, so N ranks x k see what 1 rank x N*k sees. */
        for (int j = 0; j < held; j++)
            data_batch(o->data, o->seed, s, (first + j) * world + rank, o->batch, o->seq, r->tokens + j * ntok,
                       r->targets + j * ntok);
        /* The engine sums the ranks' gradients: each micro-batch weighs 1 / (all micro-batches of the step). */
        float scale = (float)(strata_loss_scale(r->e) / ((double)o->grad_accum * world));
        if (gpt_model_pass(r->m, held, r->tokens, r->targets, true, scale, r->losses) != STRATA_OK) {
            const char *kernel_error = gpt_model_error(r->m);
            if (!*kernel_error)
                return fail(r->e, "the forward/backward pass");
            train_err("the forward/backward pass failed: %s", kernel_error);
            return 1;
        }
        for (int j = 0; j < held; j++)
            *loss += r->losses[j] / o->grad_accum;
    }
    return 0;
}

/* One step: forward and backward (twice with strata.norm_pass: the first only measures the gradient norm), then
 * strata_step; 0, or the exit code. */
static int train_step(run *r, const trainer_opts *o, int64_t s, bool norm_pass, train_report *rep)
{
    double t0 = now_s(), loss = 0;
    int world = strata_comm_size(o->comm), rc = 0;
    /* The schedule's lr is every parameter group's, set before the step begins (with strata.step_in_backward its
     * updates run during backward); the step's own lr is then 0, "the groups' values". So a schedule that ends at 0
     * ends there: as a step's lr, 0 would mean the configured one. */
    double lr = trainer_lr(o, s);
    strata_step_args args = {.lr = 0};
    if (train_groups_set(&r->groups, r->e, lr) != STRATA_OK)
        return fail(r->e, "setting the step's learning rate (strata_group_set)");
    if (strata_step_begin(r->e, &args) != STRATA_OK)
        return fail(r->e, "beginning the step (strata_step_begin)");
    if (norm_pass && ((rc = forward_backward(r, o, s, &loss)) != 0 || strata_norm_pass_end(r->e, NULL) != STRATA_OK))
        return rc ? rc : fail(r->e, "the norm pass (strata_norm_pass_end)");
    if ((rc = forward_backward(r, o, s, &loss)) != 0)
        return rc;
    double t1 = now_s();
    strata_step_result res;
    if (strata_step(r->e, &args, &res) != STRATA_OK)
        return fail(r->e, "the optimizer step (strata_step)");
    /* The step's loss is the world's: the mean over every rank's micro-batches (what one rank accumulating all of
     * them would report). */
    if (world > 1) {
        if (strata_comm_allreduce_sum(o->comm, &loss, 1) != STRATA_OK)
            return fail(NULL, "averaging the loss over the ranks (strata_comm_allreduce_sum)");
        loss /= world;
    }
    strata_stats stats;
    strata_stats_get(r->e, &stats);
    report_step(rep, s, loss, lr, now_s() - t0, t1 - t0, &stats, &res);
    return 0;
}

/* After step s: a checkpoint when --save-every says so (not at the last step, which the end saves); 0, or 1 when
 * the save failed. */
static int save_every(run *r, const trainer_opts *o, int64_t s, const train_report *rep, int64_t *last_saved)
{
    if (!o->save_dir || o->save_every <= 0 || (s + 1) % o->save_every != 0 || s + 1 >= o->steps)
        return 0;
    /* On a terminal the progress line is redrawn with \r and has no newline yet: end it, so that what the save
     * prints (the checkpoint, or why it failed) stands on a line of its own. */
    if (rep->tty && !rep->quiet)
        putchar('\n');
    *last_saved = s + 1;
    return train_saves_save(&r->saves, r->e, s + 1) != STRATA_OK ? 1 : 0;
}

/* The run's end: the last update settled, then the trace and the log finished before the summary, so that it points
 * only at files that were written. 0 or an exit code. */
static int finish_outputs(run *r, train_report *rep, const strata_config *cfg)
{
    if (strata_sync(r->e) != STRATA_OK)
        return fail(r->e, "finishing the last update (strata_sync)");
    strata_stats_get(r->e, &rep->now);
    char trace_error[1024] = "";
    if (strata_trace_write(r->e) != STRATA_OK) {
        snprintf(trace_error, sizeof trace_error, "%s", strata_last_error(r->e));
        train_err("warning: %s; the run will exit 1", trace_error);
    }
    bool log_ok = report_close_log(rep);
    r->jsonl = NULL;
    r->outputs_failed = trace_error[0] || !log_ok;
    if (train_msg_root())
        report_summary(rep, cfg->trace_path, trace_error);
    return 0;
}

/* Steps from start until o->steps or a signal, saving every save_every; *done is the steps done so far. */
static int train_loop(run *r, const trainer_opts *o, int64_t start, strata_config *cfg, int64_t *done)
{
    size_t ntok = (size_t)o->batch * o->seq;
    strata_stats stats;
    strata_stats_get(r->e, &stats);
    train_report rep;
    /* Tokens count the whole world's: every rank steps in lockstep, so rank 0's clock times them all. */
    report_begin(&rep, start, o->steps, (int64_t)ntok * o->grad_accum * stats.world_size, &stats,
                 o->quiet || !train_msg_root(), r->jsonl, r->jsonl_path);
    rep.flops_per_token = gpt_flops_per_token(&o->dims, o->seq);
    rep.startup_s = r->startup_s;
    rep.speculating = cfg_keeps_grads(cfg);
    int64_t s = start, last_saved = -1;
    int rc = 0;
    for (; s < o->steps && !stop_signal && rc == 0; s++) {
        if ((rc = train_step(r, o, s, cfg->norm_pass, &rep)) != 0)
            break;
        rc = save_every(r, o, s, &rep, &last_saved);
    }
    *done = s;
    if (rc != 0 || (rc = finish_outputs(r, &rep, cfg)) != 0)
        return rc;
    if (o->save_dir && s > start && last_saved != s && train_saves_save(&r->saves, r->e, s) != STRATA_OK)
        return 1;
    return 0;
}

/* Training went well, but a file the user asked for was not written (warned and summarized): exit 1. Every rank that
 * got this far learns whether any did, so that the world exits alike and one rank's early exit 1 cannot make mpirun
 * end a rank still writing its checkpoint. A rank that failed earlier has aborted the world, and the sum then fails
 * at once. Returns the exit code of the world. */
static int agree_outputs(const trainer_opts *o, bool outputs_failed, int rc, bool *world_done)
{
    double failed = outputs_failed ? 1 : 0;
    if (strata_comm_size(o->comm) > 1 && strata_comm_allreduce_sum(o->comm, &failed, 1) != STRATA_OK)
        return 1;
    if (failed > 0 && rc == 0)
        rc = 1;
    *world_done = true;
    return rc;
}

/* Opens the run, resumes it, trains and dumps the weights; 0 or an exit code. *done: the steps done. */
static int run_all(run *r, const trainer_opts *o, strata_config *cfg, int64_t *done)
{
    int64_t start = 0;
    /* The --save root before anything else: a root that cannot take a checkpoint, or that another run holds, fails
     * the run now rather than at its first save. */
    int rc = train_saves_open(&r->saves, o->save_dir, o->keep, o->comm);
    if (rc == 0)
        rc = run_open(r, o, cfg);
    if (rc == 0 && o->resume_dir)
        rc = resume(r, o, &start);
    if (rc == 0)
        rc = train_loop(r, o, start, cfg, done);
    if (rc == 0 && o->dump_weights)
        rc = dump_weights(r->e, r->m, o);
    return rc;
}

int trainer_run(const trainer_opts *o, strata_config *cfg, bool *world_done)
{
    *world_done = false;
    /* A graceful stop needs every rank to stop after the same step, which a signal cannot promise; with more
     * than one rank the default action ends the rank and mpirun the others. */
    bool graceful = strata_comm_size(o->comm) == 1;
    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    if (graceful) {
        sigaction(SIGINT, &sa, &old_int);
        sigaction(SIGTERM, &sa, &old_term);
    }
    stop_signal = 0;

    run r = {0};
    int64_t done = 0;
    int rc = run_all(&r, o, cfg, &done);
    bool finished = rc == 0; /* this rank got through the run (its trace or log may have failed) */
    bool outputs_failed = finished && r.outputs_failed;
    if (rc == 0 && stop_signal) {
        printf("stopped by %s after step %lld%s\n", stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)done,
               o->save_dir ? "; resume with --resume" : "");
        rc = 128 + stop_signal;
    }
    run_close(&r);
    /* Saves that found the disk full let the run go on; the exit status still says they failed. */
    if (train_saves_close(&r.saves) != 0 && rc == 0)
        rc = 1;
    if (graceful) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
    }
    return finished ? agree_outputs(o, outputs_failed, rc, world_done) : rc;
}
