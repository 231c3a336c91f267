/*
 * The Adam driver binds thread t of a team to the t-th core of the set the starting thread gave it
 * (adam_cores_use), and gives the starting thread its binding back: a one-core set puts every thread of a team on
 * that core, a two-core set alternates them, and the default (no set) uses the cores this process may run on, as
 * many as adam_default_threads says. Each tile's callback reads its thread's affinity (sched_getaffinity), so the
 * test sees the binding itself, not the driver's account of it. Skips where there are fewer than 2 cores or the
 * binding cannot be set (a container that forbids it).
 */
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_adam/adam.h"
#include "cpu_adam/driver.h"
#include "testlib.h"

#define TEAM 4
#define TILES (2 * TEAM)

typedef struct seen {
    cpu_set_t mask[TEAM];
    bool have[TEAM];
} seen;

static void on_tile(size_t offset, size_t numel, void *user)
{
    (void)offset, (void)numel;
    seen *s = user;
    int t = omp_get_thread_num();
    if (t < 0 || t >= TEAM)
        return;
    /* Thread t runs tiles t and t + TEAM (static schedule, chunk 1): both read the same binding. */
    cpu_set_t m;
    CPU_ZERO(&m);
    sched_getaffinity(0, sizeof m, &m);
    s->mask[t] = m;
    s->have[t] = true;
}

/* One step of TILES tiles over TEAM threads with the calling thread's Adam cores `set` (NULL: the default). */
static void run(const adam_cores *set, seen *s)
{
    memset(s, 0, sizeof *s);
    size_t n = TILES * ADAM_TILE_ALIGN;
    float *a = calloc(4 * n, sizeof *a);
    T_CHECK(a != NULL, "out of memory");
    if (!a)
        return;
    strata_adam_hparams hp = {STRATA_OPTIMIZER_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, STRATA_ADAM_MUL_ADD};
    adam_job job = {.numel = n, .threads = TEAM, .tile_numel = ADAM_TILE_ALIGN, .on_tile = on_tile, .on_tile_user = s,
                    .arrays = {a, a + n, a + 2 * n, a + 3 * n, NULL, STRATA_DTYPE_FP32, STRATA_DTYPE_NONE, false}};
    T_OK(adam_ops_default(&job.ops));
    adam_consts_init(&job.consts, &hp, 1, 1.0);
    const adam_cores *prev = adam_cores_use(set);
    T_OK(adam_run_step(&job));
    adam_cores_use(prev);
    free(a);
}

static bool same(const cpu_set_t *a, const cpu_set_t *b)
{
    return CPU_EQUAL(a, b);
}

static bool disjoint(const cpu_set_t *a, const cpu_set_t *b)
{
    cpu_set_t both;
    CPU_AND(&both, a, b);
    return CPU_COUNT(&both) == 0;
}

int main(void)
{
    adam_cores all;
    adam_cores_allowed(-1, &all);
    T_CHECK(all.count == 0 || all.count == adam_default_threads(),
            "the default thread count %d is not the %d cores this process may run on", adam_default_threads(),
            all.count);
    if (all.count < 2)
        t_skip("%d core(s) this process may run on: a team cannot be spread over two", all.count);
    cpu_set_t before, after;
    sched_getaffinity(0, sizeof before, &before);

    /* One core: every thread of the team on it. */
    adam_cores one = {.count = 1, .index = {all.index[all.count - 1]}};
    seen s1;
    run(&one, &s1);
    if (!s1.have[0] || same(&s1.mask[0], &before))
        t_skip("the Adam threads could not be bound to one core here (thread 0 kept the process's affinity)");
    for (int t = 1; t < TEAM; t++)
        T_CHECK(s1.have[t] && same(&s1.mask[t], &s1.mask[0]), "one-core set {%d}: thread %d is not bound where "
                "thread 0 is", one.index[0], t);

    /* Two cores, the first and the last: threads alternate between them, which do not overlap. */
    adam_cores two = {.count = 2, .index = {all.index[0], all.index[all.count - 1]}};
    seen s2;
    run(&two, &s2);
    for (int t = 0; t < TEAM; t++)
        T_CHECK(s2.have[t], "two-core set: thread %d ran no tile", t);
    T_CHECK(disjoint(&s2.mask[0], &s2.mask[1]), "two-core set {%d, %d}: threads 0 and 1 share a CPU", two.index[0],
            two.index[1]);
    T_CHECK(same(&s2.mask[1], &s1.mask[0]), "two-core set: thread 1 is not on core %d, where the one-core set put "
            "every thread", two.index[1]);
    for (int t = 2; t < TEAM; t++)
        T_CHECK(same(&s2.mask[t], &s2.mask[t % 2]), "two-core set: thread %d is not on the core of thread %d", t, t % 2);

    /* No set: thread t on the t-th core this process may run on (thread 0 on the first, as the two-core set). */
    seen s0;
    run(NULL, &s0);
    T_CHECK(s0.have[0] && same(&s0.mask[0], &s2.mask[0]), "default: thread 0 is not on core %d, the first this "
            "process may run on", all.index[0]);
    T_CHECK(s0.have[1] && disjoint(&s0.mask[0], &s0.mask[1]), "default: threads 0 and 1 share a CPU");

    sched_getaffinity(0, sizeof after, &after);
    T_CHECK(same(&before, &after), "the calling thread did not get its binding back after the team");
    return t_done();
}
