/*
 * Sharded checkpoints: a world of N ranks saves one checkpoint (every rank its own files, one manifest), and worlds
 * of M = N, 1 and N + 1 ranks load it. Per case (ZeRO stage 0 to 3; the optimizer on host or on NVMe; fp32, and
 * bf16 with the delayed update so the save finds an update pending), with fresh random data (rank 0's seed):
 *
 *  (a) exact resume at N: K steps, a save, J steps on a fresh world of N engines that loaded it, are bit-identical to
 *      K + J steps uninterrupted.
 *  (b) roundtrips at M = N, 1 and N + 1: a fresh world of M ranks loads it and saves it again at once. The master
 *      weights it holds (strata_param_read_master, gathered from every rank) are bit-identical to those gathered at
 *      the save, and every tensor of both checkpoints (master weights, Adam moments, the bf16 parameters and the
 *      pending ".next" copy), reassembled from its pieces, is bit-identical: nothing is lost or moved by resharding.
 *      M = N + 1 is run by saving from a sub-world of the first np - 1 ranks (MPI_Comm_split; one rank alone saves
 *      as a world of one) and loading with all np.
 *  (c) continuing at another world: J steps at M = 1 (one engine per rank, in-process, taking the N micro-batches
 *      one rank at a time) from the N-rank checkpoint, against the uninterrupted N-rank run; and J steps at np ranks
 *      from the sub-world's checkpoint against one rank continuing from the same checkpoint: bit-identical, the
 *      trainer's gradients being on the grid where fp32 sums are exact in any order (synth_opts.exact_sums; why in
 *      mpi_engine_ranks.c).
 *
 * And a failed save at N: rank N - 1's first NVMe read fails (injected EIO) while every rank writes; every rank
 * returns STRATA_EIO (the others naming rank N - 1), the previous checkpoint still verifies with its step, the
 * temporary directory is gone, and the same world saves again. A flipped byte in one rank's file fails the load on
 * every rank (naming the file) and leaves every rank's strata_step refusing until a good load.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "comm/comm.h"
#include "engine/ckpt/ckpt_files.h"
#include "nvme/fault.h"
#include "synth.h"
#include "testlib.h"
#include "world.h"
#ifdef STRATA_TEST_MPI
#include <mpi.h>
#endif

enum { K = 2, J = 2 };
static strata_comm *world;
static int rank, size;
static uint64_t seed;
static char shared[512]; /* rank 0's scratch directory, where the checkpoints of every world go */
static const char *mine;  /* this rank's own scratch directory (NVMe swap files) */

typedef struct ckpt_case {
    const char *name, *tag;
    int stage;
    bool nvme, bf16_delayed;
} ckpt_case;

/* Modules of 8 to 16 blocks of 4096 elements and a small last one: cut into 2 to 5 shards, a module's shards cut
 * parameters in the middle, and a rank's shard of the last module can be all padding. */
static void model(synth_opts *o)
{
    synth_defaults(o, seed);
    const int widths[] = {128, 256, 256, 256, 40};
    memcpy(o->width, widths, sizeof widths);
    o->layers = 4;
    o->exact_sums = true; /* the ranks' sums equal one rank's bit for bit (see mpi_engine_ranks.c) */
}

static size_t nweights(const synth_opts *o)
{
    size_t n = 0;
    for (int l = 0; l < o->layers; l++)
        n += (size_t)o->width[l + 1] * o->width[l] + o->width[l + 1];
    return n;
}

static void same(const char *what, const float *a, const float *b, size_t n)
{
    size_t first = 0, d = a && b ? synth_count_diff(a, b, n, &first) : n;
    T_CHECK(d == 0, "%s: %zu of %zu weights differ; the first, %zu, is %.9g vs %.9g", what, d, n, first,
            a && b && first < n ? (double)a[first] : 0.0, a && b && first < n ? (double)b[first] : 0.0);
}

/* Tensor (kind, name) of checkpoint dir, reassembled from its pieces; NULL when absent. */
static uint8_t *assemble(const char *dir, const ckpt_manifest *m, int kind, const char *name, size_t *bytes)
{
    const ckpt_tensor *t = ckpt_manifest_piece(m, kind, name, 0);
    if (!t)
        return NULL;
    size_t eb = ckpt_dtype_bytes(t->dtype);
    uint8_t *buf = malloc(t->total * eb + 1);
    *bytes = t->total * eb;
    for (uint64_t x = 0; buf && x < t->total; x = t->first + t->numel) {
        t = ckpt_manifest_piece(m, kind, name, x);
        ckpt_file f;
        T_OK(ckpt_file_open(dir, m, t->rank, kind, &f));
        T_OK(ckpt_file_read(&f, t->begin, buf + x * eb, t->numel * eb, t->name));
        ckpt_file_close(&f);
    }
    return buf;
}

/* Every tensor of checkpoints a and b is the same, bytewise, however each was cut into pieces. */
static void same_tensors(const char *what, const char *a, const char *b)
{
    ckpt_manifest ma, mb;
    T_OK(ckpt_manifest_read(a, &ma));
    T_OK(ckpt_manifest_read(b, &mb));
    size_t na = 0, nb = 0, differ = 0;
    for (size_t i = 0; i < mb.ntensors; i++)
        nb += mb.tensors[i].first == 0;
    for (size_t i = 0; i < ma.ntensors; i++) {
        const ckpt_tensor *t = &ma.tensors[i];
        if (t->first != 0)
            continue;
        na++;
        size_t la = 0, lb = 0;
        uint8_t *x = assemble(a, &ma, t->file, t->name, &la), *y = assemble(b, &mb, t->file, t->name, &lb);
        bool ok = x && y && la == lb && memcmp(x, y, la) == 0;
        T_CHECK(ok, "%s: tensor \"%s\" of %s: %s", what, t->name, ckpt_file_names[t->file],
                y ? "differs after the reload" : "missing after the reload");
        differ += !ok;
        free(x);
        free(y);
    }
    T_CHECK(na == nb && na > 0, "%s: %zu tensors written by %d ranks, %zu after the reload by %d", what, na, ma.world,
            nb, mb.world);
    if (differ == 0 && na == nb)
        printf("%s: %zu tensors (%zu pieces from %d ranks, %zu from %d) bit-identical\n", what, na, ma.ntensors,
               ma.world, mb.ntensors, mb.world);
    ckpt_manifest_free(&ma);
    ckpt_manifest_free(&mb);
}

/* A fresh engine in comm's world (NULL: a world of one) loads src and saves it to dst at once; returns the master
 * weights it loaded (gathered from every rank). */
static float *reload(strata_comm *c, const synth_opts *o, const strata_config *cfg, const char *src, const char *dst)
{
    synth_opts oo = *o;
    oo.comm = c;
    strata_engine *e = NULL;
    T_OK(synth_engine(&oo, cfg, &e));
    size_t n = nweights(o), pos = 0;
    float *w = malloc(n * sizeof *w);
    if (!e || !w) {
        free(w);
        strata_engine_destroy(e);
        return NULL;
    }
    T_OK(strata_load(e, src));
    T_OK(strata_save(e, dst));
    for (int id = 0; id < 2 * o->layers; id++) {
        size_t numel = id % 2 ? (size_t)o->width[id / 2 + 1] : (size_t)o->width[id / 2 + 1] * o->width[id / 2];
        T_OK(strata_param_read_master(e, (strata_param_id)id, 0, numel, w + pos));
        pos += numel;
    }
    strata_engine_destroy(e);
    return w;
}

static float *train(strata_comm *c, const synth_opts *base, const strata_config *cfg, int first, int steps,
                    const char *load, const char *save)
{
    synth_opts o = *base;
    o.comm = c;
    int n = c ? strata_comm_size(c) : 1;
    o.micro_batches = size / n; /* every world sees the same size micro-batches per step */
    o.first_step = first;
    o.steps = steps;
    o.load_dir = load;
    o.save_dir = save;
    o.save_after = save ? first + steps : 0;
    float *w = NULL;
    size_t nw = 0;
    T_OK(synth_train(&o, cfg, &w, &nw, NULL, NULL));
    return w;
}

/* The sub-world of ranks 0 .. size - 2 (NULL on the last rank, and a world of one where it is rank 0 alone). */
static bool sub_world(strata_comm **out)
{
    *out = NULL;
    if (size == 2)
        return true;
#ifdef STRATA_TEST_MPI
    MPI_Comm sub;
    T_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank < size - 1 ? 0 : MPI_UNDEFINED, rank, &sub) == MPI_SUCCESS,
            "MPI_Comm_split failed");
    if (sub != MPI_COMM_NULL) {
        T_OK(strata_comm_create_mpi(&sub, out));
        MPI_Comm_free(&sub);
    }
    return true;
#else
    return false;
#endif
}

static void run_case(const ckpt_case *k)
{
    char what[256], d_n[700], d_again[760], d_sub[700];
    strata_config cfg = synth_config(k->bf16_delayed ? STRATA_DTYPE_BF16 : STRATA_DTYPE_FP32);
    cfg.zero_stage = k->stage;
    cfg.cpu_threads = 1;
    cfg.offload_optimizer.device = STRATA_TIER_HOST;
    if (k->nvme)
        synth_use_nvme(&cfg, mine, k->stage == 3, true);
    cfg.delayed_update = k->bf16_delayed;
    cfg.delayed_warmup_steps = 1; /* < K: the save finds an update in flight */
    synth_opts o;
    model(&o);
    size_t n = nweights(&o);
    snprintf(d_n, sizeof d_n, "%s/%s-np%d", shared, k->tag, size);
    snprintf(d_sub, sizeof d_sub, "%s/%s-sub", shared, k->tag);

    /* (a) exact resume at N. */
    float *full = train(world, &o, &cfg, 0, K + J, NULL, NULL);
    float *at_save = train(world, &o, &cfg, 0, K, NULL, d_n);
    float *resumed = train(world, &o, &cfg, K, J, d_n, NULL);
    snprintf(what, sizeof what, "%s, %d ranks: resumed at %d ranks vs uninterrupted", k->name, size, size);
    same(what, full, resumed, n);

    /* (b) roundtrips at N and 1. */
    snprintf(d_again, sizeof d_again, "%s-again", d_n);
    float *w = reload(world, &o, &cfg, d_n, d_again);
    snprintf(what, sizeof what, "%s: saved at %d ranks, loaded at %d", k->name, size, size);
    same(what, at_save, w, n);
    if (rank == 0)
        same_tensors(what, d_n, d_again);
    free(w);
    snprintf(d_again, sizeof d_again, "%s-one-r%d", d_n, rank);
    w = reload(NULL, &o, &cfg, d_n, d_again);
    snprintf(what, sizeof what, "%s: saved at %d ranks, loaded at 1 (rank %d)", k->name, size, rank);
    same(what, at_save, w, n);
    if (rank == size - 1)
        same_tensors(what, d_n, d_again);
    free(w);

    /* (c) J steps at one rank from the N-rank checkpoint vs the uninterrupted N ranks. */
    if (rank == 0) {
        float *one = train(NULL, &o, &cfg, K, J, d_n, NULL);
        snprintf(what, sizeof what, "%s: saved at %d ranks, continued at 1 vs uninterrupted at %d", k->name, size,
                 size);
        same(what, one, full, n);
        free(one);
    }
    free(full);
    free(at_save);
    free(resumed);

    /* (b) and (c) at N + 1: saved by the first size - 1 ranks, loaded by all. */
    strata_comm *sub = NULL;
    if (size < 2 || !sub_world(&sub)) {
        if (rank == 0)
            printf("%s: no world of N + 1 here (%s)\n", k->name, size < 2 ? "one rank" : "built without MPI");
        return;
    }
    float *sub_saved = NULL;
    if (rank < size - 1)
        sub_saved = train(sub, &o, &cfg, 0, K, NULL, d_sub);
    strata_comm_destroy(sub);
    T_OK(comm_barrier(world));
    snprintf(d_again, sizeof d_again, "%s-np%d", d_sub, size);
    w = reload(world, &o, &cfg, d_sub, d_again);
    snprintf(what, sizeof what, "%s: saved at %d ranks, loaded at %d", k->name, size - 1, size);
    if (rank < size - 1)
        same(what, sub_saved, w, n);
    if (rank == 0)
        same_tensors(what, d_sub, d_again);
    free(w);
    float *cont = train(world, &o, &cfg, K, J, d_sub, NULL);
    if (rank == 0) {
        float *one = train(NULL, &o, &cfg, K, J, d_sub, NULL);
        snprintf(what, sizeof what, "%s: saved at %d ranks, continued at %d vs at 1", k->name, size - 1, size);
        same(what, cont, one, n);
        free(one);
    }
    free(cont);
    free(sub_saved);
}

/* Flips a bit of the last byte of path: the data of its last piece. */
static void flip(const char *path)
{
    FILE *f = fopen(path, "r+b");
    T_CHECK(f != NULL, "cannot open %s", path);
    if (!f)
        return;
    fseek(f, -1, SEEK_END);
    int c = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* A save that fails on one rank costs nothing; a damaged file of one rank fails the load on every rank. */
static void failures(void)
{
    if (size < 2)
        return;
    char dir[700], tmp[760], what[200];
    snprintf(dir, sizeof dir, "%s/faults", shared);
    snprintf(tmp, sizeof tmp, "%s/.faults.tmp", shared);
    strata_config cfg = synth_config(STRATA_DTYPE_FP32);
    cfg.zero_stage = 1;
    cfg.cpu_threads = 1;
    synth_use_nvme(&cfg, mine, false, true);
    synth_opts o;
    model(&o);
    o.comm = world;
    o.micro_batches = 1;
    free(train(world, &o, &cfg, 0, K, NULL, dir));
    strata_engine *e = NULL;
    T_OK(synth_engine(&o, &cfg, &e));
    if (!e)
        return;
    T_OK(strata_load(e, dir));
    T_OK(strata_step(e, NULL, NULL));
    if (rank == size - 1)
        nvme_fault_inject(1, NVME_FAULT_EIO);
    strata_status st = strata_save(e, dir);
    nvme_fault_inject(0, NVME_FAULT_NONE);
    snprintf(what, sizeof what, "rank %d of %d failed", size - 1, size);
    T_CHECK(st == STRATA_EIO, "a save whose rank %d fails returned %s on rank %d: %s", size - 1,
            strata_status_name(st), rank, strata_last_error(e));
    if (rank != size - 1)
        T_CONTAINS(strata_last_error(e), what);
    T_OK(comm_barrier(world));
    struct stat sb;
    strata_checkpoint_info info;
    if (rank == 0) {
        T_OK(strata_checkpoint_verify(dir));
        T_OK(strata_checkpoint_inspect(dir, &info));
        T_CHECK(info.step == K && info.world_size == size, "after the failed save the checkpoint holds step %lld of "
                "%d ranks, expected step %d of %d", (long long)info.step, info.world_size, K, size);
        T_CHECK(stat(tmp, &sb) != 0, "the failed save left %s behind", tmp);
    }
    T_OK(strata_save(e, dir)); /* the same world saves on */
    T_OK(strata_checkpoint_inspect(dir, &info));
    T_CHECK(info.step == K + 1, "the save after the failure holds step %lld, expected %d", (long long)info.step, K + 1);

    /* One byte of the last rank's master weights flipped: every rank's load fails, and every rank refuses to step. */
    char path[800];
    snprintf(path, sizeof path, "%s/model.rank%d.safetensors", dir, size - 1);
    T_OK(comm_barrier(world));
    if (rank == 0) {
        flip(path);
        T_STATUS(strata_checkpoint_verify(dir), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(NULL), path);
    }
    T_OK(comm_barrier(world));
    T_STATUS(strata_load(e, dir), STRATA_ECORRUPT);
    T_CONTAINS(strata_last_error(e), "crc32c");
    T_STATUS(strata_step(e, NULL, NULL), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_load failed");
    T_OK(comm_barrier(world));
    if (rank == 0)
        flip(path);
    T_OK(comm_barrier(world));
    T_OK(strata_load(e, dir)); /* repaired: the same world loads it and trains on */
    T_OK(strata_step(e, NULL, NULL));
    strata_engine_destroy(e);
}

int main(void)
{
    t_world w = t_world_open();
    world = w.comm;
    rank = w.rank;
    size = w.size;
    seed = w.seed;
    mine = t_world_scratch(world, "mpi_ckpt_ranks", shared, sizeof shared);
    const ckpt_case cases[] = {
        {"stage 0, optimizer on host", "s0", 0, false, false},
        {"stage 1, optimizer on NVMe", "s1", 1, true, false},
        {"stage 2, bf16 delayed", "s2", 2, false, true},
        {"stage 3, parameters and optimizer on NVMe", "s3", 3, true, false},
        {"stage 3, bf16 delayed", "s3d", 3, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
    failures();
    T_OK(comm_barrier(world));
    t_scratch_cleanup();
    strata_comm_destroy(world);
    return t_done();
}
