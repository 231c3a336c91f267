/*
 * The CUDA gpt_ops table of fp32 activations (GPT_ACTS_FP32, see model/gpt_ops.h): the matrix products on cuBLAS, the
 * rest on the kernels of gpt_kernels.cu, everything queued on the caller's stream. The old path, kept selectable
 * (STRATA_MODEL_ACTS=fp32) until the bf16 table (gpt_ops_cuda_bf16.c) has passed on a GPU.
 *
 * cuBLAS is column-major and the model row-major. A row-major R x K matrix with row stride ld is, to
 * cuBLAS, its K x R transpose with leading dimension ld, so each product below is the host's written for
 * the transposes: the row-major out = X Y becomes the column-major out^T = Y^T X^T (operands swapped).
 * The comment over each call says which host product it is.
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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_ops.h"
#include "model/cuda/gpt_kernels_cuda.h"

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
    cuda_blas_ok(cu, st, "cublasGemmEx", entry);
}

static void gemm_batched(cuda_ops *cu, const char *entry, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, float alpha, const float *A, int lda, long long stride_a, const float *B, int ldb,
                         long long stride_b, float beta, float *out, int ldc, long long stride_out, int batch)
{
    cublasStatus_t st = cublasGemmStridedBatchedEx(cu->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, stride_a, B,
                                                   CUDA_R_32F, ldb, stride_b, &beta, out, CUDA_R_32F, ldc, stride_out,
                                                   batch, cu->compute, CUBLAS_GEMM_DEFAULT);
    cuda_blas_ok(cu, st, "cublasGemmStridedBatchedEx", entry);
}

/* ---------------------------------------------------------------- the entries */

static void cu_embed_forward(void *ctx, void *out, const int32_t *tok, const void *wte, const void *wpe, int N, int T,
                             int C)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "embed_forward"))
        cuda_ok(cu, kcuda_embed_forward(out, tok, wte, wpe, N, T, C, cu->stream), "kcuda_embed_forward",
                "embed_forward");
}

static void cu_embed_backward(void *ctx, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int N, int T,
                              int C)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "embed_backward"))
        cuda_ok(cu, kcuda_embed_backward(dwte, dwpe, dout, tok, N, T, C, cu->stream), "kcuda_embed_backward",
                "embed_backward");
}

static void cu_layernorm_forward(void *ctx, void *out, float *mean, float *rstd, const void *inp, const void *w,
                                 const void *b, int N, int C)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "layernorm_forward"))
        cuda_ok(cu, kcuda_layernorm_forward(out, mean, rstd, inp, w, b, N, C, cu->stream), "kcuda_layernorm_forward",
                "layernorm_forward");
}

static void cu_layernorm_backward(void *ctx, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                  const void *w, const float *mean, const float *rstd, int N, int C)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "layernorm_backward"))
        cuda_ok(cu, kcuda_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, cu->stream),
                "kcuda_layernorm_backward", "layernorm_backward");
}

static void cu_linear_forward(void *ctx, void *out, const void *inp, const void *W, const void *bias, int N, int C,
                              int OC)
{
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "linear_forward"))
        return;
    /* out (N x OC) = inp (N x C) W^T */
    gemm(cu, "linear_forward", CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, W, C, inp, C, 0.0f, out, OC);
    if (bias)
        cuda_ok(cu, kcuda_add_bias(out, bias, N, OC, cu->stream), "kcuda_add_bias", "linear_forward");
}

static void cu_linear_backward(void *ctx, void *dinp, float *dW, float *dbias, const void *dout, const void *inp,
                               const void *W, int N, int C, int OC)
{
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "linear_backward"))
        return;
    /* dinp (N x C) += dout (N x OC) W (OC x C) */
    if (dinp)
        gemm(cu, "linear_backward", CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, W, C, dout, OC, 1.0f, dinp, C);
    /* dW (OC x C) += dout^T inp */
    gemm(cu, "linear_backward", CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dW, C);
    if (dbias)
        cuda_ok(cu, kcuda_colsum_add(dbias, dout, N, OC, cu->stream), "kcuda_colsum_add", "linear_backward");
}

/* Head h of batch b: q, k, v are T x hs blocks of qkv (row stride 3C) at b*T*3C + h*hs (+ C, + 2C); its
 * T x T probabilities start at att + (b*NH + h)*T*T. One strided batch over b per head. */
static void cu_attention_forward(void *ctx, void *vout, float *att, const void *vqkv, int B, int T, int C, int NH)
{
    float *out = vout;
    const float *qkv = vqkv;
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "attention_forward") || !cuda_heads_ok(cu, "attention_forward", C, NH))
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
/* The probabilities are all it needs of forward: not its output. */
static void cu_attention_backward(void *ctx, void *vdqkv, float *scratch, const void *vdout, const void *vqkv,
                                  const void *out, const float *att, int B, int T, int C, int NH)
{
    (void)out;
    float *dqkv = vdqkv;
    const float *dout = vdout, *qkv = vqkv;
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "attention_backward") || !cuda_heads_ok(cu, "attention_backward", C, NH))
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

static void cu_gelu_forward(void *ctx, void *out, const void *inp, size_t n)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "gelu_forward"))
        cuda_ok(cu, kcuda_gelu_forward(out, inp, n, cu->stream), "kcuda_gelu_forward", "gelu_forward");
}

static void cu_gelu_backward(void *ctx, void *d, const void *inp, size_t n)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "gelu_backward"))
        cuda_ok(cu, kcuda_gelu_backward(d, inp, n, cu->stream), "kcuda_gelu_backward", "gelu_backward");
}

static void cu_residual_forward(void *ctx, void *out, const void *a, const void *b, size_t n)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "residual_forward"))
        cuda_ok(cu, kcuda_residual_forward(out, a, b, n, cu->stream), "kcuda_residual_forward", "residual_forward");
}

/* logits is reused by every chunk: the stream runs a chunk's products before the next chunk's. */
static void cu_head_loss(void *ctx, void *vdx, float *dwte, void *vlogits, double *row_loss, const void *vx,
                         const void *wte, const int32_t *targets, int N, int C, int V, int chunk, float scale)
{
    float *dx = vdx, *logits = vlogits;
    const float *x = vx;
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "head_loss"))
        return;
    if (chunk <= 0) {
        cuda_failf(cu, "head_loss: chunk = %d rows; it must be at least 1", chunk);
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

/* ---------------------------------------------------------------- setup */

strata_status cuda_ops_fp32_setup(cuda_ops *cu, strata_dtype math, const char **why)
{
    switch (math) {
    case STRATA_DTYPE_BF16:
        cu->compute = CUBLAS_COMPUTE_32F_FAST_16BF;
        break;
    case STRATA_DTYPE_FP16:
        cu->compute = CUBLAS_COMPUTE_32F_FAST_16F;
        break;
    case STRATA_DTYPE_FP32:
        cu->compute = CUBLAS_COMPUTE_32F;
        break;
    default:
        *why = "gpt_ops_cuda_create: math must be STRATA_DTYPE_FP32, BF16 or FP16";
        return STRATA_EINVAL;
    }
    const char *gemm_env = getenv("STRATA_MODEL_GEMM");
    if (gemm_env && strcmp(gemm_env, "bf16") != 0 && strcmp(gemm_env, "fast") != 0) {
        *why = "STRATA_MODEL_GEMM must be \"fast\" (cuBLAS's FAST_16BF on fp32 operands, the default) or \"bf16\" "
               "(operands rounded to bf16)";
        return STRATA_EINVAL;
    }
    cu->bf16_operands = math == STRATA_DTYPE_BF16 && gemm_env && strcmp(gemm_env, "bf16") == 0;
    gpt_ops *o = &cu->ops;
    o->name = "cuda";
    o->embed_forward = cu_embed_forward;
    o->embed_backward = cu_embed_backward;
    o->layernorm_forward = cu_layernorm_forward;
    o->layernorm_backward = cu_layernorm_backward;
    o->linear_forward = cu_linear_forward;
    o->linear_backward = cu_linear_backward;
    o->attention_forward = cu_attention_forward;
    o->attention_backward = cu_attention_backward;
    o->gelu_forward = cu_gelu_forward;
    o->gelu_backward = cu_gelu_backward;
    o->residual_forward = cu_residual_forward;
    o->head_loss = cu_head_loss;
    return STRATA_OK;
}
