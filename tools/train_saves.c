/* The checkpoints of a `strata train` run (see train_saves.h). */
#include "tools/train_saves.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "base/size.h"
#include "engine/ckpt/ckpt_root.h"
#include "tools/train_msg.h"

int train_saves_open(train_saves *sv, const char *root, int keep, strata_comm *comm)
{
    memset(sv, 0, sizeof *sv);
    sv->root = root;
    sv->keep = keep;
    sv->lock_fd = -1;
    sv->last_saved = -1;
    if (!root)
        return 0;
    /* Every rank writes its files under root, so every rank checks it; one process of the run holds the lock. */
    strata_status st = ckpt_root_check(root, "--save");
    if (st == STRATA_OK && strata_comm_rank(comm) == 0)
        st = ckpt_root_lock(root, "--save", &sv->lock_fd);
    if (st == STRATA_OK && strata_comm_rank(comm) == 0)
        st = ckpt_root_clean(root, NULL);
    if (st != STRATA_OK)
        train_err("%s", strata_last_error(NULL));
    double bad = st != STRATA_OK;
    if (strata_comm_size(comm) > 1 && strata_comm_allreduce_sum(comm, &bad, 1) != STRATA_OK) {
        train_err("agreeing on the --save directory (strata_comm_allreduce_sum) failed: %s", strata_last_error(NULL));
        bad = 1;
    }
    if (bad == 0)
        return 0;
    if (st == STRATA_OK)
        train_err("--save \"%s\": another rank cannot use it (its error says why)", root);
    ckpt_root_unlock(sv->lock_fd);
    sv->lock_fd = -1;
    return 2;
}

static const char *free_space(const char *root, char *buf, size_t len)
{
    struct statvfs vs;
    if (statvfs(root, &vs) != 0)
        return "unknown";
    return size_format((uint64_t)vs.f_bavail * vs.f_frsize, buf, len);
}

strata_status train_saves_save(train_saves *sv, strata_engine *e, int64_t step)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%" PRId64, sv->root, step);
    sv->attempts++;
    strata_status st = strata_save(e, path);
    if (st == STRATA_ENOSPC) {
        if (sv->failed < TRAIN_SAVES_LISTED)
            sv->failed_steps[sv->failed] = step;
        sv->failed++;
        char free_b[32], last[64] = "none yet";
        if (sv->last_saved >= 0)
            snprintf(last, sizeof last, "step-%" PRId64, sv->last_saved);
        if (train_msg_root())
            train_err("warning: saving %s failed, the disk is full (%s free on \"%s\"): %s; training goes on and the "
                      "next save tries again; the last checkpoint (%s) is intact", path,
                      free_space(sv->root, free_b, sizeof free_b), sv->root, strata_last_error(e), last);
        return STRATA_OK;
    }
    if (st != STRATA_OK) {
        train_err("saving %s failed: %s", path, strata_last_error(e));
        return st;
    }
    sv->last_saved = step;
    if (!train_msg_root())
        return STRATA_OK; /* with several ranks, rank 0 reports and rotates: the directories are shared */
    printf("checkpoint: %s\n", path);
    fflush(stdout);
    /* The checkpoint is safe on disk: a rotation that fails costs disk space, not the run. */
    if (strata_checkpoint_prune(sv->root, sv->keep, NULL) != STRATA_OK)
        train_err("warning: removing checkpoints older than the last --keep %d in \"%s\" failed: %s", sv->keep,
                  sv->root, strata_last_error(NULL));
    return STRATA_OK;
}

int train_saves_close(train_saves *sv)
{
    ckpt_root_unlock(sv->lock_fd);
    sv->lock_fd = -1;
    if (!sv->failed)
        return 0;
    if (train_msg_root()) {
        char steps[TRAIN_SAVES_LISTED * 24] = "", last[64] = "no checkpoint was written";
        for (int i = 0; i < sv->failed && i < TRAIN_SAVES_LISTED; i++) {
            size_t n = strlen(steps);
            snprintf(steps + n, sizeof steps - n, "%s%" PRId64, i ? ", " : "", sv->failed_steps[i]);
        }
        if (sv->last_saved >= 0)
            snprintf(last, sizeof last, "the latest checkpoint is step-%" PRId64, sv->last_saved);
        train_err("%d of %d checkpoint saves failed, the disk was full (step%s %s%s); %s in \"%s\" — free space "
                  "there and --resume from it", sv->failed, sv->attempts, sv->failed == 1 ? "" : "s", steps,
                  sv->failed > TRAIN_SAVES_LISTED ? ", ..." : "", last, sv->root);
    }
    return 1;
}
