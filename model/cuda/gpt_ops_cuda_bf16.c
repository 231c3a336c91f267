/*
 * The CUDA gpt_ops table of bf16 activations (GPT_ACTS_BF16, see model/gpt_ops.h), as torch.autocast and llm.c
 * compute: activations, weights and activation gradients in bf16; every product on bf16 tensor cores with fp32
 * accumulation; LayerNorm and softmax statistics, parameter gradients and losses in fp32 (double for the losses).
 *   - linear forward: cuBLASLt with the bias epilogue (no pass of its own for the bias);
 *   - the other products: cublasGemmEx, bf16 operands, bf16 or fp32 (parameter gradients) outputs;
 *   - attention: attention_flash.cu, never a T x T matrix (state: each query row's log-sum-exp);
 *   - the head: logits rows padded to gpt_logits_ld (a multiple of 128) and the fused classifier of
 *     gpt_kernels_bf16.cu, which turns bf16 logits into the loss and their gradient in place;
 *   - the embeddings' backward grouped by token (embed_backward.cu): parallel and deterministic.
 * cuBLAS is column-major and the model row-major; as in gpt_ops_cuda.c, each product is the host's written for the
 * transposes (the row-major out = X Y is the column-major out^T = Y^T X^T), and the comment over each call says which.
 */
#include <stdbool.h>
#include <stdint.h>

#include "model/cuda/attention_flash.h"
#include "model/cuda/cuda_ops.h"
#include "model/cuda/embed_backward.h"
#include "model/cuda/gpt_kernels_bf16.h"

/* ---------------------------------------------------------------- products */

/* out (m x n column-major, ldc) = alpha op(A) op(B) + beta out, with bf16 A and B and an out of out_type (bf16 for
 * activations, fp32 for parameter gradients), accumulated in fp32. */
static void gemm16(cuda_ops *cu, const char *entry, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                   const void *A, int lda, const void *B, int ldb, float beta, void *out, cudaDataType_t out_type,
                   int ldc)
{
    float alpha = 1.0f;
    cublasStatus_t st = cublasGemmEx(cu->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta,
                                     out, out_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cuda_blas_ok(cu, st, "cublasGemmEx", entry);
}

/* The largest power of two up to 256 that divides p's address: cuBLASLt picks algorithms for pointers aligned to 256
 * bytes unless told otherwise (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*), and a weight inside the engine's store may be
 * aligned less. */
static uint32_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 1;
    while (align < 256 && (a & (2 * align - 1)) == 0)
        align *= 2;
    return align;
}

/* The linear layer's forward in one cuBLASLt call: out (OC x N column-major, bf16) = W^T inp + bias, the bias added
 * by the epilogue (bf16, broadcast over the N columns). W is the row-major OC x C weight (column-major C x OC), inp
 * the row-major N x C input (column-major C x N). */
static void lt_linear(cuda_ops *cu, void *out, const void *inp, const void *W, const void *bias, int N, int C, int OC)
{
    const char *entry = "linear_forward";
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    /* The epilogue reads the bias 16 bytes at a time; a bias aligned less gets its own pass after the product. */
    bool fused_bias = bias && alignment(bias) >= 16;
    cublasLtEpilogue_t epilogue = fused_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    uint32_t align_a = alignment(W), align_b = alignment(inp), align_d = alignment(out);
    cudaDataType_t bias_type = CUDA_R_16BF;
    size_t ws = cu->lt_workspace_bytes;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    if (st == CUBLAS_STATUS_SUCCESS && fused_bias)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (st == CUBLAS_STATUS_SUCCESS && fused_bias)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    /* Layouts as stored: A = W is C x OC (ld C), B = inp is C x N (ld C), D = out is OC x N (ld OC). */
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, (uint64_t)C, (uint64_t)OC, C);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, (uint64_t)C, (uint64_t)N, C);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, (uint64_t)OC, (uint64_t)N, OC);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                  sizeof align_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                  sizeof align_b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                  sizeof align_d);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                  sizeof align_d);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(cu->lt, op, la, lb, ld, ld, pref, 1, &heur, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found == 0)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) {
        float alpha = 1.0f, beta = 0.0f;
        st = cublasLtMatmul(cu->lt, op, &alpha, W, la, inp, lb, &beta, out, ld, out, ld, &heur.algo, cu->lt_workspace,
                            ws, cu->stream);
    }
    cuda_blas_ok(cu, st, "cublasLt (the product with its bias epilogue)", entry);
    if (st == CUBLAS_STATUS_SUCCESS && bias && !fused_bias)
        cuda_ok(cu, kbf16_add_bias(out, bias, N, OC, cu->stream), "kbf16_add_bias", entry);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (op)
        cublasLtMatmulDescDestroy(op);
}

/* ---------------------------------------------------------------- the entries */

static void b_embed_forward(void *ctx, void *out, const int32_t *tok, const void *wte, const void *wpe, int N, int T,
                            int C)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "embed_forward"))
        cuda_ok(cu, kbf16_embed_forward(out, tok, wte, wpe, N, T, C, cu->stream), "kbf16_embed_forward",
                "embed_forward");
}

static void b_embed_backward(void *ctx, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int N, int T,
                             int C)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "embed_backward"))
        cuda_ok(cu, kcuda_embed_backward_grouped(dwte, dwpe, dout, KCUDA_BF16, tok, N, T, C, cu->stream),
                "kcuda_embed_backward_grouped", "embed_backward");
}

static void b_layernorm_forward(void *ctx, void *out, float *mean, float *rstd, const void *inp, const void *w,
                                const void *b, int N, int C)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "layernorm_forward"))
        cuda_ok(cu, kbf16_layernorm_forward(out, mean, rstd, inp, w, b, N, C, cu->stream), "kbf16_layernorm_forward",
                "layernorm_forward");
}

static void b_layernorm_backward(void *ctx, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                 const void *w, const float *mean, const float *rstd, int N, int C)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "layernorm_backward"))
        cuda_ok(cu, kbf16_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, cu->stream),
                "kbf16_layernorm_backward", "layernorm_backward");
}

static void b_linear_forward(void *ctx, void *out, const void *inp, const void *W, const void *bias, int N, int C,
                             int OC)
{
    cuda_ops *cu = ctx;
    /* out (N x OC) = inp (N x C) W^T + bias */
    if (cuda_enter(cu, "linear_forward"))
        lt_linear(cu, out, inp, W, bias, N, C, OC);
}

static void b_linear_backward(void *ctx, void *dinp, float *dW, float *dbias, const void *dout, const void *inp,
                              const void *W, int N, int C, int OC)
{
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "linear_backward"))
        return;
    /* dinp (N x C) += dout (N x OC) W (OC x C) */
    if (dinp)
        gemm16(cu, "linear_backward", CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, W, C, dout, OC, 1.0f, dinp, CUDA_R_16BF, C);
    /* dW (OC x C, fp32) += dout^T inp */
    gemm16(cu, "linear_backward", CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dW, CUDA_R_32F, C);
    if (dbias)
        cuda_ok(cu, kbf16_colsum_add(dbias, dout, N, OC, cu->stream), "kbf16_colsum_add", "linear_backward");
}

static void b_attention_forward(void *ctx, void *out, float *lse, const void *qkv, int B, int T, int C, int NH)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "attention_forward") && cuda_heads_ok(cu, "attention_forward", C, NH))
        cuda_ok(cu, kcuda_flash_forward(out, lse, qkv, B, T, C, NH, KCUDA_BF16, cu->stream), "kcuda_flash_forward",
                "attention_forward");
}

static void b_attention_backward(void *ctx, void *dqkv, float *scratch, const void *dout, const void *qkv,
                                 const void *out, const float *lse, int B, int T, int C, int NH)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "attention_backward") && cuda_heads_ok(cu, "attention_backward", C, NH))
        cuda_ok(cu, kcuda_flash_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, KCUDA_BF16, cu->stream),
                "kcuda_flash_backward", "attention_backward");
}

static void b_gelu_forward(void *ctx, void *out, const void *inp, size_t n)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "gelu_forward"))
        cuda_ok(cu, kbf16_gelu_forward(out, inp, n, cu->stream), "kbf16_gelu_forward", "gelu_forward");
}

static void b_gelu_backward(void *ctx, void *d, const void *inp, size_t n)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "gelu_backward"))
        cuda_ok(cu, kbf16_gelu_backward(d, inp, n, cu->stream), "kbf16_gelu_backward", "gelu_backward");
}

static void b_residual_forward(void *ctx, void *out, const void *a, const void *b, size_t n)
{
    cuda_ops *cu = ctx;
    if (cuda_enter(cu, "residual_forward"))
        cuda_ok(cu, kbf16_residual_forward(out, a, b, n, cu->stream), "kbf16_residual_forward", "residual_forward");
}

/* logits is reused by every chunk (the stream runs a chunk's products before the next chunk's); its rows are ld
 * apart, ld the vocabulary padded to a multiple of 128, and the products span the V real columns only. */
static void b_head_loss(void *ctx, void *dx, float *dwte, void *logits, double *row_loss, const void *x,
                        const void *wte, const int32_t *targets, int N, int C, int V, int chunk, float scale)
{
    cuda_ops *cu = ctx;
    if (!cuda_enter(cu, "head_loss"))
        return;
    if (chunk <= 0) {
        cuda_failf(cu, "head_loss: chunk = %d rows; it must be at least 1", chunk);
        return;
    }
    int ld = gpt_logits_ld(GPT_ACTS_BF16, V);
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int rows = N - r0 < chunk ? N - r0 : chunk;
        const uint16_t *xr = (const uint16_t *)x + (size_t)r0 * C;
        /* logits (rows x V, row stride ld) = xr wte^T */
        gemm16(cu, "head_loss", CUBLAS_OP_T, CUBLAS_OP_N, V, rows, C, wte, C, xr, C, 0.0f, logits, CUDA_R_16BF, ld);
        cuda_ok(cu, kbf16_classifier(logits, row_loss + r0, targets + r0, rows, V, ld, scale, dx != NULL, cu->stream),
                "kbf16_classifier", "head_loss");
        if (!dx)
            continue;
        /* dx rows (rows x C, overwritten) = dlogits wte */
        gemm16(cu, "head_loss", CUBLAS_OP_N, CUBLAS_OP_N, C, rows, V, wte, C, logits, ld, 0.0f,
               (uint16_t *)dx + (size_t)r0 * C, CUDA_R_16BF, C);
        /* dwte (V x C, fp32) += dlogits^T xr */
        if (dwte)
            gemm16(cu, "head_loss", CUBLAS_OP_N, CUBLAS_OP_T, C, V, rows, xr, C, logits, ld, 1.0f, dwte, CUDA_R_32F, C);
    }
}

/* ---------------------------------------------------------------- setup */

strata_status cuda_ops_bf16_setup(cuda_ops *cu, strata_dtype math, const char **why)
{
    if (math != STRATA_DTYPE_BF16) {
        *why = "gpt_ops_cuda_create: bf16 activations compute in bf16: math must be STRATA_DTYPE_BF16";
        return STRATA_EINVAL;
    }
    if (cublasLtCreate(&cu->lt) != CUBLAS_STATUS_SUCCESS) {
        cu->lt = NULL;
        *why = "cublasLtCreate failed";
        return STRATA_EIO;
    }
    gpt_ops *o = &cu->ops;
    o->name = "cuda-bf16";
    o->embed_forward = b_embed_forward;
    o->embed_backward = b_embed_backward;
    o->layernorm_forward = b_layernorm_forward;
    o->layernorm_backward = b_layernorm_backward;
    o->linear_forward = b_linear_forward;
    o->linear_backward = b_linear_backward;
    o->attention_forward = b_attention_forward;
    o->attention_backward = b_attention_backward;
    o->gelu_forward = b_gelu_forward;
    o->gelu_backward = b_gelu_backward;
    o->residual_forward = b_residual_forward;
    o->head_loss = b_head_loss;
    return STRATA_OK;
}
