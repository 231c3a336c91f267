/* The configuration table (see config_schema.h) and the lookups over it. */
#include "engine/config/config_schema.h"

#include <assert.h>
#include <float.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "base/nearest.h"
#include "base/size.h"
#include "base/util.h"
#include "comm/comm.h"
#include "engine/config/config.h"
#include "nvme/io.h"

#define OFF(field) offsetof(strata_config, field)
#define NOFIELD 0
#define INT_MAX_D 2147483647.0
/* The largest double below 2^64: (double)SIZE_MAX rounds up to 2^64, which does not convert back to a size_t. */
#define SIZE_MAX_D 0x1.fffffffffffffp63

static const cfg_choice tier_choices[] = {
    {"none", STRATA_TIER_DEVICE}, {"cpu", STRATA_TIER_HOST}, {"nvme", STRATA_TIER_NVME}, {"auto", STRATA_TIER_AUTO},
    {NULL, 0}};
static const cfg_choice backend_choices[] = {
    {"auto", STRATA_BACKEND_AUTO}, {"host", STRATA_BACKEND_HOST}, {"cuda", STRATA_BACKEND_CUDA}, {NULL, 0}};
static const cfg_choice reduction_choices[] = {
    {"sum", STRATA_REDUCE_SUM}, {"mean", STRATA_REDUCE_MEAN}, {NULL, 0}};
static const cfg_choice moments_choices[] = {
    {"fp32", STRATA_MOMENTS_FP32}, {"bf16", STRATA_MOMENTS_BF16}, {"8bit", STRATA_MOMENTS_8BIT}, {NULL, 0}};
static const cfg_choice formula_choices[] = {
    {"mul_add", STRATA_ADAM_MUL_ADD}, {"lerp", STRATA_ADAM_LERP}, {NULL, 0}};
static const cfg_choice switch_choices[] = {
    {"auto", STRATA_SWITCH_AUTO}, {"true", STRATA_SWITCH_ON}, {"false", STRATA_SWITCH_OFF}, {NULL, 0}};

/* DeepSpeed keys whose one value below is what strata always does: that value is accepted silently, any
 * other is not implemented (see CFG_UNIMPLEMENTED). Written as JSON; numbers compare by value. */
static const cfg_choice only_true[] = {{"true", 0}, {NULL, 0}};
static const cfg_choice only_false[] = {{"false", 0}, {NULL, 0}};
/* A CFG_PLANNED switch: either value is accepted (and not read). */
static const cfg_choice true_or_false[] = {{"true", 0}, {"false", 0}, {NULL, 0}};

/* Paths of the two offload blocks share their key names; these macros keep the table readable. */
#define OFFLOAD_COMMON(prefix, field)                                                                   \
    {prefix ".device", CFG_ENUM, OFF(field.device), 0, 0, tier_choices, NULL},                          \
    {prefix ".nvme_path", CFG_PATHS, OFF(field), 0, 0, NULL, NULL},                                     \
    {prefix ".pin_memory", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, only_true,                                  \
     "strata always pins its host buffers (host-tier state and its staging pool, both counted in "       \
     "strata.host_budget_bytes)"}
/* What strata does instead of DeepSpeed's parameter swap buffers (buffer_count, buffer_size). */
#define PARAM_BUFFERS_HELP                                                                              \
    "strata sizes its pinned NVMe fetch staging from the prefetch window (stage3_prefetch_bucket_size or " \
    "strata.prefetch_bytes) plus two of the largest module, as strata estimate shows; remove the key"

const cfg_key cfg_keys[] = {
    {"zero_optimization", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"zero_optimization.stage", CFG_INT, OFF(zero_stage), 0, 3, NULL, NULL},
    {"zero_optimization.offload_param", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    OFFLOAD_COMMON("zero_optimization.offload_param", offload_param),
    {"zero_optimization.offload_param.buffer_count", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, PARAM_BUFFERS_HELP},
    {"zero_optimization.offload_param.buffer_size", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, PARAM_BUFFERS_HELP},
    {"zero_optimization.offload_param.max_in_cpu", CFG_COUNT, OFF(param_max_in_cpu), 0, SIZE_MAX_D, NULL, NULL},
    {"zero_optimization.offload_optimizer", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    OFFLOAD_COMMON("zero_optimization.offload_optimizer", offload_optimizer),
    {"zero_optimization.offload_optimizer.buffer_count", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "strata keeps four pinned optimizer slots of one sub-group each (zero_optimization.sub_group_size elements "
     "of master weights and both moments); size them with sub_group_size and remove the key"},
    {"zero_optimization.offload_optimizer.pipeline_read", CFG_BOOL, OFF(offload_optimizer.pipeline_read), 0, 0, NULL, NULL},
    {"zero_optimization.offload_optimizer.pipeline_write", CFG_BOOL, OFF(offload_optimizer.pipeline_write), 0, 0, NULL, NULL},
    {"zero_optimization.offload_optimizer.ratio", CFG_DOUBLE, OFF(offload_optimizer_ratio), 0, 1, NULL, NULL},
    {"zero_optimization.offload_optimizer.fast_init", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "strata always initialises state straight into its tier; remove the key"},
    {"zero_optimization.sub_group_size", CFG_COUNT, OFF(sub_group_size), 1, SIZE_MAX_D, NULL, NULL},
    {"zero_optimization.stage3_prefetch_bucket_size", CFG_COUNT, OFF(prefetch_bucket_size), 0, SIZE_MAX_D, NULL, NULL},
    {"zero_optimization.stage3_max_live_parameters", CFG_COUNT, OFF(max_live_parameters), 1, SIZE_MAX_D, NULL, NULL},
    {"zero_optimization.stage3_param_persistence_threshold", CFG_COUNT, OFF(param_persistence_threshold), 0, SIZE_MAX_D, NULL, NULL},
    {"zero_optimization.contiguous_gradients", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, only_true,
     "strata always keeps each module's gradients in one contiguous buffer"},
    {"zero_optimization.overlap_comm", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, only_true,
     "strata always overlaps its transfers and collectives with compute, on dedicated streams"},
    {"zero_optimization.allgather_partitions", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, only_true,
     "strata always gathers parameters with all-gather collectives (false would broadcast them)"},
    {"zero_optimization.reduce_scatter", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, only_true,
     "strata always reduce-scatters gradients to their owners from stage 1 on (stage 0 all-reduces them)"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, only_true,
     "strata always saves a model's full weights, its master weights in the model's dtype (strata.torch's "
     "state_dict(), so Trainer.save_model and save_pretrained, and `strata ckpt export`), never empty partitions"},
    /* Tuning hints: strata plans the job itself, so any value is accepted, with a notice (see CFG_PLANNED). */
    {"zero_optimization.reduce_bucket_size", CFG_PLANNED, NOFIELD, 0, SIZE_MAX_D, NULL,
     "strata reduce-scatters gradients one module at a time: a module is its bucket"},
    {"zero_optimization.allgather_bucket_size", CFG_PLANNED, NOFIELD, 0, SIZE_MAX_D, NULL,
     "strata all-gathers parameters one module at a time: a module is its bucket"},
    {"zero_optimization.round_robin_gradients", CFG_PLANNED, NOFIELD, 0, 0, true_or_false,
     "strata cuts every module into equal shards, one per rank, and hands a module's gradients over as its backward "
     "ends"},
    {"zero_optimization.stage3_max_reuse_distance", CFG_PLANNED, NOFIELD, 0, SIZE_MAX_D, NULL,
     "strata keeps a released module on the device while it is needed again within the prefetch window "
     "(stage3_prefetch_bucket_size) and the residency cap (stage3_max_live_parameters) allows"},
    {"zero_optimization.offload_param.pin_memory_buffer", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "remove the key"},

    {"aio", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"aio.block_size", CFG_BYTES, OFF(aio.block_size), NVME_BLOCK_MIN, NVME_BLOCK_MAX, NULL, NULL},
    {"aio.queue_depth", CFG_INT, OFF(aio.queue_depth), 1, NVME_QUEUE_DEPTH_MAX, NULL, NULL},
    {"aio.intra_op_parallelism", CFG_INT, OFF(aio.intra_op_parallelism), 1, NVME_MAX_RINGS, NULL, NULL},
    {"aio.thread_count", CFG_RENAMED, NOFIELD, 0, 0, NULL, "aio.intra_op_parallelism"},
    {"aio.single_submit", CFG_BOOL, OFF(aio.single_submit), 0, 0, NULL, NULL},
    {"aio.overlap_events", CFG_BOOL, OFF(aio.overlap_events), 0, 0, NULL, NULL},
    {"aio.use_gds", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "GPUDirect Storage is not implemented; NVMe data moves through pinned host buffers"},

    {"optimizer", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"optimizer.type", CFG_OPTIMIZER, OFF(optimizer), 0, 0, NULL, NULL},
    {"optimizer.params", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"optimizer.params.lr", CFG_FLOAT, OFF(lr), FLT_MIN, 1e6, NULL, NULL},
    {"optimizer.params.betas", CFG_BETAS, OFF(beta1), 0, 0, NULL, NULL},
    {"optimizer.params.eps", CFG_FLOAT, OFF(eps), FLT_MIN, 1, NULL, NULL},
    {"optimizer.params.weight_decay", CFG_FLOAT, OFF(weight_decay), 0, 1e6, NULL, NULL},
    {"optimizer.params.bias_correction", CFG_BOOL, OFF(bias_correction), 0, 0, NULL, NULL},
    {"optimizer.params.adam_w_mode", CFG_ADAM_W_MODE, OFF(optimizer), 0, 0, NULL, NULL},
    {"optimizer.params.amsgrad", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "AMSGrad is not implemented; remove the key"},
    {"optimizer.params.torch_adam", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "strata always runs its own CPU Adam; remove the key"},

    {"bf16", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"bf16.enabled", CFG_PRECISION, OFF(param_dtype), 0, 0, NULL, NULL},
    {"fp16", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"fp16.enabled", CFG_PRECISION, OFF(param_dtype), 0, 0, NULL, NULL},
    {"fp16.loss_scale", CFG_DOUBLE, OFF(loss_scale), 0, 1e30, NULL, NULL},
    {"fp16.initial_scale_power", CFG_INT, OFF(initial_scale_power), 0, 63, NULL, NULL},
    {"fp16.loss_scale_window", CFG_INT, OFF(loss_scale_window), 1, INT_MAX_D, NULL, NULL},
    {"fp16.hysteresis", CFG_INT, OFF(hysteresis), 1, INT_MAX_D, NULL, NULL},
    {"fp16.min_loss_scale", CFG_DOUBLE, OFF(min_loss_scale), DBL_MIN, 1e30, NULL, NULL},
    {"fp16.consecutive_hysteresis", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "strata's hysteresis counts every overflow; remove the key"},
    {"fp16.auto_cast", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "casting inputs is the trainer's business; remove the key"},
    {"gradient_clipping", CFG_DOUBLE, OFF(gradient_clipping), 0, 1e30, NULL, NULL},

    {"train_batch_size", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "batch sizes belong to the trainer (strata train --batch, --grad-accum)"},
    {"train_micro_batch_size_per_gpu", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "batch sizes belong to the trainer (strata train --batch)"},
    {"gradient_accumulation_steps", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "accumulation belongs to the trainer (strata train --grad-accum)"},
    {"steps_per_print", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "printing belongs to the trainer"},
    {"wall_clock_breakdown", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, only_false,
     "strata prints no per-step timing breakdown; strata.trace_path writes a per-stream timeline instead"},
    {"scheduler", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "learning-rate schedules belong to the trainer; strata_step takes the lr of each step"},
    {"activation_checkpointing", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL,
     "checkpointing belongs to the trainer's model code (strata train --activation-checkpointing); to keep the "
     "checkpointed activations off the device (DeepSpeed's cpu_checkpointing) hand them to strata_act_push with "
     "strata.offload_activations"},
    {"zero_allow_untested_optimizer", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "strata only runs Adam/AdamW"},
    {"communication_data_type", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "strata reduces gradients in fp32 and gathers parameters in their own dtype; remove the key"},
    {"flops_profiler", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "use strata.trace_path"},
    {"tensorboard", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "use strata train --log-jsonl"},
    {"amp", CFG_UNIMPLEMENTED, NOFIELD, 0, 0, NULL, "use bf16.enabled or fp16.enabled"},

    {"strata", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"strata.backend", CFG_ENUM, OFF(backend), 0, 0, backend_choices, NULL},
    {"strata.device_id", CFG_INT, OFF(device_id), 0, 1023, NULL, NULL},
    {"strata.device_budget_bytes", CFG_BYTES, OFF(device_budget_bytes), 0, SIZE_MAX_D, NULL, NULL},
    {"strata.host_budget_bytes", CFG_BYTES, OFF(host_budget_bytes), 0, SIZE_MAX_D, NULL, NULL},
    {"strata.prefetch_bytes", CFG_BYTES, OFF(prefetch_bytes), 0, SIZE_MAX_D, NULL, NULL},
    {"strata.max_live_bytes", CFG_BYTES, OFF(max_live_bytes), 0, SIZE_MAX_D, NULL, NULL},
    {"strata.activation_bytes", CFG_BYTES, OFF(activation_bytes), 0, SIZE_MAX_D, NULL, NULL},
    {"strata.cpu_threads", CFG_INT, OFF(cpu_threads), 0, 1024, NULL, NULL},
    {"strata.delayed_update", CFG_BOOL, OFF(delayed_update), 0, 0, NULL, NULL},
    {"strata.delayed_warmup_steps", CFG_INT, OFF(delayed_warmup_steps), 0, INT_MAX_D, NULL, NULL},
    {"strata.trace_path", CFG_STRING, OFF(trace_path), 0, 0, NULL, NULL},
    {"strata.swap_checksum", CFG_BOOL, OFF(swap_checksum), 0, 0, NULL, NULL},
    {"strata.gradients_on_nvme", CFG_ENUM, OFF(gradients_on_nvme), 0, 0, switch_choices, NULL},
    {"strata.host_cache", CFG_BOOL, OFF(host_cache), 0, 0, NULL, NULL},
    {"strata.step_in_backward", CFG_BOOL, OFF(step_in_backward), 0, 0, NULL, NULL},
    {"strata.norm_pass", CFG_BOOL, OFF(norm_pass), 0, 0, NULL, NULL},
    {"strata.adam_first_moment", CFG_ENUM, OFF(adam_formula), 0, 0, formula_choices, NULL},
    {"strata.optimizer_moments", CFG_ENUM, OFF(optimizer_moments), 0, 0, moments_choices, NULL},
    {"strata.optimizer_moments_seed", CFG_INT, OFF(optimizer_moments_seed), 0, INT_MAX_D, NULL, NULL},
    {"strata.offload_activations", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"strata.offload_activations.device", CFG_ENUM, OFF(offload_activations), 0, 0, tier_choices, NULL},
    {"strata.offload_activations.bytes", CFG_BYTES, OFF(offloaded_activation_bytes), 0, SIZE_MAX_D, NULL, NULL},
    {"strata.offload_activations.max_bytes", CFG_BYTES, OFF(offloaded_activation_max_bytes), 0, SIZE_MAX_D, NULL,
     NULL},
    {"strata.comm_timeout_s", CFG_DOUBLE, OFF(comm_timeout_s), 0, COMM_TIMEOUT_MAX_S, NULL, NULL},
    {"strata.gradient_reduction", CFG_ENUM, OFF(gradient_reduction), 0, 0, reduction_choices, NULL},
    {"strata.ignore_unimplemented", CFG_BOOL, OFF(ignore_unimplemented), 0, 0, NULL, NULL},
    {"strata.aio", CFG_SECTION, NOFIELD, 0, 0, NULL, NULL},
    {"strata.aio.direct", CFG_ENUM, OFF(aio.direct), 0, 0, switch_choices, NULL},
    {"strata.aio.sqpoll", CFG_ENUM, OFF(aio.sqpoll), 0, 0, switch_choices, NULL},
};
const size_t cfg_key_count = ARRAY_LEN(cfg_keys);

bool cfg_key_is_setting(const cfg_key *key)
{
    return key->kind != CFG_SECTION && key->kind != CFG_UNIMPLEMENTED && key->kind != CFG_PLANNED &&
           key->kind != CFG_RENAMED;
}

/* One flag per table entry: static storage starts false. */
static _Atomic bool noticed[ARRAY_LEN(cfg_keys)];

bool cfg_key_first_notice(const cfg_key *key)
{
    size_t i = (size_t)(key - cfg_keys);
    assert(i < cfg_key_count);
    return !atomic_exchange(&noticed[i], true);
}

const cfg_key *cfg_key_find(const char *path)
{
    for (size_t i = 0; i < cfg_key_count; i++)
        if (strcmp(cfg_keys[i].path, path) == 0)
            return &cfg_keys[i];
    return NULL;
}

static const char *last_segment(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

static size_t parent_len(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot ? (size_t)(dot - path) : 0;
}

const cfg_key *cfg_key_suggest(const char *path)
{
    const char *leaf = last_segment(path);
    size_t plen = parent_len(path);
    const cfg_key *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < cfg_key_count; i++) {
        const cfg_key *k = &cfg_keys[i];
        if (k->kind == CFG_UNIMPLEMENTED || k->kind == CFG_PLANNED)
            continue;
        const char *kleaf = last_segment(k->path);
        bool sibling = parent_len(k->path) == plen && strncmp(k->path, path, plen) == 0;
        size_t d;
        if (strcmp(kleaf, leaf) == 0)
            d = 0;                       /* the right key in the wrong section */
        else if (sibling)
            d = nearest_distance(leaf, kleaf);
        else
            continue;
        if (d < best_d) {
            best_d = d;
            best = k;
        }
    }
    return best && nearest_is_close(leaf, best_d) ? best : NULL;
}

void cfg_range_format(const cfg_key *k, char *buf, size_t len)
{
    if (k->kind == CFG_BYTES) {
        char lo[32], hi[32];
        if (k->max >= SIZE_MAX_D)
            snprintf(buf, len, "at least %s", size_format((size_t)k->min, lo, sizeof lo));
        else
            snprintf(buf, len, "[%s, %s]", size_format((size_t)k->min, lo, sizeof lo),
                     size_format((size_t)k->max, hi, sizeof hi));
    } else if (k->max >= SIZE_MAX_D) {
        snprintf(buf, len, "at least %.0f", k->min);
    } else if ((k->kind == CFG_FLOAT || k->kind == CFG_DOUBLE) && k->min > 0 && k->min < 1e-30) {
        snprintf(buf, len, "(0, %g]", k->max); /* the table's "smallest positive" lower bound */
    } else if (k->kind == CFG_FLOAT || k->kind == CFG_DOUBLE) {
        snprintf(buf, len, "[%g, %g]", k->min, k->max);
    } else {
        snprintf(buf, len, "[%.0f, %.0f]", k->min, k->max);
    }
}

void cfg_choices_format(const cfg_choice *choices, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; choices[i].name && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s\"%s\"", i ? ", " : "", choices[i].name);
}

static const char *choice_name(const cfg_choice *choices, int value)
{
    for (size_t i = 0; choices[i].name; i++)
        if (choices[i].value == value)
            return choices[i].name;
    return "?";
}

const char *cfg_moments_name(strata_moments moments)
{
    return choice_name(moments_choices, (int)moments);
}

void cfg_key_format(const cfg_key *key, const strata_config *cfg, char *buf, size_t len)
{
    const char *base = (const char *)cfg + key->offset;
    char human[32];
    switch (key->kind) {
    case CFG_BOOL:
        snprintf(buf, len, "%s", *(const bool *)base ? "true" : "false");
        break;
    case CFG_INT:
        snprintf(buf, len, "%d", *(const int *)base);
        break;
    case CFG_COUNT:
        snprintf(buf, len, "%zu", *(const size_t *)base);
        break;
    case CFG_BYTES: {
        size_t v = *(const size_t *)base;
        if (v == 0)
            snprintf(buf, len, "0 (automatic)");
        else
            snprintf(buf, len, "%zu (%s)", v, size_format(v, human, sizeof human));
        break;
    }
    case CFG_FLOAT:
        snprintf(buf, len, "%g", (double)*(const float *)base);
        break;
    case CFG_DOUBLE:
        snprintf(buf, len, "%g", *(const double *)base);
        break;
    case CFG_ENUM:
        snprintf(buf, len, "%s", choice_name(key->choices, *(const int *)base));
        break;
    case CFG_PATHS: {
        const strata_offload_config *o = (const strata_offload_config *)base;
        size_t used = 0;
        buf[0] = '\0';
        if (o->nvme_path_count == 0)
            snprintf(buf, len, "(none)");
        for (int i = 0; i < o->nvme_path_count && used < len; i++)
            used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", o->nvme_path[i]);
        break;
    }
    case CFG_STRING:
        snprintf(buf, len, "%s", *base ? base : "(none)");
        break;
    case CFG_BETAS:
        snprintf(buf, len, "[%g, %g]", (double)cfg->beta1, (double)cfg->beta2);
        break;
    case CFG_PRECISION: {
        bool on = strncmp(key->path, "bf16", 4) == 0 ? cfg->param_dtype == STRATA_DTYPE_BF16
                                                     : cfg->param_dtype == STRATA_DTYPE_FP16;
        snprintf(buf, len, "%s", on ? "true" : "false");
        break;
    }
    case CFG_OPTIMIZER:
        snprintf(buf, len, "%s", cfg->optimizer == STRATA_OPTIMIZER_ADAMW ? "AdamW" : "Adam");
        break;
    case CFG_ADAM_W_MODE:
        snprintf(buf, len, "%s", cfg->optimizer == STRATA_OPTIMIZER_ADAMW ? "true" : "false");
        break;
    case CFG_SECTION:
    case CFG_UNIMPLEMENTED:
    case CFG_PLANNED:
    case CFG_RENAMED:
        buf[0] = '\0';
        break;
    }
}

json_t *cfg_key_value_json(const cfg_key *key, const strata_config *cfg)
{
    const char *base = (const char *)cfg + key->offset;
    switch (key->kind) {
    case CFG_BOOL:
        return json_boolean(*(const bool *)base);
    case CFG_INT:
        return json_integer(*(const int *)base);
    case CFG_COUNT:
    case CFG_BYTES:
        return json_integer((json_int_t) * (const size_t *)base);
    case CFG_FLOAT: {
        const double *exact = cfg_exact_of(cfg, key->offset);
        return json_real(exact ? *exact : (double)*(const float *)base);
    }
    case CFG_DOUBLE:
        return json_real(*(const double *)base);
    case CFG_PATHS: {
        const strata_offload_config *o = (const strata_offload_config *)base;
        json_t *a = json_array();
        for (int i = 0; a && i < o->nvme_path_count; i++)
            json_array_append_new(a, json_string(o->nvme_path[i]));
        return a;
    }
    case CFG_STRING:
        return json_string(base);
    case CFG_BETAS:
        return json_pack("[f, f]", cfg->beta1_exact, cfg->beta2_exact);
    case CFG_PRECISION:
    case CFG_ADAM_W_MODE: {
        char text[8];
        cfg_key_format(key, cfg, text, sizeof text);
        return json_boolean(strcmp(text, "true") == 0);
    }
    case CFG_ENUM:
    case CFG_OPTIMIZER: {
        char text[64];
        cfg_key_format(key, cfg, text, sizeof text);
        return json_string(text);
    }
    case CFG_SECTION:
    case CFG_UNIMPLEMENTED:
    case CFG_PLANNED:
    case CFG_RENAMED:
        break;
    }
    return json_null();
}
