#include "offload/pool.h"

#include <hwloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/size.h"
#include "base/util.h"
#include "gpu/arena.h"

#define POOL_ALIGN 4096

struct pinned_pool {
    device *dev;
    nvme_io *io;
    void *base;
    size_t bytes;
    bool io_registered;
    arena *carver[POOL_PARTS];
    size_t part_base[POOL_PARTS], part_bytes[POOL_PARTS];
    bool numa_bound;               /* allocated with hwloc next to the GPU, pinned by registration */
    hwloc_topology_t topo;
    pthread_mutex_t lock;
};

/* The pool is allocated on the NUMA node nearest the GPU (when the machine has more than one node)
 * and then pinned, because pages that are already pinned cannot be moved. Otherwise it is ordinary
 * pinned memory from the device backend. */
static strata_status alloc_near_device(pinned_pool *p)
{
    int node = dev_numa_node(p->dev);
    if (node < 0)
        return dev_host_alloc(p->dev, p->bytes, &p->base);
    if (hwloc_topology_init(&p->topo) != 0 || hwloc_topology_load(p->topo) != 0)
        return dev_host_alloc(p->dev, p->bytes, &p->base);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    hwloc_bitmap_only(set, (unsigned)node);
    p->base = hwloc_alloc_membind(p->topo, p->bytes, set, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
    hwloc_bitmap_free(set);
    if (!p->base)
        return dev_host_alloc(p->dev, p->bytes, &p->base);
    strata_status st = dev_host_register(p->dev, p->base, p->bytes);
    if (st != STRATA_OK) {
        hwloc_free(p->topo, p->base, p->bytes);
        p->base = NULL;
        return st;
    }
    p->numa_bound = true;
    LOG_INFO(LOG_CORE, "pinned pool on NUMA node %d, next to the GPU", node);
    return STRATA_OK;
}

strata_status pool_create(device *dev, nvme_io *io, const size_t part_bytes[POOL_PARTS], pinned_pool **out)
{
    *out = NULL;
    pinned_pool *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(STRATA_ENOMEM, "pinned pool: out of memory for its bookkeeping");
    pthread_mutex_init(&p->lock, NULL);
    p->dev = dev;
    for (int i = 0; i < POOL_PARTS; i++) {
        p->part_base[i] = p->bytes;
        p->part_bytes[i] = align_up(MAX(part_bytes[i], (size_t)POOL_ALIGN), POOL_ALIGN);
        p->bytes += p->part_bytes[i];
    }
    strata_status st = alloc_near_device(p);
    if (st != STRATA_OK) {
        char human[32];
        err_set(st, "pinned pool: cannot pin %s of host memory (%s); lower strata.host_budget_bytes, "
                "zero_optimization.sub_group_size or the prefetch window",
                size_format(p->bytes, human, sizeof human), err_last());
        goto fail;
    }
    for (int i = 0; i < POOL_PARTS; i++)
        if ((st = arena_create(p->part_bytes[i], POOL_ALIGN, &p->carver[i])) != STRATA_OK)
            goto fail;
    /* Registering the pool with io_uring (fixed buffers) is possible but not done: measured with
     * `strata bench step` on the development VM (Linux 6.18, virtio disk), the optimizer's NVMe
     * traffic ran 2x slower through registered buffers than through plain ones (0.86-0.99 s vs
     * 0.39-0.54 s for the same 1.8 GB, alternating runs). STRATA_POOL_REGISTER=1 turns it on to
     * measure other machines. */
    const char *reg = getenv("STRATA_POOL_REGISTER");
    if (io && reg && strcmp(reg, "1") == 0) {
        p->io = io;
        p->io_registered = nvme_io_register_buffer(io, p->base, p->bytes);
        if (!p->io_registered)
            LOG_INFO(LOG_IO, "pinned pool not registered with io_uring (kernel or RLIMIT_MEMLOCK refused); "
                             "NVMe I/O uses unregistered buffers");
    }
    *out = p;
    return STRATA_OK;
fail:
    pool_destroy(p);
    return st;
}

void pool_destroy(pinned_pool *p)
{
    if (!p)
        return;
    if (p->io_registered)
        nvme_io_unregister_buffer(p->io, p->base);
    for (int i = 0; i < POOL_PARTS; i++)
        arena_destroy(p->carver[i]);
    if (p->base && p->numa_bound) {
        dev_host_unregister(p->dev, p->base);
        hwloc_free(p->topo, p->base, p->bytes);
    } else if (p->base) {
        dev_host_free(p->dev, p->base);
    }
    if (p->topo)
        hwloc_topology_destroy(p->topo);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static const char *const part_names[POOL_PARTS] = {"fetch staging", "gradient staging", "gradient accumulation",
                                                  "optimizer step"};

strata_status pool_acquire(pinned_pool *p, pool_part part, size_t bytes, const char *what, void **out)
{
    size_t off;
    pthread_mutex_lock(&p->lock);
    strata_status st = arena_alloc(p->carver[part], MAX(bytes, (size_t)1), &off);
    arena_stats s;
    arena_get_stats(p->carver[part], &s);
    pthread_mutex_unlock(&p->lock);
    if (st != STRATA_OK) {
        char a[32], f[32], t[32];
        return err_set(STRATA_EBUDGET, "pinned pool: %s needs %s but the %s slice has %s free in one piece (of %s)",
                       what, size_format(bytes, a, sizeof a), part_names[part],
                       size_format(s.largest_free_bytes, f, sizeof f), size_format(s.size_bytes, t, sizeof t));
    }
    *out = (char *)p->base + p->part_base[part] + off;
    return STRATA_OK;
}

void pool_release(pinned_pool *p, void *buf)
{
    if (!p || !buf)
        return;
    size_t off = (size_t)((char *)buf - (char *)p->base);
    int part = POOL_PARTS - 1;
    while (part > 0 && off < p->part_base[part])
        part--;
    pthread_mutex_lock(&p->lock);
    strata_status st = arena_free(p->carver[part], off - p->part_base[part], NULL);
    pthread_mutex_unlock(&p->lock);
    if (st != STRATA_OK)
        LOG_ERROR(LOG_CORE, "pinned pool: release of a buffer it did not hand out (%p)", buf);
}

size_t pool_size(const pinned_pool *p)
{
    return p ? p->bytes : 0;
}

size_t pool_peak(pinned_pool *p)
{
    if (!p)
        return 0;
    size_t peak = 0;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < POOL_PARTS; i++) {
        arena_stats s;
        arena_get_stats(p->carver[i], &s);
        peak += s.peak_bytes;
    }
    pthread_mutex_unlock(&p->lock);
    return peak;
}
