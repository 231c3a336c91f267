#include "gpt_ref.h"

#include <stdlib.h>
#include <string.h>

#include "model/gpt_ops.h"
#include "testlib.h"

double gpt_ref_grads(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, uint64_t seed, const int32_t *tok,
                     const int32_t *tgt, int micro, float scale, float *grads)
{
    gpt_flat *f = NULL;
    T_OK(gpt_flat_create(d, seed, &f));
    size_t bytes = gpt_activation_bytes(d, batch, seq, mode), n = (size_t)batch * seq;
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
