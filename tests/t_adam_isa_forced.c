/*
 * Proves that STRATA_ISA forces the kernel: each ISA this CPU runs, forced in a child process (the choice
 * is made once per process), is the one strata_adam_isa() reports and gives the reference's bits; an
 * ISA the CPU lacks is refused with STRATA_EUNSUPPORTED and the missing features named, not a crash.
 */
#include <sys/wait.h>
#include <unistd.h>

#include "t_adam_util.h"

/* A child's exit status says what failed; the parent prints the meaning (the child prints the values). */
enum {
    CHILD_OK = 0,
    CHILD_BAD_NAME = 10,
    CHILD_REPORTED_UNSUPPORTED,
    CHILD_NOT_REFUSED,
    CHILD_REFUSAL_UNNAMED,
    CHILD_NOT_FORCED,
    CHILD_STEP_FAILED,
    CHILD_MISMATCH,
};

static const char *child_failure(int code)
{
    switch (code) {
    case CHILD_BAD_NAME: return "adam_isa_parse does not know the ISA name";
    case CHILD_REPORTED_UNSUPPORTED: return "strata_adam_isa() reported an ISA this CPU lacks instead of NULL";
    case CHILD_NOT_REFUSED: return "strata_adam_step ran with an ISA this CPU lacks instead of STRATA_EUNSUPPORTED";
    case CHILD_REFUSAL_UNNAMED: return "the refusal does not name the missing features (\"lacks\")";
    case CHILD_NOT_FORCED: return "strata_adam_isa() is not the forced ISA";
    case CHILD_STEP_FAILED: return "strata_adam_step failed";
    case CHILD_MISMATCH: return "result mismatch vs reference";
    default: return "unknown exit code";
    }
}

static int unsupported_child(const char *name, const char *got)
{
    float x[3] = {0};
    uint16_t g = 0;
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.0, true, STRATA_ADAM_MUL_ADD};
    strata_adam_tensors t = {x, x + 1, x + 2, &g, STRATA_DTYPE_BF16, NULL, STRATA_DTYPE_NONE, 1};
    strata_adam_step_args a = {.step = 1};
    strata_status st = strata_adam_step(&hp, &t, &a, NULL);
    printf("%s (unsupported here): strata_adam_isa() = %s; strata_adam_step: %s: %s\n", name, got ? got : "NULL",
           strata_status_name(st), strata_last_error(NULL));
    if (got)
        return CHILD_REPORTED_UNSUPPORTED;
    if (st != STRATA_EUNSUPPORTED)
        return CHILD_NOT_REFUSED;
    return strstr(strata_last_error(NULL), "lacks") ? CHILD_OK : CHILD_REFUSAL_UNNAMED;
}

static int child(const char *name)
{
    setenv("STRATA_ISA", name, 1);
    adam_isa isa;
    if (!adam_isa_parse(name, &isa))
        return CHILD_BAD_NAME;
    const char *got = strata_adam_isa();
    if (!adam_isa_supported(isa))
        return unsupported_child(name, got);
    if (!got || strcmp(got, name) != 0) {
        printf("STRATA_ISA=%s: strata_adam_isa() = %s (%s)\n", name, got ? got : "NULL", strata_last_error(NULL));
        return CHILD_NOT_FORCED;
    }
    size_t n = 5000 + t_rand_range(0, 100);
    ta_state ref, s;
    ta_alloc(&ref, n, STRATA_DTYPE_FP16, STRATA_DTYPE_BF16);
    ta_alloc(&s, n, STRATA_DTYPE_FP16, STRATA_DTYPE_BF16);
    ta_fill_master(&ref);
    ta_fill_grad(&ref, 0, true);
    ta_copy(&s, &ref);
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.1, true, STRATA_ADAM_MUL_ADD};
    adam_consts c;
    adam_consts_init(&c, &hp, 1, 1.0);
    adam_step_ref(&c, &(adam_arrays){ref.master, ref.m, ref.v, ref.grad, ref.param, ref.gd, ref.pd, false}, 0, n);
    strata_adam_tensors t = {s.master, s.m, s.v, s.grad, s.gd, s.param, s.pd, n};
    strata_adam_step_args a = {.step = 1, .threads = 2};
    strata_status st = strata_adam_step(&hp, &t, &a, NULL);
    if (st != STRATA_OK) {
        printf("STRATA_ISA=%s: strata_adam_step: %s: %s\n", name, strata_status_name(st), strata_last_error(NULL));
        return CHILD_STEP_FAILED;
    }
    size_t bad = ta_compare(&s, &ref, name);
    printf("%s forced: %zu differences from the reference\n", name, bad);
    return bad ? CHILD_MISMATCH : CHILD_OK;
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
        if (WIFEXITED(status))
            T_CHECK(WEXITSTATUS(status) == CHILD_OK, "child STRATA_ISA=%s: exited %d = %s", names[i],
                    WEXITSTATUS(status), child_failure(WEXITSTATUS(status)));
        else
            T_CHECK(0, "child STRATA_ISA=%s: died with signal %d (%s)", names[i], WTERMSIG(status),
                    strsignal(WTERMSIG(status)));
    }
    return t_done();
}
