/*
 * Causal flash attention on CUDA cores (see attention_flash.h); the formulas are those of k_attention_forward and
 * k_attention_backward in model/gpt_kernels.c, without the T x T matrix.
 *
 * Every kernel works on tiles of TILE rows of one (b, h): a block of FLASH_WARPS warps owns TILE rows (queries in
 * forward and dQ, keys in dK/dV), ROWS per warp, and walks the tiles of the other side through shared memory, converted
 * to fp32. Within a tile one lane stands for one row of the other side: lane j computes the whole dot product of its
 * row with each of the warp's ROWS rows (the warp's rows read as broadcasts, the lane's row from a buffer whose odd
 * row stride puts the 32 lanes on 32 banks). The products then go back through the tile with the weights broadcast
 * by __shfl_sync, each lane owning head dims d = lane, lane + 32, ... of every output row (DIMS registers per row).
 *
 * Each output element is written by one thread after a sum in an order fixed by the shapes (no atomics), so results
 * are bit-reproducible. Rows past T in the last tile are zeros in shared memory and masked out of every softmax.
 */
#include <math.h>
#include <stddef.h>

#include <cuda_bf16.h>

#include "model/cuda/attention_flash.h"
#include "model/cuda/kcuda_reduce.cuh"

/* Rows per tile on both sides, one per lane in the dot products. */
#define TILE 32
#define FLASH_WARPS 4
#define FLASH_THREADS (FLASH_WARPS * 32)
/* Rows of the block's own tile that one warp owns, processed together so each shared load serves all of them. */
#define ROWS (TILE / FLASH_WARPS)
/* Head dims per lane: lane owns d = lane + 32 c for c < DIMS. */
#define DIMS (KCUDA_FLASH_MAX_HEAD / 32)
/* A block may use this much dynamic shared memory without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize). */
#define DEFAULT_SMEM_BYTES 49152
/* gridDim.y and gridDim.z hold NH and B. */
#define MAX_GRID_YZ 65535

/* ---------------------------------------------------------------- tiles */

/* Rows [row0, row0 + TILE) of src (row n at src + n * ld, hs channels) into dst as fp32 with row stride stride;
 * rows at or past T become zeros. The whole block calls it; consecutive threads read consecutive channels. */
template <typename E>
static __device__ void load_tile(float *dst, int stride, const E *src, size_t ld, int row0, int T, int hs)
{
    for (int at = threadIdx.x; at < TILE * hs; at += FLASH_THREADS) {
        int r = at / hs, d = at - r * hs, row = row0 + r;
        dst[r * stride + d] = row < T ? elem_load(src, (size_t)row * ld + d) : 0.0f;
    }
}

/* The odd stride of a buffer whose rows lanes read side by side: lane j's element d sits on bank (j * stride + d)
 * mod 32, 32 different banks when stride is odd. */
static __host__ __device__ __forceinline__ int odd_stride(int hs)
{
    return hs | 1;
}

/* ---------------------------------------------------------------- forward */

/* Block (x, h, b) owns query rows [x * TILE, x * TILE + TILE) of head h of sequence b. Shared memory: Qs (TILE x hs,
 * broadcast), Ks (TILE x odd_stride, one row per lane), Vs (TILE x hs, read along d). */
template <typename E>
static __global__ void __launch_bounds__(FLASH_THREADS)
    flash_forward_kernel(E *__restrict__ out, float *__restrict__ lse, const E *__restrict__ qkv, int T, int C, int NH,
                         int hs, float scale)
{
    extern __shared__ float smem[];
    int ks = odd_stride(hs);
    float *Qs = smem, *Ks = Qs + TILE * hs, *Vs = Ks + TILE * ks;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int q0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z;
    size_t C3 = 3 * (size_t)C;
    const E *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * (size_t)C;

    load_tile(Qs, hs, q, C3, q0, T, hs);
    const float *qw = Qs + warp * ROWS * hs;
    int i_first = q0 + warp * ROWS; /* the query row of the warp's row r is i_first + r */
    float m[ROWS], l[ROWS], acc[ROWS][DIMS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < DIMS; c++)
            acc[r][c] = 0.0f;
    }
    /* Keys past the block's last row are masked for all of its rows: the key tiles stop at that row's tile. */
    int q_end = q0 + TILE < T ? q0 + TILE : T;
    /* Keys past the warp's last row (or past T) get no weight in its rows: the output loop stops there. */
    int w_end = i_first + ROWS < T ? i_first + ROWS : T;
    for (int k0 = 0; k0 < q_end; k0 += TILE) {
        __syncthreads(); /* Qs is written (first tile); every warp is done with the previous Ks and Vs */
        load_tile(Ks, ks, k, C3, k0, T, hs);
        load_tile(Vs, hs, v, C3, k0, T, hs);
        __syncthreads();

        float p[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            p[r] = 0.0f;
        const float *kj = Ks + lane * ks;
        for (int d = 0; d < hs; d++) {
            float kd = kj[d];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                p[r] += qw[r * hs + d] * kd;
        }

        /* The online softmax, per row: the new running max, the old sum and outputs rescaled to it, this tile's
         * weights added. A row that has seen no unmasked key keeps m = -inf; base is then 0, so no exp ever sees
         * -inf - -inf (its p are 0 and its corr, exp(-inf), is 0 on zeros). */
        int j = k0 + lane;
        float corr[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            bool keep = j <= i_first + r && j < T;
            float s = keep ? p[r] * scale : -INFINITY;
            float mx = fmaxf(m[r], warp_max(s));
            float base = mx == -INFINITY ? 0.0f : mx;
            corr[r] = expf(m[r] - base);
            p[r] = keep ? expf(s - base) : 0.0f;
            l[r] = l[r] * corr[r] + warp_sum(p[r]);
            m[r] = mx;
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int c = 0; c < DIMS; c++)
                acc[r][c] *= corr[r];

        int jn = w_end - k0 < TILE ? w_end - k0 : TILE; /* the same in every lane: the shuffles see all 32 */
        for (int jj = 0; jj < jn; jj++) {
            const float *vj = Vs + jj * hs;
            float pj[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                pj[r] = __shfl_sync(FULL_MASK, p[r], jj);
#pragma unroll
            for (int c = 0; c < DIMS; c++) {
                int d = lane + 32 * c;
                if (d < hs) {
                    float vd = vj[d];
#pragma unroll
                    for (int r = 0; r < ROWS; r++)
                        acc[r][c] += pj[r] * vd;
                }
            }
        }
    }

    E *o = out + (size_t)b * T * C + (size_t)h * hs;
    float *lse_bh = lse + ((size_t)b * NH + h) * T;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int i = i_first + r;
        if (i >= T)
            break;
        /* l >= 1: the row's largest weight is exp(0). */
        float inv = 1.0f / l[r];
#pragma unroll
        for (int c = 0; c < DIMS; c++) {
            int d = lane + 32 * c;
            if (d < hs)
                elem_store(o, (size_t)i * C + d, acc[r][c] * inv);
        }
        if (lane == 0)
            lse_bh[i] = m[r] + logf(l[r]);
    }
}

/* ---------------------------------------------------------------- backward */

/* Drow[(b, h, i)] = sum_d dout[b, i, h, d] * out[b, i, h, d], the softmax backward's sum_j p_ij dp_ij: one warp per
 * row, lanes over d, folded by the butterfly. */
template <typename E>
static __global__ void __launch_bounds__(FLASH_THREADS)
    flash_rowdot_kernel(float *__restrict__ Drow, const E *__restrict__ dout, const E *__restrict__ out, int T, int C,
                        int NH, int hs, size_t rows)
{
    int lane = threadIdx.x & 31;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + (threadIdx.x >> 5);
    if (row >= rows)
        return; /* the whole warp leaves: the shuffles below see all 32 lanes */
    size_t i = row % T, bh = row / T, h = bh % NH, b = bh / NH;
    size_t at = ((size_t)b * T + i) * C + h * hs;
    float acc = 0.0f;
    for (int d = lane; d < hs; d += 32)
        acc += elem_load(dout, at + d) * elem_load(out, at + d);
    acc = warp_sum(acc);
    if (lane == 0)
        Drow[row] = acc;
}

/* Block (x, h, b) owns key rows [x * TILE, x * TILE + TILE) and walks the query tiles that can see them (from its
 * own tile on). Per query tile, lane i: s_ij = scale q_i.k_j, p_ij = exp(s_ij - lse_i), dp_ij = dout_i.v_j,
 * ds_ij = p_ij (dp_ij - D_i); then dv_j += sum_i p_ij dout_i and dk_j += sum_i ds_ij q_i (scaled once at the end).
 * Shared memory: Ks, Vs (TILE x hs, broadcast), Qs, Gs (dout) (TILE x odd_stride, one row per lane), lse, D. */
template <typename E>
static __global__ void __launch_bounds__(FLASH_THREADS)
    flash_dkdv_kernel(E *__restrict__ dqkv, const E *__restrict__ dout, const E *__restrict__ qkv,
                      const float *__restrict__ lse, const float *__restrict__ Drow, int T, int C, int NH, int hs,
                      float scale)
{
    extern __shared__ float smem[];
    int qs = odd_stride(hs);
    float *Ks = smem, *Vs = Ks + TILE * hs, *Qs = Vs + TILE * hs, *Gs = Qs + TILE * qs, *Ls = Gs + TILE * qs,
          *Ds = Ls + TILE;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int k0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z;
    size_t C3 = 3 * (size_t)C;
    const E *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * (size_t)C;
    const E *g = dout + (size_t)b * T * C + (size_t)h * hs;
    const float *lse_bh = lse + ((size_t)b * NH + h) * T, *D_bh = Drow + ((size_t)b * NH + h) * T;

    load_tile(Ks, hs, k, C3, k0, T, hs);
    load_tile(Vs, hs, v, C3, k0, T, hs);
    const float *kw = Ks + warp * ROWS * hs, *vw = Vs + warp * ROWS * hs;
    int j_first = k0 + warp * ROWS; /* the key row of the warp's row r is j_first + r */
    float dk[ROWS][DIMS], dv[ROWS][DIMS];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int c = 0; c < DIMS; c++) {
            dk[r][c] = 0.0f;
            dv[r][c] = 0.0f;
        }

    for (int q0 = k0; q0 < T; q0 += TILE) {
        __syncthreads(); /* Ks and Vs are written (first tile); every warp is done with the previous query tile */
        load_tile(Qs, qs, q, C3, q0, T, hs);
        load_tile(Gs, qs, g, (size_t)C, q0, T, hs);
        if (threadIdx.x < TILE) {
            int i = q0 + threadIdx.x;
            Ls[threadIdx.x] = i < T ? lse_bh[i] : 0.0f;
            Ds[threadIdx.x] = i < T ? D_bh[i] : 0.0f;
        }
        __syncthreads();

        float p[ROWS], ds[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            p[r] = 0.0f;
            ds[r] = 0.0f;
        }
        const float *qi = Qs + lane * qs, *gi = Gs + lane * qs;
        for (int d = 0; d < hs; d++) {
            float qd = qi[d], gd = gi[d];
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                p[r] += qd * kw[r * hs + d];
                ds[r] += gd * vw[r * hs + d];
            }
        }
        int i = q0 + lane;
        float lse_i = Ls[lane], D_i = Ds[lane];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            bool keep = i >= j_first + r && i < T;
            p[r] = keep ? expf(p[r] * scale - lse_i) : 0.0f;
            ds[r] = p[r] * (ds[r] - D_i);
        }

        /* Only queries from the warp's first key on and before T carry weight; both bounds are warp-uniform. */
        int ii0 = j_first - q0 > 0 ? j_first - q0 : 0;
        int in = T - q0 < TILE ? T - q0 : TILE;
        for (int ii = ii0; ii < in; ii++) {
            const float *qrow = Qs + ii * qs, *grow = Gs + ii * qs;
            float pi[ROWS], dsi[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                pi[r] = __shfl_sync(FULL_MASK, p[r], ii);
                dsi[r] = __shfl_sync(FULL_MASK, ds[r], ii);
            }
#pragma unroll
            for (int c = 0; c < DIMS; c++) {
                int d = lane + 32 * c;
                if (d < hs) {
                    float qd = qrow[d], gd = grow[d];
#pragma unroll
                    for (int r = 0; r < ROWS; r++) {
                        dv[r][c] += pi[r] * gd;
                        dk[r][c] += dsi[r] * qd;
                    }
                }
            }
        }
    }

    E *dk_out = dqkv + (size_t)b * T * C3 + C + (size_t)h * hs, *dv_out = dk_out + C;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int j = j_first + r;
        if (j >= T)
            break;
#pragma unroll
        for (int c = 0; c < DIMS; c++) {
            int d = lane + 32 * c;
            if (d < hs) {
                elem_store(dk_out, (size_t)j * C3 + d, dk[r][c] * scale);
                elem_store(dv_out, (size_t)j * C3 + d, dv[r][c]);
            }
        }
    }
}

/* Block (x, h, b) owns query rows [x * TILE, x * TILE + TILE) and walks the key tiles they see. Per key tile, lane j
 * recomputes p_ij and ds_ij as in flash_dkdv_kernel; then dq_i += sum_j ds_ij k_j (scaled once at the end).
 * Shared memory: Qs, Gs (TILE x hs, broadcast), Ks, Vs (TILE x odd_stride, one row per lane), lse, D. */
template <typename E>
static __global__ void __launch_bounds__(FLASH_THREADS)
    flash_dq_kernel(E *__restrict__ dqkv, const E *__restrict__ dout, const E *__restrict__ qkv,
                    const float *__restrict__ lse, const float *__restrict__ Drow, int T, int C, int NH, int hs,
                    float scale)
{
    extern __shared__ float smem[];
    int ks = odd_stride(hs);
    float *Qs = smem, *Gs = Qs + TILE * hs, *Ks = Gs + TILE * hs, *Vs = Ks + TILE * ks, *Ls = Vs + TILE * ks,
          *Ds = Ls + TILE;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int q0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z;
    size_t C3 = 3 * (size_t)C;
    const E *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * (size_t)C;
    const E *g = dout + (size_t)b * T * C + (size_t)h * hs;
    const float *lse_bh = lse + ((size_t)b * NH + h) * T, *D_bh = Drow + ((size_t)b * NH + h) * T;

    load_tile(Qs, hs, q, C3, q0, T, hs);
    load_tile(Gs, hs, g, (size_t)C, q0, T, hs);
    if (threadIdx.x < TILE) {
        int i = q0 + threadIdx.x;
        Ls[threadIdx.x] = i < T ? lse_bh[i] : 0.0f;
        Ds[threadIdx.x] = i < T ? D_bh[i] : 0.0f;
    }
    const float *qw = Qs + warp * ROWS * hs, *gw = Gs + warp * ROWS * hs;
    const float *Lw = Ls + warp * ROWS, *Dw = Ds + warp * ROWS;
    int i_first = q0 + warp * ROWS; /* the query row of the warp's row r is i_first + r */
    float dq[ROWS][DIMS];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int c = 0; c < DIMS; c++)
            dq[r][c] = 0.0f;

    int q_end = q0 + TILE < T ? q0 + TILE : T;
    int w_end = i_first + ROWS < T ? i_first + ROWS : T;
    for (int k0 = 0; k0 < q_end; k0 += TILE) {
        __syncthreads(); /* Qs, Gs, Ls, Ds are written (first tile); every warp is done with the previous keys */
        load_tile(Ks, ks, k, C3, k0, T, hs);
        load_tile(Vs, ks, v, C3, k0, T, hs);
        __syncthreads();

        float p[ROWS], ds[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            p[r] = 0.0f;
            ds[r] = 0.0f;
        }
        const float *kj = Ks + lane * ks, *vj = Vs + lane * ks;
        for (int d = 0; d < hs; d++) {
            float kd = kj[d], vd = vj[d];
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                p[r] += qw[r * hs + d] * kd;
                ds[r] += gw[r * hs + d] * vd;
            }
        }
        int j = k0 + lane;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            int i = i_first + r;
            bool keep = j <= i && i < T;
            p[r] = keep ? expf(p[r] * scale - Lw[r]) : 0.0f;
            ds[r] = p[r] * (ds[r] - Dw[r]);
        }

        int jn = w_end - k0 < TILE ? w_end - k0 : TILE; /* warp-uniform, as in the forward */
        for (int jj = 0; jj < jn; jj++) {
            const float *krow = Ks + jj * ks;
            float dsj[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                dsj[r] = __shfl_sync(FULL_MASK, ds[r], jj);
#pragma unroll
            for (int c = 0; c < DIMS; c++) {
                int d = lane + 32 * c;
                if (d < hs) {
                    float kd = krow[d];
#pragma unroll
                    for (int r = 0; r < ROWS; r++)
                        dq[r][c] += dsj[r] * kd;
                }
            }
        }
    }

    E *dq_out = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int i = i_first + r;
        if (i >= T)
            break;
#pragma unroll
        for (int c = 0; c < DIMS; c++) {
            int d = lane + 32 * c;
            if (d < hs)
                elem_store(dq_out, (size_t)i * C3 + d, dq[r][c] * scale);
        }
    }
}

/* ---------------------------------------------------------------- launchers */

static size_t forward_smem_bytes(int hs)
{
    return (size_t)TILE * (2 * hs + odd_stride(hs)) * sizeof(float);
}

/* Both backward kernels: two broadcast tiles, two per-lane tiles, lse and D of the query tile. */
static size_t backward_smem_bytes(int hs)
{
    return (size_t)TILE * (2 * hs + 2 * odd_stride(hs) + 2) * sizeof(float);
}

/* cudaErrorInvalidValue for a shape or element type these kernels do not take (see attention_flash.h). */
static cudaError_t check_shape(int B, int T, int C, int NH, kcuda_elem elem)
{
    if (elem != KCUDA_F32 && elem != KCUDA_BF16)
        return cudaErrorInvalidValue;
    if (B < 0 || T < 0 || NH < 1 || C < 1 || C % NH != 0 || C / NH > KCUDA_FLASH_MAX_HEAD)
        return cudaErrorInvalidValue;
    if (B > MAX_GRID_YZ || NH > MAX_GRID_YZ)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

/* Lets kernel take bytes of dynamic shared memory: needed past the 48 KiB every block may use (large heads). The
 * attribute belongs to the current device, so it is set at each launch that needs it rather than once. */
template <typename K> static cudaError_t allow_smem(K *kernel, size_t bytes)
{
    if (bytes <= DEFAULT_SMEM_BYTES)
        return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <typename E>
static cudaError_t flash_forward(E *out, float *lse, const E *qkv, int B, int T, int C, int NH, cudaStream_t stream)
{
    int hs = C / NH;
    size_t smem = forward_smem_bytes(hs);
    cudaError_t e = allow_smem(flash_forward_kernel<E>, smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid(((unsigned)T + TILE - 1) / TILE, (unsigned)NH, (unsigned)B);
    flash_forward_kernel<E>
        <<<grid, FLASH_THREADS, smem, stream>>>(out, lse, qkv, T, C, NH, hs, 1.0f / sqrtf((float)hs));
    return cudaGetLastError();
}

template <typename E>
static cudaError_t flash_backward(E *dqkv, float *Drow, const E *dout, const E *qkv, const E *out, const float *lse,
                                  int B, int T, int C, int NH, cudaStream_t stream)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t smem = backward_smem_bytes(hs), rows = (size_t)B * NH * T;
    cudaError_t e = allow_smem(flash_dkdv_kernel<E>, smem);
    if (e == cudaSuccess)
        e = allow_smem(flash_dq_kernel<E>, smem);
    if (e != cudaSuccess)
        return e;
    flash_rowdot_kernel<E><<<(unsigned)((rows + FLASH_WARPS - 1) / FLASH_WARPS), FLASH_THREADS, 0, stream>>>(
        Drow, dout, out, T, C, NH, hs, rows);
    LAUNCHED();
    dim3 grid(((unsigned)T + TILE - 1) / TILE, (unsigned)NH, (unsigned)B);
    flash_dkdv_kernel<E><<<grid, FLASH_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, Drow, T, C, NH, hs, scale);
    LAUNCHED();
    flash_dq_kernel<E><<<grid, FLASH_THREADS, smem, stream>>>(dqkv, dout, qkv, lse, Drow, T, C, NH, hs, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                                           kcuda_elem elem, cudaStream_t stream)
{
    cudaError_t e = check_shape(B, T, C, NH, elem);
    if (e != cudaSuccess)
        return e;
    if (B == 0 || T == 0)
        return cudaSuccess;
    if (!out || !lse || !qkv)
        return cudaErrorInvalidValue;
    if (elem == KCUDA_BF16)
        return flash_forward((__nv_bfloat16 *)out, lse, (const __nv_bfloat16 *)qkv, B, T, C, NH, stream);
    return flash_forward((float *)out, lse, (const float *)qkv, B, T, C, NH, stream);
}

extern "C" cudaError_t kcuda_flash_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                            const void *out, const float *lse, int B, int T, int C, int NH,
                                            kcuda_elem elem, cudaStream_t stream)
{
    cudaError_t e = check_shape(B, T, C, NH, elem);
    if (e != cudaSuccess)
        return e;
    if (B == 0 || T == 0)
        return cudaSuccess;
    if (!dqkv || !scratch || !dout || !qkv || !out || !lse)
        return cudaErrorInvalidValue;
    if (elem == KCUDA_BF16)
        return flash_backward((__nv_bfloat16 *)dqkv, scratch, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)qkv,
                              (const __nv_bfloat16 *)out, lse, B, T, C, NH, stream);
    return flash_backward((float *)dqkv, scratch, (const float *)dout, (const float *)qkv, (const float *)out, lse, B,
                          T, C, NH, stream);
}
