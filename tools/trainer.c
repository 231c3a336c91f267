/* The training loop of `strata train` (see trainer.h). */
#include "tools/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "model/gpt_engine.h"
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

/* The step number of a "step-N" name, or -1. */
static int64_t step_of(const char *name)
{
    char *end;
    if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9')
        return -1;
    long long n = strtoll(name + 5, &end, 10);
    return *end ? -1 : n;
}

/* The step-N entries of dir, ascending, into a malloc'd array; returns the count (-1 when dir is unreadable). */
static int list_steps(const char *dir, int64_t **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        int64_t s = step_of(ent->d_name);
        if (s < 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            int64_t *grown = realloc(*out, (size_t)cap * sizeof **out);
            if (!grown)
                break;
            *out = grown;
        }
        (*out)[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && (*out)[j - 1] > (*out)[j]; j--) {
            int64_t t = (*out)[j];
            (*out)[j] = (*out)[j - 1];
            (*out)[j - 1] = t;
        }
    return n;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

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
    int64_t *steps;
    int n = list_steps(o->save_dir, &steps);
    for (int i = 0; i < n - o->keep; i++) {
        snprintf(path, sizeof path, "%s/step-%lld", o->save_dir, (long long)steps[i]);
        nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    free(steps);
    return STRATA_OK;
}

/* The checkpoint to resume from: dir itself when it is named step-N, else its newest step-N entry. */
static bool resolve_resume(const char *dir, char *path, size_t len, int64_t *step)
{
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    if ((*step = step_of(base)) >= 0) {
        snprintf(path, len, "%s", dir);
        return true;
    }
    int64_t *steps;
    int n = list_steps(dir, &steps);
    if (n <= 0) {
        free(steps);
        return false;
    }
    *step = steps[n - 1];
    snprintf(path, len, "%s/step-%lld", dir, (long long)*step);
    free(steps);
    return true;
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
        char path[4096];
        if (!resolve_resume(o->resume_dir, path, sizeof path, &start)) {
            fprintf(stderr, "strata train: --resume \"%s\": no checkpoint there (expected a step-N directory or a "
                            "directory holding step-N checkpoints written by --save)\n", o->resume_dir);
            rc = 2;
            goto out;
        }
        if (strata_load(e, path) != STRATA_OK) {
            rc = fail(e, "resuming (strata_load)");
            goto out;
        }
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
        printf("checkpoint: %s/step-%lld\n", o->save_dir, (long long)s);
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
