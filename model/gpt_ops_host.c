/* The host gpt_ops table: the OpenBLAS + OpenMP kernels of gpt_kernels.c on host memory, fp32. */
#include <string.h>

#include "model/gpt_kernels.h"
#include "model/gpt_ops.h"

static void h_zero(void *ctx, float *p, size_t n)
{
    (void)ctx;
    memset(p, 0, n * sizeof(float));
}

static float half_to_float(uint16_t h, strata_dtype dt)
{
    if (dt == STRATA_DTYPE_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

static uint16_t float_to_half(float f, strata_dtype dt)
{
    if (dt == STRATA_DTYPE_BF16) {
        uint32_t x;
        memcpy(&x, &f, 4);
        if ((x & 0x7fffffff) > 0x7f800000)
            return (uint16_t)((x >> 16) | 0x40); /* keep NaN a NaN */
        return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16); /* round to nearest even */
    }
    _Float16 h = (_Float16)f; /* the C conversion rounds to nearest even */
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

static void h_to_f32(void *ctx, float *dst, const void *src, size_t n, strata_dtype dt)
{
    (void)ctx;
    if (dt == STRATA_DTYPE_FP32) {
        memmove(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        dst[i] = half_to_float(h[i], dt);
}

static void h_from_f32(void *ctx, void *dst, const float *src, size_t n, strata_dtype dt)
{
    (void)ctx;
    if (dt == STRATA_DTYPE_FP32) {
        memmove(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *h = dst;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        h[i] = float_to_half(src[i], dt);
}

static void h_upload(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, host_src, bytes);
}

static strata_status h_to_host(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(host_dst, src, bytes);
    return STRATA_OK; /* host kernels cannot fail */
}

static const char *h_error(void *ctx)
{
    (void)ctx;
    return "";
}

static const gpt_ops host_ops = {
    .name = "host",
    .embed_forward = k_embed_forward,
    .embed_backward = k_embed_backward,
    .layernorm_forward = k_layernorm_forward,
    .layernorm_backward = k_layernorm_backward,
    .linear_forward = k_linear_forward,
    .linear_backward = k_linear_backward,
    .attention_forward = k_attention_forward,
    .attention_backward = k_attention_backward,
    .gelu_forward = k_gelu_forward,
    .gelu_backward = k_gelu_backward,
    .residual_forward = k_residual_forward,
    .head_loss = k_head_loss,
    .zero = h_zero,
    .to_f32 = h_to_f32,
    .from_f32 = h_from_f32,
    .upload = h_upload,
    .to_host = h_to_host,
    .error = h_error,
};

const gpt_ops *gpt_ops_host(void)
{
    return &host_ops;
}
