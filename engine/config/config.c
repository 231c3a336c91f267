/* Defaults and whole-config validation. The key table lives in config_schema.c, the JSON walk in config_json.c. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "engine/config/config_report.h"
#include "engine/config/config_schema.h"
#include "engine/config/config.h"
#include "nvme/io.h"

/* The smallest strata_config a caller may hand in: the layout of 0.1, the first under the versioning rule.
 * Fields added since sit after it and take their defaults when a caller's struct ends before them. */
#define CONFIG_MIN_BYTES offsetof(strata_config, lr_exact)

static void set_defaults(strata_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = (uint32_t)sizeof *cfg;

    /* Stage 3 is what offloading parameters needs; with one rank it partitions trivially. */
    cfg->zero_stage = 3;
    cfg->offload_param = (strata_offload_config){.device = STRATA_TIER_DEVICE};
    cfg->offload_optimizer = (strata_offload_config){
        .device = STRATA_TIER_DEVICE, .pipeline_read = true, .pipeline_write = true};
    /* DeepSpeed defaults to 1e9; a smaller sub-group keeps the pinned working set of the NVMe
     * pipeline (3 sub-groups of fp32 master, m, v in flight) within a few GiB. */
    cfg->sub_group_size = 100000000;
    cfg->prefetch_bucket_size = 50000000;
    cfg->max_live_parameters = 1000000000;
    cfg->param_persistence_threshold = 100000;

    nvme_aio_defaults(&cfg->aio); /* the NVMe layer owns its defaults; standalone strata_aio uses the same */

    cfg->optimizer = STRATA_OPTIMIZER_ADAMW;
    cfg->lr = 1e-3f;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.01f;
    cfg->bias_correction = true;
    cfg->lr_exact = 1e-3;
    cfg->beta1_exact = 0.9;
    cfg->beta2_exact = 0.999;
    cfg->eps_exact = 1e-8;
    cfg->weight_decay_exact = 0.01;

    cfg->param_dtype = STRATA_DTYPE_FP32;
    cfg->loss_scale = 0.0;
    cfg->initial_scale_power = 16;
    cfg->loss_scale_window = 1000;
    cfg->hysteresis = 2;
    cfg->min_loss_scale = 1.0;
    cfg->gradient_clipping = 0.0;

    cfg->backend = STRATA_BACKEND_AUTO;
    cfg->delayed_warmup_steps = 10;
    cfg->swap_checksum = true;
    cfg->gradients_on_nvme = STRATA_SWITCH_AUTO;
    cfg->host_cache = true;
    cfg->param_max_in_cpu = STRATA_NO_CAP; /* the host budget bounds the cache (DeepSpeed caps it at 1e9) */
    cfg->offload_optimizer_ratio = 1.0;
    cfg->step_in_backward = false;
    cfg->norm_pass = false;
    cfg->adam_formula = STRATA_ADAM_MUL_ADD;
    cfg->comm_timeout_s = 120.0;
    cfg->gradient_reduction = STRATA_REDUCE_SUM;
    cfg->optimizer_moments = STRATA_MOMENTS_FP32;
    cfg->optimizer_moments_seed = 0;
}

/* Range check of one numeric field against its table entry; the message mirrors the JSON loader's. */
static void check_range(const cfg_key *k, const strata_config *cfg, cfg_report *report)
{
    const char *field = (const char *)cfg + k->offset;
    double v;
    switch (k->kind) {
    case CFG_INT: v = *(const int *)field; break;
    case CFG_COUNT:
    case CFG_BYTES: v = (double)*(const size_t *)field; break;
    case CFG_FLOAT: v = *(const float *)field; break;
    case CFG_DOUBLE: v = *(const double *)field; break;
    case CFG_ENUM: {
        int e = *(const int *)field;
        for (size_t i = 0; k->choices[i].name; i++)
            if (k->choices[i].value == e)
                return;
        char allowed[128];
        cfg_choices_format(k->choices, allowed, sizeof allowed);
        cfg_report_add(report, "%s holds the value %d, which is not one of %s", k->path, e, allowed);
        return;
    }
    default: return;
    }
    if (!(v >= k->min && v <= k->max)) {
        char shown[64], range[96];
        cfg_key_format(k, cfg, shown, sizeof shown);
        cfg_range_format(k, range, sizeof range);
        cfg_report_add(report, "%s = %s is out of range %s", k->path, shown, range);
    }
}

static void check_offload(const strata_offload_config *o, const char *name, const strata_config *cfg,
                          cfg_report *report)
{
    if (o->device == STRATA_TIER_NVME && o->nvme_path_count == 0)
        cfg_report_add(report, "zero_optimization.%s.device = \"nvme\" needs zero_optimization.%s.nvme_path "
                       "(a directory on a fast local drive, or a list of them to stripe)", name, name);
    if (o->nvme_path_count < 0 || o->nvme_path_count > STRATA_MAX_NVME_PATHS)
        cfg_report_add(report, "zero_optimization.%s.nvme_path_count = %d is out of range [0, %d]", name,
                       o->nvme_path_count, STRATA_MAX_NVME_PATHS);
    for (int i = 0; i < o->nvme_path_count && i < STRATA_MAX_NVME_PATHS; i++)
        if (!memchr(o->nvme_path[i], '\0', STRATA_PATH_BYTES) || !o->nvme_path[i][0])
            cfg_report_add(report, "zero_optimization.%s.nvme_path[%d] is empty or not NUL-terminated", name, i);
    (void)cfg;
}

static void check_offloaded_activations(const strata_config *cfg, cfg_report *report)
{
    strata_tier t = cfg->offload_activations;
    if (t == STRATA_TIER_DEVICE)
        return;
    char device[32]; /* as the JSON spells it */
    cfg_key_format(cfg_key_find("strata.offload_activations.device"), cfg, device, sizeof device);
    if (cfg->offloaded_activation_bytes == 0)
        cfg_report_add(report, "strata.offload_activations.device = \"%s\" needs strata.offload_activations.bytes: the "
                       "most activation bytes the trainer keeps at once (strata train sets it from the model)",
                       device);
    if (cfg->offloaded_activation_max_bytes > cfg->offloaded_activation_bytes)
        cfg_report_add(report, "strata.offload_activations.max_bytes = %zu is larger than strata.offload_activations."
                       "bytes = %zu: the largest activation is one of those kept; lower it, or leave it 0 (= bytes)",
                       cfg->offloaded_activation_max_bytes, cfg->offloaded_activation_bytes);
    if (t == STRATA_TIER_NVME && cfg->offload_optimizer.nvme_path_count == 0 && cfg->offload_param.nvme_path_count == 0)
        cfg_report_add(report, "strata.offload_activations.device = \"nvme\" needs a swap directory: set "
                       "zero_optimization.offload_optimizer.nvme_path (or offload_param.nvme_path) to a directory on "
                       "a fast local drive");
}

/* Each fp32 optimizer field of the 0.1 layout and the double beside it (strata.h, lr_exact). */
static const struct exact_pair {
    size_t single, exact;
} exact_pairs[] = {
    {offsetof(strata_config, lr), offsetof(strata_config, lr_exact)},
    {offsetof(strata_config, beta1), offsetof(strata_config, beta1_exact)},
    {offsetof(strata_config, beta2), offsetof(strata_config, beta2_exact)},
    {offsetof(strata_config, eps), offsetof(strata_config, eps_exact)},
    {offsetof(strata_config, weight_decay), offsetof(strata_config, weight_decay_exact)},
};

void cfg_set_exact(strata_config *cfg, size_t single_offset, double value)
{
    for (size_t i = 0; i < sizeof exact_pairs / sizeof exact_pairs[0]; i++)
        if (exact_pairs[i].single == single_offset)
            *(double *)((char *)cfg + exact_pairs[i].exact) = value;
}

const double *cfg_exact_of(const strata_config *cfg, size_t single_offset)
{
    for (size_t i = 0; i < sizeof exact_pairs / sizeof exact_pairs[0]; i++)
        if (exact_pairs[i].single == single_offset)
            return (const double *)((const char *)cfg + exact_pairs[i].exact);
    return NULL;
}

void cfg_reconcile_exact(strata_config *cfg)
{
    for (size_t i = 0; i < sizeof exact_pairs / sizeof exact_pairs[0]; i++) {
        float single = *(const float *)((const char *)cfg + exact_pairs[i].single);
        double *exact = (double *)((char *)cfg + exact_pairs[i].exact);
        if (!((float)*exact == single)) /* the float was set on its own: it is the value meant */
            *exact = single;
    }
}

bool cfg_speculates(const strata_config *cfg)
{
    return cfg->step_in_backward && !cfg->norm_pass &&
           (cfg->gradient_clipping > 0 || cfg->param_dtype == STRATA_DTYPE_FP16);
}

bool cfg_keeps_grads(const strata_config *cfg)
{
    return cfg_speculates(cfg) && cfg->gradient_clipping > 0;
}

strata_adam_hparams cfg_adam_hparams(const strata_config *cfg, double lr)
{
    return (strata_adam_hparams){.kind = cfg->optimizer, .lr = lr, .beta1 = cfg->beta1_exact,
                                 .beta2 = cfg->beta2_exact, .eps = cfg->eps_exact,
                                 .weight_decay = cfg->weight_decay_exact, .bias_correction = cfg->bias_correction,
                                 .formula = cfg->adam_formula};
}

static bool size_known(size_t size)
{
    return size >= CONFIG_MIN_BYTES && size <= sizeof(strata_config);
}

STRATA_API strata_status strata_config_init_sized(strata_config *cfg, size_t struct_size)
{
    if (!cfg)
        return err_set(STRATA_EINVAL, "strata_config_init: cfg is NULL");
    if (!size_known(struct_size))
        return err_set(STRATA_EINVAL, "strata_config_init: the caller's strata_config is %zu bytes but this library "
                       "knows layouts of %zu to %zu bytes; build against the strata.h of this library or an older "
                       "one", struct_size, (size_t)CONFIG_MIN_BYTES, sizeof(strata_config));
    strata_config full;
    set_defaults(&full);
    memcpy(cfg, &full, struct_size);
    cfg->struct_size = (uint32_t)struct_size;
    return STRATA_OK;
}

bool cfg_from_caller(const strata_config *in, strata_config *out, cfg_report *report)
{
    set_defaults(out);
    if (!size_known(in->struct_size)) {
        cfg_report_add(report, "strata_config.struct_size = %u but this library knows layouts of %zu to %zu bytes; "
                       "initialise the struct with strata_config_init() and build against this strata.h (or an "
                       "older one)", in->struct_size, (size_t)CONFIG_MIN_BYTES, sizeof(strata_config));
        return false; /* the other fields cannot be trusted */
    }
    memcpy(out, in, in->struct_size);
    out->struct_size = (uint32_t)sizeof *out;
    cfg_reconcile_exact(out);
    return true;
}

void cfg_to_caller(const strata_config *full, strata_config *out)
{
    uint32_t size = out->struct_size;
    memcpy(out, full, size);
    out->struct_size = size;
}

strata_status config_from_caller(const strata_config *in, strata_config *out)
{
    cfg_report report;
    cfg_report_init(&report, NULL, 0);
    if (cfg_from_caller(in, out, &report))
        cfg_validate_into(out, &report);
    return cfg_report_finish(&report, STRATA_ECONFIG);
}

void cfg_validate_into(const strata_config *cfg, cfg_report *report)
{
    for (size_t i = 0; i < cfg_key_count; i++)
        check_range(&cfg_keys[i], cfg, report);

    check_offload(&cfg->offload_param, "offload_param", cfg, report);
    check_offload(&cfg->offload_optimizer, "offload_optimizer", cfg, report);
    /* The struct is shared by both blocks, but only the optimizer step pipelines its NVMe transfers. */
    if (cfg->offload_param.pipeline_read || cfg->offload_param.pipeline_write)
        cfg_report_add(report, "strata_config.offload_param.pipeline_read/pipeline_write are set, but they only "
                       "apply to the optimizer step (offload_optimizer.pipeline_read/pipeline_write); parameter "
                       "fetches are always prefetched ahead of use: leave them false");
    /* "auto" at a lower stage keeps the parameters on the device (plan_auto.c). */
    if (cfg->offload_param.device != STRATA_TIER_DEVICE && cfg->offload_param.device != STRATA_TIER_AUTO &&
        cfg->zero_stage != 3)
        cfg_report_add(report, "zero_optimization.offload_param needs zero_optimization.stage = 3 (it is %d): "
                       "parameters are only offloaded when they are partitioned", cfg->zero_stage);
    if (cfg->aio.block_size % 4096 != 0)
        cfg_report_add(report, "aio.block_size = %zu is not a multiple of 4096; direct I/O moves whole 4 KiB pages",
                       cfg->aio.block_size);
    if (!isfinite(cfg->lr) || !isfinite(cfg->eps) || !isfinite(cfg->weight_decay))
        cfg_report_add(report, "optimizer.params: lr, eps and weight_decay must be finite numbers");
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1))
        cfg_report_add(report, "optimizer.params.betas = [%g, %g] is out of range: each beta must be in [0, 1)",
                       (double)cfg->beta1, (double)cfg->beta2);
    if (cfg->param_dtype != STRATA_DTYPE_FP32 && cfg->param_dtype != STRATA_DTYPE_BF16 &&
        cfg->param_dtype != STRATA_DTYPE_FP16)
        cfg_report_add(report, "param_dtype = %d is not one of fp32, bf16, fp16", (int)cfg->param_dtype);
    check_offloaded_activations(cfg, report);
    if (!memchr(cfg->trace_path, '\0', sizeof cfg->trace_path))
        cfg_report_add(report, "strata.trace_path is not NUL-terminated");
}

STRATA_API strata_status strata_config_validate(const strata_config *cfg, char *err, size_t errlen)
{
    cfg_report report;
    cfg_report_init(&report, err, errlen);
    if (!cfg) {
        cfg_report_add(&report, "strata_config_validate: cfg is NULL");
        return cfg_report_finish(&report, STRATA_EINVAL);
    }
    strata_config full;
    if (cfg_from_caller(cfg, &full, &report))
        cfg_validate_into(&full, &report);
    return cfg_report_finish(&report, STRATA_ECONFIG);
}

STRATA_API size_t strata_config_size(void)
{
    return sizeof(strata_config);
}

STRATA_API strata_status strata_config_to_json(const strata_config *cfg, char *out, size_t outlen, size_t *needed)
{
    if (needed)
        *needed = 0;
    if (!cfg || (!out && outlen))
        return err_set(STRATA_EINVAL, "strata_config_to_json: cfg is NULL (or out is NULL with outlen %zu)", outlen);
    cfg_report report;
    cfg_report_init(&report, NULL, 0);
    strata_config full;
    if (!cfg_from_caller(cfg, &full, &report))
        return cfg_report_finish(&report, STRATA_EINVAL);
    json_t *o = json_object();
    for (size_t i = 0; o && i < cfg_key_count; i++)
        if (cfg_key_is_setting(&cfg_keys[i]))
            json_object_set_new(o, cfg_keys[i].path, cfg_key_value_json(&cfg_keys[i], &full));
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(o);
    if (!text)
        return err_set(STRATA_ENOMEM, "strata_config_to_json: out of memory");
    size_t n = strlen(text) + 1;
    if (needed)
        *needed = n;
    strata_status st = STRATA_OK;
    if (n > outlen)
        st = err_set(STRATA_EINVAL, "strata_config_to_json: the text needs %zu bytes, out has %zu; call again with "
                     "*needed bytes", n, outlen);
    else
        memcpy(out, text, n);
    free(text);
    return st;
}

STRATA_API strata_status strata_config_adam_hparams(const strata_config *cfg, strata_adam_hparams *out)
{
    if (!cfg || !out)
        return err_set(STRATA_EINVAL, "strata_config_adam_hparams: cfg or out is NULL");
    cfg_report report;
    cfg_report_init(&report, NULL, 0);
    strata_config full;
    if (!cfg_from_caller(cfg, &full, &report))
        return cfg_report_finish(&report, STRATA_EINVAL);
    *out = cfg_adam_hparams(&full, full.lr_exact);
    return STRATA_OK;
}
