/*
 * The device Adam kernel the C backend launches (dev_adam_step in gpu/device.h): the update of
 * cpu_adam/adam_ref.c, operation for operation, so that its bits are the scalar reference's.
 */
#ifndef STRATA_GPU_CUDA_ADAM_H
#define STRATA_GPU_CUDA_ADAM_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

struct adam_consts;

/* Queues the update of n elements on stream: master, m, v in place, grad (fp32) read, param written as
 * param_dtype (a strata_dtype: FP32, BF16, FP16, or NONE with param NULL). Returns the launch's error. */
cudaError_t cuda_adam_step(const struct adam_consts *c, float *master, float *m, float *v, const float *grad,
                           void *param, int param_dtype, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
