/* The GELU bodies (gpt_math.h) built for AVX2 + FMA: CMakeLists.txt compiles *_avx2.c files with that ISA's flags;
 * gpt_kernels.c calls them where the CPU has both. FMA can round differently from the baseline build: results are
 * the same for any thread count on one machine, not across CPUs with and without AVX2. */
#include "model/gpt_math.h"

void gelu_forward_avx2(float *out, const float *inp, size_t n)
{
    gelu_forward_body(out, inp, n);
}

void gelu_backward_avx2(float *d, const float *inp, size_t n)
{
    gelu_backward_body(d, inp, n);
}
