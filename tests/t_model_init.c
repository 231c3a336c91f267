/*
 * The GPT's initial values (model/gpt_init.c): the same bits however they are cut into chunks and whichever loop
 * computes them (the CPU's AVX2 build against this file's scalar build of the same body), within 1e-6 of
 * Box-Muller in double precision on the same hashed integers, GPT-2's constants where they are constant, and
 * normal(0, scale) in distribution. Fresh seed each run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/gpt.h"
#include "model/gpt_init_body.h"
#include "testlib.h"

void gpt_init_normals_avx2(uint64_t base, size_t first, size_t count, float scale, float *out);

/* The formula in double on the same uniforms (u1 as the float it is: 24 bits near 1): what the float loop's ln and
 * cos approximate. */
static double normal_double(uint64_t base, size_t i)
{
    uint64_t a = gpt_mix64(base ^ (i * 0x9e3779b97f4a7c15ull)), b = gpt_mix64(a ^ 0x5851f42d4c957f2dull);
    double u1 = (double)(((float)(int32_t)(a >> 33) + 0.5f) * 0x1.0p-31f), u2 = (double)(int32_t)(b >> 40) * 0x1.0p-24;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static void check_chunking(const gpt_dims *d, uint64_t seed, int module, int index, size_t n)
{
    float *whole = malloc(n * sizeof *whole), *parts = malloc(n * sizeof *parts);
    gpt_init_fill(d, seed, module, index, 0, n, whole);
    for (size_t at = 0; at < n;) {
        size_t cut = t_rand_range(1, 3000), len = MIN(n - at, cut); /* MIN evaluates its arguments twice */
        gpt_init_fill(d, seed, module, index, at, len, parts + at);
        at += len;
    }
    size_t i = t_rand_range(0, n - 1);
    T_CHECK(memcmp(whole, parts, n * sizeof *whole) == 0, "module %d param %d: chunked fill differs from the whole",
            module, index);
    T_CHECK(gpt_init_value(d, seed, module, index, i) == whole[i], "element %zu alone: %.9g vs %.9g", i,
            (double)gpt_init_value(d, seed, module, index, i), (double)whole[i]);
    free(whole);
    free(parts);
}

int main(void)
{
    gpt_dims d = {.layers = (int)t_rand_range(2, 48), .heads = 4, .hidden = 64, .vocab = 512, .seq = 32};
    uint64_t seed = t_rand_u64();
    check_chunking(&d, seed, 0, GPT_WTE, 20000);
    check_chunking(&d, seed, 1, GPT_QKV_W, 20000);
    check_chunking(&d, seed, d.layers, GPT_FCPROJ_W, 7777);

    /* The vector loops against this file's scalar build of the same body, and both against double precision. */
    enum { N = 1 << 20 };
    float *ref = malloc(N * sizeof *ref), *got = malloc(N * sizeof *got);
    uint64_t base = t_rand_u64();
    size_t first = t_rand_range(0, (size_t)1 << 40);
    for (size_t i = 0; i < N; i++) /* one at a time: the vector loop never runs */
        gpt_init_normals_body(base, first + i, 1, 1.0f, ref + i);
    if (__builtin_cpu_supports("avx2")) {
        gpt_init_normals_avx2(base, first, N, 1.0f, got);
        size_t bad = 0, where = 0;
        for (size_t i = 0; i < N; i++)
            if (memcmp(&got[i], &ref[i], sizeof *got) && !bad++)
                where = i;
        T_CHECK(bad == 0, "AVX2 build: %zu of %d values differ from the scalar build, first at %zu: %.9g vs %.9g", bad,
                N, where, (double)got[where], (double)ref[where]);
    }
    double worst = 0, sum = 0, sq = 0, peak = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < N; i++) {
        double exact = normal_double(base, first + i), err = fabs(ref[i] - exact);
        if (err > worst) {
            worst = err;
            worst_at = i;
        }
        sum += ref[i];
        sq += (double)ref[i] * ref[i];
        peak = MAX(peak, fabs(ref[i]));
    }
    T_CHECK(worst < 1e-6, "float Box-Muller off the double formula by %.3g at %zu: %.9g vs %.9g", worst, worst_at,
            (double)ref[worst_at], normal_double(base, first + worst_at));
    double mean = sum / N, var = sq / N - mean * mean;
    T_CHECK(fabs(mean) < 5.0 / sqrt(N) && fabs(var - 1.0) < 5.0 * sqrt(2.0 / N),
            "not standard normal: mean %.5f (want 0 within %.5f), variance %.5f (want 1 within %.5f)", mean,
            5.0 / sqrt(N), var, 5.0 * sqrt(2.0 / N));
    T_CHECK(peak < 6.7 && peak > 4.0, "largest |z| %.3f: u1's 31 bits bound it by 6.7, and a million draws pass 4",
            peak);

    /* GPT-2's scales and constants, through the public fill. */
    gpt_init_fill(&d, seed, 1, GPT_FCPROJ_W, 0, N, got);
    double s2 = 0;
    for (size_t i = 0; i < N; i++)
        s2 += (double)got[i] * got[i];
    double want = 0.02 / sqrt(2.0 * d.layers);
    T_CHECK(fabs(sqrt(s2 / N) / want - 1.0) < 0.01, "mlp.proj.weight std %.6g, want 0.02/sqrt(2 x %d layers) = %.6g",
            sqrt(s2 / N), d.layers, want);
    float one, zero;
    gpt_init_fill(&d, seed, 2, GPT_LN2_W, 5, 1, &one);
    gpt_init_fill(&d, seed, 2, GPT_FC_B, 5, 1, &zero);
    T_CHECK(one == 1.0f && zero == 0.0f, "ln2.weight %g (want 1), mlp.fc.bias %g (want 0)", (double)one, (double)zero);
    gpt_init_fill(&d, seed, d.layers + 1, GPT_LNF_W, 0, 1, &one);
    T_CHECK(one == 1.0f, "ln_f.weight %g, want 1", (double)one);
    free(ref);
    free(got);
    return t_done();
}
