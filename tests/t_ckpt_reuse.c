/*
 * One checkpoint name saved again and again (a trainer's tag "last") holds the newest save every time: five saves
 * of changing weights into the same directory, each loaded by a fresh engine bit-identically. Between them, the
 * states a crash can leave: a stale temporary (partial files, a subdirectory, symbolic links to files and a
 * directory outside it, or a whole previous checkpoint after an exchange whose clean-up was cut short), files a
 * trainer added beside strata's (the PyTorch engine's torch_engine.pt), and the ".old" copy a filesystem without
 * an atomic exchange leaves when a save dies between its two renames. Every save runs once through the exchange
 * and once through that fallback (renameat2 is interposed here to refuse RENAME_EXCHANGE as such a filesystem
 * does). What the links point to must survive every removal.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "synth.h"
#include "testlib.h"

static bool no_exchange; /* this process's renameat2 answers RENAME_EXCHANGE with EINVAL */
static int exchanges_refused;

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags)
{
    if (no_exchange && (flags & RENAME_EXCHANGE)) {
        exchanges_refused++;
        errno = EINVAL;
        return -1;
    }
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

static size_t total_numel(const synth_opts *o)
{
    size_t n = 0;
    for (int l = 0; l < o->layers; l++)
        n += (size_t)o->width[l + 1] * o->width[l] + (size_t)o->width[l + 1];
    return n;
}

/* Every master weight in parameter-id order (synth_engine adds "weight" then "bias" of each layer). */
static float *read_all(strata_engine *e, const synth_opts *o)
{
    float *w = malloc(total_numel(o) * sizeof *w);
    size_t pos = 0;
    T_OK(strata_sync(e));
    for (int l = 0; l < o->layers && w; l++) {
        size_t nw = (size_t)o->width[l + 1] * o->width[l], nb = (size_t)o->width[l + 1];
        T_OK(strata_param_read_master(e, (strata_param_id)(2 * l), 0, nw, w + pos));
        T_OK(strata_param_read_master(e, (strata_param_id)(2 * l + 1), 0, nb, w + pos + nw));
        pos += nw + nb;
    }
    return w;
}

static bool exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    T_CHECK(f != NULL, "creating \"%s\": %s", path, strerror(errno));
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A fresh engine of other initial weights loads dir: it must hold want exactly. */
static void expect_loads(const synth_opts *o, const strata_config *c, const char *dir, const float *want,
                         const char *when)
{
    synth_opts other = *o;
    other.seed = o->seed + 1;
    strata_engine *e = NULL;
    T_OK(synth_engine(&other, c, &e));
    if (!e)
        return;
    strata_status st = strata_load(e, dir);
    T_CHECK(st == STRATA_OK, "%s: strata_load(\"%s\"): %s: %s", when, dir, strata_status_name(st),
            strata_last_error(e));
    float *got = read_all(e, o);
    size_t n = total_numel(o), first, d = got ? synth_count_diff(want, got, n, &first) : n;
    T_CHECK(d == 0, "%s: %zu of %zu loaded weights differ from the last save's; first at %zu: %.9g (loaded) vs %.9g "
            "(saved)", when, d, n, first, got && first < n ? (double)got[first] : 0.0,
            first < n ? (double)want[first] : 0.0);
    free(got);
    strata_engine_destroy(e);
}

int main(void)
{
    t_rng_seed();
    const char *scratch = t_scratch_dir("t_ckpt_reuse");
    char dir[400], tmp[420], old[420], other[420], keep_file[420], keep_dir[420], keep_inner[440];
    snprintf(dir, sizeof dir, "%s/last", scratch);
    snprintf(tmp, sizeof tmp, "%s/.last.tmp", scratch);
    snprintf(old, sizeof old, "%s/.last.old", scratch);
    snprintf(other, sizeof other, "%s/other", scratch);
    snprintf(keep_file, sizeof keep_file, "%s/keep.txt", scratch);
    snprintf(keep_dir, sizeof keep_dir, "%s/keep.d", scratch);
    snprintf(keep_inner, sizeof keep_inner, "%s/inner.txt", keep_dir);
    write_file(keep_file, "not strata's\n");
    T_CHECK(mkdir(keep_dir, 0755) == 0, "mkdir \"%s\": %s", keep_dir, strerror(errno));
    write_file(keep_inner, "not strata's either\n");

    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.delayed_update = false;
    strata_engine *e = NULL;
    T_OK(synth_engine(&o, &c, &e));
    if (!e)
        return t_done();
    size_t n = total_numel(&o);
    float *prev = read_all(e, &o);
    const int rounds = 10;
    for (int r = 0; r < rounds && t_failures == 0; r++) {
        no_exchange = r % 2 == 1;
        char what[120], path[520];
        snprintf(what, sizeof what, "save %d (%s)", r + 1, no_exchange ? "rename aside" : "exchange");
        switch (r / 2) {
        case 1: /* a crashed save's partial temporary, with links that lead out of it */
            T_CHECK(mkdir(tmp, 0755) == 0, "mkdir \"%s\": %s", tmp, strerror(errno));
            snprintf(path, sizeof path, "%s/model.safetensors", tmp);
            write_file(path, "partial");
            snprintf(path, sizeof path, "%s/sub", tmp);
            T_CHECK(mkdir(path, 0755) == 0, "mkdir \"%s\": %s", path, strerror(errno));
            snprintf(path, sizeof path, "%s/sub/deeper.txt", tmp);
            write_file(path, "x");
            snprintf(path, sizeof path, "%s/link-file", tmp);
            T_CHECK(symlink(keep_file, path) == 0, "symlink \"%s\": %s", path, strerror(errno));
            snprintf(path, sizeof path, "%s/link-dir", tmp);
            T_CHECK(symlink(keep_dir, path) == 0, "symlink \"%s\": %s", path, strerror(errno));
            break;
        case 2: /* a trainer's files beside strata's in the checkpoint being replaced */
            snprintf(path, sizeof path, "%s/torch_engine.pt", dir);
            write_file(path, "the trainer's state");
            snprintf(path, sizeof path, "%s/extra", dir);
            T_CHECK(mkdir(path, 0755) == 0, "mkdir \"%s\": %s", path, strerror(errno));
            snprintf(path, sizeof path, "%s/extra/link-dir", dir);
            T_CHECK(symlink(keep_dir, path) == 0, "symlink \"%s\": %s", path, strerror(errno));
            break;
        case 3: /* an exchange done, its clean-up cut short: a whole older checkpoint at the temporary name */
            T_OK(strata_save(e, other));
            T_CHECK(rename(other, tmp) == 0, "rename to \"%s\": %s", tmp, strerror(errno));
            expect_loads(&o, &c, dir, prev, "with a complete checkpoint at the temporary name");
            break;
        case 4: /* killed between the fallback's two renames: the checkpoint only at ".old" */
            T_CHECK(rename(dir, old) == 0, "rename to \"%s\": %s", old, strerror(errno));
            expect_loads(&o, &c, dir, prev, "with the checkpoint at .old only");
            break;
        }
        /* Steps without gradients still move the weights (weight decay) and the step count. */
        T_OK(strata_step(e, NULL, NULL));
        float *now = read_all(e, &o);
        size_t first, d = synth_count_diff(prev, now, n, &first);
        T_CHECK(d > n / 2, "%s: the step changed only %zu of %zu weights (the saves would not be told apart)", what,
                d, n);
        int refused = exchanges_refused;
        strata_status st = strata_save(e, dir);
        T_CHECK(st == STRATA_OK, "%s: strata_save(\"%s\"): %s: %s", what, dir, strata_status_name(st),
                strata_last_error(e));
        if (no_exchange)
            T_CHECK(exchanges_refused > refused, "%s: the save never asked for RENAME_EXCHANGE (%d refusals)", what,
                    exchanges_refused);
        T_CHECK(!exists(tmp) && !exists(old), "%s: left %s%s behind", what, exists(tmp) ? tmp : "",
                exists(old) ? old : "");
        snprintf(path, sizeof path, "%s/torch_engine.pt", dir);
        T_CHECK(!exists(path), "%s: the replaced checkpoint's %s is still there", what, path);
        T_CHECK(exists(keep_file) && exists(keep_inner), "%s: a removal followed a link: %s %s, %s %s", what,
                keep_file, exists(keep_file) ? "exists" : "is gone", keep_inner,
                exists(keep_inner) ? "exists" : "is gone");
        T_CHECK(strata_checkpoint_verify(dir) == STRATA_OK, "%s: strata_checkpoint_verify: %s", what,
                strata_last_error(NULL));
        expect_loads(&o, &c, dir, now, what);
        free(prev);
        prev = now;
    }
    no_exchange = false;
    free(prev);
    strata_engine_destroy(e);
    t_scratch_cleanup();
    return t_done();
}
