/*
 * Adam with compressed moments (cpu_adam/moments.h, cpu_adam/adam_moments.h):
 *   - the two 8-bit maps are what the paper defines, and the bucket search finds the same code as the
 *     binary search (the specification) on every midpoint, its neighbours and random values;
 *   - stochastic rounding to bf16 is unbiased (exactly, over all 2^16 random values) and its hash bits are
 *     uniform and change with the step;
 *   - one step from the same state gives the master weights and parameter copy of adam_step_ref() bit for
 *     bit, and moments within the form's error (bf16: one bf16 step toward zero or away; 8-bit: half the
 *     map's largest gap times the block's scale);
 *   - a hundred steps stay close to the fp32 run (relative L2 distance of the weight change, printed);
 *   - the bits do not depend on how the range is split (pieces run by OpenMP threads) nor on the ISA: every
 *     SIMD variant this CPU runs gives the bits of the reference, for odd lengths, unaligned starts, every
 *     gradient and parameter dtype, with NaN and inf in the gradient.
 */
#include <float.h>

#include "cpu_adam/adam_moments.h"
#include "t_adam_util.h"

typedef struct variant {
    const char *name;
    adam_isa isa;
    adam_step_bf16_fn bf16;
    adam_step_q8_fn q8;
} variant;

static const variant variants[] = {
    {"ref", ADAM_ISA_REF, adam_step_bf16_ref, adam_step_q8_ref},
    {"avx2", ADAM_ISA_AVX2, adam_step_bf16_avx2, adam_step_q8_avx2},
};

/* ------------------------------------------------------------------ the forms */

static void check_map(const moments_q8_map *map, bool is_signed)
{
    const char *name = is_signed ? "signed" : "unsigned";
    bool ascending = true;
    for (int k = 0; k < 255; k++)
        ascending &= map->code[k] < map->code[k + 1];
    T_CHECK(ascending, "%s map: codes not strictly ascending", name);
    T_CHECK(map->code[map->zero] == 0.0f && map->code[255] == 1.0f, "%s map: code[zero] %g, code[255] %g", name,
            map->code[map->zero], map->code[255]);
    /* Signed: 127 negative codes, 0, 128 positive (the largest 1); unsigned: 0 and 255 positive. */
    T_EQ_INT(map->zero, is_signed ? 127 : 0);
    /* The smallest positive code: 1e-6 times the middle of the first of 1 (signed) or 2 steps of [0.1, 1]. */
    float smallest = is_signed ? 0.55e-6f : 0.325e-6f;
    T_CHECK(fabsf(map->code[map->zero + 1] - smallest) < 1e-12f, "%s map: smallest positive code %g, want %g", name,
            map->code[map->zero + 1], smallest);

    size_t bad = 0, tried = 0;
    for (int k = 0; k < 255; k++)
        for (int d = -2; d <= 2; d++) {
            float y = map->mid[k];
            for (int s = 0; s < abs(d); s++)
                y = nextafterf(y, d < 0 ? -INFINITY : INFINITY);
            uint8_t want = moments_q8_nearest(map, y), got = moments_q8_nearest_fast(map, y);
            tried++;
            if (want != got && bad++ < 5)
                t_fail(__FILE__, __LINE__, "%s map: y=%a: buckets give %u, binary search %u", name, y, got, want);
        }
    for (int r = 0; r < 2000000; r++) {
        /* Half uniform in [-1.0039, 1.0039], half log-uniform in magnitude down to 1e-30. */
        float y = r & 1 ? (float)((2.0 * t_rand_unit() - 1.0) * 1.0039)
                        : (float)(pow(10.0, -30.0 * t_rand_unit()) * (t_rand_range(0, 1) ? 1 : -1));
        if (r < 4)
            y = (float[]){0.0f, -0.0f, 1.0f, -1.0f}[r];
        uint8_t want = moments_q8_nearest(map, y), got = moments_q8_nearest_fast(map, y);
        tried++;
        if (want != got && bad++ < 5)
            t_fail(__FILE__, __LINE__, "%s map: y=%a: buckets give %u, binary search %u", name, y, got, want);
    }
    t_checks++;
    printf("%s map: bucket search = binary search on %zu values, %zu differ\n", name, tried, bad);
}

/* Chi-square of the top 6 bits of a(i) against those of b(i), over 4096 cells: 4095 +- 91 when independent. */
static double pair_chi2(const uint16_t *a, const uint16_t *b, size_t n)
{
    static size_t cells[4096];
    memset(cells, 0, sizeof cells);
    for (size_t i = 0; i < n; i++)
        cells[(a[i] >> 10) << 6 | b[i] >> 10]++;
    double want = (double)n / 4096.0, chi2 = 0.0;
    for (int k = 0; k < 4096; k++)
        chi2 += ((double)cells[k] - want) * ((double)cells[k] - want) / want;
    return chi2;
}

/* The mixer (moments_sr_mix) is weaker than a full finaliser: its roundings of different elements in one
 * step must still look independent. The halves of neighbours (index distance 1, 2, 8) and the two halves of
 * one element, as joint distributions: a mixer with one multiply fewer fails the distance-1 pair of low
 * halves (chi2 ~ 6000). Bound 10 sigma. */
static void check_sr_neighbours(uint32_t key)
{
    size_t n = 1 << 20;
    uint16_t *lo = malloc((n + 8) * 2), *hi = malloc((n + 8) * 2);
    for (size_t i = 0; i < n + 8; i++) {
        uint32_t h = moments_sr_bits(key, i);
        lo[i] = (uint16_t)h;
        hi[i] = (uint16_t)(h >> 16);
    }
    const size_t dist[] = {1, 2, 8};
    double worst = pair_chi2(lo, hi, n);
    for (size_t d = 0; d < 3; d++) {
        double cl = pair_chi2(lo, lo + dist[d], n), ch = pair_chi2(hi, hi + dist[d], n);
        worst = fmax(worst, fmax(cl, ch));
        T_CHECK(cl < 4095 + 10 * 90.5 && ch < 4095 + 10 * 90.5,
                "hash halves of elements %zu apart look dependent: chi2 %.0f (low) %.0f (high), 4095 +- 91 want",
                dist[d], cl, ch);
    }
    double both = pair_chi2(lo, hi, n);
    T_CHECK(both < 4095 + 10 * 90.5, "the two hash halves of one element look dependent: chi2 %.0f", both);
    printf("hash: largest neighbour-pair chi2 %.0f (4095 +- 91 when independent)\n", worst);
    free(lo);
    free(hi);
}

static void check_sr(void)
{
    size_t biased = 0, outside = 0;
    for (int t = 0; t < 2000; t++) {
        float x = t_rand_normal() * (float)pow(10.0, -12.0 + 14.0 * t_rand_unit());
        uint16_t down = (uint16_t)(cvt_f32_bits(x) >> 16);
        double sum = 0.0;
        for (uint32_t r = 0; r < 65536; r++) {
            uint16_t h = moments_bf16_round_sr(x, r);
            outside += h != down && h != (uint16_t)(down + 1);
            sum += cvt_bf16_to_f32(h);
        }
        if (sum != 65536.0 * x && biased++ < 5)
            t_fail(__FILE__, __LINE__, "SR of %a: mean over all 2^16 random values %a", x, sum / 65536.0);
    }
    T_CHECK(outside == 0, "SR gave %zu results that are neither x rounded down nor up", outside);
    T_CHECK(biased == 0, "SR biased for %zu values", biased);
    T_EQ_INT(moments_bf16_round_sr(INFINITY, 0xffff), 0x7f80);
    T_EQ_INT(moments_bf16_round_sr(-NAN, 0x1234), 0xffc0);
    T_EQ_INT(moments_bf16_round_sr(1.0f, 0xffff), 0x3f80); /* representable: stays */

    /* The hash: uniform halves, the same for the same key, fresh for another step. */
    uint32_t key = moments_sr_key(t_rand_u64(), 7), key2 = moments_sr_key(0, 8);
    double lo = 0, hi = 0;
    size_t n = 1 << 20, same = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t h = moments_sr_bits(key, i);
        lo += h & 0xffff;
        hi += h >> 16;
        same += h == moments_sr_bits(key2, i);
    }
    double sigma = 65536.0 / sqrt(12.0 * (double)n);
    T_CHECK(fabs(lo / (double)n - 32767.5) < 6 * sigma && fabs(hi / (double)n - 32767.5) < 6 * sigma,
            "hash halves not uniform: means %.1f and %.1f, want 32767.5 +- %.1f", lo / (double)n, hi / (double)n,
            6 * sigma);
    T_CHECK(same < 10, "steps 7 and 8 share the bits of %zu elements", same);
    check_sr_neighbours(key);
    T_CHECK(moments_sr_key(1, 2) != moments_sr_key(1, 3) && moments_sr_key(1, 2) != moments_sr_key(2, 2),
            "keys do not change with seed and step");
    T_CHECK(moments_sr_bits(key, 5) != moments_sr_bits(key, 5 + ((size_t)1 << 32)),
            "elements 2^32 apart share their bits");
}

/* ------------------------------------------------------------------ state */

typedef struct cstate {
    ta_state s;                 /* master, gradient, parameter copy; s.m / s.v the fp32 moments */
    uint16_t *bm, *bv;          /* bf16 moments */
    uint8_t *qm, *qv;           /* 8-bit moments */
    float *qms, *qvs;           /* their block scales */
} cstate;

static size_t blocks_of(size_t n)
{
    return (n + MOMENTS_Q8_BLOCK - 1) / MOMENTS_Q8_BLOCK;
}

static void cs_alloc(cstate *c, size_t n, strata_dtype gd, strata_dtype pd)
{
    ta_alloc(&c->s, n, gd, pd);
    c->bm = ta_calloc64(n);
    c->bv = ta_calloc64(n);
    c->qm = ta_calloc64(n);
    c->qv = ta_calloc64(n);
    c->qms = ta_calloc64(blocks_of(n));
    c->qvs = ta_calloc64(blocks_of(n));
}

static void cs_free(cstate *c)
{
    ta_free(&c->s);
    free(c->bm);
    free(c->bv);
    free(c->qm);
    free(c->qv);
    free(c->qms);
    free(c->qvs);
}

static void cs_copy(cstate *dst, const cstate *src)
{
    size_t n = src->s.n, nb = blocks_of(n);
    ta_copy(&dst->s, &src->s);
    memcpy(dst->bm, src->bm, n * 2);
    memcpy(dst->bv, src->bv, n * 2);
    memcpy(dst->qm, src->qm, n);
    memcpy(dst->qv, src->qv, n);
    memcpy(dst->qms, src->qms, nb * 4);
    memcpy(dst->qvs, src->qvs, nb * 4);
}

/* Random moments in both compressed forms, and their fp32 values in s.m / s.v (bf16 ones). */
static void cs_fill_moments(cstate *c)
{
    for (size_t b = 0; b < blocks_of(c->s.n); b++) {
        c->qms[b] = (float)pow(10.0, -6.0 + 5.0 * t_rand_unit());
        c->qvs[b] = (float)pow(10.0, -10.0 + 9.0 * t_rand_unit());
    }
    for (size_t i = 0; i < c->s.n; i++) {
        float m = t_rand_normal() * (float)pow(10.0, -6.0 + 5.0 * t_rand_unit());
        float v = m * m * (float)t_rand_unit() * 4.0f;
        c->bm[i] = cvt_f32_to_bf16(m);
        c->bv[i] = cvt_f32_to_bf16(v);
        c->s.m[i] = cvt_bf16_to_f32(c->bm[i]);
        c->s.v[i] = cvt_bf16_to_f32(c->bv[i]);
        c->qm[i] = (uint8_t)t_rand_range(0, 255);
        c->qv[i] = (uint8_t)t_rand_range(0, 255);
    }
}

static adam_arrays cs_arrays(cstate *c)
{
    return (adam_arrays){c->s.master, NULL, NULL, c->s.grad, c->s.param, c->s.gd, c->s.pd, true};
}

/* Elements [begin, end) as a call over arrays that start at begin (base = begin: where they sit in the whole), as
 * the engine calls it on a piece of the optimizer's view: the bits must be those of one call over the whole. */
static void run_bf16(adam_step_bf16_fn fn, const adam_consts *k, cstate *c, uint32_t key, size_t begin, size_t end)
{
    adam_arrays a = cs_arrays(c);
    size_t gb = strata_dtype_bytes(a.grad_dtype), pb = strata_dtype_bytes(a.param_dtype);
    a.master += begin;
    a.grad = (const char *)a.grad + begin * gb;
    a.param = a.param ? (char *)a.param + begin * pb : NULL;
    adam_bf16_moments mo = {c->bm + begin, c->bv + begin, key, begin};
    fn(k, &a, &mo, 0, end - begin);
}

static void run_q8(adam_step_q8_fn fn, const adam_consts *k, cstate *c, size_t begin, size_t end)
{
    adam_arrays a = cs_arrays(c);
    adam_q8_moments mo = {c->qm, c->qv, c->qms, c->qvs};
    fn(k, &a, &mo, begin, end);
}

/* Counts the elements whose state differs in any bit (NaNs equal); prints the first few. */
static size_t cs_compare(const cstate *got, const cstate *want, const char *what)
{
    size_t bad = 0, n = got->s.n;
    t_checks++;
    for (size_t i = 0; i < n; i++) {
        float g[2] = {got->s.master[i], got->s.param ? ta_param_at(&got->s, i) : 0.0f};
        float w[2] = {want->s.master[i], want->s.param ? ta_param_at(&want->s, i) : 0.0f};
        unsigned gb[4] = {got->bm[i], got->bv[i], got->qm[i], got->qv[i]};
        unsigned wb[4] = {want->bm[i], want->bv[i], want->qm[i], want->qv[i]};
        for (int k = 0; k < 6; k++) {
            bool same = k < 2 ? ta_same(g[k], w[k]) : gb[k - 2] == wb[k - 2];
            if (!same && bad++ < 5)
                t_fail(__FILE__, __LINE__, "%s: element %zu of %s: got 0x%08x, reference 0x%08x", what, i,
                       (const char *[]){"master", "param", "bf16 m", "bf16 v", "q8 m", "q8 v"}[k],
                       k < 2 ? cvt_f32_bits(g[k]) : gb[k - 2], k < 2 ? cvt_f32_bits(w[k]) : wb[k - 2]);
        }
    }
    for (size_t b = 0; b < blocks_of(n); b++)
        for (int k = 0; k < 2; k++) {
            float gs = k ? got->qvs[b] : got->qms[b], ws = k ? want->qvs[b] : want->qms[b];
            if (!ta_same(gs, ws) && bad++ < 5)
                t_fail(__FILE__, __LINE__, "%s: block %zu %s scale: got %a, reference %a", what, b, k ? "v" : "m", gs, ws);
        }
    return bad;
}

/* ------------------------------------------------------------------ one step against fp32 */

static float q8_max_gap(const moments_q8_map *map)
{
    float gap = 0.0f;
    for (int k = 0; k < 255; k++)
        gap = fmaxf(gap, map->code[k + 1] - map->code[k]);
    return gap;
}

static bool weights_differ(const cstate *got, const cstate *want, size_t i)
{
    return !ta_same(got->s.master[i], want->s.master[i]) ||
           (got->s.param && !ta_same(ta_param_at(&got->s, i), ta_param_at(&want->s, i)));
}

/* bf16: fp holds the bf16 moments of c widened; after one step each stored moment must be the fp32 result
 * rounded down or up (in magnitude). */
static void one_step_bf16(const cstate *c, cstate *fp, cstate *b, const adam_consts *k, const char *what)
{
    size_t n = c->s.n, bad_w = 0, bad_m = 0;
    cs_copy(fp, c);
    adam_arrays af = {fp->s.master, fp->s.m, fp->s.v, fp->s.grad, fp->s.param, fp->s.gd, fp->s.pd, false};
    adam_step_ref(k, &af, 0, n);
    cs_copy(b, c);
    run_bf16(adam_step_bf16_ref, k, b, moments_sr_key(1, 3), 0, n);
    for (size_t i = 0; i < n; i++) {
        bad_w += weights_differ(b, fp, i);
        uint16_t want[2] = {(uint16_t)(cvt_f32_bits(fp->s.m[i]) >> 16), (uint16_t)(cvt_f32_bits(fp->s.v[i]) >> 16)};
        uint16_t got[2] = {b->bm[i], b->bv[i]};
        for (int j = 0; j < 2; j++)
            if (got[j] != want[j] && got[j] != (uint16_t)(want[j] + 1) && bad_m++ < 5)
                t_fail(__FILE__, __LINE__, "%s bf16: element %zu %s: fp32 %a, bf16 %a: not one of its two neighbours",
                       what, i, j ? "v" : "m", j ? fp->s.v[i] : fp->s.m[i], cvt_bf16_to_f32(got[j]));
    }
    T_CHECK(bad_w == 0, "%s bf16: %zu master or param values differ from adam_step_ref", what, bad_w);
    t_checks++;
}

/* 8-bit: fp holds the 8-bit moments of c dequantized; after one step each stored moment must be within
 * half the map's largest gap (times the block's new scale) of the fp32 result. */
static void one_step_q8(const cstate *c, cstate *fp, cstate *b, const adam_consts *k, const char *what)
{
    const moments_q8_map *map[2] = {moments_q8_signed(), moments_q8_unsigned()};
    size_t n = c->s.n, bad_w = 0, bad_m = 0;
    cs_copy(fp, c);
    for (size_t i = 0; i < n; i++) {
        fp->s.m[i] = moments_q8_dequantize(map[0], c->qm[i], c->qms[i / MOMENTS_Q8_BLOCK]);
        fp->s.v[i] = moments_q8_dequantize(map[1], c->qv[i], c->qvs[i / MOMENTS_Q8_BLOCK]);
    }
    adam_arrays af = {fp->s.master, fp->s.m, fp->s.v, fp->s.grad, fp->s.param, fp->s.gd, fp->s.pd, false};
    adam_step_ref(k, &af, 0, n);
    cs_copy(b, c);
    run_q8(adam_step_q8_ref, k, b, 0, n);
    float gap[2] = {q8_max_gap(map[0]) / 2, q8_max_gap(map[1]) / 2};
    for (size_t i = 0; i < n; i++) {
        bad_w += weights_differ(b, fp, i);
        size_t blk = i / MOMENTS_Q8_BLOCK;
        float want[2] = {fp->s.m[i], fp->s.v[i]}, scale[2] = {b->qms[blk], b->qvs[blk]};
        uint8_t q[2] = {b->qm[i], b->qv[i]};
        for (int j = 0; j < 2; j++) {
            float got = moments_q8_dequantize(map[j], q[j], scale[j]);
            float bound = gap[j] * scale[j] * 1.0001f; /* the fp32 roundings of code, reciprocal and product */
            if (!(fabsf(got - want[j]) <= bound) && bad_m++ < 5)
                t_fail(__FILE__, __LINE__, "%s q8: element %zu %s: fp32 %a, 8-bit %a (scale %a): off by more than %a",
                       what, i, j ? "v" : "m", want[j], got, scale[j], bound);
        }
    }
    T_CHECK(bad_w == 0, "%s q8: %zu master or param values differ from adam_step_ref", what, bad_w);
    t_checks++;
}

/* From the same decoded state, one step: master and parameter copy bit for bit as adam_step_ref(); the
 * moments within the form's rounding of the fp32 reference's. */
static void one_step(const strata_adam_hparams *hp, strata_dtype gd, strata_dtype pd)
{
    size_t n = t_rand_range(1, 3 * MOMENTS_Q8_BLOCK + 100);
    cstate c, fp, b;
    cs_alloc(&c, n, gd, pd);
    cs_alloc(&fp, n, gd, pd);
    cs_alloc(&b, n, gd, pd);
    /* No special values: a weight of 3e38 with L2 decay overflows v, and its block reads back NaN. */
    for (size_t i = 0; i < n; i++)
        c.s.master[i] = t_rand_normal() * 0.5f;
    ta_fill_grad(&c.s, 0, false);
    cs_fill_moments(&c);
    adam_consts k;
    adam_consts_init(&k, hp, 3, 0.5);
    char what[120];
    snprintf(what, sizeof what, "one step n=%zu grad=%s param=%s wd=%g", n, strata_dtype_name(gd),
             strata_dtype_name(pd), hp->weight_decay);
    one_step_bf16(&c, &fp, &b, &k, what);
    one_step_q8(&c, &fp, &b, &k, what);
    cs_free(&b);
    cs_free(&c);
    cs_free(&fp);
}

/* ------------------------------------------------------------------ many steps against fp32 */

/* Relative L2 distance between the weight changes of two runs. */
static double drift(const float *p0, const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double da = (double)a[i] - p0[i], db = (double)b[i] - p0[i];
        num += (da - db) * (da - db);
        den += db * db;
    }
    return sqrt(num / den);
}

/* 200 steps from zero moments on a gradient of a fixed signal and fresh noise, its scale one decade wide
 * within a block and over four decades between blocks: the weight change of each compressed run against
 * the fp32 run's. (Scales many decades apart inside one block defeat 8-bit moments: v of the small ones
 * falls below the smallest code, 3.25e-7 of the block's largest, reads back 0, and m / (0 + eps) explodes;
 * the paper's method has the same limit.) */
static void many_steps(void)
{
    size_t n = 4 * MOMENTS_Q8_BLOCK + 77, steps = 200;
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD};
    cstate fp, b, q;
    cs_alloc(&fp, n, STRATA_DTYPE_FP32, STRATA_DTYPE_NONE);
    cs_alloc(&b, n, STRATA_DTYPE_FP32, STRATA_DTYPE_NONE);
    cs_alloc(&q, n, STRATA_DTYPE_FP32, STRATA_DTYPE_NONE);
    float *p0 = ta_calloc64(n), *signal = ta_calloc64(n), *scale = ta_calloc64(n);
    double block_exp = 0.0;
    for (size_t i = 0; i < n; i++) {
        fp.s.master[i] = p0[i] = t_rand_normal() * 0.5f;
        if (i % MOMENTS_Q8_BLOCK == 0)
            block_exp = -4.0 + 3.0 * t_rand_unit();
        scale[i] = (float)pow(10.0, block_exp + t_rand_unit());
        signal[i] = t_rand_normal() * scale[i];
    }
    cs_copy(&b, &fp);
    cs_copy(&q, &fp);
    uint64_t seed = t_rand_u64();
    for (size_t t = 1; t <= steps; t++) {
        for (size_t i = 0; i < n; i++)
            ((float *)fp.s.grad)[i] = signal[i] + 2.0f * t_rand_normal() * scale[i];
        memcpy(b.s.grad, fp.s.grad, n * 4);
        memcpy(q.s.grad, fp.s.grad, n * 4);
        adam_consts k;
        adam_consts_init(&k, &hp, (int64_t)t, 1.0);
        adam_arrays af = {fp.s.master, fp.s.m, fp.s.v, fp.s.grad, NULL, STRATA_DTYPE_FP32, STRATA_DTYPE_NONE, false};
        adam_step_ref(&k, &af, 0, n);
        run_bf16(adam_step_bf16_ref, &k, &b, moments_sr_key(seed, (int64_t)t), 0, n);
        run_q8(adam_step_q8_ref, &k, &q, 0, n);
    }
    double db = drift(p0, b.s.master, fp.s.master, n), dq = drift(p0, q.s.master, fp.s.master, n);
    printf("after %zu steps, weight change vs fp32 moments (relative L2): bf16 SR %.3g, 8-bit %.3g\n", steps, db, dq);
    T_CHECK(db < 0.02, "bf16 moments drift %.4f from the fp32 run, bound 0.02", db);
    T_CHECK(dq < 0.10, "8-bit moments drift %.4f from the fp32 run, bound 0.10", dq);
    free(p0);
    free(signal);
    free(scale);
    cs_free(&fp);
    cs_free(&b);
    cs_free(&q);
}

/* ------------------------------------------------------------------ determinism and ISAs */

/* The same step over [0, n) in one call, and in pieces (cut at random, at block boundaries for 8-bit)
 * run by OpenMP threads: the same bits. */
static void splits(void)
{
    size_t n = 5 * MOMENTS_Q8_BLOCK + 333;
    cstate whole, parts;
    cs_alloc(&whole, n, STRATA_DTYPE_BF16, STRATA_DTYPE_BF16);
    cs_alloc(&parts, n, STRATA_DTYPE_BF16, STRATA_DTYPE_BF16);
    ta_fill_master(&whole.s);
    cs_fill_moments(&whole);
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD};
    uint64_t seed = t_rand_u64();
    cs_copy(&parts, &whole);
    for (int step = 1; step <= 3; step++) {
        ta_fill_grad(&whole.s, 0, false);
        memcpy(parts.s.grad, whole.s.grad, n * 2);
        adam_consts k;
        adam_consts_init(&k, &hp, step, 1.0);
        uint32_t key = moments_sr_key(seed, step);
        run_bf16(adam_step_bf16_ref, &k, &whole, key, 0, n);
        run_q8(adam_step_q8_ref, &k, &whole, 0, n);
        size_t cut[8] = {0}, qcut[8] = {0}, blocks = 0;
        for (int j = 1; j < 7; j++) {
            cut[j] = t_rand_range(cut[j - 1], n);
            blocks = t_rand_range(blocks, blocks_of(n));
            qcut[j] = blocks * MOMENTS_Q8_BLOCK < n ? blocks * MOMENTS_Q8_BLOCK : n;
        }
        cut[7] = qcut[7] = n;
#pragma omp parallel for schedule(dynamic, 1)
        for (int j = 0; j < 7; j++) {
            const variant *v = &variants[j % 2 && adam_isa_supported(ADAM_ISA_AVX2)];
            run_bf16(v->bf16, &k, &parts, key, cut[j], cut[j + 1]);
        }
#pragma omp parallel for schedule(dynamic, 1)
        for (int j = 0; j < 7; j++) {
            const variant *v = &variants[j % 2 && adam_isa_supported(ADAM_ISA_AVX2)];
            run_q8(v->q8, &k, &parts, qcut[j], qcut[j + 1]);
        }
        char what[64];
        snprintf(what, sizeof what, "split into pieces, step %d", step);
        if (cs_compare(&parts, &whole, what))
            break;
    }
    cs_free(&whole);
    cs_free(&parts);
}

/* Six steps with the state carried over and a new gradient (NaN and inf in it) each step: the variant
 * gives the reference's bits. q8 starts at block 0 or 1; bf16 anywhere. */
static void simd_case(const variant *v, bool q8, strata_dtype gd, strata_dtype pd, const strata_adam_hparams *hp)
{
    size_t n = t_rand_range(0, 2) == 0 ? t_rand_range(1, 40) : t_rand_range(1000, 3 * MOMENTS_Q8_BLOCK + 50);
    size_t begin = q8 ? (n > MOMENTS_Q8_BLOCK && t_rand_range(0, 1) ? MOMENTS_Q8_BLOCK : 0) : t_rand_range(0, n - 1);
    cstate ref, simd;
    cs_alloc(&ref, n, gd, pd);
    cs_alloc(&simd, n, gd, pd);
    ta_fill_master(&ref.s);
    cs_fill_moments(&ref);
    uint64_t seed = t_rand_u64();
    char what[200];
    snprintf(what, sizeof what, "%s %s grad=%s param=%s %s wd=%g n=%zu begin=%zu", v->name, q8 ? "q8" : "bf16",
             strata_dtype_name(gd), strata_dtype_name(pd), hp->kind == STRATA_OPTIMIZER_ADAMW ? "adamw" : "adam",
             hp->weight_decay, n, begin);
    cs_copy(&simd, &ref);
    for (int step = 1; step <= 6; step++) {
        ta_fill_grad(&ref.s, 500, true);
        memcpy(simd.s.grad, ref.s.grad, n * strata_dtype_bytes(gd));
        adam_consts k;
        adam_consts_init(&k, hp, step, step == 3 ? 1.0 / 1024.0 : 0.75);
        if (q8) {
            run_q8(adam_step_q8_ref, &k, &ref, begin, n);
            run_q8(v->q8, &k, &simd, begin, n);
        } else {
            run_bf16(adam_step_bf16_ref, &k, &ref, moments_sr_key(seed, step), begin, n);
            run_bf16(v->bf16, &k, &simd, moments_sr_key(seed, step), begin, n);
        }
        char label[240];
        snprintf(label, sizeof label, "%s step=%d", what, step);
        if (cs_compare(&simd, &ref, label))
            break;
    }
    cs_free(&ref);
    cs_free(&simd);
}

/* Element indices past 2^32 take the hash's next key: the arrays are addressed from a base 2^32 - 20
 * elements before them, so that a range crosses the boundary mid-vector. */
static void simd_past_2_32(const variant *v)
{
    size_t n = 64, off = ((size_t)1 << 32) - 20;
    cstate ref, simd;
    cs_alloc(&ref, n, STRATA_DTYPE_FP32, STRATA_DTYPE_BF16);
    cs_alloc(&simd, n, STRATA_DTYPE_FP32, STRATA_DTYPE_BF16);
    ta_fill_master(&ref.s);
    ta_fill_grad(&ref.s, 0, false);
    cs_fill_moments(&ref);
    cs_copy(&simd, &ref);
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD};
    adam_consts k;
    adam_consts_init(&k, &hp, 1, 1.0);
    cstate *both[2] = {&ref, &simd};
    for (int j = 0; j < 2; j++) {
        cstate *c = both[j];
        /* The arrays' element 0 is element off of the whole array (base): the range [1, n) crosses index 2^32. */
        adam_arrays a = {c->s.master, NULL, NULL, (float *)c->s.grad, (uint16_t *)c->s.param, STRATA_DTYPE_FP32,
                         STRATA_DTYPE_BF16, false};
        adam_bf16_moments mo = {c->bm, c->bv, moments_sr_key(3, 1), off};
        (j ? v->bf16 : adam_step_bf16_ref)(&k, &a, &mo, 1, n);
    }
    char what[64];
    snprintf(what, sizeof what, "%s bf16 across element 2^32", v->name);
    cs_compare(&simd, &ref, what);
    cs_free(&ref);
    cs_free(&simd);
}

static const strata_dtype grad_types[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16};
static const strata_dtype param_types[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16,
                                           STRATA_DTYPE_NONE};

int main(void)
{
    t_rng_seed();
    check_map(moments_q8_signed(), true);
    check_map(moments_q8_unsigned(), false);
    check_sr();
    const strata_adam_hparams hps[] = {
        {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD},
        {STRATA_OPTIMIZER_ADAM, 3e-4, 0.8, 0.95, 1e-6, 0.1, true, STRATA_ADAM_MUL_ADD},
        {STRATA_OPTIMIZER_ADAM, 1e-2, 0.9, 0.999, 1e-8, 0.0, false, STRATA_ADAM_MUL_ADD},
        {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_LERP}, /* torch >= 2.0's */
    };
    const size_t n_hps = sizeof hps / sizeof hps[0];
    for (size_t h = 0; h < n_hps; h++)
        for (size_t g = 0; g < 3; g++)
            one_step(&hps[h], grad_types[g], param_types[t_rand_range(0, 3)]);
    many_steps();
    splits();
    for (size_t vi = 1; vi < sizeof variants / sizeof variants[0]; vi++) {
        const variant *v = &variants[vi];
        if (!adam_isa_supported(v->isa)) {
            printf("not tested here: the %s kernels (this CPU lacks the ISA)\n", v->name);
            continue;
        }
        simd_past_2_32(v);
        for (size_t h = 0; h < n_hps; h++)
            for (size_t g = 0; g < 3; g++)
                for (size_t p = 0; p < 4; p++)
                    for (int q8 = 0; q8 < 2; q8++)
                        simd_case(v, q8, grad_types[g], param_types[p], &hps[h]);
    }
    return t_done();
}
