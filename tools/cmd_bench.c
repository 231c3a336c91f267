/*
 * `strata bench <what>`: kernel and pipeline benchmarks. Each entry of the table below is one benchmark;
 * `adam` measures the CPU Adam against the same-shape roofline in the same process.
 *
 * bench adam: for each size x (gradient dtype, parameter dtype) x thread count it times, interleaved,
 * the Adam step, the gradient pre-pass and the roofline of Adam's exact access pattern (with regular
 * stores, with streaming stores, and with regular stores in place plus a streaming parameter copy as
 * Adam itself does; the fastest counts), keeps the best of --reps runs of each, and reports ms/step,
 * parameters/s, the bytes one step moves (counted exactly for the dtypes), GB/s and Adam's share of
 * the roofline — with and without the pre-pass. A #wrong column checks a sample of every row against
 * the scalar reference, bit for bit.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/big_alloc.h"
#include "base/size.h"
#include "base/util.h"
#include "cpu_adam/adam.h"
#include "base/half.h"
#include "cpu_adam/driver.h"
#include "strata.h"
#include "tools/cli.h"
#include "tools/machine_line.h"
#include "tools/options.h"

/* ------------------------------------------------------------------ bench adam */

typedef struct combo {
    strata_dtype grad, param;
} combo;

/* The headline combination: fp32 master/m/v, bf16 gradients, bf16 parameter copy. */
static const combo headline = {STRATA_DTYPE_BF16, STRATA_DTYPE_BF16};

typedef struct combo_list {
    combo v[12];
    int n;
    bool given; /* by --combos */
} combo_list;

typedef struct adam_opts {
    cli_size_list sizes;
    size_t full_max;          /* sizes above this run the headline combination only */
    cli_int_list threads;
    combo_list combos;
    int reps;
    bool json;
    long long seed;
    int optimizer;            /* the index of adamw|adam */
    int formula;              /* the index of mul_add|lerp: strata_adam_formula */
    const adam_ops *ops;
    strata_adam_hparams hp;
} adam_opts;

typedef struct row {
    size_t n;
    combo c;
    int threads;
    double adam_s, roof_s, pre_s;  /* best of reps */
    adam_stores roof_stores;  /* the fastest store policy of the roofline */
    double roof_each_s[ADAM_STORES_COUNT]; /* best of each store policy */
    size_t bytes;
    size_t wrong, checked;
} row;

static bool parse_dtype(const char *s, size_t len, strata_dtype *out)
{
    static const strata_dtype all[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16, STRATA_DTYPE_NONE};
    for (size_t i = 0; i < ARRAY_LEN(all); i++) {
        const char *name = strata_dtype_name(all[i]);
        if (strlen(name) == len && strncmp(s, name, len) == 0) {
            *out = all[i];
            return true;
        }
    }
    return false;
}

static bool parse_combos(const char *list, void *dst)
{
    combo_list *o = dst;
    o->n = 0;
    o->given = true;
    if (strcmp(list, "all") == 0) {
        for (int g = 0; g < 3; g++)
            for (int p = 0; p < 4; p++)
                o->v[o->n++] = (combo){(strata_dtype)g, (strata_dtype)p};
        return true;
    }
    for (const char *s = list; *s;) {
        const char *colon = strchr(s, ':'), *end = strchr(s, ',');
        if (!end)
            end = s + strlen(s);
        combo c;
        if (!colon || colon > end || o->n == (int)ARRAY_LEN(o->v) || !parse_dtype(s, (size_t)(colon - s), &c.grad) ||
            c.grad == STRATA_DTYPE_NONE || !parse_dtype(colon + 1, (size_t)(end - colon - 1), &c.param))
            return false;
        o->v[o->n++] = c;
        s = *end ? end + 1 : end;
    }
    return o->n > 0;
}

#define OPT(...) CLI_OPTION(adam_opts, __VA_ARGS__)
static const cli_opt adam_opt_table[] = {
    OPT("--sizes", CLI_SIZE_LIST, sizes, 1, 0, "LIST", "element counts (default 16M,64M,256M,1G; K/M/G are powers of "
                                                       "1024)"),
    OPT("--full-max", CLI_SIZE, full_max, 0, 0, "N", "sizes above N run only bf16 grad -> bf16 param (default 256M)"),
    {.name = "--combos", .kind = CLI_CUSTOM, .offset = offsetof(adam_opts, combos), .parse = parse_combos,
     .meta = "LIST", .what = "all or a list of GRAD:PARAM",
     .help = "all | GRAD:PARAM,... with GRAD in fp32,bf16,fp16 and PARAM in fp32,bf16,fp16,none"},
    OPT("--threads", CLI_INT_LIST, threads, 1, 4096, "LIST", "OpenMP thread counts, each in {} (default 1,<cores>)"),
    OPT("--reps", CLI_INT, reps, 1, 1000, "N", "timed repetitions per row, {}; the best counts (default 3)"),
    {.name = "--optimizer", .kind = CLI_CHOICE, .offset = offsetof(adam_opts, optimizer), .choices = "adamw|adam",
     .meta = "NAME", .help = "adamw (default) or adam"},
    {.name = "--formula", .kind = CLI_CHOICE, .offset = offsetof(adam_opts, formula), .choices = "mul_add|lerp",
     .meta = "NAME", .help = "the first moment's update: mul_add (torch < 2.0, default) or lerp (torch >= 2.0)"},
    OPT("--seed", CLI_LL, seed, 0, 1e18, "N", "data seed (default 1)"),
    OPT("--json", CLI_SWITCH, json, 0, 0, NULL, "one JSON document on stdout (the header goes to stderr)"),
};
#undef OPT
static const cli_opt_group adam_groups[] = {CLI_GROUP(adam_opt_table)};
static const cli_spec adam_spec = {.command = "bench adam", .groups = adam_groups, .ngroups = 1,
                                   .footer = "STRATA_ISA=ref|avx2|avx512 forces the kernel."};

static int parse_adam_opts(int argc, char **argv, adam_opts *o)
{
    int cores = adam_default_threads();
    *o = (adam_opts){.sizes = {{(size_t)16 << 20, (size_t)64 << 20, (size_t)256 << 20, (size_t)1 << 30}, 4},
                     .full_max = (size_t)256 << 20, .threads = {{1, cores}, cores > 1 ? 2 : 1}, .reps = 3, .seed = 1,
                     .hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD}};
    parse_combos("all", &o->combos);
    o->combos.given = false;
    int rc = cli_parse_or_say(&adam_spec, argc, argv, o);
    if (rc)
        return rc;
    o->hp.kind = o->optimizer == 1 ? STRATA_OPTIMIZER_ADAM : STRATA_OPTIMIZER_ADAMW;
    o->hp.formula = o->formula == 1 ? STRATA_ADAM_LERP : STRATA_ADAM_MUL_ADD;
    if (adam_ops_default(&o->ops) != STRATA_OK) {
        fprintf(stderr, "strata bench adam: %s\n", strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

static float hash_unit(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (float)(x >> 40) * 0x1p-24f * 2.0f - 1.0f; /* [-1, 1) */
}

typedef struct bufs {
    float *master, *m, *v;
    void *grad, *param;
} bufs;

static void fill_state(const bufs *b, size_t n, uint64_t seed, int threads)
{
#pragma omp parallel for schedule(static, 1 << 16) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        b->master[i] = 0.05f * hash_unit(seed ^ (i * 3));
        b->m[i] = 1e-4f * hash_unit(seed ^ (i * 3 + 1));
        b->v[i] = 1e-8f * (1.5f + hash_unit(seed ^ (i * 3 + 2)));
    }
}

static void fill_grad(const bufs *b, size_t n, strata_dtype gd, uint64_t seed, int threads)
{
#pragma omp parallel for schedule(static, 1 << 16) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        float g = 1e-3f * hash_unit(~seed ^ i);
        if (gd == STRATA_DTYPE_FP32)
            ((float *)b->grad)[i] = g;
        else if (gd == STRATA_DTYPE_BF16)
            ((uint16_t *)b->grad)[i] = cvt_f32_to_bf16(g);
        else
            ((uint16_t *)b->grad)[i] = cvt_f32_to_fp16(g);
    }
}

/* One more step, checked bit for bit against the scalar reference on three windows (start, middle,
 * end — the end window includes the unaligned tail). Returns the elements compared; *wrong counts
 * elements where master, m, v or the parameter copy differ (any two NaNs count as equal). */
static size_t check_sample(adam_job *job, size_t *wrong)
{
    enum { W = 4099 };
    size_t n = job->numel, starts[3] = {0, n / 2 > 37 ? n / 2 - 37 : 0, n > W ? n - W : 0};
    size_t gb = strata_dtype_bytes(job->arrays.grad_dtype), pb = strata_dtype_bytes(job->arrays.param_dtype);
    static float sm[3][W], sv[3][W], sp[3][W], sparam[3][W];
    static unsigned char sg[3][W * 4];
    size_t len = MIN((size_t)W, n);
    for (int w = 0; w < 3; w++) {
        memcpy(sp[w], job->arrays.master + starts[w], len * 4);
        memcpy(sm[w], job->arrays.exp_avg + starts[w], len * 4);
        memcpy(sv[w], job->arrays.exp_avg_sq + starts[w], len * 4);
        memcpy(sg[w], (const char *)job->arrays.grad + starts[w] * gb, len * gb);
    }
    adam_run_step(job);
    *wrong = 0;
    for (int w = 0; w < 3; w++) {
        adam_arrays ref = {sp[w], sm[w], sv[w], sg[w], pb ? sparam[w] : NULL, job->arrays.grad_dtype,
                           job->arrays.param_dtype, false};
        adam_step_ref(&job->consts, &ref, 0, len);
        for (size_t i = 0; i < len; i++) {
            size_t at = starts[w] + i;
            bool same = cvt_f32_bits(sp[w][i]) == cvt_f32_bits(job->arrays.master[at]) &&
                        cvt_f32_bits(sm[w][i]) == cvt_f32_bits(job->arrays.exp_avg[at]) &&
                        cvt_f32_bits(sv[w][i]) == cvt_f32_bits(job->arrays.exp_avg_sq[at]) &&
                        (!pb || memcmp((char *)sparam[w] + i * pb, (char *)job->arrays.param + at * pb, pb) == 0);
            bool nan = isnan(sp[w][i]) && isnan(job->arrays.master[at]);
            *wrong += !same && !nan;
        }
    }
    return 3 * len;
}

static double seconds_since(uint64_t t0)
{
    return (double)(now_ns() - t0) * 1e-9;
}

static const char *const stores_name[ADAM_STORES_COUNT] = {"reg", "nt", "nt-copy"};

static void run_row(const adam_opts *o, const bufs *b, row *r, int64_t *step)
{
    adam_job job = {.ops = o->ops, .numel = r->n, .threads = r->threads,
                    .arrays = {b->master, b->m, b->v, b->grad, r->c.param == STRATA_DTYPE_NONE ? NULL : b->param,
                               r->c.grad, r->c.param, true}};
    /* The whole update of a sub-group: unscale (1/loss scale) and clip folded into one gradient scale. */
    double grad_scale = 0.8 / 1024.0;
    r->adam_s = r->roof_s = r->pre_s = INFINITY;
    for (int s = 0; s < ADAM_STORES_COUNT; s++)
        r->roof_each_s[s] = INFINITY;
    for (int rep = -1; rep < o->reps; rep++) { /* rep -1 warms up pages, caches and threads */
        double t_roof[ADAM_STORES_COUNT], t_adam, t_pre;
        uint64_t t0;
        for (int s = 0; s < ADAM_STORES_COUNT; s++) {
            t0 = now_ns();
            adam_run_roofline(&job, (adam_stores)s);
            t_roof[s] = seconds_since(t0);
        }
        adam_consts_init(&job.consts, &o->hp, ++*step, grad_scale);
        t0 = now_ns();
        adam_run_step(&job);
        t_adam = seconds_since(t0);
        adam_gradstats gs;
        t0 = now_ns();
        adam_run_gradstats(o->ops, b->grad, r->c.grad, r->n, r->threads, &gs);
        t_pre = seconds_since(t0);
        if (rep < 0)
            continue;
        r->adam_s = MIN(r->adam_s, t_adam);
        r->pre_s = MIN(r->pre_s, t_pre);
        for (int s = 0; s < ADAM_STORES_COUNT; s++) {
            r->roof_each_s[s] = MIN(r->roof_each_s[s], t_roof[s]);
            if (t_roof[s] < r->roof_s) {
                r->roof_s = t_roof[s];
                r->roof_stores = (adam_stores)s;
            }
        }
    }
    adam_consts_init(&job.consts, &o->hp, ++*step, grad_scale);
    r->checked = check_sample(&job, &r->wrong);
    r->bytes = r->n * (3 * 4 + strata_dtype_bytes(r->c.grad) + 3 * 4 + strata_dtype_bytes(r->c.param));
}

static void print_header(FILE *out, const adam_opts *o)
{
    machine_line_print(out, "# ");
    fprintf(out, "# config: kernel %s, %s (%s) lr=%g betas=(%g,%g) eps=%g wd=%g bias_correction=%d, grad_scale=0.8/1024,"
            " reps %d (best counts), sizes above %zu elements: bf16:bf16 only%s, seed %llu\n",
            o->ops->name, o->hp.kind == STRATA_OPTIMIZER_ADAM ? "adam" : "adamw",
            o->hp.formula == STRATA_ADAM_LERP ? "lerp" : "mul_add", o->hp.lr, o->hp.beta1, o->hp.beta2,
            o->hp.eps, o->hp.weight_decay, o->hp.bias_correction, o->reps, o->full_max,
            o->combos.given ? " (or as --combos says)" : "", (unsigned long long)o->seed);
    fprintf(out, "# bytes = master+m+v read and written (24 B) + grad read + param written, per element.\n"
                 "# roof = Adam's access pattern without arithmetic, fastest of regular (reg), streaming (nt) and"
                 " regular + streaming parameter copy (nt-copy, as Adam stores)\n"
                 "# ratio = roof_ms/adam_ms; +pre also counts the gradient pre-pass (norm, inf/NaN) in Adam's time.\n");
}

static void print_row_text(const row *r, bool first)
{
    if (first)
        printf("%7s %4s %5s %3s %9s %9s %8s %9s %9s %8s %8s %6s %7s %6s %6s\n", "Melem", "grad", "param", "thr",
               "adam_ms", "roof_ms", "pre_ms", "Mparam/s", "MB/step", "adamGB/s", "roofGB/s", "ratio", "st",
               "+pre", "#wrong");
    printf("%7.1f %4s %5s %3d %9.2f %9.2f %8.2f %9.0f %9.0f %8.2f %8.2f %6.3f %7s %6.3f %6zu\n", (double)r->n / (1 << 20),
           strata_dtype_name(r->c.grad), strata_dtype_name(r->c.param), r->threads, r->adam_s * 1e3, r->roof_s * 1e3,
           r->pre_s * 1e3, r->n / r->adam_s * 1e-6, r->bytes / 1e6, r->bytes / r->adam_s * 1e-9,
           r->bytes / r->roof_s * 1e-9, r->roof_s / r->adam_s, stores_name[r->roof_stores],
           r->roof_s / (r->adam_s + r->pre_s), r->wrong);
    fflush(stdout);
}

static void print_row_json(const row *r, bool first)
{
    printf("%s\n    {\"numel\": %zu, \"grad\": \"%s\", \"param\": \"%s\", \"threads\": %d, \"adam_ms\": %.4f, "
           "\"roofline_ms\": %.4f, \"roofline_stores\": \"%s\", \"roofline_reg_ms\": %.4f, \"roofline_nt_ms\": %.4f, "
           "\"roofline_nt_copy_ms\": %.4f, \"prepass_ms\": %.4f, \"params_per_s\": %.6g, "
           "\"bytes\": %zu, \"adam_gbps\": %.4f, \"roofline_gbps\": %.4f, \"ratio\": %.4f, "
           "\"ratio_with_prepass\": %.4f, \"checked\": %zu, \"wrong\": %zu}",
           first ? "" : ",", r->n, strata_dtype_name(r->c.grad), strata_dtype_name(r->c.param), r->threads,
           r->adam_s * 1e3, r->roof_s * 1e3, stores_name[r->roof_stores], r->roof_each_s[0] * 1e3, r->roof_each_s[1] * 1e3, r->roof_each_s[2] * 1e3,
           r->pre_s * 1e3,
           r->n / r->adam_s, r->bytes, r->bytes / r->adam_s * 1e-9, r->bytes / r->roof_s * 1e-9,
           r->roof_s / r->adam_s, r->roof_s / (r->adam_s + r->pre_s), r->checked, r->wrong);
    fflush(stdout);
}

static bool runs_at(const adam_opts *o, size_t n, combo c)
{
    return n <= o->full_max || o->combos.given || (c.grad == headline.grad && c.param == headline.param);
}

/* Every combination and thread count at n elements, on one set of buffers; adds the rows printed and the sampled
 * elements that differ from the reference. CLI_EXIT_OK, also when n is skipped for want of memory, or an exit code. */
static int bench_size(const adam_opts *o, size_t n, int max_threads, int *rows, size_t *wrong)
{
    size_t gmax = 0, pmax = 0;
    for (int c = 0; c < o->combos.n; c++)
        if (runs_at(o, n, o->combos.v[c])) {
            gmax = MAX(gmax, strata_dtype_bytes(o->combos.v[c].grad));
            pmax = MAX(pmax, strata_dtype_bytes(o->combos.v[c].param));
        }
    if (!gmax)
        return CLI_EXIT_OK;
    size_t need = n * (12 + gmax + pmax), avail = machine_mem_available_bytes();
    char a[32], b[32];
    if (need + ((size_t)1 << 30) > avail) {
        fprintf(stderr, "# %zu elements skipped: needs %s, %s available (keep 1 GiB spare)\n", n,
                size_format(need, a, sizeof a), size_format(avail, b, sizeof b));
        return CLI_EXIT_OK;
    }
    int rc = CLI_EXIT_OK;
    bufs buf = {big_alloc(n * 4), big_alloc(n * 4), big_alloc(n * 4), big_alloc(n * gmax),
                pmax ? big_alloc(n * pmax) : NULL};
    if (!buf.master || !buf.m || !buf.v || !buf.grad || (pmax && !buf.param)) {
        fprintf(stderr, "strata bench adam: could not allocate %s for %zu elements\n", size_format(need, a, sizeof a),
                n);
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    fill_state(&buf, n, (uint64_t)o->seed, max_threads);
    int64_t step = 0;
    for (int c = 0; c < o->combos.n; c++) {
        if (!runs_at(o, n, o->combos.v[c]))
            continue;
        fill_grad(&buf, n, o->combos.v[c].grad, (uint64_t)o->seed, max_threads);
        for (int t = 0; t < o->threads.n; t++) {
            row r = {.n = n, .c = o->combos.v[c], .threads = o->threads.v[t]};
            run_row(o, &buf, &r, &step);
            *wrong += r.wrong;
            if (o->json)
                print_row_json(&r, *rows == 0);
            else
                print_row_text(&r, *rows == 0);
            ++*rows;
        }
    }
out:
    free(buf.master), free(buf.m), free(buf.v), free(buf.grad), free(buf.param);
    return rc;
}

static int bench_adam(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        cli_print_help(&adam_spec, stdout);
        return CLI_EXIT_OK;
    }
    adam_opts o;
    int rc = parse_adam_opts(argc, argv, &o);
    if (rc != CLI_EXIT_OK)
        return rc;
    print_header(o.json ? stderr : stdout, &o);
    if (o.json)
        printf("{\"kernel\": \"%s\", \"rows\": [", o.ops->name);
    int max_threads = 1, rows = 0;
    size_t total_wrong = 0;
    for (int t = 0; t < o.threads.n; t++)
        max_threads = MAX(max_threads, o.threads.v[t]);
    for (int s = 0; s < o.sizes.n; s++)
        if ((rc = bench_size(&o, o.sizes.v[s], max_threads, &rows, &total_wrong)) != CLI_EXIT_OK)
            return rc;
    if (o.json)
        printf("\n], \"wrong\": %zu}\n", total_wrong);
    if (total_wrong) {
        fprintf(stderr, "strata bench adam: %zu sampled elements differ from the scalar reference\n", total_wrong);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* ------------------------------------------------------------------ the table */

typedef struct bench_entry {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the benchmark's name */
} bench_entry;

static const bench_entry benches[] = {
    {"adam", "CPU Adam (every dtype pair) against the same-shape memory roofline", bench_adam},
    {"step", "the optimizer step with state on NVMe: Adam alone, I/O alone, pipelined", bench_step_main},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: strata bench <what> [options]\n\nbenchmarks:\n");
    for (size_t i = 0; i < ARRAY_LEN(benches); i++)
        fprintf(out, "  %-8s %s\n", benches[i].name, benches[i].summary);
    fprintf(out, "\n`strata bench <what> --help` shows its options.\n");
}

int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    for (size_t i = 0; i < ARRAY_LEN(benches); i++)
        if (strcmp(argv[1], benches[i].name) == 0)
            return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "strata bench: unknown benchmark \"%s\"; allowed:", argv[1]);
    for (size_t i = 0; i < ARRAY_LEN(benches); i++)
        fprintf(stderr, " %s", benches[i].name);
    fprintf(stderr, "\n");
    return CLI_EXIT_USAGE;
}
