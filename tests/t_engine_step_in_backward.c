/*
 * Step in backward (strata.step_in_backward): each module's update runs during backward from its hand-over's
 * staging, and must give bit for bit what the ordinary step gives from the fp32 gradient store, in every placement
 * and dtype where both apply, over several steps of fresh random data, also with gradient clipping that triggers
 * (steps redone) and that does not, fp16 steps skipped, and compressed moments; the same with strata.norm_pass (the
 * norm measured by a first backward: nothing redone, nothing kept), whose second backward must repeat the first.
 * The store is never written (NVMe writes of a run with the store on NVMe shrink by exactly the store's bytes). The
 * combinations it refuses and the misuse of its calls each give their message.
 */
#include <math.h>
#include <string.h>

#include "synth.h"
#include "testlib.h"

static const char *nvme_dir;

/* The optimizer state and the gradient store on NVMe, the parameters in host memory, no host cache. */
static void opt_nvme_grads_nvme(strata_config *c, const char *dir)
{
    synth_use_nvme(c, dir, false, true);
    c->offload_param.device = STRATA_TIER_HOST;
}

static size_t padded(size_t n)
{
    return (n + 4095) / 4096 * 4096;
}

/* Elements of the flat partition of o's model: one module per layer, each padded to 4096 elements. */
static size_t partition_numel(const synth_opts *o)
{
    size_t total = 0;
    for (int l = 0; l < o->layers; l++)
        total += padded((size_t)o->width[l + 1] * o->width[l] + o->width[l + 1]);
    return total;
}

static void compare(const char *label, const synth_opts *o, strata_config c, strata_stats *ord_stats,
                    strata_stats *sib_stats)
{
    float *ref = NULL, *w = NULL, *init = NULL;
    size_t nref = 0, n = 0, ninit = 0;
    strata_stats s0, s1;
    bool norm_pass = c.norm_pass;
    c.step_in_backward = c.norm_pass = false;
    T_OK(synth_train(o, &c, &ref, &nref, NULL, &s0));
    c.step_in_backward = true;
    c.norm_pass = norm_pass;
    double sib_norms[16];
    synth_opts sib = *o;
    if (o->grad_norms)
        sib.grad_norms = sib_norms;
    T_OK(synth_train(&sib, &c, &w, &n, NULL, &s1));
    for (int s = 0; o->grad_norms && s < o->steps; s++)
        T_CHECK(memcmp(&o->grad_norms[s], &sib_norms[s], sizeof sib_norms[s]) == 0, "%s: step %d's gradient norm "
                "%.17g in backward, %.17g by the ordinary step", label, s, sib_norms[s], o->grad_norms[s]);
    synth_opts untrained = *o;
    untrained.grad_norms = NULL;
    untrained.steps = 0;
    T_OK(synth_train(&untrained, &c, &init, &ninit, NULL, NULL));
    if (!ref || !w || !init)
        goto out;
    T_EQ_INT(n, nref);
    size_t first, diffs = synth_count_diff(ref, w, n < nref ? n : nref, &first);
    size_t moved_first, moved = n - synth_count_diff(init, w, n < ninit ? n : ninit, &moved_first);
    printf("%s: %zu of %zu weights differ from the ordinary step (max-diff 0 expected); %zu did not move\n", label,
           diffs, n, moved);
    T_CHECK(diffs == 0, "%s: step in backward vs ordinary: %zu of %zu weights differ; first at %zu: %.9g vs %.9g",
            label, diffs, n, first, first < n ? (double)ref[first] : 0.0, first < n ? (double)w[first] : 0.0);
    T_CHECK(moved < n / 100, "%s: %zu of %zu weights did not train", label, moved, n);
    T_CHECK(s1.steps == s0.steps && s1.skipped_steps == s0.skipped_steps &&
            s1.steps + s1.skipped_steps == (uint64_t)o->steps, "%s: steps %llu (%llu skipped) vs %llu (%llu skipped)",
            label, (unsigned long long)s1.steps, (unsigned long long)s1.skipped_steps, (unsigned long long)s0.steps,
            (unsigned long long)s0.skipped_steps);
    if (ord_stats)
        *ord_stats = s0;
    if (sib_stats)
        *sib_stats = s1;
out:
    free(ref);
    free(w);
    free(init);
}

/* Clipping in every placement: the updates in backward speculate that it will not trigger, and a step where it
 * does is redone, clipped (or, once the norm so far makes it certain, the rest wait for strata_step). */
typedef enum clip_mode {
    CLIP_OFF,
    CLIP_NEVER,   /* a threshold above every norm */
    CLIP_CERTAIN, /* below the first module's norm: certain from the first hand-over, nothing speculates */
    CLIP_MID,     /* between the steps' norms (found by a probe run): some steps redone, after most modules ran */
} clip_mode;

static const char *clip_mode_name[] = {"no clipping", "clipping that never triggers", "clipping certain at once",
                                       "clipping between the steps' norms"};

/* A threshold between the smallest and the largest norm of an unclipped run of o (same data). */
static double probe_clip(const synth_opts *o, strata_config c)
{
    double norms[16] = {0}, lo = 1e300, hi = 0;
    synth_opts p = *o;
    p.grad_norms = norms;
    c.gradient_clipping = 1e30;
    c.step_in_backward = false;
    float *w = NULL;
    size_t n = 0;
    T_OK(synth_train(&p, &c, &w, &n, NULL, NULL));
    free(w);
    for (int s = 0; s < o->steps; s++) {
        if (!isfinite(norms[s]))
            continue; /* an fp16 overflow: skipped, not clipped */
        lo = norms[s] < lo ? norms[s] : lo;
        hi = norms[s] > hi ? norms[s] : hi;
    }
    return (lo + hi) / 2;
}

static void run_placements(strata_dtype dtype, clip_mode mode, strata_moments moments, bool norm_pass)
{
    for (size_t p = 0; p < synth_placement_count; p++) {
        synth_opts o;
        synth_defaults(&o, t_rand_u64());
        o.micro_batches = 1;
        o.steps = 4;
        strata_config c = synth_config(dtype);
        synth_placements[p].apply(&c, nvme_dir);
        double clips[] = {0, 1e12, 1e-6, 0};
        if (dtype == STRATA_DTYPE_FP16) {
            /* Gradients that overflow fp16 at the first steps' loss scale (2^19, halved at each overflow): those
             * steps are skipped (two, with this data). */
            c.initial_scale_power = 19;
            c.hysteresis = 1;
            o.steps = 6;
        }
        c.optimizer_moments = moments;
        c.gradient_clipping = mode == CLIP_MID ? probe_clip(&o, c) : clips[mode];
        c.norm_pass = norm_pass;
        static const char *moments_name[] = {"fp32", "bf16", "8-bit"};
        char label[200];
        snprintf(label, sizeof label, "%s / %s / %s (%g) / %s moments%s", strata_dtype_name(dtype),
                 synth_placements[p].name, clip_mode_name[mode], c.gradient_clipping, moments_name[moments],
                 norm_pass ? " / norm pass" : "");
        double norms[8];
        o.grad_norms = norms;
        strata_stats s0 = {0}, s1 = {0};
        compare(label, &o, c, &s0, &s1);
        uint64_t redone = 0;
        for (int s = 0; mode != CLIP_OFF && s < o.steps; s++)
            redone += isfinite(norms[s]) && norms[s] > c.gradient_clipping; /* an fp16 overflow skips instead */
        printf("%s: %llu of %d steps redone (%llu by the ordinary step's norms), %llu skipped (fp16 overflow), "
               "%.3f s and %llu NVMe bytes in redos\n", label, (unsigned long long)s1.steps_redone, o.steps,
               (unsigned long long)redone, (unsigned long long)s1.skipped_steps, s1.redo_ns * 1e-9,
               (unsigned long long)s1.redo_nvme_bytes);
        if (norm_pass) /* the step is decided before its updates: nothing is redone */
            redone = 0;
        T_CHECK(s1.steps_redone == redone, "%s: %llu steps redone, %llu expected", label,
                (unsigned long long)s1.steps_redone, (unsigned long long)redone);
        T_CHECK(s1.norm_passes == (norm_pass ? (uint64_t)o.steps : 0) && (s1.norm_pass_ns > 0) == norm_pass,
                "%s: %llu norm passes in %llu ns, for %d steps", label, (unsigned long long)s1.norm_passes,
                (unsigned long long)s1.norm_pass_ns, o.steps);
        uint64_t clipped = 0;
        for (int s = 0; mode != CLIP_OFF && s < o.steps; s++)
            clipped += isfinite(norms[s]) && norms[s] > c.gradient_clipping;
        T_CHECK(mode != CLIP_MID || (clipped > 0 && clipped < (uint64_t)o.steps), "%s: %llu of %d steps clipped; the "
                "threshold was to clip some", label, (unsigned long long)clipped, o.steps);
        T_CHECK(s0.steps_redone == 0, "%s: the ordinary step counted %llu redone steps", label,
                (unsigned long long)s0.steps_redone);
        T_CHECK(dtype != STRATA_DTYPE_FP16 || (s1.skipped_steps > 0 && s1.skipped_steps < (uint64_t)o.steps),
                "%s: %llu of %d steps skipped; the loss scale was to overflow some", label,
                (unsigned long long)s1.skipped_steps, o.steps);
    }
}

/* The gradient store on NVMe: the ordinary run writes it once per step (one hand-over per module overwrites it),
 * step in backward never; everything else it writes is the same (the initial state, then master/m/v per step). */
static void store_never_written(void)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.micro_batches = 1;
    o.steps = 3;
    strata_config c = synth_config(STRATA_DTYPE_BF16);
    opt_nvme_grads_nvme(&c, nvme_dir);
    strata_stats s0 = {0}, s1 = {0};
    compare("bf16 / optimizer and gradient store on NVMe", &o, c, &s0, &s1);
    uint64_t numel = partition_numel(&o), store = 4 * numel * (uint64_t)o.steps;
    uint64_t opt = 12 * numel * (uint64_t)(o.steps + 1);
    printf("NVMe writes: ordinary %llu bytes, step in backward %llu bytes (the gradient store: %llu bytes)\n",
           (unsigned long long)s0.host_to_nvme_bytes, (unsigned long long)s1.host_to_nvme_bytes,
           (unsigned long long)store);
    printf("NVMe reads: ordinary %llu bytes, step in backward %llu bytes\n",
           (unsigned long long)s0.nvme_to_host_bytes, (unsigned long long)s1.nvme_to_host_bytes);
    T_EQ_INT(s1.host_to_nvme_bytes, opt);
    T_EQ_INT(s0.host_to_nvme_bytes - s1.host_to_nvme_bytes, store);
    T_CHECK(s1.nvme_to_host_bytes <= 12 * numel * (uint64_t)o.steps, "step in backward read %llu bytes, more than "
            "master/m/v once per step", (unsigned long long)s1.nvme_to_host_bytes);
}

/* The host cache mirrors whole modules of the optimizer state when the update runs per module: with sub-groups that
 * cut across modules (3 x 4096 elements; three modules of 5200 elements padded to 8192, so the second spans
 * [8192, 16384) across the boundary at 12288), every piece step in backward reads is still served from host memory,
 * so a run with everything mirrored reads nothing from the drive. */
static void optimizer_state_cached(void)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    int widths[] = {64, 80, 64, 80};
    o.layers = 3;
    memcpy(o.width, widths, sizeof widths);
    o.micro_batches = 1;
    o.steps = 3;
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    synth_use_nvme(&c, nvme_dir, false, true);
    c.offload_param.device = STRATA_TIER_HOST;
    c.gradients_on_nvme = STRATA_SWITCH_OFF;
    c.host_cache = true;
    c.sub_group_size = 3 * 4096;
    strata_stats s0 = {0}, s1 = {0};
    compare("fp32 / optimizer state on NVMe, mirrored whole, sub-groups across modules", &o, c, &s0, &s1);
    printf("NVMe reads: ordinary %llu bytes, step in backward %llu bytes; host cache served %llu bytes to step in "
           "backward\n", (unsigned long long)s0.nvme_to_host_bytes, (unsigned long long)s1.nvme_to_host_bytes,
           (unsigned long long)s1.host_cache_read_bytes);
    T_EQ_INT(s1.nvme_to_host_bytes, 0);
    T_CHECK(s1.host_cache_read_bytes >= 12 * partition_numel(&o) * (uint64_t)o.steps,
            "the host cache served %llu bytes, less than master/m/v once per step (%llu)",
            (unsigned long long)s1.host_cache_read_bytes,
            (unsigned long long)(12 * partition_numel(&o) * (uint64_t)o.steps));
}

/* A step whose backward handed nothing over updates every module with zero gradients, as the ordinary one does. */
static void no_gradients(void)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    float a[64], b[64];
    for (int mode = 0; mode < 2; mode++) {
        strata_config c = synth_config(STRATA_DTYPE_FP32);
        c.step_in_backward = mode == 1;
        strata_engine *e = NULL;
        T_OK(synth_engine(&o, &c, &e));
        if (!e)
            return;
        for (int s = 0; s < 2; s++) {
            T_OK(strata_step_begin(e, NULL));
            T_OK(strata_step(e, NULL, NULL));
        }
        T_OK(strata_param_read_master(e, 0, 0, 64, mode ? b : a));
        strata_engine_destroy(e);
    }
    size_t first, diffs = synth_count_diff(a, b, 64, &first);
    T_CHECK(diffs == 0, "no gradients: %zu of 64 weights differ; first at %zu", diffs, first);
}

/* Writes the deterministic gradient of (step, use) into every parameter of module l (params 2l and 2l + 1), in
 * dtype: random values in [-1, 1) (as bf16, their top 16 bits). */
static void write_grads(strata_engine *e, const synth_opts *o, int l, int step, int use, strata_dtype dtype)
{
    for (int k = 0; k < 2; k++) {
        strata_param_id p = (strata_param_id)(2 * l + k);
        size_t n = k == 0 ? (size_t)o->width[l + 1] * o->width[l] : (size_t)o->width[l + 1];
        void *g = strata_grad_data(e, p);
        T_CHECK(g != NULL, "strata_grad_data: %s", strata_last_error(e));
        if (!g)
            return;
        for (size_t i = 0; i < n; i++) {
            float v = synth_init_value(o->seed + (uint64_t)(step * 8 + use), 2 * l + k, i) * 7.0f;
            if (dtype == STRATA_DTYPE_FP32) {
                ((float *)g)[i] = v;
            } else {
                uint32_t bits;
                memcpy(&bits, &v, 4);
                ((uint16_t *)g)[i] = (uint16_t)(bits >> 16);
            }
        }
    }
}

/* A module used twice in a step (tied weights: the GPT embeddings and head): with a declared order whose forward
 * is followed by a second use of layer 0 before backward, layer 0 is handed over twice per step. The first
 * hand-over is summed (fp32) and the update starts at the second: bit-identical to the ordinary step's store.
 * Without a declared order (step 1 records it) the first hand-over is the last, and the second is refused. */
static void tied(strata_dtype dtype, double clip, bool norm_pass)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    int L = o.layers;
    strata_module_id order[2 * SYNTH_MAX_LAYERS + 1];
    size_t k = 0;
    for (int l = 0; l < L; l++)
        order[k++] = (strata_module_id)l;
    order[k++] = 0;
    for (int l = L - 1; l >= 0; l--)
        order[k++] = (strata_module_id)l;
    size_t n = 0;
    for (int l = 0; l < L; l++)
        n += (size_t)o.width[l + 1] * o.width[l];
    float *w[2] = {calloc(n, 4), calloc(n, 4)};
    /* modes: the ordinary step; step in backward (with norm_pass, each step's hand-overs made twice); no order */
    for (int mode = 0; mode < (norm_pass ? 2 : 3) && w[0] && w[1]; mode++) {
        strata_config c = synth_config(dtype);
        c.step_in_backward = mode != 0;
        c.norm_pass = norm_pass && mode != 0;
        c.gradient_clipping = clip;
        strata_engine *e = NULL;
        T_OK(synth_engine(&o, &c, &e));
        if (!e)
            break;
        if (mode != 2)
            T_OK(strata_module_order(e, order, k));
        for (int s = 0; s < 3; s++) {
            T_OK(strata_step_begin(e, NULL));
            for (int pass = c.norm_pass ? 0 : 1; pass < 2; pass++) {
                if (pass == 1 && c.norm_pass)
                    T_OK(strata_norm_pass_end(e, NULL));
                for (int l = 0; l < L; l++) {
                    T_OK(strata_fetch(e, (strata_module_id)l));
                    T_OK(strata_release(e, (strata_module_id)l));
                }
                T_OK(strata_fetch(e, 0)); /* the tied use */
                write_grads(e, &o, 0, s, 0, dtype);
                T_OK(strata_grads_ready(e, 0));
                T_OK(strata_release(e, 0));
                for (int l = L - 1; l >= 0; l--) {
                    T_OK(strata_fetch(e, (strata_module_id)l));
                    write_grads(e, &o, l, s, 1, dtype);
                    strata_status st = strata_grads_ready(e, (strata_module_id)l);
                    if (mode == 2 && l == 0) {
                        T_CHECK(st == STRATA_ESTATE, "tied, no declared order: the second hand-over gave %s",
                                strata_status_name(st));
                        T_CONTAINS(strata_last_error(e),
                                   "the module's gradients were already handed over in this step");
                        T_CONTAINS(strata_last_error(e), "only when the fetch order is declared (strata_module_order)");
                    } else {
                        T_CHECK(st == STRATA_OK, "tied: grads_ready(%d): %s", l, strata_last_error(e));
                    }
                    T_OK(strata_release(e, (strata_module_id)l));
                }
            }
            T_OK(strata_step(e, NULL, NULL));
            if (mode == 2)
                break;
        }
        size_t pos = 0;
        for (int l = 0; mode != 2 && l < L; l++) {
            size_t nw = (size_t)o.width[l + 1] * o.width[l];
            T_OK(strata_param_read_master(e, (strata_param_id)(2 * l), 0, nw, w[mode] + pos));
            pos += nw;
        }
        strata_engine_destroy(e);
    }
    size_t first, diffs = synth_count_diff(w[0], w[1], n, &first);
    printf("tied %s, clipping %g%s: %zu of %zu weights differ from the ordinary step\n", strata_dtype_name(dtype), clip,
           norm_pass ? ", norm pass" : "", diffs, n);
    T_CHECK(diffs == 0, "tied %s, clipping %g: %zu of %zu weights differ; first at %zu: %.9g vs %.9g",
            strata_dtype_name(dtype), clip, diffs, n, first, first < n ? (double)w[0][first] : 0.0, first < n ? (double)w[1][first] : 0.0);
    free(w[0]);
    free(w[1]);
}

/* A checkpoint between steps: 2 steps, save, a fresh engine loads and runs 2 more = 4 steps uninterrupted. */
static void checkpoint(void)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.micro_batches = 1;
    o.steps = 4;
    o.lr_decay = 0.9;
    strata_config c = synth_config(STRATA_DTYPE_BF16);
    opt_nvme_grads_nvme(&c, nvme_dir);
    c.step_in_backward = true;
    float *ref = NULL, *w = NULL, *tmp = NULL;
    size_t nref = 0, n = 0, ntmp = 0;
    T_OK(synth_train(&o, &c, &ref, &nref, NULL, NULL));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt", nvme_dir);
    synth_opts first = o;
    first.steps = 2;
    first.save_dir = dir;
    first.save_after = 2;
    T_OK(synth_train(&first, &c, &tmp, &ntmp, NULL, NULL));
    synth_opts second = o;
    second.steps = 2;
    second.first_step = 2;
    second.load_dir = dir;
    T_OK(synth_train(&second, &c, &w, &n, NULL, NULL));
    if (ref && w) {
        size_t f, diffs = synth_count_diff(ref, w, n < nref ? n : nref, &f);
        printf("checkpoint: %zu of %zu weights differ from the uninterrupted run\n", diffs, n);
        T_CHECK(diffs == 0 && n == nref, "checkpoint: %zu of %zu weights differ; first at %zu", diffs, n, f);
    }
    free(ref);
    free(w);
    free(tmp);
}

/* strata.norm_pass whose second backward gives other gradients than the first: strata_step fails naming the module,
 * before anything is updated (the module that differs is the first handed over), and the step run again with the
 * first's gradients ends where the ordinary step ends, bit for bit. */
static void norm_pass_differs(strata_dtype dtype, void (*place)(strata_config *, const char *), const char *where)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.micro_batches = 1;
    o.steps = 3;
    strata_config c = synth_config(dtype);
    place(&c, nvme_dir);
    c.gradient_clipping = 1e-6; /* triggers: the clip factor the norm pass fixed is the one the updates use */
    c.norm_pass = true;
    char error[1024] = "(not failed)";
    o.norm_pass_differ_at = 2;
    o.norm_pass_error = error;
    char label[160];
    snprintf(label, sizeof label, "norm pass, second backward differs at step 2 (%s, %s)", strata_dtype_name(dtype),
             where);
    compare(label, &o, c, NULL, NULL);
    printf("%s: strata_step said: %s\n", label, error);
    T_CONTAINS(error, "module \"layer3\": its gradients in the second backward are not the norm pass's (sum of "
               "squares");
    T_CONTAINS(error, "load the last checkpoint, and make the backward repeatable or set strata.norm_pass to false");
}

static void refused(const char *label, strata_config c, const char *key_text)
{
    synth_opts o;
    synth_defaults(&o, 1);
    c.step_in_backward = true;
    strata_engine *e = NULL;
    T_STATUS(synth_engine(&o, &c, &e), STRATA_ECONFIG);
    printf("%s: %s\n", label, strata_last_error(NULL));
    T_CONTAINS(strata_last_error(NULL), "strata.step_in_backward = true with");
    T_CONTAINS(strata_last_error(NULL), key_text);
    strata_engine_destroy(e);
}

static void refusals(void)
{
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c = synth_config(STRATA_DTYPE_FP32);
    c.delayed_update = true;
    refused("delayed update", c, "strata.delayed_update = true");
    c = synth_config(STRATA_DTYPE_FP32);
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.offload_optimizer_ratio = 0.5;
    refused("twin-flow", c, "ratio = 0.5: step in backward runs every update on the CPU");
    c = synth_config(STRATA_DTYPE_FP32);
    c.norm_pass = true;
    c.step_in_backward = true;
    synth_opts o;
    synth_defaults(&o, 1);
    strata_engine *e = NULL;
    T_STATUS(synth_engine(&o, &c, &e), STRATA_ECONFIG);
    printf("norm pass without clipping: %s\n", strata_last_error(NULL));
    T_CONTAINS(strata_last_error(NULL), "strata.norm_pass = true without gradient_clipping or fp16: the norm pass "
               "decides clipping (and an fp16 overflow) before the updates run");
    c.gradient_clipping = 1;
    c.step_in_backward = false;
    T_STATUS(synth_engine(&o, &c, &e), STRATA_ECONFIG);
    printf("norm pass without step in backward: %s\n", strata_last_error(NULL));
    T_CONTAINS(strata_last_error(NULL), "strata.norm_pass = true with strata.step_in_backward = false");
    strata_engine_destroy(e);
}

/* The calls' contract: begin before the hand-overs, one hand-over per module and step, strata_step's lr. */
static void misuse(void)
{
    synth_opts o;
    synth_defaults(&o, 2);
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.step_in_backward = true;
    strata_engine *e = NULL;
    T_OK(synth_engine(&o, &c, &e));
    if (!e)
        return;
    /* module 0 is "layer0" with parameters 0 (weight) and 1 (bias) */
    T_OK(strata_fetch(e, 0));
    T_CHECK(strata_grad_data(e, 0) && strata_grad_data(e, 1), "grad_data: %s", strata_last_error(e));
    T_STATUS(strata_grads_ready(e, 0), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_grads_ready(\"layer0\"): strata.step_in_backward is on and no step was "
               "begun: call strata_step_begin(engine, args) before the backward of every step");
    T_OK(strata_release(e, 0));
    T_STATUS(strata_step(e, NULL, NULL), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_step: strata.step_in_backward is on and the step was not begun");

    strata_step_args args = {.lr = 3e-3};
    T_OK(strata_step_begin(e, &args));
    T_STATUS(strata_step_begin(e, &args), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_step_begin: a step is already begun");
    T_OK(strata_fetch(e, 0));
    T_CHECK(strata_grad_data(e, 0) && strata_grad_data(e, 1), "grad_data: %s", strata_last_error(e));
    T_OK(strata_grads_ready(e, 0));
    T_CHECK(strata_grad_data(e, 0) && strata_grad_data(e, 1), "grad_data: %s", strata_last_error(e));
    T_STATUS(strata_grads_ready(e, 0), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_grads_ready(\"layer0\"): the module's gradients were already handed "
               "over in this step and its update has started; with strata.step_in_backward a module's update starts "
               "at its last hand-over of the step (the one after which the fetch order has no more fetches of it), "
               "so gradient accumulation must be 1");
    T_OK(strata_release(e, 0));
    strata_step_args other = {.lr = 1e-3};
    T_STATUS(strata_step(e, &other, NULL), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(e), "but strata_step_begin began this step with lr = 0.0030000000000000001");
    strata_step_result r;
    T_OK(strata_step(e, &args, &r));
    T_EQ_INT(r.step, 1);
    T_STATUS(strata_step_begin(e, &(strata_step_args){.lr = -1}), STRATA_EINVAL);
    strata_engine_destroy(e);

    /* Without step in backward, strata_step_begin only checks its args. */
    c.step_in_backward = false;
    T_OK(synth_engine(&o, &c, &e));
    if (!e)
        return;
    T_OK(strata_step_begin(e, NULL));
    T_OK(strata_step_begin(e, NULL));
    T_STATUS(strata_step_begin(e, &(strata_step_args){.lr = 1.0 / 0.0}), STRATA_EINVAL);
    T_STATUS(strata_norm_pass_end(e, NULL), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_norm_pass_end: strata.norm_pass is off");
    strata_engine_destroy(e);

    /* With the norm pass: strata_norm_pass_end once per begun step, before strata_step. */
    c.step_in_backward = c.norm_pass = true;
    c.gradient_clipping = 1;
    T_OK(synth_engine(&o, &c, &e));
    if (!e)
        return;
    T_STATUS(strata_norm_pass_end(e, NULL), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_norm_pass_end: no step was begun");
    T_OK(strata_step_begin(e, NULL));
    T_STATUS(strata_step(e, NULL, NULL), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_step: strata.norm_pass is on and this step's norm pass did not end");
    double norm = -2;
    T_OK(strata_norm_pass_end(e, &norm));
    T_CHECK(norm == 0, "a norm pass without hand-overs measured %g", norm);
    T_STATUS(strata_norm_pass_end(e, NULL), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_norm_pass_end: this step's norm pass already ended");
    T_OK(strata_step(e, NULL, &r));
    T_EQ_INT(r.step, 1);
    T_CHECK(r.grad_norm == 0, "grad_norm %g", r.grad_norm);
    /* A load between the two backwards would update the loaded state with what the norm pass measured of the old. */
    T_OK(strata_step_begin(e, NULL));
    T_OK(strata_fetch(e, 0));
    T_CHECK(strata_grad_data(e, 0) && strata_grad_data(e, 1), "grad_data: %s", strata_last_error(e));
    T_OK(strata_grads_ready(e, 0));
    T_OK(strata_release(e, 0));
    T_OK(strata_norm_pass_end(e, NULL));
    T_STATUS(strata_load(e, nvme_dir), STRATA_ESTATE);
    T_CONTAINS(strata_last_error(e), "strata_load: a step in backward is under way");
    strata_engine_destroy(e);
}

int main(void)
{
    t_rng_seed();
    nvme_dir = t_scratch_dir("t_engine_step_in_backward");
    misuse();
    refusals();
    no_gradients();
    tied(STRATA_DTYPE_FP32, 0, false);
    tied(STRATA_DTYPE_BF16, 0, false);
    tied(STRATA_DTYPE_BF16, 1e-3, false); /* triggers: the tied module's redo reads its fp32 sum */
    checkpoint();
    store_never_written();
    optimizer_state_cached();
    run_placements(STRATA_DTYPE_FP32, CLIP_OFF, STRATA_MOMENTS_FP32, false);
    run_placements(STRATA_DTYPE_BF16, CLIP_OFF, STRATA_MOMENTS_FP32, false);
    run_placements(STRATA_DTYPE_FP32, CLIP_MID, STRATA_MOMENTS_FP32, false);
    run_placements(STRATA_DTYPE_BF16, CLIP_MID, STRATA_MOMENTS_FP32, false);
    run_placements(STRATA_DTYPE_BF16, CLIP_CERTAIN, STRATA_MOMENTS_FP32, false);
    run_placements(STRATA_DTYPE_BF16, CLIP_NEVER, STRATA_MOMENTS_FP32, false);
    /* overflows skip steps: the updates undone */
    run_placements(STRATA_DTYPE_FP16, CLIP_OFF, STRATA_MOMENTS_FP32, false);
    run_placements(STRATA_DTYPE_FP16, CLIP_MID, STRATA_MOMENTS_FP32, false);
    /* Compressed moments (strata.optimizer_moments): the bf16 rounding bits are drawn by element index, so the
     * module pieces of the updates in backward draw what the ordinary step's sub-groups draw. */
    run_placements(STRATA_DTYPE_BF16, CLIP_OFF, STRATA_MOMENTS_BF16, false);
    run_placements(STRATA_DTYPE_BF16, CLIP_MID, STRATA_MOMENTS_BF16, false);
    run_placements(STRATA_DTYPE_BF16, CLIP_OFF, STRATA_MOMENTS_8BIT, false);
    run_placements(STRATA_DTYPE_BF16, CLIP_MID, STRATA_MOMENTS_8BIT, false);
    /* The norm pass: each step decided before its updates, which then run once, clipped. */
    run_placements(STRATA_DTYPE_FP32, CLIP_MID, STRATA_MOMENTS_FP32, true);
    run_placements(STRATA_DTYPE_BF16, CLIP_MID, STRATA_MOMENTS_FP32, true);
    run_placements(STRATA_DTYPE_BF16, CLIP_NEVER, STRATA_MOMENTS_FP32, true);
    run_placements(STRATA_DTYPE_FP16, CLIP_OFF, STRATA_MOMENTS_FP32, true); /* an overflow skips: nothing updated */
    run_placements(STRATA_DTYPE_BF16, CLIP_MID, STRATA_MOMENTS_8BIT, true);
    tied(STRATA_DTYPE_BF16, 1e-3, true);
    norm_pass_differs(STRATA_DTYPE_BF16, synth_placements[0].apply, synth_placements[0].name);
    norm_pass_differs(STRATA_DTYPE_FP32, opt_nvme_grads_nvme, "optimizer on NVMe");
    return t_done();
}
