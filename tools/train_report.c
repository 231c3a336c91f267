/* Progress line, JSONL log and summary of `strata train` (see train_report.h). */
#include "tools/train_report.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "base/stream.h"
#include "tools/train_msg.h"

#define TAIL_STEPS 10

const char *report_bytes(double bytes, char *buf, size_t len)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    snprintf(buf, len, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
    return buf;
}

static double ns_s(uint64_t ns)
{
    return (double)ns * 1e-9;
}

/* Decimals for a rate: a 3-billion-parameter model trains at a fraction of a token per second. */
static int rate_decimals(double rate)
{
    return rate < 10 ? 2 : rate < 100 ? 1 : 0;
}

/* The last line of the header: what this rank got of its host (engine/plan/node_share.h), rank 0's for a world. */
static void print_share(const strata_stats *s)
{
    char host[32], dev[32];
    printf("  budgets%s host %s, device %s; Adam %d thread%s on cores %s\n",
           s->world_size > 1 ? " (rank 0's; each rank has its own share of its host)" : "",
           report_bytes((double)s->host_budget_bytes, host, sizeof host),
           report_bytes((double)s->device_budget_bytes, dev, sizeof dev), s->adam_threads,
           s->adam_threads == 1 ? "" : "s", s->adam_cores[0] ? s->adam_cores : "unbound");
}

void report_begin(train_report *r, int64_t first_step, int64_t total_steps, int64_t tokens_per_step,
                  const strata_stats *start, bool quiet, FILE *jsonl, const char *jsonl_path)
{
    if (train_msg_root())
        print_share(start);
    memset(r, 0, sizeof *r);
    r->first_step = first_step;
    r->last_step = first_step - 1;
    r->total_steps = total_steps;
    r->tokens_per_step = tokens_per_step;
    r->start = *start;
    r->now = *start;
    r->quiet = quiet;
    /* mpirun hands its ranks a pseudo-terminal whatever its own stdout is (a log, a pipe): with more than one rank,
     * plain lines. */
    r->tty = start->world_size == 1 && isatty(STDOUT_FILENO);
    /* Plain lines (a log, a pipe) come about 20 times per run; a terminal line updates every step. */
    int64_t run = total_steps - first_step;
    r->print_every = r->tty ? 1 : (run > 20 ? run / 20 : 1);
    r->jsonl = jsonl;
    r->jsonl_path = jsonl_path;
    /* Unbuffered, each line is one write(2) of its own: a line that fails leaves nothing behind in the stream to be
     * written later, and what it did write can be cut off, so that the log stays whole lines. */
    if (jsonl)
        setvbuf(jsonl, NULL, _IONBF, 0);
}

/* The log failed at step (1-based; 0: when it was closed) with errno e: said once, now, and kept for the summary;
 * whole_lines: what the file holds ends with a whole line. */
static void log_failed(train_report *r, int64_t step, int e, bool whole_lines)
{
    char at[48] = "";
    if (step > 0)
        snprintf(at, sizeof at, " at step %lld", (long long)step);
    snprintf(r->jsonl_error, sizeof r->jsonl_error, "--log-jsonl \"%s\": writing failed%s: %s; the log is incomplete%s",
             r->jsonl_path, at, strerror(e), whole_lines ? " (whole lines of the steps before it)" : "");
    train_err("warning: %s%s", r->jsonl_error, step > 0 ? "; later steps are not logged, and the run will exit 1" : "");
}

bool report_close_log(train_report *r)
{
    if (!r->jsonl)
        return !r->jsonl_error[0];
    int e = stream_close_errno(r->jsonl);
    r->jsonl = NULL;
    if (e && !r->jsonl_error[0])
        log_failed(r, 0, e, false);
    return !r->jsonl_error[0];
}

static double gb(uint64_t now, uint64_t then)
{
    return (double)(now - then) * 1e-9;
}

/* One line of the --log-jsonl log: step's figures, and the links' bytes since prev. */
static void log_step(train_report *r, int64_t step, double loss, double lr, double step_wall_s,
                     const strata_stats *now, const strata_stats *prev, const strata_step_result *res)
{
    if (!r->jsonl || r->jsonl_error[0])
        return;
    long whole = ftell(r->jsonl); /* where the lines written so far end; -1 for a device such as /dev/full */
    double tokens_per_s = step_wall_s > 0 ? (double)r->tokens_per_step / step_wall_s : 0;
    errno = 0;
    int written = fprintf(r->jsonl,
            "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"tokens_per_s\":%.1f,\"tflops\":%.4f,\"step_s\":%.6f,"
            "\"stall_s\":%.6f,"
            "\"optimizer_s\":%.6f,\"skipped\":%s,\"loss_scale\":%.1f,\"nvme_to_host_bytes\":%llu,"
            "\"host_to_device_bytes\":%llu,\"device_to_host_bytes\":%llu,\"host_to_nvme_bytes\":%llu,"
            "\"rank\":%d,\"world_size\":%d,\"comm_bytes\":%llu,\"device_peak_bytes\":%zu,"
            "\"host_peak_bytes\":%zu,\"nvme_peak_bytes\":%zu,\"fetches\":%llu,\"host_cache_read_bytes\":%llu,"
            "\"host_cache_held_bytes\":%llu,"
            "\"act_offload_bytes\":%llu,\"act_restore_bytes\":%llu,\"act_stall_s\":%.6f,\"redone\":%s,"
            "\"redo_s\":%.6f,\"redo_nvme_bytes\":%llu,\"norm_pass_s\":%.6f}\n",
            (long long)step + 1, loss, lr, tokens_per_s, tokens_per_s * r->flops_per_token / 1e12,
            step_wall_s, ns_s(now->stall_ns - prev->stall_ns), ns_s(now->step_ns - prev->step_ns),
            res->skipped ? "true" : "false", res->loss_scale,
            (unsigned long long)(now->nvme_to_host_bytes - prev->nvme_to_host_bytes),
            (unsigned long long)(now->host_to_device_bytes - prev->host_to_device_bytes),
            (unsigned long long)(now->device_to_host_bytes - prev->device_to_host_bytes),
            (unsigned long long)(now->host_to_nvme_bytes - prev->host_to_nvme_bytes), now->rank, now->world_size,
            (unsigned long long)(now->comm_bytes - prev->comm_bytes), now->device_peak_bytes, now->host_peak_bytes,
            now->nvme_peak_bytes, (unsigned long long)(now->fetches - prev->fetches),
            (unsigned long long)(now->host_cache_read_bytes - prev->host_cache_read_bytes),
            (unsigned long long)(now->host_cache_held_bytes - prev->host_cache_held_bytes),
            (unsigned long long)(now->act_offload_bytes - prev->act_offload_bytes),
            (unsigned long long)(now->act_restore_bytes - prev->act_restore_bytes),
            ns_s(now->act_stall_ns - prev->act_stall_ns), now->steps_redone > prev->steps_redone ? "true" : "false",
            ns_s(now->redo_ns - prev->redo_ns), (unsigned long long)(now->redo_nvme_bytes - prev->redo_nvme_bytes),
            ns_s(now->norm_pass_ns - prev->norm_pass_ns));
    /* Unbuffered, the write fails in fprintf itself, which leaves errno saying why. */
    int e = written < 0 ? (errno ? errno : EIO) : stream_flush_errno(r->jsonl);
    if (e) {
        /* A full disk takes part of a line: cut it off, so that the log is whole lines (a device cannot be cut). */
        bool cut = whole >= 0 && ftruncate(fileno(r->jsonl), whole) == 0;
        log_failed(r, step + 1, e, cut);
    }
}

void report_step(train_report *r, int64_t step, double loss, double lr, double step_wall_s, double compute_s,
                 const strata_stats *now, const strata_step_result *res)
{
    strata_stats prev = r->now;
    if (step == r->first_step)
        r->first_loss = loss;
    r->last_loss = loss;
    r->last_step = step;
    if (r->total_steps - step <= TAIL_STEPS) {
        r->tail_loss_sum += loss;
        r->tail_count++;
    }
    r->wall_s += step_wall_s;
    r->compute_s += compute_s;
    r->now = *now;
    int64_t done = step - r->first_step + 1;
    double tps = r->wall_s > 0 ? (double)(done * r->tokens_per_step) / r->wall_s : 0;
    double stall = ns_s(now->stall_ns - r->start.stall_ns);
    double eta = r->wall_s / (double)done * (double)(r->total_steps - step - 1);
    log_step(r, step, loss, lr, step_wall_s, now, &prev, res);
    /* Plain lines also come at least every 10 s, so a long run in a log shows it is alive. */
    bool due = done % r->print_every == 0 || step + 1 == r->total_steps || r->wall_s - r->last_print_s >= 10.0;
    if (r->quiet || !due)
        return;
    r->last_print_s = r->wall_s;
    const strata_stats *s0 = &r->start;
    printf("%sstep %lld/%lld  loss %.4f  lr %.2e  %.*f tok/s  stall %.1f%%  GB nvme>host %.2f host>dev %.2f "
           "dev>host %.2f host>nvme %.2f  ETA %.0fs%s",
           r->tty ? "\r" : "", (long long)step + 1, (long long)r->total_steps, loss, lr, rate_decimals(tps), tps,
           r->wall_s > 0 ? 100.0 * stall / r->wall_s : 0, gb(now->nvme_to_host_bytes, s0->nvme_to_host_bytes),
           gb(now->host_to_device_bytes, s0->host_to_device_bytes),
           gb(now->device_to_host_bytes, s0->device_to_host_bytes), gb(now->host_to_nvme_bytes, s0->host_to_nvme_bytes),
           eta, r->tty ? "\033[K" : "\n");
    fflush(stdout);
}

/* A world of ranks: the moved and peak lines above are rank 0's own (each rank holds its part of the model
 * state); the loss is the world's mean, tokens and throughput count every rank's. */
static void report_ranks(const train_report *r)
{
    int64_t steps = r->last_step - r->first_step + 1;
    uint64_t comm = r->now.comm_bytes - r->start.comm_bytes;
    char x[32], y[32];
    printf("  ranks       %d (MPI): moved and peak are rank 0's, per rank; loss, tokens and throughput are the "
           "world's\n", r->now.world_size);
    printf("  comm        %s by rank 0's collectives, %s per step\n", report_bytes((double)comm, x, sizeof x),
           report_bytes(steps > 0 ? (double)comm / (double)steps : 0, y, sizeof y));
}

/* The summary's first lines: steps and tokens, the loss, the throughput and where the time went. */
static void summary_totals(const train_report *r, int64_t steps)
{
    const strata_stats *a = &r->start, *b = &r->now;
    double stall = ns_s(b->stall_ns - a->stall_ns), opt = ns_s(b->step_ns - a->step_ns);
    double compute = r->compute_s - stall, wall = r->wall_s > 0 ? r->wall_s : 1e-9;
    double alloc = ns_s(b->finalize_alloc_ns), init = ns_s(b->finalize_init_ns);
    double rest = r->startup_s - alloc - init; /* creating the engine (a GPU's context), registering, the model */
    char pinned[32];
    printf("summary: %lld steps, %lld tokens in %.1f s, after %.1f s of start-up (plan and allocation %.1f s, %s of it "
           "pinned; initial state %.1f s; the rest %.1f s)\n", (long long)steps,
           (long long)(steps * r->tokens_per_step), r->wall_s, r->startup_s, alloc,
           report_bytes((double)b->pinned_host_bytes, pinned, sizeof pinned), init,
           rest > 0 ? rest : 0.0);
    if (steps > 0) {
        printf("  loss        %.4f -> %.4f (first -> last step", r->first_loss, r->last_loss);
        if (r->tail_count > 1)
            printf("; mean of the last %d: %.4f", r->tail_count, r->tail_loss_sum / r->tail_count);
        printf(")\n");
    }
    double tokens_per_s = (double)(steps * r->tokens_per_step) / wall;
    printf("  throughput  %.*f tokens/s", rate_decimals(tokens_per_s), tokens_per_s);
    if (r->flops_per_token > 0)
        printf(", %.3g TFLOPS (model FLOPs: 6 x parameters + 12 x layers x seq x hidden per token)",
               tokens_per_s * r->flops_per_token / 1e12);
    printf("\n");
    printf("  time        compute %.2f s (%.0f%%), stall %.2f s (%.0f%%), optimizer step %.2f s (%.0f%%)\n", compute,
           100 * compute / wall, stall, 100 * stall / wall, opt, 100 * opt / wall);
}

/* The bytes moved between the tiers, the host cache's and the activations' share, the fetches. */
static void summary_traffic(const train_report *r, int64_t steps)
{
    const strata_stats *a = &r->start, *b = &r->now;
    char x[32], y[32], z[32], w[32];
    printf("  moved       nvme->host %s, host->device %s, device->host %s, host->nvme %s\n",
           report_bytes((double)(b->nvme_to_host_bytes - a->nvme_to_host_bytes), x, sizeof x),
           report_bytes((double)(b->host_to_device_bytes - a->host_to_device_bytes), y, sizeof y),
           report_bytes((double)(b->device_to_host_bytes - a->device_to_host_bytes), z, sizeof z),
           report_bytes((double)(b->host_to_nvme_bytes - a->host_to_nvme_bytes), w, sizeof w));
    if (b->host_cache_bytes)
        printf("  host cache  %s mirrored of NVMe-homed state; it served %s in %llu reads and held %s of writes the "
               "drive did not have to take\n",
               report_bytes((double)b->host_cache_bytes, x, sizeof x),
               report_bytes((double)(b->host_cache_read_bytes - a->host_cache_read_bytes), y, sizeof y),
               (unsigned long long)(b->host_cache_hits - a->host_cache_hits),
               report_bytes((double)(b->host_cache_held_bytes - a->host_cache_held_bytes), z, sizeof z));
    if (b->act_pushes)
        printf("  activations %llu offloaded: %s off the device and %s back, at most %s kept and %s restored on the "
               "device at once; backward waited %.2f s for them\n",
               (unsigned long long)(b->act_pushes - a->act_pushes),
               report_bytes((double)(b->act_offload_bytes - a->act_offload_bytes), x, sizeof x),
               report_bytes((double)(b->act_restore_bytes - a->act_restore_bytes), y, sizeof y),
               report_bytes((double)b->act_kept_peak_bytes, z, sizeof z),
               report_bytes((double)b->act_device_peak_bytes, w, sizeof w), ns_s(b->act_stall_ns - a->act_stall_ns));
    if (r->speculating) {
        uint64_t redone = b->steps_redone - a->steps_redone;
        printf("  redone      %llu of %lld steps (%.0f%%): gradient clipping triggered after the updates in backward, "
               "which ran again clipped in %.2f s moving %s of NVMe\n", (unsigned long long)redone, (long long)steps,
               steps > 0 ? 100.0 * (double)redone / (double)steps : 0.0, ns_s(b->redo_ns - a->redo_ns),
               report_bytes((double)(b->redo_nvme_bytes - a->redo_nvme_bytes), x, sizeof x));
    }
    uint64_t passes = b->norm_passes - a->norm_passes;
    if (passes)
        printf("  norm pass   %llu of %lld steps measured the gradient norm first, with one more forward and "
               "backward: %.2f s\n", (unsigned long long)passes, (long long)steps,
               ns_s(b->norm_pass_ns - a->norm_pass_ns));
    uint64_t fetches = b->fetches - a->fetches;
    printf("  fetches     %llu (%.1f per step), %llu found resident or in flight\n", (unsigned long long)fetches,
           steps > 0 ? (double)fetches / (double)steps : 0.0, (unsigned long long)(b->prefetch_hits - a->prefetch_hits));
}

/* The peak bytes per tier, against the budgets where there are any. */
static void summary_peaks(const train_report *r)
{
    const strata_stats *b = &r->now;
    char x[32], y[32], z[32], w[32];
    char budget_dev[48] = "", budget_host[48] = "";
    if (b->device_budget_bytes)
        snprintf(budget_dev, sizeof budget_dev, " of %s", report_bytes((double)b->device_budget_bytes, x, sizeof x));
    if (b->host_budget_bytes)
        snprintf(budget_host, sizeof budget_host, " of %s", report_bytes((double)b->host_budget_bytes, x, sizeof x));
    printf("  peak        device %s%s, host %s%s, nvme %s\n", report_bytes((double)b->device_peak_bytes, y, sizeof y),
           budget_dev, report_bytes((double)b->host_peak_bytes, z, sizeof z), budget_host,
           report_bytes((double)b->nvme_peak_bytes, w, sizeof w));
}

void report_summary(train_report *r, const char *trace_path, const char *trace_error)
{
    if (r->tty && !r->quiet)
        printf("\n");
    int64_t steps = r->last_step - r->first_step + 1;
    summary_totals(r, steps);
    summary_traffic(r, steps);
    summary_peaks(r);
    if (r->now.world_size > 1)
        report_ranks(r);
    /* A file that failed is named as failed, never offered to open. */
    if (trace_error && trace_error[0])
        printf("  trace       FAILED: %s\n", trace_error);
    else if (trace_path && trace_path[0])
        printf("  trace       %s — open it at https://ui.perfetto.dev (Open trace file) or in chrome://tracing\n",
               trace_path);
    if (r->jsonl_error[0])
        printf("  log         FAILED: %s\n", r->jsonl_error);
    fflush(stdout);
}
