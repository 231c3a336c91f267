/* `strata estimate`'s speed block: see estimate_speed.h. */
#include "tools/estimate_speed.h"

#include <math.h>
#include <stdio.h>

#define RATE(flag, field, hi_, meta_, text, hint_)                                                                  \
    {.name = flag, .kind = CLI_REAL, .offset = offsetof(estimate_speed, field), .lo = 0, .hi = hi_,               \
     .open_lo = true, .meta = meta_, .what = "a rate", .help = text, .hint = hint_}

const cli_opt estimate_speed_opts[ESTIMATE_SPEED_NOPTS] = {
    RATE("--tflops", tflops, 1e6, "T",
         "the GPU's achieved bf16 TFLOP/s per rank (what a training step reaches, not the peak): prints the batch "
         "that hides Adam behind compute; also the bandwidth analysis's compute (default there 70)",
         "achieved TFLOP/s per rank, e.g. 300"),
    RATE("--adam-rate", adam_melem_s, 1e7, "R",
         "the CPU Adam's rate in million elements per second (default 5000: the fp32 step on a 16-core host, "
         "benchmarks/RESULTS.md; `b_adam_moments` measures it)",
         "million elements per second, e.g. 5000"),
};
#undef RATE

static const char *const mode_names[SPEED_NMODES] = {"after backward (default)", "step in backward",
                                                     "delayed update"};

/* The smallest whole batch b with b * per_seq_s >= need_s (at least 1). */
static long long smallest_batch(double need_s, double per_seq_s)
{
    double b = ceil(need_s / per_seq_s);
    return b < 1 ? 1 : b > 1e15 ? (long long)1e15 : (long long)b;
}

void estimate_speed_compute(const estimate_speed *s, const speed_step *st, speed_numbers *out)
{
    *out = (speed_numbers){.adam_s = st->adam_numel / (s->adam_melem_s * 1e6)};
    if (s->tflops <= 0)
        return;
    /* 2 flops per parameter per token forward, 4 backward; the recompute of checkpointing runs the forward again
     * inside backward: 8, of which backward's 6. */
    out->flops_per_token = (st->recompute ? 8.0 : 6.0) * st->params;
    out->backward_share = st->recompute ? 6.0 / 8.0 : 4.0 / 6.0;
    double flops_per_s = s->tflops * 1e12;
    double tokens = st->tokens ? (double)st->tokens : (double)st->batch * st->seq;
    out->compute_s = out->flops_per_token * tokens * st->grad_accum / flops_per_s;
    double c = out->compute_s, a = out->adam_s, bwd = out->backward_share * c;
    /* After backward Adam adds to the step; in backward each module's update runs while backward goes on (the
     * last module's is the tail it cannot hide, left out here); delayed, the update of one step runs during the
     * next step's forward and backward. */
    out->step_s[SPEED_PLAIN] = c + a;
    out->step_s[SPEED_IN_BACKWARD] = c + (a > bwd ? a - bwd : 0);
    out->step_s[SPEED_DELAYED] = c > a ? c : a;
    double per_seq_s = out->flops_per_token * st->seq * st->grad_accum / flops_per_s;
    out->hide_batch[SPEED_PLAIN] = smallest_batch(a, per_seq_s);
    out->hide_batch[SPEED_IN_BACKWARD] = st->grad_accum == 1 ? smallest_batch(a, per_seq_s * out->backward_share) : 0;
    out->hide_batch[SPEED_DELAYED] = smallest_batch(a, per_seq_s);
}

void estimate_speed_print(const estimate_speed *s, const speed_step *st, bool on_gpu)
{
    speed_numbers n;
    estimate_speed_compute(s, st, &n);
    printf("\nSPEED per rank per step: the CPU's Adam over %.0f elements (the optimizer state it updates) at "
           "%.6g million elements/s (--adam-rate) takes %.4f s\n", st->adam_numel, s->adam_melem_s, n.adam_s);
    if (!on_gpu) {
        printf("(the host backend: its cores run the model and Adam alike, so nothing overlaps; --device cuda plans "
               "for a GPU)\n");
        return;
    }
    if (s->tflops <= 0) {
        printf("(give --tflops, the GPU's achieved TFLOP/s, for the compute and the batch that hides Adam)\n");
        return;
    }
    char tokens[64];
    if (st->tokens)
        snprintf(tokens, sizeof tokens, "%zu tokens (--tokens)", st->tokens);
    else
        snprintf(tokens, sizeof tokens, "%d x %d tokens", st->batch, st->seq);
    printf("compute: %d x %.0f parameters x %s x %d micro-batch%s at %.6g TFLOP/s (--tflops) takes %.4f s%s\n",
           st->recompute ? 8 : 6, st->params, tokens, st->grad_accum, st->grad_accum == 1 ? "" : "es", s->tflops,
           n.compute_s, st->recompute ? " (8, not 6: checkpointing's recompute, 4/3 of the flops)" : "");
    char share[48], at[48];
    snprintf(share, sizeof share, "backward (%s of compute)", st->recompute ? "3/4" : "2/3");
    snprintf(at, sizeof at, st->tokens ? "STEP, --tokens" : "STEP, BATCH %d", st->batch);
    const char *overlaps[SPEED_NMODES] = {"nothing: Adam adds to the step", share,
                                          "the next step's forward + backward"};
    printf("%-26s %-36s %16s  %s\n", "UPDATE", "ADAM OVERLAPS", at, "SMALLEST BATCH WHOSE OVERLAP >= ADAM");
    for (int m = 0; m < SPEED_NMODES; m++) {
        char batch[64];
        if (m == SPEED_IN_BACKWARD && !n.hide_batch[m])
            snprintf(batch, sizeof batch, "- (needs --grad-accum 1)");
        else
            snprintf(batch, sizeof batch, m == SPEED_PLAIN ? "%lld (compute >= Adam; Adam still adds)" : "%lld",
                     n.hide_batch[m]);
        printf("%-26s %-36s %14.4f s  %s\n", mode_names[m], overlaps[m], n.step_s[m], batch);
    }
    printf("(strata.step_in_backward and strata.delayed_update choose the update; batches are sequences of %d tokens "
           "per rank per micro-batch)\n", st->seq);
}

json_t *estimate_speed_json(const estimate_speed *s, const speed_step *st, bool on_gpu)
{
    speed_numbers n;
    estimate_speed_compute(s, st, &n);
    json_t *o = json_pack("{s:f, s:f, s:f, s:b}", "adam_rate_melem_s", s->adam_melem_s, "adam_elements",
                          st->adam_numel, "adam_s", n.adam_s, "on_gpu", on_gpu);
    if (!on_gpu || s->tflops <= 0)
        return o;
    static const char *const keys[SPEED_NMODES] = {"after_backward", "step_in_backward", "delayed_update"};
    json_t *step = json_object(), *batch = json_object();
    for (int m = 0; m < SPEED_NMODES; m++) {
        json_object_set_new(step, keys[m], json_real(n.step_s[m]));
        json_object_set_new(batch, keys[m], n.hide_batch[m] ? json_integer(n.hide_batch[m]) : json_null());
    }
    json_object_set_new(o, "tflops", json_real(s->tflops));
    json_object_set_new(o, "flops_per_token", json_real(n.flops_per_token));
    json_object_set_new(o, "compute_s", json_real(n.compute_s));
    json_object_set_new(o, "backward_share", json_real(n.backward_share));
    json_object_set_new(o, "seq", json_integer(st->seq));
    json_object_set_new(o, "batch", json_integer(st->batch));
    json_object_set_new(o, "step_s", step);
    json_object_set_new(o, "hide_adam_batch", batch);
    return o;
}
