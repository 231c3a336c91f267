/*
 * `strata bench step`: the optimizer step with its state on NVMe. In one process, interleaved
 * rep by rep, it times
 *   T_adam  Adam alone, over the same sub-groups, on arrays in RAM;
 *   T_io    the same NVMe traffic alone (read master, m, v and gradients; write master, m, v), no compute,
 *           the faster of two peers: the engine's pipeline with as many slots as the engine has, and one
 *           sequential stream (every array read, then written, start to end, as fio would);
 *   T_step  the engine's strata_step and the strata_sync that settles its write-backs (the step leaves the last
 *           slots' writes in flight; the peers' times include every write), where the two overlap;
 * and reports the overlap efficiency max(T_adam, T_io) / T_step (1.0 = perfect hiding; above 1 up to noise
 * would mean the peer is not the best I/O alone). The disk's speed swings between time windows longer than
 * a rep, so the figure is the median of the per-rep ratios (each rep's timings are adjacent in time), not a
 * ratio of medians. The engine's master weights are checked against the in-RAM Adam on a sample after every
 * rep (#wrong).
 *
 * The engine runs with the host cache off (strata.host_cache = false): with it, the default, the step reads its
 * state from RAM while the peers read the drive, and the ratio measured nothing (1.44-1.87). Every rep checks
 * that the step read and wrote exactly the peers' bytes on NVMe with no host-cache hit, and fails otherwise.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/big_alloc.h"
#include "base/size.h"
#include "base/util.h"
#include "cpu_adam/adam.h"
#include "cpu_adam/driver.h"
#include "engine/engine.h"
#include "engine/step/step.h"
#include "nvme/io.h"
#include "nvme/swap.h"
#include "strata.h"
#include "tools/cli.h"
#include "tools/machine_line.h"
#include "tools/options.h"

#define MODULE_NUMEL ((size_t)16 << 20)
#define GRAD_VALUE 1e-3f

/* The pipelined peer uses the engine's own optimizer slot count (engine/step/step.h): with three against the engine's
 * four it waited for writes the engine no longer waits for, and the overlap read 1.13 and 1.16. */
#define PEER_SLOTS STEP_SLOTS

typedef struct step_opts {
    size_t numel, sub_group;
    int threads, reps;
    const char *path;
    const char *trace;
    strata_aio_config aio;
    bool checksum; /* strata.swap_checksum, the engine's default, for the engine and the peers alike */
    bool json;
} step_opts;

#define OPT(...) CLI_OPTION(step_opts, __VA_ARGS__)
static const cli_opt step_opt_table[] = {
    OPT("--path", CLI_TEXT, path, 0, 0, "DIR", "a directory on the drive to measure (required)"),
    {.name = "--numel", .kind = CLI_SIZE, .offset = offsetof(step_opts, numel), .lo = 4096, .meta = "N",
     .help = "fp32 elements of the state, at least 4096 (default 64M)", .hint = "elements, written like a size: 64M = 64 x 2^20"},
    {.name = "--sub-group", .kind = CLI_SIZE, .offset = offsetof(step_opts, sub_group), .lo = 4096, .meta = "N",
     .help = "elements per optimizer sub-group, at least 4096 (default 16M)", .hint = "elements, written like a size: 16M"},
    OPT("--threads", CLI_INT, threads, 0, 1024, "T", "Adam threads, {} (default 0: the cores of this process)"),
    OPT("--reps", CLI_INT, reps, 1, 100, "R", "timed reps after one warm-up rep, {} (default 3)"),
    {.name = "--block-size", .kind = CLI_SIZE, .offset = offsetof(step_opts, aio.block_size), .lo = 4096,
     .align = 4096, .meta = "SIZE", .help = "aio block, {}, a multiple of 4KiB (default 1MiB)",
     .hint = "write bytes or e.g. 1MiB"},
    OPT("--queue-depth", CLI_INT, aio.queue_depth, 1, 1024, "N", "aio queue depth, {} (default 32)"),
    OPT("--io-threads", CLI_INT, aio.intra_op_parallelism, 1, 64, "N", "I/O threads, {} (default 1)"),
    OPT("--trace", CLI_TEXT, trace, 0, 0, "FILE", "Chrome trace-event JSON of the engine's steps"),
    OPT("--json", CLI_SWITCH, json, 0, 0, NULL, "one JSON object of the medians instead of the table"),
};
#undef OPT
static const cli_opt_group step_groups[] = {CLI_GROUP(step_opt_table)};
static const cli_spec step_spec = {
    .command = "bench step", .groups = step_groups, .ngroups = 1,
    .about = "Times Adam alone in RAM, the optimizer's NVMe I/O alone, and the engine's pipelined step over\n"
             "the same state (fp32 master/m/v and gradients on NVMe under DIR, bf16 parameters, the host cache\n"
             "off so that the step reads the drive as the I/O-alone peers do), and prints the overlap efficiency\n"
             "max(T_adam, T_io) / T_step, T_step including the settling of its write-backs."};

static float init_value(size_t i)
{
    return (float)((i * 2654435761u) % 2001) * 1e-4f - 0.1f;
}

static strata_status init_fn(void *ctx, strata_param_id p, size_t off, size_t n, float *out)
{
    size_t base = *(size_t *)ctx;
    (void)p;
    for (size_t i = 0; i < n; i++)
        out[i] = init_value(base + off + i);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- T_adam */

typedef struct ram_state {
    float *master, *m, *v, *grad;
    uint16_t *param;
} ram_state;

static double time_adam(const step_opts *o, const adam_ops *ops, ram_state *r, int64_t step)
{
    strata_config c;
    strata_config_init(&c);
    strata_adam_hparams hp;
    strata_config_adam_hparams(&c, &hp); /* what the engine runs with */
    adam_consts k;
    adam_consts_init(&k, &hp, step, 1.0);
    uint64_t t0 = now_ns();
    for (size_t first = 0; first < o->numel; first += o->sub_group) {
        size_t n = MIN(o->sub_group, o->numel - first);
        adam_job job = {.ops = ops, .consts = k, .numel = n, .threads = o->threads,
                        .arrays = {r->master + first, r->m + first, r->v + first, r->grad + first, r->param + first,
                                   STRATA_DTYPE_FP32, STRATA_DTYPE_BF16}};
        adam_run_step(&job);
    }
    return (now_ns() - t0) / 1e9;
}

/* The per-rep columns; each gets a median. */
enum { COL_ADAM, COL_PIPE, COL_SEQ, COL_IO, COL_STEP, COL_OVERLAP, COLS };

/* ---------------------------------------------------------------- T_io */

/* The I/O-alone peers' swap: master, m, v and gradients, each in its own extent, and PEER_SLOTS slots of
 * four sub-group-sized buffers on huge pages, as the engine's pinned pool is (gpu/backend_host.c): O_DIRECT pins
 * every page of a request, and with 4 KiB pages the peers paid for it where the engine did not (overlap 1.2-1.3 at
 * 4M-8M elements with the cache off). */
typedef struct io_peer {
    nvme_swap *swap;
    swap_extent ext[4];
    float *buf[PEER_SLOTS][4];
    io_wait rd[PEER_SLOTS], wr[PEER_SLOTS];
    bool open; /* peer_open ran: the waits exist */
} io_peer;

static size_t sub_groups(const step_opts *o)
{
    return (o->numel + o->sub_group - 1) / o->sub_group;
}

/* Bytes of sub-group k of one fp32 array. */
static size_t sub_bytes(const step_opts *o, size_t k)
{
    return MIN(o->sub_group, o->numel - k * o->sub_group) * 4;
}

static strata_status drain(io_peer *p, strata_status st)
{
    for (int s = 0; s < PEER_SLOTS; s++) {
        strata_status a = io_wait_wait(&p->rd[s]), b = io_wait_wait(&p->wr[s]);
        if (st == STRATA_OK)
            st = a != STRATA_OK ? a : b;
    }
    return st;
}

/* The engine's pipeline with no compute: the read of sub-group k goes out while k-1 waits for its own read,
 * and k-1 is written back from its slot as soon as it has landed. */
static strata_status time_io_pipelined(const step_opts *o, io_peer *p, double *seconds)
{
    size_t nsub = sub_groups(o);
    strata_status st = STRATA_OK;
    uint64_t t0 = now_ns();
    for (size_t k = 0; k <= nsub && st == STRATA_OK; k++) {
        if (k < nsub) { /* read sub-group k into its slot once the slot's old write is out */
            int s = (int)(k % PEER_SLOTS);
            st = io_wait_wait(&p->wr[s]);
            for (int a = 0; a < 4 && st == STRATA_OK; a++)
                st = swap_read(p->swap, &p->ext[a], k * o->sub_group * 4, p->buf[s][a], sub_bytes(o, k), &p->rd[s]);
        }
        if (k > 0 && st == STRATA_OK) { /* "compute" k-1 takes no time: write it back */
            int s = (int)((k - 1) % PEER_SLOTS);
            st = io_wait_wait(&p->rd[s]);
            for (int a = 0; a < 3 && st == STRATA_OK; a++)
                st = swap_write(p->swap, &p->ext[a], (k - 1) * o->sub_group * 4, p->buf[s][a], sub_bytes(o, k - 1),
                                &p->wr[s]);
        }
    }
    st = drain(p, st);
    *seconds = (now_ns() - t0) / 1e9;
    return st;
}

/* The same bytes as fio would move them: the four arrays read start to end, then master, m and v written
 * start to end, in sub-group-sized requests through all 4 * PEER_SLOTS buffers, each reused once its last
 * request is done. Nothing waits for data, so the drive sees one long read and one long write stream. What
 * it writes back is whatever a buffer last held: these extents are the peer's own, and only time counts. */
static strata_status time_io_sequential(const step_opts *o, io_peer *p, double *seconds)
{
    size_t nsub = sub_groups(o), i = 0;
    strata_status st = STRATA_OK;
    uint64_t t0 = now_ns();
    for (int write = 0; write < 2; write++)
        for (int a = 0; a < (write ? 3 : 4); a++)
            for (size_t k = 0; k < nsub && st == STRATA_OK; k++, i++) {
                int s = (int)(i / 4 % PEER_SLOTS), b = (int)(i % 4);
                io_wait *w = write ? &p->wr[s] : &p->rd[s];
                /* The slot's previous round of four requests must have left its buffers. */
                if (b == 0 && (st = io_wait_wait(&p->rd[s])) == STRATA_OK)
                    st = io_wait_wait(&p->wr[s]);
                if (st == STRATA_OK)
                    st = write ? swap_write(p->swap, &p->ext[a], k * o->sub_group * 4, p->buf[s][b], sub_bytes(o, k), w)
                               : swap_read(p->swap, &p->ext[a], k * o->sub_group * 4, p->buf[s][b], sub_bytes(o, k), w);
            }
    st = drain(p, st);
    *seconds = (now_ns() - t0) / 1e9;
    return st;
}

/* Writes arrays [first, last) of ram into the peers' extents, untimed, through slot 0. */
static strata_status peer_write(const step_opts *o, io_peer *p, const float *const ram[4], int first, int last)
{
    strata_status st = STRATA_OK;
    for (size_t k = 0; k < sub_groups(o) && st == STRATA_OK; k++) {
        for (int a = first; a < last && st == STRATA_OK; a++) {
            memcpy(p->buf[0][a], ram[a] + k * o->sub_group, sub_bytes(o, k));
            st = swap_write(p->swap, &p->ext[a], k * o->sub_group * 4, p->buf[0][a], sub_bytes(o, k), &p->wr[0]);
        }
        strata_status wst = io_wait_wait(&p->wr[0]);
        if (st == STRATA_OK)
            st = wst;
    }
    return st;
}

/* Creates the peers' swap and writes all four extents once from ram, as the engine's state is written before
 * its step: reading a never-written (unwritten ext4) extent returns zeros without touching the disk, which
 * would make the I/O-alone peer look faster than the traffic it stands for. */
static strata_status peer_open(const step_opts *o, nvme_io *io, const float *const ram[4], io_peer *p)
{
    for (int s = 0; s < PEER_SLOTS; s++) {
        io_wait_init(&p->rd[s]);
        io_wait_init(&p->wr[s]);
    }
    p->open = true;
    const char *paths[] = {o->path};
    strata_status st = swap_create(io, paths, 1, o->numel * 16, &p->swap);
    if (st == STRATA_OK)
        swap_set_checksum(p->swap, o->checksum);
    for (int a = 0; a < 4 && st == STRATA_OK; a++)
        st = swap_alloc(p->swap, o->numel * 4, &p->ext[a]);
    for (int s = 0; s < PEER_SLOTS && st == STRATA_OK; s++)
        for (int a = 0; a < 4 && st == STRATA_OK; a++)
            if (!(p->buf[s][a] = big_alloc(o->sub_group * 4)))
                st = STRATA_ENOMEM;
            else /* first touch now, not in the first timed read */
                memset(p->buf[s][a], 0, o->sub_group * 4);
    return st == STRATA_OK ? peer_write(o, p, ram, 0, 4) : st;
}

/* One peer's time into t[COL_PIPE] or t[COL_SEQ], after writing the gradients afresh. */
static strata_status time_peer(const step_opts *o, io_peer *p, const float *const ram[4], bool pipelined, double *t)
{
    strata_status st = peer_write(o, p, ram, 3, 4);
    if (st != STRATA_OK)
        return st;
    return pipelined ? time_io_pipelined(o, p, &t[COL_PIPE]) : time_io_sequential(o, p, &t[COL_SEQ]);
}

static void peer_close(io_peer *p)
{
    if (!p->open)
        return;
    drain(p, STRATA_OK);
    for (int s = 0; s < PEER_SLOTS; s++) {
        io_wait_destroy(&p->rd[s]);
        io_wait_destroy(&p->wr[s]);
        for (int a = 0; a < 4; a++)
            free(p->buf[s][a]);
    }
    swap_destroy(p->swap);
}

/* ---------------------------------------------------------------- T_step */

typedef struct engine_run {
    strata_engine *e;
    strata_module_id *mods;
    strata_param_id *params;
    size_t *bases;
    size_t nmods;
} engine_run;

static strata_status engine_open(const step_opts *o, engine_run *r)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.param_dtype = STRATA_DTYPE_BF16;
    c.offload_param.device = STRATA_TIER_HOST;
    c.offload_optimizer.device = STRATA_TIER_NVME;
    snprintf(c.offload_optimizer.nvme_path[0], STRATA_PATH_BYTES, "%s", o->path);
    c.offload_optimizer.nvme_path_count = 1;
    c.gradients_on_nvme = STRATA_SWITCH_ON; /* T_io reads the gradients from NVMe too */
    c.swap_checksum = o->checksum;
    c.host_cache = false; /* the peers read the drive: so must the step */
    c.sub_group_size = o->sub_group;
    c.cpu_threads = o->threads;
    c.aio = o->aio;
    c.device_budget_bytes = 4 * MODULE_NUMEL * 2 + (64u << 20);
    if (o->trace)
        snprintf(c.trace_path, sizeof c.trace_path, "%s", o->trace);
    strata_status st = strata_engine_create(&c, &r->e);
    if (st != STRATA_OK)
        return st;
    r->nmods = (o->numel + MODULE_NUMEL - 1) / MODULE_NUMEL;
    r->mods = calloc(r->nmods, sizeof *r->mods);
    r->params = calloc(r->nmods, sizeof *r->params);
    r->bases = calloc(r->nmods, sizeof *r->bases);
    for (size_t i = 0; i < r->nmods && st == STRATA_OK; i++) {
        char name[32];
        snprintf(name, sizeof name, "block%zu", i);
        r->bases[i] = i * MODULE_NUMEL;
        st = strata_module_add(r->e, name, &r->mods[i]);
        if (st == STRATA_OK)
            st = strata_param_add(r->e, r->mods[i], "w", MIN(MODULE_NUMEL, o->numel - i * MODULE_NUMEL), init_fn,
                                  &r->bases[i], &r->params[i]);
    }
    return st == STRATA_OK ? strata_engine_finalize(r->e) : st;
}

static strata_status engine_step(const step_opts *o, engine_run *r, double *seconds, strata_stats *delta)
{
    /* The backward pass hands every module a constant gradient. */
    for (size_t i = 0; i < r->nmods; i++) {
        strata_status st = strata_fetch(r->e, r->mods[i]);
        uint16_t *g = st == STRATA_OK ? strata_grad_data(r->e, r->params[i]) : NULL;
        if (!g)
            return st != STRATA_OK ? st : STRATA_ESTATE;
        size_t n = MIN(MODULE_NUMEL, o->numel - i * MODULE_NUMEL);
        uint32_t bits;
        float gv = GRAD_VALUE;
        memcpy(&bits, &gv, 4);
        for (size_t j = 0; j < n; j++)
            g[j] = (uint16_t)(bits >> 16); /* 1e-3 truncated to bf16: exact in fp32 too */
        if ((st = strata_grads_ready(r->e, r->mods[i])) != STRATA_OK || (st = strata_release(r->e, r->mods[i])))
            return st;
    }
    strata_status st = strata_sync(r->e);
    if (st != STRATA_OK)
        return st;
    /* The pipeline in full, as T_io does it: the slots would otherwise skip re-reading the sub-groups whose
     * state they kept from the last step. */
    step_forget(r->e->step);
    strata_stats before, after;
    strata_stats_get(r->e, &before);
    uint64_t t0 = now_ns();
    st = strata_step(r->e, NULL, NULL);
    if (st == STRATA_OK)
        st = strata_sync(r->e); /* the write-backs the step leaves in flight: the peers wait for theirs */
    *seconds = (now_ns() - t0) / 1e9;
    strata_stats_get(r->e, &after);
    delta->adam_ns = after.adam_ns - before.adam_ns;
    delta->step_io_wait_ns = after.step_io_wait_ns - before.step_io_wait_ns;
    delta->nvme_to_host_bytes = after.nvme_to_host_bytes - before.nvme_to_host_bytes;
    delta->host_to_nvme_bytes = after.host_to_nvme_bytes - before.host_to_nvme_bytes;
    delta->host_cache_hits = after.host_cache_hits - before.host_cache_hits;
    return st;
}

/* ---------------------------------------------------------------- the benchmark */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bool parse_args(int argc, char **argv, step_opts *o)
{
    strata_config c;
    strata_config_init(&c);
    *o = (step_opts){.numel = (size_t)64 << 20, .sub_group = (size_t)16 << 20, .reps = 3, .checksum = c.swap_checksum};
    nvme_aio_defaults(&o->aio);
    if (cli_parse_or_say(&step_spec, argc, argv, o))
        return false;
    if (!o->path) {
        fprintf(stderr, "strata bench step: --path DIR is required (a directory on the drive to measure)\n");
        return false;
    }
    o->sub_group = align_up(MIN(o->sub_group, o->numel), 4096);
    if (!o->threads)
        o->threads = adam_default_threads();
    return true;
}

static void print_header(FILE *out, const step_opts *o, const adam_ops *ops)
{
    char b1[32], b2[32];
    machine_line_print(out, "");
    fprintf(out, "config:  numel %zu, sub-group %zu, %d Adam threads (kernel %s), state on NVMe %s (fp32 master/m/v/grad), "
            "path %s, aio block %s, queue depth %d, %d I/O thread(s), swap checksums %s, host cache off "
            "(strata.host_cache = false), %d reps after a warm-up\n", o->numel, o->sub_group, o->threads, ops->name,
            size_format(o->numel * 16, b1, sizeof b1), o->path, size_format(o->aio.block_size, b2, sizeof b2),
            o->aio.queue_depth, o->aio.intra_op_parallelism, o->checksum ? "on" : "off", o->reps);
    fprintf(out, "T_io = the faster of T_pipe (the engine's pipeline, %d slots, no compute) and T_seq (the same bytes "
            "as one read and one write stream); T_step = strata_step + strata_sync (its write-backs settled); every "
            "rep checks the step moved the peers' NVMe bytes with no host-cache hit\n\n", PEER_SLOTS);
}

/* The RAM arrays, touched now so that no rep pays for first-touch page faults, master initialised as the engine's,
 * gradients the engine's bf16-rounded GRAD_VALUE. False when memory is short. */
static bool ram_open(const step_opts *o, ram_state *r)
{
    r->master = malloc(o->numel * 4);
    r->m = malloc(o->numel * 4);
    r->v = malloc(o->numel * 4);
    r->grad = malloc(o->numel * 4);
    r->param = malloc(o->numel * 2);
    if (!r->master || !r->m || !r->v || !r->grad || !r->param)
        return false;
    /* explicit_bzero, because the compiler folds malloc + memset into calloc, which touches nothing. */
    explicit_bzero(r->m, o->numel * 4);
    explicit_bzero(r->v, o->numel * 4);
    explicit_bzero(r->param, o->numel * 2);
    for (size_t i = 0; i < o->numel; i++)
        r->master[i] = init_value(i);
    uint32_t bits;
    float gv = GRAD_VALUE;
    memcpy(&bits, &gv, 4);
    bits &= 0xffff0000u; /* the engine's gradients pass through bf16 */
    memcpy(&gv, &bits, 4);
    for (size_t i = 0; i < o->numel; i++)
        r->grad[i] = gv;
    return true;
}

static void ram_close(ram_state *r)
{
    free(r->master);
    free(r->m);
    free(r->v);
    free(r->grad);
    free(r->param);
}

/* What the reps gathered: each column per rep (the warm-up left out), the mismatches, the last rep's counters. */
typedef struct reps {
    double *col[COLS];
    uint64_t wrong_total, moved_wrong;
    strata_stats last;
} reps;

/* The step moved exactly the peers' NVMe bytes with no host-cache hit; says so on stderr when not. */
static bool step_moved_peers_bytes(const step_opts *o, int rep, const strata_stats *d)
{
    if (!d->host_cache_hits && d->nvme_to_host_bytes == o->numel * 16 && d->host_to_nvme_bytes == o->numel * 12)
        return true;
    fprintf(stderr, "strata bench step: rep %d: the step read %llu and wrote %llu bytes on NVMe with %llu host-cache "
            "hits; the peers read %zu and write %zu: the step did not run the traffic it is compared with\n", rep,
            (unsigned long long)d->nvme_to_host_bytes, (unsigned long long)d->host_to_nvme_bytes,
            (unsigned long long)d->host_cache_hits, o->numel * 16, o->numel * 12);
    return false;
}

/* #wrong: the engine's master weights against the RAM Adam, on a strided sample. */
static uint64_t count_wrong(const step_opts *o, const engine_run *er, const ram_state *r)
{
    uint64_t wrong = 0;
    for (size_t i = 0; i < o->numel; i += o->numel / 997 + 1) {
        size_t mod = i / MODULE_NUMEL;
        float got;
        if (strata_param_read_master(er->e, er->params[mod], i - mod * MODULE_NUMEL, 1, &got) != STRATA_OK ||
            memcmp(&got, &r->master[i], 4) != 0)
            wrong++;
    }
    return wrong;
}

/* One rep: Adam in RAM, the two I/O peers, the engine's step; checked and printed. */
static strata_status run_rep(const step_opts *o, const adam_ops *ops, ram_state *r, io_peer *peer, engine_run *er,
                             int rep, reps *out)
{
    const float *const ram[4] = {r->master, r->m, r->v, r->grad};
    strata_stats d;
    double t[COLS];
    t[COL_ADAM] = time_adam(o, ops, r, rep + 1);
    /* The peers take turns going first, so that neither always starts behind the other's writes. Before each, the
     * gradients are written afresh, untimed, as the engine's backward writes them just before its step: a virtual
     * disk's host cache serves data written moments ago faster than data written long ago. */
    bool pipe_first = rep % 2 == 0;
    strata_status st;
    if ((st = time_peer(o, peer, ram, pipe_first, t)) != STRATA_OK ||
        (st = time_peer(o, peer, ram, !pipe_first, t)) != STRATA_OK ||
        (st = engine_step(o, er, &t[COL_STEP], &d)) != STRATA_OK)
        return st;
    out->last = d; /* the configuration the step ran with: every byte the peers move went to and from the drive */
    out->moved_wrong += !step_moved_peers_bytes(o, rep, &d);
    uint64_t wrong = count_wrong(o, er, r);
    out->wrong_total += wrong;
    t[COL_IO] = MIN(t[COL_PIPE], t[COL_SEQ]);
    t[COL_OVERLAP] = MAX(t[COL_ADAM], t[COL_IO]) / t[COL_STEP];
    for (int c = 0; c < COLS && rep > 0; c++)
        out->col[c][rep - 1] = t[c];
    char label[16] = "warm";
    if (rep)
        snprintf(label, sizeof label, "%d", rep);
    if (!o->json)
        printf("%-4s %10.3f %10.3f %10.3f %10.3f %10.3f %9.3f %10.2f %10.3f %7llu\n", label, t[COL_ADAM], t[COL_PIPE],
               t[COL_SEQ], t[COL_IO], t[COL_STEP], t[COL_OVERLAP], o->numel * 28 / t[COL_IO] / 1e9,
               d.step_io_wait_ns / 1e9, (unsigned long long)wrong);
    return STRATA_OK;
}

/* The medians of the reps, as the table's last row or as one JSON object. */
static void print_medians(const step_opts *o, reps *rs)
{
    double med[COLS];
    for (int c = 0; c < COLS; c++) {
        qsort(rs->col[c], (size_t)o->reps, sizeof(double), cmp_double);
        med[c] = rs->col[c][o->reps / 2];
    }
    if (o->json)
        printf("{\"bench\":\"step\",\"numel\":%zu,\"sub_group\":%zu,\"threads\":%d,\"peer_slots\":%d,"
               "\"t_adam_s\":%.4f,\"t_io_pipelined_s\":%.4f,\"t_io_sequential_s\":%.4f,\"t_io_s\":%.4f,"
               "\"t_step_s\":%.4f,\"overlap_efficiency\":%.4f,\"wrong\":%llu,\"host_cache\":false,"
               "\"step_host_cache_hits\":%llu,\"step_nvme_read_bytes\":%llu,\"step_nvme_write_bytes\":%llu,"
               "\"io_nvme_read_bytes\":%zu,\"io_nvme_write_bytes\":%zu,\"reps_traffic_mismatch\":%llu}\n",
               o->numel, o->sub_group, o->threads, PEER_SLOTS, med[COL_ADAM], med[COL_PIPE], med[COL_SEQ], med[COL_IO],
               med[COL_STEP], med[COL_OVERLAP], (unsigned long long)rs->wrong_total,
               (unsigned long long)rs->last.host_cache_hits, (unsigned long long)rs->last.nvme_to_host_bytes,
               (unsigned long long)rs->last.host_to_nvme_bytes, o->numel * 16, o->numel * 12,
               (unsigned long long)rs->moved_wrong);
    else
        printf("%-4s %10.3f %10.3f %10.3f %10.3f %10.3f %9.3f   (medians; overlap = median of the per-rep ratios)\n",
               "med", med[COL_ADAM], med[COL_PIPE], med[COL_SEQ], med[COL_IO], med[COL_STEP], med[COL_OVERLAP]);
}

/* The peers and the engine over r, then the reps; an exit code. */
static int run_bench(const step_opts *o, const adam_ops *ops, ram_state *r, reps *rs)
{
    const float *const ram[4] = {r->master, r->m, r->v, r->grad};
    nvme_io *io = NULL;
    io_peer peer = {0};
    engine_run er = {0};
    int rc = CLI_EXIT_FAIL;
    strata_status st = nvme_io_create(&o->aio, &io);
    if (st == STRATA_OK)
        st = peer_open(o, io, ram, &peer);
    if (st == STRATA_OK)
        st = engine_open(o, &er);
    if (st != STRATA_OK) {
        fprintf(stderr, "strata bench step: setup failed: %s\n", strata_last_error(er.e));
        goto out;
    }
    if (!o->json)
        printf("%-4s %10s %10s %10s %10s %10s %9s %10s %10s %7s\n", "REP", "T_ADAM_S", "T_PIPE_S", "T_SEQ_S", "T_IO_S",
               "T_STEP_S", "OVERLAP", "IO_GB/S", "STEP_IOW_S", "#WRONG");
    /* Rep 0 warms up (the engine takes its pinned slots at its first step, threads start, pages are touched)
     * and is printed but left out of the medians. */
    for (int rep = 0; rep <= o->reps; rep++)
        if (run_rep(o, ops, r, &peer, &er, rep, rs) != STRATA_OK) {
            fprintf(stderr, "strata bench step: %s\n", strata_last_error(er.e));
            goto out;
        }
    print_medians(o, rs);
    rc = rs->wrong_total || rs->moved_wrong ? CLI_EXIT_FAIL : CLI_EXIT_OK;
out:
    strata_engine_destroy(er.e);
    free(er.mods);
    free(er.params);
    free(er.bases);
    peer_close(&peer);
    nvme_io_destroy(io);
    return rc;
}

int bench_step_main(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        cli_print_help(&step_spec, stdout);
        return CLI_EXIT_OK;
    }
    step_opts o;
    if (!parse_args(argc, argv, &o))
        return CLI_EXIT_USAGE;
    const adam_ops *ops;
    if (adam_ops_default(&ops) != STRATA_OK) {
        fprintf(stderr, "strata bench step: %s\n", strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    print_header(o.json ? stderr : stdout, &o, ops);
    int rc = CLI_EXIT_FAIL;
    ram_state r = {0};
    reps rs = {0};
    bool ok = true;
    for (int c = 0; c < COLS; c++)
        ok &= (rs.col[c] = calloc((size_t)o.reps, sizeof(double))) != NULL;
    if (ok && ram_open(&o, &r))
        rc = run_bench(&o, ops, &r, &rs);
    else
        fprintf(stderr, "strata bench step: out of memory for %zu elements in RAM\n", o.numel);
    ram_close(&r);
    for (int c = 0; c < COLS; c++)
        free(rs.col[c]);
    return rc;
}
