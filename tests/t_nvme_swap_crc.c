/*
 * Swap integrity: a byte changed on the drive after strata wrote it is caught on the next read of that
 * 4 KiB unit, as STRATA_ECORRUPT naming what the extent holds, the unit, the swap file and its offset —
 * on one path and striped over two, for whole-extent and sub-range I/O. The same flip with checksums
 * off comes back silently different (the oracle that shows the check is what caught it). In the engine,
 * a flipped byte in the NVMe master weights fails the next step with the extent's name and the path.
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/error.h"
#include "engine/engine.h"
#include "engine/step/step.h"
#include "nvme/direct.h"
#include "nvme/swap.h"
#include "synth.h"
#include "testlib.h"

/* Flips one bit at striped offset `at` through a second, buffered descriptor of the swap file. */
static void flip(nvme_swap *s, int nfiles, uint64_t unit, uint64_t at, uint8_t mask)
{
    uint64_t k = at / unit;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", swap_file_fd(s, (int)(k % (uint64_t)nfiles)));
    int fd = open(proc, O_RDWR);
    off_t off = (off_t)((k / (uint64_t)nfiles) * unit + at % unit);
    uint8_t b = 0;
    T_CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1, "cannot read the swap file through %s", proc);
    b ^= mask;
    T_CHECK(pwrite(fd, &b, 1, off) == 1 && fsync(fd) == 0, "cannot write the swap file through %s", proc);
    close(fd);
}

static void crc_known_answer(void)
{
    T_EQ_INT(crc32c(0, "123456789", 9), 0xe3069283u);
    T_EQ_INT(crc32c_sw(0, "123456789", 9), 0xe3069283u);
    uint8_t buf[4099];
    t_rand_bytes(buf, sizeof buf);
    for (size_t off = 0; off < 9; off++) {
        size_t len = t_rand_range(0, sizeof buf - off);
        uint32_t hw = crc32c(0, buf + off, len), sw = crc32c_sw(0, buf + off, len);
        T_CHECK(hw == sw, "crc32c of %zu bytes at %zu: %08x, table %08x", len, off, hw, sw);
        uint32_t split = crc32c(crc32c(0, buf + off, len / 3), buf + off + len / 3, len - len / 3);
        T_CHECK(split == sw, "crc32c continued: %08x vs %08x", split, sw);
    }
    printf("crc32c: %s\n", crc32c_hw() ? "SSE4.2 instruction" : "table");
}

static void swap_level(const char *a, const char *b, int npaths)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.block_size = 64 << 10;
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    const char *paths[] = {a, b};
    nvme_swap *s = NULL;
    T_OK(swap_create(io, paths, npaths, 4u << 20, &s));
    if (!s) {
        nvme_io_destroy(io);
        return;
    }
    T_CHECK(swap_checksum(s), "checksums are not on by default");
    swap_extent pad, e;
    T_OK(swap_alloc(s, 12288, &pad)); /* so the extent does not start at 0 */
    T_OK(swap_alloc(s, 1u << 20, &e));
    e.what = "test tensor";
    void *wb, *rb;
    direct_buffer_alloc(e.bytes, &wb, NULL);
    direct_buffer_alloc(e.bytes, &rb, NULL);
    t_rand_bytes(wb, e.bytes);
    io_wait w;
    io_wait_init(&w);
    T_OK(swap_write(s, &e, 0, wb, e.bytes, &w));
    T_OK(io_wait_wait(&w));
    T_OK(swap_read(s, &e, 0, rb, e.bytes, &w));
    T_OK(io_wait_wait(&w));
    T_CHECK(memcmp(wb, rb, e.bytes) == 0, "clean read back differs");

    uint64_t unit_in_ext = t_rand_range(0, e.bytes / 4096 - 1) * 4096;
    uint64_t byte = unit_in_ext + t_rand_range(0, 4095);
    uint8_t mask = (uint8_t)(1u << t_rand_range(0, 7));
    flip(s, npaths, cfg.block_size, e.offset + byte, mask);
    T_OK(swap_read(s, &e, 0, rb, e.bytes, &w));
    T_STATUS(io_wait_wait(&w), STRATA_ECORRUPT);
    char needle[96];
    snprintf(needle, sizeof needle, "unit at byte %llu of the extent", (unsigned long long)unit_in_ext);
    T_CONTAINS(err_last(), "checksum mismatch in test tensor");
    T_CONTAINS(err_last(), needle);
    T_CONTAINS(err_last(), npaths == 2 && (e.offset + byte) / cfg.block_size % 2 ? b : a);
    /* A sub-range read of just that unit is caught too; one of the units beside it is clean. */
    T_OK(swap_read(s, &e, unit_in_ext, rb, 4096, &w));
    T_STATUS(io_wait_wait(&w), STRATA_ECORRUPT);
    uint64_t other = unit_in_ext ? unit_in_ext - 4096 : 4096;
    T_OK(swap_read(s, &e, other, rb, 4096, &w));
    T_OK(io_wait_wait(&w));
    /* A rewrite of the unit (a sub-range write) makes it good again. */
    T_OK(swap_write(s, &e, unit_in_ext, (char *)wb + unit_in_ext, 4096, &w));
    T_OK(io_wait_wait(&w));
    T_OK(swap_read(s, &e, 0, rb, e.bytes, &w));
    T_OK(io_wait_wait(&w));
    T_CHECK(memcmp(wb, rb, e.bytes) == 0, "read back after the repair differs");

    /* Without checksums the same damage comes back silently: the oracle for the check above. */
    swap_set_checksum(s, false);
    flip(s, npaths, cfg.block_size, e.offset + byte, mask);
    T_OK(swap_read(s, &e, 0, rb, e.bytes, &w));
    T_OK(io_wait_wait(&w));
    T_CHECK(((uint8_t *)rb)[byte] == (((uint8_t *)wb)[byte] ^ mask), "the unchecked read did not see the flip");
    io_wait_destroy(&w);
    direct_buffer_free(wb, e.bytes);
    direct_buffer_free(rb, e.bytes);
    swap_destroy(s);
    nvme_io_destroy(io);
}

static void engine_level(const char *dir)
{
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    synth_use_nvme(&c, dir, true, true);
    synth_opts so;
    synth_defaults(&so, t_rand_u64());
    strata_engine *e = NULL;
    T_OK(synth_engine(&so, &c, &e));
    if (!e)
        return;
    T_OK(strata_step(e, NULL, NULL));
    uint64_t at = e->tiers.master.ext.offset + t_rand_range(0, e->tiers.master.ext.bytes - 1);
    flip(e->tiers.swap, 1, c.aio.block_size, at, 0x10);
    /* The optimizer's slots still hold the last step's state and would not read it again: make them forget,
     * so that the step reads the damaged copy from the drive. */
    step_forget(e->step);
    T_STATUS(strata_step(e, NULL, NULL), STRATA_ECORRUPT);
    T_CONTAINS(strata_last_error(e), "checksum mismatch in master weights");
    T_CONTAINS(strata_last_error(e), dir);
    strata_engine_destroy(e);
}

int main(void)
{
    t_rng_seed();
    const char *a = t_scratch_dir("t_nvme_swap_crc_a");
    char b[600];
    snprintf(b, sizeof b, "%s/second", a);
    mkdir(b, 0700);
    crc_known_answer();
    swap_level(a, b, 1);
    swap_level(a, b, 2);
    engine_level(a);
    return t_done();
}
