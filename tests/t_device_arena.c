/*
 * The carving allocator (gpu/arena.c) alone, against an oracle that knows only the live blocks:
 * random alloc/free sequences must never overlap, stay aligned and in range, account used bytes
 * exactly, succeed exactly when some gap between live blocks fits the request (coalescing is then
 * complete), and come back to one free block of the full size when everything is freed.
 */
#include <stdlib.h>

#include "gpu/arena.h"
#include "tests/helpers/testlib.h"

#define ALIGN 256
#define MAX_LIVE 512

typedef struct live {
    size_t off, size; /* size as asked */
} live;

static live lv[MAX_LIVE];
static int nlive;

static size_t rounded(size_t b)
{
    return (b + ALIGN - 1) / ALIGN * ALIGN;
}

static int by_off(const void *a, const void *b)
{
    const live *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Checks the live set and returns the largest gap the oracle sees (what a perfect coalescer offers). */
static size_t check_live(arena *a, size_t size)
{
    live sorted[MAX_LIVE];
    memcpy(sorted, lv, sizeof lv[0] * (size_t)nlive);
    qsort(sorted, (size_t)nlive, sizeof sorted[0], by_off);
    size_t used = 0, pos = 0, gap = 0;
    for (int i = 0; i < nlive; i++) {
        size_t r = rounded(sorted[i].size);
        T_CHECK(sorted[i].off % ALIGN == 0, "offset %zu is not %d-aligned", sorted[i].off, ALIGN);
        T_CHECK(sorted[i].off >= pos, "block at %zu overlaps the previous one, which ends at %zu", sorted[i].off, pos);
        T_CHECK(sorted[i].off + r <= size, "block [%zu, +%zu) runs past the arena end %zu", sorted[i].off, r, size);
        T_EQ_INT(arena_block_bytes(a, sorted[i].off), r);
        if (sorted[i].off > pos && sorted[i].off - pos > gap)
            gap = sorted[i].off - pos;
        pos = sorted[i].off + r;
        used += r;
    }
    if (size - pos > gap)
        gap = size - pos;
    arena_stats st;
    arena_get_stats(a, &st);
    T_EQ_INT(st.used_bytes, used);
    T_EQ_INT(st.free_bytes, size - used);
    T_EQ_INT(st.used_blocks, nlive);
    T_EQ_INT(st.largest_free_bytes, gap);
    return gap;
}

static void random_run(size_t size, int steps)
{
    arena *a = NULL;
    T_OK(arena_create(size, ALIGN, &a));
    if (!a)
        return;
    nlive = 0;
    size_t peak = 0, used = 0;
    int ebudget = 0;
    for (int step = 0; step < steps; step++) {
        bool do_alloc = nlive == 0 || (nlive < MAX_LIVE && t_rand_unit() < 0.55);
        if (do_alloc) {
            /* Mostly small blocks, some large ones that fragmentation will refuse. */
            size_t bytes = t_rand_unit() < 0.8 ? t_rand_range(1, size / 64) : t_rand_range(size / 16, size / 3);
            size_t gap = check_live(a, size);
            size_t off = 0;
            strata_status s = arena_alloc(a, bytes, &off);
            if (rounded(bytes) <= gap) {
                T_CHECK(s == STRATA_OK, "step %d: alloc of %zu failed although a %zu-byte gap exists: %s", step, bytes,
                        gap, strata_last_error(NULL));
            } else {
                T_CHECK(s == STRATA_EBUDGET, "step %d: alloc of %zu returned %s with no gap large enough (largest %zu)",
                        step, bytes, strata_status_name(s), gap);
                ebudget++;
            }
            if (s == STRATA_OK) {
                lv[nlive++] = (live){off, bytes};
                used += rounded(bytes);
                if (used > peak)
                    peak = used;
            }
        } else {
            int i = (int)t_rand_range(0, (size_t)nlive - 1);
            size_t got = 0;
            T_OK(arena_free(a, lv[i].off, &got));
            T_EQ_INT(got, rounded(lv[i].size));
            used -= rounded(lv[i].size);
            lv[i] = lv[--nlive];
        }
    }
    check_live(a, size);
    arena_stats st;
    arena_get_stats(a, &st);
    T_EQ_INT(st.peak_bytes, peak);
    T_CHECK(ebudget > 0, "the run never exhausted the arena, so refusals went untested (size %zu)", size);

    /* Free in random order: the free list must coalesce back to one block of the whole range. */
    while (nlive) {
        int i = (int)t_rand_range(0, (size_t)nlive - 1);
        T_OK(arena_free(a, lv[i].off, NULL));
        lv[i] = lv[--nlive];
    }
    arena_get_stats(a, &st);
    T_EQ_INT(st.free_blocks, 1);
    T_EQ_INT(st.largest_free_bytes, size);
    T_EQ_INT(st.used_bytes, 0);
    size_t off = 1;
    T_OK(arena_alloc(a, size, &off));
    T_EQ_INT(off, 0);
    arena_destroy(a);
}

static void test_misuse(void)
{
    arena *a = NULL;
    T_STATUS(arena_create(1000, 100, &a), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "not a power of two");
    T_CHECK(a == NULL, "out-param set on failure");
    T_STATUS(arena_create(100, ALIGN, &a), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "smaller than one 256-byte block");

    T_OK(arena_create(4096 + 100, ALIGN, &a)); /* rounded down to 4096 */
    size_t off;
    T_STATUS(arena_alloc(a, 0, &off), STRATA_EINVAL);
    T_STATUS(arena_alloc(a, 4097, &off), STRATA_EBUDGET);
    T_STATUS(arena_alloc(a, SIZE_MAX, &off), STRATA_EBUDGET);
    T_OK(arena_alloc(a, 1, &off));
    T_EQ_INT(arena_block_bytes(a, off), ALIGN);
    T_STATUS(arena_free(a, off + ALIGN, NULL), STRATA_EINVAL);
    T_OK(arena_free(a, off, NULL));
    T_STATUS(arena_free(a, off, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "double free");
    /* Exactly full, then one more byte is refused. */
    size_t o1, o2;
    T_OK(arena_alloc(a, 2048, &o1));
    T_OK(arena_alloc(a, 2048, &o2));
    T_STATUS(arena_alloc(a, 1, &off), STRATA_EBUDGET);
    arena_destroy(a);
    arena_destroy(NULL);
}

/* Many live blocks: the offset table grows and deletes with backward shifts; every block is still found. */
static void test_many_blocks(void)
{
    enum { N = 20000 };
    arena *a = NULL;
    T_OK(arena_create((size_t)N * ALIGN, ALIGN, &a));
    static size_t offs[N];
    for (int i = 0; i < N; i++)
        T_OK(arena_alloc(a, ALIGN, &offs[i]));
    for (int i = 0; i < N; i += 2)
        T_OK(arena_free(a, offs[i], NULL));
    arena_stats st;
    arena_get_stats(a, &st);
    T_EQ_INT(st.free_blocks, N / 2);
    T_EQ_INT(st.largest_free_bytes, ALIGN);
    for (int i = 1; i < N; i += 2)
        T_EQ_INT(arena_block_bytes(a, offs[i]), ALIGN);
    for (int i = 1; i < N; i += 2)
        T_OK(arena_free(a, offs[i], NULL));
    arena_get_stats(a, &st);
    T_EQ_INT(st.free_blocks, 1);
    T_EQ_INT(st.used_blocks, 0);
    arena_destroy(a);
}

int main(void)
{
    test_misuse();
    test_many_blocks();
    random_run(1u << 20, 4000);
    random_run((size_t)3 << 30, 4000); /* offsets past 32 bits */
    random_run(64 * ALIGN, 2000);       /* tiny: constant exhaustion */
    return t_done();
}
