/*
 * The host cache of an NVMe tier array (offload/tier_cache.h), holding writes and writing through the ones it
 * cannot hold, against an oracle: a plain copy of what the array must hold. Random writes (whole mirrors, parts of one, spans across mirrors and the
 * unmirrored rest), reads of random spans, forgets and replaced caches; every read must return the oracle's bytes.
 * Held writes must not reach the drive (its counter stays, the held counter grows by their bytes; a write across
 * mirrors and the rest sends the drive only the rest), a read the mirror cannot serve whole must first hand the
 * drive what the mirror holds, and once the cache is dropped the drive alone must hold the oracle's bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "nvme/direct.h"
#include "nvme/swap.h"
#include "offload/tier_array.h"
#include "testlib.h"

#define ELEM 2                               /* bytes: bf16-sized elements */
#define ALIGN ((size_t)4096 / ELEM)          /* elements of one 4 KiB-aligned piece: the drive's unit */
#define NUMEL (24 * ALIGN)

static tier_array arr;
static tier_env env;
static tier_counters ctr;
static unsigned char *oracle, *buf;

/* Two mirrors, blocks [2, 6) and [10, 12) of the cache (TCACHE_BLOCK elements each); or blocks [0, 3) and [8, 12). */
static void cache_ranges(int choice)
{
    const tcache_range a[] = {{2 * TCACHE_BLOCK, 4 * TCACHE_BLOCK}, {10 * TCACHE_BLOCK, 2 * TCACHE_BLOCK}};
    const tcache_range b[] = {{0, 3 * TCACHE_BLOCK}, {8 * TCACHE_BLOCK, 4 * TCACHE_BLOCK}};
    T_OK(tarr_cache(&arr, &env, choice ? b : a, 2));
}

/* A random span in 4 KiB pieces: inside one mirror, a whole mirror, or anywhere. */
static void random_span(size_t *first, size_t *count)
{
    size_t kind = t_rand_range(0, 2);
    if (kind == 0) { /* a whole mirror of choice a */
        *first = t_rand_range(0, 1) ? 2 * TCACHE_BLOCK : 10 * TCACHE_BLOCK;
        *count = *first == 2 * TCACHE_BLOCK ? 4 * TCACHE_BLOCK : 2 * TCACHE_BLOCK;
        return;
    }
    if (kind == 1) { /* pieces inside the first mirror of choice a, block-aligned or not */
        size_t lo = t_rand_range(4, 11), hi = t_rand_range(lo + 1, 12);
        *first = lo * ALIGN;
        *count = (hi - lo) * ALIGN;
        return;
    }
    size_t lo = t_rand_range(0, NUMEL / ALIGN - 1), hi = t_rand_range(lo + 1, NUMEL / ALIGN);
    *first = lo * ALIGN;
    *count = (hi - lo) * ALIGN;
}

static void check_read(size_t first, size_t count, const char *when)
{
    memset(buf, 0xEE, count * ELEM);
    T_OK(tarr_read_sync(&arr, &env, first, count, buf));
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < count * ELEM; i++)
        if (buf[i] != oracle[first * ELEM + i] && bad++ == 0)
            at = i;
    T_CHECK(bad == 0, "%s: read of [%zu, %zu): %zu bytes differ from the oracle, the first at element %zu "
            "(0x%02x, oracle 0x%02x)", when, first, first + count, bad, first + at / ELEM, bad ? buf[at] : 0,
            bad ? oracle[first * ELEM + at] : 0);
}

static void random_ops(void)
{
    for (int op = 0; op < 400; op++) {
        size_t first, count;
        random_span(&first, &count);
        size_t pick = t_rand_range(0, 19);
        if (pick < 9) {
            uint64_t drive = atomic_load(&ctr.nvme_write_bytes), held = atomic_load(&ctr.cache_held_bytes);
            t_rand_bytes(buf, count * ELEM);
            memcpy(oracle + first * ELEM, buf, count * ELEM);
            T_OK(tarr_write_sync(&arr, &env, first, count, buf));
            uint64_t to_drive = atomic_load(&ctr.nvme_write_bytes) - drive;
            uint64_t to_cache = atomic_load(&ctr.cache_held_bytes) - held;
            T_CHECK(to_drive + to_cache == count * ELEM, "write of [%zu, %zu): %llu bytes to the drive, %llu held",
                    first, first + count, (unsigned long long)to_drive, (unsigned long long)to_cache);
        } else if (pick < 18) {
            check_read(first, count, "random");
        } else if (pick == 18) {
            tcache_forget(arr.cache);
        } else {
            int choice = (int)t_rand_range(0, 1);
            cache_ranges(choice);
            /* A new cache starts invalid: fill one mirror from the drive, as host_cache_follow_order does. */
            T_OK(choice ? tarr_cache_fill(&arr, &env, 0, 3 * TCACHE_BLOCK)
                        : tarr_cache_fill(&arr, &env, 2 * TCACHE_BLOCK, 4 * TCACHE_BLOCK));
        }
    }
}

/* A whole mirror written twice: the drive takes none of it while held; a read across it and the unmirrored rest
 * hands the drive the held blocks (their bytes counted as written) and returns the newest bytes. */
static void held_then_spanning_read(void)
{
    cache_ranges(0);
    size_t first = 2 * TCACHE_BLOCK, count = 4 * TCACHE_BLOCK;
    uint64_t drive = atomic_load(&ctr.nvme_write_bytes);
    for (int i = 0; i < 2; i++) {
        t_rand_bytes(buf, count * ELEM);
        memcpy(oracle + first * ELEM, buf, count * ELEM);
        T_OK(tarr_write_sync(&arr, &env, first, count, buf));
    }
    T_CHECK(atomic_load(&ctr.nvme_write_bytes) == drive, "two held writes of a whole mirror: the drive took %llu bytes",
            (unsigned long long)(atomic_load(&ctr.nvme_write_bytes) - drive));
    check_read(first, count, "the held mirror, whole");
    T_CHECK(atomic_load(&ctr.nvme_write_bytes) == drive, "a read the mirror served wrote %llu bytes to the drive",
            (unsigned long long)(atomic_load(&ctr.nvme_write_bytes) - drive));
    check_read(0, NUMEL, "across the held mirror");
    T_CHECK(atomic_load(&ctr.nvme_write_bytes) - drive == count * ELEM,
            "a read across the held mirror wrote %llu bytes to the drive, expected the mirror's %zu",
            (unsigned long long)(atomic_load(&ctr.nvme_write_bytes) - drive), count * ELEM);
    /* A write across both mirrors and the rest (an optimizer sub-group of many modules): the mirrors, valid now,
     * hold their parts; only the rest reaches the drive. */
    size_t mirrored = 6 * TCACHE_BLOCK * ELEM;
    drive = atomic_load(&ctr.nvme_write_bytes);
    uint64_t held = atomic_load(&ctr.cache_held_bytes);
    t_rand_bytes(buf, NUMEL * ELEM);
    memcpy(oracle, buf, NUMEL * ELEM);
    T_OK(tarr_write_sync(&arr, &env, 0, NUMEL, buf));
    T_CHECK(atomic_load(&ctr.cache_held_bytes) - held == mirrored &&
                atomic_load(&ctr.nvme_write_bytes) - drive == NUMEL * ELEM - mirrored,
            "a write across the mirrors: %llu bytes held (the mirrors' %zu), %llu to the drive (the rest's %zu)",
            (unsigned long long)(atomic_load(&ctr.cache_held_bytes) - held), mirrored,
            (unsigned long long)(atomic_load(&ctr.nvme_write_bytes) - drive), NUMEL * ELEM - mirrored);
    check_read(2 * TCACHE_BLOCK, 4 * TCACHE_BLOCK, "a mirror after a write across the mirrors");
    check_read(0, NUMEL, "across the mirrors after a write across them");
}

/* Dropping the cache hands the drive everything held: the drive alone then matches the oracle. */
static void drive_after_drop(const char *when)
{
    T_OK(tarr_cache(&arr, &env, NULL, 0));
    T_CHECK(arr.cache == NULL, "the cache was not dropped");
    check_read(0, NUMEL, when);
}

int main(void)
{
    t_rng_seed();
    const char *dir = t_scratch_dir("t_tier_cache");
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    nvme_io *io = NULL;
    nvme_swap *swap = NULL;
    device *dev = NULL;
    dev_options opt = {0};
    T_OK(nvme_io_create(&cfg, &io));
    T_OK(swap_create(io, &dir, 1, 4u << 20, &swap));
    T_OK(dev_create(STRATA_BACKEND_HOST, &opt, &dev));
    T_OK(direct_buffer_alloc(NUMEL * ELEM, (void **)&buf, NULL));
    oracle = malloc(NUMEL * ELEM);
    if (!io || !swap || !dev || !buf || !oracle)
        return t_done();
    env = (tier_env){.dev = dev, .swap = swap, .host_addressable_device = true, .ctr = &ctr};
    T_OK(tarr_alloc(&arr, &env, STRATA_TIER_NVME, NUMEL, ELEM, "t_tier_cache's array"));
    t_rand_bytes(oracle, NUMEL * ELEM);
    memcpy(buf, oracle, NUMEL * ELEM); /* the drive's reads and writes need 4 KiB-aligned memory */
    T_OK(tarr_write_sync(&arr, &env, 0, NUMEL, buf));

    for (int round = 0; round < 2; round++) {
        cache_ranges(0);
        random_ops();
        drive_after_drop("the drive after random writes, the cache dropped");
    }
    held_then_spanning_read();
    drive_after_drop("the drive after a spanning read, the cache dropped");
    printf("drive: %llu bytes written, %llu read; cache: %llu bytes held, %llu bytes served in %llu reads\n",
           (unsigned long long)ctr.nvme_write_bytes, (unsigned long long)ctr.nvme_read_bytes,
           (unsigned long long)ctr.cache_held_bytes, (unsigned long long)ctr.cache_read_bytes,
           (unsigned long long)ctr.cache_hits);
    T_CHECK(ctr.cache_held_bytes > 0 && ctr.cache_hits > 0, "the cache held %llu bytes and served %llu reads",
            (unsigned long long)ctr.cache_held_bytes, (unsigned long long)ctr.cache_hits);

    tarr_free(&arr, &env);
    direct_buffer_free(buf, NUMEL * ELEM);
    free(oracle);
    dev_destroy(dev);
    swap_destroy(swap);
    nvme_io_destroy(io);
    return t_done();
}
