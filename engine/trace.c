#include "engine/trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/stream.h"
#include "base/util.h"

typedef struct trace_rec {
    uint64_t t0, t1;
    uint8_t track;
    char name[48];
} trace_rec;

struct trace {
    FILE *f;
    char path[STRATA_PATH_BYTES];
    uint64_t origin_ns;
    pthread_mutex_t lock;
    trace_rec *recs;
    size_t n, cap;
    bool written;           /* trace_write ran: later events are dropped, the file is closed */
    strata_status status;   /* what trace_write returned, for a second call */
    char error[ERR_MSG_BYTES];
};

static const char *const track_names[TRACK_COUNT] = {"trainer", "h2d stream", "d2h stream", "optimizer (CPU Adam)",
                                                     "nvme (optimizer I/O)", "parameter update stream",
                                                     "device Adam (offload_optimizer.ratio)",
                                                     "activations (offload, restore)"};

strata_status trace_create(const char *path, trace **out)
{
    *out = NULL;
    trace *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(STRATA_ENOMEM, "trace: out of memory");
    t->f = fopen(path, "w");
    if (!t->f) {
        char why[96];
        int e = errno;
        free(t);
        return err_set(STRATA_EIO, "strata.trace_path \"%s\": cannot create the file: %s", path,
                       err_errno_str(e, why, sizeof why));
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    t->origin_ns = now_ns();
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return STRATA_OK;
}

void trace_event(trace *t, trace_track track, const char *name, const char *detail, uint64_t t0_ns, uint64_t t1_ns)
{
    if (!t)
        return;
    trace_rec r = {.t0 = t0_ns, .t1 = t1_ns, .track = (uint8_t)track};
    snprintf(r.name, sizeof r.name, "%s%s%s", name, detail ? " " : "", detail ? detail : "");
    pthread_mutex_lock(&t->lock);
    if (t->written) { /* the file is closed: what comes after it (a checkpoint's gather, teardown) is not in it */
        pthread_mutex_unlock(&t->lock);
        return;
    }
    if (t->n == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 4096;
        trace_rec *nr = realloc(t->recs, ncap * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&t->lock);
            LOG_ONCE(STRATA_LOG_WARN, LOG_CORE, "trace: out of memory; later events are dropped");
            return;
        }
        t->recs = nr;
        t->cap = ncap;
    }
    t->recs[t->n++] = r;
    pthread_mutex_unlock(&t->lock);
}

/* Names come from the trainer (module names): escape them for JSON. */
static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* Writes the JSON to t->f and closes it; STRATA_OK, or the error (a full disk, an I/O error) naming the file. */
static strata_status write_file(trace *t)
{
    FILE *f = t->f;
    t->f = NULL;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    for (int k = 0; k < TRACK_COUNT; k++) {
        fprintf(f, "{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", k);
        put_json_string(f, track_names[k]);
        fprintf(f, "}},\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}},\n",
                k, k);
    }
    fprintf(f, "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"strata\"}}");
    for (size_t i = 0; i < t->n && !ferror(f); i++) {
        const trace_rec *r = &t->recs[i];
        uint64_t t0 = r->t0 > t->origin_ns ? r->t0 - t->origin_ns : 0;
        uint64_t dur = r->t1 > r->t0 ? r->t1 - r->t0 : 0;
        fprintf(f, ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"name\":", r->track, t0 / 1e3,
                dur / 1e3);
        put_json_string(f, r->name);
        fputc('}', f);
    }
    fprintf(f, "\n]}\n");
    int e = stream_close_errno(f);
    if (e == 0)
        return STRATA_OK;
    char why[96];
    return err_set(err_from_errno(e), "strata.trace_path \"%s\": writing the trace (%zu events) failed: %s; the file is "
                   "incomplete", t->path, t->n, err_errno_str(e, why, sizeof why));
}

strata_status trace_write(trace *t)
{
    if (!t)
        return STRATA_OK;
    pthread_mutex_lock(&t->lock);
    if (!t->written) {
        t->written = true;
        t->status = write_file(t);
        snprintf(t->error, sizeof t->error, "%s", t->status == STRATA_OK ? "" : err_last());
        if (t->status == STRATA_OK)
            LOG_INFO(LOG_CORE, "trace written to %s (%zu events); open it at https://ui.perfetto.dev", t->path, t->n);
    }
    strata_status st = t->status;
    pthread_mutex_unlock(&t->lock);
    return st == STRATA_OK ? STRATA_OK : err_set(st, "%s", t->error);
}

void trace_finish(trace *t)
{
    if (!t)
        return;
    /* Nobody can be told of a failure now but the log. */
    if (!t->written && trace_write(t) != STRATA_OK)
        LOG_WARN(LOG_CORE, "%s", err_last());
    pthread_mutex_destroy(&t->lock);
    free(t->recs);
    free(t);
}
