/*
 * `strata bench step`: the optimizer step with its state on NVMe. In one process, interleaved
 * rep by rep, it times
 *   T_adam  Adam alone, over the same sub-groups, on arrays in RAM;
 *   T_io    the same NVMe traffic alone (read master, m, v and gradients; write master, m, v), with
 *           the same three-slot pipelining and no compute;
 *   T_step  the engine's strata_step, where the two overlap;
 * and reports the overlap efficiency max(T_adam, T_io) / T_step (1.0 = perfect hiding). The disk's speed
 * swings between time windows longer than a rep, so the figure is the median of the per-rep ratios
 * (each rep's three timings are adjacent in time), not a ratio of medians. The engine's
 * master weights are checked against the in-RAM Adam on a sample after every rep (#wrong).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "base/size.h"
#include "base/util.h"
#include "build_info.h"
#include "cpu_adam/adam.h"
#include "cpu_adam/driver.h"
#include "engine/engine.h"
#include "engine/step.h"
#include "nvme/io.h"
#include "nvme/swap.h"
#include "strata.h"
#include "tools/cli.h"

#define MODULE_NUMEL ((size_t)16 << 20)
#define GRAD_VALUE 1e-3f

typedef struct step_opts {
    size_t numel, sub_group;
    int threads, reps;
    const char *path;
    const char *trace;
    strata_aio_config aio;
    bool json;
} step_opts;

static void usage(FILE *out)
{
    fprintf(out, "usage: strata bench step --path DIR [--numel N] [--sub-group N] [--threads T] [--reps R]\n"
                 "                         [--block-size SIZE] [--queue-depth N] [--io-threads N] [--trace FILE] [--json]\n\n"
                 "Times Adam alone in RAM, the optimizer's NVMe I/O alone, and the engine's pipelined step over\n"
                 "the same state (fp32 master/m/v and gradients on NVMe under DIR, bf16 parameters), and prints\n"
                 "the overlap efficiency max(T_adam, T_io) / T_step. Defaults: --numel 64M, --sub-group 16M,\n"
                 "--reps 3, aio block 1MiB, queue depth 32, 1 I/O thread, threads = the cores of this process.\n");
}

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
    strata_adam_hparams hp = {c.optimizer, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.bias_correction};
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

/* ---------------------------------------------------------------- T_io */

static strata_status time_io(const step_opts *o, nvme_swap *swap, const swap_extent ext[4], float *slots[3][4],
                             double *seconds)
{
    io_wait rd[3], wr[3];
    for (int s = 0; s < 3; s++) {
        io_wait_init(&rd[s]);
        io_wait_init(&wr[s]);
    }
    size_t nsub = (o->numel + o->sub_group - 1) / o->sub_group;
    strata_status st = STRATA_OK;
    uint64_t t0 = now_ns();
    for (size_t k = 0; k <= nsub && st == STRATA_OK; k++) {
        if (k < nsub) { /* read sub-group k into its slot once the slot's old write is out */
            int s = (int)(k % 3);
            size_t off = k * o->sub_group * 4, len = MIN(o->sub_group, o->numel - k * o->sub_group) * 4;
            st = io_wait_wait(&wr[s]);
            for (int a = 0; a < 4 && st == STRATA_OK; a++)
                st = swap_read(swap, &ext[a], off, slots[s][a], len, &rd[s]);
        }
        if (k > 0 && st == STRATA_OK) { /* "compute" k-1 takes no time: write it back */
            int s = (int)((k - 1) % 3);
            size_t off = (k - 1) * o->sub_group * 4, len = MIN(o->sub_group, o->numel - (k - 1) * o->sub_group) * 4;
            st = io_wait_wait(&rd[s]);
            for (int a = 0; a < 3 && st == STRATA_OK; a++)
                st = swap_write(swap, &ext[a], off, slots[s][a], len, &wr[s]);
        }
    }
    for (int s = 0; s < 3; s++) {
        strata_status a = io_wait_wait(&rd[s]), b = io_wait_wait(&wr[s]);
        if (st == STRATA_OK)
            st = a != STRATA_OK ? a : b;
        io_wait_destroy(&rd[s]);
        io_wait_destroy(&wr[s]);
    }
    *seconds = (now_ns() - t0) / 1e9;
    return st;
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
    strata_stats before, after;
    strata_stats_get(r->e, &before);
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
    uint64_t t0 = now_ns();
    st = strata_step(r->e, NULL, NULL);
    *seconds = (now_ns() - t0) / 1e9;
    strata_stats_get(r->e, &after);
    delta->adam_ns = after.adam_ns - before.adam_ns;
    delta->step_io_wait_ns = after.step_io_wait_ns - before.step_io_wait_ns;
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
    *o = (step_opts){.numel = (size_t)64 << 20, .sub_group = (size_t)16 << 20, .reps = 3};
    nvme_aio_defaults(&o->aio);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t sz;
        if (strcmp(a, "--json") == 0) {
            o->json = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "strata bench step: %s needs a value (see --help)\n", a);
            return false;
        }
        i++;
        bool ok = size_parse(v, &sz);
        if (strcmp(a, "--path") == 0)
            o->path = v;
        else if (strcmp(a, "--trace") == 0)
            o->trace = v;
        else if (strcmp(a, "--numel") == 0 && ok && sz >= 4096)
            o->numel = sz;
        else if (strcmp(a, "--sub-group") == 0 && ok && sz >= 4096)
            o->sub_group = sz;
        else if (strcmp(a, "--threads") == 0 && ok && sz <= 1024)
            o->threads = (int)sz;
        else if (strcmp(a, "--reps") == 0 && ok && sz >= 1 && sz <= 100)
            o->reps = (int)sz;
        else if (strcmp(a, "--block-size") == 0 && ok && sz >= 4096 && sz % 4096 == 0)
            o->aio.block_size = sz;
        else if (strcmp(a, "--queue-depth") == 0 && ok && sz >= 1 && sz <= 1024)
            o->aio.queue_depth = (int)sz;
        else if (strcmp(a, "--io-threads") == 0 && ok && sz >= 1 && sz <= 64)
            o->aio.intra_op_parallelism = (int)sz;
        else {
            fprintf(stderr, "strata bench step: bad option or value: %s %s (see --help)\n", a, v);
            return false;
        }
    }
    if (!o->path) {
        fprintf(stderr, "strata bench step: --path DIR is required (a directory on the drive to measure)\n");
        return false;
    }
    o->sub_group = align_up(MIN(o->sub_group, o->numel), 4096);
    if (!o->threads)
        o->threads = adam_default_threads();
    return true;
}

int bench_step_main(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
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
    struct utsname u;
    uname(&u);
    char b1[32], b2[32];
    FILE *hdr = o.json ? stderr : stdout;
    fprintf(hdr, "strata %s bench step on %s (%s), %d Adam threads, isa %s, build %s\n", strata_version(), u.nodename,
            u.machine, o.threads, ops->name, STRATA_BUILD_TYPE);
    fprintf(hdr, "numel %zu, sub-group %zu, state on NVMe %s (fp32 master/m/v/grad), path %s, aio block %s, "
            "queue depth %d, %d I/O thread(s)\n\n", o.numel, o.sub_group,
            size_format(o.numel * 16, b1, sizeof b1), o.path, size_format(o.aio.block_size, b2, sizeof b2),
            o.aio.queue_depth, o.aio.intra_op_parallelism);

    int rc = CLI_EXIT_FAIL;
    ram_state r = {0};
    nvme_io *io = NULL;
    nvme_swap *swap = NULL;
    swap_extent ext[4] = {0};
    float *slots[3][4] = {{0}};
    engine_run er = {0};
    double *ta = calloc((size_t)o.reps, 8), *ti = calloc((size_t)o.reps, 8), *ts = calloc((size_t)o.reps, 8);
    double *te = calloc((size_t)o.reps, 8);
    r.master = malloc(o.numel * 4);
    r.m = calloc(o.numel, 4);
    r.v = calloc(o.numel, 4);
    r.grad = malloc(o.numel * 4);
    r.param = malloc(o.numel * 2);
    if (!r.master || !r.m || !r.v || !r.grad || !r.param || !ta || !ti || !ts) {
        fprintf(stderr, "strata bench step: out of memory for %zu elements in RAM\n", o.numel);
        goto out;
    }
    /* Touch everything now, so that no rep pays for first-touch page faults. */
    memset(r.m, 0, o.numel * 4);
    memset(r.v, 0, o.numel * 4);
    memset(r.param, 0, o.numel * 2);
    for (size_t i = 0; i < o.numel; i++)
        r.master[i] = init_value(i);
    {
        uint32_t bits;
        float gv = GRAD_VALUE;
        memcpy(&bits, &gv, 4);
        bits &= 0xffff0000u; /* the engine's gradients pass through bf16 */
        memcpy(&gv, &bits, 4);
        for (size_t i = 0; i < o.numel; i++)
            r.grad[i] = gv;
    }
    const char *paths[] = {o.path};
    strata_status st = nvme_io_create(&o.aio, &io);
    if (st == STRATA_OK)
        st = swap_create(io, paths, 1, o.numel * 16, &swap);
    for (int a = 0; a < 4 && st == STRATA_OK; a++)
        st = swap_alloc(swap, o.numel * 4, &ext[a]);
    for (int s = 0; s < 3 && st == STRATA_OK; s++)
        for (int a = 0; a < 4; a++)
            if (posix_memalign((void **)&slots[s][a], 4096, o.sub_group * 4))
                st = STRATA_ENOMEM;
    /* Write all four extents once, as the engine's state is written before its step: reading a
     * never-written (unwritten ext4) extent returns zeros without touching the disk, which would
     * make the I/O-alone peer look faster than the traffic it stands for. */
    {
        io_wait w;
        io_wait_init(&w);
        float *src[4] = {r.master, r.m, r.v, r.grad};
        for (size_t first = 0; first < o.numel && st == STRATA_OK; first += o.sub_group) {
            size_t n = MIN(o.sub_group, o.numel - first);
            for (int a = 0; a < 4 && st == STRATA_OK; a++) {
                memcpy(slots[0][a], src[a] + first, n * 4);
                st = swap_write(swap, &ext[a], first * 4, slots[0][a], n * 4, &w);
            }
            strata_status wst = io_wait_wait(&w);
            if (st == STRATA_OK)
                st = wst;
        }
        io_wait_destroy(&w);
    }
    if (st == STRATA_OK)
        st = engine_open(&o, &er);
    if (st != STRATA_OK) {
        fprintf(stderr, "strata bench step: setup failed: %s\n", strata_last_error(er.e));
        goto out;
    }
    if (!o.json)
        printf("%-4s %10s %10s %10s %9s %10s %10s %7s\n", "REP", "T_ADAM_S", "T_IO_S", "T_STEP_S", "OVERLAP",
               "IO_GB/S", "STEP_IOW_S", "#WRONG");
    uint64_t wrong_total = 0;
    for (int rep = 0; rep < o.reps; rep++) {
        strata_stats d;
        ta[rep] = time_adam(&o, ops, &r, rep + 1);
        if ((st = time_io(&o, swap, ext, slots, &ti[rep])) != STRATA_OK ||
            (st = engine_step(&o, &er, &ts[rep], &d)) != STRATA_OK) {
            fprintf(stderr, "strata bench step: %s\n", strata_last_error(er.e));
            goto out;
        }
        /* #wrong: the engine's master weights against the RAM Adam, on a strided sample. */
        uint64_t wrong = 0;
        for (size_t i = 0; i < o.numel; i += o.numel / 997 + 1) {
            size_t mod = i / MODULE_NUMEL;
            float got;
            if (strata_param_read_master(er.e, er.params[mod], i - mod * MODULE_NUMEL, 1, &got) != STRATA_OK ||
                memcmp(&got, &r.master[i], 4) != 0)
                wrong++;
        }
        wrong_total += wrong;
        double eff = te[rep] = MAX(ta[rep], ti[rep]) / ts[rep];
        if (!o.json)
            printf("%-4d %10.3f %10.3f %10.3f %9.3f %10.2f %10.3f %7llu\n", rep + 1, ta[rep], ti[rep], ts[rep], eff,
                   o.numel * 28 / ti[rep] / 1e9, d.step_io_wait_ns / 1e9, (unsigned long long)wrong);
    }
    qsort(ta, (size_t)o.reps, 8, cmp_double);
    qsort(ti, (size_t)o.reps, 8, cmp_double);
    qsort(ts, (size_t)o.reps, 8, cmp_double);
    qsort(te, (size_t)o.reps, 8, cmp_double);
    double ma = ta[o.reps / 2], mi = ti[o.reps / 2], ms = ts[o.reps / 2], eff = te[o.reps / 2];
    if (o.json)
        printf("{\"bench\":\"step\",\"numel\":%zu,\"sub_group\":%zu,\"threads\":%d,\"t_adam_s\":%.4f,\"t_io_s\":%.4f,"
               "\"t_step_s\":%.4f,\"overlap_efficiency\":%.4f,\"wrong\":%llu}\n", o.numel, o.sub_group, o.threads, ma,
               mi, ms, eff, (unsigned long long)wrong_total);
    else
        printf("%-4s %10.3f %10.3f %10.3f %9.3f   (medians; overlap = median of the per-rep ratios)\n", "med", ma, mi,
               ms, eff);
    rc = wrong_total ? CLI_EXIT_FAIL : CLI_EXIT_OK;
out:
    strata_engine_destroy(er.e);
    free(er.mods);
    free(er.params);
    free(er.bases);
    for (int s = 0; s < 3; s++)
        for (int a = 0; a < 4; a++)
            free(slots[s][a]);
    swap_destroy(swap);
    nvme_io_destroy(io);
    free(r.master);
    free(r.m);
    free(r.v);
    free(r.grad);
    free(r.param);
    free(ta);
    free(ti);
    free(ts);
    free(te);
    return rc;
}
