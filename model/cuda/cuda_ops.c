/* What the CUDA gpt_ops tables share (cuda_ops.h): the sticky error, the format-neutral entries, create and destroy. */
#include "model/cuda/cuda_ops.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/gpt_kernels_cuda.h"

/* ---------------------------------------------------------------- the sticky error */

void cuda_failf(cuda_ops *cu, const char *fmt, ...)
{
    if (cu->failed)
        return;
    cu->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cu->pending, sizeof cu->pending, fmt, ap);
    va_end(ap);
}

bool cuda_ok(cuda_ops *cu, cudaError_t e, const char *call, const char *entry)
{
    if (e == cudaSuccess)
        return true;
    cuda_failf(cu, "%s (%s): %s (%s)", call, entry, cudaGetErrorString(e), cudaGetErrorName(e));
    return false;
}

void cuda_blas_ok(cuda_ops *cu, cublasStatus_t st, const char *call, const char *entry)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        cuda_failf(cu, "%s (%s): %s (%s)", call, entry, cublasGetStatusName(st), cublasGetStatusString(st));
}

/* Selecting the device is cheap when it is already current. */
bool cuda_enter(cuda_ops *cu, const char *entry)
{
    return cuda_ok(cu, cudaSetDevice(cu->device), "cudaSetDevice", entry);
}

bool cuda_heads_ok(cuda_ops *cu, const char *entry, int C, int NH)
{
    if (NH > 0 && C % NH == 0)
        return true;
    cuda_failf(cu, "%s: C = %d channels do not split into NH = %d heads", entry, C, NH);
    return false;
}

/* ---------------------------------------------------------------- the format-neutral entries */

static void cu_zero(void *ctx, void *p, size_t bytes)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "zero"))
        cuda_ok(cu, cudaMemsetAsync(p, 0, bytes, cu->stream), "cudaMemsetAsync", "zero");
}

static void cu_add_f32(void *ctx, float *out, const float *a, const float *b, size_t n)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "add_f32"))
        cuda_ok(cu, kcuda_residual_forward(out, a, b, n, cu->stream), "kcuda_residual_forward", "add_f32");
}

static void cu_to_f32(void *ctx, float *dst, const void *src, size_t n, strata_dtype dtype)
{
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "to_f32"))
        return;
    switch (dtype) {
    case STRATA_DTYPE_FP32:
        if ((const void *)dst != src && n > 0)
            cuda_ok(cu, cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cu->stream),
                    "cudaMemcpyAsync", "to_f32");
        return;
    case STRATA_DTYPE_BF16:
        cuda_ok(cu, kcuda_bf16_to_f32(dst, src, n, cu->stream), "kcuda_bf16_to_f32", "to_f32");
        return;
    case STRATA_DTYPE_FP16:
        cuda_ok(cu, kcuda_f16_to_f32(dst, src, n, cu->stream), "kcuda_f16_to_f32", "to_f32");
        return;
    default:
        cuda_failf(cu, "to_f32: dtype %d is not FP32, BF16 or FP16", (int)dtype);
    }
}

static void cu_from_f32(void *ctx, void *dst, const float *src, size_t n, strata_dtype dtype)
{
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "from_f32"))
        return;
    switch (dtype) {
    case STRATA_DTYPE_FP32:
        if (dst != (const void *)src && n > 0)
            cuda_ok(cu, cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cu->stream),
                    "cudaMemcpyAsync", "from_f32");
        return;
    case STRATA_DTYPE_BF16:
        cuda_ok(cu, kcuda_f32_to_bf16(dst, src, n, cu->stream), "kcuda_f32_to_bf16", "from_f32");
        return;
    case STRATA_DTYPE_FP16:
        cuda_ok(cu, kcuda_f32_to_f16(dst, src, n, cu->stream), "kcuda_f32_to_f16", "from_f32");
        return;
    default:
        cuda_failf(cu, "from_f32: dtype %d is not FP32, BF16 or FP16", (int)dtype);
    }
}

/* host_src may be reused on return, and a copy from pinned memory is truly asynchronous: wait for it.
 * Uploads are the tokens and targets, a few KB once per micro-step. */
static void cu_upload(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "upload") || bytes == 0)
        return;
    if (cuda_ok(cu, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cu->stream), "cudaMemcpyAsync",
                "upload"))
        cuda_ok(cu, cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize", "upload");
}

static strata_status cu_to_host(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "to_host")) {
        if (bytes > 0)
            cuda_ok(cu, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cu->stream), "cudaMemcpyAsync",
                    "to_host");
        /* A kernel that faulted is reported by the wait, not by its launch. */
        cuda_ok(cu, cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize", "to_host");
        cuda_ok(cu, cudaGetLastError(), "cudaGetLastError", "to_host");
    }
    if (!cu->failed) {
        cu->reported[0] = '\0';
        return STRATA_OK;
    }
    memcpy(cu->reported, cu->pending, sizeof cu->reported);
    cu->pending[0] = '\0';
    cu->failed = false;
    return STRATA_EIO;
}

static const char *cu_error(void *ctx)
{
    cuda_ops *cu = ctx;
    return cu->reported;
}

/* ---------------------------------------------------------------- create, destroy */

/* cublasCreate's failures, in words (why must be a static string). */
static const char *create_failure(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "cublasCreate: CUBLAS_STATUS_NOT_INITIALIZED (no usable CUDA device, or the driver is too old)";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "cublasCreate: CUBLAS_STATUS_ALLOC_FAILED (out of device memory for cuBLAS's workspace)";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "cublasCreate: CUBLAS_STATUS_ARCH_MISMATCH (this GPU is too old for this cuBLAS)";
    default:
        return "cublasCreate failed";
    }
}

strata_status gpt_ops_cuda_create(void *stream, gpt_act_format acts, strata_dtype math, void *workspace, gpt_ops **out,
                                  const char **why)
{
    const char *ignored;
    if (!why)
        why = &ignored;
    *why = "";
    *out = NULL;
    if (acts != GPT_ACTS_FP32 && acts != GPT_ACTS_BF16) {
        *why = "gpt_ops_cuda_create: acts must be GPT_ACTS_FP32 or GPT_ACTS_BF16";
        return STRATA_EINVAL;
    }
    cuda_ops *cu = calloc(1, sizeof *cu);
    if (!cu) {
        *why = "gpt_ops_cuda_create: out of host memory";
        return STRATA_ENOMEM;
    }
    cu->stream = (cudaStream_t)stream;
    cu->lt_workspace = workspace;
    cu->lt_workspace_bytes = workspace ? gpt_ops_workspace_bytes(acts) : 0;
    cu->ops = (gpt_ops){
        .ctx = cu,
        .add_f32 = cu_add_f32,
        .zero = cu_zero,
        .to_f32 = cu_to_f32,
        .from_f32 = cu_from_f32,
        .upload = cu_upload,
        .to_host = cu_to_host,
        .error = cu_error,
    };
    strata_status rc = STRATA_EIO;

    /* The handle must live on the stream's device (the legacy default stream is the current device's). */
    cudaError_t e = stream ? cudaStreamGetDevice(cu->stream, &cu->device) : cudaGetDevice(&cu->device);
    if (e != cudaSuccess) {
        *why = "cudaStreamGetDevice failed: no usable CUDA device, or the stream is not a valid CUDA stream";
        goto fail;
    }
    if (cudaSetDevice(cu->device) != cudaSuccess) {
        *why = "cudaSetDevice failed for the stream's device";
        goto fail;
    }
    cublasStatus_t st = cublasCreate(&cu->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cu->blas = NULL;
        *why = create_failure(st);
        goto fail;
    }
    if (cublasSetStream(cu->blas, cu->stream) != CUBLAS_STATUS_SUCCESS) {
        *why = "cublasSetStream failed";
        goto fail;
    }
    /* The compute type alone picks the tensor-core format; the handle's math mode stays the default. */
    if (cublasSetMathMode(cu->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
        *why = "cublasSetMathMode(CUBLAS_DEFAULT_MATH) failed";
        goto fail;
    }
    rc = acts == GPT_ACTS_BF16 ? cuda_ops_bf16_setup(cu, math, why) : cuda_ops_fp32_setup(cu, math, why);
    if (rc != STRATA_OK)
        goto fail;
    cu->ops.acts = acts;
    *out = &cu->ops;
    return STRATA_OK;

fail:
    gpt_ops_cuda_destroy(&cu->ops);
    return rc;
}

void gpt_ops_cuda_destroy(gpt_ops *ops)
{
    if (!ops)
        return;
    cuda_ops *cu = ops->ctx;
    if (cu->blas || cu->lt) {
        /* Drain what is queued before the handles (and their workspaces) go; nobody is left to hear an error. */
        if (cudaSetDevice(cu->device) == cudaSuccess)
            (void)cudaStreamSynchronize(cu->stream);
    }
    if (cu->blas)
        cublasDestroy(cu->blas);
    if (cu->lt)
        cublasLtDestroy(cu->lt);
    for (int i = 0; i < 2; i++)
        if (cu->scratch[i])
            (void)cudaFree(cu->scratch[i]);
    free(cu);
}
