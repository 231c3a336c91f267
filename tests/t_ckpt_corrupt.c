/*
 * Damaged and hostile checkpoints: a flipped byte in any tensor of any file, a truncated file, a broken
 * header length, a garbage manifest, a missing directory and a checkpoint of another model are all caught
 * with a message that names the file and tensor; a failure found before anything was written leaves the
 * engine usable, one found while streaming makes strata_step refuse until a good load. Also: misuse of
 * strata_save, inspect's fields, and keep-last-N rotation.
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ckpt/ckpt_files.h"
#include "synth.h"
#include "testlib.h"

static strata_config config(void)
{
    strata_config c = synth_config(STRATA_DTYPE_BF16);
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.delayed_update = true;
    c.delayed_warmup_steps = 1;
    return c;
}

static void xor_byte(const char *path, uint64_t off, uint8_t mask)
{
    int fd = open(path, O_RDWR);
    uint8_t b = 0;
    T_CHECK(fd >= 0 && pread(fd, &b, 1, (off_t)off) == 1, "cannot read %s", path);
    b ^= mask;
    T_CHECK(pwrite(fd, &b, 1, (off_t)off) == 1, "cannot write %s", path);
    close(fd);
}

static void flipped_tensor(const synth_opts *o, const strata_config *c, const char *dir)
{
    ckpt_manifest m;
    T_OK(ckpt_manifest_read(dir, &m));
    if (m.ntensors == 0)
        return;
    const ckpt_tensor *t = &m.tensors[t_rand_range(0, m.ntensors - 1)];
    ckpt_file f;
    T_OK(ckpt_file_open(dir, &m, t->rank, t->file, &f));
    ckpt_file_close(&f);
    uint64_t off = f.data_start + t_rand_range(t->begin, t->end - 1);
    uint8_t mask = (uint8_t)(1u << t_rand_range(0, 7));
    xor_byte(f.path, off, mask);
    printf("flipped bit %02x at byte %llu of %s (tensor %s)\n", mask, (unsigned long long)off, f.path, t->name);

    T_STATUS(strata_checkpoint_verify(dir), STRATA_ECORRUPT);
    T_CONTAINS(strata_last_error(NULL), f.path);
    T_CONTAINS(strata_last_error(NULL), t->name);
    T_CONTAINS(strata_last_error(NULL), "crc32c");

    strata_engine *e = NULL;
    T_OK(synth_engine(o, c, &e));
    if (e) {
        T_STATUS(strata_load(e, dir), STRATA_ECORRUPT);
        T_CONTAINS(strata_last_error(e), t->name);
        T_CONTAINS(strata_last_error(e), f.path);
        T_STATUS(strata_step(e, NULL, NULL), STRATA_ESTATE);
        T_CONTAINS(strata_last_error(e), "strata_load failed");
        xor_byte(f.path, off, mask); /* repaired: the same engine loads it and trains on */
        T_OK(strata_load(e, dir));
        T_OK(strata_step(e, NULL, NULL));
        strata_engine_destroy(e);
    }
    T_OK(strata_checkpoint_verify(dir));
    ckpt_manifest_free(&m);
}

/* Structural damage is found before the engine's state is touched: the engine keeps training. */
static void expect_refused(const synth_opts *o, const strata_config *c, const char *dir, const char *what,
                           strata_status want, const char *needle1, const char *needle2)
{
    strata_engine *e = NULL;
    T_OK(synth_engine(o, c, &e));
    if (!e)
        return;
    strata_status st = strata_load(e, dir);
    T_CHECK(st == want, "%s: strata_load returned %s, expected %s (%s)", what, strata_status_name(st),
            strata_status_name(want), strata_last_error(e));
    T_CONTAINS(strata_last_error(e), needle1);
    if (needle2)
        T_CONTAINS(strata_last_error(e), needle2);
    T_OK(strata_step(e, NULL, NULL));
    strata_engine_destroy(e);
}

static void truncated(const synth_opts *o, const strata_config *c, const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, ckpt_file_names[t_rand_range(0, 2)]);
    struct stat sb;
    T_CHECK(stat(path, &sb) == 0, "stat %s", path);
    off_t cut = (off_t)t_rand_range(1, (size_t)sb.st_size - 1);
    T_CHECK(truncate(path, cut) == 0, "truncate %s", path);
    printf("truncated %s from %lld to %lld bytes\n", path, (long long)sb.st_size, (long long)cut);
    expect_refused(o, c, dir, "truncated file", STRATA_ECORRUPT, path, "truncated");
    T_STATUS(strata_checkpoint_verify(dir), STRATA_ECORRUPT);
    T_CONTAINS(strata_last_error(NULL), path);
}

static void broken_header(const synth_opts *o, const strata_config *c, const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, ckpt_file_names[CKPT_FILE_OPTIMIZER]);
    int fd = open(path, O_RDWR);
    uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    T_CHECK(fd >= 0 && pwrite(fd, huge, 8, 0) == 8, "cannot write %s", path);
    close(fd);
    expect_refused(o, c, dir, "header length", STRATA_ECORRUPT, path, "header length");
}

static void bad_manifest(const synth_opts *o, const strata_config *c, const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"strata-checkpoint\", \"version\": 1, \"step\": -4}", f);
    fclose(f);
    expect_refused(o, c, dir, "manifest", STRATA_ECORRUPT, path, "\"step\"");
    char missing[1024];
    snprintf(missing, sizeof missing, "%s/does-not-exist", dir);
    expect_refused(o, c, missing, "missing dir", STRATA_ENOTFOUND, missing, "manifest");
}

static void misuse(const synth_opts *o, const strata_config *c, const char *scratch)
{
    strata_engine *e = NULL;
    T_OK(synth_engine(o, c, &e));
    if (!e)
        return;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/no/such/parent/ckpt", scratch);
    T_CHECK(strata_save(e, dir) != STRATA_OK, "save under a missing parent succeeded");
    T_CONTAINS(strata_last_error(e), "no/such/parent");
    /* A directory that holds something else is never replaced. */
    snprintf(dir, sizeof dir, "%s/users-own", scratch);
    mkdir(dir, 0755);
    char keep[700];
    snprintf(keep, sizeof keep, "%s/notes.txt", dir);
    FILE *f = fopen(keep, "w");
    fputs("mine\n", f);
    fclose(f);
    T_STATUS(strata_save(e, dir), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "is not a strata checkpoint");
    struct stat sb;
    T_CHECK(stat(keep, &sb) == 0, "%s is gone", keep);
    T_OK(strata_fetch(e, 0));
    snprintf(dir, sizeof dir, "%s/held", scratch);
    T_STATUS(strata_save(e, dir), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "layer0");
    /* Gradients accumulated but not stepped are not part of any checkpoint. */
    T_CHECK(strata_grad_data(e, 0) != NULL, "no gradient buffer");
    T_OK(strata_grads_ready(e, 0));
    T_OK(strata_release(e, 0));
    T_STATUS(strata_save(e, dir), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "gradients accumulated");
    T_OK(strata_step(e, NULL, NULL));
    T_OK(strata_save(e, dir));
    strata_engine_destroy(e);
}

static void other_model(const synth_opts *o, const strata_config *c, const char *dir)
{
    synth_opts wide = *o;
    wide.width[2] += 8;
    expect_refused(&wide, c, dir, "other model", STRATA_ECORRUPT, "layer1.weight", "different model");
    strata_config fp32 = *c;
    fp32.param_dtype = STRATA_DTYPE_FP32;
    expect_refused(o, &fp32, dir, "other precision", STRATA_ECONFIG, "BF16", "same precision");
}

static void rotation(const synth_opts *o0, const strata_config *c, const char *scratch)
{
    char root[600], dir[700], latest[800];
    snprintf(root, sizeof root, "%s/rot", scratch);
    mkdir(root, 0755);
    int steps[] = {3, 1, 4, 2};
    for (int i = 0; i < 4; i++) {
        synth_opts o = *o0;
        o.steps = o.save_after = steps[i];
        snprintf(dir, sizeof dir, "%s/run-%c", root, 'a' + i);
        o.save_dir = dir;
        float *w = NULL;
        size_t n;
        T_OK(synth_train(&o, c, &w, &n, NULL, NULL));
        free(w);
    }
    /* fp16 with a loss scale that overflows every step: 5 strata_step calls, no update applied. The newest
     * checkpoint by strata_step calls, though its optimizer step (0) is the lowest. */
    synth_opts o = *o0;
    o.steps = o.save_after = 5;
    snprintf(dir, sizeof dir, "%s/run-0", root);
    o.save_dir = dir;
    strata_config skipping = *c;
    skipping.param_dtype = STRATA_DTYPE_FP16;
    skipping.initial_scale_power = 40;
    float *w = NULL;
    size_t n;
    T_OK(synth_train(&o, &skipping, &w, &n, NULL, NULL));
    free(w);
    strata_checkpoint_info info;
    T_OK(strata_checkpoint_inspect(dir, &info));
    T_CHECK(info.step == 0 && info.iterations == 5, "run-0: step %lld, iterations %lld; want 0 and 5 (every step "
            "skipped)", (long long)info.step, (long long)info.iterations);

    snprintf(dir, sizeof dir, "%s/not-a-checkpoint", root);
    mkdir(dir, 0755);
    T_OK(strata_checkpoint_latest(root, latest, sizeof latest));
    snprintf(dir, sizeof dir, "%s/run-0", root);
    T_EQ_STR(latest, dir);
    int removed = -1;
    T_OK(strata_checkpoint_prune(root, 2, &removed));
    T_EQ_INT(removed, 3);
    const char *expect[] = {"run-0", "run-a", "run-b", "run-c", "run-d", "not-a-checkpoint"};
    bool present[] = {true, false, false, true, false, true};
    for (int i = 0; i < 6; i++) {
        struct stat sb;
        snprintf(dir, sizeof dir, "%s/%s", root, expect[i]);
        T_CHECK((stat(dir, &sb) == 0) == present[i], "after pruning to 2, %s is %s", expect[i],
                present[i] ? "missing" : "still there");
    }
    T_STATUS(strata_checkpoint_prune(root, 0, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "keep_last");
}

/* Where the filesystem has no atomic exchange, a save moves the old checkpoint to ".<name>.old" before renaming
 * the new one in; a crash between the two renames must still leave it loadable under its own name. */
static void between_renames(const synth_opts *o, const strata_config *c, const char *scratch)
{
    char dir[600], old[700];
    snprintf(dir, sizeof dir, "%s/interrupted", scratch);
    snprintf(old, sizeof old, "%s/.interrupted.old", scratch);
    synth_opts so = *o;
    so.steps = so.save_after = 2;
    so.save_dir = dir;
    float *w = NULL;
    size_t n;
    T_OK(synth_train(&so, c, &w, &n, NULL, NULL));
    free(w);
    T_CHECK(rename(dir, old) == 0, "rename %s", dir);
    T_OK(strata_checkpoint_verify(dir));
    strata_engine *e = NULL;
    T_OK(synth_engine(o, c, &e));
    if (e) {
        T_OK(strata_load(e, dir));
        T_OK(strata_step(e, NULL, NULL));
        T_OK(strata_save(e, dir)); /* and the next save completes the replacement */
        strata_engine_destroy(e);
    }
    strata_checkpoint_info info;
    T_OK(strata_checkpoint_inspect(dir, &info));
    T_EQ_INT(info.step, 3);
    struct stat sb;
    T_CHECK(stat(old, &sb) != 0, "the superseded %s is still there", old);
}

int main(void)
{
    t_rng_seed();
    const char *scratch = t_scratch_dir("t_ckpt_corrupt");
    strata_config c = config();
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    char dir[600];
    snprintf(dir, sizeof dir, "%s/ckpt", scratch);
    o.steps = o.save_after = 2; /* > warmup: a delayed update is pending, so every file exists */
    o.save_dir = dir;
    float *w = NULL;
    size_t n;
    T_OK(synth_train(&o, &c, &w, &n, NULL, NULL));
    free(w);
    o.save_dir = NULL;

    strata_checkpoint_info info;
    T_OK(strata_checkpoint_inspect(dir, &info));
    T_EQ_INT(info.step, 2);
    T_EQ_INT(info.iterations, 2);
    T_CHECK(info.pending_update, "no pending update recorded");
    T_EQ_INT(info.tensors, 8 * 5); /* master, m, v, params, params.next for 4 layers x 2 */
    T_EQ_INT(info.param_dtype, STRATA_DTYPE_BF16);
    T_OK(strata_checkpoint_verify(dir));

    for (int i = 0; i < 4; i++)
        flipped_tensor(&o, &c, dir);
    other_model(&o, &c, dir);
    truncated(&o, &c, dir);
    misuse(&o, &c, scratch);
    synth_opts o2 = o;
    o2.steps = o2.save_after = 2;
    o2.save_dir = dir;
    T_OK(synth_train(&o2, &c, &w, &n, NULL, NULL));
    free(w);
    broken_header(&o, &c, dir);
    bad_manifest(&o, &c, dir);
    rotation(&o, &c, scratch);
    between_renames(&o, &c, scratch);
    return t_done();
}
