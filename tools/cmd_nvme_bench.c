/* `strata nvme-bench PATH...`: sweep block size x queue depth x I/O threads over write, read and
 * concurrent read+write; print a table with each reading mode's rate unverified and verified, and the
 * best settings; optionally write them as an aio config block. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/size.h"
#include "tools/nvme_bench_run.h"
#include "tools/cli.h"
#include "tools/machine_line.h"
#include "tools/options.h"

/* The command line: the grid to sweep and how. */
typedef struct bench_args {
    cli_size_list bs;
    cli_int_list qd, threads;
    bool modes[BENCH_MODES];
    size_t size, max_buffers;
    double seconds;
    strata_switch direct;
    long long seed; /* -1: the time */
    bool json;
    const char *config_out;
} bench_args;

static bool parse_modes(const char *text, void *dst)
{
    bool *modes = dst;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", text);
    memset(modes, 0, sizeof(bool) * BENCH_MODES);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int m = 0;
        while (m < BENCH_MODES && strcmp(tok, bench_mode_name((bench_mode)m)) != 0)
            m++;
        if (m == BENCH_MODES)
            return false;
        modes[m] = true;
    }
    return true;
}

static bool parse_direct(const char *text, void *dst)
{
    strata_switch *direct = dst;
    if (strcasecmp(text, "auto") == 0)
        *direct = STRATA_SWITCH_AUTO;
    else if (strcasecmp(text, "on") == 0 || strcasecmp(text, "true") == 0)
        *direct = STRATA_SWITCH_ON;
    else if (strcasecmp(text, "off") == 0 || strcasecmp(text, "false") == 0)
        *direct = STRATA_SWITCH_OFF;
    else
        return false;
    return true;
}

#define OPT(flag, kind, field, meta, text) CLI_OPTION(bench_args, flag, kind, field, 0, 0, meta, text)
static const cli_opt bench_opts[] = {
    {.name = "--size", .kind = CLI_SIZE, .offset = offsetof(bench_args, size), .lo = 8u << 20, .meta = "SIZE",
     .help = "total file size over all paths, {} (default 4GiB)", .hint = "write bytes or e.g. 4GiB"},
    {.name = "--bs", .kind = CLI_SIZE_LIST, .offset = offsetof(bench_args, bs), .lo = 4096, .align = 4096,
     .meta = "LIST", .help = "block sizes (default 128KiB,1MiB,8MiB)"},
    {.name = "--qd", .kind = CLI_INT_LIST, .offset = offsetof(bench_args, qd), .lo = 1, .hi = 4096, .meta = "LIST",
     .help = "queue depths per ring, each in {} (default 1,4,16,64)"},
    {.name = "--threads", .kind = CLI_INT_LIST, .offset = offsetof(bench_args, threads), .lo = 1, .hi = 64,
     .meta = "LIST", .help = "I/O threads, one ring each, each in {} (default 1,2)"},
    {.name = "--modes", .kind = CLI_CUSTOM, .offset = offsetof(bench_args, modes), .parse = parse_modes,
     .what = "a comma-separated list of write, read, rw", .meta = "LIST",
     .help = "write,read,rw (default all three; rw = concurrent read+write)"},
    {.name = "--seconds", .kind = CLI_REAL, .offset = offsetof(bench_args, seconds), .lo = 0, .hi = 1e6, .meta = "S",
     .what = "a time in seconds", .help = "time limit per pass, 0 = the whole file (default 1)"},
    {.name = "--direct", .kind = CLI_CUSTOM, .offset = offsetof(bench_args, direct), .parse = parse_direct,
     .what = "auto, on or off", .meta = "auto|on|off", .help = "O_DIRECT policy (default auto)"},
    {.name = "--max-buffers", .kind = CLI_SIZE, .offset = offsetof(bench_args, max_buffers), .meta = "SIZE",
     .help = "skip points needing more buffer memory (default 1GiB)", .hint = "write bytes or e.g. 1GiB"},
    {.name = "--seed", .kind = CLI_LL, .offset = offsetof(bench_args, seed), .lo = 0, .hi = 1e18, .meta = "N",
     .help = "pattern seed (default: time)"},
    OPT("--json", CLI_SWITCH, json, NULL, "print JSON instead of the table"),
    OPT("--write-config", CLI_TEXT, config_out, "FILE", "write the best settings as a DeepSpeed-style aio block"),
};
#undef OPT
static const cli_opt_group bench_groups[] = {CLI_GROUP(bench_opts)};
static const cli_spec bench_spec = {
    .command = "nvme-bench", .operands = "PATH [PATH...]", .groups = bench_groups, .ngroups = 1,
    .about = "Measures NVMe bandwidth on private files in each PATH (a directory; several are striped). A mode "
             "that reads runs twice per point: its reads timed only, then verified block by block."};

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void progress_bar(uint64_t done, uint64_t total, void *ctx)
{
    const char *label = ctx;
    if (!isatty(STDERR_FILENO) || total == 0)
        return;
    int width = 30, filled = (int)((double)done / (double)total * width);
    if (filled > width)
        filled = width;
    fprintf(stderr, "\r  %-44s [%-*.*s] %3d%%", label, width, filled, "##############################",
            (int)(100.0 * (double)done / (double)total));
    fflush(stderr);
}

static void clear_progress(void)
{
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\r%*s\r", 90, "");
}

static void print_header(const char *const *paths, int npaths, uint64_t size, const bench_args *g, bool is_direct,
                         uint64_t seed)
{
    char a[32];
    machine_line_print(stdout, "");
    printf("config:  paths");
    for (int i = 0; i < npaths; i++)
        printf(" %s", paths[i]);
    printf(", size %s, direct %s (%s), seconds per pass %g, seed %llu\n", size_format(size, a, sizeof a),
           g->direct == STRATA_SWITCH_ON ? "on" : g->direct == STRATA_SWITCH_OFF ? "off" : "auto",
           is_direct ? "O_DIRECT" : "buffered", g->seconds, (unsigned long long)seed);
    printf("grid:    bs");
    for (int i = 0; i < g->bs.n; i++)
        printf("%s%s", i ? "," : " ", size_format(g->bs.v[i], a, sizeof a));
    printf("; qd");
    for (int i = 0; i < g->qd.n; i++)
        printf("%s%d", i ? "," : " ", g->qd.v[i]);
    printf("; threads");
    for (int i = 0; i < g->threads.n; i++)
        printf("%s%d", i ? "," : " ", g->threads.v[i]);
    printf("; modes");
    for (int m = 0; m < BENCH_MODES; m++)
        if (g->modes[m])
            printf(" %s", bench_mode_name((bench_mode)m));
    printf("\ncolumns: GB/s with the reads timed only; verified: the same pass again, every 4 KiB block read checked "
           "against the pattern (#wrong); p50/p99/cpu of the first pass\n");
    printf("\n%-6s %9s %4s %4s %8s %8s %9s %9s %9s %7s %6s\n", "mode", "bs", "qd", "thr", "GB/s", "verified", "p50_us",
           "p99_us", "cpu_s/GB", "#wrong", "errors");
}

/* One row of the table: a mode's pass with its reads timed only (a write's, the only pass), and for a mode that
 * reads the same pass again verified (checked.verified is false where there is none). */
typedef struct bench_row {
    bench_result raw, checked;
} bench_row;

static uint64_t row_errors(const bench_row *r)
{
    return r->raw.errors + r->checked.errors;
}

static void print_row(const bench_row *row)
{
    const bench_result *r = &row->raw;
    char a[32], v[32] = "-";
    if (row->checked.verified)
        snprintf(v, sizeof v, "%.3f", row->checked.gbps);
    printf("%-6s %9s %4d %4d %8.3f %8s %9.0f %9.0f %9.3f %7llu %6llu\n", bench_mode_name(r->mode),
           size_format(r->block_size, a, sizeof a), r->queue_depth, r->threads, r->gbps, v, r->p50_us, r->p99_us,
           r->cpu_s_per_gb, (unsigned long long)row->checked.wrong, (unsigned long long)row_errors(row));
    fflush(stdout);
}

/* The first pass's figures, the verified pass's rate, time and CPU (null for a write), the wrong blocks and the
 * errors of both. */
static json_t *row_json(const bench_row *row)
{
    const bench_result *r = &row->raw, *c = &row->checked;
    json_t *o = json_pack("{s:s, s:I, s:i, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:s}", "mode",
                          bench_mode_name(r->mode), "block_size", (json_int_t)r->block_size, "queue_depth",
                          r->queue_depth, "threads", r->threads, "bytes", (json_int_t)r->bytes, "seconds", r->seconds,
                          "gbps", r->gbps, "p50_us", r->p50_us, "p99_us", r->p99_us, "cpu_s_per_gb", r->cpu_s_per_gb,
                          "wrong", (json_int_t)c->wrong, "errors", (json_int_t)row_errors(row), "first_error",
                          r->errors ? r->first_error : c->first_error);
    json_object_set_new(o, "gbps_verified", c->verified ? json_real(c->gbps) : json_null());
    json_object_set_new(o, "seconds_verified", c->verified ? json_real(c->seconds) : json_null());
    json_object_set_new(o, "cpu_s_per_gb_verified", c->verified ? json_real(c->cpu_s_per_gb) : json_null());
    return o;
}

static int write_config(const char *file, const bench_result *best)
{
    json_t *root = json_pack("{s:{s:I, s:i, s:i, s:b, s:b}}", "aio", "block_size", (json_int_t)best->block_size,
                             "queue_depth", best->queue_depth, "intra_op_parallelism", best->threads, "single_submit", 0,
                             "overlap_events", 1);
    int rc = json_dump_file(root, file, JSON_INDENT(2));
    json_decref(root);
    if (rc != 0) {
        fprintf(stderr, "strata nvme-bench: cannot write --write-config file \"%s\"\n", file);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* What the sweep found so far: the best result per mode, the best point (the highest mean over the modes), the
 * verification counts, and the rows of --json. */
typedef struct sweep {
    const bench_args *args;
    bench_files *bf;
    bench_row best[BENCH_MODES];
    bench_result best_point;
    double best_score;
    uint64_t wrong, errors, seed;
    json_t *rows;
    int point, points;
} sweep;

/* One pass of mode at cfg, verified or not, into *r and the sweep's counts; 0, or an exit code when it could not
 * run. */
static int sweep_pass(sweep *sw, const strata_aio_config *cfg, bench_mode mode, bool verify, bench_result *r)
{
    char label[96], a[32];
    snprintf(label, sizeof label, "%d/%d %s%s bs %s qd %d threads %d", sw->point, sw->points, bench_mode_name(mode),
             verify ? " verified" : "", size_format(cfg->block_size, a, sizeof a), cfg->queue_depth,
             cfg->intra_op_parallelism);
    if (!bench_files_direct(sw->bf))
        bench_drop_caches(sw->bf);
    strata_status st = bench_run(sw->bf, cfg, mode, verify, sw->args->seconds, &interrupted, progress_bar, label, r);
    clear_progress();
    if (st != STRATA_OK) {
        fprintf(stderr, "strata: %s\n", strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    if (r->errors)
        fprintf(stderr, "strata nvme-bench: %llu request(s) failed; first: %s\n", (unsigned long long)r->errors,
                r->first_error);
    sw->wrong += r->wrong;
    sw->errors += r->errors;
    return 0;
}

/* Every mode at one point of the grid: a mode that reads runs twice, timed only and then verified, so that the
 * check's cost on the clock shows as the difference. 0, or an exit code when a pass could not run. */
static int sweep_point(sweep *sw, const strata_aio_config *cfg)
{
    const bench_args *g = sw->args;
    double score = 0;
    int nmodes = 0;
    for (int m = 0; m < BENCH_MODES && !interrupted; m++) {
        if (!g->modes[m])
            continue;
        bench_row row = {0};
        int rc = sweep_pass(sw, cfg, (bench_mode)m, false, &row.raw);
        if (rc == 0 && bench_mode_reads((bench_mode)m) && !interrupted)
            rc = sweep_pass(sw, cfg, (bench_mode)m, true, &row.checked);
        if (rc)
            return rc;
        if (g->json)
            json_array_append_new(sw->rows, row_json(&row));
        else
            print_row(&row);
        if (row.raw.gbps > sw->best[m].raw.gbps)
            sw->best[m] = row;
        score += row.raw.gbps;
        nmodes++;
    }
    if (nmodes && score / nmodes > sw->best_score) {
        sw->best_score = score / nmodes;
        sw->best_point.block_size = cfg->block_size;
        sw->best_point.queue_depth = cfg->queue_depth;
        sw->best_point.threads = cfg->intra_op_parallelism;
    }
    return 0;
}

/* The grid, block size outermost; points that need more than --max-buffers are skipped. 0 or an exit code. */
static int sweep_grid(sweep *sw)
{
    const bench_args *g = sw->args;
    sw->points = g->bs.n * g->qd.n * g->threads.n;
    for (int ib = 0; ib < g->bs.n && !interrupted; ib++)
        for (int iq = 0; iq < g->qd.n && !interrupted; iq++)
            for (int it = 0; it < g->threads.n && !interrupted; it++) {
                sw->point++;
                strata_aio_config cfg;
                strata_aio_config_init(&cfg);
                cfg.block_size = g->bs.v[ib];
                cfg.queue_depth = g->qd.v[iq];
                cfg.intra_op_parallelism = g->threads.v[it];
                cfg.direct = g->direct;
                if (cfg.block_size * (size_t)cfg.queue_depth * (size_t)cfg.intra_op_parallelism > g->max_buffers) {
                    char a[32], b[32];
                    if (!g->json)
                        printf("%-6s %9s %4d %4d   skipped: needs more than --max-buffers %s of buffers\n", "-",
                               size_format(cfg.block_size, a, sizeof a), cfg.queue_depth, cfg.intra_op_parallelism,
                               size_format(g->max_buffers, b, sizeof b));
                    continue;
                }
                int rc = sweep_point(sw, &cfg);
                if (rc)
                    return rc;
            }
    return 0;
}

static void print_summary(sweep *sw)
{
    char a[32];
    if (sw->args->json) {
        json_t *root = json_pack("{s:o, s:{s:I, s:i, s:i, s:f}, s:I, s:I, s:b, s:I}", "results", sw->rows, "best",
                                 "block_size", (json_int_t)sw->best_point.block_size, "queue_depth",
                                 sw->best_point.queue_depth, "threads", sw->best_point.threads, "mean_gbps",
                                 sw->best_score, "wrong", (json_int_t)sw->wrong, "errors", (json_int_t)sw->errors,
                                 "interrupted", (int)interrupted, "seed", (json_int_t)sw->seed);
        sw->rows = NULL; /* the root took it */
        json_dumpf(root, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(root);
        return;
    }
    printf("\nbest: block_size %s, queue_depth %d, intra_op_parallelism %d (mean %.3f GB/s over the modes)\n",
           size_format(sw->best_point.block_size, a, sizeof a), sw->best_point.queue_depth, sw->best_point.threads,
           sw->best_score);
    for (int m = 0; m < BENCH_MODES; m++) {
        const bench_row *b = &sw->best[m];
        char v[48] = "";
        if (b->checked.verified)
            snprintf(v, sizeof v, " (verified %.3f)", b->checked.gbps);
        if (b->raw.gbps > 0)
            printf("  best %-5s %.3f GB/s%s at bs %s qd %d threads %d\n", bench_mode_name((bench_mode)m), b->raw.gbps,
                   v, size_format(b->raw.block_size, a, sizeof a), b->raw.queue_depth, b->raw.threads);
    }
    printf("#wrong %llu, errors %llu%s\n", (unsigned long long)sw->wrong, (unsigned long long)sw->errors,
           interrupted ? " (interrupted: partial results; files removed)" : "");
}

/* The command line into a and the paths; 0 or an exit code. */
static int parse_args(int argc, char **argv, bench_args *a, const char **paths, int *npaths)
{
    char err[1024];
    if (cli_parse(&bench_spec, argc, argv, a, paths, argc, npaths, err, sizeof err)) {
        fprintf(stderr, "strata nvme-bench: %s\n", err);
        return CLI_EXIT_USAGE;
    }
    if (*npaths < 1 || *npaths > STRATA_MAX_NVME_PATHS) {
        fprintf(stderr, "strata nvme-bench: give 1 to %d directories to measure (got %d)\n", STRATA_MAX_NVME_PATHS,
                *npaths);
        cli_print_help(&bench_spec, stderr);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

int cmd_nvme_bench(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        cli_print_help(&bench_spec, stdout);
        return CLI_EXIT_OK;
    }
    bench_args g = {.bs = {{128 << 10, 1 << 20, 8 << 20}, 3}, .qd = {{1, 4, 16, 64}, 4}, .threads = {{1, 2}, 2},
                    .modes = {true, true, true}, .size = (size_t)4 << 30, .max_buffers = (size_t)1 << 30,
                    .seconds = 1, .direct = STRATA_SWITCH_AUTO, .seed = -1};
    const char *paths[argc > 0 ? argc : 1];
    int npaths = 0;
    int rc = parse_args(argc, argv, &g, paths, &npaths);
    if (rc)
        return rc;
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    sweep sw = {.args = &g, .best_score = -1, .seed = g.seed >= 0 ? (uint64_t)g.seed : (uint64_t)time(NULL)};
    strata_status st = bench_files_create(paths, npaths, g.size, g.direct, sw.seed, progress_bar,
                                          "writing the test data", &sw.bf);
    clear_progress();
    if (st != STRATA_OK) {
        fprintf(stderr, "strata: %s\n", strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    if (!g.json)
        print_header(paths, npaths, bench_files_bytes(sw.bf), &g, bench_files_direct(sw.bf), sw.seed);
    sw.rows = json_array();
    rc = sweep_grid(&sw);
    bench_files_destroy(sw.bf);
    if (rc == 0)
        print_summary(&sw);
    json_decref(sw.rows);
    if (rc)
        return rc;
    rc = sw.wrong || sw.errors ? CLI_EXIT_FAIL : CLI_EXIT_OK;
    if (g.config_out && sw.best_score > 0 && write_config(g.config_out, &sw.best_point) != CLI_EXIT_OK)
        rc = CLI_EXIT_FAIL;
    return interrupted ? 130 : rc;
}
