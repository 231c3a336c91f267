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
    arena *carver;
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

strata_status pool_create(device *dev, nvme_io *io, size_t bytes, pinned_pool **out)
{
    *out = NULL;
    pinned_pool *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(STRATA_ENOMEM, "pinned pool: out of memory for its bookkeeping");
    pthread_mutex_init(&p->lock, NULL);
    p->dev = dev;
    p->bytes = align_up(MAX(bytes, (size_t)POOL_ALIGN), POOL_ALIGN);
    strata_status st = alloc_near_device(p);
    if (st != STRATA_OK) {
        char human[32];
        err_set(st, "pinned pool: cannot pin %s of host memory (%s); lower strata.host_budget_bytes, "
                "zero_optimization.sub_group_size or the prefetch window",
                size_format(p->bytes, human, sizeof human), err_last());
        goto fail;
    }
    st = arena_create(p->bytes, POOL_ALIGN, &p->carver);
    if (st != STRATA_OK)
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
    arena_destroy(p->carver);
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

strata_status pool_acquire(pinned_pool *p, size_t bytes, const char *what, void **out)
{
    size_t off;
    pthread_mutex_lock(&p->lock);
    strata_status st = arena_alloc(p->carver, MAX(bytes, (size_t)1), &off);
    arena_stats s;
    arena_get_stats(p->carver, &s);
    pthread_mutex_unlock(&p->lock);
    if (st != STRATA_OK) {
        char a[32], f[32], t[32];
        return err_set(STRATA_EBUDGET, "pinned pool exhausted: %s needs %s, %s free of %s (largest block); "
                       "this is a planning bug in strata, please report it",
                       what, size_format(bytes, a, sizeof a), size_format(s.largest_free_bytes, f, sizeof f),
                       size_format(s.size_bytes, t, sizeof t));
    }
    *out = (char *)p->base + off;
    return STRATA_OK;
}

void pool_release(pinned_pool *p, void *buf)
{
    if (!p || !buf)
        return;
    pthread_mutex_lock(&p->lock);
    strata_status st = arena_free(p->carver, (size_t)((char *)buf - (char *)p->base), NULL);
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
    arena_stats s;
    pthread_mutex_lock(&p->lock);
    arena_get_stats(p->carver, &s);
    pthread_mutex_unlock(&p->lock);
    return s.peak_bytes;
}
