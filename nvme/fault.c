/* Test-only fault injection: inert unless a test or STRATA_NVME_FAULT arms it. */
#include "nvme/fault.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* armed_kind is NONE in every normal run, so nvme_fault_next() returns after one load. */
static _Atomic int armed_kind = NVME_FAULT_NONE;
static _Atomic uint64_t target_op;
static _Atomic uint64_t op_counter;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void read_env(void)
{
    const char *env = getenv("STRATA_NVME_FAULT");
    if (!env || !*env)
        return;
    static const struct {
        const char *name;
        nvme_fault_kind kind;
    } kinds[] = {{"eio", NVME_FAULT_EIO}, {"short", NVME_FAULT_SHORT}, {"eagain", NVME_FAULT_EAGAIN},
                 {"nodirect", NVME_FAULT_NODIRECT}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        size_t n = strlen(kinds[i].name);
        if (strncmp(env, kinds[i].name, n) != 0)
            continue;
        uint64_t at = env[n] == '@' ? strtoull(env + n + 1, NULL, 10) : 1;
        nvme_fault_inject(at ? at : 1, kinds[i].kind);
        LOG_WARN(LOG_IO, "STRATA_NVME_FAULT=%s: fault injection armed (test-only)", env);
        return;
    }
    LOG_WARN(LOG_IO, "STRATA_NVME_FAULT=\"%s\" not understood: expected eio@N, short@N, eagain@N or nodirect; ignored",
             env);
}

void nvme_fault_inject(uint64_t op_index, nvme_fault_kind kind)
{
    atomic_store(&armed_kind, NVME_FAULT_NONE);
    atomic_store(&target_op, atomic_load(&op_counter) + op_index);
    atomic_store(&armed_kind, kind);
}

nvme_fault_kind nvme_fault_next(void)
{
    pthread_once(&env_once, read_env);
    int kind = atomic_load_explicit(&armed_kind, memory_order_relaxed);
    if (kind == NVME_FAULT_NONE || kind == NVME_FAULT_NODIRECT)
        return NVME_FAULT_NONE;
    uint64_t n = atomic_fetch_add(&op_counter, 1) + 1;
    if (n != atomic_load(&target_op))
        return NVME_FAULT_NONE;
    /* One shot: exactly one operation sees the fault, whichever thread counts it. */
    int expected = kind;
    if (!atomic_compare_exchange_strong(&armed_kind, &expected, NVME_FAULT_NONE))
        return NVME_FAULT_NONE;
    return (nvme_fault_kind)kind;
}

bool nvme_fault_nodirect(void)
{
    pthread_once(&env_once, read_env);
    return atomic_load_explicit(&armed_kind, memory_order_relaxed) == NVME_FAULT_NODIRECT;
}
