/*
 * The embeddings' backward on CUDA (see embed_backward.h).
 *
 * dwte: rows of dout that share a token add into the same row of dwte, and the host adds them in increasing row order.
 * Block (n, tile) first asks whether row n is the first row of its token v = tok[n]; only then does it own row v of
 * dwte (for the THREADS channels of its tile), and it walks tok[n..N) in chunks of THREADS rows, lists the chunk's rows
 * of token v in increasing order (a ballot per warp, then the warps in order) and adds them, one thread per channel.
 * So each element of dwte is read, summed in the host's order and written by exactly one thread: no atomics, the
 * host's bits, and the grouping happens on the device without a sort or a round trip to the host.
 *
 * The price is that every block scans the rows before its own (O(N^2) token comparisons in all, a few microseconds of
 * coalesced loads per block at N = 16K), and that a token's rows are summed one after another, as the order demands.
 */
#include "model/cuda/embed_backward.h"
#include "model/cuda/kcuda_reduce.cuh"

/* Chunks of THREADS tokens a thread compares before the block votes on whether row n was seen earlier. */
#define SCAN_UNROLL 8

/* Launched as (N, tiles of THREADS channels) blocks of THREADS threads. */
template <typename E>
static __global__ void embed_dwte_kernel(float *__restrict__ dwte, const E *__restrict__ dout,
                                         const int32_t *__restrict__ tok, int N, int C)
{
    __shared__ int rows[THREADS];
    __shared__ int counts[THREADS / 32];
    size_t n = blockIdx.x;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t v = tok[n];

    /* An earlier row of token v means that another block owns it. __syncthreads_or gives every thread the same
     * answer, so the block leaves as a whole and the barriers below see all of its threads. */
    for (size_t base = 0; base < n; base += (size_t)THREADS * SCAN_UNROLL) {
        bool seen = false;
#pragma unroll
        for (int k = 0; k < SCAN_UNROLL; k++) {
            size_t i = base + (size_t)k * THREADS + threadIdx.x;
            seen |= i < n && tok[i] == v;
        }
        if (__syncthreads_or(seen))
            return;
    }

    int c = blockIdx.y * THREADS + threadIdx.x;
    float *d = dwte + (size_t)v * C;
    float acc = c < C ? d[c] : 0.0f;
    for (size_t base = n; base < (size_t)N; base += THREADS) {
        size_t i = base + threadIdx.x;
        bool hit = i < (size_t)N && tok[i] == v;
        unsigned mask = __ballot_sync(FULL_MASK, hit);
        if (lane == 0)
            counts[warp] = __popc(mask);
        __syncthreads();
        int before = 0, hits = 0;
        for (int w = 0; w < THREADS / 32; w++) {
            before += w < warp ? counts[w] : 0;
            hits += counts[w];
        }
        if (hit)
            rows[before + __popc(mask & ((1u << lane) - 1u))] = (int)i;
        __syncthreads();
        if (c < C)
            for (int k = 0; k < hits; k++)
                acc += elem_load(dout, (size_t)rows[k] * C + c);
        __syncthreads(); /* every thread has read rows and counts before the next chunk rewrites them */
    }
    if (c < C)
        d[c] = acc;
}

/* One thread per (t, c) of wpe, adding rows t, t + T, ... in order, as the host does. */
template <typename E>
static __global__ void embed_dwpe_kernel(float *__restrict__ dwpe, const E *__restrict__ dout, int N, int T, int C)
{
    FOR_EACH(i, (size_t)T * C) {
        size_t t = i / C, c = i % C;
        float acc = dwpe[i];
        for (size_t n = t; n < (size_t)N; n += T)
            acc += elem_load(dout, n * C + c);
        dwpe[i] = acc;
    }
}

template <typename E>
static cudaError_t launch(float *dwte, float *dwpe, const E *dout, const int32_t *tok, int N, int T, int C,
                          cudaStream_t stream)
{
    dim3 grid((unsigned)N, (unsigned)(((size_t)C + THREADS - 1) / THREADS));
    embed_dwte_kernel<E><<<grid, THREADS, 0, stream>>>(dwte, dout, tok, N, C);
    LAUNCHED();
    embed_dwpe_kernel<E><<<grid_for((size_t)T * C), THREADS, 0, stream>>>(dwpe, dout, N, T, C);
    return cudaGetLastError();
}

extern "C" cudaError_t kcuda_embed_backward_grouped(float *dwte, float *dwpe, const void *dout, kcuda_elem elem,
                                                    const int32_t *tok, int N, int T, int C, cudaStream_t stream)
{
    if (N <= 0 || C <= 0)
        return cudaSuccess;
    if (T <= 0)
        return cudaErrorInvalidValue;
    switch (elem) {
    case KCUDA_F32:
        return launch(dwte, dwpe, (const float *)dout, tok, N, T, C, stream);
    case KCUDA_BF16:
        return launch(dwte, dwpe, (const __nv_bfloat16 *)dout, tok, N, T, C, stream);
    }
    return cudaErrorInvalidValue;
}
