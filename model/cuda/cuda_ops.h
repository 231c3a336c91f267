/*
 * What the two CUDA gpt_ops tables share (gpt_ops.h): the context behind ops.ctx, the sticky error that to_host
 * returns, and the entries that do not depend on the activation format (zero, add_f32, conversions, copies). Each
 * table's file fills in its own entries: gpt_ops_cuda.c (GPT_ACTS_FP32) and gpt_ops_cuda_bf16.c (GPT_ACTS_BF16);
 * gpt_ops_cuda_create (cuda_ops.c) starts cuBLAS and picks one.
 *
 * The entries return nothing, so the first failure since the last to_host is kept with the entry's name
 * ("cublasGemmEx (linear_forward): CUBLAS_STATUS_..."); to_host returns it as STRATA_EIO and error() says it.
 */
#ifndef STRATA_MODEL_CUDA_CUDA_OPS_H
#define STRATA_MODEL_CUDA_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "model/gpt_ops.h"

#define CUDA_OPS_ERROR_LEN 256

typedef struct cuda_ops {
    gpt_ops ops; /* ops.ctx points back here */
    cudaStream_t stream;
    int device; /* the stream's: the entries may be called from any thread */
    cublasHandle_t blas;
    cublasComputeType_t compute; /* GPT_ACTS_FP32: the products' tensor-core math */
    bool bf16_operands; /* GPT_ACTS_FP32 with STRATA_MODEL_GEMM=bf16: gemm() rounds its operands into scratch */
    void *scratch[2]; /* the bf16 copies of A and B */
    size_t scratch_bytes[2];
    cublasLtHandle_t lt; /* GPT_ACTS_BF16: the products with epilogues */
    void *lt_workspace; /* the creator's (gpt_ops_cuda_create) */
    size_t lt_workspace_bytes;
    bool failed; /* pending holds the first failure since the last to_host */
    char pending[CUDA_OPS_ERROR_LEN];
    char reported[CUDA_OPS_ERROR_LEN]; /* what the last to_host reported; "" after one that succeeded */
} cuda_ops;

/* Keeps the first failure only: once one step failed, later ones usually fail because of it. */
void cuda_failf(cuda_ops *cu, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* true for cudaSuccess; otherwise keeps "call (entry): message (name)". */
bool cuda_ok(cuda_ops *cu, cudaError_t e, const char *call, const char *entry);
void cuda_blas_ok(cuda_ops *cu, cublasStatus_t st, const char *call, const char *entry);
/* Makes the stream's device current for this thread (the runtime keeps it per thread); false after a failure. */
bool cuda_enter(cuda_ops *cu, const char *entry);
/* C channels split into NH heads, or a kept failure. */
bool cuda_heads_ok(cuda_ops *cu, const char *entry, int C, int NH);

/* Each table's entries and settings; STRATA_EINVAL with a static reason in *why for a refused setting. The cuBLAS
 * handle exists and is bound to the stream when they run. */
strata_status cuda_ops_fp32_setup(cuda_ops *cu, strata_dtype math, const char **why);
strata_status cuda_ops_bf16_setup(cuda_ops *cu, strata_dtype math, const char **why);

#endif
