/*
 * What t_cuda_emu_tables.c asks of the emulated CUDA runtime (emu_runtime.cpp) beyond the CUDA API itself: the seed
 * of its scheduling order, and counts that show the work really ran through it. Plain C, for the test's C code.
 */
#ifndef STRATA_TESTS_EMU_RUNTIME_H
#define STRATA_TESTS_EMU_RUNTIME_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Seeds the order in which the emulator runs blocks and resumes threads (the test passes its printed seed, so a
 * failure that depends on the order reproduces). */
void emu_seed(uint64_t seed);

typedef struct emu_counts {
    long long launches; /* kernel launches that ran */
    long long switches; /* fiber switches (the emulation's cost) */
    long long gemm_calls; /* cublasGemmEx / cublasGemmStridedBatchedEx calls */
    long long lt_calls; /* cublasLtMatmul calls */
} emu_counts;

/* Since the process started; emu_runtime.cpp counts the launches and switches, emu_blas.cpp the products. */
extern emu_counts emu_totals;

#ifdef __cplusplus
}
#endif

#endif
