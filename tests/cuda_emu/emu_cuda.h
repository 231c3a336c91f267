/*
 * The CUDA device features the model's kernels (the .cu files of model/cuda) use, emulated on the host, so that the
 * CUDA model's kernels and kernel tables are checked on the CPU in every build with the CUDA toolkit, also where no
 * GPU is lent. Three tests run on it (CMakeLists.txt builds them):
 *   cuda_emu_tables           t_cuda_emu_tables.c: the bf16 and fp32 kernel tables through the network, with the
 *                             emulated cuBLAS (emu_blas.cpp);
 *   cuda_emu_kcuda_bf16       tests/t_kcuda_bf16.c, the GPU test unchanged: the bf16 kernels and the embedding
 *                             backward against the host kernels;
 *   cuda_emu_kcuda_attention  tests/t_kcuda_attention.c, likewise: the flash attention, with STRATA_KCUDA_SHAPES=quick
 *                             (every shape but the largest).
 * The GPU tests (t_kcuda_*, t_model_cuda) on a GPU remain the authority; this emulation catches what a wrong index,
 * leading dimension, missing term or overwrite would show on any machine.
 *
 * convert_cu.py rewrites each .cu / .cuh file into host C++ that includes this header first: a launch
 * k<<<grid, block, smem, stream>>>(args) becomes emu_run_grid(...), which runs the grid's blocks one at a time,
 * in a random order, each block's threads as fibers (emu_runtime.cpp) switched at __syncthreads and at the warp
 * collectives (__shfl_sync, __shfl_xor_sync, __ballot_sync), which are exchanged through per-warp slots with
 * full-warp masks only. threadIdx / blockIdx / blockDim / gridDim are globals that the scheduler sets before it
 * resumes a fiber. Static __shared__ arrays become static locals (one copy, which is right because blocks run one at
 * a time) that are filled with 0xff before every block; extern __shared__ is the emulator's own array, likewise
 * poisoned, with a guard band that catches a write past the launch's dynamic size.
 *
 * What it does not model: blocks never run concurrently, so a race between blocks (two blocks adding into one
 * address without an atomic) cannot show; threads of a warp are not in lock step, so code that relies on implicit
 * warp synchrony without a collective is not checked either way; there is no memory model, no timing, and the
 * device's float arithmetic is the host's (fused multiply-add contraction and fast intrinsics may differ in the last
 * bits).
 */
#ifndef STRATA_TESTS_EMU_CUDA_H
#define STRATA_TESTS_EMU_CUDA_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#undef __launch_bounds__
#define __launch_bounds__(...)

extern uint3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim

/* The calling fiber's lane, and a shuffle of 8 bytes from lane src of its warp (mask must be the full warp). */
int emu_lane_id();
unsigned long long emu_shfl_raw(unsigned mask, unsigned long long v, int src_lane);

template <class T> T __shfl_sync(unsigned mask, T v, int src)
{
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    unsigned long long u = 0;
    memcpy(&u, &v, sizeof v);
    u = emu_shfl_raw(mask, u, src & 31);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}

template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask)
{
    return __shfl_sync(mask, v, emu_lane_id() ^ lane_mask);
}

unsigned __ballot_sync(unsigned mask, int pred);
int __syncthreads_or(int pred);
void __syncthreads();
static inline int __popc(unsigned x)
{
    return __builtin_popcount(x);
}
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

/* Runs body once per thread of every block of grid (blocks one at a time, in a random order). kernel identifies the
 * kernel for cudaFuncSetAttribute's dynamic shared-memory limit (nullptr: the default 48 KiB). A launch the hardware
 * would refuse (too many threads, too much shared memory, an empty grid) runs nothing and is reported by
 * cudaGetLastError as cudaErrorInvalidValue, as a real launch failure would be. */
void emu_run_grid(const void *kernel, dim3 grid, dim3 block, size_t smem_bytes, std::function<void()> body);

template <class T> cudaError_t cudaFuncSetAttribute(T *f, enum cudaFuncAttribute a, int v)
{
    return cudaFuncSetAttribute((const void *)f, a, v);
}

/* Registers a static __shared__ array (once, from its first use) so that it is poisoned before every block. */
bool emu_register_shared(void *p, size_t bytes);
#define EMU_SHARED(x)                                                       \
do {                                                                        \
static bool emu_registered_ = emu_register_shared((void *)&(x), sizeof(x)); \
(void)emu_registered_;                                                      \
} while (0)

#endif
