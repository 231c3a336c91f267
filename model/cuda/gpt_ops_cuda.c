/*
 * The CUDA gpt_ops table (see model/gpt_ops.h): the matrix products on cuBLAS, the rest on the kernels of
 * gpt_kernels.cu, everything queued on the caller's stream.
 *
 * cuBLAS is column-major and the model row-major. A row-major R x K matrix with row stride ld is, to
 * cuBLAS, its K x R transpose with leading dimension ld, so each product below is the host's written for
 * the transposes: the row-major out = X Y becomes the column-major out^T = Y^T X^T (operands swapped).
 * The comment over each call says which host product it is.
 *
 * The entries return nothing, so the first failure since the last to_host is kept with the entry's name
 * ("cublasGemmEx (linear_forward): CUBLAS_STATUS_..."); to_host returns it as STRATA_EIO and error() says it.
 *
 * bf16 math, two ways (STRATA_MODEL_GEMM): "fast" (the default) hands cuBLAS the fp32 operands with
 * CUBLAS_COMPUTE_32F_FAST_16BF, which on an H200 (Nsight Compute, 2026-11-26) ran TF32 kernels
 * (sm90_xmma_gemm_f32f32_tf32f32): half the bf16 tensor-core rate, fp32 operand traffic. "bf16" rounds the operands of
 * the linear layers and the head to bf16 (nearest even) in a scratch of this table's own and runs cuBLAS's bf16
 * kernels with fp32 accumulation and output, as torch.autocast does; the attention products stay "fast". It passes
 * t_model_cuda but is not the default: its scratch (the two largest operands so far, 2 bytes per element) lies outside
 * the engine's device budget, and ran out of memory at 6.65B; at 124M the conversions cost what the bf16 kernels
 * save (benchmarks/RESULTS.md, 2026-11-26). bf16 activations end to end are the way on.
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "model/cuda/gpt_kernels_cuda.h"
#include "model/gpt_ops.h"

#define ERROR_LEN 256

typedef struct cuda_ops {
    gpt_ops ops; /* ops.ctx points back here */
    cudaStream_t stream;
    int device; /* the stream's: the entries may be called from any thread */
    cublasHandle_t blas;
    cublasComputeType_t compute;
    bool bf16_operands; /* STRATA_MODEL_GEMM=bf16 with bf16 math: gemm() rounds its operands into scratch */
    void *scratch[2];   /* the bf16 copies of A and B */
    size_t scratch_bytes[2];
    bool failed;              /* pending holds the first failure since the last to_host */
    char pending[ERROR_LEN];
    char reported[ERROR_LEN]; /* what the last to_host reported; "" after one that succeeded */
} cuda_ops;

/* ---------------------------------------------------------------- the sticky error */

static void failf(cuda_ops *cu, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Keeps the first failure only: once one step failed, later ones usually fail because of it. */
static void failf(cuda_ops *cu, const char *fmt, ...)
{
    if (cu->failed)
        return;
    cu->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cu->pending, sizeof cu->pending, fmt, ap);
    va_end(ap);
}

static bool cuda_ok(cuda_ops *cu, cudaError_t e, const char *call, const char *entry)
{
    if (e == cudaSuccess)
        return true;
    failf(cu, "%s (%s): %s (%s)", call, entry, cudaGetErrorString(e), cudaGetErrorName(e));
    return false;
}

static void blas_ok(cuda_ops *cu, cublasStatus_t st, const char *call, const char *entry)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        failf(cu, "%s (%s): %s (%s)", call, entry, cublasGetStatusName(st), cublasGetStatusString(st));
}

/* The runtime keeps the current device per thread, and the handle and stream belong to one device;
 * selecting it is cheap when it is already current. */
static bool enter(cuda_ops *cu, const char *entry)
{
    return cuda_ok(cu, cudaSetDevice(cu->device), "cudaSetDevice", entry);
}

/* ---------------------------------------------------------------- cuBLAS */

/* Scratch slot i holding at least bytes (grown by replacing it: cudaFree waits for the device, so nothing queued
 * still reads the old one); NULL after a failure, which is kept. */
static void *scratch(cuda_ops *cu, int i, size_t bytes, const char *entry)
{
    if (cu->scratch_bytes[i] >= bytes)
        return cu->scratch[i];
    if (cu->scratch[i] && !cuda_ok(cu, cudaFree(cu->scratch[i]), "cudaFree", entry))
        return NULL;
    cu->scratch[i] = NULL;
    cu->scratch_bytes[i] = 0;
    if (!cuda_ok(cu, cudaMalloc(&cu->scratch[i], bytes), "cudaMalloc (the bf16 operand scratch)", entry))
        return NULL;
    cu->scratch_bytes[i] = bytes;
    return cu->scratch[i];
}

/* The bf16 copy of a column-major operand of cols columns with leading dimension ld, in scratch slot i. */
static const void *operand_bf16(cuda_ops *cu, int i, const float *x, int ld, int cols, const char *entry)
{
    size_t n = (size_t)ld * (size_t)cols;
    void *dst = scratch(cu, i, n * 2, entry);
    if (dst && !cuda_ok(cu, kcuda_f32_to_bf16(dst, x, n, cu->stream), "kcuda_f32_to_bf16", entry))
        return NULL;
    return dst;
}

static void gemm(cuda_ops *cu, const char *entry, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *out, int ldc)
{
    cublasStatus_t st;
    if (cu->bf16_operands) {
        const void *a = operand_bf16(cu, 0, A, lda, ta == CUBLAS_OP_N ? k : m, entry);
        const void *b = a ? operand_bf16(cu, 1, B, ldb, tb == CUBLAS_OP_N ? n : k, entry) : NULL;
        if (!b)
            return;
        st = cublasGemmEx(cu->blas, ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &beta, out,
                          CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
        st = cublasGemmEx(cu->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta, out,
                          CUDA_R_32F, ldc, cu->compute, CUBLAS_GEMM_DEFAULT);
    }
    blas_ok(cu, st, "cublasGemmEx", entry);
}

static void gemm_batched(cuda_ops *cu, const char *entry, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, float alpha, const float *A, int lda, long long stride_a, const float *B, int ldb,
                         long long stride_b, float beta, float *out, int ldc, long long stride_out, int batch)
{
    cublasStatus_t st = cublasGemmStridedBatchedEx(cu->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, stride_a, B,
                                                   CUDA_R_32F, ldb, stride_b, &beta, out, CUDA_R_32F, ldc,
                                                   stride_out, batch, cu->compute, CUBLAS_GEMM_DEFAULT);
    blas_ok(cu, st, "cublasGemmStridedBatchedEx", entry);
}

/* ---------------------------------------------------------------- the entries */

static void cu_embed_forward(void *ctx, float *out, const int32_t *tok, const float *wte, const float *wpe, int N,
                             int T, int C)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "embed_forward"))
        cuda_ok(cu, kcuda_embed_forward(out, tok, wte, wpe, N, T, C, cu->stream), "kcuda_embed_forward",
                "embed_forward");
}

static void cu_embed_backward(void *ctx, float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N,
                              int T, int C)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "embed_backward"))
        cuda_ok(cu, kcuda_embed_backward(dwte, dwpe, dout, tok, N, T, C, cu->stream), "kcuda_embed_backward",
                "embed_backward");
}

static void cu_layernorm_forward(void *ctx, float *out, float *mean, float *rstd, const float *inp, const float *w,
                                 const float *b, int N, int C)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "layernorm_forward"))
        cuda_ok(cu, kcuda_layernorm_forward(out, mean, rstd, inp, w, b, N, C, cu->stream),
                "kcuda_layernorm_forward", "layernorm_forward");
}

static void cu_layernorm_backward(void *ctx, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                  const float *w, const float *mean, const float *rstd, int N, int C)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "layernorm_backward"))
        cuda_ok(cu, kcuda_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, cu->stream),
                "kcuda_layernorm_backward", "layernorm_backward");
}

static void cu_linear_forward(void *ctx, float *out, const float *inp, const float *W, const float *bias, int N,
                              int C, int OC)
{
    cuda_ops *cu = ctx;
    if (!enter(cu, "linear_forward"))
        return;
    /* out (N x OC) = inp (N x C) W^T */
    gemm(cu, "linear_forward", CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, W, C, inp, C, 0.0f, out, OC);
    if (bias)
        cuda_ok(cu, kcuda_add_bias(out, bias, N, OC, cu->stream), "kcuda_add_bias", "linear_forward");
}

static void cu_linear_backward(void *ctx, float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                               const float *W, int N, int C, int OC)
{
    cuda_ops *cu = ctx;
    if (!enter(cu, "linear_backward"))
        return;
    /* dinp (N x C) += dout (N x OC) W (OC x C) */
    if (dinp)
        gemm(cu, "linear_backward", CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, W, C, dout, OC, 1.0f, dinp, C);
    /* dW (OC x C) += dout^T inp */
    gemm(cu, "linear_backward", CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dW, C);
    if (dbias)
        cuda_ok(cu, kcuda_colsum_add(dbias, dout, N, OC, cu->stream), "kcuda_colsum_add", "linear_backward");
}

static bool heads_ok(cuda_ops *cu, const char *entry, int C, int NH)
{
    if (NH > 0 && C % NH == 0)
        return true;
    failf(cu, "%s: C = %d channels do not split into NH = %d heads", entry, C, NH);
    return false;
}

/* Head h of batch b: q, k, v are T x hs blocks of qkv (row stride 3C) at b*T*3C + h*hs (+ C, + 2C); its
 * T x T probabilities start at att + (b*NH + h)*T*T. One strided batch over b per head. */
static void cu_attention_forward(void *ctx, float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    cuda_ops *cu = ctx;
    if (!enter(cu, "attention_forward") || !heads_ok(cu, "attention_forward", C, NH))
        return;
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long stride_qkv = (long long)T * C3, stride_att = (long long)NH * T * T, stride_out = (long long)T * C;
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + (size_t)h * hs, *k = q + C;
        float *a = att + (size_t)h * T * T;
        /* a (T x T) = scale q k^T */
        gemm_batched(cu, "attention_forward", CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, C3, stride_qkv, q, C3,
                     stride_qkv, 0.0f, a, T, stride_att, B);
    }
    cuda_ok(cu, kcuda_causal_softmax(att, B * NH * T, T, cu->stream), "kcuda_causal_softmax", "attention_forward");
    for (int h = 0; h < NH; h++) {
        const float *v = qkv + (size_t)h * hs + 2 * (size_t)C;
        const float *a = att + (size_t)h * T * T;
        /* y (T x hs, row stride C) = a v */
        gemm_batched(cu, "attention_forward", CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, C3, stride_qkv, a, T,
                     stride_att, 0.0f, out + (size_t)h * hs, C, stride_out, B);
    }
}

/* scratch is laid out as att: head h of batch b at (b*NH + h)*T*T. */
static void cu_attention_backward(void *ctx, float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *att, int B, int T, int C, int NH)
{
    cuda_ops *cu = ctx;
    if (!enter(cu, "attention_backward") || !heads_ok(cu, "attention_backward", C, NH))
        return;
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long stride_qkv = (long long)T * C3, stride_att = (long long)NH * T * T, stride_out = (long long)T * C;
    for (int h = 0; h < NH; h++) {
        const float *v = qkv + (size_t)h * hs + 2 * (size_t)C, *g = dout + (size_t)h * hs;
        const float *a = att + (size_t)h * T * T;
        float *da = scratch + (size_t)h * T * T, *dv = dqkv + (size_t)h * hs + 2 * (size_t)C;
        /* da (T x T) = g v^T */
        gemm_batched(cu, "attention_backward", CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, C3, stride_qkv, g, C,
                     stride_out, 0.0f, da, T, stride_att, B);
        /* dv (T x hs, row stride 3C) = a^T g */
        gemm_batched(cu, "attention_backward", CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, g, C, stride_out, a, T,
                     stride_att, 0.0f, dv, C3, stride_qkv, B);
    }
    cuda_ok(cu, kcuda_causal_softmax_backward(scratch, att, B * NH * T, T, cu->stream),
            "kcuda_causal_softmax_backward", "attention_backward");
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + (size_t)h * hs, *k = q + C, *da = scratch + (size_t)h * T * T;
        float *dq = dqkv + (size_t)h * hs, *dk = dq + C;
        /* dq = scale dpre k */
        gemm_batched(cu, "attention_backward", CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, k, C3, stride_qkv, da, T,
                     stride_att, 0.0f, dq, C3, stride_qkv, B);
        /* dk = scale dpre^T q */
        gemm_batched(cu, "attention_backward", CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, C3, stride_qkv, da, T,
                     stride_att, 0.0f, dk, C3, stride_qkv, B);
    }
}

static void cu_gelu_forward(void *ctx, float *out, const float *inp, size_t n)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "gelu_forward"))
        cuda_ok(cu, kcuda_gelu_forward(out, inp, n, cu->stream), "kcuda_gelu_forward", "gelu_forward");
}

static void cu_gelu_backward(void *ctx, float *d, const float *inp, size_t n)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "gelu_backward"))
        cuda_ok(cu, kcuda_gelu_backward(d, inp, n, cu->stream), "kcuda_gelu_backward", "gelu_backward");
}

static void cu_residual_forward(void *ctx, float *out, const float *a, const float *b, size_t n)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "residual_forward"))
        cuda_ok(cu, kcuda_residual_forward(out, a, b, n, cu->stream), "kcuda_residual_forward", "residual_forward");
}

/* logits is reused by every chunk: the stream runs a chunk's products before the next chunk's. */
static void cu_head_loss(void *ctx, float *dx, float *dwte, float *logits, double *row_loss, const float *x,
                         const float *wte, const int32_t *targets, int N, int C, int V, int chunk, float scale)
{
    cuda_ops *cu = ctx;
    if (!enter(cu, "head_loss"))
        return;
    if (chunk <= 0) {
        failf(cu, "head_loss: chunk = %d rows; it must be at least 1", chunk);
        return;
    }
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int rows = N - r0 < chunk ? N - r0 : chunk;
        const float *xr = x + (size_t)r0 * C;
        /* logits (rows x V) = xr wte^T */
        gemm(cu, "head_loss", CUBLAS_OP_T, CUBLAS_OP_N, V, rows, C, 1.0f, wte, C, xr, C, 0.0f, logits, V);
        cuda_ok(cu, kcuda_cross_entropy(logits, row_loss + r0, targets + r0, rows, V, scale, dx != NULL, cu->stream),
                "kcuda_cross_entropy", "head_loss");
        if (!dx)
            continue;
        /* dx rows (rows x C, overwritten) = dlogits wte */
        gemm(cu, "head_loss", CUBLAS_OP_N, CUBLAS_OP_N, C, rows, V, 1.0f, wte, C, logits, V, 0.0f, dx + (size_t)r0 * C,
             C);
        /* dwte (V x C) += dlogits^T xr */
        if (dwte)
            gemm(cu, "head_loss", CUBLAS_OP_N, CUBLAS_OP_T, C, V, rows, 1.0f, xr, C, logits, V, 1.0f, dwte, C);
    }
}

static void cu_zero(void *ctx, float *p, size_t n)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "zero"))
        cuda_ok(cu, cudaMemsetAsync(p, 0, n * sizeof(float), cu->stream), "cudaMemsetAsync", "zero");
}

static void cu_to_f32(void *ctx, float *dst, const void *src, size_t n, strata_dtype dtype)
{
    cuda_ops *cu = ctx;
    if (!enter(cu, "to_f32"))
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
        failf(cu, "to_f32: dtype %d is not FP32, BF16 or FP16", (int)dtype);
    }
}

static void cu_from_f32(void *ctx, void *dst, const float *src, size_t n, strata_dtype dtype)
{
    cuda_ops *cu = ctx;
    if (!enter(cu, "from_f32"))
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
        failf(cu, "from_f32: dtype %d is not FP32, BF16 or FP16", (int)dtype);
    }
}

/* host_src may be reused on return, and a copy from pinned memory is truly asynchronous: wait for it.
 * Uploads are the tokens and targets, a few KB once per micro-step. */
static void cu_upload(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    cuda_ops *cu = ctx;
    if (!enter(cu, "upload") || bytes == 0)
        return;
    if (cuda_ok(cu, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cu->stream), "cudaMemcpyAsync",
                "upload"))
        cuda_ok(cu, cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize", "upload");
}

static strata_status cu_to_host(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    cuda_ops *cu = ctx;
    if (enter(cu, "to_host")) {
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

strata_status gpt_ops_cuda_create(void *stream, strata_dtype math, gpt_ops **out, const char **why)
{
    const char *ignored;
    if (!why)
        why = &ignored;
    *why = "";
    *out = NULL;

    cublasComputeType_t compute;
    switch (math) {
    case STRATA_DTYPE_BF16:
        compute = CUBLAS_COMPUTE_32F_FAST_16BF;
        break;
    case STRATA_DTYPE_FP16:
        compute = CUBLAS_COMPUTE_32F_FAST_16F;
        break;
    case STRATA_DTYPE_FP32:
        compute = CUBLAS_COMPUTE_32F;
        break;
    default:
        *why = "gpt_ops_cuda_create: math must be STRATA_DTYPE_FP32, BF16 or FP16";
        return STRATA_EINVAL;
    }

    cuda_ops *cu = calloc(1, sizeof *cu);
    if (!cu) {
        *why = "gpt_ops_cuda_create: out of host memory";
        return STRATA_ENOMEM;
    }
    cu->stream = (cudaStream_t)stream;
    cu->compute = compute;
    const char *gemm_env = getenv("STRATA_MODEL_GEMM");
    if (gemm_env && strcmp(gemm_env, "bf16") != 0 && strcmp(gemm_env, "fast") != 0) {
        *why = "STRATA_MODEL_GEMM must be \"fast\" (cuBLAS's FAST_16BF on fp32 operands, the default) or \"bf16\" "
               "(operands rounded to bf16)";
        free(cu);
        return STRATA_EINVAL;
    }
    cu->bf16_operands = math == STRATA_DTYPE_BF16 && gemm_env && strcmp(gemm_env, "bf16") == 0;
    cu->ops = (gpt_ops){
        .name = "cuda",
        .ctx = cu,
        .embed_forward = cu_embed_forward,
        .embed_backward = cu_embed_backward,
        .layernorm_forward = cu_layernorm_forward,
        .layernorm_backward = cu_layernorm_backward,
        .linear_forward = cu_linear_forward,
        .linear_backward = cu_linear_backward,
        .attention_forward = cu_attention_forward,
        .attention_backward = cu_attention_backward,
        .gelu_forward = cu_gelu_forward,
        .gelu_backward = cu_gelu_backward,
        .residual_forward = cu_residual_forward,
        .head_loss = cu_head_loss,
        .zero = cu_zero,
        .to_f32 = cu_to_f32,
        .from_f32 = cu_from_f32,
        .upload = cu_upload,
        .to_host = cu_to_host,
        .error = cu_error,
    };

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
    *out = &cu->ops;
    return STRATA_OK;

fail:
    gpt_ops_cuda_destroy(&cu->ops);
    return STRATA_EIO;
}

void gpt_ops_cuda_destroy(gpt_ops *ops)
{
    if (!ops)
        return;
    cuda_ops *cu = ops->ctx;
    if (cu->blas) {
        /* Drain what is queued before the handle (and its workspace) goes; nobody is left to hear an error. */
        if (cudaSetDevice(cu->device) == cudaSuccess)
            (void)cudaStreamSynchronize(cu->stream);
        cublasDestroy(cu->blas);
    }
    for (int i = 0; i < 2; i++)
        if (cu->scratch[i])
            (void)cudaFree(cu->scratch[i]);
    free(cu);
}
