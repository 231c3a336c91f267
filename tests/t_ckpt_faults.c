/*
 * Faults around checkpoints and steps:
 *  - a full filesystem during a save (a small tmpfs mounted by the test; root only, else that part is
 *    skipped with its reason): STRATA_ENOSPC naming the file and errno, the previous checkpoint still
 *    verifies with its old step, the temporary directory is gone, and the engine trains and saves on;
 *  - an I/O error injected into the NVMe tier during a step (immediate and delayed update): the step fails
 *    naming the swap file and errno, the engine can still save and be destroyed, and the checkpoint written
 *    before the fault still verifies and loads;
 *  - a short transfer injected during a step is finished by the NVMe layer: the weights equal a clean run's.
 * (A step cannot run out of space: the swap files are preallocated when the engine is finalized, where a
 * full disk is refused up front — tests/t_nvme_enospc.c.)
 */
#include <errno.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "nvme/fault.h"
#include "synth.h"
#include "testlib.h"

static strata_config config(const char *nvme, bool delayed)
{
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.delayed_update = delayed;
    c.delayed_warmup_steps = 1;
    c.cpu_threads = 1;
    if (nvme)
        synth_use_nvme(&c, nvme, true, true);
    return c;
}

static uint64_t free_bytes(const char *path)
{
    struct statvfs vs;
    return statvfs(path, &vs) == 0 ? (uint64_t)vs.f_bavail * vs.f_frsize : 0;
}

static void full_disk(const char *scratch)
{
    char mnt[400], dir[500], tmp[500], elsewhere[500];
    snprintf(mnt, sizeof mnt, "%s/small", scratch);
    mkdir(mnt, 0700);
    if (geteuid() != 0) {
        printf("skipped the full-disk part: needs root to mount a small tmpfs\n");
        return;
    }
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m,mode=0700") != 0) {
        printf("skipped the full-disk part: cannot mount a tmpfs at %s: %s\n", mnt, strerror(errno));
        return;
    }
    snprintf(dir, sizeof dir, "%s/ckpt", mnt);
    snprintf(tmp, sizeof tmp, "%s/.ckpt.tmp", mnt);
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", scratch);
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.layers = 2;
    int w[] = {96, 256, 96}; /* about 50 K elements: a checkpoint of ~600 KiB, two do not fit in 1 MiB */
    memcpy(o.width, w, sizeof w);
    strata_config c = config(NULL, false);
    strata_engine *e = NULL;
    T_OK(synth_engine(&o, &c, &e));
    if (!e)
        goto out;
    T_OK(strata_step(e, NULL, NULL));
    T_OK(strata_save(e, dir));
    uint64_t before = free_bytes(mnt);
    T_OK(strata_step(e, NULL, NULL));
    T_STATUS(strata_save(e, dir), STRATA_ENOSPC);
    T_CONTAINS(strata_last_error(e), "No space left on device (ENOSPC)");
    T_CONTAINS(strata_last_error(e), tmp);
    T_CONTAINS(strata_last_error(e), "previous checkpoint");
    struct stat sb;
    T_CHECK(stat(tmp, &sb) != 0, "the failed save left %s behind", tmp);
    T_EQ_INT(free_bytes(mnt), before);
    strata_checkpoint_info info;
    T_OK(strata_checkpoint_verify(dir));
    T_OK(strata_checkpoint_inspect(dir, &info));
    T_EQ_INT(info.step, 1);
    /* The engine is unharmed: it trains on and saves where there is room. */
    T_OK(strata_step(e, NULL, NULL));
    T_OK(strata_save(e, elsewhere));
    T_OK(strata_checkpoint_inspect(elsewhere, &info));
    T_EQ_INT(info.step, 3);
    strata_engine_destroy(e);
out:
    if (umount(mnt) != 0)
        fprintf(stderr, "warning: umount %s: %s\n", mnt, strerror(errno));
}

static void io_error_in_step(const char *scratch, bool delayed)
{
    char dir[500], after[500];
    snprintf(dir, sizeof dir, "%s/before-fault", scratch);
    snprintf(after, sizeof after, "%s/after-fault", scratch);
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    strata_config c = config(scratch, delayed);
    strata_engine *e = NULL;
    T_OK(synth_engine(&o, &c, &e));
    if (!e)
        return;
    T_OK(strata_step(e, NULL, NULL));
    T_OK(strata_step(e, NULL, NULL));
    T_OK(strata_save(e, dir));
    strata_checkpoint_info good;
    T_OK(strata_checkpoint_inspect(dir, &good));
    nvme_fault_inject(t_rand_range(1, 4), NVME_FAULT_EIO);
    strata_status st = strata_step(e, NULL, NULL);
    /* The update ran on the optimizer thread (delayed), or its write-back is still in flight when the step
     * returns: the failure shows at the join, or when strata_sync waits for the drive. */
    if (st == STRATA_OK)
        st = strata_sync(e);
    nvme_fault_inject(0, NVME_FAULT_NONE);
    T_CHECK(st == STRATA_EIO, "%s: the step with an injected I/O error returned %s (%s)", delayed ? "delayed" : "plain",
            strata_status_name(st), strata_last_error(e));
    T_CONTAINS(strata_last_error(e), "Input/output error (EIO)");
    T_CONTAINS(strata_last_error(e), scratch);
    if (delayed)
        T_CONTAINS(strata_last_error(e), "delayed optimizer step");
    /* Still able to save (what it holds now) and to be destroyed cleanly. */
    T_OK(strata_save(e, after));
    strata_engine_destroy(e);
    /* What was written before the fault is intact. */
    strata_checkpoint_info info;
    T_OK(strata_checkpoint_verify(dir));
    T_OK(strata_checkpoint_inspect(dir, &info));
    T_EQ_INT(info.step, good.step);
    e = NULL;
    T_OK(synth_engine(&o, &c, &e));
    if (e) {
        T_OK(strata_load(e, dir));
        T_OK(strata_step(e, NULL, NULL));
        strata_engine_destroy(e);
    }
}

/* A short transfer is not an error: the NVMe layer finishes the remainder, and the step's result is
 * bit-identical to a run without the fault (the oracle: the same steps on a second engine). */
static void short_io_in_step(const char *scratch)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    strata_config c = config(scratch, false);
    strata_engine *clean = NULL, *faulty = NULL;
    T_OK(synth_engine(&o, &c, &clean));
    T_OK(synth_engine(&o, &c, &faulty));
    if (!clean || !faulty)
        goto out;
    for (int s = 0; s < 3; s++) {
        T_OK(strata_step(clean, NULL, NULL));
        nvme_fault_inject(t_rand_range(1, 6), NVME_FAULT_SHORT);
        T_OK(strata_step(faulty, NULL, NULL));
        nvme_fault_inject(0, NVME_FAULT_NONE);
    }
    size_t n = (size_t)o.width[1] * o.width[0];
    float *a = malloc(n * 4), *b = malloc(n * 4);
    T_OK(strata_param_read_master(clean, 0, 0, n, a));
    T_OK(strata_param_read_master(faulty, 0, 0, n, b));
    size_t first, d = synth_count_diff(a, b, n, &first);
    T_CHECK(d == 0, "short transfers changed %zu of %zu weights; first at %zu: %.9g vs %.9g", d, n, first,
            first < n ? (double)a[first] : 0.0, first < n ? (double)b[first] : 0.0);
    free(a);
    free(b);
out:
    strata_engine_destroy(clean);
    strata_engine_destroy(faulty);
}

int main(void)
{
    t_rng_seed();
    const char *scratch = t_scratch_dir("t_ckpt_faults");
    io_error_in_step(scratch, false);
    io_error_in_step(scratch, true);
    short_io_in_step(scratch);
    full_disk(scratch);
    return t_done();
}
