/*
 * Compressed Adam moments in the engine against the scalar oracle (synth_oracle.h): the synthetic model trained by the
 * engine on every placement it runs (fp32 parameters) must end with the master weights of plain arrays trained with the
 * same layer math and the reference kernels (adam_step_bf16_ref / adam_step_q8_ref) over the engine's flat partition,
 * with the rounding key step_moments_key gives, drawn by element index (bf16), and the block scales (8-bit). Bit for
 * bit: the SIMD kernels, their tiles and threads, the sub-groups, the tiers and slots must not change a bit.
 */
#include <string.h>

#include "synth.h"
#include "synth_oracle.h"
#include "testlib.h"

static void run(strata_moments form, const char *scratch)
{
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.steps = 6;
    strata_config c = synth_config(STRATA_DTYPE_FP32);
    c.optimizer_moments = form;
    c.optimizer_moments_seed = 9;
    size_t n_ref = 0;
    float *ref = synth_oracle(&o, &c, form, &n_ref);
    for (size_t p = 0; p < synth_placement_count; p++) {
        strata_config pc = c;
        synth_placements[p].apply(&pc, scratch);
        float *w = NULL;
        size_t n = 0;
        strata_status st = synth_train(&o, &pc, &w, &n, NULL, NULL);
        T_CHECK(st == STRATA_OK, "%s: training failed: %s", synth_placements[p].name, strata_last_error(NULL));
        if (w && n == n_ref) {
            size_t first, d = synth_count_diff(ref, w, n, &first);
            T_CHECK(d == 0, "%s moments / %s: %zu of %zu weights differ from the oracle; first at %zu: %.9g vs %.9g",
                    form == STRATA_MOMENTS_BF16 ? "bf16" : "8bit", synth_placements[p].name, d, n, first,
                    first < n ? (double)ref[first] : 0.0, first < n ? (double)w[first] : 0.0);
        }
        free(w);
    }
    free(ref);
}

int main(void)
{
    t_rng_seed();
    const char *scratch = t_scratch_dir("t_engine_moments_oracle");
    run(STRATA_MOMENTS_BF16, scratch);
    run(STRATA_MOMENTS_8BIT, scratch);
    return t_done();
}
