/*
 * Causal multi-head attention that never materializes the T x T matrix (FlashAttention's tiling with an online
 * softmax), for the CUDA gpt_ops tables. The layout is the network's: qkv is (B, T, 3C) with head h's queries, keys
 * and values at channels h*hs, C + h*hs and 2C + h*hs (hs = C / NH); out and dout are (B, T, C) with head h at
 * channels h*hs. Elements are fp32 or bf16 (kcuda_elem); every sum accumulates in fp32 and the softmax statistics
 * stay fp32. scale = 1/sqrt(hs).
 *
 * Forward keeps, per query row, lse = max + log(sum exp(s - max)) of the scaled scores s (B, NH, T fp32): all that
 * backward needs besides qkv and out. Backward recomputes the probabilities from lse and runs in two kernels, one
 * over key tiles (dK, dV) and one over query tiles (dQ), so no two threads ever add into the same element: no
 * atomics, and the bits depend on the shapes alone (two runs of the same step give the same gradients).
 *
 * Head sizes up to KCUDA_FLASH_MAX_HEAD; any T >= 1 (odd ones included). Each launcher queues on stream and returns
 * the first launch failure (cudaSuccess when nothing needed launching: B == 0 or T == 0). It returns
 * cudaErrorInvalidValue, having launched nothing, for NH < 1, C < 1, C % NH != 0, C / NH > KCUDA_FLASH_MAX_HEAD,
 * B or T < 0, B or NH > 65535 (grid limits), an elem outside kcuda_elem, or a NULL pointer where there is work. Heads
 * of 96 and more (forward: 128) need more than the 48 KiB of shared memory a block gets by default: the launchers opt
 * in with cudaFuncSetAttribute on the current device (at most 66 KiB, at hs 128) and return its failure, if any.
 * Pointers are device memory; outputs must not overlap inputs.
 */
#ifndef STRATA_MODEL_CUDA_ATTENTION_FLASH_H
#define STRATA_MODEL_CUDA_ATTENTION_FLASH_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "model/cuda/kcuda_elem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KCUDA_FLASH_MAX_HEAD 128

/* out (overwritten) and lse (B * NH * T floats, overwritten) from qkv. */
cudaError_t kcuda_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, kcuda_elem elem,
                                cudaStream_t stream);
/* dqkv (B, T, 3C, overwritten: every column of every row) from dout, with forward's qkv, out and lse (the same elem;
 * in bf16, out as forward rounded it); scratch holds B * NH * T floats (each row's sum of dout * out). */
cudaError_t kcuda_flash_backward(void *dqkv, float *scratch, const void *dout, const void *qkv, const void *out,
                                 const float *lse, int B, int T, int C, int NH, kcuda_elem elem, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
