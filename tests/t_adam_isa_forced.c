/*
 * Proves that STRATA_ISA forces the kernel: each ISA this CPU runs, forced in a child process (the choice
 * is made once per process), is the one strata_adam_isa() reports and gives the reference's bits; an
 * ISA the CPU lacks is refused with STRATA_EUNSUPPORTED and the missing features named, not a crash.
 */
#include <sys/wait.h>
#include <unistd.h>

#include "t_adam_util.h"

static int child(const char *name)
{
    setenv("STRATA_ISA", name, 1);
    adam_isa isa;
    if (!adam_isa_parse(name, &isa))
        return 10;
    const char *got = strata_adam_isa();
    if (!adam_isa_supported(isa)) {
        float x[3] = {0};
        uint16_t g = 0;
        strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.0, true};
        strata_adam_tensors t = {x, x + 1, x + 2, &g, STRATA_DTYPE_BF16, NULL, STRATA_DTYPE_NONE, 1};
        strata_adam_step_args a = {.step = 1};
        strata_status st = strata_adam_step(&hp, &t, &a, NULL);
        printf("%s (unsupported here): %s: %s\n", name, strata_status_name(st), strata_last_error(NULL));
        return got == NULL && st == STRATA_EUNSUPPORTED && strstr(strata_last_error(NULL), "lacks") ? 0 : 11;
    }
    if (!got || strcmp(got, name) != 0)
        return 12;
    size_t n = 5000 + t_rand_range(0, 100);
    ta_state ref, s;
    ta_alloc(&ref, n, STRATA_DTYPE_FP16, STRATA_DTYPE_BF16);
    ta_alloc(&s, n, STRATA_DTYPE_FP16, STRATA_DTYPE_BF16);
    ta_fill_master(&ref);
    ta_fill_grad(&ref, 0, true);
    ta_copy(&s, &ref);
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.1, true};
    adam_consts c;
    adam_consts_init(&c, &hp, 1, 1.0);
    adam_step_ref(&c, &(adam_arrays){ref.master, ref.m, ref.v, ref.grad, ref.param, ref.gd, ref.pd, false}, 0, n);
    strata_adam_tensors t = {s.master, s.m, s.v, s.grad, s.gd, s.param, s.pd, n};
    strata_adam_step_args a = {.step = 1, .threads = 2};
    if (strata_adam_step(&hp, &t, &a, NULL) != STRATA_OK)
        return 13;
    size_t bad = ta_compare(&s, &ref, name);
    printf("%s forced: %zu differences from the reference\n", name, bad);
    return bad ? 14 : 0;
}

int main(void)
{
    t_rng_seed();
    static const char *names[] = {"ref", "avx2", "avx512"};
    for (size_t i = 0; i < 3; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            int rc = child(names[i]);
            fflush(stdout);
            _exit(rc);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "STRATA_ISA=%s: child %s %d", names[i],
                WIFEXITED(status) ? "exited" : "died with signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
    return t_done();
}
