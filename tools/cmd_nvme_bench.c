/* `strata nvme-bench PATH...`: sweep block size x queue depth x I/O threads over write, read and
 * concurrent read+write; print a verified table and the best settings; optionally write them as
 * an aio config block. */
#include <getopt.h>
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

#define MAX_GRID 16

typedef struct grid {
    size_t bs[MAX_GRID];
    int nbs;
    int qd[MAX_GRID];
    int nqd;
    int threads[MAX_GRID];
    int nthreads;
    bool modes[BENCH_MODES];
} grid;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata nvme-bench PATH [PATH...] [options]\n"
            "  Measures NVMe bandwidth on private files in each PATH (a directory; several are striped).\n"
            "  --size SIZE          total file size over all paths (default 4GiB)\n"
            "  --bs LIST            block sizes (default 128KiB,1MiB,8MiB)\n"
            "  --qd LIST            queue depths per ring (default 1,4,16,64)\n"
            "  --threads LIST       I/O threads, one ring each (default 1,2)\n"
            "  --modes LIST         write,read,rw (default all three; rw = concurrent read+write)\n"
            "  --seconds S          time limit per pass, 0 = the whole file (default 1)\n"
            "  --direct auto|on|off O_DIRECT policy (default auto)\n"
            "  --max-buffers SIZE   skip points needing more buffer memory (default 1GiB)\n"
            "  --seed N             pattern seed (default: time)\n"
            "  --json               print JSON instead of the table\n"
            "  --write-config FILE  write the best settings as a DeepSpeed-style aio block\n");
}

static bool parse_sizes(const char *text, size_t *out, int *n)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    *n = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_GRID || !size_parse(tok, &out[*n]) || out[*n] % 4096 || out[*n] == 0)
            return false;
        (*n)++;
    }
    return *n > 0;
}

static bool parse_ints(const char *text, int *out, int *n, int lo, int hi)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    *n = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*n == MAX_GRID || *end || v < lo || v > hi)
            return false;
        out[(*n)++] = (int)v;
    }
    return *n > 0;
}

static bool parse_modes(const char *text, bool *modes)
{
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

static void print_header(const char *const *paths, int npaths, uint64_t size, const grid *g, double seconds,
                         strata_switch direct, bool is_direct, uint64_t seed)
{
    char a[32];
    machine_line_print(stdout, "");
    printf("config:  paths");
    for (int i = 0; i < npaths; i++)
        printf(" %s", paths[i]);
    printf(", size %s, direct %s (%s), seconds per pass %g, seed %llu\n", size_format(size, a, sizeof a),
           direct == STRATA_SWITCH_ON ? "on" : direct == STRATA_SWITCH_OFF ? "off" : "auto",
           is_direct ? "O_DIRECT" : "buffered", seconds, (unsigned long long)seed);
    printf("grid:    bs");
    for (int i = 0; i < g->nbs; i++)
        printf("%s%s", i ? "," : " ", size_format(g->bs[i], a, sizeof a));
    printf("; qd");
    for (int i = 0; i < g->nqd; i++)
        printf("%s%d", i ? "," : " ", g->qd[i]);
    printf("; threads");
    for (int i = 0; i < g->nthreads; i++)
        printf("%s%d", i ? "," : " ", g->threads[i]);
    printf("; modes");
    for (int m = 0; m < BENCH_MODES; m++)
        if (g->modes[m])
            printf(" %s", bench_mode_name((bench_mode)m));
    printf("\n\n%-6s %9s %4s %4s %8s %9s %9s %9s %7s %6s\n", "mode", "bs", "qd", "thr", "GB/s", "p50_us", "p99_us",
           "cpu_s/GB", "#wrong", "errors");
}

static void print_row(const bench_result *r)
{
    char a[32];
    printf("%-6s %9s %4d %4d %8.3f %9.0f %9.0f %9.3f %7llu %6llu\n", bench_mode_name(r->mode),
           size_format(r->block_size, a, sizeof a), r->queue_depth, r->threads, r->gbps, r->p50_us, r->p99_us,
           r->cpu_s_per_gb, (unsigned long long)r->wrong, (unsigned long long)r->errors);
    fflush(stdout);
}

static json_t *result_json(const bench_result *r)
{
    return json_pack("{s:s, s:I, s:i, s:i, s:I, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:s}", "mode",
                     bench_mode_name(r->mode), "block_size", (json_int_t)r->block_size, "queue_depth", r->queue_depth,
                     "threads", r->threads, "bytes", (json_int_t)r->bytes, "seconds", r->seconds, "gbps", r->gbps,
                     "p50_us", r->p50_us, "p99_us", r->p99_us, "cpu_s_per_gb", r->cpu_s_per_gb, "wrong",
                     (json_int_t)r->wrong, "errors", (json_int_t)r->errors, "first_error", r->first_error);
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

int cmd_nvme_bench(int argc, char **argv)
{
    grid g = {.bs = {128 << 10, 1 << 20, 8 << 20}, .nbs = 3, .qd = {1, 4, 16, 64}, .nqd = 4, .threads = {1, 2},
              .nthreads = 2, .modes = {true, true, true}};
    size_t size = (size_t)4 << 30, max_buffers = (size_t)1 << 30;
    double seconds = 1;
    strata_switch direct = STRATA_SWITCH_AUTO;
    uint64_t seed = (uint64_t)time(NULL);
    bool as_json = false;
    const char *config_out = NULL;
    static const struct option opts[] = {
        {"size", required_argument, 0, 's'},    {"bs", required_argument, 0, 'b'},
        {"qd", required_argument, 0, 'q'},      {"threads", required_argument, 0, 't'},
        {"modes", required_argument, 0, 'm'},   {"seconds", required_argument, 0, 'S'},
        {"direct", required_argument, 0, 'd'},  {"max-buffers", required_argument, 0, 'B'},
        {"seed", required_argument, 0, 'r'},    {"json", no_argument, 0, 'j'},
        {"write-config", required_argument, 0, 'w'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    optind = 1;
    for (int c, li = 0; (c = getopt_long(argc, argv, "h", opts, &li)) != -1;) {
        bool ok = true;
        switch (c) {
        case 's': ok = size_parse(optarg, &size) && size >= (8u << 20); break;
        case 'b': ok = parse_sizes(optarg, g.bs, &g.nbs); break;
        case 'q': ok = parse_ints(optarg, g.qd, &g.nqd, 1, 4096); break;
        case 't': ok = parse_ints(optarg, g.threads, &g.nthreads, 1, 64); break;
        case 'm': ok = parse_modes(optarg, g.modes); break;
        case 'S': seconds = atof(optarg); ok = seconds >= 0; break;
        case 'B': ok = size_parse(optarg, &max_buffers); break;
        case 'r': seed = strtoull(optarg, NULL, 0); break;
        case 'j': as_json = true; break;
        case 'w': config_out = optarg; break;
        case 'd':
            if (strcasecmp(optarg, "auto") == 0) direct = STRATA_SWITCH_AUTO;
            else if (strcasecmp(optarg, "on") == 0 || strcasecmp(optarg, "true") == 0) direct = STRATA_SWITCH_ON;
            else if (strcasecmp(optarg, "off") == 0 || strcasecmp(optarg, "false") == 0) direct = STRATA_SWITCH_OFF;
            else ok = false;
            break;
        case 'h': usage(stdout); return CLI_EXIT_OK;
        default: usage(stderr); return CLI_EXIT_USAGE;
        }
        if (!ok) {
            fprintf(stderr, "strata nvme-bench: bad value \"%s\" for --%s (see --help for the allowed values; "
                            "sizes are multiples of 4KiB, --size at least 8MiB)\n", optarg, opts[li].name);
            return CLI_EXIT_USAGE;
        }
    }
    int npaths = argc - optind;
    if (npaths < 1 || npaths > STRATA_MAX_NVME_PATHS) {
        fprintf(stderr, "strata nvme-bench: give 1 to %d directories to measure (got %d)\n", STRATA_MAX_NVME_PATHS,
                npaths);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *const *paths = (const char *const *)argv + optind;
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    bench_files *bf = NULL;
    strata_status st = bench_files_create(paths, npaths, size, direct, seed, progress_bar, "writing the test data", &bf);
    clear_progress();
    if (st != STRATA_OK) {
        fprintf(stderr, "strata: %s\n", strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    if (!as_json)
        print_header(paths, npaths, bench_files_bytes(bf), &g, seconds, direct, bench_files_direct(bf), seed);
    json_t *rows = json_array();
    bench_result best[BENCH_MODES] = {0}, best_point = {0};
    double best_score = -1;
    uint64_t wrong = 0, errors = 0;
    int points = g.nbs * g.nqd * g.nthreads, point = 0;
    for (int ib = 0; ib < g.nbs && !interrupted; ib++)
        for (int iq = 0; iq < g.nqd && !interrupted; iq++)
            for (int it = 0; it < g.nthreads && !interrupted; it++) {
                point++;
                strata_aio_config cfg;
                strata_aio_config_init(&cfg);
                cfg.block_size = g.bs[ib];
                cfg.queue_depth = g.qd[iq];
                cfg.intra_op_parallelism = g.threads[it];
                cfg.direct = direct;
                if (g.bs[ib] * (size_t)g.qd[iq] * (size_t)g.threads[it] > max_buffers) {
                    char a[32];
                    if (!as_json)
                        printf("%-6s %9s %4d %4d   skipped: needs more than --max-buffers %s of buffers\n", "-",
                               size_format(g.bs[ib], a, sizeof a), g.qd[iq], g.threads[it],
                               size_format(max_buffers, a, sizeof a));
                    continue;
                }
                double score = 0;
                int nmodes = 0;
                for (int m = 0; m < BENCH_MODES && !interrupted; m++) {
                    if (!g.modes[m])
                        continue;
                    char label[96], a[32];
                    snprintf(label, sizeof label, "%d/%d %s bs %s qd %d threads %d", point, points,
                             bench_mode_name((bench_mode)m), size_format(g.bs[ib], a, sizeof a), g.qd[iq],
                             g.threads[it]);
                    if (!bench_files_direct(bf))
                        bench_drop_caches(bf);
                    bench_result r;
                    st = bench_run(bf, &cfg, (bench_mode)m, seconds, &interrupted, progress_bar, label, &r);
                    clear_progress();
                    if (st != STRATA_OK) {
                        fprintf(stderr, "strata: %s\n", strata_last_error(NULL));
                        json_decref(rows);
                        bench_files_destroy(bf);
                        return CLI_EXIT_FAIL;
                    }
                    if (r.errors)
                        fprintf(stderr, "strata nvme-bench: %llu request(s) failed; first: %s\n",
                                (unsigned long long)r.errors, r.first_error);
                    wrong += r.wrong;
                    errors += r.errors;
                    if (as_json)
                        json_array_append_new(rows, result_json(&r));
                    else
                        print_row(&r);
                    if (r.gbps > best[m].gbps)
                        best[m] = r;
                    score += r.gbps;
                    nmodes++;
                }
                if (nmodes && score / nmodes > best_score) {
                    best_score = score / nmodes;
                    best_point.block_size = cfg.block_size;
                    best_point.queue_depth = cfg.queue_depth;
                    best_point.threads = cfg.intra_op_parallelism;
                }
            }
    bench_files_destroy(bf);
    char a[32];
    if (as_json) {
        json_t *root = json_pack("{s:o, s:{s:I, s:i, s:i, s:f}, s:I, s:I, s:b, s:I}", "results", rows, "best",
                                 "block_size", (json_int_t)best_point.block_size, "queue_depth",
                                 best_point.queue_depth, "threads", best_point.threads, "mean_gbps", best_score,
                                 "wrong", (json_int_t)wrong, "errors", (json_int_t)errors, "interrupted",
                                 (int)interrupted, "seed", (json_int_t)seed);
        json_dumpf(root, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(root);
    } else {
        json_decref(rows);
        printf("\nbest: block_size %s, queue_depth %d, intra_op_parallelism %d (mean %.3f GB/s over the modes)\n",
               size_format(best_point.block_size, a, sizeof a), best_point.queue_depth, best_point.threads, best_score);
        for (int m = 0; m < BENCH_MODES; m++)
            if (best[m].gbps > 0)
                printf("  best %-5s %.3f GB/s at bs %s qd %d threads %d\n", bench_mode_name((bench_mode)m),
                       best[m].gbps, size_format(best[m].block_size, a, sizeof a), best[m].queue_depth,
                       best[m].threads);
        printf("#wrong %llu, errors %llu%s\n", (unsigned long long)wrong, (unsigned long long)errors,
               interrupted ? " (interrupted: partial results; files removed)" : "");
    }
    int rc = wrong || errors ? CLI_EXIT_FAIL : CLI_EXIT_OK;
    if (config_out && best_score > 0 && write_config(config_out, &best_point) != CLI_EXIT_OK)
        rc = CLI_EXIT_FAIL;
    return interrupted ? 130 : rc;
}
