/*
 * A tensor in parts (strata_param_set_part): one [ROWS, COLS] tensor "emb.weight" split by rows into tiles, each a
 * parameter of its own module, trains bit for bit as the whole parameter "emb.weight" does (the same gradients, a
 * function of each element's value, its place in the tensor and the step); a checkpoint saved from any split holds
 * the tensor whole (model.safetensors: one "emb.weight" of shape [ROWS, COLS]) and loads into any other split, or
 * into the whole parameter, exactly (the continued training equal to the unbroken one's); strata_param_load reads a
 * part out of a file's whole tensor; and a split that does not make one tensor is refused at finalize, naming the
 * tensor and the parts.
 *
 * In a world of N ranks (mpirun -np N) the same at every ZeRO stage, and with parameters and optimizer on NVMe: the
 * tiles are modules of their own, so each is cut into N shards (a rank's shard of a tile can be all padding) and a
 * rank's pieces of the tensor continue one another only in part; the checkpoint of the tiles at N ranks loads into
 * N ranks of any split, and into one rank alone (rank 0, a world of one) whole or in tiles, exactly. The gradients
 * lie on a grid where the sums of N ranks' equal gradients are exact in any order, so a reduction cut along other
 * shards gives the same bits and the whole parameter is the tiles' oracle at every N.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>

#include "comm/comm.h"
#include "synth.h"
#include "testlib.h"
#include "world.h"

#define ROWS 37 /* tiles of uneven rows, none on the layout's alignment */
#define COLS 264 /* a tile of 5 rows is 1320 elements: more than one 4 KiB shard */
#define NUMEL ((size_t)ROWS * COLS)
#define MAX_TILES 8

static const int64_t shape[2] = {ROWS, COLS};
static float start[NUMEL + COLS]; /* the tensor's initial values, then the bias's (rank 0's, on every rank) */
static t_world world;
static const char *mine; /* this rank's scratch directory (its NVMe files) */

typedef struct layout {
    const char *name;
    int stage;
    bool nvme; /* parameters and optimizer state on NVMe */
} layout;
static layout now = {"stage 0", 0, false}; /* the layout engines are built with */

/* An engine of the tensor in tiles (cut[0] = 0 < cut[1] < ... < cut[tiles] = ROWS, rows of each tile; tiles 0: the
 * whole parameter "emb.weight") and a bias "head.bias" after it. */
typedef struct model {
    strata_engine *e;
    int tiles;
    int cut[MAX_TILES + 1];
    strata_module_id mod[MAX_TILES + 1]; /* the tiles (or the whole), then the head */
    strata_param_id par[MAX_TILES + 1];
} model;

static strata_status init(void *ctx, strata_param_id param, size_t offset, size_t count, float *out)
{
    const model *m = ctx;
    int n = m->tiles ? m->tiles : 1;
    const float *v = param == m->par[n] ? start + NUMEL : start + (m->tiles ? (size_t)m->cut[param] * COLS : 0);
    memcpy(out, v + offset, count * sizeof *out);
    return STRATA_OK;
}

static strata_config config(void)
{
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.sub_group_size = 1000; /* optimizer sub-groups that cut the tiles elsewhere than the modules do */
    c.zero_stage = now.stage;
    if (now.nvme)
        synth_nvme_path(&c, mine, true, true);
    return c;
}

/* Registers the model (not finalized) as one rank of the world in (NULL: a world of one); tiles and cuts as above. */
static strata_status add_model_in(strata_comm *in, model *m, int tiles, const int *cut)
{
    strata_config c = config();
    memset(m, 0, sizeof *m);
    m->tiles = tiles;
    if (tiles)
        memcpy(m->cut, cut, (size_t)(tiles + 1) * sizeof *cut);
    strata_status st = strata_engine_create_ranked(&c, in, NULL, &m->e);
    for (int t = 0; st == STRATA_OK && t < (tiles ? tiles : 1); t++) {
        char name[32];
        snprintf(name, sizeof name, tiles ? "emb.tile%d" : "emb", t);
        size_t rows = tiles ? (size_t)(cut[t + 1] - cut[t]) : ROWS;
        st = strata_module_add(m->e, name, &m->mod[t]);
        if (st == STRATA_OK)
            st = strata_param_add(m->e, m->mod[t], tiles ? "part" : "weight", rows * COLS, init, m, &m->par[t]);
        int64_t dims[2] = {(int64_t)rows, COLS};
        if (st == STRATA_OK && tiles)
            st = strata_param_set_part(m->e, m->par[t], "emb.weight", (uint64_t)cut[t] * COLS, 2, shape);
        else if (st == STRATA_OK)
            st = strata_param_set_shape(m->e, m->par[t], 2, dims);
    }
    int n = tiles ? tiles : 1;
    if (st == STRATA_OK)
        st = strata_module_add(m->e, "head", &m->mod[n]);
    if (st == STRATA_OK)
        st = strata_param_add(m->e, m->mod[n], "bias", COLS, init, m, &m->par[n]);
    return st;
}

static strata_status add_model(model *m, int tiles, const int *cut)
{
    return add_model_in(world.comm, m, tiles, cut);
}

static model *build_in(strata_comm *in, int tiles, const int *cut)
{
    static model pool[8];
    static int used;
    model *m = &pool[used++ % 8];
    T_OK(add_model_in(in, m, tiles, cut));
    T_OK(strata_engine_finalize(m->e));
    return m;
}

static model *build(int tiles, const int *cut)
{
    return build_in(world.comm, tiles, cut);
}

/* The gradient of tensor element i (its value w) at step s: depends on where the element is in the tensor, so a
 * part placed at the wrong rows trains differently. Multiples of 2^-16 within +-2^-6: every rank gives the same,
 * and their sum over up to 32 ranks is exact whatever the order. */
static float grad_of(size_t i, float w, int s)
{
    return ldexpf(roundf(sinf(3.0f * w + 0.01f * (float)i + (float)s) * 1024.0f), -16);
}

/* Steps [s0, s1): every module fetched forward, then backward with its gradients, then strata_step. */
static void train(model *m, int s0, int s1)
{
    int n = m->tiles ? m->tiles : 1;
    for (int s = s0; s < s1; s++) {
        for (int k = 0; k <= n; k++) {
            T_OK(strata_fetch(m->e, m->mod[k]));
            T_OK(strata_release(m->e, m->mod[k]));
        }
        for (int k = n; k >= 0; k--) {
            T_OK(strata_fetch(m->e, m->mod[k]));
            const float *w = strata_param_data(m->e, m->par[k]);
            float *g = strata_grad_data(m->e, m->par[k]);
            size_t base = k == n ? NUMEL : m->tiles ? (size_t)m->cut[k] * COLS : 0;
            size_t count = k == n ? COLS : m->tiles ? (size_t)(m->cut[k + 1] - m->cut[k]) * COLS : NUMEL;
            for (size_t j = 0; w && g && j < count; j++)
                g[j] = grad_of(base + j, w[j], s);
            T_OK(strata_grads_ready(m->e, m->mod[k]));
            T_OK(strata_release(m->e, m->mod[k]));
        }
        strata_step_args args = {0};
        strata_step_result res;
        T_OK(strata_step(m->e, &args, &res));
    }
}

/* The tensor's master weights, then the bias's, into out (NUMEL + COLS). */
static void weights(model *m, float *out)
{
    int n = m->tiles ? m->tiles : 1;
    for (int k = 0; k < n; k++) {
        size_t base = m->tiles ? (size_t)m->cut[k] * COLS : 0;
        size_t count = m->tiles ? (size_t)(m->cut[k + 1] - m->cut[k]) * COLS : NUMEL;
        T_OK(strata_param_read_master(m->e, m->par[k], 0, count, out + base));
    }
    T_OK(strata_param_read_master(m->e, m->par[n], 0, COLS, out + NUMEL));
}

static void expect_same(model *m, const float *want, const char *what)
{
    float got[NUMEL + COLS];
    weights(m, got);
    size_t first, d = synth_count_diff(want, got, NUMEL + COLS, &first);
    T_CHECK(d == 0, "%s: %zu of %zu weights differ from the oracle's; first at %zu: %.9g vs %.9g (oracle)", what, d,
            NUMEL + COLS, first, first < NUMEL + COLS ? (double)got[first] : 0.0,
            first < NUMEL + COLS ? (double)want[first] : 0.0);
}

static void destroy(model *m)
{
    strata_engine_destroy(m->e);
    m->e = NULL;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
        rewind(f);
        if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
            buf[n] = '\0';
            *len = (size_t)n;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    if (f)
        fclose(f);
    return buf;
}

/* A world of one's model file holds the tensor whole, once, in its shape. */
static void expect_whole_in_file(const char *dir)
{
    char path[1100];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char *buf = slurp(path, &len);
    T_CHECK(buf && len > 8, "cannot read %s", path);
    if (!buf)
        return;
    uint64_t hlen = 0;
    memcpy(&hlen, buf, 8);
    char *head = strndup(buf + 8, (size_t)hlen);
    T_CONTAINS(head, "\"emb.weight\":{\"dtype\":\"F32\",\"shape\":[9768]");
    T_CHECK(!strstr(head, "emb.weight@") && !strstr(head, "tile"), "the file holds the tensor in pieces: %s", head);
    free(head);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    free(buf);
    buf = slurp(path, &len);
    size_t kept = 0; /* the manifest is pretty-printed: compare it without its white space */
    for (size_t i = 0; buf && i < len; i++)
        if (!isspace((unsigned char)buf[i]))
            buf[kept++] = buf[i];
    if (buf)
        buf[kept] = 0;
    T_CONTAINS(buf, "\"model_shape\":[37,264]");
    free(buf);
}

/* Rank 0 alone (a world of one) loads the world's checkpoint of the tiles, whole and in tiles: the same weights. */
static void load_alone(const char *dir, const float *want)
{
    static const int two[] = {0, 19, ROWS};
    if (world.rank == 0) {
        for (int k = 0; k < 2; k++) {
            char what[160];
            snprintf(what, sizeof what, "%s: %d ranks' checkpoint of 3 tiles into %s, by rank 0 alone", now.name,
                     world.size, k ? "2 tiles" : "the whole parameter");
            model *m = build_in(NULL, k ? 2 : 0, k ? two : NULL);
            T_OK(strata_load(m->e, dir));
            expect_same(m, want, what);
            destroy(m);
        }
    }
    T_OK(comm_barrier(world.comm));
}

static void round_trips(const char *root)
{
    static const int three[] = {0, 5, 21, ROWS}, four[] = {0, 1, 2, 30, ROWS}, two[] = {0, 19, ROWS};
    float oracle2[NUMEL + COLS], oracle4[NUMEL + COLS];
    model *whole = build(0, NULL);
    train(whole, 0, 2);
    weights(whole, oracle2);
    char dir_whole[1024], dir_three[1024];
    snprintf(dir_whole, sizeof dir_whole, "%s/%d%s_whole", root, now.stage, now.nvme ? "nvme" : "");
    snprintf(dir_three, sizeof dir_three, "%s/%d%s_three", root, now.stage, now.nvme ? "nvme" : "");
    T_OK(strata_save(whole->e, dir_whole));
    train(whole, 2, 4);
    weights(whole, oracle4);
    destroy(whole);

    model *tiled = build(3, three);
    train(tiled, 0, 2);
    char what[200];
    snprintf(what, sizeof what, "%s, %d ranks: 3 tiles after 2 steps against the whole parameter", now.name,
             world.size);
    expect_same(tiled, oracle2, what);
    T_OK(strata_save(tiled->e, dir_three));
    if (world.size == 1)
        expect_whole_in_file(dir_three);
    train(tiled, 2, 4);
    snprintf(what, sizeof what, "%s, %d ranks: 3 tiles after 4 steps", now.name, world.size);
    expect_same(tiled, oracle4, what);
    destroy(tiled);

    /* The whole parameter's checkpoint into tiles, the tiles' into other tiles and into the whole parameter. */
    struct { const char *dir; int tiles; const int *cut; const char *what; } loads[] = {
        {dir_whole, 4, four, "the whole parameter's checkpoint into 4 tiles, 2 steps on"},
        {dir_three, 2, two, "3 tiles' checkpoint into 2 tiles, 2 steps on"},
        {dir_three, 0, NULL, "3 tiles' checkpoint into the whole parameter, 2 steps on"},
        {dir_three, 3, three, "3 tiles' checkpoint into the same 3 tiles, 2 steps on"},
    };
    for (size_t i = 0; i < sizeof loads / sizeof *loads; i++) {
        snprintf(what, sizeof what, "%s, %d ranks: %s", now.name, world.size, loads[i].what);
        model *m = build(loads[i].tiles, loads[i].cut);
        T_OK(strata_load(m->e, loads[i].dir));
        expect_same(m, oracle2, what);
        train(m, 2, 4);
        expect_same(m, oracle4, what);
        destroy(m);
    }
    if (world.size > 1) {
        load_alone(dir_three, oracle2);
        return;
    }

    /* A damaged piece is found whatever the split that reads it. */
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir_three);
    FILE *f = fopen(path, "r+b");
    T_CHECK(f != NULL, "cannot open %s", path);
    if (f) {
        fseek(f, -8 - (long)(COLS * sizeof(float)), SEEK_END); /* inside the tensor's last row */
        int byte = fgetc(f);
        fseek(f, -1, SEEK_CUR);
        fputc(byte ^ 0x40, f);
        fclose(f);
    }
    model *m = build(2, two);
    strata_status st = strata_load(m->e, dir_three);
    T_EQ_INT(st, STRATA_ECORRUPT);
    T_CONTAINS(strata_last_error(m->e), "tensor \"emb.weight\": crc32c");
    destroy(m);
}

/* A safetensors file as Hugging Face writes one: "emb.weight" [ROWS, COLS] and "head.bias" [COLS], F32. */
static void write_weights(const char *path, const float *v)
{
    char head[256];
    int n = snprintf(head, sizeof head, "{\"emb.weight\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]},"
                     "\"head.bias\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}}", ROWS, COLS,
                     NUMEL * 4, COLS, NUMEL * 4, (NUMEL + COLS) * 4);
    while (n % 8)
        head[n++] = ' ';
    uint64_t len = (uint64_t)n;
    FILE *f = fopen(path, "wb");
    T_CHECK(f && fwrite(&len, 8, 1, f) == 1 && fwrite(head, 1, (size_t)n, f) == (size_t)n &&
                fwrite(v, sizeof *v, NUMEL + COLS, f) == NUMEL + COLS,
            "cannot write %s", path);
    if (f)
        fclose(f);
}

/* strata_param_load reads each part of a tensor out of a file's whole tensor. */
static void load_parts(const char *root)
{
    static const int three[] = {0, 5, 21, ROWS};
    char file[600];
    snprintf(file, sizeof file, "%s/pretrained.safetensors", root);
    float want[NUMEL + COLS];
    for (size_t i = 0; i < NUMEL + COLS; i++)
        want[i] = t_rand_normal();
    T_OK(comm_broadcast(world.comm, want, sizeof want, COMM_BYTE, 0));
    if (world.rank == 0)
        write_weights(file, want);
    T_OK(comm_barrier(world.comm));
    model m;
    T_OK(add_model(&m, 3, three));
    strata_weights_id w;
    T_OK(strata_weights_open(m.e, file, &w));
    for (int t = 0; t < 3; t++)
        T_OK(strata_param_load(m.e, m.par[t], w, "emb.weight", 0));
    T_OK(strata_param_load(m.e, m.par[3], w, "head.bias", 0));
    T_OK(strata_engine_finalize(m.e));
    expect_same(&m, want, "3 tiles loaded with strata_param_load from the whole tensor");
    destroy(&m);

    /* A part declared after its load: the size was checked against the part alone and is refused, saying why. */
    T_OK(add_model(&m, 0, NULL));
    strata_module_id extra;
    strata_param_id p;
    T_OK(strata_module_add(m.e, "more", &extra));
    T_OK(strata_param_add(m.e, extra, "rows", 5 * COLS, init, &m, &p));
    T_OK(strata_weights_open(m.e, file, &w));
    T_STATUS(strata_param_load(m.e, p, w, "emb.weight", 0), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(m.e), "declare it with strata_param_set_part before strata_param_load");
    destroy(&m);
    T_OK(comm_barrier(world.comm)); /* before rank 0 writes the next file */
}

/* A split that is not one tensor, refused at finalize with the tensor and the parts named (a world of one: the
 * checks are the registry's, before any rank talks to another). */
static void expect_refused(int tiles, const int *cut, void (*alter)(model *), strata_status want, const char *text)
{
    model m;
    T_OK(add_model_in(NULL, &m, tiles, cut));
    if (alter)
        alter(&m);
    strata_status st = strata_engine_finalize(m.e);
    T_CHECK(st == want, "finalize: %s, expected %s (%s)", strata_status_name(st), strata_status_name(want), text);
    T_CONTAINS(strata_last_error(m.e), text);
    destroy(&m);
}

static void gap(model *m)
{
    T_OK(strata_param_set_part(m->e, m->par[1], "emb.weight", 6 * COLS, 2, shape)); /* rows 6..21: 5 missing */
}

static void overlap(model *m)
{
    T_OK(strata_param_set_part(m->e, m->par[1], "emb.weight", 4 * COLS, 2, shape));
}

static void other_shape(model *m)
{
    int64_t other[2] = {COLS, ROWS};
    T_OK(strata_param_set_part(m->e, m->par[2], "emb.weight", 21 * COLS, 2, other));
}

static void frozen(model *m)
{
    T_OK(strata_module_freeze(m->e, m->mod[1]));
}

static void clash(model *m)
{
    strata_module_id mod;
    strata_param_id p;
    T_OK(strata_module_add(m->e, "emb", &mod));
    T_OK(strata_param_add(m->e, mod, "weight", 4, NULL, NULL, &p));
}

static void other_group(model *m)
{
    strata_group_hparams hp;
    strata_group_id g;
    T_OK(strata_group_get(m->e, 0, &hp));
    T_OK(strata_group_add(m->e, "tile", &hp, &g));
    T_OK(strata_param_set_group(m->e, m->par[2], g));
}

static void refusals(void)
{
    static const int three[] = {0, 5, 21, ROWS};
    expect_refused(3, three, gap, STRATA_EINVAL, "tensor \"emb.weight\": a gap: part \"emb.tile0.part\" ends at "
                   "element 1320, part \"emb.tile1.part\" starts at 1584");
    expect_refused(3, three, overlap, STRATA_EINVAL, "two parts overlap");
    expect_refused(3, three, other_shape, STRATA_EINVAL, "declares the shape [37, 264], part \"emb.tile2.part\" "
                   "[264, 37]");
    expect_refused(3, three, frozen, STRATA_EINVAL, "part \"emb.tile1.part\" is frozen, part \"emb.tile0.part\" is "
                   "not");
    expect_refused(3, three, clash, STRATA_EINVAL, "tensor \"emb.weight\" has the name of parameter");
    expect_refused(3, three, other_group, STRATA_EINVAL, "are in different parameter groups");
    static const int short_cut[] = {0, 5, 30}; /* rows 30..37 in no part */
    expect_refused(2, short_cut, NULL, STRATA_EINVAL, "a gap: its last part \"emb.tile1.part\" ends at element 7920 "
                   "of 9768");

    /* The tiles' modules in another order than their elements, with the head between: refused. */
    strata_config c = config();
    strata_engine *e;
    strata_module_id a, h, b;
    strata_param_id pa, ph, pb;
    T_OK(strata_engine_create(&c, &e));
    T_OK(strata_module_add(e, "late", &a));
    T_OK(strata_param_add(e, a, "part", 17 * COLS, NULL, NULL, &pa));
    T_OK(strata_module_add(e, "head", &h));
    T_OK(strata_param_add(e, h, "bias", COLS, NULL, NULL, &ph));
    T_OK(strata_module_add(e, "early", &b));
    T_OK(strata_param_add(e, b, "part", 20 * COLS, NULL, NULL, &pb));
    T_OK(strata_param_set_part(e, pa, "emb.weight", 20 * COLS, 2, shape));
    T_OK(strata_param_set_part(e, pb, "emb.weight", 0, 2, shape));
    T_STATUS(strata_engine_finalize(e), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "part \"late.part\" does not follow part \"early.part\"");
    strata_engine_destroy(e);

    /* At the call: what can be checked at once. */
    T_OK(strata_engine_create(&c, &e));
    T_OK(strata_module_add(e, "m", &a));
    T_OK(strata_param_add(e, a, "p", 10 * COLS, NULL, NULL, &pa));
    T_STATUS(strata_param_set_part(e, pa, "t", 28 * COLS, 2, shape), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "elements [7392, 10032) lie outside tensor \"t\" of shape [37, 264] (9768 "
                    "elements)");
    T_STATUS(strata_param_set_part(e, pa, "", 0, 2, shape), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "the tensor's name is empty");
    T_STATUS(strata_param_set_part(e, pa, "t", 0, 0, shape), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "ndim = 0 is outside [1, 8]");
    int64_t zero[2] = {ROWS, 0};
    T_STATUS(strata_param_set_part(e, pa, "t", 0, 2, zero), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "dims[1] = 0");
    T_STATUS(strata_param_set_part(e, 7, "t", 0, 2, shape), STRATA_ESTATE);
    strata_engine_destroy(e);
}

int main(void)
{
    world = t_world_open();
    for (size_t i = 0; i < NUMEL + COLS; i++)
        start[i] = t_rand_normal() * 0.5f;
    T_OK(comm_broadcast(world.comm, start, sizeof start, COMM_BYTE, 0));
    static char root[512]; /* rank 0's scratch directory: the world's checkpoints and files */
    mine = t_world_scratch(world.comm, "param_parts", root, sizeof root);
    static const layout layouts[] = {
        {"stage 0", 0, false}, {"stage 1", 1, false}, {"stage 2", 2, false}, {"stage 3", 3, false},
        {"stage 3, parameters and optimizer on NVMe", 3, true},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        if (world.size == 1 && i > 0 && i < 4)
            continue; /* a world of one partitions nothing: stages 1 to 3 are stage 0 there */
        now = layouts[i];
        round_trips(root);
    }
    now = layouts[0];
    load_parts(root);
    if (world.rank == 0)
        refusals();
    strata_comm_destroy(world.comm);
    return t_done();
}
