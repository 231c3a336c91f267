/*
 * b_stall: does prefetching hide NVMe behind compute? A synthetic trainer streams every module's
 * parameters from NVMe and "computes" for a fixed time per module (a busy loop that reads the
 * parameters, so the data is really used). When the drive can deliver a module within its compute
 * time, the trainer should almost never wait: the stall share is stall time / forward+backward time.
 * The host cache is off (strata.host_cache = false, default on): with it the fetches read RAM, not the drive,
 * and the figure would say nothing about hiding NVMe. The run fails if any fetch was served from the cache.
 *
 *   b_stall --path DIR [--modules N] [--module-mib M] [--compute-ms C] [--steps S] [--json]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "strata.h"
#include "tools/machine_line.h"

static void spin_compute(const uint16_t *w, size_t n, double ms, volatile uint32_t *sink)
{
    uint64_t end = now_ns() + (uint64_t)(ms * 1e6);
    uint32_t acc = 0;
    size_t i = 0;
    while (now_ns() < end) {
        for (int k = 0; k < 4096; k++, i = (i + 64) % n)
            acc += w[i];
    }
    *sink += acc;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int modules = 12, steps = 4;
    double module_mib = 16, compute_ms = 30;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) { json = true; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "b_stall: %s needs a value\n", argv[i]); return 2; }
        const char *v = argv[++i];
        if (strcmp(argv[i - 1], "--path") == 0) path = v;
        else if (strcmp(argv[i - 1], "--modules") == 0) modules = atoi(v);
        else if (strcmp(argv[i - 1], "--module-mib") == 0) module_mib = atof(v);
        else if (strcmp(argv[i - 1], "--compute-ms") == 0) compute_ms = atof(v);
        else if (strcmp(argv[i - 1], "--steps") == 0) steps = atoi(v);
        else { fprintf(stderr, "b_stall: unknown option %s\n", argv[i - 1]); return 2; }
    }
    if (!path || modules < 2 || module_mib <= 0 || compute_ms < 0 || steps < 2) {
        fprintf(stderr, "usage: b_stall --path DIR [--modules N>=2] [--module-mib M] [--compute-ms C] [--steps S>=2] [--json]\n");
        return 2;
    }
    size_t numel = (size_t)(module_mib * 1048576 / 2);
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.param_dtype = STRATA_DTYPE_BF16;
    c.offload_param.device = STRATA_TIER_NVME;
    snprintf(c.offload_param.nvme_path[0], STRATA_PATH_BYTES, "%s", path);
    c.offload_param.nvme_path_count = 1;
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.host_cache = false; /* every fetch reads the drive */
    c.prefetch_bytes = 3 * numel * 2;           /* three modules ahead */
    c.max_live_bytes = 6 * numel * 2;
    c.device_budget_bytes = 10 * numel * 2 + (16u << 20);
    FILE *hdr = json ? stderr : stdout;
    machine_line_print(hdr, "");
    fprintf(hdr, "config:  %d modules x %.0f MiB bf16 on NVMe (%s), %.1f ms compute per module, prefetch 3 modules, "
            "%d steps (first step records the order), host cache off (strata.host_cache = false)\n\n", modules, module_mib, path, compute_ms, steps);

    strata_engine *e = NULL;
    strata_module_id *mods = calloc((size_t)modules, sizeof *mods);
    strata_param_id *ps = calloc((size_t)modules, sizeof *ps);
    strata_status st = strata_engine_create(&c, &e);
    for (int m = 0; m < modules && st == STRATA_OK; m++) {
        char name[32];
        snprintf(name, sizeof name, "block%d", m);
        st = strata_module_add(e, name, &mods[m]);
        if (st == STRATA_OK)
            st = strata_param_add(e, mods[m], "w", numel, NULL, NULL, &ps[m]);
    }
    if (st == STRATA_OK)
        st = strata_engine_finalize(e);
    volatile uint32_t sink = 0;
    uint64_t measured_ns = 0, stall_before = 0, stall_prev = 0, bytes_before = 0;
    strata_stats s = {0};
    if (!json && st == STRATA_OK)
        printf("%-5s %10s %10s %8s %12s\n", "STEP", "FB_S", "STALL_S", "STALL%", "NVME_GB/S");
    for (int step = 0; step < steps && st == STRATA_OK; step++) {
        uint64_t t0 = now_ns();
        for (int pass = 0; pass < 2 && st == STRATA_OK; pass++)
            for (int k = 0; k < modules && st == STRATA_OK; k++) {
                int m = pass == 0 ? k : modules - 1 - k;
                if ((st = strata_fetch(e, mods[m])) != STRATA_OK)
                    break;
                spin_compute(strata_param_data(e, ps[m]), numel, compute_ms, &sink);
                if (pass == 1) {
                    void *g = strata_grad_data(e, ps[m]);
                    if (!g) { st = STRATA_ESTATE; break; }
                    if ((st = strata_grads_ready(e, mods[m])) != STRATA_OK)
                        break;
                }
                st = strata_release(e, mods[m]);
            }
        uint64_t fb = now_ns() - t0;
        if (st == STRATA_OK)
            st = strata_step(e, NULL, NULL);
        strata_stats_get(e, &s);
        double stall = (s.stall_ns - (step ? stall_prev : 0)) / 1e9;
        stall_prev = s.stall_ns;
        double gbs = (s.nvme_to_host_bytes - bytes_before) / (fb / 1e9) / 1e9;
        if (!json)
            printf("%-5d %10.3f %10.3f %7.1f%% %12.2f\n", step + 1, fb / 1e9, stall, 100 * stall / (fb / 1e9), gbs);
        /* The first step records the order and cannot prefetch: measure from the second on. */
        if (step == 0)
            stall_before = s.stall_ns;
        else
            measured_ns += fb;
        bytes_before = s.nvme_to_host_bytes;
    }
    if (st != STRATA_OK) {
        fprintf(stderr, "b_stall: %s: %s\n", strata_status_name(st), strata_last_error(e));
        strata_engine_destroy(e);
        return 1;
    }
    if (s.host_cache_hits) {
        fprintf(stderr, "b_stall: %llu fetches were served by the host cache, which this benchmark turns off\n",
                (unsigned long long)s.host_cache_hits);
        strata_engine_destroy(e);
        return 1;
    }
    double share = (double)(s.stall_ns - stall_before) / (double)measured_ns;
    if (json)
        printf("{\"bench\":\"stall\",\"modules\":%d,\"module_mib\":%.1f,\"compute_ms\":%.2f,\"steps\":%d,"
               "\"stall_share\":%.4f,\"prefetch_hits\":%llu,\"fetches\":%llu,\"host_cache\":false,\"nvme_read_bytes\":%llu}\n",
               modules, module_mib, compute_ms, steps, share, (unsigned long long)s.prefetch_hits,
               (unsigned long long)s.fetches, (unsigned long long)s.nvme_to_host_bytes);
    else
        printf("\nsteps 2..%d: stall %.1f%% of forward+backward time; %llu of %llu fetches found their module "
               "prefetched\n", steps, 100 * share, (unsigned long long)s.prefetch_hits, (unsigned long long)s.fetches);
    strata_engine_destroy(e);
    free(mods);
    free(ps);
    return 0;
}
