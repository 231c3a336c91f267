/*
 * Host arrays without the device (strata_grads_from_host, strata_params_to_host, strata_grad_store_data,
 * strata_param_home_data) against the device path (fetch, strata_grad_data, strata_grads_ready): the same random
 * gradients over several steps of accumulation 2 give bit-identical master weights whether they are handed over
 * through the device buffers, copied from the trainer's arrays, or written in place into the store's own memory;
 * the weights strata_params_to_host copies out (and, in host memory, those at strata_param_home_data) equal the master
 * weights. With the optimizer and the gradient store on NVMe the store's address is refused with a message naming the
 * copying call, and the copies still work (read-add-write on the drive); with step_in_backward the calls are refused. fp32 parameters on the host tier are the master
 * array itself (the step writes it once): the address a trainer reads is where the update lands.
 */
#include <stdlib.h>
#include <string.h>

#include "synth.h"
#include "testlib.h"

enum { NPARAMS = 3, STEPS = 3, ACCUM = 2 };
static const size_t numels[NPARAMS] = {1000, 37, 4096};

typedef enum { VIA_DEVICE, VIA_COPY, VIA_STORE } way;

static strata_status init_fn(void *ctx, strata_param_id param, size_t offset, size_t count, float *out)
{
    uint64_t seed = *(uint64_t *)ctx + (uint64_t)param * 1000003u;
    for (size_t i = 0; i < count; i++) {
        uint64_t x = (seed + offset + i) * 0x9e3779b97f4a7c15ull;
        out[i] = (float)((double)(x >> 11) / (double)(1ull << 53)) - 0.5f;
    }
    return STRATA_OK;
}

static strata_config config(bool opt_on_nvme, const char *dir)
{
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 8u << 20;
    c.offload_param.device = STRATA_TIER_HOST;
    c.offload_optimizer.device = STRATA_TIER_HOST;
    if (opt_on_nvme) {
        synth_offload(&c, STRATA_TIER_NVME, dir, false, true);
        c.gradients_on_nvme = STRATA_SWITCH_ON; /* the store too: read-add-write on the drive */
    }
    c.weight_decay = 0.1f;
    c.weight_decay_exact = 0.1;
    return c;
}

static strata_engine *build(const strata_config *c, uint64_t *seed, strata_module_id *mid, strata_param_id *pids)
{
    strata_engine *e = NULL;
    T_OK(strata_engine_create(c, &e));
    if (!e)
        return NULL;
    T_OK(strata_module_add(e, "block", mid));
    for (int i = 0; i < NPARAMS; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        T_OK(strata_param_add(e, *mid, name, numels[i], init_fn, seed, &pids[i]));
    }
    T_OK(strata_engine_finalize(e));
    return e;
}

/* Trains with the gradients of grads[step][micro][param] handed over `how`; returns the master weights. */
static float *train(const strata_config *c, uint64_t seed, way how, float *grads[STEPS][ACCUM][NPARAMS])
{
    strata_module_id mid;
    strata_param_id pids[NPARAMS];
    strata_engine *e = build(c, &seed, &mid, pids);
    if (!e)
        return NULL;
    for (int s = 0; s < STEPS; s++) {
        for (int m = 0; m < ACCUM; m++) {
            const void *from[NPARAMS];
            for (int i = 0; i < NPARAMS; i++)
                from[i] = grads[s][m][i];
            if (how == VIA_DEVICE) {
                T_OK(strata_fetch(e, mid));
                for (int i = 0; i < NPARAMS; i++)
                    memcpy(strata_grad_data(e, pids[i]), grads[s][m][i], numels[i] * 4);
                T_OK(strata_grads_ready(e, mid));
                T_OK(strata_release(e, mid));
            } else if (how == VIA_STORE) {
                /* The trainer accumulates in place, as a backward into .grad aliasing the store would. */
                for (int i = 0; i < NPARAMS; i++) {
                    float *at = strata_grad_store_data(e, pids[i]);
                    T_CHECK(at != NULL, "strata_grad_store_data: %s", strata_last_error(e));
                    if (!at)
                        break;
                    for (size_t k = 0; k < numels[i]; k++)
                        at[k] = m == 0 ? grads[s][m][i][k] : at[k] + grads[s][m][i][k];
                    from[i] = at;
                }
                T_OK(strata_grads_from_host(e, mid, from, NPARAMS));
            } else {
                T_OK(strata_grads_from_host(e, mid, from, NPARAMS));
            }
        }
        strata_step_args a = {.lr = 1e-2};
        strata_step_result r;
        T_OK(strata_step(e, &a, &r));
    }
    T_OK(strata_sync(e));
    size_t total = 0;
    for (int i = 0; i < NPARAMS; i++)
        total += numels[i];
    float *master = calloc(total, 4), *out = calloc(total, 4);
    void *dst[NPARAMS];
    size_t at = 0;
    for (int i = 0; i < NPARAMS; i++) {
        T_OK(strata_param_read_master(e, pids[i], 0, numels[i], master + at));
        dst[i] = out + at;
        at += numels[i];
    }
    T_OK(strata_params_to_host(e, mid, dst, NPARAMS));
    T_CHECK(memcmp(master, out, total * 4) == 0, "strata_params_to_host copies the master weights (fp32)");
    at = 0;
    if (c->offload_optimizer.device == STRATA_TIER_HOST) {
        for (int i = 0; i < NPARAMS; i++) {
            const float *home = strata_param_home_data(e, pids[i]);
            T_CHECK(home && memcmp(home, master + at, numels[i] * 4) == 0,
                    "p%d: strata_param_home_data holds the updated weights (%s)", i,
                    home ? "they differ" : strata_last_error(e));
            at += numels[i];
        }
    }
    free(out);
    strata_engine_destroy(e);
    return master;
}

static void compare(const char *what, const float *got, const float *want)
{
    size_t total = 0;
    for (int i = 0; i < NPARAMS; i++)
        total += numels[i];
    if (!got || !want)
        return;
    size_t k = 0;
    while (k < total && memcmp(&got[k], &want[k], 4) == 0)
        k++;
    T_CHECK(k == total, "%s: master weights differ from the device path's at element %zu: %.9g vs %.9g", what, k,
            k < total ? (double)got[k] : 0.0, k < total ? (double)want[k] : 0.0);
}

int main(void)
{
    uint64_t seed = t_rng_seed();
    float *grads[STEPS][ACCUM][NPARAMS];
    for (int s = 0; s < STEPS; s++)
        for (int m = 0; m < ACCUM; m++)
            for (int i = 0; i < NPARAMS; i++) {
                grads[s][m][i] = malloc(numels[i] * 4);
                for (size_t k = 0; k < numels[i]; k++)
                    grads[s][m][i][k] = t_rand_normal() * 0.01f;
            }
    const char *dir = t_scratch_dir("t_host_exchange");
    for (int nvme = 0; nvme < 2; nvme++) {
        strata_config c = config(nvme, dir);
        const char *tier = nvme ? "optimizer and gradients on NVMe" : "host tier";
        float *want = train(&c, seed, VIA_DEVICE, grads);
        float *copied = train(&c, seed, VIA_COPY, grads);
        char what[80];
        snprintf(what, sizeof what, "%s: copied from host arrays", tier);
        compare(what, copied, want);
        if (!nvme) {
            float *in_place = train(&c, seed, VIA_STORE, grads);
            snprintf(what, sizeof what, "%s: accumulated in the store's memory", tier);
            compare(what, in_place, want);
            free(in_place);
        } else {
            strata_module_id mid;
            strata_param_id pids[NPARAMS];
            uint64_t s2 = seed;
            strata_engine *e = build(&c, &s2, &mid, pids);
            if (e) {
                T_CHECK(strata_grad_store_data(e, pids[0]) == NULL, "the store on NVMe has no host address");
                T_CONTAINS(strata_last_error(e), "strata_grads_from_host");
                strata_engine_destroy(e);
            }
        }
        free(want);
        free(copied);
    }
    /* step_in_backward moves gradients as they come off the device: the host calls are refused. */
    strata_config c = config(false, dir);
    c.step_in_backward = true;
    strata_module_id mid;
    strata_param_id pids[NPARAMS];
    strata_engine *e = build(&c, &seed, &mid, pids);
    if (e) {
        const void *none[NPARAMS] = {0};
        T_STATUS(strata_grads_from_host(e, mid, none, NPARAMS), STRATA_ESTATE);
        T_CONTAINS(strata_last_error(e), "step_in_backward");
        strata_engine_destroy(e);
    }
    for (int s = 0; s < STEPS; s++)
        for (int m = 0; m < ACCUM; m++)
            for (int i = 0; i < NPARAMS; i++)
                free(grads[s][m][i]);
    return t_done();
}
