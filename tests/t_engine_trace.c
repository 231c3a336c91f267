/*
 * Stats and trace: a run with parameters and optimizer state on NVMe writes a Chrome trace-event
 * file that parses as JSON and has events on every track, and the per-link byte counters agree
 * with what that run must have moved.
 */
#include <jansson.h>

#include "synth.h"
#include "testlib.h"

int main(void)
{
    t_rng_seed();
    const char *dir = t_scratch_dir("t_engine_trace");
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 64u << 20;
    c.sub_group_size = 12288;
    c.aio.block_size = 64 << 10;
    synth_offload(&c, STRATA_TIER_NVME, dir, true, true);
    c.host_cache = false; /* every link moves bytes: fetches and the step read the drive */
    snprintf(c.trace_path, sizeof c.trace_path, "%s/trace.json", dir);
    float *w = NULL;
    size_t n = 0;
    strata_stats s;
    T_OK(synth_train(&o, &c, &w, &n, NULL, &s));
    free(w);

    /* Counters: every step writes all master/m/v (12 bytes per element) at least. */
    T_EQ_INT(s.steps, o.steps);
    T_CHECK(s.fetches == (uint64_t)(o.steps * o.micro_batches * 2 * o.layers), "fetches %llu",
            (unsigned long long)s.fetches);
    T_CHECK(s.host_to_nvme_bytes >= s.nvme_peak_bytes / 2, "host->nvme %llu bytes, nvme in use %zu",
            (unsigned long long)s.host_to_nvme_bytes, s.nvme_peak_bytes);
    T_CHECK(s.nvme_to_host_bytes > 0 && s.host_to_device_bytes > 0 && s.device_to_host_bytes > 0,
            "a link moved nothing: nvme->host %llu, host->device %llu, device->host %llu",
            (unsigned long long)s.nvme_to_host_bytes, (unsigned long long)s.host_to_device_bytes,
            (unsigned long long)s.device_to_host_bytes);
    T_CHECK(s.adam_ns > 0 && s.step_ns >= s.adam_ns / 4, "adam %llu ns, step %llu ns", (unsigned long long)s.adam_ns,
            (unsigned long long)s.step_ns);

    json_error_t je;
    json_t *root = json_load_file(c.trace_path, 0, &je);
    T_CHECK(root != NULL, "trace is not valid JSON: %s:%d:%d: %s", c.trace_path, je.line, je.column, je.text);
    if (root) {
        json_t *events = json_object_get(root, "traceEvents");
        T_CHECK(json_is_array(events), "no traceEvents array");
        int per_track[8] = {0};
        size_t i;
        json_t *ev;
        json_array_foreach(events, i, ev) {
            const char *ph = json_string_value(json_object_get(ev, "ph"));
            json_int_t tid = json_integer_value(json_object_get(ev, "tid"));
            if (ph && strcmp(ph, "X") == 0 && tid >= 0 && tid < 8) {
                per_track[tid]++;
                T_CHECK(json_real_value(json_object_get(ev, "dur")) >= 0, "negative duration");
            }
        }
        const char *names[] = {"trainer", "h2d", "d2h", "optimizer", "nvme"};
        for (int k = 0; k < 5; k++)
            T_CHECK(per_track[k] > 0, "no events on the %s track", names[k]);
        json_decref(root);
    }

    /* A trace path that cannot be created fails engine creation with the path in the message. */
    snprintf(c.trace_path, sizeof c.trace_path, "%s/no/such/dir/trace.json", dir);
    strata_engine *e;
    T_STATUS(strata_engine_create(&c, &e), STRATA_EIO);
    T_CONTAINS(strata_last_error(NULL), "strata.trace_path \"");
    T_CONTAINS(strata_last_error(NULL), "cannot create the file: No such file or directory (ENOENT)");

    /* A trace that cannot be written (a full disk): strata_trace_write says so with the path and errno, and says the
     * same again; without it, destroy could only log it. */
    snprintf(c.trace_path, sizeof c.trace_path, "/dev/full");
    T_OK(strata_engine_create(&c, &e));
    T_STATUS(strata_trace_write(e), STRATA_ENOSPC);
    T_CONTAINS(strata_last_error(e), "strata.trace_path \"/dev/full\": writing the trace");
    T_CONTAINS(strata_last_error(e), "No space left on device (ENOSPC); the file is incomplete");
    T_STATUS(strata_trace_write(e), STRATA_ENOSPC);
    strata_engine_destroy(e);
    /* Written once, and OK for a second call and for an engine without a trace. */
    snprintf(c.trace_path, sizeof c.trace_path, "%s/again.json", dir);
    T_OK(strata_engine_create(&c, &e));
    T_OK(strata_trace_write(e));
    T_OK(strata_trace_write(e));
    strata_engine_destroy(e);
    root = json_load_file(c.trace_path, 0, &je);
    T_CHECK(root != NULL, "the trace written by strata_trace_write is not valid JSON: %s", je.text);
    json_decref(root);
    c.trace_path[0] = '\0';
    T_OK(strata_engine_create(&c, &e));
    T_OK(strata_trace_write(e));
    strata_engine_destroy(e);
    return t_done();
}
