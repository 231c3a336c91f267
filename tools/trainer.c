/* The training loop of `strata train` (see trainer.h). */
#include "tools/trainer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "model/gpt_engine.h"
#include "tools/ckpt_locate.h"
#include "tools/train_report.h"

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

double trainer_lr(const trainer_opts *o, int64_t s)
{
    if (s < o->warmup)
        return o->lr * (double)(s + 1) / (double)o->warmup;
    int64_t span = o->steps - o->warmup;
    double progress = span > 1 ? (double)(s - o->warmup) / (double)(span - 1) : 1.0;
    return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * progress));
}

/* ---------------------------------------------------------------- checkpoints: DIR/step-N */

/* Saves DIR/step-N, then keeps the last o->keep checkpoints in DIR: strata_checkpoint_prune touches only
 * directories holding a manifest, so a user's own step-N directory (or anything else) in DIR survives. */
static strata_status save_checkpoint(strata_engine *e, const trainer_opts *o, int64_t steps_done)
{
    if (mkdir(o->save_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "strata train: --save \"%s\": cannot create the directory: %s\n", o->save_dir,
                strerror(errno));
        return STRATA_EIO;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%lld", o->save_dir, (long long)steps_done);
    strata_status st = strata_save(e, path);
    if (st != STRATA_OK) {
        fprintf(stderr, "strata train: saving %s failed: %s\n", path, strata_last_error(e));
        return st;
    }
    printf("checkpoint: %s\n", path);
    fflush(stdout);
    /* The checkpoint is safe on disk: a rotation that fails costs disk space, not the run. */
    if (strata_checkpoint_prune(o->save_dir, o->keep, NULL) != STRATA_OK)
        fprintf(stderr, "strata train: warning: removing checkpoints older than the last --keep %d in \"%s\" "
                        "failed: %s\n", o->keep, o->save_dir, strata_last_error(NULL));
    return STRATA_OK;
}

/* ---------------------------------------------------------------- the loop */

static int fail(strata_engine *e, const char *what)
{
    fprintf(stderr, "strata train: %s failed: %s\n", what, strata_last_error(e));
    return 1;
}

static strata_status dump_weights(gpt_model *m, const trainer_opts *o)
{
    size_t n = gpt_numel(&o->dims);
    float *w = malloc(n * sizeof(float));
    if (!w)
        return STRATA_ENOMEM;
    strata_status st = gpt_model_read_weights(m, w);
    FILE *f = st == STRATA_OK ? fopen(o->dump_weights, "wb") : NULL;
    if (st == STRATA_OK && (!f || fwrite(w, sizeof(float), n, f) != n)) {
        fprintf(stderr, "strata train: --dump-weights \"%s\": cannot write: %s\n", o->dump_weights, strerror(errno));
        st = STRATA_EIO;
    }
    if (f && fclose(f) != 0 && st == STRATA_OK)
        st = STRATA_EIO;
    free(w);
    return st;
}

int trainer_run(const trainer_opts *o, strata_config *cfg)
{
    int rc = 1;
    strata_engine *e = NULL;
    gpt_model *m = NULL;
    FILE *jsonl = NULL;
    size_t ntok = (size_t)o->batch * o->seq;
    int32_t *tokens = malloc(ntok * sizeof(int32_t)), *targets = malloc(ntok * sizeof(int32_t));
    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    stop_signal = 0;

    size_t act = gpt_engine_activation_bytes(&o->dims, o->batch, o->seq, cfg->param_dtype);
    if (cfg->activation_bytes < act)
        cfg->activation_bytes = act;
    if (!tokens || !targets) {
        fprintf(stderr, "strata train: out of memory\n");
        goto out;
    }
    if (strata_engine_create(cfg, &e) != STRATA_OK) {
        rc = fail(NULL, "creating the engine");
        goto out;
    }
    if (gpt_model_register(e, &o->dims, o->seed, &m) != STRATA_OK) {
        rc = fail(e, "registering the model");
        goto out;
    }
    if (strata_engine_finalize(e) != STRATA_OK) {
        rc = fail(e, "planning the memory (strata_engine_finalize)");
        goto out;
    }
    strata_status st = gpt_model_prepare(m, o->batch, o->seq, cfg->param_dtype);
    if (st == STRATA_EUNSUPPORTED) {
        fprintf(stderr, "strata train: this build has no CUDA kernels for the model (nvcc was not found when it "
                        "was configured); use --device host\n");
        goto out;
    }
    if (st != STRATA_OK && *gpt_model_error(m)) {
        fprintf(stderr, "strata train: the model's CUDA kernels cannot start: %s\n", gpt_model_error(m));
        goto out;
    }
    if (st != STRATA_OK) {
        rc = fail(e, "allocating the activations (strata_device_alloc)");
        goto out;
    }
    int64_t start = 0;
    if (o->resume_dir) {
        char buf[4096];
        const char *path = ckpt_locate(o->resume_dir, buf, sizeof buf);
        if (!path) {
            fprintf(stderr, "strata train: --resume \"%s\": no checkpoint there: %s; %s\n", o->resume_dir,
                    strata_last_error(NULL), CKPT_LOCATE_EXPECTED);
            rc = 2;
            goto out;
        }
        if (strata_load(e, path) != STRATA_OK) {
            rc = fail(e, "resuming (strata_load)");
            goto out;
        }
        /* The data continues where the saved run's strata_step calls stopped. */
        strata_checkpoint_info info;
        if (strata_checkpoint_inspect(path, &info) != STRATA_OK) {
            rc = fail(NULL, "reading the resumed checkpoint's manifest (strata_checkpoint_inspect)");
            goto out;
        }
        start = info.iterations;
        printf("resumed from %s at step %lld\n", path, (long long)start);
    }
    if (o->log_jsonl && !(jsonl = fopen(o->log_jsonl, "w"))) {
        fprintf(stderr, "strata train: --log-jsonl \"%s\": cannot open: %s\n", o->log_jsonl, strerror(errno));
        rc = 2;
        goto out;
    }
    strata_stats stats;
    strata_stats_get(e, &stats);
    train_report rep;
    report_begin(&rep, start, o->steps, (int64_t)ntok * o->grad_accum, &stats, o->quiet, jsonl);
    rep.flops_per_token = gpt_flops_per_token(&o->dims, o->seq);
    int64_t s = start, last_saved = -1;
    for (; s < o->steps && !stop_signal; s++) {
        double t0 = now_s(), loss = 0;
        for (int mb = 0; mb < o->grad_accum; mb++) {
            data_batch(o->data, o->seed, s, mb, o->batch, o->seq, tokens, targets);
            double l = 0;
            float scale = (float)(strata_loss_scale(e) / o->grad_accum);
            if (gpt_model_micro_step(m, tokens, targets, true, scale, &l) != STRATA_OK) {
                const char *kernel_error = gpt_model_error(m);
                if (*kernel_error)
                    fprintf(stderr, "strata train: the forward/backward pass failed: %s\n", kernel_error);
                else
                    fail(e, "the forward/backward pass");
                rc = 1;
                goto out;
            }
            loss += l / o->grad_accum;
        }
        double t1 = now_s(), lr = trainer_lr(o, s);
        strata_step_args args = {.lr = lr};
        strata_step_result res;
        if (strata_step(e, &args, &res) != STRATA_OK) {
            rc = fail(e, "the optimizer step (strata_step)");
            goto out;
        }
        strata_stats_get(e, &stats);
        report_step(&rep, s, loss, lr, now_s() - t0, t1 - t0, &stats, &res);
        if (o->save_dir && o->save_every > 0 && (s + 1) % o->save_every == 0 && s + 1 < o->steps) {
            /* On a terminal the progress line is redrawn with \r and has no newline yet: end it, so that what the save
             * prints (the checkpoint, or why it failed) stands on a line of its own. */
            if (rep.tty && !rep.quiet)
                putchar('\n');
            if (save_checkpoint(e, o, s + 1) != STRATA_OK)
                goto out;
            last_saved = s + 1;
        }
    }
    if (strata_sync(e) != STRATA_OK) {
        rc = fail(e, "finishing the last update (strata_sync)");
        goto out;
    }
    strata_stats_get(e, &stats);
    rep.now = stats;
    report_summary(&rep, cfg->trace_path);
    if (o->save_dir && s > start && last_saved != s) {
        if (save_checkpoint(e, o, s) != STRATA_OK)
            goto out;
    }
    if (o->dump_weights && dump_weights(m, o) != STRATA_OK) {
        rc = fail(e, "--dump-weights");
        goto out;
    }
    if (stop_signal) {
        printf("stopped by %s after step %lld%s\n", stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)s,
               o->save_dir ? "; resume with --resume" : "");
        rc = 128 + stop_signal;
    } else {
        rc = 0;
    }
out:
    if (jsonl)
        fclose(jsonl);
    gpt_model_destroy(m);
    strata_engine_destroy(e);
    free(tokens);
    free(targets);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
}
