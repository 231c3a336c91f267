/* The host head in vocabulary tiles (k_head_tile's three passes over the tiles) against the untiled head
 * (k_head_loss) on fresh random data: the same row losses, input gradient and embedding gradient bit for bit, for
 * tiles of one piece, of several, uneven (the last shorter), and one tile of the whole vocabulary, with row counts
 * that are and are not a multiple of the chunk; and the embeddings in the same tiles (k_embed_tile_*), repeated
 * tokens included, against k_embed_forward / k_embed_backward. The reason for the pieces: OpenBLAS's column bits depend on the
 * product's other columns, so without them a tile's logits differ from the untiled ones (gpt_kernels.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt_kernels.h"
#include "testlib.h"

static float *randn(size_t n, float sd)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = sd * t_rand_normal();
    return p;
}

/* The first index where a and b differ bitwise, or -1. */
static long first_diff(const void *a, const void *b, size_t n, size_t elem)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem))
            return (long)i;
    return -1;
}

static void check(int N, int C, int V, int chunk, const int *bounds, int tiles)
{
    float *x = randn((size_t)N * C, 1.0f), *wte = randn((size_t)V * C, 0.05f);
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    for (int n = 0; n < N; n++)
        targets[n] = (int32_t)(t_rand_u64() % (uint64_t)V);
    float scale = 0.37f;
    double *loss = malloc((size_t)N * sizeof *loss), *tloss = malloc((size_t)N * sizeof *tloss);
    float *dx = calloc((size_t)N * C, sizeof *dx), *tdx = calloc((size_t)N * C, sizeof *tdx);
    float *dwte = randn((size_t)V * C, 0.01f), *tdwte = malloc((size_t)V * C * sizeof *tdwte);
    memcpy(tdwte, dwte, (size_t)V * C * sizeof *tdwte); /* the head adds into what is there */
    float *logits = malloc((size_t)chunk * V * sizeof *logits);
    k_head_loss(NULL, dx, dwte, logits, loss, x, wte, targets, N, C, V, chunk, scale);

    gpt_head_rows st = {malloc((size_t)N * sizeof(float)), malloc((size_t)N * sizeof(double)),
                        malloc((size_t)N * sizeof(float))};
    for (int n = 0; n < N; n++) /* the first tile's passes start the state: what is there must not matter */
        st.max[n] = 1e30f, st.sum[n] = 1e300;
    for (int pass = GPT_HEAD_MAX; pass <= GPT_HEAD_GRAD; pass++)
        for (int t = 0; t < tiles; t++) {
            int v0 = bounds[t], v1 = bounds[t + 1];
            /* the tile's own copies, as a fetch gives them: nothing reads past its rows */
            float *tw = malloc((size_t)(v1 - v0) * C * sizeof *tw), *tg = malloc((size_t)(v1 - v0) * C * sizeof *tg);
            memcpy(tw, wte + (size_t)v0 * C, (size_t)(v1 - v0) * C * sizeof *tw);
            memcpy(tg, tdwte + (size_t)v0 * C, (size_t)(v1 - v0) * C * sizeof *tg);
            k_head_tile(NULL, (gpt_head_pass)pass, &st, tdx, tg, logits, x, tw, targets, N, C, v0, v1, chunk, scale);
            memcpy(tdwte + (size_t)v0 * C, tg, (size_t)(v1 - v0) * C * sizeof *tg);
            free(tw), free(tg);
        }
    k_head_rows_loss(&st, tloss, N);

    long d;
    d = first_diff(tloss, loss, (size_t)N, sizeof *loss);
    T_CHECK(d < 0, "N %d C %d V %d in %d tiles: row loss %ld: tiled %.17g, untiled %.17g", N, C, V, tiles, d,
            d < 0 ? 0 : tloss[d], d < 0 ? 0 : loss[d]);
    d = first_diff(tdx, dx, (size_t)N * C, sizeof *dx);
    T_CHECK(d < 0, "N %d C %d V %d in %d tiles: dx[%ld]: tiled %.9g, untiled %.9g", N, C, V, tiles, d,
            d < 0 ? 0 : tdx[d], d < 0 ? 0 : dx[d]);
    d = first_diff(tdwte, dwte, (size_t)V * C, sizeof *dwte);
    T_CHECK(d < 0, "N %d C %d V %d in %d tiles: dwte[%ld]: tiled %.9g, untiled %.9g", N, C, V, tiles, d,
            d < 0 ? 0 : tdwte[d], d < 0 ? 0 : dwte[d]);
    free(st.max), free(st.sum), free(st.target);
    free(x), free(wte), free(targets), free(loss), free(tloss), free(dx), free(tdx), free(dwte), free(tdwte);
    free(logits);
}

/* The embeddings in the same tiles against k_embed_forward / k_embed_backward. */
static void check_embed(int N, int T, int C, int V, const int *bounds, int tiles)
{
    float *wte = randn((size_t)V * C, 0.05f), *wpe = randn((size_t)T * C, 0.05f), *dout = randn((size_t)N * C, 1.0f);
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int n = 0; n < N; n++) /* repeated tokens collide in dwte's rows */
        tok[n] = (int32_t)(t_rand_u64() % (uint64_t)(n % 3 ? V : 7));
    float *out = malloc((size_t)N * C * sizeof *out), *tout = malloc((size_t)N * C * sizeof *tout);
    float *dwte = randn((size_t)V * C, 0.01f), *tdwte = malloc((size_t)V * C * sizeof *tdwte);
    float *dwpe = calloc((size_t)T * C, sizeof *dwpe), *tdwpe = calloc((size_t)T * C, sizeof *tdwpe);
    memcpy(tdwte, dwte, (size_t)V * C * sizeof *tdwte);
    k_embed_forward(NULL, out, tok, wte, wpe, N, T, C);
    k_embed_backward(NULL, dwte, dwpe, dout, tok, N, T, C);
    for (int t = 0; t < tiles; t++) {
        int v0 = bounds[t], v1 = bounds[t + 1];
        k_embed_tile_forward(NULL, tout, tok, wte + (size_t)v0 * C, wpe, N, T, C, v0, v1);
        k_embed_tile_backward(NULL, tdwte + (size_t)v0 * C, dout, tok, N, C, v0, v1);
    }
    k_embed_backward(NULL, NULL, tdwpe, dout, tok, N, T, C);
    long d = first_diff(tout, out, (size_t)N * C, sizeof *out);
    T_CHECK(d < 0, "embeddings in %d tiles: out[%ld]: tiled %.9g, untiled %.9g", tiles, d, d < 0 ? 0 : tout[d],
            d < 0 ? 0 : out[d]);
    d = first_diff(tdwte, dwte, (size_t)V * C, sizeof *dwte);
    T_CHECK(d < 0, "embeddings in %d tiles: dwte[%ld]: tiled %.9g, untiled %.9g", tiles, d, d < 0 ? 0 : tdwte[d],
            d < 0 ? 0 : dwte[d]);
    d = first_diff(tdwpe, dwpe, (size_t)T * C, sizeof *dwpe);
    T_CHECK(d < 0, "embeddings in %d tiles: dwpe[%ld]: tiled %.9g, untiled %.9g", tiles, d, d < 0 ? 0 : tdwpe[d],
            d < 0 ? 0 : dwpe[d]);
    free(wte), free(wpe), free(dout), free(tok), free(out), free(tout), free(dwte), free(tdwte), free(dwpe);
    free(tdwpe);
}

int main(void)
{
    const int P = GPT_HEAD_PIECE;
    int V = 3 * P + 517;
    int pieces[] = {0, P, 2 * P, 3 * P, V};
    int pairs[] = {0, 2 * P, V};
    int uneven[] = {0, P, 3 * P, V};
    int whole[] = {0, V};
    check(300, 64, V, 256, pieces, 4);
    check(300, 64, V, 256, pairs, 2);
    check(256, 96, V, 128, uneven, 3);
    check(77, 32, V, 256, whole, 1);
    int small = P / 2 + 3, one[] = {0, small};
    check(40, 48, small, 16, one, 1);
    check_embed(300, 50, 64, V, pieces, 4);
    check_embed(128, 64, 32, V, uneven, 3);
    return t_done();
}
