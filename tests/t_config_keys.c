/*
 * Every key the configuration accepts changes what strata does (STYLE rule 13: a key the table accepts
 * changes something a test can observe, or it is rejected as not implemented).
 *
 * For each key of the schema that sets a field, a probe loads two configs from JSON, one with the key at
 * its default and one with it changed (both over the same context: what the key needs in order to matter,
 * such as the optimizer state on NVMe for pipeline_read), runs the smallest thing that shows the effect and
 * compares what came out: a finalized engine (status, memory, loss scale), a short training run (weights,
 * traffic, loss scale), its trace, the files and io_uring rings it holds open, the NVMe layer on a FIFO, a
 * log line. Observing the parsed value itself would prove nothing, so no observer looks at the config.
 * Both observations are printed. The test fails for a key without a probe (so an inert key cannot be added
 * silently), for a probe of a key the schema no longer has, and for a probe that sees no difference.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "cpu_adam/driver.h"
#include "engine/config/config_schema.h"
#include "gpu/device.h"
#include "synth.h"
#include "testlib.h"

#define OBS_BYTES 2048
#define SEED 1 /* fixed: two runs of one config must agree, so a difference is the key's */

static char dir1[256], dir2[272]; /* scratch directories, "$DIR" and "$DIR2" in the table */

/* ---------------------------------------------------------------- small helpers */

static void appendf(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char *out, size_t len, const char *fmt, ...)
{
    size_t used = strlen(out);
    if (used >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, len - used, fmt, ap);
    va_end(ap);
}

/* Replaces every "$DIR2" and "$DIR" of text by the scratch directories (at most len bytes). */
static void expand(const char *text, char *out, size_t len)
{
    out[0] = '\0';
    for (const char *p = text; *p;) {
        if (strncmp(p, "$DIR2", 5) == 0) {
            appendf(out, len, "%s", dir2);
            p += 5;
        } else if (strncmp(p, "$DIR", 4) == 0) {
            appendf(out, len, "%s", dir1);
            p += 4;
        } else {
            appendf(out, len, "%c", *p++);
        }
    }
}

/* Log messages while a capture runs. */
static char captured[4096];
static void capture(strata_log_level level, const char *subsystem, const char *message, void *user)
{
    (void)level, (void)user;
    appendf(captured, sizeof captured, "[%s] %s\n", subsystem, message);
}

/* Captures log messages up to level (and every subsystem); log_restore puts the filter back. */
static int saved_level;
static unsigned saved_mask;
static void log_capture(strata_log_level level)
{
    captured[0] = '\0';
    saved_level = atomic_load(&log_level_now);
    saved_mask = atomic_load(&log_subsys_mask);
    strata_log_set_level(level);
    atomic_store(&log_subsys_mask, ~0u);
    strata_log_set_callback(capture, NULL);
}

static void log_restore(void)
{
    strata_log_set_callback(NULL, NULL);
    atomic_store(&log_level_now, saved_level);
    atomic_store(&log_subsys_mask, saved_mask);
}

static uint32_t fnv1a(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

/* ---------------------------------------------------------------- observers: what strata does with a config */

typedef void (*observe_fn)(const strata_config *cfg, char *out, size_t len);

/* Engine creation alone: the config's checks and the backend choice. */
static void obs_create(const strata_config *cfg, char *out, size_t len)
{
    strata_engine *e = NULL;
    strata_status st = strata_engine_create(cfg, &e);
    if (st == STRATA_OK)
        appendf(out, len, "created on the %s backend", strata_engine_backend(e) == STRATA_BACKEND_HOST ? "host" : "cuda");
    else
        appendf(out, len, "create: %s: %s", strata_status_name(st), strata_last_error(NULL));
    strata_engine_destroy(e);
}

/* The synthetic model's engine, finalized with cfg; NULL when it failed, with the failure written to out. */
static strata_engine *finalized(const strata_config *cfg, char *out, size_t len)
{
    synth_opts o;
    synth_defaults(&o, SEED);
    strata_engine *e = NULL;
    strata_status st = synth_engine(&o, cfg, &e);
    if (st != STRATA_OK)
        appendf(out, len, "finalize: %s: %s", strata_status_name(st), strata_last_error(NULL));
    return e;
}

/* A finalized engine of the synthetic model: the plan it took (memory per tier) and its loss scale. */
static void obs_finalize(const strata_config *cfg, char *out, size_t len)
{
    strata_engine *e = finalized(cfg, out, len);
    if (!e)
        return;
    strata_stats s;
    T_OK(strata_stats_get(e, &s));
    appendf(out, len, "device %zu bytes, host plan %zu bytes, nvme %zu bytes, loss scale %g", s.device_peak_bytes,
            s.host_peak_bytes, s.nvme_peak_bytes, strata_loss_scale(e));
    strata_engine_destroy(e);
}

static void train_summary(const synth_opts *o, const strata_config *cfg, char *out, size_t len)
{
    float *w = NULL;
    size_t n = 0;
    double losses[16], scale = 0;
    strata_stats s;
    synth_opts run = *o;
    run.final_loss_scale = &scale;
    strata_status st = synth_train(&run, cfg, &w, &n, losses, &s);
    if (st != STRATA_OK) {
        appendf(out, len, "train: %s: %s", strata_status_name(st), strata_last_error(NULL));
        return;
    }
    appendf(out, len,
            "weights %08x, last loss %.9g, loss scale %g; %llu steps, %llu skipped; fetches %llu (%llu hits); "
            "bytes nvme->host %llu, host->device %llu, device->host %llu, host->nvme %llu",
            fnv1a(w, n * sizeof *w), losses[o->steps - 1], scale, (unsigned long long)s.steps,
            (unsigned long long)s.skipped_steps, (unsigned long long)s.fetches, (unsigned long long)s.prefetch_hits,
            (unsigned long long)s.nvme_to_host_bytes, (unsigned long long)s.host_to_device_bytes,
            (unsigned long long)s.device_to_host_bytes, (unsigned long long)s.host_to_nvme_bytes);
    free(w);
}

/* A short training run: the weights it ends with, its traffic and its loss scale (timings left out). */
static void obs_train(const strata_config *cfg, char *out, size_t len)
{
    synth_opts o;
    synth_defaults(&o, SEED);
    train_summary(&o, cfg, out, len);
}

/* As obs_train with one micro-batch per step (gradient accumulation 1, which step in backward needs). */
static void obs_train_one_micro_batch(const strata_config *cfg, char *out, size_t len)
{
    synth_opts o;
    synth_defaults(&o, SEED);
    o.micro_batches = 1;
    train_summary(&o, cfg, out, len);
}

/* One step with a trace: how the optimizer went through the sub-groups (emission order and timestamps). */
static void obs_trace(const strata_config *cfg, char *out, size_t len)
{
    strata_config c = *cfg;
    snprintf(c.trace_path, sizeof c.trace_path, "%s/obs-trace.json", dir1);
    unlink(c.trace_path);
    synth_opts o;
    synth_defaults(&o, SEED);
    o.steps = 1;
    char run[OBS_BYTES] = "";
    train_summary(&o, &c, run, sizeof run);
    if (strncmp(run, "train: ", 7) == 0) {
        appendf(out, len, "%s", run);
        return;
    }
    json_error_t je;
    json_t *root = json_load_file(c.trace_path, 0, &je);
    if (!root) {
        appendf(out, len, "no trace: %s", je.text);
        return;
    }
    /* The optimizer's events in the order the engine recorded them (sub-groups ascend in a first step). */
    double adam_end[64], read_ts[64];
    int nadam = 0, nread = 0, writes_before_last_adam = 0, pending_writes = 0;
    char threads[256] = "";
    size_t i;
    json_t *ev;
    json_array_foreach(json_object_get(root, "traceEvents"), i, ev) {
        const char *name = json_string_value(json_object_get(ev, "name"));
        double ts = json_number_value(json_object_get(ev, "ts")), dur = json_number_value(json_object_get(ev, "dur"));
        if (!name)
            continue;
        if (strncmp(name, "adam ", 5) == 0 && nadam < 64) {
            adam_end[nadam++] = ts + dur;
            writes_before_last_adam += pending_writes;
            pending_writes = 0;
            const char *t = strstr(name, ", ");
            if (t && !strstr(threads, t + 2))
                appendf(threads, sizeof threads, "%s%s", threads[0] ? "/" : "", t + 2);
        } else if (strncmp(name, "read master", 11) == 0 && nread < 64) {
            read_ts[nread++] = ts;
        } else if (strncmp(name, "write master", 12) == 0) {
            pending_writes++;
        }
    }
    json_decref(root);
    /* pipeline_read: the read of sub-group k+1 is issued before Adam on k ends. */
    int reads_ahead = 0;
    for (int k = 0; k + 1 < nread && k < nadam; k++)
        reads_ahead += read_ts[k + 1] < adam_end[k];
    appendf(out, len, "%d sub-groups (Adam on %s); %d of %d reads issued before Adam on the previous sub-group ended; "
            "%d write-backs waited for between sub-groups", nadam, threads[0] ? threads : "?", reads_ahead,
            nread > 0 ? nread - 1 : 0, writes_before_last_adam);
}

/* Whether a training run wrote a trace where the changed value puts it. */
static void obs_trace_file(const strata_config *cfg, char *out, size_t len)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/trace-probe.json", dir1);
    unlink(path);
    synth_opts o;
    synth_defaults(&o, SEED);
    o.steps = 1;
    char run[OBS_BYTES] = "";
    train_summary(&o, cfg, run, sizeof run);
    if (strncmp(run, "train: ", 7) == 0) {
        appendf(out, len, "%s", run);
        return;
    }
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root)
        appendf(out, len, "a trace of %zu events at $DIR/trace-probe.json",
                json_array_size(json_object_get(root, "traceEvents")));
    else
        appendf(out, len, "no trace at $DIR/trace-probe.json");
    json_decref(root);
}

/* A value from a /proc/self/fdinfo file ("SqMask:\t0x7"), or -1. */
static long long fdinfo_value(int fd, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    FILE *f = fopen(path, "r");
    long long v = -1;
    size_t klen = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, klen) == 0 && line[klen] == ':')
            v = strtoll(line + klen + 1, NULL, 0);
    if (f)
        fclose(f);
    return v;
}

typedef struct out_buf {
    char *out;
    size_t len;
} out_buf;

/* The engine's swap files are open, unlinked files ("dir/#ino (deleted)" for O_TMPFILE); its rings are
 * io_uring descriptors. Describes each from what the kernel says of it. */
static bool describe_fd(int fd, const char *target, void *ctx)
{
    out_buf *b = ctx;
    const char *slash = strrchr(target, '/');
    if (target[0] == '/' && slash && strstr(target, " (deleted)") && strncmp(target, "/memfd:", 7) != 0) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - target), target);
        struct stat sb;
        fstat(fd, &sb);
        long long flags = fdinfo_value(fd, "flags");
        const char *where = strcmp(dir, dir2) == 0 ? "$DIR2" : strcmp(dir, dir1) == 0 ? "$DIR" : dir;
        appendf(b->out, b->len, "%sswap file in %s: %lld bytes, %s", b->out[0] ? "; " : "", where,
                (long long)sb.st_size, flags >= 0 && (flags & O_DIRECT) ? "O_DIRECT" : "buffered");
    } else if (strcmp(target, "anon_inode:[io_uring]") == 0) {
        appendf(b->out, b->len, "%sio_uring with %lld SQ entries, %s", b->out[0] ? "; " : "",
                fdinfo_value(fd, "SqMask") + 1,
                fdinfo_value(fd, "SqThread") > 0 ? "a kernel polling thread" : "no polling thread");
    }
    return false;
}

/* A finalized engine with state on NVMe: the swap files and io_uring rings it holds open, as the kernel
 * reports them. */
static void obs_files(const strata_config *cfg, char *out, size_t len)
{
    strata_engine *e = finalized(cfg, out, len);
    if (!e)
        return;
    out_buf b = {out, len};
    t_each_open_fd(describe_fd, &b);
    strata_engine_destroy(e);
}

/* Overwrites the first 4 KiB of a swap file through a second descriptor of it. */
static bool corrupt_swap_file(int fd, const char *target, void *ctx)
{
    int *done = ctx;
    if (target[0] != '/' || !strstr(target, " (deleted)") || strncmp(target, dir1, strlen(dir1)) != 0)
        return false;
    char path[64], junk[4096];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int w = open(path, O_WRONLY);
    memset(junk, 0x5a, sizeof junk);
    *done += w >= 0 && pwrite(w, junk, sizeof junk, 0) == (ssize_t)sizeof junk && fsync(w) == 0;
    if (w >= 0)
        close(w);
    return false;
}

/* A finalized engine with the optimizer state on NVMe whose swap file is overwritten behind its back: does
 * reading the master weights back notice? (The master weights are the first state in the swap space.) */
static void obs_corrupt(const strata_config *cfg, char *out, size_t len)
{
    strata_engine *e = finalized(cfg, out, len);
    if (!e)
        return;
    int corrupted = 0;
    t_each_open_fd(corrupt_swap_file, &corrupted);
    float w[16];
    strata_status st = strata_param_read_master(e, 0, 0, 16, w);
    appendf(out, len, "%d swap file(s) overwritten; reading the master weights back: %s", corrupted,
            strata_status_name(st));
    strata_engine_destroy(e);
}

/* The NVMe layer with the config's aio block: a 64 KiB write, and how the ring submitted its pieces
 * (the ring's debug line when it goes). */
static void obs_aio_batches(const strata_config *cfg, char *out, size_t len)
{
    strata_aio *aio = NULL;
    strata_aio_file *f = NULL;
    void *buf = NULL;
    char path[1100];
    snprintf(path, sizeof path, "%s/aio-batches", dir1);
    log_capture(STRATA_LOG_DEBUG);
    T_OK(strata_aio_create(&cfg->aio, &aio));
    T_OK(strata_aio_open(aio, path, STRATA_AIO_WRITE | STRATA_AIO_TRUNCATE, &f));
    T_OK(strata_aio_buffer_alloc(aio, 64 << 10, &buf));
    T_OK(strata_aio_pwrite(aio, f, buf, 64 << 10, 0));
    strata_aio_buffer_free(aio, buf);
    strata_aio_close(aio, f);
    strata_aio_destroy(aio);
    log_restore();
    const char *line = strstr(captured, "(at most ");
    long most = line ? strtol(line + 9, NULL, 10) : -1;
    if (most < 0)
        appendf(out, len, "no submission summary logged: %s", captured);
    else
        appendf(out, len, "one piece per submission (at most 2 SQEs with the ring's wake-up): %s",
                most <= 2 ? "yes" : "no");
    unlink(path);
}

/* The NVMe layer with the config's aio block: a read from an empty FIFO stays in flight; does a write queued
 * behind it land before the FIFO is fed? (Two seconds is the patience; a write that may start lands in
 * milliseconds.) */
static void obs_aio_overlap(const strata_config *cfg, char *out, size_t len)
{
    char fifo[1100], file[1100];
    snprintf(fifo, sizeof fifo, "%s/aio-fifo", dir1);
    snprintf(file, sizeof file, "%s/aio-overlap", dir1);
    unlink(fifo);
    unlink(file);
    if (mkfifo(fifo, 0600) != 0) {
        appendf(out, len, "mkfifo failed: %s", strerror(errno));
        return;
    }
    strata_aio *aio = NULL;
    strata_aio_file *ff = NULL, *fw = NULL;
    void *rbuf = NULL, *wbuf = NULL;
    T_OK(strata_aio_create(&cfg->aio, &aio));
    T_OK(strata_aio_open(aio, fifo, STRATA_AIO_WRITE, &ff)); /* read-write: opening does not wait for a writer */
    T_OK(strata_aio_open(aio, file, STRATA_AIO_WRITE | STRATA_AIO_TRUNCATE, &fw));
    T_OK(strata_aio_buffer_alloc(aio, 4096, &rbuf));
    T_OK(strata_aio_buffer_alloc(aio, 8192, &wbuf));
    T_OK(strata_aio_read(aio, ff, rbuf, 4096, 0));
    usleep(20000); /* the read is in flight before the write is queued */
    T_OK(strata_aio_write(aio, fw, wbuf, 8192, 0));
    struct stat sb = {0};
    for (int ms = 0; ms < 2000 && !(stat(file, &sb) == 0 && sb.st_size >= 8192); ms += 5)
        usleep(5000);
    bool landed = sb.st_size >= 8192;
    int w = open(fifo, O_WRONLY);
    char feed[4096] = {0};
    T_CHECK(w >= 0 && write(w, feed, sizeof feed) == (ssize_t)sizeof feed, "feeding the FIFO failed");
    if (w >= 0)
        close(w);
    T_OK(strata_aio_wait(aio));
    strata_aio_buffer_free(aio, rbuf);
    strata_aio_buffer_free(aio, wbuf);
    strata_aio_close(aio, ff);
    strata_aio_close(aio, fw);
    strata_aio_destroy(aio);
    appendf(out, len, "a write queued behind a blocked read lands before the read completes: %s",
            landed ? "yes" : "no");
    unlink(fifo);
    unlink(file);
}

/* Nothing beyond loading: for a key whose whole effect is on the loader (its outcome and warnings are part
 * of every observation). */
static void obs_load_only(const strata_config *cfg, char *out, size_t len)
{
    (void)cfg, (void)out, (void)len;
}

/* ---------------------------------------------------------------- changed values decided on this machine */

/* A value for strata.backend that differs from what "auto" picks here. */
static const char *pick_backend(char *why, size_t len)
{
    (void)why, (void)len;
    return dev_probe(STRATA_BACKEND_CUDA, NULL, 0) == STRATA_OK ? "\"host\"" : "\"cuda\"";
}

static const char *pick_device_id(char *why, size_t len)
{
    char detail[256];
    if (dev_probe(STRATA_BACKEND_CUDA, detail, sizeof detail) != STRATA_OK) {
        snprintf(why, len, "device ordinals exist only on the CUDA backend, which cannot run here (%s)", detail);
        return NULL;
    }
    return "1023";
}

/* Keys whose effect needs several ranks, which this program (world 1) does not have: the tests that show it. */
static const char *pick_needs_ranks(char *why, size_t len)
{
    snprintf(why, len, "its effect needs several ranks: tests/mpi_grad_reduction.c (gradient_reduction: the norm and "
             "weights of mean vs sum) and tests/cli_train_rank_agree.sh (comm_timeout_s: a stopped rank fails the "
             "other at the configured deadline) show it under mpirun");
    return NULL;
}

/* A thread count other than the default (the cores this process may use). */
static const char *pick_cpu_threads(char *why, size_t len)
{
    (void)why, (void)len;
    return adam_default_threads() > 1 ? "1" : "2";
}

/* aio.direct: false where the scratch filesystem takes O_DIRECT (auto uses it), else true (auto falls back). */
static const char *pick_direct(char *why, size_t len)
{
    (void)why, (void)len;
    char path[1100];
    snprintf(path, sizeof path, "%s/direct-probe", dir1);
    int fd = open(path, O_CREAT | O_RDWR | O_DIRECT, 0600);
    if (fd >= 0)
        close(fd);
    unlink(path);
    return fd >= 0 ? "false" : "true";
}

/* ---------------------------------------------------------------- the probes */

typedef struct probe {
    const char *path;                               /* the key */
    const char *value;                              /* its changed value as JSON */
    const char *context;                            /* JSON both configs load: what the key needs to matter */
    observe_fn observe;
    const char *(*pick)(char *why, size_t len);     /* decides the value on this machine; NULL + why: skip */
} probe;

#define ZO "zero_optimization"
#define OPT_ON_NVME "{\"" ZO "\": {\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$DIR\"}}"
#define PARAM_ON_HOST_NO_PERSISTENCE                                                                       \
    "{\"" ZO "\": {\"offload_param\": {\"device\": \"cpu\"}, \"stage3_param_persistence_threshold\": 0}}"
#define FP16 "{\"fp16\": {\"enabled\": true"
/* Parameters and optimizer state on NVMe (with what the host budget leaves mirroring them), and the same with the
 * host cache off: what the drive holds is what is read. */
#define BOTH_ON_NVME                                                                                     \
    "{\"" ZO "\": {\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$DIR\"}, \"offload_optimizer\": " \
    "{\"device\": \"nvme\", \"nvme_path\": \"$DIR\"}}}"
#define OPT_ON_NVME_UNCACHED OPT_ON_NVME ", \"strata\": {\"host_cache\": false}}"

static const probe probes[] = {
    {ZO ".stage", "2", "{\"" ZO "\": {\"offload_param\": {\"device\": \"cpu\"}}}", obs_create, NULL},
    {ZO ".offload_param.device", "\"cpu\"", NULL, obs_finalize, NULL},
    {ZO ".offload_param.nvme_path", "\"$DIR2\"",
     "{\"" ZO "\": {\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$DIR\"}}}", obs_files, NULL},
    {ZO ".offload_optimizer.device", "\"cpu\"", NULL, obs_finalize, NULL},
    {ZO ".offload_optimizer.nvme_path", "\"$DIR2\"", OPT_ON_NVME "}", obs_files, NULL},
    {ZO ".offload_optimizer.pipeline_read", "false",
     "{\"" ZO "\": {\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$DIR\"}, \"sub_group_size\": 4096}}",
     obs_trace, NULL},
    {ZO ".offload_optimizer.pipeline_write", "false",
     "{\"" ZO "\": {\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$DIR\"}, \"sub_group_size\": 4096}}",
     obs_trace, NULL},
    /* Half the sub-groups' state moves to the device (bit-identical weights: t_engine_twin_flow proves that). */
    {ZO ".offload_optimizer.ratio", "0.5",
     "{\"" ZO "\": {\"offload_optimizer\": {\"device\": \"cpu\"}, \"sub_group_size\": 4096}}", obs_finalize, NULL},
    {ZO ".sub_group_size", "4096", NULL, obs_trace, NULL},
    {ZO ".stage3_prefetch_bucket_size", "0", PARAM_ON_HOST_NO_PERSISTENCE, obs_train, NULL},
    {ZO ".stage3_max_live_parameters", "8192", PARAM_ON_HOST_NO_PERSISTENCE, obs_train, NULL},
    {ZO ".stage3_param_persistence_threshold", "0",
     "{\"" ZO "\": {\"offload_param\": {\"device\": \"cpu\"}}, \"strata\": {\"prefetch_bytes\": 1}}", obs_train, NULL},

    {"aio.block_size", "4096", OPT_ON_NVME "}", obs_files, NULL},
    {"aio.queue_depth", "2", OPT_ON_NVME "}", obs_files, NULL},
    {"aio.intra_op_parallelism", "2", OPT_ON_NVME "}", obs_files, NULL},
    {"aio.single_submit", "true", "{\"aio\": {\"block_size\": 4096}}", obs_aio_batches, NULL},
    {"aio.overlap_events", "false", "{\"strata\": {\"aio\": {\"direct\": false}}}", obs_aio_overlap, NULL},

    {"optimizer.type", "\"AdamW\"", "{\"optimizer\": {\"params\": {\"adam_w_mode\": false}}}", obs_train, NULL},
    {"optimizer.params.lr", "0.1", NULL, obs_train, NULL},
    {"optimizer.params.betas", "[0.5, 0.9]", NULL, obs_train, NULL},
    {"optimizer.params.eps", "0.01", NULL, obs_train, NULL},
    {"optimizer.params.weight_decay", "0.5", NULL, obs_train, NULL},
    {"optimizer.params.bias_correction", "false", NULL, obs_train, NULL},
    {"optimizer.params.adam_w_mode", "false", NULL, obs_train, NULL},
    /* torch >= 2.0's first moment rounds differently: other weights after a few steps (t_adam_formula: which). */
    {"strata.adam_first_moment", "\"lerp\"", NULL, obs_train, NULL},

    {"bf16.enabled", "true", NULL, obs_finalize, NULL},
    {"fp16.enabled", "true", NULL, obs_finalize, NULL},
    {"fp16.loss_scale", "128", FP16 "}}", obs_finalize, NULL},
    {"fp16.initial_scale_power", "8", FP16 "}}", obs_finalize, NULL},
    /* A small scale never overflows: with a window of 1 it doubles every step. */
    {"fp16.loss_scale_window", "1", FP16 ", \"initial_scale_power\": 4}}", obs_train, NULL},
    /* 2^40 overflows every step: the scale halves every hysteresis-th step, never below min_loss_scale. */
    {"fp16.hysteresis", "1", FP16 ", \"initial_scale_power\": 40}}", obs_train, NULL},
    {"fp16.min_loss_scale", "549755813888", FP16 ", \"initial_scale_power\": 40, \"hysteresis\": 1}}", obs_train,
     NULL},
    {"gradient_clipping", "0.001", NULL, obs_train, NULL},

    {"strata.backend", NULL, "{\"strata\": {\"backend\": \"auto\"}}", obs_create, pick_backend},
    {"strata.device_id", NULL, "{\"strata\": {\"backend\": \"cuda\"}}", obs_create, pick_device_id},
    {"strata.device_budget_bytes", "\"64KiB\"", NULL, obs_finalize, NULL},
    {"strata.host_budget_bytes", "\"64KiB\"", NULL, obs_finalize, NULL},
    {"strata.prefetch_bytes", "1", PARAM_ON_HOST_NO_PERSISTENCE, obs_train, NULL},
    {"strata.max_live_bytes", "32768", PARAM_ON_HOST_NO_PERSISTENCE, obs_train, NULL},
    {"strata.activation_bytes", "\"2GiB\"", NULL, obs_finalize, NULL},
    {"strata.cpu_threads", NULL, NULL, obs_trace, pick_cpu_threads},
    {"strata.delayed_update", "true", NULL, obs_finalize, NULL},
    {"strata.delayed_warmup_steps", "0", "{\"strata\": {\"delayed_update\": true}}", obs_train, NULL},
    {"strata.trace_path", "\"$DIR/trace-probe.json\"", NULL, obs_trace_file, NULL},
    {"strata.swap_checksum", "false", OPT_ON_NVME_UNCACHED, obs_corrupt, NULL},
    {"strata.host_cache", "false", BOTH_ON_NVME, obs_train, NULL},
    {ZO ".offload_param.max_in_cpu", "0", BOTH_ON_NVME, obs_train, NULL},
    {"strata.gradients_on_nvme", "true", OPT_ON_NVME "}", obs_finalize, NULL},
    /* The same weights, without the gradient store's NVMe writes (t_engine_step_in_backward proves both). */
    {"strata.step_in_backward", "true", OPT_ON_NVME ", \"strata\": {\"host_cache\": false, \"gradients_on_nvme\": true}}",
     obs_train_one_micro_batch, NULL},
    /* Clipping decided by a first backward: nothing redone, no second copy nor kept gradients on NVMe (the same
     * weights: t_engine_step_in_backward). */
    {"strata.norm_pass", "true",
     OPT_ON_NVME ", \"gradient_clipping\": 0.001, \"strata\": {\"host_cache\": false, \"step_in_backward\": true}}",
     obs_train_one_micro_batch, NULL},
    /* Offloaded activations: what the plan holds for them (strata_act_push itself: t_engine_act). */
    {"strata.offload_activations.device", "\"cpu\"", "{\"strata\": {\"offload_activations\": {\"bytes\": \"1MiB\"}}}",
     obs_finalize, NULL},
    {"strata.offload_activations.bytes", "\"2MiB\"",
     "{\"strata\": {\"offload_activations\": {\"device\": \"cpu\", \"bytes\": \"1MiB\"}}}", obs_finalize, NULL},
    {"strata.offload_activations.max_bytes", "\"64KiB\"",
     "{\"" ZO "\": {\"offload_optimizer\": {\"nvme_path\": \"$DIR\"}}, \"strata\": {\"offload_activations\": "
     "{\"device\": \"nvme\", \"bytes\": \"1MiB\"}}}", obs_finalize, NULL},
    {"strata.comm_timeout_s", NULL, NULL, obs_create, pick_needs_ranks},
    {"strata.gradient_reduction", NULL, NULL, obs_train, pick_needs_ranks},
    /* The weights of training (t_engine_moments proves every placement and the resume). */
    {"strata.optimizer_moments", "\"8bit\"", NULL, obs_train, NULL},
    {"strata.optimizer_moments_seed", "7", "{\"strata\": {\"optimizer_moments\": \"bf16\"}}", obs_train, NULL},
    {"strata.ignore_unimplemented", "true", "{\"train_batch_size\": 8}", obs_load_only, NULL},
    {"strata.aio.direct", NULL, OPT_ON_NVME "}", obs_files, pick_direct},
    {"strata.aio.sqpoll", "true", OPT_ON_NVME "}", obs_files, NULL},
};

/* Sets the dotted path of doc to value, making the sections on the way. */
static void json_set_path(json_t *doc, const char *path, json_t *value)
{
    char key[256];
    snprintf(key, sizeof key, "%s", path);
    json_t *obj = doc;
    char *save = NULL;
    for (char *seg = strtok_r(key, ".", &save); seg; seg = strtok_r(NULL, ".", &save)) {
        if (save == NULL || *save == '\0') {
            json_object_set_new(obj, seg, value);
            return;
        }
        json_t *next = json_object_get(obj, seg);
        if (!json_is_object(next)) {
            next = json_object();
            json_object_set_new(obj, seg, next);
        }
        obj = next;
    }
}

/* Loads doc over the tests' base (the host backend, so that the synthetic trainer can read device memory
 * directly) and observes; a config that does not load is observed as its loader's answer. */
static void observe(const probe *p, const json_t *doc, char *out, size_t len)
{
    strata_config cfg;
    strata_config_init(&cfg);
    cfg.backend = STRATA_BACKEND_HOST;
    char *text = json_dumps(doc, JSON_COMPACT);
    char err[2048] = "";
    log_capture(STRATA_LOG_WARN);
    strata_status st = strata_config_load_json_string(&cfg, text, p->path, err, sizeof err);
    log_restore();
    free(text);
    out[0] = '\0';
    if (st != STRATA_OK) {
        appendf(out, len, "load: %s: %s", strata_status_name(st), err);
        return;
    }
    size_t n = strlen(captured);
    if (n && captured[n - 1] == '\n')
        captured[n - 1] = '\0';
    if (captured[0])
        appendf(out, len, "loaded with warnings: %s", captured);
    p->observe(&cfg, out, len);
}

/* Observes the key at its default and changed; true when the two observations differ. */
static bool run_probe(const probe *p)
{
    char why[512] = "", buf[4096];
    const char *value = p->pick ? p->pick(why, sizeof why) : p->value;
    if (!value) {
        printf("%s\n    skipped: %s\n", p->path, why);
        return true;
    }
    expand(p->context ? p->context : "{}", buf, sizeof buf);
    json_error_t je;
    json_t *def = json_loads(buf, 0, &je);
    T_CHECK(def != NULL, "%s: context %s is not JSON: %s", p->path, buf, je.text);
    expand(value, buf, sizeof buf);
    json_t *v = json_loads(buf, JSON_DECODE_ANY, &je);
    T_CHECK(v != NULL, "%s: value %s is not JSON: %s", p->path, buf, je.text);
    if (!def || !v)
        return false;
    json_t *changed = json_deep_copy(def);
    json_set_path(changed, p->path, v);

    static char a[OBS_BYTES], b[OBS_BYTES];
    observe(p, def, a, sizeof a);
    observe(p, changed, b, sizeof b);
    json_decref(def);
    json_decref(changed);
    printf("%s\n    default:       %s\n    changed to %s: %s\n", p->path, a, value, b);
    fflush(stdout);
    return strcmp(a, b) != 0;
}

static const probe *probe_for(const char *path)
{
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
        if (strcmp(probes[i].path, path) == 0)
            return &probes[i];
    return NULL;
}

int main(void)
{
    const char *scratch = t_scratch_dir("t_config_keys");
    if (strlen(scratch) >= sizeof dir1 - 64)
        t_skip("the scratch directory \"%s\" is too long for the swap paths of this test", scratch);
    snprintf(dir1, sizeof dir1, "%s", scratch);
    snprintf(dir2, sizeof dir2, "%s/second", dir1);
    T_CHECK(mkdir(dir2, 0700) == 0, "mkdir %s: %s", dir2, strerror(errno));

    /* Every key that sets a field has a probe ... */
    for (size_t i = 0; i < cfg_key_count; i++)
        if (cfg_key_is_setting(&cfg_keys[i]))
            T_CHECK(probe_for(cfg_keys[i].path) != NULL,
                    "%s is accepted by the config but has no probe here: add one that shows its effect, or refuse "
                    "the key as not implemented (CFG_UNIMPLEMENTED in engine/config/config_schema.c)",
                    cfg_keys[i].path);
    /* ... every probe is of such a key ... */
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        const cfg_key *k = cfg_key_find(probes[i].path);
        T_CHECK(k && cfg_key_is_setting(k), "the probe of %s names no key of the config that sets a field",
                probes[i].path);
    }
    /* ... and every probe sees its key change something. */
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
        T_CHECK(run_probe(&probes[i]),
                "%s: changing it changed nothing observed (both observations are above); the key is inert",
                probes[i].path);
    return t_done();
}
