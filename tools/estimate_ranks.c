#include "tools/estimate_ranks.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan_ranks.h"
#include "tools/estimate_bandwidth.h"

#define WORLD(flag, field, kind_, lo_, hi_, meta_, text, hint_)                                                   \
    {.name = flag, .kind = kind_, .offset = offsetof(estimate_ranks, field), .lo = lo_, .hi = hi_, .meta = meta_,   \
     .help = text, .hint = hint_}
#define RATE(flag, field, meta_, text, hint_)                                                                       \
    {.name = flag, .kind = CLI_REAL, .offset = offsetof(estimate_ranks, field), .lo = 0, .hi = 1e6, .open_lo = true, \
     .meta = meta_, .what = "a rate", .help = text, .hint = hint_}

const cli_opt estimate_ranks_opts[ESTIMATE_RANKS_NOPTS] = {
    WORLD("--world-size", world_size, CLI_INT, 1, 1000000, "N", "ranks, {} (default 1)",
          "the number of data-parallel ranks to plan for, e.g. --world-size 64"),
    WORLD("--stage", zero_stage, CLI_INT, 0, 3, "S", "ZeRO stage, {} (default: the config's)",
          "ZeRO stages: 0 replicated, 1 partitions the optimizer state, 2 also the gradients, 3 also the parameters"),
    WORLD("--params", params, CLI_COUNT, 1, 1e15, "COUNT",
          "a bare parameter count instead of a shape: 7.5e9, 7.5B, 125M, 350000000; planned as equal modules of "
          "--module-params COUNT (default 100M, a transformer layer's order) with no tied embeddings and no "
          "activations: a count has no layers, so the largest module, the prefetch window and the collectives' "
          "scratch follow the module size you give",
          "write a parameter count like 7.5e9, 7.5B, 125M or 350000000"),
    WORLD("--module-params", module_params, CLI_COUNT, 1, 1e15, "COUNT", "the parameters of one module of --params",
          "the parameters of one module of a bare --params count, e.g. 200M"),
    WORLD("--trainable-params", trainable, CLI_COUNT, 1, 1e15, "COUNT",
          "of --params, the ones trained (LoRA's adapters, say): the rest are frozen modules, with parameters only (no "
          "gradients, no optimizer state), as strata.torch keeps parameters with requires_grad=False",
          "the trained part of a bare --params count, e.g. 4.2M for LoRA r=8 on a 7B model's q and v"),
    WORLD("--grad-accum", grad_accum, CLI_INT, 1, 1000000, "K", "micro-batches per optimizer step (default 1)",
          "micro-batches per optimizer step"),
    RATE("--link-gbps", link_gbps, "G", "interconnect bandwidth per rank in Gbit/s (8 Gbit/s = 1 GB/s); enables the "
         "bandwidth analysis; --nvme-gbps, --pcie-gbps (Gbit/s too) add those links to it",
         "Gbit/s per rank, e.g. 100 (8 Gbit/s = 1 GB/s)"),
    RATE("--nvme-gbps", nvme_gbps, "G", "NVMe bandwidth per rank in Gbit/s", "Gbit/s per rank, e.g. 100 (8 Gbit/s = 1 GB/s)"),
    RATE("--pcie-gbps", pcie_gbps, "G", "PCIe bandwidth per rank in Gbit/s", "Gbit/s per rank, e.g. 100 (8 Gbit/s = 1 GB/s)"),
    WORLD("--tokens", tokens, CLI_COUNT, 1, 1e12, "N",
          "tokens per rank per micro-batch (default --batch x the shape's seq; --batch default 1)",
          "tokens per rank per micro-batch (batch x sequence length)"),
    {.name = "--json", .kind = CLI_SWITCH, .offset = offsetof(estimate_ranks, json),
     .help = "one JSON object with the same numbers"},
};
#undef WORLD
#undef RATE

size_t estimate_ranks_module_params(const estimate_ranks *r)
{
    size_t m = r->module_params ? r->module_params : ESTIMATE_MODULE_PARAMS_DEFAULT;
    return m < r->params ? m : r->params;
}

bool estimate_ranks_settle(estimate_ranks *r, const strata_config *cfg)
{
    if (r->module_params && !r->params) {
        fprintf(stderr, "strata estimate: --module-params cuts a bare --params count into modules; a model shape "
                "(--model or --layers/--hidden) has its own modules\n");
        return false;
    }
    if (r->trainable && (!r->params || r->trainable > r->params)) {
        fprintf(stderr, "strata estimate: --trainable-params is the trained part of a bare --params count (at most "
                "it)%s\n", r->params ? "" : "; give --params too");
        return false;
    }
    if (r->zero_stage < 0)
        r->zero_stage = cfg->zero_stage;
    if (cfg->offload_param.device != STRATA_TIER_DEVICE && cfg->offload_param.device != STRATA_TIER_AUTO &&
        r->zero_stage != 3) {
        fprintf(stderr, "strata estimate: --stage %d with zero_optimization.offload_param.device = \"%s\": parameters "
                "are only offloaded when they are partitioned (stage 3); use --stage 3 or keep parameters on the "
                "device\n", r->zero_stage, cfg->offload_param.device == STRATA_TIER_NVME ? "nvme" : "cpu");
        return false;
    }
    return true;
}

/* Everything the world's blocks print, computed once so the table and the JSON cannot disagree. */
typedef struct world_numbers {
    plan_model_states states[4]; /* per stage */
    plan_comm comm;              /* what the engine moves and counts in comm_bytes */
    plan_comm paper;             /* the ZeRO paper's count: Ψ unpadded, no tied module */
    plan_traffic traffic;
    size_t tokens;
    bw_analysis bw;
} world_numbers;

/* What the engine's comm_bytes counts (comm/comm.h, Counting; engine/ranks/ranks.c): every collective moves whole padded
 * modules, each cut into N shards of whole blocks (so N times this rank's shards, in->shard_numel), and a module the
 * trainer fetches and hands over once more per micro-batch (tied_numel, padded) adds a reduce-scatter from stage 2
 * and an all-gather at stage 3 each micro-batch. */
static void engine_comm(const estimate_ranks *r, const plan_input *in, size_t padded, size_t tied_numel,
                        plan_comm *out)
{
    size_t k = (size_t)r->grad_accum;
    plan_comm_per_step(padded, r->world_size, r->zero_stage, r->grad_accum, in->param_bytes, out);
    if (r->world_size <= 1)
        return;
    if (r->zero_stage >= 2) {
        out->reduce_scatter_elements += k * tied_numel;
        out->reduce_scatter_bytes += 4 * k * tied_numel;
    }
    if (r->zero_stage >= 3) {
        out->all_gather_elements += k * tied_numel;
        out->all_gather_bytes += in->param_bytes * k * tied_numel;
    }
}

static void compute(const estimate_ranks *r, const plan_input *in, size_t numel, int seq, size_t tied_numel,
                    world_numbers *w)
{
    for (int s = 0; s < 4; s++)
        plan_model_states_per_rank(numel, r->world_size, s, &w->states[s]);
    plan_comm_per_step(numel, r->world_size, r->zero_stage, r->grad_accum, in->param_bytes, &w->paper);
    /* Every module is padded to N shards of whole blocks at every stage: the collectives move whole padded modules,
     * and each hand-over copies one off the device. */
    size_t padded = r->world_size > 1 && in->shard_numel ? (size_t)r->world_size * in->shard_numel : in->total_numel;
    engine_comm(r, in, padded, tied_numel, &w->comm);
    size_t np, ng, no;
    plan_class_numel(in, &np, &ng, &no);
    plan_traffic_per_step(padded, no, r->zero_stage, r->grad_accum, in->param_bytes, in->param_tier, in->opt_tier,
                          in->grad_tier, plan_opt_elem_bytes(in->moments), &w->traffic);
    /* The tied module's second hand-over per micro-batch copies its gradients off the device once more. */
    w->traffic.device_to_host_bytes += in->param_bytes * (size_t)r->grad_accum * tied_numel;
    w->tokens = r->tokens ? r->tokens : (size_t)r->batch * (size_t)seq;
    /* Training a transformer costs about 6 flops per parameter per token (2 forward, 4 backward); strata's
     * trainer does not recompute activations, so there is no 8th. */
    double flops = 6.0 * (double)numel * (double)w->tokens * r->grad_accum;
    const plan_traffic *t = &w->traffic;
    double bytes[BW_NLINKS] = {(double)(w->comm.reduce_scatter_bytes + w->comm.all_gather_bytes),
                               (double)(t->nvme_read_bytes + t->nvme_write_bytes),
                               (double)(t->host_to_device_bytes + t->device_to_host_bytes)};
    double gbps[BW_NLINKS] = {r->link_gbps, r->nvme_gbps, r->pcie_gbps};
    estimate_bandwidth_analyze(flops, r->tflops * 1e12, bytes, gbps, &w->bw);
}

static json_t *world_json(const estimate_ranks *r, const plan *p, size_t numel, const world_numbers *w)
{
    const plan_model_states *m = &w->states[r->zero_stage];
    const plan_comm *c = &w->comm;
    const plan_traffic *t = &w->traffic;
    json_t *lines = json_array();
    for (int i = 0; i < p->nlines; i++)
        json_array_append_new(lines, json_pack("{s:s, s:s, s:I}", "what", p->lines[i].what, "tier",
                                               strata_tier_name(p->lines[i].tier), "bytes", (json_int_t)p->lines[i].bytes));
    json_t *o = json_pack(
        "{s:I, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:I, s:I, s:I}, s:o,"
        " s:{s:I, s:I, s:I, s:I}}",
        "params", (json_int_t)numel, "world_size", r->world_size, "zero_stage", r->zero_stage, "grad_accum",
        (json_int_t)r->grad_accum, "model_states_per_rank_bytes", (json_int_t)m->total_bytes, "params_per_rank_bytes",
        (json_int_t)m->params_bytes, "grads_per_rank_bytes", (json_int_t)m->grads_bytes, "optimizer_per_rank_bytes",
        (json_int_t)m->optimizer_bytes, "model_states_per_rank_gb", (double)m->total_bytes / 1e9,
        "comm_elements_per_step", (json_int_t)(c->reduce_scatter_elements + c->all_gather_elements),
        "comm_bytes_per_step", (json_int_t)(c->reduce_scatter_bytes + c->all_gather_bytes),
        "reduce_scatter_elements_per_step", (json_int_t)c->reduce_scatter_elements, "all_gather_elements_per_step",
        (json_int_t)c->all_gather_elements, "reduce_scatter_bytes_per_step", (json_int_t)c->reduce_scatter_bytes,
        "all_gather_bytes_per_step", (json_int_t)c->all_gather_bytes, "tier_bytes", "device",
        (json_int_t)p->tier_bytes[STRATA_TIER_DEVICE], "host", (json_int_t)p->tier_bytes[STRATA_TIER_HOST], "nvme",
        (json_int_t)p->tier_bytes[STRATA_TIER_NVME], "plan_lines", lines, "offload_bytes_per_step", "nvme_read",
        (json_int_t)t->nvme_read_bytes, "nvme_write", (json_int_t)t->nvme_write_bytes, "host_to_device",
        (json_int_t)t->host_to_device_bytes, "device_to_host", (json_int_t)t->device_to_host_bytes);
    if (r->link_gbps > 0) {
        const bw_analysis *b = &w->bw;
        json_object_set_new(o, "tokens_per_micro_batch", json_integer((json_int_t)w->tokens));
        json_object_set_new(o, "flops_per_step", json_real(b->flops));
        json_object_set_new(o, "compute_time_s", json_real(b->compute_s));
        json_object_set_new(o, "comm_time_s", json_real(b->links[BW_LINK].time_s));
        json_object_set_new(o, "nvme_time_s", json_real(b->links[BW_NVME].time_s));
        json_object_set_new(o, "pcie_time_s", json_real(b->links[BW_PCIE].time_s));
        json_object_set_new(o, "step_time_lower_bound_s", json_real(b->lower_bound_s));
        json_object_set_new(o, "step_time_no_overlap_s", json_real(b->no_overlap_s));
        json_object_set_new(o, "efficiency", json_real(b->efficiency));
        json_object_set_new(o, "efficiency_no_overlap", json_real(b->efficiency_no_overlap));
        json_object_set_new(o, "link_ait_flop_per_byte", json_real(b->links[BW_LINK].ait_flop_per_byte));
        json_object_set_new(o, "link_efficiency_ait", json_real(b->links[BW_LINK].efficiency_alone));
    }
    /* The paper's count beside the engine's: Ψ unpadded, no tied module (comm_* above is what comm_bytes logs). */
    json_object_set_new(o, "paper_comm_elements_per_step",
                        json_integer((json_int_t)(w->paper.reduce_scatter_elements + w->paper.all_gather_elements)));
    json_object_set_new(o, "paper_comm_bytes_per_step",
                        json_integer((json_int_t)(w->paper.reduce_scatter_bytes + w->paper.all_gather_bytes)));
    return o;
}

static void print_table(const estimate_ranks *r, const strata_config *cfg, size_t numel, size_t tied_numel,
                        const world_numbers *w)
{
    static const char *parts[4] = {"nothing (replicated)", "optimizer state", "+ gradients", "+ parameters"};
    printf("\nZeRO model states per rank: %zu parameters, %d ranks, mixed precision + Adam (2 + 2 + K = 12 bytes)%s\n",
           numel, r->world_size, r->trainable ? "; the paper's accounting trains every parameter (the plan above "
           "counts the frozen ones as parameters only)" : "");
    printf("%-6s %-21s %16s %16s %16s %16s %8s\n", "STAGE", "PARTITIONED", "PARAMS_BYTES", "GRADS_BYTES",
           "OPTIMIZER_BYTES", "PER_RANK_BYTES", "GB");
    for (int s = 0; s < 4; s++) {
        const plan_model_states *m = &w->states[s];
        printf("%d%-5s %-21s %16zu %16zu %16zu %16zu %8.1f\n", s, s == r->zero_stage ? " *" : "", parts[s],
               m->params_bytes, m->grads_bytes, m->optimizer_bytes, m->total_bytes, (double)m->total_bytes / 1e9);
    }
    const plan_comm *c = &w->comm;
    double psi = (double)numel;
    printf("\nCOMMUNICATION per rank per step, stage %d, %d micro-batch%s per step\n", r->zero_stage, r->grad_accum,
           r->grad_accum == 1 ? "" : "es");
    printf("%-28s %20s %8s %20s\n", "COLLECTIVE", "ELEMENTS", "x PARAMS", "BYTES");
    printf("%-28s %20zu %7.2fΨ %20zu\n", "reduce-scatter (fp32)", c->reduce_scatter_elements,
           (double)c->reduce_scatter_elements / psi, c->reduce_scatter_bytes);
    char ag[40];
    snprintf(ag, sizeof ag, "all-gather (%s)", r->zero_stage == 0 ? "fp32" : strata_dtype_name(cfg->param_dtype));
    printf("%-28s %20zu %7.2fΨ %20zu\n", ag, c->all_gather_elements, (double)c->all_gather_elements / psi,
           c->all_gather_bytes);
    size_t ce = c->reduce_scatter_elements + c->all_gather_elements;
    printf("%-28s %20zu %7.2fΨ %20zu\n", "total", ce, (double)ce / psi, c->reduce_scatter_bytes + c->all_gather_bytes);
    size_t pe = w->paper.reduce_scatter_elements + w->paper.all_gather_elements;
    if (r->world_size > 1)
        printf("(what comm_bytes will log: whole modules, each padded to %d shards of 4096-element blocks%s; the ZeRO "
               "paper's count is %.2fΨ, %zu bytes)\n", r->world_size, tied_numel && r->zero_stage >= 2
               ? ", and the tied embeddings fetched and handed over once more per micro-batch" : "", (double)pe / psi,
               w->paper.reduce_scatter_bytes + w->paper.all_gather_bytes);

    const plan_traffic *t = &w->traffic;
    printf("\n%-28s %20s\n", "OFFLOAD per rank per step", "BYTES");
    printf("%-28s %20zu\n%-28s %20zu\n%-28s %20zu\n%-28s %20zu\n", "nvme read", t->nvme_read_bytes, "nvme write",
           t->nvme_write_bytes, "host -> device", t->host_to_device_bytes, "device -> host", t->device_to_host_bytes);
    if (r->link_gbps <= 0)
        return;
    const bw_analysis *b = &w->bw;
    printf("\nBANDWIDTH (ZeRO-Infinity): %.4g flops per step per rank = 6 x params x %zu tokens x %d micro-batch%s "
           "at %.4g TFLOP/s\n", b->flops, w->tokens, r->grad_accum, r->grad_accum == 1 ? "" : "es", r->tflops);
    printf("%-28s %14s %12s %14s %12s\n", "WHAT", "BYTES", "GBIT/S", "SECONDS", "EFF (AIT)");
    printf("%-28s %14s %12s %14.4f %12s\n", "compute", "-", "-", b->compute_s, "-");
    for (int i = 0; i < BW_NLINKS; i++) {
        const bw_link *l = &b->links[i];
        if (l->bytes_per_s > 0)
            printf("%-28s %14.4g %12.4g %14.4f %12.3f\n", l->name, l->bytes, l->bytes_per_s * 8 / 1e9, l->time_s,
                   l->efficiency_alone);
    }
    printf("%-28s %14s %12s %14.4f %12.3f\n", "step, perfect overlap (max)", "", "", b->lower_bound_s, b->efficiency);
    printf("%-28s %14s %12s %14.4f %12.3f\n", "step, no overlap (sum)", "", "", b->no_overlap_s,
           b->efficiency_no_overlap);
}

void estimate_ranks_print(const estimate_ranks *r, const strata_config *cfg, const plan_input *in, size_t numel,
                          int seq, size_t tied_numel)
{
    world_numbers w;
    compute(r, in, numel, seq, tied_numel, &w);
    print_table(r, cfg, numel, tied_numel, &w);
}

json_t *estimate_ranks_json(const estimate_ranks *r, const plan_input *in, const plan *p, size_t numel, int seq,
                            size_t tied_numel)
{
    world_numbers w;
    compute(r, in, numel, seq, tied_numel, &w);
    return world_json(r, p, numel, &w);
}
