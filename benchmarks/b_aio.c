/*
 * b_aio: one timed pass of the public strata_aio handle, the way DeepSpeed's aio_handle.sync_pwrite/sync_pread
 * is used: the whole file in one request from one registered buffer, which the handle cuts into block-size
 * pieces with queue-depth of them in flight on one ring (one I/O thread). benchmarks/io_peers.sh runs it
 * beside fio and DeepSpeed.
 *
 * A write fills the buffer with a pattern (before the clock starts) and writes it over the file as it is: the
 * script decides whether the file exists, and how. A read reads the file into the buffer and, after the clock
 * stops, checks the pattern a write of the same size left there (--verify), so a read of the wrong bytes fails.
 *
 *   b_aio --file PATH --op write|read --size SIZE [--block SIZE] [--qd N] [--direct on|off|auto]
 *         [--sqpoll on|off] [--single-submit on|off] [--verify]
 * Prints one JSON line: {"op":...,"bytes":...,"seconds":...,"gbps":...,"direct":...,"verified":...,"wrong_blocks":...}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/size.h"
#include "base/util.h"
#include "strata.h"

typedef struct options {
    const char *file;
    bool write, verify;
    size_t size;
    strata_aio_config cfg;
} options;

static bool parse_switch(const char *v, strata_switch *out)
{
    if (strcmp(v, "on") == 0) *out = STRATA_SWITCH_ON;
    else if (strcmp(v, "off") == 0) *out = STRATA_SWITCH_OFF;
    else if (strcmp(v, "auto") == 0) *out = STRATA_SWITCH_AUTO;
    else return false;
    return true;
}

static bool parse(int argc, char **argv, options *o)
{
    strata_aio_config_init(&o->cfg);
    bool op_given = false;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (strcmp(k, "--verify") == 0) { o->verify = true; continue; }
        if (i + 1 >= argc) return false;
        const char *v = argv[++i];
        bool ok = true;
        if (strcmp(k, "--file") == 0) o->file = v;
        else if (strcmp(k, "--op") == 0) { o->write = strcmp(v, "write") == 0; op_given = o->write || !strcmp(v, "read"); }
        else if (strcmp(k, "--size") == 0) ok = size_parse(v, &o->size);
        else if (strcmp(k, "--block") == 0) ok = size_parse(v, &o->cfg.block_size);
        else if (strcmp(k, "--qd") == 0) o->cfg.queue_depth = atoi(v);
        else if (strcmp(k, "--direct") == 0) ok = parse_switch(v, &o->cfg.direct);
        else if (strcmp(k, "--sqpoll") == 0) ok = parse_switch(v, &o->cfg.sqpoll);
        else if (strcmp(k, "--single-submit") == 0) { o->cfg.single_submit = strcmp(v, "on") == 0; ok = o->cfg.single_submit || !strcmp(v, "off"); }
        else ok = false;
        if (!ok) return false;
    }
    return o->file && op_given && o->size > 0;
}

/* One 64-bit word per 4 KiB depends on its offset: enough to catch a read of the wrong block or of nothing. */
static void stamp(uint64_t *w, size_t size)
{
    for (size_t at = 0; at < size / 8; at += 512)
        w[at] = 0x9e3779b97f4a7c15ull * (at + 1);
}

static size_t count_wrong(const uint64_t *w, size_t size)
{
    size_t wrong = 0;
    for (size_t at = 0; at < size / 8; at += 512)
        wrong += w[at] != 0x9e3779b97f4a7c15ull * (at + 1);
    return wrong;
}

static int fail(strata_aio *aio, const char *what)
{
    fprintf(stderr, "b_aio: %s: %s\n", what, strata_aio_last_error(aio));
    strata_aio_destroy(aio);
    return 1;
}

/* The timed pass on a handle made for it: its buffer, its file, the request and the wait; prints the JSON line. */
static int timed_pass(strata_aio *aio, const options *o)
{
    void *buf = NULL;
    strata_aio_file *f = NULL;
    if (strata_aio_buffer_alloc(aio, o->size, &buf) != STRATA_OK)
        return fail(aio, "strata_aio_buffer_alloc");
    if (strata_aio_open(aio, o->file, o->write ? STRATA_AIO_WRITE : STRATA_AIO_READ, &f) != STRATA_OK)
        return fail(aio, o->file);
    if (o->write)
        stamp(buf, o->size);
    else
        memset(buf, 0, o->size); /* touch every page before the clock starts, as the write's pattern does */
    uint64_t t0 = now_ns();
    strata_status st = o->write ? strata_aio_write(aio, f, buf, o->size, 0) : strata_aio_read(aio, f, buf, o->size, 0);
    if (st == STRATA_OK)
        st = strata_aio_wait(aio);
    double seconds = (double)(now_ns() - t0) * 1e-9;
    if (st != STRATA_OK)
        return fail(aio, o->write ? "write" : "read");
    bool verified = !o->write && o->verify;
    size_t wrong = verified ? count_wrong(buf, o->size) : 0;
    printf("{\"op\":\"%s\",\"bytes\":%zu,\"seconds\":%.6f,\"gbps\":%.4f,\"direct\":%s,\"verified\":%s,"
           "\"wrong_blocks\":%zu}\n", o->write ? "write" : "read", o->size, seconds, (double)o->size / seconds * 1e-9,
           strata_aio_file_is_direct(f) ? "true" : "false", verified ? "true" : "false", wrong);
    strata_aio_destroy(aio);
    return wrong ? 1 : 0;
}

int main(int argc, char **argv)
{
    options o = {0};
    if (!parse(argc, argv, &o)) {
        fprintf(stderr, "usage: b_aio --file PATH --op write|read --size SIZE [--block SIZE] [--qd N] "
                        "[--direct on|off|auto] [--sqpoll on|off] [--single-submit on|off] [--verify]\n");
        return 2;
    }
    strata_aio *aio = NULL;
    if (strata_aio_create(&o.cfg, &aio) != STRATA_OK)
        return fail(NULL, "strata_aio_create");
    return timed_pass(aio, &o);
}
