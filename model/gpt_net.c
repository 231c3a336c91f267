/* The GPT network: carves its activations out of the caller's block and runs forward and backward module
 * by module, asking the source for each module's parameters right before use (see gpt.h). */
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"
#include "model/gpt_kernels.h"

/* Rows of the head computed at once: bounds the logits buffer to HEAD_CHUNK x vocab. */
#define HEAD_CHUNK 256

typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *res3;
} layer_acts;

struct gpt_net {
    gpt_dims d;
    int B, T;
    float *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits;
    float *dres, *dsmall, *dbig, *datt; /* backward scratch */
    layer_acts *layer;
};

typedef struct carver {
    char *base;
    size_t used, cap;
} carver;

static float *carve(carver *c, size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63; /* 64-byte aligned pieces */
    float *p = c->base ? (float *)(c->base + c->used) : NULL;
    c->used += bytes;
    return p;
}

/* One layout function for both sizing (base NULL) and carving, so they cannot disagree. */
static size_t layout(const gpt_dims *d, int B, int T, void *mem, gpt_net *net)
{
    carver c = {mem, 0, 0};
    size_t N = (size_t)B * T, C = (size_t)d->hidden, NH = (size_t)d->heads;
    size_t chunk = N < HEAD_CHUNK ? N : HEAD_CHUNK;
    float *p;
    p = carve(&c, N * C);
    if (net)
        net->encoded = p;
    for (int l = 0; l < d->layers; l++) {
        layer_acts a;
        a.ln1 = carve(&c, N * C);
        a.ln1_mean = carve(&c, N);
        a.ln1_rstd = carve(&c, N);
        a.qkv = carve(&c, N * 3 * C);
        a.atty = carve(&c, N * C);
        a.att = carve(&c, (size_t)B * NH * T * T);
        a.res2 = carve(&c, N * C);
        a.ln2 = carve(&c, N * C);
        a.ln2_mean = carve(&c, N);
        a.ln2_rstd = carve(&c, N);
        a.fch = carve(&c, N * 4 * C);
        a.fch_gelu = carve(&c, N * 4 * C);
        a.res3 = carve(&c, N * C);
        if (net)
            net->layer[l] = a;
    }
    float *lnf = carve(&c, N * C), *mean = carve(&c, N), *rstd = carve(&c, N), *logits = carve(&c, chunk * d->vocab);
    float *dres = carve(&c, N * C), *dsmall = carve(&c, N * C), *dbig = carve(&c, N * 4 * C);
    float *datt = carve(&c, (size_t)T * T);
    if (net) {
        net->lnf = lnf, net->lnf_mean = mean, net->lnf_rstd = rstd, net->logits = logits;
        net->dres = dres, net->dsmall = dsmall, net->dbig = dbig, net->datt = datt;
    }
    return c.used;
}

size_t gpt_activation_bytes(const gpt_dims *d, int batch, int seq)
{
    return layout(d, batch, seq, NULL, NULL);
}

strata_status gpt_net_create(const gpt_dims *d, int batch, int seq, void *mem, size_t mem_bytes, gpt_net **out)
{
    *out = NULL;
    if (batch < 1 || seq < 1 || seq > d->seq || gpt_dims_check(d) || !mem ||
        mem_bytes < gpt_activation_bytes(d, batch, seq))
        return STRATA_EINVAL;
    gpt_net *net = calloc(1, sizeof *net);
    if (!net)
        return STRATA_ENOMEM;
    net->layer = calloc((size_t)d->layers, sizeof *net->layer);
    if (!net->layer) {
        free(net);
        return STRATA_ENOMEM;
    }
    net->d = *d;
    net->B = batch;
    net->T = seq;
    layout(d, batch, seq, mem, net);
    *out = net;
    return STRATA_OK;
}

void gpt_net_destroy(gpt_net *net)
{
    if (!net)
        return;
    free(net->layer);
    free(net);
}

#define TRY(call)                        \
    do {                                 \
        strata_status st_ = (call);      \
        if (st_ != STRATA_OK)            \
            return st_;                  \
    } while (0)

static void block_forward(gpt_net *net, int l, float **w, const float *inp)
{
    int N = net->B * net->T, C = net->d.hidden;
    layer_acts *a = &net->layer[l];
    k_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, inp, w[0], w[1], N, C);
    k_linear_forward(a->qkv, a->ln1, w[2], w[3], N, C, 3 * C);
    k_attention_forward(a->atty, a->att, a->qkv, net->B, net->T, C, net->d.heads);
    k_linear_forward(net->dsmall, a->atty, w[4], w[5], N, C, C);
    k_residual_forward(a->res2, inp, net->dsmall, (size_t)N * C);
    k_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[6], w[7], N, C);
    k_linear_forward(a->fch, a->ln2, w[8], w[9], N, C, 4 * C);
    k_gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * C);
    k_linear_forward(net->dsmall, a->fch_gelu, w[10], w[11], N, 4 * C, C);
    k_residual_forward(a->res3, a->res2, net->dsmall, (size_t)N * C);
}

/* dres holds the gradient of the block's output on entry and of its input on return. */
static void block_backward(gpt_net *net, int l, float **w, float **g, const float *inp)
{
    int N = net->B * net->T, C = net->d.hidden;
    layer_acts *a = &net->layer[l];
    float *dres = net->dres, *dbig = net->dbig, *dsmall = net->dsmall;
    size_t n4 = (size_t)N * 4 * C;
    /* MLP: res3 = res2 + proj(gelu(fc(ln2(res2)))) */
    memset(dbig, 0, n4 * sizeof(float));
    k_linear_backward(dbig, g[10], g[11], dres, a->fch_gelu, w[10], N, 4 * C, C);
    k_gelu_backward(dbig, a->fch, n4);
    memset(dsmall, 0, (size_t)N * C * sizeof(float));
    k_linear_backward(dsmall, g[8], g[9], dbig, a->ln2, w[8], N, C, 4 * C);
    k_layernorm_backward(dres, g[6], g[7], dsmall, a->res2, w[6], a->ln2_mean, a->ln2_rstd, N, C);
    /* Attention: res2 = inp + proj(attn(qkv(ln1(inp)))) */
    memset(dsmall, 0, (size_t)N * C * sizeof(float));
    k_linear_backward(dsmall, g[4], g[5], dres, a->atty, w[4], N, C, C);
    k_attention_backward(dbig, net->datt, dsmall, a->qkv, a->att, net->B, net->T, C, net->d.heads);
    memset(dsmall, 0, (size_t)N * C * sizeof(float));
    k_linear_backward(dsmall, g[2], g[3], dbig, a->ln1, w[2], N, C, 3 * C);
    k_layernorm_backward(dres, g[0], g[1], dsmall, inp, w[0], a->ln1_mean, a->ln1_rstd, N, C);
}

strata_status gpt_net_step(gpt_net *net, const gpt_source *src, const int32_t *tokens, const int32_t *targets,
                           bool backward, float grad_scale, double *loss)
{
    const gpt_dims *d = &net->d;
    int L = d->layers, N = net->B * net->T, C = d->hidden;
    float *w[GPT_MAX_MODULE_PARAMS], *g[GPT_MAX_MODULE_PARAMS];
    for (int t = 0; t < N; t++)
        if (tokens[t] < 0 || tokens[t] >= d->vocab || targets[t] < 0 || targets[t] >= d->vocab)
            return STRATA_EINVAL;

    /* forward */
    TRY(src->acquire(src->ctx, 0, false, w, g));
    k_embed_forward(net->encoded, tokens, w[0], w[1], N, net->T, C);
    TRY(src->finish(src->ctx, 0, false));
    for (int l = 0; l < L; l++) {
        TRY(src->acquire(src->ctx, l + 1, false, w, g));
        block_forward(net, l, w, l == 0 ? net->encoded : net->layer[l - 1].res3);
        TRY(src->finish(src->ctx, l + 1, false));
    }
    float *last = L > 0 ? net->layer[L - 1].res3 : net->encoded;
    TRY(src->acquire(src->ctx, L + 1, false, w, g));
    k_layernorm_forward(net->lnf, net->lnf_mean, net->lnf_rstd, last, w[0], w[1], N, C);
    TRY(src->finish(src->ctx, L + 1, false));

    /* the tied head: its forward and backward while the embedding is held */
    TRY(src->acquire(src->ctx, 0, backward, w, g));
    float scale = grad_scale / (float)N;
    double sum = k_head_loss(backward ? net->dsmall : NULL, backward ? g[0] : NULL, net->logits, net->lnf, w[0],
                             targets, N, C, d->vocab, N < HEAD_CHUNK ? N : HEAD_CHUNK, scale);
    TRY(src->finish(src->ctx, 0, backward));
    *loss = sum / N;
    if (!backward)
        return STRATA_OK;

    /* backward */
    TRY(src->acquire(src->ctx, L + 1, true, w, g));
    memset(net->dres, 0, (size_t)N * C * sizeof(float));
    k_layernorm_backward(net->dres, g[0], g[1], net->dsmall, last, w[0], net->lnf_mean, net->lnf_rstd, N, C);
    TRY(src->finish(src->ctx, L + 1, true));
    for (int l = L - 1; l >= 0; l--) {
        TRY(src->acquire(src->ctx, l + 1, true, w, g));
        block_backward(net, l, w, g, l == 0 ? net->encoded : net->layer[l - 1].res3);
        TRY(src->finish(src->ctx, l + 1, true));
    }
    TRY(src->acquire(src->ctx, 0, true, w, g));
    k_embed_backward(g[0], g[1], net->dres, tokens, N, net->T, C);
    TRY(src->finish(src->ctx, 0, true));
    return STRATA_OK;
}
