/*
 * Choosing the kernel: the CPU's features are read once (__builtin_cpu_supports); STRATA_ISA=ref|avx2|avx512
 * forces one. An unknown value warns once and names the allowed values; forcing an ISA the CPU lacks is
 * an error with the missing features named, never an illegal-instruction crash.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "cpu_adam/adam.h"
#include "cpu_adam/adam_moments.h"

/* The compressed-moment steps have no AVX-512 variant: the AVX-512 table uses the AVX2 ones. */
static const adam_ops table[ADAM_ISA_COUNT] = {
    [ADAM_ISA_REF] = {ADAM_ISA_REF, "ref", adam_step_ref, adam_step_bf16_ref, adam_step_q8_ref, adam_gradstats_ref,
                      adam_roofline_ref},
    [ADAM_ISA_AVX2] = {ADAM_ISA_AVX2, "avx2", adam_step_avx2, adam_step_bf16_avx2, adam_step_q8_avx2,
                       adam_gradstats_avx2, adam_roofline_avx2},
    [ADAM_ISA_AVX512] = {ADAM_ISA_AVX512, "avx512", adam_step_avx512, adam_step_bf16_avx2, adam_step_q8_avx2,
                         adam_gradstats_avx512, adam_roofline_avx512},
};

/* The features each ISA's files are compiled for, as __builtin_cpu_supports and /proc/cpuinfo name them
 * (avx512bf16 is optional: the AVX-512 kernel falls back to integer bf16 rounding without it). */
static const char *missing_features(adam_isa isa, char *buf, size_t len)
{
    buf[0] = '\0';
#define NEED(feature)                                                                    \
    do {                                                                                 \
        if (!__builtin_cpu_supports(feature))                                            \
            snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? "," : "", feature); \
    } while (0)
    __builtin_cpu_init();
    if (isa == ADAM_ISA_AVX2 || isa == ADAM_ISA_AVX512) {
        NEED("avx2");
        NEED("fma");
        NEED("f16c");
    }
    if (isa == ADAM_ISA_AVX512) {
        NEED("avx512f");
        NEED("avx512bw");
        NEED("avx512vl");
        NEED("avx512dq");
    }
#undef NEED
    return buf;
}

bool adam_isa_supported(adam_isa isa)
{
    char buf[128];
    return isa >= 0 && isa < ADAM_ISA_COUNT && missing_features(isa, buf, sizeof buf)[0] == '\0';
}

bool adam_isa_parse(const char *name, adam_isa *out)
{
    for (int i = 0; i < ADAM_ISA_COUNT; i++) {
        if (strcmp(name, table[i].name) == 0) {
            *out = (adam_isa)i;
            return true;
        }
    }
    return false;
}

strata_status adam_ops_for(adam_isa isa, const adam_ops **out)
{
    char missing[128];
    *out = NULL;
    if (isa < 0 || isa >= ADAM_ISA_COUNT)
        return err_set(STRATA_EINVAL, "adam: unknown ISA %d", (int)isa);
    if (missing_features(isa, missing, sizeof missing)[0]) {
        return err_set(STRATA_EUNSUPPORTED,
                       "adam: the %s kernel needs CPU features this machine lacks (%s); unset STRATA_ISA to use "
                       "the best this CPU runs, or choose a lesser one (ref, avx2)",
                       table[isa].name, missing);
    }
    *out = &table[isa];
    return STRATA_OK;
}

static pthread_once_t choose_once = PTHREAD_ONCE_INIT;
static bool forced;
static adam_isa chosen;

static void choose(void)
{
    const char *env = getenv("STRATA_ISA");
    if (env && env[0]) {
        if (adam_isa_parse(env, &chosen)) {
            forced = true;
            return;
        }
        LOG_WARN(LOG_ADAM, "STRATA_ISA=\"%s\" is not a known kernel; allowed: ref, avx2, avx512 — using the best "
                 "this CPU runs", env);
    }
    chosen = adam_isa_supported(ADAM_ISA_AVX512) ? ADAM_ISA_AVX512
             : adam_isa_supported(ADAM_ISA_AVX2) ? ADAM_ISA_AVX2
                                                 : ADAM_ISA_REF;
    LOG_INFO(LOG_ADAM, "CPU Adam kernel: %s", table[chosen].name);
}

strata_status adam_ops_default(const adam_ops **out)
{
    pthread_once(&choose_once, choose);
    strata_status st = adam_ops_for(chosen, out);
    if (st != STRATA_OK && forced) {
        char missing[128];
        return err_set(st, "STRATA_ISA=%s: this CPU lacks %s; allowed here: %s%s", table[chosen].name,
                       missing_features(chosen, missing, sizeof missing), "ref",
                       adam_isa_supported(ADAM_ISA_AVX2) ? ", avx2" : "");
    }
    return st;
}
