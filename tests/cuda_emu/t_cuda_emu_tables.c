/*
 * The CUDA model's kernel tables on the CPU: the bf16 table (model/cuda/gpt_ops_cuda_bf16.c, GPT_ACTS_BF16) and the
 * fp32 table (gpt_ops_cuda.c, GPT_ACTS_FP32), with cuda_ops.c and the real .cu kernels, run one micro-batch forward
 * and backward of a small GPT through the network (gpt_net) on an emulated CUDA runtime and cuBLAS / cuBLASLt
 * (tests/cuda_emu/: emu_cuda.h says what the emulation models and what not), against the host network
 * (gpt_ops_host.c) on the same weights. It exists so that every build with the CUDA toolkit checks the CUDA tables,
 * also where no GPU is lent; on a GPU, t_kcuda_* and t_model_cuda remain the authority.
 *
 * The weights are the model's initial values with normal(0, 0.05) noise on every parameter (so that LayerNorm
 * weights are not all 1 and biases not all 0), rounded to bf16 for both tables and the host; tokens and targets are
 * random (a token repeated, for the grouped embedding backward). Checks, for each run:
 *  - the loss within 1e-5 of the host's for the fp32 table, 2e-2 for the bf16 table;
 *  - every parameter tensor's gradient: cosine similarity with the host's > 0.99999 and max |diff| < 1e-3 max |ref|
 *    (fp32 table), > 0.99 and < 0.1 max |ref| (bf16 table: every activation rounded to 8 bits of mantissa);
 *  - the gradient buffers the source hands out hold 0.25 before backward (the contract says the network adds into
 *    them), so an entry that overwrites instead of adding fails;
 *  - a forward-only step gives the same loss bits as the forward of the backward step.
 * Runs: shapes that are not multiples of a warp or of a tile (layers 2, heads 3, hidden 72, vocabulary 301, which the
 * bf16 head pads to 384, 2 x 37 tokens; and layers 1, heads 3, hidden 45 (head size 15), vocabulary 257, 1 x 7 tokens,
 * with 4x query/key/value weights so that attention is peaked); both tables on each; the bf16 table on each once with
 * every parameter 2 bytes off its allocation's alignment; activation checkpointing (GPT_ACT_CHECKPOINT) in three
 * runs (main() lists them).
 * The fresh seed (printed; STRATA_TEST_SEED reproduces) also orders the emulator's blocks and threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "emu_runtime.h"
#include "model/gpt.h"
#include "testlib.h"

/* testlib's T_OK, but for strata_last_error, which lives in libstrata's engine: linking that would pull in the
 * library's CUDA backend and with it the real CUDA runtime, whose symbols the emulator defines. The model's calls
 * here fail with a status alone. */
#define CHECK_OK(call)                                                          \
do {                                                                            \
strata_status ok_s_ = (call);                                                   \
T_CHECK(ok_s_ == STRATA_OK, "%s failed: %s", #call, strata_status_name(ok_s_)); \
} while (0)

/* What the gradient buffers hold when the network gets them. */
#define GRAD_PREFILL 0.25f

enum { MAX_MODULES = 8 };

/* A gpt_source on emulated device memory: the parameters converted to the table's weight dtype (at an offset from
 * cudaMalloc's alignment), fp32 gradient buffers prefilled with GRAD_PREFILL, and what the network added into them
 * collected into one flat array in the host's layout. */
typedef struct dev_source {
    gpt_dims d;
    size_t size[MAX_MODULES][GPT_MAX_MODULE_PARAMS];
    void *param_alloc[MAX_MODULES][GPT_MAX_MODULE_PARAMS];
    void *param[MAX_MODULES][GPT_MAX_MODULE_PARAMS];
    float *grad[MAX_MODULES][GPT_MAX_MODULE_PARAMS];
    float prefill[MAX_MODULES]; /* what the module's gradient buffers held before the network added into them */
    float *grads; /* flat, the host's layout */
} dev_source;

/* Adds what the network added into module m's buffers into the flat gradients, and zeroes the buffers (as hand_over's
 * fresh buffers are). */
static void collect(dev_source *s, int m)
{
    size_t pos = 0;
    for (int i = 0; i < m; i++)
        pos += gpt_module_numel(&s->d, i);
    int np = gpt_module_param_sizes(&s->d, m, s->size[m]);
    for (int k = 0; k < np; k++) {
        float *g = s->grad[m][k];
        for (size_t i = 0; i < s->size[m][k]; i++)
            s->grads[pos + i] += g[i] - s->prefill[m];
        memset(g, 0, s->size[m][k] * sizeof(float));
        pos += s->size[m][k];
    }
    s->prefill[m] = 0;
}

static strata_status ds_acquire(void *ctx, int m, bool backward, void **params, float **grads)
{
    dev_source *s = ctx;
    int np = gpt_module_param_sizes(&s->d, m, s->size[m]);
    for (int k = 0; k < np; k++) {
        params[k] = s->param[m][k];
        if (backward) {
            for (size_t i = 0; i < s->size[m][k]; i++)
                s->grad[m][k][i] = GRAD_PREFILL;
            grads[k] = s->grad[m][k];
        }
    }
    if (backward)
        s->prefill[m] = GRAD_PREFILL;
    return STRATA_OK;
}

static strata_status ds_hand_over(void *ctx, int m, float **grads)
{
    collect(ctx, m);
    return STRATA_OK;
}

static strata_status ds_finish(void *ctx, int m, bool backward)
{
    if (backward)
        collect(ctx, m);
    return STRATA_OK;
}

static void ds_destroy(dev_source *s)
{
    for (int m = 0; m < MAX_MODULES; m++)
        for (int k = 0; k < GPT_MAX_MODULE_PARAMS; k++) {
            cudaFree(s->param_alloc[m][k]);
            cudaFree(s->grad[m][k]);
        }
    free(s->grads);
    free(s);
}

/* params (flat fp32) in weight dtype wdt, each parameter misalign bytes past a cudaMalloc'd address. */
static dev_source *ds_create(const gpt_dims *d, const float *params, strata_dtype wdt, int misalign)
{
    dev_source *s = calloc(1, sizeof *s);
    T_CHECK(s != NULL, "out of memory");
    s->d = *d;
    s->grads = calloc(gpt_numel(d), sizeof(float));
    T_CHECK(s->grads != NULL, "out of memory");
    size_t es = wdt == STRATA_DTYPE_BF16 ? 2 : 4, pos = 0;
    for (int m = 0; m < gpt_modules(d); m++) {
        int np = gpt_module_param_sizes(d, m, s->size[m]);
        for (int k = 0; k < np; k++) {
            size_t n = s->size[m][k];
            T_CHECK(cudaMalloc(&s->param_alloc[m][k], n * es + (size_t)misalign) == cudaSuccess &&
                        cudaMalloc((void **)&s->grad[m][k], n * sizeof(float)) == cudaSuccess,
                    "cudaMalloc of module %d parameter %d (%zu elements) failed", m, k, n);
            s->param[m][k] = (char *)s->param_alloc[m][k] + misalign;
            CHECK_OK(strata_convert(s->param[m][k], wdt, params + pos, STRATA_DTYPE_FP32, n));
            pos += n;
        }
    }
    return s;
}

typedef struct shape {
    const char *name;
    gpt_dims d;
    int B, T;
    float qkv_gain;
} shape;

typedef struct table_run {
    gpt_act_format acts;
    gpt_act_mode mode;
    int misalign;
} table_run;

/* A micro-batch and the host network's loss and gradients on it. */
typedef struct problem {
    const shape *sh;
    float *params; /* flat fp32, bf16-exact */
    int32_t *tok, *tgt;
    double loss;
    float *grads;
} problem;

static problem make_problem(const shape *sh)
{
    problem p = {.sh = sh};
    const gpt_dims *d = &sh->d;
    int N = sh->B * sh->T;
    gpt_flat *f = NULL;
    CHECK_OK(gpt_flat_create(d, t_rand_u64(), &f));
    size_t n = gpt_numel(d);
    for (size_t i = 0; i < n; i++)
        f->params[i] += 0.05f * t_rand_normal();
    for (int m = 1; m <= d->layers; m++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS], pos = f->module_offset[m];
        gpt_module_param_sizes(d, m, sizes);
        for (int k = 0; k < GPT_QKV_W; k++)
            pos += sizes[k];
        for (size_t i = 0; i < sizes[GPT_QKV_W]; i++)
            f->params[pos + i] *= sh->qkv_gain;
    }
    /* Every table and the host get the same, bf16-exact weights. */
    uint16_t *half = malloc(n * sizeof(uint16_t));
    T_CHECK(half != NULL, "out of memory");
    CHECK_OK(strata_convert(half, STRATA_DTYPE_BF16, f->params, STRATA_DTYPE_FP32, n));
    CHECK_OK(strata_convert(f->params, STRATA_DTYPE_FP32, half, STRATA_DTYPE_BF16, n));
    free(half);

    p.tok = malloc((size_t)N * sizeof(int32_t));
    p.tgt = malloc((size_t)N * sizeof(int32_t));
    T_CHECK(p.tok && p.tgt, "out of memory");
    for (int i = 0; i < N; i++) {
        p.tok[i] = (int32_t)t_rand_range(0, (size_t)d->vocab - 1);
        p.tgt[i] = (int32_t)t_rand_range(0, (size_t)d->vocab - 1);
    }
    p.tok[N / 2] = p.tok[0]; /* repeated tokens: the grouped embedding backward adds rows of one token */
    p.tok[N - 1] = p.tok[0];

    size_t bytes = gpt_activation_bytes(d, sh->B, sh->T, GPT_ACT_KEEP, GPT_ACTS_FP32);
    void *mem = malloc(bytes);
    T_CHECK(mem != NULL, "out of memory");
    gpt_net *net = NULL;
    CHECK_OK(gpt_net_create(d, sh->B, sh->T, GPT_ACT_KEEP, NULL, gpt_ops_host(), mem, bytes, &net));
    gpt_source src = gpt_flat_source(f);
    CHECK_OK(gpt_net_step(net, &src, p.tok, p.tgt, true, 1.0f, &p.loss));
    gpt_net_destroy(net);
    free(mem);
    p.params = malloc(n * sizeof(float));
    p.grads = malloc(n * sizeof(float));
    T_CHECK(p.params && p.grads, "out of memory");
    memcpy(p.params, f->params, n * sizeof(float));
    memcpy(p.grads, f->grads, n * sizeof(float));
    gpt_flat_destroy(f);
    return p;
}

static void free_problem(problem *p)
{
    free(p->params);
    free(p->grads);
    free(p->tok);
    free(p->tgt);
}

/* Runs the problem through one CUDA table and checks it against the host's loss and gradients. */
static void check_table(const problem *p, table_run r)
{
    const shape *sh = p->sh;
    const gpt_dims *d = &sh->d;
    bool bf16 = r.acts == GPT_ACTS_BF16;
    double loss_tol = bf16 ? 2e-2 : 1e-5, cos_min = bf16 ? 0.99 : 0.99999, rel_max = bf16 ? 0.1 : 1e-3;
    char what[128];
    snprintf(what, sizeof what, "%s, %s table, %s, params +%d bytes", sh->name, gpt_act_format_name(r.acts),
             r.mode == GPT_ACT_CHECKPOINT ? "checkpointing" : "keep", r.misalign);

    dev_source *s = ds_create(d, p->params, gpt_act_weight_dtype(r.acts), r.misalign);
    void *ws = NULL, *mem = NULL;
    size_t ws_bytes = gpt_ops_workspace_bytes(r.acts);
    size_t bytes = gpt_activation_bytes(d, sh->B, sh->T, r.mode, r.acts);
    T_CHECK((!ws_bytes || cudaMalloc(&ws, ws_bytes) == cudaSuccess) && cudaMalloc(&mem, bytes) == cudaSuccess,
            "%s: cudaMalloc of %zu + %zu bytes failed", what, ws_bytes, bytes);
    gpt_ops *ops = NULL;
    gpt_net *net = NULL;
    const char *why = "";
    strata_status st = gpt_ops_cuda_create(NULL, r.acts, bf16 ? STRATA_DTYPE_BF16 : STRATA_DTYPE_FP32, ws, &ops, &why);
    T_CHECK(st == STRATA_OK, "%s: gpt_ops_cuda_create: %s: %s", what, strata_status_name(st), why);
    if (st != STRATA_OK)
        goto out;
    CHECK_OK(gpt_net_create(d, sh->B, sh->T, r.mode, NULL, ops, mem, bytes, &net));
    if (!net)
        goto out;

    emu_counts before = emu_totals;
    gpt_source src = {.acquire = ds_acquire, .hand_over = ds_hand_over, .finish = ds_finish, .ctx = s};
    double loss = NAN, fwd_loss = NAN;
    st = gpt_net_step(net, &src, p->tok, p->tgt, true, 1.0f, &loss);
    T_CHECK(st == STRATA_OK, "%s: gpt_net_step: %s: %s", what, strata_status_name(st), ops->error(ops->ctx));
    st = gpt_net_step(net, &src, p->tok, p->tgt, false, 1.0f, &fwd_loss);
    T_CHECK(st == STRATA_OK, "%s: forward-only gpt_net_step: %s: %s", what, strata_status_name(st),
            ops->error(ops->ctx));
    T_CHECK(memcmp(&loss, &fwd_loss, sizeof loss) == 0,
            "%s: forward-only loss %.17g differs from the backward step's %.17g", what, fwd_loss, loss);
    T_CHECK(fabs(loss - p->loss) < loss_tol, "%s: loss %.9f vs host %.9f: |diff| %.3g >= %g", what, loss, p->loss,
            fabs(loss - p->loss), loss_tol);

    /* Every parameter tensor on its own: a gradient that is wrong in one small tensor (a bias, a LayerNorm weight)
     * hardly moves the cosine of the whole. */
    double worst_cos = 1, worst_rel = 0;
    const char *worst_cos_name = "", *worst_rel_name = "";
    size_t pos = 0;
    for (int m = 0; m < gpt_modules(d); m++) {
        size_t sizes[GPT_MAX_MODULE_PARAMS];
        int np = gpt_module_param_sizes(d, m, sizes);
        for (int k = 0; k < np; k++) {
            double dot = 0, na = 0, nb = 0, max_diff = 0, max_ref = 0;
            for (size_t i = 0; i < sizes[k]; i++) {
                double a = p->grads[pos + i], b = s->grads[pos + i];
                dot += a * b;
                na += a * a;
                nb += b * b;
                max_diff = isfinite(b) ? fmax(max_diff, fabs(a - b)) : INFINITY;
                max_ref = fmax(max_ref, fabs(a));
            }
            double cosine = na == 0 && nb == 0 ? 1 : dot / sqrt(na * nb), rel = max_diff / max_ref;
            const char *name = gpt_param_name(d, m, k);
            T_CHECK(cosine > cos_min, "%s: module %d %s: gradient cosine %.7f <= %g", what, m, name, cosine, cos_min);
            T_CHECK(rel < rel_max, "%s: module %d %s: gradient max |diff| %.3g = %.3g of max |host| %.3g >= %g", what,
                    m, name, max_diff, rel, max_ref, rel_max);
            if (!(cosine >= worst_cos)) {
                worst_cos = cosine;
                worst_cos_name = name;
            }
            if (!(rel <= worst_rel)) {
                worst_rel = rel;
                worst_rel_name = name;
            }
            pos += sizes[k];
        }
    }
    emu_counts after = emu_totals;
    printf("%-46s loss %.6f (host %.6f, |diff| %.1e); worst gradient cosine %.7f (%s), max |diff| %.1e of max |host| "
           "(%s); %lld launches, %lld + %lld products\n",
           what, loss, p->loss, fabs(loss - p->loss), worst_cos, worst_cos_name, worst_rel, worst_rel_name,
           after.launches - before.launches, after.gemm_calls - before.gemm_calls, after.lt_calls - before.lt_calls);
    T_CHECK(after.launches > before.launches, "%s: no kernel ran on the emulator", what);

out:
    gpt_net_destroy(net);
    gpt_ops_cuda_destroy(ops);
    cudaFree(mem);
    cudaFree(ws);
    ds_destroy(s);
}

int main(void)
{
    emu_seed(t_rand_u64());
    static const shape shapes[] = {
        {"L2 H3 C72 V301 2x37", {.layers = 2, .heads = 3, .hidden = 72, .vocab = 301, .seq = 40}, 2, 37, 1.0f},
        {"L1 H3 C45 V257 1x7, peaked", {.layers = 1, .heads = 3, .hidden = 45, .vocab = 257, .seq = 16}, 1, 7, 4.0f},
    };
    static const table_run runs[][3] = {
        {{GPT_ACTS_FP32, GPT_ACT_KEEP, 0}, {GPT_ACTS_BF16, GPT_ACT_KEEP, 0}, {GPT_ACTS_BF16, GPT_ACT_CHECKPOINT, 2}},
        {{GPT_ACTS_FP32, GPT_ACT_CHECKPOINT, 0},
         {GPT_ACTS_BF16, GPT_ACT_KEEP, 2},
         {GPT_ACTS_BF16, GPT_ACT_CHECKPOINT, 0}},
    };
    printf("CUDA tables on the emulated runtime and cuBLAS (tests/cuda_emu) vs the host network\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *sh = &shapes[i];
        T_CHECK(gpt_modules(&sh->d) <= MAX_MODULES, "%s: %d modules > %d", sh->name, gpt_modules(&sh->d), MAX_MODULES);
        if (gpt_modules(&sh->d) > MAX_MODULES)
            continue;
        problem p = make_problem(sh);
        for (size_t j = 0; j < sizeof runs[i] / sizeof runs[i][0]; j++)
            check_table(&p, runs[i][j]);
        free_problem(&p);
    }
    printf("emulator: %lld launches, %lld fiber switches, %lld cuBLAS + %lld cuBLASLt products\n", emu_totals.launches,
           emu_totals.switches, emu_totals.gemm_calls, emu_totals.lt_calls);
    return t_done();
}
