/* The GPT's initial values (gpt.h): which parameters are normal and at what scale, and the normals' loop, built for
 * the baseline x86-64 here and for AVX2 in gpt_init_avx2.c, taken where the CPU has it. The loop was double-precision
 * libm log and cos per element, about 110 ns each: 46 s of a 6.65B model's start-up on 16 cores. In float, on
 * hashed integers, it is about 6 ns with AVX2 (tests/t_model_init.c holds it to the double formula, 1e-6). */
#include <math.h>

#include "model/gpt.h"
#include "model/gpt_init_body.h"

void gpt_init_normals_avx2(uint64_t base, size_t first, size_t count, float scale, float *out);

static void normals(uint64_t base, size_t first, size_t count, float scale, float *out)
{
#if defined(__x86_64__)
    static int avx2 = -1; /* a benign race: every thread stores the same answer */
    if (avx2 < 0)
        avx2 = __builtin_cpu_supports("avx2");
    if (avx2) {
        gpt_init_normals_avx2(base, first, count, scale, out);
        return;
    }
#endif
    gpt_init_normals_body(base, first, count, scale, out);
}

void gpt_init_fill(const gpt_dims *d, uint64_t seed, int module, int index, size_t first, size_t count, float *out)
{
    float scale = 0.0f, constant = 0.0f; /* scale > 0: normal(0, scale); else the constant */
    if (module == 0)
        scale = 0.02f;
    else if (module == d->layers + 1)
        constant = index == GPT_LNF_W ? 1.0f : 0.0f;
    else
        switch ((gpt_block_param)index) {
        case GPT_LN1_W:
        case GPT_LN2_W:
            constant = 1.0f;
            break;
        case GPT_QKV_W:
        case GPT_FC_W:
            scale = 0.02f;
            break;
        case GPT_PROJ_W:
        case GPT_FCPROJ_W:
            scale = (float)(0.02 / sqrt(2.0 * d->layers));
            break;
        default:
            break; /* biases */
        }
    if (scale == 0.0f) {
        for (size_t i = 0; i < count; i++)
            out[i] = constant;
        return;
    }
    uint64_t tensor = ((uint64_t)module << 40) ^ ((uint64_t)index << 32);
    normals(gpt_mix64(seed) ^ gpt_mix64(tensor), first, count, scale, out);
}

float gpt_init_value(const gpt_dims *d, uint64_t seed, int module, int index, size_t i)
{
    float v;
    gpt_init_fill(d, seed, module, index, i, 1, &v);
    return v;
}
