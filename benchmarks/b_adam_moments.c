/*
 * b_adam_moments: elements/s of the CPU Adam step with each moment storage -- fp32 (the kernel table's
 * step), bf16 with stochastic rounding, 8-bit block-wise -- on the same master weights, gradient and
 * parameter copy, all on the same ISA (AVX2), the same threads and the same tiling (tiles of whole 8-bit
 * blocks, one OpenMP loop). The three run interleaved, rep after rep, so that a shared, noisy machine
 * slows them alike; best and median of the reps are printed, and each compressed kernel's best as a
 * share of the fp32 kernel's (issue 25's bar: >= 0.90).
 *
 *   b_adam_moments [--melem N] [--reps R] [--threads T] [--grad fp32|bf16|fp16] [--param fp32|bf16|fp16|none]
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/big_alloc.h"
#include "base/half.h"
#include "base/util.h"
#include "cpu_adam/adam_moments.h"
#include "tools/machine_line.h"

enum { FORM_FP32, FORM_BF16, FORM_Q8, FORMS };
static const char *const form_name[FORMS] = {"fp32", "bf16-sr", "8-bit"};

typedef struct bench {
    size_t n, tile;
    int threads;
    const adam_ops *fp32;
    adam_arrays a;             /* master, fp32 moments, gradient, parameter copy */
    adam_bf16_moments bf16;
    adam_q8_moments q8;
} bench;

static void *alloc_or_die(size_t bytes)
{
    void *p = big_alloc(bytes);
    if (!p) {
        fprintf(stderr, "b_adam_moments: out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    return memset(p, 0, bytes);
}

static double run_form(const bench *b, int form, const adam_consts *c)
{
    uint64_t t0 = now_ns();
    size_t tiles = (b->n + b->tile - 1) / b->tile;
#pragma omp parallel for schedule(static) num_threads(b->threads)
    for (size_t t = 0; t < tiles; t++) {
        size_t begin = t * b->tile, end = begin + b->tile < b->n ? begin + b->tile : b->n;
        if (form == FORM_FP32)
            b->fp32->step(c, &b->a, begin, end);
        else if (form == FORM_BF16)
            adam_step_bf16_avx2(c, &b->a, &b->bf16, begin, end);
        else
            adam_step_q8_avx2(c, &b->a, &b->q8, begin, end);
    }
    return (double)(now_ns() - t0) * 1e-9;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static bool parse_dtype(const char *s, strata_dtype *out)
{
    for (int d = STRATA_DTYPE_FP32; d <= STRATA_DTYPE_NONE; d++)
        if (strcmp(s, strata_dtype_name((strata_dtype)d)) == 0) {
            *out = (strata_dtype)d;
            return true;
        }
    return false;
}

/* Bytes one step moves per element: master read and written, each moment in its form read and written,
 * the gradient read, the parameter copy written (8-bit scales: 2 x 8 B per 2048 elements). */
static double bytes_per_elem(int form, strata_dtype gd, strata_dtype pd)
{
    double moments = form == FORM_FP32 ? 16.0 : form == FORM_BF16 ? 8.0 : 4.0 + 16.0 / MOMENTS_Q8_BLOCK;
    return 8.0 + moments + (double)strata_dtype_bytes(gd) + (double)strata_dtype_bytes(pd);
}

typedef struct options {
    double melem;
    int reps, threads;
    strata_dtype gd, pd;
} options;

static bool parse_options(int argc, char **argv, options *o)
{
    *o = (options){32, 9, omp_get_max_threads(), STRATA_DTYPE_BF16, STRATA_DTYPE_BF16};
    if (argc % 2 == 0)
        return false;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        bool ok = strcmp(k, "--melem") == 0   ? (o->melem = atof(v)) > 0
                  : strcmp(k, "--reps") == 0    ? (o->reps = atoi(v)) > 0
                  : strcmp(k, "--threads") == 0 ? (o->threads = atoi(v)) > 0
                  : strcmp(k, "--grad") == 0    ? parse_dtype(v, &o->gd) && o->gd != STRATA_DTYPE_NONE
                  : strcmp(k, "--param") == 0   ? parse_dtype(v, &o->pd)
                                                : false;
        if (!ok)
            return false;
    }
    return true;
}

/* Zeroed moments in every form; weights ~0.02 and gradients ~1e-3 (a trained model's values) in every dtype. */
static void setup(bench *b, const options *o)
{
    size_t n = b->n, nb = (n + MOMENTS_Q8_BLOCK - 1) / MOMENTS_Q8_BLOCK;
    b->a = (adam_arrays){alloc_or_die(n * 4), alloc_or_die(n * 4), alloc_or_die(n * 4), alloc_or_die(n * 4),
                         o->pd == STRATA_DTYPE_NONE ? NULL : alloc_or_die(n * 4), o->gd, o->pd, true};
    b->bf16 = (adam_bf16_moments){alloc_or_die(n * 2), alloc_or_die(n * 2), 0, 0};
    b->q8 = (adam_q8_moments){alloc_or_die(n), alloc_or_die(n), alloc_or_die(nb * 4), alloc_or_die(nb * 4)};
    srand(1);
    for (size_t i = 0; i < n; i++) {
        b->a.master[i] = 0.02f * ((float)rand() / RAND_MAX - 0.5f);
        float g = 1e-3f * ((float)rand() / RAND_MAX - 0.5f);
        if (o->gd == STRATA_DTYPE_FP32)
            ((float *)b->a.grad)[i] = g;
        else
            ((uint16_t *)b->a.grad)[i] = o->gd == STRATA_DTYPE_BF16 ? cvt_f32_to_bf16(g) : cvt_f32_to_fp16(g);
    }
}

static void report(const bench *b, const options *o, double *t)
{
    machine_line_print(stdout, "# ");
    printf("# %zu elements (%.0f Mi), grad %s, param %s, %d threads, tiles of %zu, AVX2 for all, %d reps interleaved\n",
           b->n, o->melem, strata_dtype_name(o->gd), strata_dtype_name(o->pd), b->threads, b->tile, o->reps);
    printf("%-8s %10s %10s %12s %12s %8s %10s\n", "moments", "best_ms", "median_ms", "Melem/s", "Melem/s_med",
           "B/elem", "vs_fp32");
    int reps = o->reps;
    double best[FORMS];
    for (int f = 0; f < FORMS; f++) {
        qsort(t + f * reps, (size_t)reps, sizeof *t, cmp_double);
        best[f] = t[f * reps];
        double med = t[f * reps + reps / 2];
        printf("%-8s %10.2f %10.2f %12.0f %12.0f %8.2f %10.3f\n", form_name[f], best[f] * 1e3, med * 1e3,
               (double)b->n / best[f] * 1e-6, (double)b->n / med * 1e-6, bytes_per_elem(f, o->gd, o->pd),
               best[0] / best[f]);
    }
}

int main(int argc, char **argv)
{
    options o;
    if (!parse_options(argc, argv, &o)) {
        fprintf(stderr, "usage: b_adam_moments [--melem N] [--reps R] [--threads T] [--grad fp32|bf16|fp16]"
                        " [--param fp32|bf16|fp16|none]\n");
        return 2;
    }
    if (!adam_isa_supported(ADAM_ISA_AVX2)) {
        fprintf(stderr, "b_adam_moments: this CPU lacks AVX2, the ISA of the compressed kernels\n");
        return 77;
    }
    bench b = {.n = (size_t)(o.melem * (1 << 20)), .tile = 64 * MOMENTS_Q8_BLOCK, .threads = o.threads};
    adam_ops_for(ADAM_ISA_AVX2, &b.fp32);
    setup(&b, &o);
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD};
    double *t = calloc((size_t)o.reps * FORMS, sizeof *t);
    for (int rep = -1; rep < o.reps; rep++) { /* rep -1 warms pages, caches and threads */
        adam_consts c;
        adam_consts_init(&c, &hp, rep + 2, 1.0);
        b.bf16.key = moments_sr_key(1, rep + 2);
        for (int f = 0; f < FORMS; f++) {
            int form = (f + (rep < 0 ? 0 : rep)) % FORMS; /* rotate the order too */
            double s = run_form(&b, form, &c);
            if (rep >= 0)
                t[form * o.reps + rep] = s;
        }
    }
    report(&b, &o, t);
    free(t);
    return 0;
}
