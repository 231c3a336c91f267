#include "gpt_runs.h"

#include <stdlib.h>
#include <string.h>

#include "model/gpt_ops.h"
#include "testlib.h"

double gpt_ref_grads(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, uint64_t seed, const int32_t *tok,
                     const int32_t *tgt, int micro, float scale, float *grads)
{
    gpt_flat *f = NULL;
    T_OK(gpt_flat_create(d, seed, &f));
    size_t bytes = gpt_activation_bytes(d, batch, seq, mode, GPT_ACTS_FP32), n = (size_t)batch * seq;
    void *mem = malloc(bytes);
    gpt_net *net = NULL;
    T_OK(gpt_net_create(d, batch, seq, mode, NULL, gpt_ops_host(), mem, bytes, &net));
    gpt_source src = gpt_flat_source(f);
    double loss = 0, l;
    for (int mb = 0; mb < micro; mb++) {
        T_OK(gpt_net_step(net, &src, tok + mb * n, tgt + mb * n, true, scale, &l));
        loss += l / micro;
    }
    memcpy(grads, f->grads, gpt_numel(d) * sizeof(float));
    gpt_net_destroy(net);
    free(mem);
    gpt_flat_destroy(f);
    return loss;
}

double gpt_engine_grads(const char *what, const strata_config *cfg, const gpt_dims *d, int batch, int seq,
                        gpt_act_mode mode, strata_dtype dt, uint64_t seed, const int32_t *tok, const int32_t *tgt,
                        int micro, float scale, float *grads, gpt_engine_run *run)
{
    size_t n = (size_t)batch * seq;
    double loss = 0, l;
    *run = (gpt_engine_run){0};
    T_OK(strata_engine_create(cfg, &run->e));
    T_OK(gpt_model_register(run->e, d, seed, &run->m));
    T_OK(strata_engine_finalize(run->e));
    T_OK(gpt_model_prepare(run->m, batch, seq, 1, mode, dt));
    memset(grads, 0, gpt_numel(d) * sizeof(float));
    T_OK(gpt_model_capture_grads(run->m, grads));
    for (int mb = 0; mb < micro; mb++) {
        T_CHECK(gpt_model_micro_step(run->m, tok + mb * n, tgt + mb * n, true, scale, &l) == STRATA_OK,
                "%s: micro step: %s", what, strata_last_error(run->e));
        loss += l / micro;
    }
    return loss;
}

void gpt_engine_run_end(gpt_engine_run *run)
{
    gpt_model_destroy(run->m);
    strata_engine_destroy(run->e);
    *run = (gpt_engine_run){0};
}
