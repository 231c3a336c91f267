/*
 * A save killed at a random point never costs the previous checkpoint: a child process loads the
 * checkpoint, then steps and saves in a loop into the same directory; the parent SIGKILLs it after a
 * random delay, many times. After every kill the directory must verify (every checksum), load, and hold
 * a step no older than the last one seen. Kills that land inside a save (its temporary directory is
 * left behind) are counted: at least one must, or the test proved nothing.
 */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "synth.h"
#include "testlib.h"

static strata_config config(const char *nvme)
{
    strata_config c = synth_config(STRATA_DTYPE_BF16);
    c.device_budget_bytes = 256u << 20;
    c.host_budget_bytes = 2u << 30;
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.delayed_update = true; /* saves find an update pending */
    c.delayed_warmup_steps = 1;
    c.cpu_threads = 1;
    c.aio.block_size = 256 << 10;
    if (nvme)
        synth_use_nvme(&c, nvme, true, true);
    return c;
}

static void child(const synth_opts *o, const strata_config *c, const char *dir)
{
    strata_engine *e = NULL;
    if (synth_engine(o, c, &e) != STRATA_OK || strata_load(e, dir) != STRATA_OK) {
        fprintf(stderr, "child: %s\n", strata_last_error(e));
        _exit(3);
    }
    for (;;) {
        /* Steps without gradients still move the weights (weight decay) and the step count. */
        if (strata_step(e, NULL, NULL) != STRATA_OK || strata_save(e, dir) != STRATA_OK) {
            fprintf(stderr, "child: %s\n", strata_last_error(e));
            _exit(4);
        }
    }
}

int main(void)
{
    t_rng_seed();
    const char *scratch = t_scratch_dir("t_ckpt_crash");
    char dir[400], tmp[500], nvme[400];
    snprintf(dir, sizeof dir, "%s/ckpt", scratch);
    snprintf(tmp, sizeof tmp, "%s/.ckpt.tmp", scratch);
    snprintf(nvme, sizeof nvme, "%s", scratch);
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.layers = 3;
    int w[] = {128, 384, 384, 64};
    memcpy(o.width, w, sizeof w);
    o.steps = o.save_after = 2;
    o.save_dir = dir;
    strata_config c = config(NULL);
    float *weights = NULL;
    size_t n;
    T_OK(synth_train(&o, &c, &weights, &n, NULL, NULL));
    free(weights);
    o.save_dir = NULL;

    const int rounds = 12;
    int mid_save = 0;
    int64_t last_step = 2;
    for (int r = 0; r < rounds && t_failures == 0; r++) {
        strata_config cr = config(r % 2 == 1 ? nvme : NULL);
        pid_t pid = fork();
        if (pid == 0)
            child(&o, &cr, dir);
        T_CHECK(pid > 0, "fork failed");
        struct timespec ts = {0, (long)t_rand_range(30, 400) * 1000000L};
        nanosleep(&ts, NULL);
        int status = 0;
        bool exited_early = waitpid(pid, &status, WNOHANG) == pid;
        if (!exited_early) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        }
        T_CHECK(!exited_early && WIFSIGNALED(status), "round %d: the child ended by itself (status %d)", r, status);
        struct stat sb;
        bool in_save = stat(tmp, &sb) == 0;
        mid_save += in_save;
        strata_checkpoint_info info;
        T_OK(strata_checkpoint_verify(dir));
        T_OK(strata_checkpoint_inspect(dir, &info));
        T_CHECK(info.step >= last_step, "round %d: the checkpoint went back from step %lld to %lld", r,
                (long long)last_step, (long long)info.step);
        printf("round %2d: killed %s; checkpoint at step %lld verifies\n", r, in_save ? "inside a save" : "between saves",
               (long long)info.step);
        last_step = info.step;
        strata_engine *e = NULL;
        T_OK(synth_engine(&o, &cr, &e));
        if (e) {
            T_OK(strata_load(e, dir));
            strata_engine_destroy(e);
        }
    }
    T_CHECK(mid_save > 0, "none of %d kills landed inside a save", rounds);
    T_CHECK(last_step > 2, "the child never completed a save (step still %lld)", (long long)last_step);
    return t_done();
}
