/* The GPT network of one micro-batch: carves its activations out of the caller's block and runs each module's
 * forward and backward with the parameters a schedule (gpt_pass.c) hands it (see gpt.h).
 *
 * What a block keeps for backward (gpt_act_mode): with GPT_ACT_KEEP every block has its own internals (layer[l]);
 * with checkpointing the blocks share one set (work) that backward refills by running the block's forward again
 * from its input, which is all a block keeps: in[l], the previous block's output. With GPT_ACT_OFFLOAD the inputs
 * go to the keeper (strata_act_push) and the net holds only two, used in turn: block l reads io[l % 2] and writes
 * io[(l + 1) % 2]; backward gets each back from the keeper. The same kernels on the same inputs compute the same
 * bits, so the gradients are those of GPT_ACT_KEEP exactly. */
#include <stdlib.h>
#include <string.h>

#include "model/gpt.h"

/* Rows of the head computed at once: bounds the logits buffer to HEAD_CHUNK x vocab. */
#define HEAD_CHUNK 256

/* Activations (void *) are in the table's format; statistics and attention state are fp32. */
typedef struct layer_acts {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3;
    float *ln1_mean, *ln1_rstd, *att, *ln2_mean, *ln2_rstd;
} layer_acts;

struct gpt_net {
    gpt_dims d;
    int B, T;
    gpt_act_mode mode;
    const gpt_keeper *keeper;   /* GPT_ACT_OFFLOAD: where the block inputs go */
    bool backward_follows;      /* this micro-batch's forward keeps what backward needs (gpt_net_load) */
    uint64_t *kept;             /* GPT_ACT_OFFLOAD: the keeper's handle of each block's input */
    const gpt_ops *ops;
    int32_t *tokens, *targets; /* the micro-batch, uploaded next to the activations */
    double *row_loss, *host_row_loss; /* double: the finite-difference check differences losses */
    void *encoded, *lnf, *logits;
    float *lnf_mean, *lnf_rstd;
    gpt_head_rows head_rows;    /* with the token embedding in tiles: what the head's passes carry from tile to tile */
    void *dres, *dsmall, *dbig; /* backward scratch */
    float *datt;
    layer_acts *layer;          /* GPT_ACT_KEEP: one per block */
    layer_acts work;            /* checkpointing: the one block's internals being computed */
    void **in;                  /* checkpointing: each block's input (layers + 1: the last is the final LN's) */
    void *io[2];                /* GPT_ACT_OFFLOAD: the two block inputs on the device */
};

typedef struct carver {
    char *base;
    size_t used;
    size_t act; /* bytes of one activation element */
} carver;

static void *carve_bytes(carver *c, size_t bytes)
{
    bytes = (bytes + 63) & ~(size_t)63; /* 64-byte aligned pieces */
    void *p = c->base ? c->base + c->used : NULL;
    c->used += bytes;
    return p;
}

/* n fp32 values (statistics, attention state; int32 tokens are float-sized). */
static float *carve(carver *c, size_t n)
{
    return carve_bytes(c, n * sizeof(float));
}

/* n activations in the table's format. */
static void *carve_act(carver *c, size_t n)
{
    return carve_bytes(c, n * c->act);
}

/* One block's internals; with_output: its own res3 (GPT_ACT_KEEP), else the block writes the next one's input. */
static layer_acts carve_layer(carver *c, size_t B, size_t T, size_t C, size_t att_state, bool with_output)
{
    size_t N = B * T;
    layer_acts a;
    a.ln1 = carve_act(c, N * C);
    a.ln1_mean = carve(c, N);
    a.ln1_rstd = carve(c, N);
    a.qkv = carve_act(c, N * 3 * C);
    a.atty = carve_act(c, N * C);
    a.att = carve(c, att_state);
    a.res2 = carve_act(c, N * C);
    a.ln2 = carve_act(c, N * C);
    a.ln2_mean = carve(c, N);
    a.ln2_rstd = carve(c, N);
    a.fch = carve_act(c, N * 4 * C);
    a.fch_gelu = carve_act(c, N * 4 * C);
    a.res3 = with_output ? carve_act(c, N * C) : NULL;
    return a;
}

/* One layout function for both sizing (base NULL) and carving, so they cannot disagree. */
static size_t layout(const gpt_dims *d, int B, int T, gpt_act_mode mode, gpt_act_format fmt, void *mem, gpt_net *net)
{
    carver c = {mem, 0, gpt_act_bytes(fmt)};
    size_t N = (size_t)B * T, C = (size_t)d->hidden, NH = (size_t)d->heads;
    size_t chunk = N < HEAD_CHUNK ? N : HEAD_CHUNK;
    size_t att_state = (size_t)B * NH * (size_t)T * gpt_attention_state_floats(fmt, (size_t)T);
    int L = d->layers;
    int32_t *tokens = (int32_t *)carve(&c, N), *targets = (int32_t *)carve(&c, N); /* int32 is float-sized */
    double *row_loss = (double *)carve(&c, 2 * N); /* 64-byte aligned pieces: fine for doubles */
    if (net)
        net->tokens = tokens, net->targets = targets, net->row_loss = row_loss;
    if (mode == GPT_ACT_OFFLOAD) {
        void *a = carve_act(&c, N * C), *b = carve_act(&c, N * C);
        if (net) {
            net->io[0] = a, net->io[1] = b;
            for (int l = 0; l <= L; l++)
                net->in[l] = net->io[l % 2];
        }
    } else {
        void *p = carve_act(&c, N * C);
        if (net)
            net->encoded = p;
    }
    if (mode == GPT_ACT_KEEP) {
        for (int l = 0; l < L; l++) {
            layer_acts a = carve_layer(&c, (size_t)B, (size_t)T, C, att_state, true);
            if (net)
                net->layer[l] = a;
        }
    } else {
        layer_acts a = carve_layer(&c, (size_t)B, (size_t)T, C, att_state, false);
        if (net)
            net->work = a;
        for (int l = 1; mode == GPT_ACT_CHECKPOINT && l <= L; l++) {
            void *p = carve_act(&c, N * C);
            if (net)
                net->in[l] = p;
        }
        if (net && mode == GPT_ACT_CHECKPOINT)
            net->in[0] = net->encoded;
        if (net && mode == GPT_ACT_OFFLOAD)
            net->encoded = net->in[0];
    }
    size_t logits_width = d->head_rows ? (size_t)d->head_rows : (size_t)gpt_logits_ld(fmt, d->vocab);
    void *lnf = carve_act(&c, N * C), *logits = carve_act(&c, chunk * logits_width);
    float *mean = carve(&c, N), *rstd = carve(&c, N);
    if (d->head_rows) {
        float *max = carve(&c, N), *target = carve(&c, N);
        double *sum = (double *)carve(&c, 2 * N);
        if (net)
            net->head_rows = (gpt_head_rows){max, sum, target};
    }
    void *dres = carve_act(&c, N * C), *dsmall = carve_act(&c, N * C), *dbig = carve_act(&c, N * 4 * C);
    float *datt = carve(&c, att_state);
    if (net) {
        net->lnf = lnf, net->lnf_mean = mean, net->lnf_rstd = rstd, net->logits = logits;
        net->dres = dres, net->dsmall = dsmall, net->dbig = dbig, net->datt = datt;
    }
    return c.used;
}

size_t gpt_activation_bytes(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, gpt_act_format fmt)
{
    return layout(d, batch, seq, mode, fmt, NULL, NULL);
}

size_t gpt_block_input_bytes(const gpt_dims *d, int batch, int seq, gpt_act_format fmt)
{
    return (size_t)batch * (size_t)seq * (size_t)d->hidden * gpt_act_bytes(fmt);
}

strata_status gpt_net_create(const gpt_dims *d, int batch, int seq, gpt_act_mode mode, const gpt_keeper *keeper,
                             const gpt_ops *ops, void *mem, size_t mem_bytes, gpt_net **out)
{
    *out = NULL;
    if (batch < 1 || seq < 1 || seq > d->seq || gpt_dims_check(d) || !ops || !mem ||
        (d->head_rows && !ops->head_tile) ||
        (mode != GPT_ACT_KEEP && mode != GPT_ACT_CHECKPOINT && mode != GPT_ACT_OFFLOAD) ||
        (mode == GPT_ACT_OFFLOAD) != (keeper != NULL) ||
        mem_bytes < gpt_activation_bytes(d, batch, seq, mode, ops->acts))
        return STRATA_EINVAL;
    gpt_net *net = calloc(1, sizeof *net);
    if (!net)
        return STRATA_ENOMEM;
    net->layer = calloc((size_t)d->layers, sizeof *net->layer);
    net->in = calloc((size_t)d->layers + 1, sizeof *net->in);
    net->kept = calloc((size_t)d->layers, sizeof *net->kept);
    net->host_row_loss = malloc((size_t)batch * seq * sizeof(double));
    if (!net->layer || !net->in || !net->kept || !net->host_row_loss) {
        gpt_net_destroy(net);
        return STRATA_ENOMEM;
    }
    net->ops = ops;
    net->d = *d;
    net->B = batch;
    net->T = seq;
    net->mode = mode;
    net->keeper = keeper;
    layout(d, batch, seq, mode, ops->acts, mem, net);
    *out = net;
    return STRATA_OK;
}

void gpt_net_destroy(gpt_net *net)
{
    if (!net)
        return;
    free(net->layer);
    free(net->in);
    free(net->kept);
    free(net->host_row_loss);
    free(net);
}

const gpt_dims *gpt_net_dims(const gpt_net *net)
{
    return &net->d;
}

size_t gpt_net_tokens(const gpt_net *net)
{
    return (size_t)net->B * (size_t)net->T;
}

/* Block l's internals: its own (GPT_ACT_KEEP) or the shared ones (checkpointing). */
static layer_acts *acts_of(gpt_net *net, int l)
{
    return net->mode == GPT_ACT_KEEP ? &net->layer[l] : &net->work;
}

/* The input of block l (0-based) and of the final LayerNorm (l = layers), as forward left it. */
static void *block_input(const gpt_net *net, int l)
{
    if (net->mode != GPT_ACT_KEEP)
        return net->in[l];
    return l == 0 ? net->encoded : net->layer[l - 1].res3;
}

/* Block l's forward. with_output false: only what its backward reads (a recompute under checkpointing), without
 * the MLP's output product and the residual that make the next block's input: a third of its matrix products. */
static void block_forward(gpt_net *net, int l, void **w, const void *inp, bool with_output)
{
    const gpt_ops *o = net->ops;
    void *x = o->ctx;
    int N = net->B * net->T, C = net->d.hidden;
    layer_acts *a = acts_of(net, l);
    void *out = net->mode == GPT_ACT_KEEP ? a->res3 : net->in[l + 1];
    o->layernorm_forward(x, a->ln1, a->ln1_mean, a->ln1_rstd, inp, w[GPT_LN1_W], w[GPT_LN1_B], N, C);
    o->linear_forward(x, a->qkv, a->ln1, w[GPT_QKV_W], w[GPT_QKV_B], N, C, 3 * C);
    o->attention_forward(x, a->atty, a->att, a->qkv, net->B, net->T, C, net->d.heads);
    o->linear_forward(x, net->dsmall, a->atty, w[GPT_PROJ_W], w[GPT_PROJ_B], N, C, C);
    o->residual_forward(x, a->res2, inp, net->dsmall, (size_t)N * C);
    o->layernorm_forward(x, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[GPT_LN2_W], w[GPT_LN2_B], N, C);
    o->linear_forward(x, a->fch, a->ln2, w[GPT_FC_W], w[GPT_FC_B], N, C, 4 * C);
    o->gelu_forward(x, a->fch_gelu, a->fch, (size_t)N * 4 * C);
    if (!with_output)
        return;
    o->linear_forward(x, net->dsmall, a->fch_gelu, w[GPT_FCPROJ_W], w[GPT_FCPROJ_B], N, 4 * C, C);
    o->residual_forward(x, out, a->res2, net->dsmall, (size_t)N * C);
}

/* dres holds the gradient of the block's output on entry and of its input on return. */
static void block_backward(gpt_net *net, int l, void **w, float **g, const void *inp)
{
    const gpt_ops *o = net->ops;
    void *x = o->ctx;
    int N = net->B * net->T, C = net->d.hidden;
    layer_acts *a = acts_of(net, l);
    void *dres = net->dres, *dbig = net->dbig, *dsmall = net->dsmall;
    size_t n4 = (size_t)N * 4 * C, act = gpt_act_bytes(o->acts);
    /* MLP: res3 = res2 + proj(gelu(fc(ln2(res2)))) */
    o->zero(x, dbig, n4 * act);
    o->linear_backward(x, dbig, g[GPT_FCPROJ_W], g[GPT_FCPROJ_B], dres, a->fch_gelu, w[GPT_FCPROJ_W], N, 4 * C, C);
    o->gelu_backward(x, dbig, a->fch, n4);
    o->zero(x, dsmall, (size_t)N * C * act);
    o->linear_backward(x, dsmall, g[GPT_FC_W], g[GPT_FC_B], dbig, a->ln2, w[GPT_FC_W], N, C, 4 * C);
    o->layernorm_backward(x, dres, g[GPT_LN2_W], g[GPT_LN2_B], dsmall, a->res2, w[GPT_LN2_W], a->ln2_mean, a->ln2_rstd,
                          N, C);
    /* Attention: res2 = inp + proj(attn(qkv(ln1(inp)))) */
    o->zero(x, dsmall, (size_t)N * C * act);
    o->linear_backward(x, dsmall, g[GPT_PROJ_W], g[GPT_PROJ_B], dres, a->atty, w[GPT_PROJ_W], N, C, C);
    o->attention_backward(x, dbig, net->datt, dsmall, a->qkv, a->atty, a->att, net->B, net->T, C, net->d.heads);
    o->zero(x, dsmall, (size_t)N * C * act);
    o->linear_backward(x, dsmall, g[GPT_QKV_W], g[GPT_QKV_B], dbig, a->ln1, w[GPT_QKV_W], N, C, 3 * C);
    o->layernorm_backward(x, dres, g[GPT_LN1_W], g[GPT_LN1_B], dsmall, inp, w[GPT_LN1_W], a->ln1_mean, a->ln1_rstd, N,
                          C);
}

/* Waits for the queued work (its failures come back here) and sums the row losses in row order, so the loss is the
 * same for any thread count and on every backend's table. Once per micro-batch: the only wait in a step. */
strata_status gpt_net_loss(gpt_net *net, double *loss)
{
    int N = net->B * net->T;
    strata_status st = net->ops->to_host(net->ops->ctx, net->host_row_loss, net->row_loss, (size_t)N * sizeof(double));
    if (st != STRATA_OK)
        return st;
    double sum = 0;
    for (int n = 0; n < N; n++)
        sum += net->host_row_loss[n];
    *loss = sum / N;
    return STRATA_OK;
}

strata_status gpt_net_load(gpt_net *net, const int32_t *tokens, const int32_t *targets, bool backward)
{
    net->backward_follows = backward;
    const gpt_ops *o = net->ops;
    int N = net->B * net->T, V = net->d.vocab;
    for (int t = 0; t < N; t++)
        if (tokens[t] < 0 || tokens[t] >= V || targets[t] < 0 || targets[t] >= V)
            return STRATA_EINVAL;
    o->upload(o->ctx, net->tokens, tokens, (size_t)N * sizeof *tokens);
    o->upload(o->ctx, net->targets, targets, (size_t)N * sizeof *targets);
    return STRATA_OK;
}

strata_status gpt_net_forward(gpt_net *net, int module, void **w)
{
    const gpt_ops *o = net->ops;
    int L = net->d.layers, N = net->B * net->T, C = net->d.hidden;
    if (module == 0) {
        if (!net->d.head_rows) /* else the tiles write it (gpt_net_embed_tile) */
            o->embed_forward(o->ctx, net->encoded, net->tokens, w[GPT_WTE], w[GPT_WPE], N, net->T, C);
    } else if (module <= L) {
        int l = module - 1;
        if (net->mode == GPT_ACT_OFFLOAD && net->backward_follows) {
            const gpt_keeper *k = net->keeper;
            strata_status st =
                k->push(k->ctx, net->in[l], gpt_block_input_bytes(&net->d, net->B, net->T, o->acts), &net->kept[l]);
            if (st != STRATA_OK)
                return st;
        }
        block_forward(net, l, w, block_input(net, l), true);
    } else {
        o->layernorm_forward(o->ctx, net->lnf, net->lnf_mean, net->lnf_rstd, block_input(net, L), w[GPT_LNF_W],
                             w[GPT_LNF_B], N, C);
    }
    return STRATA_OK;
}

/* Block l's backward under checkpointing: its input (from the keeper with GPT_ACT_OFFLOAD), its forward again into
 * the shared internals (all but the output, which backward does not read), then its backward. */
static strata_status checkpointed_backward(gpt_net *net, int l, void **w, float **g)
{
    const gpt_keeper *k = net->keeper;
    const void *inp = net->in[l];
    if (net->mode == GPT_ACT_OFFLOAD) {
        strata_status st = k->pop(k->ctx, net->kept[l], &inp);
        if (st != STRATA_OK)
            return st;
    }
    block_forward(net, l, w, inp, false);
    block_backward(net, l, w, g, inp);
    return net->mode == GPT_ACT_OFFLOAD ? k->drop(k->ctx, net->kept[l]) : STRATA_OK;
}

void gpt_net_head(gpt_net *net, void **w, float *dwte, float grad_scale)
{
    const gpt_ops *o = net->ops;
    int N = net->B * net->T;
    /* dsmall carries the head's input gradient to the final LayerNorm's backward. */
    o->head_loss(o->ctx, dwte ? net->dsmall : NULL, dwte, net->logits, net->row_loss, net->lnf, w[GPT_WTE],
                 net->targets, N, net->d.hidden, net->d.vocab, N < HEAD_CHUNK ? N : HEAD_CHUNK, grad_scale / (float)N);
}

strata_status gpt_net_backward(gpt_net *net, int module, void **w, float **g)
{
    const gpt_ops *o = net->ops;
    int L = net->d.layers, N = net->B * net->T, C = net->d.hidden;
    if (module == L + 1) {
        o->zero(o->ctx, net->dres, (size_t)N * C * gpt_act_bytes(o->acts));
        o->layernorm_backward(o->ctx, net->dres, g[GPT_LNF_W], g[GPT_LNF_B], net->dsmall, block_input(net, L),
                              w[GPT_LNF_W], net->lnf_mean, net->lnf_rstd, N, C);
    } else if (module >= 1 && net->mode != GPT_ACT_KEEP) {
        return checkpointed_backward(net, module - 1, w, g);
    } else if (module >= 1) {
        block_backward(net, module - 1, w, g, block_input(net, module - 1));
    } else {
        /* In tiles, dwte is the tiles' (gpt_net_embed_tile) and module 0 has no gradient buffer for it. */
        o->embed_backward(o->ctx, net->d.head_rows ? NULL : g[GPT_WTE], g[GPT_WPE], net->dres, net->tokens, N, net->T,
                          C);
    }
    return STRATA_OK;
}

void gpt_net_embed_tile(gpt_net *net, int tile, bool backward, void **w, float **g)
{
    const gpt_ops *o = net->ops;
    int N = net->B * net->T, C = net->d.hidden, v0, v1;
    gpt_head_tile_rows(&net->d, tile, &v0, &v1);
    if (backward)
        o->embed_tile_backward(o->ctx, g[GPT_WTE], net->dres, net->tokens, N, C, v0, v1);
    else
        o->embed_tile_forward(o->ctx, net->encoded, net->tokens, w[GPT_WTE], w[GPT_WPE], N, net->T, C, v0, v1);
}

void gpt_net_head_tile(gpt_net *net, int tile, gpt_head_pass pass, void **w, float *dwte, float grad_scale)
{
    const gpt_ops *o = net->ops;
    int N = net->B * net->T, v0, v1;
    gpt_head_tile_rows(&net->d, tile, &v0, &v1);
    o->head_tile(o->ctx, pass, &net->head_rows, net->dsmall, dwte, net->logits, net->lnf, w[GPT_WTE], net->targets, N,
                 net->d.hidden, v0, v1, N < HEAD_CHUNK ? N : HEAD_CHUNK, grad_scale / (float)N);
}

void gpt_net_head_end(gpt_net *net)
{
    const gpt_ops *o = net->ops;
    o->head_rows_loss(o->ctx, &net->head_rows, net->row_loss, net->B * net->T);
}
