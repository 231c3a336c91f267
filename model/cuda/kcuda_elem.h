/* The element type of an activation buffer the CUDA kernels read or write: the one choice a kernel that serves both
 * CUDA gpt_ops tables (fp32 activations, bf16 activations) takes at run time. */
#ifndef STRATA_MODEL_CUDA_KCUDA_ELEM_H
#define STRATA_MODEL_CUDA_KCUDA_ELEM_H

typedef enum kcuda_elem {
    KCUDA_F32 = 0,
    KCUDA_BF16,
} kcuda_elem;

#endif
