#include <hwloc.h>
/*
 * Backend selection, devices, device memory and pinned memory (see device.h): argument checks, the
 * arena and its budget message, poisoning policy, and tracking of what the caller made so that
 * dev_destroy() can drain and free it. Streams and events are in gpu/stream.c.
 *
 * This is the only file that knows which backends were built.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/size.h"
#include "gpu/device_internal.h"

/* ---------------------------------------------------------------- selection */

static const dev_ops *backend_ops(strata_backend_kind kind)
{
    switch (kind) {
    case STRATA_BACKEND_HOST:
        return &dev_ops_host;
    case STRATA_BACKEND_CUDA:
#ifdef STRATA_HAVE_CUDA
        return &dev_ops_cuda;
#else
        return NULL;
#endif
    default:
        return NULL;
    }
}

static const char *const cuda_not_built = "cuda: not built (nvcc was not found when strata was configured)";

int dev_count(strata_backend_kind kind)
{
    const dev_ops *ops = backend_ops(kind == STRATA_BACKEND_AUTO ? STRATA_BACKEND_CUDA : kind);
    return ops && ops->count ? ops->count() : 0;
}

strata_status dev_probe(strata_backend_kind kind, char *detail, size_t len)
{
    char scratch[256];
    if (!detail || len == 0) {
        detail = scratch;
        len = sizeof scratch;
    }
    detail[0] = '\0';
    if (kind == STRATA_BACKEND_AUTO) {
        char why[256];
        if (dev_probe(STRATA_BACKEND_CUDA, why, sizeof why) == STRATA_OK) {
            snprintf(detail, len, "auto -> %s", why);
            return STRATA_OK;
        }
        char host[256];
        strata_status st = dev_probe(STRATA_BACKEND_HOST, host, sizeof host);
        snprintf(detail, len, "auto -> %s; %s", host, why);
        return st;
    }
    if (kind != STRATA_BACKEND_HOST && kind != STRATA_BACKEND_CUDA) {
        snprintf(detail, len, "unknown backend kind %d", (int)kind);
        return err_set(STRATA_EINVAL, "dev_probe: %s", detail);
    }
    const dev_ops *ops = backend_ops(kind);
    if (!ops) {
        snprintf(detail, len, "%s", cuda_not_built);
        return err_set(STRATA_EUNSUPPORTED, "%s", detail);
    }
    return ops->probe(detail, len);
}

/* Poisoning: asked for, or forced by STRATA_POISON, or the debug-build default. */
static bool poison_wanted(const dev_options *opt)
{
    if (opt->poison_on_free)
        return true;
    const char *env = getenv("STRATA_POISON");
    if (env && *env) {
        if (strcmp(env, "1") == 0)
            return true;
        if (strcmp(env, "0") == 0)
            return false;
        LOG_ONCE(STRATA_LOG_WARN, LOG_DEV, "STRATA_POISON=\"%s\" is not 0 or 1; ignored", env);
    }
#ifdef NDEBUG
    return false;
#else
    return true;
#endif
}

strata_status dev_create(strata_backend_kind kind, const dev_options *opt, device **out)
{
    static const dev_options defaults = DEV_OPTIONS_INIT;
    *out = NULL;
    if (!opt)
        opt = &defaults;
    if (opt->device_id < 0)
        return err_set(STRATA_EINVAL, "dev_create: device_id = %d must be >= 0", opt->device_id);
    if (opt->budget_bytes && opt->budget_bytes < DEV_ALIGN_BYTES)
        return err_set(STRATA_EINVAL,
                       "dev_create: budget_bytes = %zu is below one %d-byte block; set strata.device_budget_bytes "
                       "higher, or 0 for the backend's default",
                       opt->budget_bytes, DEV_ALIGN_BYTES);

    char why[256];
    if (kind == STRATA_BACKEND_AUTO) {
        kind = dev_probe(STRATA_BACKEND_CUDA, why, sizeof why) == STRATA_OK ? STRATA_BACKEND_CUDA
                                                                            : STRATA_BACKEND_HOST;
        if (kind == STRATA_BACKEND_HOST)
            LOG_INFO(LOG_DEV, "backend auto: using the host backend (%s)", why);
    } else if (kind == STRATA_BACKEND_CUDA) {
        strata_status st = dev_probe(kind, why, sizeof why);
        if (st == STRATA_EUNSUPPORTED)
            return err_set(st, "%s; rebuild with nvcc on PATH, or use backend \"host\"", why);
        if (st != STRATA_OK)
            return err_set(STRATA_EDEVICE, "%s; use backend \"host\" (or \"auto\") on this machine", why);
    } else if (kind != STRATA_BACKEND_HOST) {
        return err_set(STRATA_EINVAL, "dev_create: unknown backend kind %d (allowed: auto, host, cuda)", (int)kind);
    }

    device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return err_set(STRATA_ENOMEM, "dev_create: out of host memory");
    pthread_mutex_init(&dev->lock, NULL);
    dev->ops = backend_ops(kind);
    strata_status st = dev->ops->create(opt, &dev->impl, dev->name, sizeof dev->name);
    if (st != STRATA_OK)
        goto fail;
    size_t bytes = opt->budget_bytes;
    void *base = NULL;
    st = dev->ops->arena_reserve(dev->impl, &bytes, &base);
    if (st != STRATA_OK)
        goto fail;
    dev->base = base;
    dev->budget = bytes;
    st = arena_create(bytes, DEV_ALIGN_BYTES, &dev->arena);
    if (st != STRATA_OK)
        goto fail;
    dev->poison = poison_wanted(opt);
    dev->ordinal = kind == STRATA_BACKEND_CUDA ? opt->device_id : -1;

    char b[32];
    LOG_INFO(LOG_DEV, "device %s (%s backend): arena %s, poison on free %s", dev->name, dev->ops->name,
             size_format(dev->budget, b, sizeof b), dev->poison ? "on" : "off");
    *out = dev;
    return STRATA_OK;
fail:
    dev_destroy(dev);
    return st;
}

void dev_destroy(device *dev)
{
    if (!dev)
        return;
    /* Drain every stream before freeing anything: queued work may wait on events of other streams. */
    for (dev_stream *s = dev->streams; s; s = s->next)
        dev->ops->stream_sync(dev->impl, s->impl);
    while (dev->events)
        dev_event_destroy(dev->events);
    while (dev->streams)
        dev_stream_destroy(dev->streams);
    for (host_block *h = dev->host_blocks, *n; h; h = n) {
        n = h->next;
        LOG_DEBUG(LOG_DEV, "device %s: freeing a %s pinned buffer the caller left", dev->name,
                  h->registered ? "registered" : "allocated");
        if (h->registered)
            dev->ops->host_unregister(dev->impl, h->ptr);
        else
            dev->ops->host_free(dev->impl, h->ptr);
        free(h);
    }
    arena_destroy(dev->arena);
    if (dev->base)
        dev->ops->arena_release(dev->impl, dev->base, dev->budget);
    if (dev->impl)
        dev->ops->destroy(dev->impl);
    pthread_mutex_destroy(&dev->lock);
    free(dev);
}

strata_backend_kind dev_kind(const device *dev)
{
    return dev->ops->kind;
}

int dev_ordinal(const device *dev)
{
    return dev->ordinal;
}

const char *dev_name(const device *dev)
{
    return dev->name;
}

int dev_numa_node(const device *dev)
{
    char busid[32];
    if (!dev->ops->pci_bus_id || !dev->ops->pci_bus_id(dev->impl, busid, sizeof busid))
        return -1;
    hwloc_topology_t topo;
    int node = -1;
    if (hwloc_topology_init(&topo) != 0)
        return -1;
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) == 0) {
        hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, busid);
        hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : NULL;
        /* Only a real choice counts: on one NUMA node there is nothing to place. */
        if (anc && anc->nodeset && hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE) > 1)
            node = hwloc_bitmap_first(anc->nodeset);
    }
    hwloc_topology_destroy(topo);
    return node;
}

bool dev_poisons(const device *dev)
{
    return dev->poison;
}

/* ---------------------------------------------------------------- device memory */

strata_status dev_alloc(device *dev, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return err_set(STRATA_EINVAL, "dev_alloc: 0 bytes asked of device %s", dev->name);
    size_t off = 0;
    pthread_mutex_lock(&dev->lock);
    strata_status st = arena_alloc(dev->arena, bytes, &off);
    if (st == STRATA_EBUDGET) {
        arena_stats a;
        arena_get_stats(dev->arena, &a);
        char asked[32], fr[32], all[32], big[32];
        err_set(st,
                "device budget exceeded: asked %s, free %s of %s (largest free block %s); "
                "raise strata.device_budget_bytes or lower the prefetch window",
                size_format(bytes, asked, sizeof asked), size_format(a.free_bytes, fr, sizeof fr),
                size_format(a.size_bytes, all, sizeof all), size_format(a.largest_free_bytes, big, sizeof big));
    }
    pthread_mutex_unlock(&dev->lock);
    if (st == STRATA_OK)
        *out = dev->base + off;
    return st;
}

strata_status dev_free(device *dev, void *ptr)
{
    if (!ptr)
        return STRATA_OK;
    char *p = ptr;
    if (p < dev->base || p >= dev->base + dev->budget)
        return err_set(STRATA_EINVAL, "dev_free: %p is not device memory of %s (its arena is %p..%p)", ptr,
                       dev->name, (void *)dev->base, (void *)(dev->base + dev->budget));
    size_t off = (size_t)(p - dev->base);
    strata_status st = STRATA_OK;
    pthread_mutex_lock(&dev->lock);
    size_t bytes = arena_block_bytes(dev->arena, off);
    if (bytes == 0) {
        st = err_set(STRATA_EINVAL,
                     "dev_free: %p is not a live allocation of %s (freed twice, or inside a block)", ptr, dev->name);
    } else {
        /* Poison before the block can be carved again, so no new owner ever sees the fill land. */
        if (dev->poison)
            st = dev->ops->poison(dev->impl, ptr, bytes);
        arena_free(dev->arena, off, NULL);
    }
    pthread_mutex_unlock(&dev->lock);
    return st;
}

void dev_mem_stats_get(device *dev, dev_mem_stats *out)
{
    arena_stats a;
    pthread_mutex_lock(&dev->lock);
    arena_get_stats(dev->arena, &a);
    *out = (dev_mem_stats){
        .budget_bytes = a.size_bytes,
        .used_bytes = a.used_bytes,
        .peak_bytes = a.peak_bytes,
        .free_bytes = a.free_bytes,
        .largest_free_bytes = a.largest_free_bytes,
        .live_allocs = a.used_blocks,
        .free_blocks = a.free_blocks,
        .alloc_count = a.alloc_count,
        .pinned_bytes = dev->pinned_bytes,
        .registered_bytes = dev->registered_bytes,
    };
    pthread_mutex_unlock(&dev->lock);
}

void dev_reset_peak(device *dev)
{
    pthread_mutex_lock(&dev->lock);
    arena_reset_peak(dev->arena);
    pthread_mutex_unlock(&dev->lock);
}

/* ---------------------------------------------------------------- pinned host memory */

static strata_status track_host(device *dev, void *ptr, size_t bytes, bool registered)
{
    host_block *h = malloc(sizeof *h);
    if (!h)
        return err_set(STRATA_ENOMEM, "device %s: out of host memory for bookkeeping", dev->name);
    *h = (host_block){ptr, bytes, registered, NULL};
    pthread_mutex_lock(&dev->lock);
    h->next = dev->host_blocks;
    dev->host_blocks = h;
    if (registered)
        dev->registered_bytes += bytes;
    else
        dev->pinned_bytes += bytes;
    pthread_mutex_unlock(&dev->lock);
    return STRATA_OK;
}

/* Unlinks ptr's record when it is of the wanted sort; NULL when there is none. */
static host_block *untrack_host(device *dev, void *ptr, bool registered)
{
    pthread_mutex_lock(&dev->lock);
    host_block **pp = &dev->host_blocks;
    while (*pp && !((*pp)->ptr == ptr && (*pp)->registered == registered))
        pp = &(*pp)->next;
    host_block *h = *pp;
    if (h) {
        *pp = h->next;
        if (registered)
            dev->registered_bytes -= h->bytes;
        else
            dev->pinned_bytes -= h->bytes;
    }
    pthread_mutex_unlock(&dev->lock);
    return h;
}

strata_status dev_host_alloc(device *dev, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return err_set(STRATA_EINVAL, "dev_host_alloc: 0 bytes asked of device %s", dev->name);
    void *p = NULL;
    ERR_CHECK(dev->ops->host_alloc(dev->impl, bytes, &p));
    strata_status st = track_host(dev, p, bytes, false);
    if (st != STRATA_OK) {
        dev->ops->host_free(dev->impl, p);
        return st;
    }
    *out = p;
    return STRATA_OK;
}

strata_status dev_host_free(device *dev, void *ptr)
{
    if (!ptr)
        return STRATA_OK;
    host_block *h = untrack_host(dev, ptr, false);
    if (!h)
        return err_set(STRATA_EINVAL, "dev_host_free: %p was not allocated by dev_host_alloc() on %s (or was freed)",
                       ptr, dev->name);
    dev->ops->host_free(dev->impl, ptr);
    free(h);
    return STRATA_OK;
}

strata_status dev_host_register(device *dev, void *ptr, size_t bytes)
{
    if (!ptr || bytes == 0)
        return err_set(STRATA_EINVAL, "dev_host_register: %s on %s", ptr ? "0 bytes" : "NULL buffer", dev->name);
    ERR_CHECK(dev->ops->host_register(dev->impl, ptr, bytes));
    strata_status st = track_host(dev, ptr, bytes, true);
    if (st != STRATA_OK)
        dev->ops->host_unregister(dev->impl, ptr);
    return st;
}

strata_status dev_host_unregister(device *dev, void *ptr)
{
    host_block *h = ptr ? untrack_host(dev, ptr, true) : NULL;
    if (!h)
        return err_set(STRATA_EINVAL, "dev_host_unregister: %p is not registered with %s", ptr, dev->name);
    dev->ops->host_unregister(dev->impl, ptr);
    free(h);
    return STRATA_OK;
}
