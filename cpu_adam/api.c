/* The public strata_adam_* functions: argument checks with actionable messages, then the driver. */
#include <math.h>

#include "base/error.h"
#include "cpu_adam/adam.h"
#include "cpu_adam/driver.h"

#define MAX_THREADS 4096

static strata_status check_range(const char *fn, const char *name, double value, double lo, double hi,
                                 bool hi_open)
{
    if (isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi))
        return STRATA_OK;
    return err_set(STRATA_EINVAL, "%s: %s = %g is out of range [%g, %g%s", fn, name, value, lo, hi,
                   hi_open ? ")" : "]");
}

static strata_status check_hparams(const char *fn, const strata_adam_hparams *hp)
{
    if (hp->kind != STRATA_OPTIMIZER_ADAMW && hp->kind != STRATA_OPTIMIZER_ADAM)
        return err_set(STRATA_EINVAL, "%s: hp->kind = %d is not an optimizer; use STRATA_OPTIMIZER_ADAMW or "
                       "STRATA_OPTIMIZER_ADAM", fn, (int)hp->kind);
    ERR_CHECK(check_range(fn, "hp->lr", hp->lr, 0.0, HUGE_VAL, false));
    ERR_CHECK(check_range(fn, "hp->beta1", hp->beta1, 0.0, 1.0, true));
    ERR_CHECK(check_range(fn, "hp->beta2", hp->beta2, 0.0, 1.0, true));
    ERR_CHECK(check_range(fn, "hp->eps", hp->eps, 0.0, HUGE_VAL, false));
    ERR_CHECK(check_range(fn, "hp->weight_decay", hp->weight_decay, 0.0, HUGE_VAL, false));
    if (hp->formula != STRATA_ADAM_MUL_ADD && hp->formula != STRATA_ADAM_LERP)
        return err_set(STRATA_EINVAL, "%s: hp->formula = %d is not a first-moment formula; use STRATA_ADAM_MUL_ADD "
                       "(torch < 2.0) or STRATA_ADAM_LERP (torch >= 2.0)", fn, (int)hp->formula);
    return STRATA_OK;
}

static strata_status check_grad(const char *fn, const char *name, const void *grad, strata_dtype dtype,
                                size_t numel)
{
    if (dtype != STRATA_DTYPE_FP32 && dtype != STRATA_DTYPE_BF16 && dtype != STRATA_DTYPE_FP16)
        return err_set(STRATA_EINVAL, "%s: %s_dtype = %s (%d) is not a gradient type; use FP32, BF16 or FP16", fn,
                       name, strata_dtype_name(dtype), (int)dtype);
    if (!grad && numel)
        return err_set(STRATA_EINVAL, "%s: %s is NULL with numel = %zu", fn, name, numel);
    return STRATA_OK;
}

static strata_status check_threads(const char *fn, int threads)
{
    if (threads < 0 || threads > MAX_THREADS)
        return err_set(STRATA_EINVAL, "%s: threads = %d is out of range [0, %d]; 0 means one per core", fn,
                       threads, MAX_THREADS);
    return STRATA_OK;
}

static strata_status check_tensors(const char *fn, const strata_adam_tensors *t)
{
    if (!t->master || !t->exp_avg || !t->exp_avg_sq) {
        if (t->numel)
            return err_set(STRATA_EINVAL, "%s: t->%s is NULL with numel = %zu", fn,
                           !t->master ? "master" : !t->exp_avg ? "exp_avg" : "exp_avg_sq", t->numel);
    }
    ERR_CHECK(check_grad(fn, "t->grad", t->grad, t->grad_dtype, t->numel));
    if (t->param_dtype == STRATA_DTYPE_NONE)
        return STRATA_OK;
    if (strata_dtype_bytes(t->param_dtype) == 0)
        return err_set(STRATA_EINVAL, "%s: t->param_dtype = %d is not a dtype; use FP32, BF16, FP16 or NONE", fn,
                       (int)t->param_dtype);
    if (!t->param && t->numel)
        return err_set(STRATA_EINVAL, "%s: t->param is NULL but t->param_dtype = %s; pass an array or "
                       "STRATA_DTYPE_NONE", fn, strata_dtype_name(t->param_dtype));
    return STRATA_OK;
}

static strata_status step(const strata_adam_hparams *hp, const strata_adam_tensors *t,
                          const strata_adam_step_args *args, strata_adam_step_result *result)
{
    static const char fn[] = "strata_adam_step";
    if (!hp || !t || !args)
        return err_set(STRATA_EINVAL, "%s: %s is NULL", fn, !hp ? "hp" : !t ? "t" : "args");
    ERR_CHECK(check_hparams(fn, hp));
    ERR_CHECK(check_tensors(fn, t));
    ERR_CHECK(check_threads(fn, args->threads));
    if (hp->bias_correction && args->step < 1)
        return err_set(STRATA_EINVAL, "%s: args->step = %lld with bias correction; steps count from 1", fn,
                       (long long)args->step);
    double scale = args->grad_scale == 0.0 ? 1.0 : args->grad_scale;
    if (!isfinite(scale) || scale < 0.0)
        return err_set(STRATA_EINVAL, "%s: args->grad_scale = %g must be finite and > 0 (0 means 1)", fn,
                       args->grad_scale);

    adam_job job = {
        .numel = t->numel,
        .threads = args->threads ? args->threads : adam_default_threads(),
        .tile_numel = args->tile_numel,
        .on_tile = args->on_tile,
        .on_tile_user = args->on_tile_user,
        .arrays = {t->master, t->exp_avg, t->exp_avg_sq, t->grad, t->param, t->grad_dtype, t->param_dtype, true},
    };
    ERR_CHECK(adam_ops_default(&job.ops));
    if (args->skip_nonfinite) {
        adam_gradstats stats;
        ERR_CHECK(adam_run_gradstats(job.ops, t->grad, t->grad_dtype, t->numel, job.threads, &stats));
        result->grad_sumsq = stats.sumsq;
        if (stats.nonfinite) {
            result->skipped = true;
            return STRATA_OK;
        }
    }
    adam_consts_init(&job.consts, hp, args->step, scale);
    return adam_run_step(&job);
}

strata_status strata_adam_step(const strata_adam_hparams *hp, const strata_adam_tensors *t,
                               const strata_adam_step_args *args, strata_adam_step_result *result)
{
    strata_adam_step_result local;
    if (!result)
        result = &local;
    result->skipped = false;
    result->grad_sumsq = 0.0;
    err_clear();
    return step(hp, t, args, result);
}

strata_status strata_adam_grad_stats(const void *grad, strata_dtype grad_dtype, size_t numel, int threads,
                                     double *sumsq, bool *nonfinite)
{
    static const char fn[] = "strata_adam_grad_stats";
    const adam_ops *ops;
    adam_gradstats stats;
    err_clear();
    if (!sumsq || !nonfinite)
        return err_set(STRATA_EINVAL, "%s: %s is NULL", fn, !sumsq ? "sumsq" : "nonfinite");
    *sumsq = 0.0;
    *nonfinite = false;
    ERR_CHECK(check_grad(fn, "grad", grad, grad_dtype, numel));
    ERR_CHECK(check_threads(fn, threads));
    ERR_CHECK(adam_ops_default(&ops));
    ERR_CHECK(adam_run_gradstats(ops, grad, grad_dtype, numel, threads ? threads : adam_default_threads(), &stats));
    *sumsq = stats.sumsq;
    *nonfinite = stats.nonfinite;
    return STRATA_OK;
}

const char *strata_adam_isa(void)
{
    const adam_ops *ops;
    err_clear();
    return adam_ops_default(&ops) == STRATA_OK ? ops->name : NULL;
}
