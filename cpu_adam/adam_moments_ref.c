/*
 * The scalar references of Adam with compressed moments (adam_moments.h): the specification the SIMD
 * variants are tested against bit for bit.
 */
#include "cpu_adam/adam_moments.h"
#include "cpu_adam/adam_scalar.h"

void adam_step_bf16_ref(const adam_consts *c, const adam_arrays *a, const adam_bf16_moments *mo, size_t begin,
                        size_t end)
{
    for (size_t i = begin; i < end; i++) {
        float m = cvt_bf16_to_f32(mo->m[i]), v = cvt_bf16_to_f32(mo->v[i]);
        adam_update_element(c, adam_load_grad(a->grad, a->grad_dtype, i), &a->master[i], &m, &v);
        adam_store_param(a->param, a->param_dtype, i, a->master[i]);
        uint32_t r = moments_sr_bits(mo->key, mo->base + i);
        mo->m[i] = moments_bf16_round_sr(m, r & 0xffffu);
        mo->v[i] = moments_bf16_round_sr(v, r >> 16);
    }
}

void adam_step_q8_ref(const adam_consts *c, const adam_arrays *a, const adam_q8_moments *mo, size_t begin,
                      size_t end)
{
    const moments_q8_map *sm = moments_q8_signed(), *um = moments_q8_unsigned();
    float m[MOMENTS_Q8_BLOCK], v[MOMENTS_Q8_BLOCK];
    for (size_t b = begin; b < end; b += MOMENTS_Q8_BLOCK) {
        size_t n = end - b < MOMENTS_Q8_BLOCK ? end - b : MOMENTS_Q8_BLOCK, blk = b / MOMENTS_Q8_BLOCK;
        for (size_t k = 0; k < n; k++) {
            size_t i = b + k;
            m[k] = moments_q8_dequantize(sm, mo->m[i], mo->m_scale[blk]);
            v[k] = moments_q8_dequantize(um, mo->v[i], mo->v_scale[blk]);
            adam_update_element(c, adam_load_grad(a->grad, a->grad_dtype, i), &a->master[i], &m[k], &v[k]);
            adam_store_param(a->param, a->param_dtype, i, a->master[i]);
        }
        moments_q8_quantize_block(sm, m, n, mo->m + b, &mo->m_scale[blk]);
        moments_q8_quantize_block(um, v, n, mo->v + b, &mo->v_scale[blk]);
    }
}
