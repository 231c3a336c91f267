/*
 * The configuration loader: one case per error class with the exact message, a DeepSpeed-style
 * config resolved to the expected values, and "an error loses nothing" (the struct is untouched).
 */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <unistd.h>

#include "testlib.h"

/* Messages logged while a capture runs, one per line. */
static char captured[4096];

static void capture(strata_log_level level, const char *subsystem, const char *message, void *user)
{
    (void)level, (void)user;
    size_t used = strlen(captured);
    snprintf(captured + used, sizeof captured - used, "%s: %s\n", subsystem, message);
}

static void log_capture_start(void)
{
    captured[0] = '\0';
    strata_log_set_callback(capture, NULL);
}

static void log_capture_stop(void)
{
    strata_log_set_callback(NULL, NULL);
}

static strata_config defaults(void)
{
    strata_config c;
    strata_config_init(&c);
    return c;
}

/* Loads json over the defaults and expects failure with exactly `expected` as the whole report. */
static void expect_error(const char *json, const char *expected)
{
    strata_config cfg = defaults(), before = cfg;
    char err[4096] = "";
    strata_status st = strata_config_load_json_string(&cfg, json, "test.json", err, sizeof err);
    T_CHECK(st == STRATA_ECONFIG, "status for %s: got %s, expected STRATA_ECONFIG", json, strata_status_name(st));
    T_EQ_STR(err, expected);
    T_CHECK(memcmp(&cfg, &before, sizeof cfg) == 0, "a failed load changed the config (json %s)", json);
    /* The thread's last error is the first line. */
    T_CHECK(strncmp(strata_last_error(NULL), expected, strcspn(expected, "\n")) == 0,
            "last error \"%s\" is not the first line of \"%s\"", strata_last_error(NULL), expected);
}

static void test_error_classes(void)
{
    /* unknown key, with a suggestion among its siblings */
    expect_error("{\"zero_optimization\": {\"sub_grup_size\": 1e8}}",
                 "config: unknown key zero_optimization.sub_grup_size; did you mean zero_optimization.sub_group_size?");
    /* the right key in the wrong section */
    expect_error("{\"sub_group_size\": 1000}",
                 "config: unknown key sub_group_size; did you mean zero_optimization.sub_group_size?");
    /* nothing close: the section's keys are listed */
    expect_error("{\"aio\": {\"zzz\": 1}}",
                 "config: unknown key aio.zzz; keys allowed in aio: block_size, queue_depth, intra_op_parallelism, "
                 "thread_count, single_submit, overlap_events");
    /* wrong type */
    expect_error("{\"zero_optimization\": {\"stage\": \"3\"}}",
                 "config: zero_optimization.stage = \"3\" has the wrong type (string); expected an integer in [0, 3]");
    expect_error("{\"aio\": {\"single_submit\": 1}}",
                 "config: aio.single_submit = 1 has the wrong type (integer); expected true or false");
    expect_error("{\"aio\": []}", "config: aio = [] has the wrong type (array); expected an object { ... }");
    /* out of range */
    expect_error("{\"aio\": {\"queue_depth\": 3000}}", "config: aio.queue_depth = 3000 is out of range [1, 1024]");
    expect_error("{\"optimizer\": {\"params\": {\"lr\": -0.1}}}",
                 "config: optimizer.params.lr = -0.1 is out of range (0, 1e+06]");
    expect_error("{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.0]}}}",
                 "config: optimizer.params.betas = [0.9,1.0] is out of range: each beta must be in [0, 1)");
    /* enum */
    expect_error("{\"zero_optimization\": {\"offload_param\": {\"device\": \"gpu\"}}}",
                 "config: zero_optimization.offload_param.device = \"gpu\" is not allowed; allowed: \"none\", "
                 "\"cpu\", \"nvme\", \"auto\"");
    /* bad size strings */
    expect_error("{\"strata\": {\"host_budget_bytes\": \"8 gigs\"}}",
                 "config: strata.host_budget_bytes = \"8 gigs\" is not a size; expected bytes as a number or a string "
                 "like \"512MiB\", \"8GiB\", \"1.5TB\"");
    expect_error("{\"aio\": {\"block_size\": \"128MiB\"}}",
                 "config: aio.block_size = \"128MiB\" is out of range [4.00 KiB, 64.00 MiB]");
    /* numbers too large for a size_t are range errors, not undefined conversions (found by fuzz_config) */
    expect_error("{\"aio\": {\"block_size\": 1e60}}", "config: aio.block_size = 1e60 is out of range [4.00 KiB, 64.00 MiB]");
    expect_error("{\"zero_optimization\": {\"sub_group_size\": 18446744073709551616.0}}",
                 "config: zero_optimization.sub_group_size = 1.84467440737096e19 is out of range: at least 1 and below 2^64 allowed");
    /* malformed JSON with line and column */
    expect_error("{\n  \"aio\": {\"block_size\": 4096,}\n}",
                 "config: test.json:2:30: malformed JSON: string or '}' expected near '}'");
    expect_error("{\"aio\": {\"queue_depth\": 4, \"queue_depth\": 8}}",
                 "config: test.json:1:40: malformed JSON: duplicate object key near '\"queue_depth\"'");
    /* a DeepSpeed key strata does not implement */
    expect_error("{\"zero_optimization\": {\"overlap_comm\": false}}",
                 "config: zero_optimization.overlap_comm = false is a DeepSpeed setting that strata does not "
                 "implement: strata always overlaps its transfers and collectives with compute, on dedicated streams; "
                 "write true (what strata does) or remove the key; or set strata.ignore_unimplemented = true to only "
                 "warn");
    expect_error("{\"zero_optimization\": {\"contiguous_gradients\": false}}",
                 "config: zero_optimization.contiguous_gradients = false is a DeepSpeed setting that strata does not "
                 "implement: strata always keeps each module's gradients in one contiguous buffer; write true (what "
                 "strata does) or remove the key; or set strata.ignore_unimplemented = true to only warn");
    expect_error("{\"zero_optimization\": {\"allgather_partitions\": false}}",
                 "config: zero_optimization.allgather_partitions = false is a DeepSpeed setting that strata does not "
                 "implement: strata always gathers parameters with all-gather collectives (false would broadcast "
                 "them); write true (what strata does) or remove the key; or set strata.ignore_unimplemented = true "
                 "to only warn");
    expect_error("{\"zero_optimization\": {\"reduce_scatter\": false}}",
                 "config: zero_optimization.reduce_scatter = false is a DeepSpeed setting that strata does not "
                 "implement: strata always reduce-scatters gradients to their owners from stage 1 on (stage 0 "
                 "all-reduces them); write true (what strata does) or remove the key; or set "
                 "strata.ignore_unimplemented = true to only warn");
    expect_error("{\"zero_optimization\": {\"stage3_gather_16bit_weights_on_model_save\": false}}",
                 "config: zero_optimization.stage3_gather_16bit_weights_on_model_save = false is a DeepSpeed setting "
                 "that strata does not implement: strata always saves a model's full weights, its master weights in "
                 "the model's dtype (strata.torch's state_dict(), so Trainer.save_model and save_pretrained, and "
                 "`strata ckpt export`), never empty partitions; write true (what strata does) or remove the key; or "
                 "set strata.ignore_unimplemented = true to only warn");
    expect_error("{\"wall_clock_breakdown\": true}",
                 "config: wall_clock_breakdown = true is a DeepSpeed setting that strata does not implement: strata "
                 "prints no per-step timing breakdown; strata.trace_path writes a per-stream timeline instead; write "
                 "false (what strata does) or remove the key; or set strata.ignore_unimplemented = true to only warn");
    /* a tuning hint strata plans itself takes a value of its type, and nothing else */
    expect_error("{\"zero_optimization\": {\"reduce_bucket_size\": \"big\"}}",
                 "config: zero_optimization.reduce_bucket_size = \"big\" has the wrong type (string); expected a "
                 "whole number of elements (at least 0) or \"auto\"");
    expect_error("{\"zero_optimization\": {\"allgather_bucket_size\": -1}}",
                 "config: zero_optimization.allgather_bucket_size = -1 is out of range: at least 0 and below 2^64 "
                 "allowed");
    expect_error("{\"zero_optimization\": {\"round_robin_gradients\": 1}}",
                 "config: zero_optimization.round_robin_gradients = 1 has the wrong type (integer); expected true or "
                 "false");
    /* "auto" where strata has nothing to fill it with: the message says who fills it */
    expect_error("{\"optimizer\": {\"params\": {\"lr\": \"auto\"}}}",
                 "config: optimizer.params.lr = \"auto\" has the wrong type (string); expected a number in (0, 1e+06]; "
                 "\"auto\" is filled in by transformers' Trainer from its TrainingArguments "
                 "(strata.torch.hf.StrataTrainer and strata.torch.hf.fill_auto fill it the same way): elsewhere write "
                 "the value");
    /* DeepSpeed keys strata validated once but never read: refused with what strata does instead */
    expect_error("{\"zero_optimization\": {\"offload_param\": {\"buffer_count\": 5}}}",
                 "config: zero_optimization.offload_param.buffer_count is a DeepSpeed key that strata does not "
                 "implement: strata sizes its pinned NVMe fetch staging from the prefetch window "
                 "(stage3_prefetch_bucket_size or strata.prefetch_bytes) plus two of the largest module, as strata "
                 "estimate shows; remove the key; or set strata.ignore_unimplemented = true to only warn");
    expect_error("{\"zero_optimization\": {\"offload_param\": {\"buffer_size\": 1e8}}}",
                 "config: zero_optimization.offload_param.buffer_size is a DeepSpeed key that strata does not "
                 "implement: strata sizes its pinned NVMe fetch staging from the prefetch window "
                 "(stage3_prefetch_bucket_size or strata.prefetch_bytes) plus two of the largest module, as strata "
                 "estimate shows; remove the key; or set strata.ignore_unimplemented = true to only warn");
    expect_error("{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_count\": 4}}}",
                 "config: zero_optimization.offload_optimizer.buffer_count is a DeepSpeed key that strata does not "
                 "implement: strata keeps four pinned optimizer slots of one sub-group each "
                 "(zero_optimization.sub_group_size elements of master weights and both moments); size them with "
                 "sub_group_size and remove the key; or set strata.ignore_unimplemented = true to only warn");
    /* ... and those where one value is what strata does anyway: that value passes, any other is refused */
    expect_error("{\"zero_optimization\": {\"offload_param\": {\"pin_memory\": false}}}",
                 "config: zero_optimization.offload_param.pin_memory = false is a DeepSpeed setting that strata does "
                 "not implement: strata always pins its host buffers (host-tier state and its staging pool, both "
                 "counted in strata.host_budget_bytes); write true (what strata does) or remove the key; or set "
                 "strata.ignore_unimplemented = true to only warn");
    expect_error("{\"zero_optimization\": {\"offload_optimizer\": {\"pin_memory\": false}}}",
                 "config: zero_optimization.offload_optimizer.pin_memory = false is a DeepSpeed setting that strata "
                 "does not implement: strata always pins its host buffers (host-tier state and its staging pool, "
                 "both counted in strata.host_budget_bytes); write true (what strata does) or remove the key; or set "
                 "strata.ignore_unimplemented = true to only warn");
    expect_error("{\"zero_optimization\": {\"offload_optimizer\": {\"ratio\": 1.5}}}",
                 "config: zero_optimization.offload_optimizer.ratio = 1.5 is out of range [0, 1]");
    /* a value of the wrong type is not what strata does either */
    expect_error("{\"zero_optimization\": {\"offload_optimizer\": {\"pin_memory\": \"yes\"}}}",
                 "config: zero_optimization.offload_optimizer.pin_memory = \"yes\" is a DeepSpeed setting that "
                 "strata does not implement: strata always pins its host buffers (host-tier state and its staging "
                 "pool, both counted in strata.host_budget_bytes); write true (what strata does) or remove the key; "
                 "or set strata.ignore_unimplemented = true to only warn");
    /* relations between keys */
    expect_error("{\"bf16\": {\"enabled\": true}, \"fp16\": {\"enabled\": true}}",
                 "config: bf16.enabled and fp16.enabled are both true; enable at most one");
    expect_error("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}",
                 "config: zero_optimization.offload_optimizer.device = \"nvme\" needs "
                 "zero_optimization.offload_optimizer.nvme_path (a directory on a fast local drive, or a list of "
                 "them to stripe)");
    expect_error("{\"aio\": {\"block_size\": 5000}}",
                 "config: aio.block_size = 5000 is not a multiple of 4096; direct I/O moves whole 4 KiB pages");
    /* several problems are all reported, one per line */
    expect_error("{\"aio\": {\"queue_depth\": 0, \"single_submit\": \"no\"}}",
                 "config: aio.queue_depth = 0 is out of range [1, 1024]\n"
                 "config: aio.single_submit = \"no\" has the wrong type (string); expected true or false");
    expect_error("[1, 2]", "config: test.json: the top level must be a JSON object { ... }, not array");
}

static void test_deepspeed_config_resolves(void)
{
    const char *json =
        "{\n"
        "  \"zero_optimization\": {\n"
        "    \"stage\": 3,\n"
        "    \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/local_nvme\", \"pin_memory\": true,\n"
        "                      \"max_in_cpu\": 2e8},\n"
        "    \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": [\"/nvme0\", \"/nvme1\"],\n"
        "                          \"pin_memory\": true, \"pipeline_read\": true, \"pipeline_write\": false, \"ratio\": 1.0},\n"
        "    \"sub_group_size\": 5e7,\n"
        "    \"stage3_prefetch_bucket_size\": \"auto\",\n"
        "    \"stage3_max_live_parameters\": 3e8,\n"
        "    \"stage3_param_persistence_threshold\": 1e4\n"
        "  },\n"
        "  \"aio\": {\"block_size\": 262144, \"queue_depth\": 16, \"thread_count\": 2, \"single_submit\": true,\n"
        "          \"overlap_events\": false},\n"
        "  \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 3e-4, \"betas\": [0.8, 0.95], \"eps\": 1e-6,\n"
        "                \"weight_decay\": 0.1, \"adam_w_mode\": false}},\n"
        "  \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12, \"loss_scale_window\": 500,\n"
        "           \"hysteresis\": 3, \"min_loss_scale\": 0.5},\n"
        "  \"gradient_clipping\": 1.0,\n"
        "  \"strata\": {\"backend\": \"host\", \"device_budget_bytes\": \"2GiB\", \"host_budget_bytes\": 8589934592,\n"
        "             \"cpu_threads\": 2, \"delayed_update\": true, \"delayed_warmup_steps\": 5,\n"
        "             \"trace_path\": \"/tmp/trace.json\", \"aio\": {\"direct\": false}}\n"
        "}\n";
    strata_config c = defaults();
    char err[4096] = "";
    T_OK(strata_config_load_json_string(&c, json, "ds.json", err, sizeof err));
    T_EQ_STR(err, "");
    T_EQ_INT(c.zero_stage, 3);
    T_EQ_INT(c.offload_param.device, STRATA_TIER_NVME);
    T_EQ_INT(c.offload_param.nvme_path_count, 1);
    T_EQ_STR(c.offload_param.nvme_path[0], "/local_nvme");
    T_EQ_INT(c.offload_optimizer.device, STRATA_TIER_NVME);
    T_EQ_INT(c.offload_optimizer.nvme_path_count, 2);
    T_EQ_STR(c.offload_optimizer.nvme_path[1], "/nvme1");
    T_EQ_INT(c.offload_optimizer.pipeline_write, 0);
    T_EQ_INT(c.sub_group_size, 50000000);
    T_EQ_INT(c.prefetch_bucket_size, defaults().prefetch_bucket_size); /* "auto" keeps the default */
    T_EQ_INT(c.max_live_parameters, 300000000);
    T_EQ_INT(c.param_persistence_threshold, 10000);
    T_EQ_INT(c.param_max_in_cpu, 200000000);
    T_EQ_INT(c.aio.block_size, 262144);
    T_EQ_INT(c.aio.queue_depth, 16);
    T_EQ_INT(c.aio.intra_op_parallelism, 2); /* from the old spelling thread_count */
    T_EQ_INT(c.aio.single_submit, 1);
    T_EQ_INT(c.aio.overlap_events, 0);
    T_EQ_INT(c.aio.direct, STRATA_SWITCH_OFF);
    T_EQ_INT(c.optimizer, STRATA_OPTIMIZER_ADAM); /* DeepSpeed's Adam with adam_w_mode=false is L2 Adam */
    T_CHECK(c.lr == 3e-4f && c.beta1 == 0.8f && c.beta2 == 0.95f && c.eps == 1e-6f && c.weight_decay == 0.1f,
            "optimizer params lr=%g betas=[%g,%g] eps=%g wd=%g", (double)c.lr, (double)c.beta1, (double)c.beta2,
            (double)c.eps, (double)c.weight_decay);
    T_EQ_INT(c.param_dtype, STRATA_DTYPE_FP16);
    T_CHECK(c.loss_scale == 0 && c.min_loss_scale == 0.5, "loss_scale %g min %g", c.loss_scale, c.min_loss_scale);
    T_EQ_INT(c.initial_scale_power, 12);
    T_EQ_INT(c.loss_scale_window, 500);
    T_EQ_INT(c.hysteresis, 3);
    T_CHECK(c.gradient_clipping == 1.0, "gradient_clipping %g", c.gradient_clipping);
    T_EQ_INT(c.backend, STRATA_BACKEND_HOST);
    T_EQ_INT(c.device_budget_bytes, 2ull << 30);
    T_EQ_INT(c.host_budget_bytes, 8ull << 30);
    T_EQ_INT(c.cpu_threads, 2);
    T_EQ_INT(c.delayed_update, 1);
    T_EQ_INT(c.delayed_warmup_steps, 5);
    T_EQ_STR(c.trace_path, "/tmp/trace.json");

    /* DeepSpeed's plain "Adam" is decoupled (AdamW) unless adam_w_mode says otherwise. */
    strata_config d = defaults();
    d.optimizer = STRATA_OPTIMIZER_ADAM;
    T_OK(strata_config_load_json_string(&d, "{\"optimizer\": {\"type\": \"Adam\"}}", NULL, NULL, 0));
    T_EQ_INT(d.optimizer, STRATA_OPTIMIZER_ADAMW);
}

static void test_ignore_unimplemented_warns(void)
{
    strata_config c = defaults();
    /* The switch applies even when it comes after the key it excuses. */
    T_OK(strata_config_load_json_string(
        &c, "{\"train_batch_size\": 32, \"strata\": {\"ignore_unimplemented\": true}}", NULL, NULL, 0));
    T_EQ_INT(c.ignore_unimplemented, 1);

    /* A value strata does not implement only warns too, and the warning says why. */
    strata_config d = defaults(), before = d;
    log_capture_start();
    T_OK(strata_config_load_json_string(&d,
                                        "{\"zero_optimization\": {\"offload_param\": {\"pin_memory\": false}}, "
                                        "\"strata\": {\"ignore_unimplemented\": true}}",
                                        NULL, NULL, 0));
    log_capture_stop();
    T_EQ_STR(captured, "config: zero_optimization.offload_param.pin_memory = false is a DeepSpeed setting that strata "
                       "does not implement (strata always pins its host buffers (host-tier state and its staging "
                       "pool, both counted in strata.host_budget_bytes)); ignored because "
                       "strata.ignore_unimplemented = true\n");
    before.ignore_unimplemented = true;
    T_CHECK(memcmp(&d, &before, sizeof d) == 0, "an ignored key changed something besides ignore_unimplemented");
}

/* The value of each of these is what strata does anyway: a DeepSpeed config that writes it loads silently. */
static void test_what_strata_does_passes(void)
{
    strata_config c = defaults(), before = c;
    log_capture_start();
    T_OK(strata_config_load_json_string(&c,
                                        "{\"zero_optimization\": {\"offload_param\": {\"pin_memory\": true}, "
                                        "\"offload_optimizer\": {\"pin_memory\": true}}}",
                                        NULL, NULL, 0));
    log_capture_stop();
    T_EQ_STR(captured, "");
    T_CHECK(memcmp(&c, &before, sizeof c) == 0, "accepting what strata does anyway changed the config");
}

/* The zero_optimization keys of transformers' stock ZeRO-2 and ZeRO-3 offload configs load. The tuning hints strata
 * plans itself each log one warning that says so, once per process however often a config is loaded; the settings
 * whose value is what strata does load silently; neither changes the config. */
static void test_stock_keys_and_planned_notices(void)
{
    const char *json =
        "{\"zero_optimization\": {\"overlap_comm\": true, \"contiguous_gradients\": true, \"reduce_scatter\": true,"
        " \"allgather_partitions\": true, \"stage3_gather_16bit_weights_on_model_save\": true,"
        " \"offload_param\": {\"pin_memory\": true}, \"reduce_bucket_size\": 2e8, \"allgather_bucket_size\": 2e8,"
        " \"round_robin_gradients\": true, \"stage3_max_reuse_distance\": 1e9},"
        " \"wall_clock_breakdown\": false}";
    strata_config c = defaults(), before = c;
    log_capture_start();
    T_OK(strata_config_load_json_string(&c, json, NULL, NULL, 0));
    log_capture_stop();
    T_EQ_STR(captured,
             "config: zero_optimization.reduce_bucket_size = 200000000.0 is a DeepSpeed tuning hint that strata plans "
             "itself (strata reduce-scatters gradients one module at a time: a module is its bucket); accepted, not "
             "read\n"
             "config: zero_optimization.allgather_bucket_size = 200000000.0 is a DeepSpeed tuning hint that strata "
             "plans itself (strata all-gathers parameters one module at a time: a module is its bucket); accepted, not "
             "read\n"
             "config: zero_optimization.round_robin_gradients = true is a DeepSpeed tuning hint that strata plans "
             "itself (strata cuts every module into equal shards, one per rank, and hands a module's gradients over "
             "as its backward ends); accepted, not read\n"
             "config: zero_optimization.stage3_max_reuse_distance = 1000000000.0 is a DeepSpeed tuning hint that "
             "strata plans itself (strata keeps a released module on the device while it is needed again within the "
             "prefetch window (stage3_prefetch_bucket_size) and the residency cap (stage3_max_live_parameters) "
             "allows); accepted, not read\n");
    T_CHECK(memcmp(&c, &before, sizeof c) == 0, "the stock keys changed the config");
    /* Loaded again (strata.torch loads a config several times): no second notice. */
    log_capture_start();
    T_OK(strata_config_load_json_string(&c, "{\"zero_optimization\": {\"reduce_bucket_size\": \"auto\"}}", NULL,
                                        NULL, 0));
    log_capture_stop();
    T_EQ_STR(captured, "");
    T_CHECK(memcmp(&c, &before, sizeof c) == 0, "\"auto\" for a planned key changed the config");
}

static void test_file_errors(void)
{
    strata_config c = defaults();
    char err[1024];
    T_STATUS(strata_config_load_json(&c, "/nonexistent/strata.json", err, sizeof err), STRATA_ENOTFOUND);
    T_EQ_STR(err, "config: cannot open \"/nonexistent/strata.json\": No such file or directory (ENOENT)");
    T_STATUS(strata_config_load_json(NULL, "x", err, sizeof err), STRATA_EINVAL);

    /* A file with random content never crashes the loader and never half-applies. */
    const char *dir = t_scratch_dir("t_config");
    char path[4200];
    snprintf(path, sizeof path, "%s/random.json", dir);
    for (int round = 0; round < 50; round++) {
        unsigned char junk[256];
        t_rand_bytes(junk, sizeof junk);
        junk[0] = '{';
        FILE *f = fopen(path, "wb");
        fwrite(junk, 1, t_rand_range(1, sizeof junk), f);
        fclose(f);
        strata_config before = c;
        strata_status st = strata_config_load_json(&c, path, err, sizeof err);
        T_CHECK(st == STRATA_ECONFIG, "random file round %d: got %s", round, strata_status_name(st));
        T_CHECK(memcmp(&c, &before, sizeof c) == 0, "random file round %d changed the config", round);
    }
}

static void test_validate_from_c(void)
{
    strata_config c = defaults();
    char err[2048];
    T_OK(strata_config_validate(&c, err, sizeof err));
    c.aio.queue_depth = 0;
    c.offload_param.device = STRATA_TIER_NVME;
    T_STATUS(strata_config_validate(&c, err, sizeof err), STRATA_ECONFIG);
    T_EQ_STR(err, "config: aio.queue_depth = 0 is out of range [1, 1024]\n"
                  "config: zero_optimization.offload_param.device = \"nvme\" needs "
                  "zero_optimization.offload_param.nvme_path (a directory on a fast local drive, or a list of them "
                  "to stripe)");
    c = defaults();
    c.offload_param.pipeline_write = true;
    T_STATUS(strata_config_validate(&c, err, sizeof err), STRATA_ECONFIG);
    T_CONTAINS(err, "offload_param.pipeline_read/pipeline_write are set, but they only apply to the optimizer step");
    strata_config raw;
    memset(&raw, 0, sizeof raw);
    T_STATUS(strata_config_validate(&raw, err, sizeof err), STRATA_ECONFIG);
    T_CONTAINS(err, "initialise the struct with strata_config_init()");
    T_STATUS(strata_config_init(NULL), STRATA_EINVAL);
}

/* strata_config_to_json: what bindings read back. Every value typed and exact (a random lr survives as its fp32
 * value, not the %g of the table), the size protocol (ask with outlen 0, refuse a short buffer untouched). */
static void test_to_json(void)
{
    T_EQ_INT(strata_config_size(), sizeof(strata_config));
    strata_config c = defaults();
    double lr = 1e-5 + t_rand_unit() * 1e-2;
    char json[512], err[1024];
    snprintf(json, sizeof json, "{\"optimizer\": {\"params\": {\"lr\": %.17g}}, \"bf16\": {\"enabled\": true},"
             " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", "
             "\"nvme_path\": [\"/a\", \"/b\"]}}}", lr);
    T_OK(strata_config_load_json_string(&c, json, "test", err, sizeof err));
    size_t needed = 0;
    T_STATUS(strata_config_to_json(&c, NULL, 0, &needed), STRATA_EINVAL); /* asking for the size */
    T_CHECK(needed > 100, "needed = %zu", needed);
    char *small = malloc(needed - 1), *text = malloc(needed);
    memset(small, 'x', needed - 1);
    T_STATUS(strata_config_to_json(&c, small, needed - 1, NULL), STRATA_EINVAL);
    T_CHECK(small[0] == 'x', "a short buffer is left untouched");
    T_OK(strata_config_to_json(&c, text, needed, NULL));
    T_EQ_INT(strlen(text) + 1, needed);
    json_t *o = json_loads(text, 0, NULL);
    T_CHECK(o != NULL, "the text is JSON: %s", text);
    double got_lr = json_real_value(json_object_get(o, "optimizer.params.lr"));
    T_CHECK(got_lr == lr, "lr: got %.17g, expected %.17g (exact, not its fp32 rounding)", got_lr, lr);
    T_EQ_INT(json_integer_value(json_object_get(o, "zero_optimization.stage")), 2);
    T_CHECK(json_is_true(json_object_get(o, "bf16.enabled")), "bf16.enabled is true");
    T_CHECK(json_is_false(json_object_get(o, "fp16.enabled")), "fp16.enabled is false");
    T_EQ_STR(json_string_value(json_object_get(o, "zero_optimization.offload_optimizer.device")), "nvme");
    json_t *paths = json_object_get(o, "zero_optimization.offload_optimizer.nvme_path");
    T_CHECK(json_array_size(paths) == 2, "two nvme paths, got %zu", json_array_size(paths));
    T_EQ_STR(json_string_value(json_array_get(paths, 1)), "/b");
    json_decref(o);
    free(small);
    free(text);
    T_STATUS(strata_config_to_json(NULL, NULL, 0, NULL), STRATA_EINVAL);
}

/* The optimizer's exact doubles (strata.h, lr_exact): JSON's values reach Adam unrounded, a float set from C
 * afterwards wins over a double it no longer agrees with, and strata_config_adam_hparams says what runs. */
static void test_exact_hyperparameters(void)
{
    strata_config c = defaults();
    double b1 = 0.8 + 0.1 * t_rand_unit(), wd = 0.2 * t_rand_unit();
    char json[256], err[1024];
    snprintf(json, sizeof json, "{\"optimizer\": {\"params\": {\"betas\": [%.17g, 0.999], \"weight_decay\": %.17g}}}",
             b1, wd);
    T_OK(strata_config_load_json_string(&c, json, "test", err, sizeof err));
    strata_adam_hparams hp;
    T_OK(strata_config_adam_hparams(&c, &hp));
    T_CHECK(hp.beta1 == b1 && hp.beta2 == 0.999 && hp.weight_decay == wd && hp.eps == 1e-8 && hp.lr == 1e-3,
            "from JSON: beta1 %.17g (want %.17g), beta2 %.17g, wd %.17g (want %.17g), eps %.17g, lr %.17g", hp.beta1,
            b1, hp.beta2, hp.weight_decay, wd, hp.eps, hp.lr);
    c.beta1 = 0.5f; /* set from C after the load: the float is what is meant */
    c.lr = 0.25f;
    T_OK(strata_config_adam_hparams(&c, &hp));
    T_CHECK(hp.beta1 == 0.5 && hp.lr == 0.25 && hp.weight_decay == wd, "after C set the floats: beta1 %.17g, lr %.17g, "
            "wd %.17g (want 0.5, 0.25, %.17g)", hp.beta1, hp.lr, hp.weight_decay, wd);
    /* A struct of the 0.1 layout (it ends before the doubles): its floats are the values. */
    strata_config old = defaults();
    old.beta2 = 0.875f;
    old.struct_size = (uint32_t)offsetof(strata_config, lr_exact);
    T_OK(strata_config_adam_hparams(&old, &hp));
    T_CHECK(hp.beta2 == 0.875 && hp.beta1 == 0.9, "0.1 layout: beta2 %.17g (want 0.875), beta1 %.17g (want 0.9)",
            hp.beta2, hp.beta1);
    T_STATUS(strata_config_adam_hparams(NULL, &hp), STRATA_EINVAL);
}

int main(void)
{
    t_rng_seed();
    test_error_classes();
    test_deepspeed_config_resolves();
    test_ignore_unimplemented_warns();
    test_what_strata_does_passes();
    test_stock_keys_and_planned_notices();
    test_file_errors();
    test_validate_from_c();
    test_to_json();
    test_exact_hyperparameters();
    return t_done();
}
