/*
 * cuBLAS and cuBLASLt, emulated for t_cuda_emu_tables.c (see emu_cuda.h for why the CUDA tables are checked on the
 * CPU), written from the documented column-major semantics and not from the tables' code, so that a table that
 * passes a wrong transpose, leading dimension, dimension or type is caught rather than mirrored:
 *   D (m x n, ldd) = alpha op(A) op(B) + beta C (+ bias[i] on every row i with CUBLASLT_EPILOGUE_BIAS),
 *   op(A) m x k, A stored column-major with lda >= its rows (op = N or T), likewise B; beta == 0: C is not read.
 * Products accumulate in double and round to fp32, then to the output type (bf16: to nearest even), so the emulation is
 * an oracle as exact as the types allow. What it checks, and aborts on with the call and the values: dimensions that do
 * not fit together, a leading dimension below the rows, an output that overlaps an input, a type, transpose,
 * epilogue or descriptor attribute it does not know (so that a table starting to use one is not silently emulated
 * wrong).
 *
 * What it does not model: real cuBLAS's summation order and its rounding of partial sums (the GPU tests see those);
 * cuBLASLt's algorithm choice, its heuristics' failures and its alignment rules (a pointer or leading dimension the
 * real library refuses or runs slowly with passes here; t_model_cuda on a GPU is the check for those); workspace
 * size; streams (every call completes before it returns).
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
#include <vector>

#include "emu_runtime.h"

static float bf16_to_f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static const char *tname(cudaDataType t)
{
    return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_32F ? "f32" : t == CUDA_R_16F ? "f16" : "?";
}
static double load(const void *p, cudaDataType t, size_t i)
{
    switch (t) {
    case CUDA_R_32F:
        return ((const float *)p)[i];
    case CUDA_R_16BF:
        return bf16_to_f(((const uint16_t *)p)[i]);
    default:
        fprintf(stderr, "emu blas: type %d unsupported\n", (int)t);
        abort();
    }
}
static void store(void *p, cudaDataType t, size_t i, double v)
{
    switch (t) {
    case CUDA_R_32F:
        ((float *)p)[i] = (float)v;
        return;
    case CUDA_R_16BF:
        ((uint16_t *)p)[i] = f_to_bf16((float)v);
        return;
    default:
        fprintf(stderr, "emu blas: type %d unsupported\n", (int)t);
        abort();
    }
}
static void fail(const char *what, const char *msg)
{
    fprintf(stderr, "emu blas: %s: %s\n", what, msg);
    abort();
}

/* Byte range of a column-major stored matrix rows x cols, ld. */
static void range(const void *p, cudaDataType t, long rows, long cols, long ld, const char **lo, const char **hi)
{
    size_t es = t == CUDA_R_32F ? 4 : 2;
    *lo = (const char *)p;
    *hi = (const char *)p + ((size_t)(cols - 1) * ld + rows) * es;
}
static bool overlap(const char *a0, const char *a1, const char *b0, const char *b1)
{
    return a0 < b1 && b0 < a1;
}

/* The core: op(A) m x k, op(B) k x n, C m x n. */
static void gemm_core(const char *who, bool ta, bool tb, long m, long n, long k, double alpha, const void *A,
                      cudaDataType at, long lda, const void *B, cudaDataType bt, long ldb, double beta, const void *Cin,
                      cudaDataType ct, long ldc, void *D, cudaDataType dt, long ldd, const void *bias,
                      cudaDataType biast)
{
    if (m < 0 || n < 0 || k < 0)
        fail(who, "negative dimension");
    long arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    if (lda < (arows > 1 ? arows : 1)) {
        fprintf(stderr, "emu blas: %s: lda %ld < rows of A %ld (ta %d m %ld n %ld k %ld)\n", who, lda, arows, ta, m, n,
                k);
        abort();
    }
    if (ldb < (brows > 1 ? brows : 1)) {
        fprintf(stderr, "emu blas: %s: ldb %ld < rows of B %ld (tb %d m %ld n %ld k %ld)\n", who, ldb, brows, tb, m, n,
                k);
        abort();
    }
    if (ldd < (m > 1 ? m : 1) || (beta != 0 && ldc < (m > 1 ? m : 1))) {
        fprintf(stderr, "emu blas: %s: ldc/ldd %ld/%ld < m %ld\n", who, ldc, ldd, m);
        abort();
    }
    if (m == 0 || n == 0)
        return;
    if (k > 0) {
        const char *a0, *a1, *b0, *b1, *d0, *d1;
        range(A, at, arows, acols, lda, &a0, &a1);
        range(B, bt, brows, bcols, ldb, &b0, &b1);
        range(D, dt, m, n, ldd, &d0, &d1);
        if (overlap(a0, a1, d0, d1) || overlap(b0, b1, d0, d1))
            fail(who, "output overlaps an input");
    }
    std::vector<double> acc((size_t)m * n);
    for (long j = 0; j < n; j++)
        for (long i = 0; i < m; i++) {
            double s = 0;
            for (long p = 0; p < k; p++) {
                double a = ta ? load(A, at, (size_t)i * lda + p) : load(A, at, (size_t)p * lda + i);
                double b = tb ? load(B, bt, (size_t)p * ldb + j) : load(B, bt, (size_t)j * ldb + p);
                s += a * b;
            }
            double v = alpha * s;
            if (beta != 0)
                v += beta * load(Cin, ct, (size_t)j * ldc + i);
            if (bias)
                v += load(bias, biast, (size_t)i);
            acc[(size_t)j * m + i] = v;
        }
    for (long j = 0; j < n; j++)
        for (long i = 0; i < m; i++)
            store(D, dt, (size_t)j * ldd + i, acc[(size_t)j * m + i]);
}

static bool op_t(cublasOperation_t o, const char *who)
{
    if (o == CUBLAS_OP_N)
        return false;
    if (o == CUBLAS_OP_T)
        return true;
    fail(who, "op other than N / T");
    return false;
}

extern "C" {
struct cublasContext {
    cudaStream_t stream;
};
cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = (cublasHandle_t)calloc(1, sizeof(cublasContext));
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t)
{
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusName(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_?";
}
const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "success" : "failure";
}

static void check_types(const char *who, cudaDataType at, cudaDataType bt, cudaDataType ct, cublasComputeType_t comp)
{
    bool ok = (at == CUDA_R_16BF && bt == CUDA_R_16BF && (ct == CUDA_R_16BF || ct == CUDA_R_32F) &&
               comp == CUBLAS_COMPUTE_32F) ||
              (at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F &&
               (comp == CUBLAS_COMPUTE_32F || comp == CUBLAS_COMPUTE_32F_FAST_16BF ||
                comp == CUBLAS_COMPUTE_32F_FAST_16F || comp == CUBLAS_COMPUTE_32F_FAST_TF32));
    if (!ok) {
        fprintf(stderr, "emu blas: %s: types A %s B %s C %s compute %d not emulated\n", who, tname(at), tname(bt),
                tname(ct), (int)comp);
        abort();
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t)
{
    emu_totals.gemm_calls++;
    check_types("cublasGemmEx", Atype, Btype, Ctype, computeType);
    gemm_core("cublasGemmEx", op_t(transa, "GemmEx"), op_t(transb, "GemmEx"), m, n, k, *(const float *)alpha, A, Atype,
              lda, B, Btype, ldb, *(const float *)beta, C, Ctype, ldc, C, Ctype, ldc, NULL, CUDA_R_32F);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m,
                                          int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
                                          long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t)
{
    emu_totals.gemm_calls++;
    check_types("cublasGemmStridedBatchedEx", Atype, Btype, Ctype, computeType);
    size_t ea = Atype == CUDA_R_32F ? 4 : 2, eb = Btype == CUDA_R_32F ? 4 : 2, ec = Ctype == CUDA_R_32F ? 4 : 2;
    for (int b = 0; b < batchCount; b++)
        gemm_core("cublasGemmStridedBatchedEx", op_t(transa, "Batched"), op_t(transb, "Batched"), m, n, k,
                  *(const float *)alpha, (const char *)A + b * strideA * ea, Atype, lda,
                  (const char *)B + b * strideB * eb, Btype, ldb, *(const float *)beta, (char *)C + b * strideC * ec,
                  Ctype, ldc, (char *)C + b * strideC * ec, Ctype, ldc, NULL, CUDA_R_32F);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- cuBLASLt */
struct cublasLtContext {
    int dummy;
};
struct LtDesc {
    cublasComputeType_t compute;
    cudaDataType scale;
    cublasOperation_t ta, tb;
    cublasLtEpilogue_t epi;
    const void *bias;
    int bias_set;
    cudaDataType bias_type;
    int bias_type_set;
};
struct LtLayout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = (cublasLtHandle_t)calloc(1, sizeof(cublasLtContext));
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale)
{
    LtDesc *x = (LtDesc *)calloc(1, sizeof(LtDesc));
    x->compute = compute;
    x->scale = scale;
    x->ta = CUBLAS_OP_N;
    x->tb = CUBLAS_OP_N;
    x->epi = CUBLASLT_EPILOGUE_DEFAULT;
    *d = (cublasLtMatmulDesc_t)x;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    LtDesc *x = (LtDesc *)d;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        if (size != sizeof(int32_t))
            fail("LtDesc", "TRANSA size");
        x->ta = *(const cublasOperation_t *)buf;
        break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (size != sizeof(int32_t))
            fail("LtDesc", "TRANSB size");
        x->tb = *(const cublasOperation_t *)buf;
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (size != sizeof(uint32_t))
            fail("LtDesc", "EPILOGUE size");
        x->epi = *(const cublasLtEpilogue_t *)buf;
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (size != sizeof(void *))
            fail("LtDesc", "BIAS_POINTER size");
        memcpy(&x->bias, buf, sizeof(void *));
        x->bias_set = 1;
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        if (size != sizeof(int32_t))
            fail("LtDesc", "BIAS_DATA_TYPE size");
        x->bias_type = (cudaDataType) * (const int32_t *)buf;
        x->bias_type_set = 1;
        break;
    default:
        fprintf(stderr, "emu blas: LtDesc attribute %d not emulated\n", (int)attr);
        abort();
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld)
{
    LtLayout *x = (LtLayout *)calloc(1, sizeof(LtLayout));
    x->type = type;
    x->rows = rows;
    x->cols = cols;
    x->ld = ld;
    *l = (cublasLtMatrixLayout_t)x;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = (cublasLtMatmulPreference_t)calloc(1, 64);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size)
{
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size != sizeof(uint64_t))
        fail("Pref", "MAX_WORKSPACE_BYTES size");
    if ((attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES || attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ||
         attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES || attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) &&
        size != sizeof(uint32_t))
        fail("Pref", "MIN_ALIGNMENT size");
    (void)buf;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t *res, int *found)
{
    if (requested < 1)
        fail("Heuristic", "requested < 1");
    memset(res, 0, sizeof *res);
    res->state = CUBLAS_STATUS_SUCCESS;
    res->wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t)
{
    emu_totals.lt_calls++;
    LtDesc *d = (LtDesc *)desc;
    LtLayout *la = (LtLayout *)Adesc, *lb = (LtLayout *)Bdesc, *lc = (LtLayout *)Cdesc, *ld = (LtLayout *)Ddesc;
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F)
        fail("cublasLtMatmul", "compute/scale type");
    if (la->type != CUDA_R_16BF || lb->type != CUDA_R_16BF || !(lc->type == ld->type) || ld->type != CUDA_R_16BF)
        fail("cublasLtMatmul", "A/B/C/D types other than bf16");
    bool ta = op_t(d->ta, "Lt"), tb = op_t(d->tb, "Lt");
    long m = (long)ld->rows, n = (long)ld->cols;
    long opa_r = ta ? la->cols : la->rows, opa_c = ta ? la->rows : la->cols;
    long opb_r = tb ? lb->cols : lb->rows, opb_c = tb ? lb->rows : lb->cols;
    if (opa_r != m || opb_c != n || opa_c != opb_r || lc->rows != ld->rows || lc->cols != ld->cols) {
        fprintf(stderr,
                "emu blas: cublasLtMatmul: inconsistent dims: op(A) %ldx%ld op(B) %ldx%ld C %lux%lu D %ldx%ld\n", opa_r,
                opa_c, opb_r, opb_c, (unsigned long)lc->rows, (unsigned long)lc->cols, m, n);
        abort();
    }
    if (la->ld < (int64_t)la->rows || lb->ld < (int64_t)lb->rows || lc->ld < (int64_t)lc->rows ||
        ld->ld < (int64_t)ld->rows)
        fail("cublasLtMatmul", "ld < rows");
    const void *bias = NULL;
    cudaDataType bt = ld->type;
    if (d->epi == CUBLASLT_EPILOGUE_BIAS) {
        if (!d->bias_set || !d->bias)
            fail("cublasLtMatmul", "BIAS epilogue without a bias pointer");
        bias = d->bias;
        if (d->bias_type_set)
            bt = d->bias_type;
    } else if (d->epi != CUBLASLT_EPILOGUE_DEFAULT)
        fail("cublasLtMatmul", "epilogue not emulated");
    double b = *(const float *)beta;
    if (b != 0 && C != D)
        fail("cublasLtMatmul", "beta != 0 with C != D not emulated");
    gemm_core("cublasLtMatmul", ta, tb, m, n, opa_c, *(const float *)alpha, A, la->type, la->ld, B, lb->type, lb->ld, b,
              C, lc->type, lc->ld, D, ld->type, ld->ld, bias, bt);
    return CUBLAS_STATUS_SUCCESS;
}
}
