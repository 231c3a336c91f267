/* The optimizer's device share (offload_optimizer.ratio); see twin_flow.h. */
#include "engine/step/twin_flow.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/size.h"
#include "base/util.h"
#include "cpu_adam/adam.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "engine/ranks/ranks.h"

/* Elements per bounce-buffer copy between the host arrays and the share (a multiple of 1024: 4 KiB of fp32, so
 * NVMe transfers stay aligned). */
#define MOVE_CHUNK_NUMEL ((size_t)1 << 20)

struct twin_flow {
    size_t first, numel;          /* elements [first, first + numel) of the optimizer view */
    bool own;                     /* master/m/v are this share's arrays (else the device-tier arrays' tail) */
    float *state[3];              /* device: master, exp_avg, exp_avg_sq */
    float *grad;                  /* device: the uploaded gradients */
    void *param_scratch;          /* device: new parameters whose home is not the device */
    void *param_pinned;           /* pinned: the same on their way to NVMe */
    void *grads_pinned[2];        /* the share's range of each gradient store the step reads, registered for its
                                     upload (the stores are not pinned: tarr_alloc_cpu) */
    dev_stream *stream;
    bool launched;
    uint64_t start_ns, done_ns;   /* stamped on the stream (ordered before the sync that reads them) */
};

size_t twin_flow_split(size_t numel, size_t sg, double ratio)
{
    if (ratio >= 1.0 || numel == 0 || sg == 0)
        return numel;
    size_t nsub = (numel + sg - 1) / sg;
    /* 0.3 * 10 is 3.0000000000000004 in doubles: a hair below ceil keeps the share the ratio names. */
    double want = ceil(ratio * (double)nsub - 1e-9);
    size_t ncpu = want <= 0 ? 0 : (size_t)want;
    return MIN(ncpu * sg, numel);
}

static size_t sub_group_numel(const strata_engine *e, size_t numel)
{
    return MIN(align_up(e->cfg.sub_group_size, ENGINE_MODULE_ALIGN), numel);
}

static tier_array *host_array(strata_engine *e, int i)
{
    tier_array *a[] = {&e->tiers.master, &e->tiers.exp_avg, &e->tiers.exp_avg_sq};
    return a[i];
}

static strata_status check_supported(const strata_engine *e)
{
    double r = e->cfg.offload_optimizer_ratio;
    if (e->tiers.grad_tier != STRATA_TIER_HOST)
        return err_set(STRATA_EUNSUPPORTED, "zero_optimization.offload_optimizer.ratio = %g needs the gradient "
                       "store in host memory, but it is on %s; set strata.gradients_on_nvme = false (or ratio 1)",
                       r, strata_tier_name(e->tiers.grad_tier));
    /* The device's Adam keeps fp32 moments only. */
    if (e->cfg.optimizer_moments != STRATA_MOMENTS_FP32)
        return err_set(STRATA_ECONFIG, "zero_optimization.offload_optimizer.ratio = %g with strata.optimizer_moments "
                       "= \"%s\": the device's Adam keeps fp32 moments only; set the ratio to 1 or the moments to "
                       "\"fp32\"", r, cfg_moments_name(e->cfg.optimizer_moments));
    return STRATA_OK;
}

/* Runs on the stream: when the share's update started and ended, for the trace. */
static strata_status stamp_fn(void *arg)
{
    *(uint64_t *)arg = now_ns();
    return STRATA_OK;
}

/* Copies the share's state to (up) or from the host arrays, chunk by chunk through a pinned buffer. */
static strata_status move_state(strata_engine *e, twin_flow *tf, bool up)
{
    if (!tf || !tf->own)
        return STRATA_OK;
    size_t chunk = MIN(MOVE_CHUNK_NUMEL, tf->numel);
    float *bounce;
    ERR_CHECK(dev_host_alloc(e->dev, chunk * 4, (void **)&bounce));
    strata_status st = STRATA_OK;
    for (int i = 0; i < 3 && st == STRATA_OK; i++) {
        tier_array *a = host_array(e, i);
        for (size_t off = 0; off < tf->numel && st == STRATA_OK; off += chunk) {
            size_t n = MIN(chunk, tf->numel - off);
            if (up) {
                st = tarr_read_sync(a, &e->tiers.env, tf->first + off, n, bounce);
                if (st == STRATA_OK)
                    st = dev_memcpy_async(tf->stream, tf->state[i] + off, bounce, n * 4);
                if (st == STRATA_OK)
                    st = dev_stream_sync(tf->stream);
            } else {
                st = dev_memcpy_async(tf->stream, bounce, tf->state[i] + off, n * 4);
                if (st == STRATA_OK)
                    st = dev_stream_sync(tf->stream);
                if (st == STRATA_OK)
                    st = tarr_write_sync(a, &e->tiers.env, tf->first + off, n, bounce);
            }
        }
    }
    dev_stream_sync(tf->stream);
    dev_host_free(e->dev, bounce);
    if (st != STRATA_OK)
        return err_set(st, "optimizer device share (offload_optimizer.ratio): copying its state %s failed: %s",
                       up ? "to the device" : "back to its home", err_last());
    return STRATA_OK;
}

strata_status twin_flow_store(strata_engine *e, twin_flow *tf)
{
    return move_state(e, tf, false);
}

strata_status twin_flow_load(strata_engine *e, twin_flow *tf)
{
    return move_state(e, tf, true);
}

/* Each step uploads the share's gradients straight from the store (twin_flow_launch): that range is pinned, so the
 * upload is an asynchronous DMA rather than CUDA's synchronous copy of pageable memory. */
static strata_status pin_grads(strata_engine *e, twin_flow *tf)
{
    for (int i = 0; i < (e->cfg.delayed_update ? 2 : 1); i++) {
        tier_array *g = ranks_step_grads(e, i);
        void *at = g->cpu_only ? tarr_host_ptr(g, &e->tiers.env, tf->first) : NULL;
        if (!at || (i == 1 && at == tf->grads_pinned[0]))
            continue;
        ERR_CHECK(dev_host_register(e->dev, at, tf->numel * 4));
        tf->grads_pinned[i] = at;
    }
    return STRATA_OK;
}

static strata_status build(strata_engine *e, twin_flow *tf)
{
    size_t pb = e->tiers.param_bytes;
    ERR_CHECK(dev_stream_create(e->dev, "adam", &tf->stream));
    for (int i = 0; i < 3; i++) {
        if (tf->own)
            ERR_CHECK(dev_alloc(e->dev, tf->numel * 4, (void **)&tf->state[i]));
        else
            tf->state[i] = (float *)host_array(e, i)->mem + tf->first;
    }
    ERR_CHECK(dev_alloc(e->dev, tf->numel * 4, (void **)&tf->grad));
    /* Where the step writes parameters: their home, or this rank's shard of them on the host (stages 1 and 2). */
    strata_tier pout = ranks_step_params(e, 0)->tier;
    if (pout != STRATA_TIER_DEVICE)
        ERR_CHECK(dev_alloc(e->dev, tf->numel * pb, &tf->param_scratch));
    if (pout == STRATA_TIER_NVME)
        ERR_CHECK(dev_host_alloc(e->dev, tf->numel * pb, &tf->param_pinned));
    ERR_CHECK(pin_grads(e, tf));
    return twin_flow_load(e, tf);
}

strata_status twin_flow_create(strata_engine *e, twin_flow **out)
{
    *out = NULL;
    size_t numel = registry_view_numel(e->reg, e->views.opt);
    size_t first = twin_flow_split(numel, sub_group_numel(e, numel), e->cfg.offload_optimizer_ratio);
    if (first == numel)
        return STRATA_OK;
    ERR_CHECK(check_supported(e));
    twin_flow *tf = calloc(1, sizeof *tf);
    if (!tf)
        return err_set(STRATA_ENOMEM, "strata_engine_finalize: out of memory for the optimizer's device share");
    tf->first = first;
    tf->numel = numel - first;
    tf->own = e->tiers.opt_tier != STRATA_TIER_DEVICE;
    strata_status st = build(e, tf);
    if (st != STRATA_OK) {
        twin_flow_destroy(e, tf);
        return st;
    }
    char b[32];
    LOG_INFO(LOG_ADAM, "offload_optimizer.ratio %g: the device updates elements [%zu, %zu) (%s of master weights "
             "and moments), the CPU the %zu before them", e->cfg.offload_optimizer_ratio, first, numel,
             size_format(tf->numel * 12, b, sizeof b), first);
    *out = tf;
    return STRATA_OK;
}

void twin_flow_destroy(strata_engine *e, twin_flow *tf)
{
    if (!tf)
        return;
    dev_stream_destroy(tf->stream);
    for (int i = 0; i < 3 && tf->own; i++)
        dev_free(e->dev, tf->state[i]);
    dev_free(e->dev, tf->grad);
    dev_free(e->dev, tf->param_scratch);
    dev_host_free(e->dev, tf->param_pinned);
    for (int i = 0; i < 2; i++)
        if (tf->grads_pinned[i])
            (void)dev_host_unregister(e->dev, tf->grads_pinned[i]);
    free(tf);
}

size_t twin_flow_cpu_numel(const twin_flow *tf, size_t numel)
{
    return tf ? tf->first : numel;
}

strata_status twin_flow_launch(strata_engine *e, twin_flow *tf, tier_array *grads, tier_array *pout,
                               const step_consts *c)
{
    if (!tf)
        return STRATA_OK;
    size_t pb = e->tiers.param_bytes;
    const float *g = tarr_host_ptr(grads, &e->tiers.env, tf->first);
    if (!g) /* twin_flow_create refused gradients the host cannot address */
        return err_set(STRATA_EINVAL, "optimizer device share: the gradient store is not in host memory");
    tf->launched = true; /* from here on, twin_flow_finish waits for what was queued */
    tf->start_ns = tf->done_ns = 0;
    ERR_CHECK(dev_memcpy_async(tf->stream, tf->grad, g, tf->numel * 4));
    atomic_fetch_add(&e->ctr.host_to_device, tf->numel * 4);
    ERR_CHECK(dev_host_fn(tf->stream, stamp_fn, &tf->start_ns));
    bool on_device = pout->tier == STRATA_TIER_DEVICE;
    dev_adam_arrays a = {.master = tf->state[0], .exp_avg = tf->state[1], .exp_avg_sq = tf->state[2], .grad = tf->grad,
                         .param = on_device ? (char *)pout->mem + tf->first * pb : tf->param_scratch,
                         .param_dtype = e->cfg.param_dtype};
    /* One launch per parameter group the share holds, each with its group's constants. */
    for (size_t done = 0, n; done < tf->numel; done += n) {
        uint32_t group;
        step_consts_run(c, tf->first + done, tf->numel - done, &group, &n);
        dev_adam_arrays at = {.master = a.master + done, .exp_avg = a.exp_avg + done,
                              .exp_avg_sq = a.exp_avg_sq + done, .grad = a.grad + done,
                              .param = (char *)a.param + done * pb, .param_dtype = a.param_dtype};
        ERR_CHECK(dev_adam_step(tf->stream, &c->by_group[group], &at, n));
    }
    if (!on_device) {
        void *dst = pout->tier == STRATA_TIER_HOST ? tarr_host_ptr(pout, &e->tiers.env, tf->first) : tf->param_pinned;
        ERR_CHECK(dev_memcpy_async(tf->stream, dst, tf->param_scratch, tf->numel * pb));
        atomic_fetch_add(&e->ctr.device_to_host, tf->numel * pb);
    }
    return dev_host_fn(tf->stream, stamp_fn, &tf->done_ns);
}

strata_status twin_flow_finish(strata_engine *e, twin_flow *tf, tier_array *pout)
{
    if (!tf || !tf->launched)
        return STRATA_OK;
    tf->launched = false;
    strata_status st = dev_stream_sync(tf->stream);
    if (st == STRATA_OK && pout->tier == STRATA_TIER_NVME)
        st = tarr_write_sync(pout, &e->tiers.env, tf->first, tf->numel, tf->param_pinned);
    if (tf->start_ns && tf->done_ns) {
        char label[64];
        snprintf(label, sizeof label, "elements [%zu, %zu)", tf->first, tf->first + tf->numel);
        trace_event(e->trace, TRACK_DEVICE_ADAM, "device adam", label, tf->start_ns, tf->done_ns);
    }
    if (st != STRATA_OK)
        return err_set(st, "optimizer step: the device share (offload_optimizer.ratio = %g) failed: %s",
                       e->cfg.offload_optimizer_ratio, err_last());
    return STRATA_OK;
}
