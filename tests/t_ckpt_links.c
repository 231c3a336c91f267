/*
 * Removing checkpoint directories never follows a symbolic link: ckpt_dir_remove of a link (also spelled with a
 * trailing slash, which makes the kernel resolve it) removes the link and leaves its target's files; the rotation
 * (strata_checkpoint_prune) neither counts nor removes a link ROOT/step-0 -> elsewhere; the run-start clean-up
 * (ckpt_root_clean) removes only directories named like a save's staging directory, keeps a link of that name and
 * everything else, and says what it removed; strata_save to "ROOT/step-9/" where step-9 is a link to a checkpoint
 * elsewhere replaces the link with the new checkpoint and leaves the link's target a whole, verifiable checkpoint.
 * The lock: a second holder is refused naming this pid; a filesystem whose flock answers ENOLCK (interposed here)
 * gets no lock and a warning instead of a refused run.
 * The oracle is the directory listing before and after (and the target's verify and step).
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/ckpt/ckpt_files.h"
#include "engine/ckpt/ckpt_root.h"
#include "synth.h"
#include "testlib.h"

static bool no_locks; /* this process's flock answers ENOLCK, as a filesystem without locks does */

int flock(int fd, int op)
{
    if (no_locks) {
        errno = ENOLCK;
        return -1;
    }
    return (int)syscall(SYS_flock, fd, op);
}

static char warned[4096]; /* the warnings logged since the last reset, one per line */

static void on_log(strata_log_level level, const char *subsystem, const char *message, void *user)
{
    (void)subsystem;
    (void)user;
    size_t n = strlen(warned);
    if (level == STRATA_LOG_WARN)
        snprintf(warned + n, sizeof warned - n, "%s\n", message);
}

static void put(const char *dir, const char *name, const char *text)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    T_CHECK(f != NULL, "cannot create %s: %s", path, strerror(errno));
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static bool exists(const char *dir, const char *name)
{
    char path[600];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &sb) == 0;
}

/* A minimal checkpoint directory: a manifest the rotation accepts (version 1, one tiny tensor) and its file. */
static void fake_checkpoint(const char *dir, int step)
{
    T_CHECK(mkdir(dir, 0755) == 0, "mkdir %s: %s", dir, strerror(errno));
    char text[512];
    snprintf(text, sizeof text, "{\"format\": \"strata-checkpoint\", \"version\": 1, \"step\": %d, \"iterations\": %d, "
             "\"steps\": %d, \"skipped_steps\": 0, \"loss_scale\": \"0x1p+0\", \"good_steps\": 0, \"hysteresis_left\": "
             "2, \"param_dtype\": \"F32\", \"pending_update\": null, \"files\": {\"model.safetensors\": 8}, "
             "\"tensors\": []}", step, step, step);
    put(dir, "manifest.json", text);
    put(dir, "model.safetensors", "12345678");
}

int main(void)
{
    const char *s = t_scratch_dir("t_ckpt_links");
    char root[400], elsewhere[400], link[500], slash[520];
    snprintf(root, sizeof root, "%s/root", s);
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", s);
    T_CHECK(mkdir(root, 0755) == 0, "mkdir %s", root);
    fake_checkpoint(elsewhere, 0);

    /* ckpt_dir_remove of a link, with and without a trailing slash: the link goes, the target's files stay. */
    for (int trailing = 0; trailing < 2; trailing++) {
        snprintf(link, sizeof link, "%s/step-0", root);
        T_CHECK(symlink(elsewhere, link) == 0, "symlink %s: %s", link, strerror(errno));
        snprintf(slash, sizeof slash, "%s%s", link, trailing ? "/" : "");
        T_EQ_INT(ckpt_dir_remove(slash), 0);
        T_CHECK(!exists(root, "step-0"), "ckpt_dir_remove(\"%s\") left the link", slash);
        T_CHECK(exists(elsewhere, "manifest.json") && exists(elsewhere, "model.safetensors"),
                "ckpt_dir_remove(\"%s\") removed files in the link's target %s", slash, elsewhere);
    }

    /* Rotation keeps a link ROOT/step-0 and its target, and removes the oldest real checkpoints only. */
    T_CHECK(symlink(elsewhere, link) == 0, "symlink %s", link);
    char dir[500];
    for (int step = 1; step <= 3; step++) {
        snprintf(dir, sizeof dir, "%s/step-%d", root, step);
        fake_checkpoint(dir, step);
    }
    int removed = -1;
    T_OK(strata_checkpoint_prune(root, 1, &removed));
    T_EQ_INT(removed, 2);
    T_CHECK(exists(root, "step-0") && exists(root, "step-3") && !exists(root, "step-1") && !exists(root, "step-2"),
            "rotation with --keep 1: expected step-0 (a link) and step-3 to remain, and only them");
    T_CHECK(exists(elsewhere, "manifest.json") && exists(elsewhere, "model.safetensors"),
            "rotation removed files in the link's target %s", elsewhere);

    /* The run-start clean-up: a staging directory goes; a link named like one, other hidden names stay. */
    char stale[500], other[500], lk[500];
    snprintf(stale, sizeof stale, "%s/.step-7.tmp", root);
    snprintf(other, sizeof other, "%s/.step-x.tmp", root);
    snprintf(lk, sizeof lk, "%s/.step-8.tmp", root);
    fake_checkpoint(stale, 7);
    T_CHECK(mkdir(other, 0755) == 0, "mkdir %s", other);
    T_CHECK(symlink(elsewhere, lk) == 0, "symlink %s", lk);
    warned[0] = '\0';
    strata_log_set_callback(on_log, NULL);
    T_OK(ckpt_root_clean(root, &removed));
    strata_log_set_callback(NULL, NULL);
    T_EQ_INT(removed, 1);
    T_CONTAINS(warned, "removed \"");
    T_CONTAINS(warned, "/.step-7.tmp\", the staging directory of a save that was interrupted");
    T_CONTAINS(warned, "/.step-8.tmp\": it has the name of a save's staging directory but is a symbolic link");
    T_CHECK(!exists(root, ".step-7.tmp"), "ckpt_root_clean left %s", stale);
    T_CHECK(exists(root, ".step-x.tmp") && exists(root, ".step-8.tmp") && exists(root, "step-3"),
            "ckpt_root_clean removed something that is not a staging directory");
    T_CHECK(exists(elsewhere, "manifest.json") && exists(elsewhere, "model.safetensors"),
            "ckpt_root_clean removed files in %s", elsewhere);

    /* strata_save through "link/": the link is replaced, its target stays whole. */
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    strata_engine *e = NULL;
    T_OK(synth_engine(&o, &c, &e));
    char target[500], via[520];
    snprintf(target, sizeof target, "%s/target", s);
    snprintf(link, sizeof link, "%s/step-9", root);
    snprintf(via, sizeof via, "%s/", link);
    if (e) {
        T_OK(strata_step(e, NULL, NULL));
        T_OK(strata_save(e, target));
        T_CHECK(symlink(target, link) == 0, "symlink %s", link);
        T_OK(strata_step(e, NULL, NULL));
        T_OK(strata_save(e, via));
        struct stat sb;
        T_CHECK(lstat(link, &sb) == 0 && S_ISDIR(sb.st_mode), "strata_save(\"%s\") did not leave a directory there", via);
        strata_checkpoint_info info;
        T_OK(strata_checkpoint_verify(target));
        T_OK(strata_checkpoint_inspect(target, &info));
        T_EQ_INT(info.step, 1);
        T_OK(strata_checkpoint_inspect(link, &info));
        T_EQ_INT(info.step, 2);
    }
    strata_engine_destroy(e);

    /* The lock: a second lock on the root by this process's other descriptor is refused, naming the holder. */
    int fd1 = -1, fd2 = -1;
    T_OK(ckpt_root_lock(root, "--save", &fd1));
    T_STATUS(ckpt_root_lock(root, "--save", &fd2), STRATA_EBUSY);
    char want[64];
    snprintf(want, sizeof want, "in use by another run (pid %ld on host ", (long)getpid());
    T_CONTAINS(strata_last_error(NULL), want);
    T_EQ_INT(fd2, -1);
    ckpt_root_unlock(fd1);
    T_OK(ckpt_root_lock(root, "--save", &fd2));
    ckpt_root_unlock(fd2);
    no_locks = true;
    fd2 = 7;
    warned[0] = '\0';
    strata_log_set_callback(on_log, NULL);
    T_OK(ckpt_root_lock(root, "--save", &fd2));
    strata_log_set_callback(NULL, NULL);
    T_EQ_INT(fd2, -1);
    T_CONTAINS(warned, "the filesystem cannot lock .strata.lock (No locks available (ENOLCK)): a second run on this "
                       "root would not be refused");
    no_locks = false;

    t_scratch_cleanup();
    return t_done();
}
