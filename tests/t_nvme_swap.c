/* Swap space: striping over two paths gives back the same bytes and puts each stripe where
 * RAID-0 says; files are private, preallocated and invisible; the allocator refuses clearly. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "nvme/direct.h"
#include "nvme/swap.h"
#include "testlib.h"

static strata_status wait_io(io_wait *w)
{
    return io_wait_wait(w);
}

static void striping(const char *a, const char *b)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    cfg.block_size = 64 << 10;
    cfg.intra_op_parallelism = 2;
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    const char *paths[] = {a, b};
    nvme_swap *s = NULL;
    T_OK(swap_create(io, paths, 2, 4u << 20, &s));
    if (!s) {
        nvme_io_destroy(io);
        return;
    }
    T_EQ_INT(t_dir_entries(a), 0);
    T_EQ_INT(t_dir_entries(b), 0);
    struct stat sb;
    T_OK(fstat(swap_file_fd(s, 0), &sb) == 0 ? STRATA_OK : STRATA_EIO);
    T_EQ_INT(sb.st_mode & 0777, 0600);
    T_CHECK((uint64_t)sb.st_blocks * 512 >= swap_capacity(s) / 2, "swap file not preallocated: %lld blocks",
            (long long)sb.st_blocks);

    /* Three extents of sizes off the stripe grid, random data, read back through fresh buffers. */
    const uint64_t sizes[] = {300000, 1u << 20, 70000};
    swap_extent e[3];
    void *wb[3], *rb[3];
    io_wait w;
    io_wait_init(&w);
    for (int i = 0; i < 3; i++) {
        T_OK(swap_alloc(s, sizes[i], &e[i]));
        T_EQ_INT(e[i].offset % 4096, 0);
        T_EQ_INT(e[i].bytes % 4096, 0);
        direct_buffer_alloc(e[i].bytes, &wb[i], NULL);
        direct_buffer_alloc(e[i].bytes, &rb[i], NULL);
        t_rand_bytes(wb[i], e[i].bytes);
        T_OK(swap_write(s, &e[i], 0, wb[i], e[i].bytes, &w));
    }
    T_OK(wait_io(&w));
    for (int i = 0; i < 3; i++)
        T_OK(swap_read(s, &e[i], 0, rb[i], e[i].bytes, &w));
    T_OK(wait_io(&w));
    for (int i = 0; i < 3; i++)
        T_CHECK(memcmp(wb[i], rb[i], e[i].bytes) == 0, "extent %d (%llu bytes at %llu) read back differently", i,
                (unsigned long long)e[i].bytes, (unsigned long long)e[i].offset);

    /* The oracle for the layout: stripe k of the space is in file k % 2 at (k / 2) * unit. */
    const uint64_t unit = cfg.block_size;
    void *chunk = NULL; /* aligned: the swap fds are O_DIRECT */
    direct_buffer_alloc(4096, &chunk, NULL);
    int misplaced = 0;
    for (uint64_t at = e[1].offset; at < e[1].offset + e[1].bytes; at += 4096) {
        uint64_t k = at / unit;
        int fd = swap_file_fd(s, (int)(k % 2));
        if (pread(fd, chunk, 4096, (off_t)((k / 2) * unit + at % unit)) != 4096 ||
            memcmp(chunk, (char *)wb[1] + (at - e[1].offset), 4096) != 0)
            misplaced++;
    }
    T_EQ_INT(misplaced, 0);
    direct_buffer_free(chunk, 4096);

    /* A write past the extent is refused before any I/O. */
    T_STATUS(swap_write(s, &e[2], 4096, wb[2], e[2].bytes, &w), STRATA_EINVAL);
    T_CONTAINS(err_last(), "lies outside an extent");

    /* Allocate until full: the refusal gives the numbers; freeing merges back to one range. */
    uint64_t before = swap_free_bytes(s);
    swap_extent big;
    T_STATUS(swap_alloc(s, swap_capacity(s), &big), STRATA_ENOSPC);
    T_CONTAINS(err_last(), "swap: no free extent of 4.00 MiB");
    for (int i = 0; i < 3; i++)
        swap_free(s, e[i]);
    T_EQ_INT(swap_free_bytes(s), before + e[0].bytes + e[1].bytes + e[2].bytes);
    T_OK(swap_alloc(s, swap_capacity(s), &big));
    swap_free(s, big);
    for (int i = 0; i < 3; i++) {
        direct_buffer_free(wb[i], e[i].bytes);
        direct_buffer_free(rb[i], e[i].bytes);
    }
    io_wait_destroy(&w);
    swap_destroy(s);
    nvme_io_destroy(io);
}

static void bad_paths(const char *a)
{
    strata_aio_config cfg;
    nvme_aio_defaults(&cfg);
    nvme_io *io = NULL;
    T_OK(nvme_io_create(&cfg, &io));
    nvme_swap *s = NULL;
    const char *huge[] = {a};
    T_STATUS(swap_create(io, huge, 1, 1ull << 60, &s), STRATA_ENOSPC);
    T_CONTAINS(err_last(), a);
    T_CONTAINS(err_last(), "but the filesystem has only");
    const char *missing[] = {"/nonexistent/strata"};
    T_STATUS(swap_create(io, missing, 1, 1 << 20, &s), STRATA_ECONFIG);
    T_CONTAINS(err_last(), "nvme_path \"/nonexistent/strata\"");
    T_CHECK(s == NULL, "out must be NULL on failure");
    nvme_io_destroy(io);
}

int main(void)
{
    char a[4096], b[4200];
    snprintf(a, sizeof a, "%s", t_scratch_dir("t_nvme_swap"));
    snprintf(b, sizeof b, "%s/second", a);
    mkdir(b, 0700);
    snprintf(a + strlen(a), sizeof a - strlen(a), "/first");
    mkdir(a, 0700);
    striping(a, b);
    bad_paths(a);
    return t_done();
}
