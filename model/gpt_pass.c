/* Passes of micro-batches through the GPT network (see gpt_pass.h): the walk over the modules that a step makes,
 * for one micro-batch (the ordinary schedule) or for several at once (the layer-wise one). */
#include "model/gpt_pass.h"

#include <stdlib.h>

/* The pieces of a pass's block start on 4 KiB boundaries, so every net's activations are aligned as a lone net's
 * are: the kernels (cuBLAS chooses its algorithms by alignment too) then compute the same bits for each. */
#define PIECE_ALIGN ((size_t)4096)

struct gpt_pass {
    int count;
    gpt_net **nets;      /* one per micro-batch */
    float **head_grads;  /* [j], j >= 1: micro-batch j's head gradient (vocab x hidden), kept for the embeddings */
    const gpt_ops *ops;
};

#define TRY(call)                        \
    do {                                 \
        strata_status st_ = (call);      \
        if (st_ != STRATA_OK)            \
            return st_;                  \
    } while (0)

static size_t piece(size_t bytes)
{
    return (bytes + PIECE_ALIGN - 1) & ~(PIECE_ALIGN - 1);
}

static size_t head_grad_numel(const gpt_dims *d)
{
    return (size_t)d->vocab * (size_t)d->hidden;
}

gpt_pass_size gpt_pass_bytes(const gpt_dims *d, int batch, int seq, int count, gpt_act_mode mode, gpt_act_format fmt)
{
    gpt_pass_size s;
    s.per_micro_batch = piece(gpt_activation_bytes(d, batch, seq, mode, fmt));
    s.head_grad = piece(head_grad_numel(d) * sizeof(float));
    s.total = count < 1 ? 0 : (size_t)count * s.per_micro_batch + (size_t)(count - 1) * s.head_grad;
    return s;
}

strata_status gpt_pass_create(const gpt_dims *d, int batch, int seq, int count, gpt_act_mode mode,
                              const gpt_keeper *keeper, const gpt_ops *ops, void *mem, size_t mem_bytes,
                              gpt_pass **out)
{
    *out = NULL;
    if (count < 1 || !mem || (count > 1 && d->head_rows)) /* the kept head gradients would be wte whole */
        return STRATA_EINVAL;
    gpt_pass_size size = gpt_pass_bytes(d, batch, seq, count, mode, ops->acts);
    if (mem_bytes < size.total)
        return STRATA_EINVAL;
    gpt_pass *p = calloc(1, sizeof *p);
    if (!p)
        return STRATA_ENOMEM;
    p->ops = ops;
    p->nets = calloc((size_t)count, sizeof *p->nets);
    p->head_grads = calloc((size_t)count, sizeof *p->head_grads);
    if (!p->nets || !p->head_grads) {
        gpt_pass_destroy(p);
        return STRATA_ENOMEM;
    }
    char *at = mem;
    for (; p->count < count; p->count++, at += size.per_micro_batch) {
        strata_status st = gpt_net_create(d, batch, seq, mode, keeper, ops, at, size.per_micro_batch,
                                          &p->nets[p->count]);
        if (st != STRATA_OK) {
            gpt_pass_destroy(p);
            return st;
        }
    }
    for (int j = 1; j < count; j++, at += size.head_grad)
        p->head_grads[j] = (float *)at;
    *out = p;
    return STRATA_OK;
}

void gpt_pass_destroy(gpt_pass *p)
{
    if (!p)
        return;
    for (int j = 0; j < p->count; j++)
        gpt_net_destroy(p->nets[j]);
    free(p->nets);
    free(p->head_grads);
    free(p);
}

/* The source's module of the token embedding's tile t (gpt_source). */
static int tile_module(const gpt_dims *d, int t)
{
    return d->layers + 2 + t;
}

/* The embeddings' token tiles, each fetched, used and released in turn: forward inside module 0's acquisition (wpe
 * held), backward after it finishes (each tile's share of the embeddings' gradient, after dwpe). */
static strata_status embed_tiles(gpt_net *net, const gpt_source *src, bool backward, void **w, float **g)
{
    const gpt_dims *d = gpt_net_dims(net);
    for (int t = 0; t < gpt_head_tiles(d); t++) {
        TRY(src->acquire(src->ctx, tile_module(d, t), backward, w, g));
        gpt_net_embed_tile(net, t, backward, w, g);
        TRY(src->finish(src->ctx, tile_module(d, t), backward));
    }
    return STRATA_OK;
}

static strata_status forward(gpt_pass *p, int count, const gpt_source *src, int module, void **w, float **g)
{
    TRY(src->acquire(src->ctx, module, false, w, g));
    for (int j = 0; j < count; j++)
        TRY(gpt_net_forward(p->nets[j], module, w));
    if (module == 0 && gpt_net_dims(p->nets[0])->head_rows)
        TRY(embed_tiles(p->nets[0], src, false, w, g)); /* a pass of one micro-batch (gpt_pass_create) */
    return src->finish(src->ctx, module, false);
}

/* The head over the token embedding's tiles: every tile once per pass (gpt_head_pass), the last pass only with
 * backward, in which each tile's gradient is handed over when its acquisition finishes. */
static strata_status head_tiles(gpt_net *net, const gpt_source *src, bool backward, float grad_scale, void **w,
                                float **g)
{
    const gpt_dims *d = gpt_net_dims(net);
    for (int pass = GPT_HEAD_MAX; pass <= (backward ? GPT_HEAD_GRAD : GPT_HEAD_SUM); pass++)
        for (int t = 0; t < gpt_head_tiles(d); t++) {
            bool grad = pass == GPT_HEAD_GRAD;
            TRY(src->acquire(src->ctx, tile_module(d, t), grad, w, g));
            gpt_net_head_tile(net, t, (gpt_head_pass)pass, w, grad ? g[GPT_WTE] : NULL, grad_scale);
            TRY(src->finish(src->ctx, tile_module(d, t), grad));
        }
    gpt_net_head_end(net);
    return STRATA_OK;
}

/* The head of every micro-batch while the embeddings are held. Micro-batch 0's gradient goes into the source's
 * buffer and is handed over when this acquisition finishes, as in the ordinary schedule. The others wait in
 * head_grads: handed over now, they would reach the embeddings' gradient store before micro-batch 0's embedding
 * gradient, and the fp32 sums would be grouped differently from the ordinary schedule's. */
static strata_status head(gpt_pass *p, int count, const gpt_source *src, bool backward, float grad_scale, void **w,
                          float **g)
{
    if (gpt_net_dims(p->nets[0])->head_rows)
        return head_tiles(p->nets[0], src, backward, grad_scale, w, g);
    TRY(src->acquire(src->ctx, 0, backward, w, g));
    const gpt_dims *d = gpt_net_dims(p->nets[0]);
    for (int j = 0; j < count; j++) {
        float *dwte = !backward ? NULL : j == 0 ? g[GPT_WTE] : p->head_grads[j];
        if (backward && j > 0)
            p->ops->zero(p->ops->ctx, dwte, head_grad_numel(d) * sizeof(float)); /* the head adds into it */
        gpt_net_head(p->nets[j], w, dwte, grad_scale);
    }
    return src->finish(src->ctx, 0, backward);
}

/* A module's backward for every micro-batch; each micro-batch's gradients are handed over before the next one adds
 * its own. For the embeddings, micro-batch j > 0 first hands over its kept head gradient, where the ordinary
 * schedule's head of micro-batch j would have. */
static strata_status backward(gpt_pass *p, int count, const gpt_source *src, int module, void **w, float **g)
{
    TRY(src->acquire(src->ctx, module, true, w, g));
    const gpt_dims *d = gpt_net_dims(p->nets[0]);
    for (int j = 0; j < count; j++) {
        if (j > 0)
            TRY(src->hand_over(src->ctx, module, g));
        if (j > 0 && module == 0) {
            /* The fresh buffer is zero, and 0 + x is x for every x the head can write (never -0: it added into
             * zero too), so the source receives the very bits the ordinary schedule's head handed over. */
            p->ops->add_f32(p->ops->ctx, g[GPT_WTE], g[GPT_WTE], p->head_grads[j], head_grad_numel(d));
            TRY(src->hand_over(src->ctx, module, g));
        }
        TRY(gpt_net_backward(p->nets[j], module, w, g));
    }
    TRY(src->finish(src->ctx, module, true));
    if (module == 0 && gpt_net_dims(p->nets[0])->head_rows)
        TRY(embed_tiles(p->nets[0], src, true, w, g));
    return STRATA_OK;
}

strata_status gpt_pass_step(gpt_pass *p, int count, const gpt_source *src, const int32_t *tokens,
                            const int32_t *targets, bool backward_too, float grad_scale, double *losses)
{
    if (count < 1 || count > p->count)
        return STRATA_EINVAL;
    int L = gpt_net_dims(p->nets[0])->layers;
    size_t N = gpt_net_tokens(p->nets[0]);
    void *w[GPT_MAX_MODULE_PARAMS];
    float *g[GPT_MAX_MODULE_PARAMS];
    for (int j = 0; j < count; j++)
        TRY(gpt_net_load(p->nets[j], tokens + (size_t)j * N, targets + (size_t)j * N, backward_too));
    for (int m = 0; m <= L + 1; m++)
        TRY(forward(p, count, src, m, w, g));
    TRY(head(p, count, src, backward_too, grad_scale, w, g));
    for (int m = L + 1; backward_too && m >= 0; m--)
        TRY(backward(p, count, src, m, w, g));
    for (int j = 0; j < count; j++)
        TRY(gpt_net_loss(p->nets[j], &losses[j]));
    return STRATA_OK;
}

strata_status gpt_net_step(gpt_net *net, const gpt_source *src, const int32_t *tokens, const int32_t *targets,
                           bool backward_too, float grad_scale, double *loss)
{
    /* A pass of one micro-batch keeps no head gradient and needs no kernels of its own. */
    gpt_pass one = {.count = 1, .nets = &net};
    return gpt_pass_step(&one, 1, src, tokens, targets, backward_too, grad_scale, loss);
}
