/*
 * strata.gradient_reduction: with "mean" the optimizer sees the ranks' summed gradients divided by the number of
 * ranks (DeepSpeed's rule), with "sum" (the default) the sum, at every stage.
 *
 * Oracles: (1) the reported global norm (gradient_clipping set so that it is computed) against the norm worked out
 * from the constant gradients each rank hands over: rank r hands over r + 1 everywhere, so the sum is
 * N(N+1)/2 per element; (2) where 1/N is exact in floating point (N a power of two), "mean" ends with the weights,
 * bit for bit, of "sum" whose trainer divides its own gradients by N first. And the step's check that every rank
 * agrees is exercised on every step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"
#include "testlib.h"

static strata_comm *world;
static int rank, size;

/* One step: every module fetched, its gradients set to value everywhere, handed over, released; returns the norm. */
static double step_with(strata_engine *e, const synth_opts *o, float value, size_t *numel_out)
{
    size_t numel = 0;
    for (int l = 0; l < o->layers; l++) {
        strata_module_id m = (strata_module_id)l;
        T_OK(strata_fetch(e, m));
        for (int k = 0; k < 2; k++) {
            strata_param_id p = (strata_param_id)(2 * l + k);
            size_t n = k ? (size_t)o->width[l + 1] : (size_t)o->width[l + 1] * o->width[l];
            float *g = strata_grad_data(e, p);
            T_CHECK(g != NULL, "strata_grad_data(%u): %s", p, strata_last_error(e));
            for (size_t i = 0; g && i < n; i++)
                g[i] = value;
            numel += n;
        }
        T_OK(strata_grads_ready(e, m));
        T_OK(strata_release(e, m));
    }
    strata_step_result r;
    T_OK(strata_step(e, NULL, &r));
    *numel_out = numel;
    return r.grad_norm;
}

/* The master weights of every parameter, concatenated. */
static float *weights(strata_engine *e, const synth_opts *o, size_t numel)
{
    float *w = calloc(numel, sizeof *w);
    size_t pos = 0;
    for (int id = 0; w && id < 2 * o->layers; id++) {
        size_t n = id % 2 ? (size_t)o->width[id / 2 + 1] : (size_t)o->width[id / 2 + 1] * o->width[id / 2];
        T_OK(strata_param_read_master(e, (strata_param_id)id, 0, n, w + pos));
        pos += n;
    }
    return w;
}

static void run_stage(int stage, uint64_t seed)
{
    synth_opts o;
    synth_defaults(&o, seed);
    o.comm = world;
    double sum_per_element = size * (size + 1) / 2.0;
    float *w[2] = {NULL, NULL};
    size_t numel = 0;
    for (int mean = 0; mean < 2; mean++) {
        strata_config cfg = synth_config(STRATA_DTYPE_FP32);
        cfg.zero_stage = stage;
        cfg.gradient_clipping = 1e30; /* never clips; the norm is computed and reported */
        cfg.gradient_reduction = mean ? STRATA_REDUCE_MEAN : STRATA_REDUCE_SUM;
        strata_engine *e = NULL;
        T_OK(synth_engine(&o, &cfg, &e));
        if (!e)
            return;
        /* "sum" gets what "mean" should see: each rank's gradient already divided by N (exact for N = 2, 4). */
        float mine = (float)(rank + 1) / (mean ? 1.0f : (float)size);
        double norm = step_with(e, &o, mine, &numel);
        double want = sqrt((double)numel) * sum_per_element / size;
        T_CHECK(fabs(norm - want) <= 1e-9 * want, "stage %d, %s: the optimizer saw gradients of norm %.17g, expected "
                "%.17g (the sum over %d ranks / %d)", stage, mean ? "mean" : "sum with pre-divided gradients", norm,
                want, size, size);
        w[mean] = weights(e, &o, numel);
        strata_engine_destroy(e);
    }
    /* Where 1/N is exact, "mean" is the pre-divided "sum" bit for bit. */
    if ((size & (size - 1)) == 0 && w[0] && w[1]) {
        size_t diff = 0, first = 0;
        for (size_t i = 0; i < numel; i++)
            if (memcmp(&w[0][i], &w[1][i], sizeof(float)) != 0 && diff++ == 0)
                first = i;
        T_CHECK(diff == 0, "stage %d: %zu of %zu weights differ between \"mean\" and the pre-divided \"sum\"; the "
                "first, %zu, is %.9g vs %.9g", stage, diff, numel, first, w[1][first], w[0][first]);
    }
    free(w[0]);
    free(w[1]);
}

int main(void)
{
    T_CHECK(strata_comm_create(&world) == STRATA_OK, "strata_comm_create: %s", strata_last_error(NULL));
    rank = strata_comm_rank(world);
    size = strata_comm_size(world);
    uint64_t seed = t_rng_seed();
    double s = (double)(seed % 1000003);
    T_OK(strata_comm_allreduce_sum(world, &s, 1)); /* every rank builds the same model */
    for (int stage = 0; stage <= 3; stage++)
        run_stage(stage, (uint64_t)s);
    if (rank == 0)
        printf("gradient_reduction: sum and mean agree with their oracles at stages 0-3, %d rank(s)\n", size);
    strata_comm_destroy(world);
    return t_done();
}
