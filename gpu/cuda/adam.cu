/* The device Adam kernel (see adam.h). */
#include "gpu/cuda/adam.h"

#include "cpu_adam/adam.h"
#define CVT_FN __host__ __device__ static inline
#include "base/half.h"

/* One element, in adam_ref.c's order. Every operation is an explicit round-to-nearest intrinsic: nvcc contracts
 * a * b + c into an FMA by default, and the reference fuses exactly where it writes fmaf, nowhere else. */
template <strata_dtype P>
static __global__ void adam_kernel(adam_consts c, float *master, float *m, float *v, const float *grad, void *param,
                                   size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float p = master[i];
        float g = __fmul_rn(grad[i], c.grad_scale);
        if (c.use_l2)
            g = __fmaf_rn(p, c.l2, g);
        float mi = c.lerp ? __fmaf_rn(c.lerp_coeff, __fsub_rn(g, m[i]), c.lerp_from_m ? m[i] : g)
                          : __fmaf_rn(g, c.one_minus_beta1, __fmul_rn(m[i], c.beta1));
        float vi = __fmaf_rn(__fmul_rn(g, c.one_minus_beta2), g, __fmul_rn(v[i], c.beta2));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
        p = __fmul_rn(p, c.decay);
        p = __fadd_rn(p, __fdiv_rn(__fmul_rn(c.neg_step, mi), denom));
        master[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (P == STRATA_DTYPE_FP32)
            ((float *)param)[i] = p;
        else if (P == STRATA_DTYPE_BF16)
            ((uint16_t *)param)[i] = cvt_f32_to_bf16(p);
        else if (P == STRATA_DTYPE_FP16)
            ((uint16_t *)param)[i] = cvt_f32_to_fp16(p);
    }
}

extern "C" cudaError_t cuda_adam_step(const struct adam_consts *c, float *master, float *m, float *v,
                                      const float *grad, void *param, int param_dtype, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    const unsigned threads = 256;
    size_t want = (n + threads - 1) / threads;
    unsigned blocks = want < 8192 ? (unsigned)want : 8192u;
    switch (param_dtype) {
    case STRATA_DTYPE_FP32:
        adam_kernel<STRATA_DTYPE_FP32><<<blocks, threads, 0, stream>>>(*c, master, m, v, grad, param, n);
        break;
    case STRATA_DTYPE_BF16:
        adam_kernel<STRATA_DTYPE_BF16><<<blocks, threads, 0, stream>>>(*c, master, m, v, grad, param, n);
        break;
    case STRATA_DTYPE_FP16:
        adam_kernel<STRATA_DTYPE_FP16><<<blocks, threads, 0, stream>>>(*c, master, m, v, grad, param, n);
        break;
    default:
        adam_kernel<STRATA_DTYPE_NONE><<<blocks, threads, 0, stream>>>(*c, master, m, v, grad, param, n);
        break;
    }
    return cudaGetLastError();
}
