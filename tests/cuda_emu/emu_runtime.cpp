/*
 * The emulated CUDA runtime and kernel scheduler behind the emulated tests (emu_cuda.h lists them, says why they exist
 * and what the emulation does not model).
 *
 * Kernels: emu_run_grid runs a launch's blocks one at a time in a random order; a block's threads are fibers (stacks
 * of their own, switched by emu_switch below) resumed in a random order each round until every one has exited. A
 * fiber stops at __syncthreads (released when every thread of the block is there; a barrier after some threads exited
 * is a bug, and aborts) and at a warp collective (released when every lane of its warp is there; a warp collective
 * that some lanes of the warp skip, or one in a partial warp, aborts). Shared memory is poisoned with 0xff (NaN in
 * fp32 and bf16, -1 as an integer) before every block, so a read of shared memory no thread of this block wrote
 * shows.
 *
 * Runtime: synchronous and in host memory. cudaMalloc returns 256-byte aligned memory filled with 0xff, so a kernel
 * or table that reads memory nobody wrote (instead of zeroing or overwriting it) produces NaN; copies and memsets are
 * memmove / memset; streams and devices are single and trivially synchronized. Only what the model's tables and the
 * t_kcuda_* tests call is defined: anything else they start to call fails the link, loudly.
 *
 * The order of blocks and threads comes from the test's seed: emu_seed, or else, at the first launch, testlib's
 * t_rng_seed() (printed; STRATA_TEST_SEED repeats it), so an order-dependent failure of a t_kcuda_* test reproduces.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "emu_cuda.h"
#include "emu_runtime.h"

uint3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;

/* The dynamic shared memory: attention_flash.cu's `extern __shared__ float smem[]`, which convert_cu.py turns into a
 * reference to this array. 227 KiB is the most a kernel may opt in to (cudaFuncSetAttribute, below); a guard band
 * follows it. */
enum { SMEM_MAX_BYTES = 232448, SMEM_GUARD_BYTES = 64 };
float smem[(SMEM_MAX_BYTES + SMEM_GUARD_BYTES) / sizeof(float)];

/* A fiber switch saves the callee-saved registers on the running stack and resumes the other stack's: all that a
 * switch at a function call has to keep, in a few instructions. (glibc's swapcontext also saves and restores the
 * signal mask, a system call each way: most of the emulation's time went there.) The project builds for x86-64 only
 * (its host kernels are AVX2 files). */
#if !defined(__x86_64__)
#error "tests/cuda_emu: emu_switch is written for x86-64"
#endif
extern "C" void emu_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size emu_switch, .-emu_switch\n");

enum fiber_state { RUNNABLE, AT_WARP, AT_BARRIER, EXITED };
struct fiber {
    void *sp; /* the saved stack pointer while it does not run */
    char *stack;
    fiber_state state;
    uint3 tid;
};

static const size_t FIBER_STACK_BYTES = 128 * 1024;
static void *scheduler_sp;
static std::vector<fiber> fibers;
static unsigned current, block_threads;
static std::function<void()> *kernel_body;
static unsigned long long warp_slots[32][32];
static int barrier_pred[1024];
static cudaError_t last_error = cudaSuccess;
static std::map<const void *, int> dynamic_smem_limit;
static std::vector<std::pair<void *, size_t>> shared_arrays;
static std::mt19937_64 order_rng(1);
static bool order_seeded;
emu_counts emu_totals;

extern "C" uint64_t t_rng_seed(void); /* tests/helpers/testlib.c, which every emulated test links */

static void die(const char *what)
{
    fprintf(stderr, "emu: %s (block %u %u %u, thread %u %u %u)\n", what, emu_blockIdx.x, emu_blockIdx.y, emu_blockIdx.z,
            emu_threadIdx.x, emu_threadIdx.y, emu_threadIdx.z);
    abort();
}

extern "C" void emu_seed(uint64_t seed)
{
    order_rng.seed(seed);
    order_seeded = true;
}

bool emu_register_shared(void *p, size_t bytes)
{
    shared_arrays.push_back({p, bytes});
    memset(p, 0xff, bytes);
    return true;
}

/* A fiber's first frame: the kernel body, then back to the scheduler for good. */
static void fiber_main()
{
    (*kernel_body)();
    fibers[current].state = EXITED;
    void *unused;
    emu_switch(&unused, scheduler_sp);
    abort();
}

/* A fresh stack that emu_switch enters at fiber_main: six zero registers, fiber_main as the return address, and a
 * zero return address for fiber_main itself, so that it starts with the stack alignment of a called function. */
static void *fiber_stack_start(char *stack)
{
    uintptr_t top = ((uintptr_t)stack + FIBER_STACK_BYTES) & ~(uintptr_t)15;
    void **sp = (void **)top - 8;
    memset(sp, 0, 8 * sizeof(void *));
    sp[6] = (void *)fiber_main;
    return sp;
}

/* Parks the calling fiber until the scheduler releases it. */
static void park(fiber_state why)
{
    fibers[current].state = why;
    emu_switch(&fibers[current].sp, scheduler_sp);
    emu_threadIdx = fibers[current].tid;
}

int emu_lane_id()
{
    return (int)(current % 32);
}

/* The calling fiber's warp, which must be whole: the kernels launch multiples of 32 threads. */
static unsigned full_warp(unsigned mask, const char *what)
{
    if (mask != 0xffffffffu)
        die(what);
    unsigned w = current / 32;
    if (w * 32 + 32 > block_threads)
        die("a warp collective in a partial warp");
    return w;
}

unsigned long long emu_shfl_raw(unsigned mask, unsigned long long v, int src)
{
    unsigned w = full_warp(mask, "__shfl_sync with a mask other than the full warp");
    warp_slots[w][current % 32] = v;
    park(AT_WARP);
    unsigned long long r = warp_slots[w][src & 31];
    park(AT_WARP); /* nobody overwrites a slot before every lane has read */
    return r;
}

unsigned __ballot_sync(unsigned mask, int pred)
{
    unsigned w = full_warp(mask, "__ballot_sync with a mask other than the full warp");
    warp_slots[w][current % 32] = pred != 0;
    park(AT_WARP);
    unsigned r = 0;
    for (unsigned l = 0; l < 32; l++)
        r |= (unsigned)(warp_slots[w][l] != 0) << l;
    park(AT_WARP);
    return r;
}

void __syncthreads()
{
    park(AT_BARRIER);
}

int __syncthreads_or(int pred)
{
    barrier_pred[current] = pred != 0;
    park(AT_BARRIER);
    int r = 0;
    for (unsigned f = 0; f < block_threads; f++)
        r |= barrier_pred[f];
    park(AT_BARRIER);
    return r;
}

static void run_block(dim3 bd)
{
    block_threads = bd.x * bd.y * bd.z;
    if (fibers.size() < block_threads)
        fibers.resize(block_threads);
    for (unsigned f = 0; f < block_threads; f++) {
        fiber &fb = fibers[f];
        if (!fb.stack && !(fb.stack = (char *)malloc(FIBER_STACK_BYTES)))
            die("out of memory for fiber stacks");
        fb.sp = fiber_stack_start(fb.stack);
        fb.state = RUNNABLE;
        fb.tid = make_uint3(f % bd.x, (f / bd.x) % bd.y, f / (bd.x * bd.y));
    }
    std::vector<unsigned> order(block_threads);
    for (unsigned f = 0; f < block_threads; f++)
        order[f] = f;
    for (;;) {
        std::shuffle(order.begin(), order.end(), order_rng);
        for (unsigned f : order)
            if (fibers[f].state == RUNNABLE) {
                current = f;
                emu_threadIdx = fibers[f].tid;
                emu_totals.switches++;
                emu_switch(&scheduler_sp, fibers[f].sp);
            }
        unsigned exited = 0, at_barrier = 0, released = 0;
        for (unsigned f = 0; f < block_threads; f++) {
            exited += fibers[f].state == EXITED;
            at_barrier += fibers[f].state == AT_BARRIER;
        }
        if (exited == block_threads)
            return;
        /* Warps whose lanes all wait at a collective go on; a warp with some lanes there and others elsewhere is
         * divergent at a collective that needs them all. */
        for (unsigned w = 0; w * 32 < block_threads; w++) {
            unsigned waiting = 0, lanes = 0;
            for (unsigned l = w * 32; l < w * 32 + 32 && l < block_threads; l++, lanes++)
                waiting += fibers[l].state == AT_WARP;
            if (waiting && waiting != lanes) {
                current = w * 32;
                emu_threadIdx = fibers[current].tid;
                die("a warp is divergent at a warp collective (some lanes exited or wait at a barrier)");
            }
            if (waiting) {
                for (unsigned l = w * 32; l < w * 32 + lanes; l++)
                    fibers[l].state = RUNNABLE;
                released++;
            }
        }
        if (released)
            continue;
        if (at_barrier + exited != block_threads)
            die("deadlock");
        if (exited)
            die("__syncthreads after some threads of the block exited");
        for (unsigned f = 0; f < block_threads; f++)
            fibers[f].state = RUNNABLE;
    }
}

void emu_run_grid(const void *kernel, dim3 grid, dim3 block, size_t smem_bytes, std::function<void()> body)
{
    size_t limit = 49152;
    auto it = dynamic_smem_limit.find(kernel);
    if (kernel && it != dynamic_smem_limit.end() && (size_t)it->second > limit)
        limit = (size_t)it->second;
    unsigned threads = block.x * block.y * block.z;
    if (smem_bytes > limit || threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 ||
        grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr,
                "emu: launch refused: dynamic shared memory %zu (allowed %zu), block %u x %u x %u, grid %u x %u x %u\n",
                smem_bytes, limit, block.x, block.y, block.z, grid.x, grid.y, grid.z);
        last_error = cudaErrorInvalidValue;
        return;
    }
    if (!order_seeded)
        emu_seed(t_rng_seed());
    emu_totals.launches++;
    kernel_body = &body;
    emu_blockDim = block;
    emu_gridDim = grid;
    std::vector<uint3> blocks;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++)
                blocks.push_back(make_uint3(x, y, z));
    std::shuffle(blocks.begin(), blocks.end(), order_rng);
    for (uint3 b : blocks) {
        emu_blockIdx = b;
        memset(smem, 0xff, smem_bytes + SMEM_GUARD_BYTES);
        for (auto &a : shared_arrays)
            memset(a.first, 0xff, a.second);
        run_block(block);
        const unsigned char *guard = (const unsigned char *)smem + smem_bytes;
        for (size_t i = 0; i < SMEM_GUARD_BYTES; i++)
            if (guard[i] != 0xff) {
                fprintf(stderr, "emu: block %u %u %u wrote dynamic shared memory past its %zu bytes (at +%zu)\n", b.x,
                        b.y, b.z, smem_bytes, i);
                abort();
            }
    }
}

/* ---------------------------------------------------------------- the runtime API the tables and tests call */
extern "C" {
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > SMEM_MAX_BYTES)
        return cudaErrorInvalidValue;
    dynamic_smem_limit[func] = value;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    size_t bytes = (n + 255) / 256 * 256 + 256;
    *p = aligned_alloc(256, bytes);
    if (!*p)
        return cudaErrorMemoryAllocation;
    memset(*p, 0xff, bytes); /* NaN in fp32 and bf16: a read of memory nobody wrote shows */
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind)
{
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind, cudaStream_t)
{
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int v, size_t n)
{
    memset(dst, v, n);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t)
{
    memset(dst, v, n);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t, int *d)
{
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

/* The device the tests print: named for what it is, with the compute capability and shared-memory limits the
 * emulator enforces (those of sm_90, which the model's kernels target). */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int d)
{
    if (d != 0)
        return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "emulated on the host (tests/cuda_emu)");
    prop->major = 9;
    prop->minor = 0;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->sharedMemPerBlock = 49152;
    prop->sharedMemPerBlockOptin = SMEM_MAX_BYTES;
    prop->multiProcessorCount = 1;
    return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    default:
        return "cudaError (not emulated)";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    return cudaGetErrorName(e);
}
}
