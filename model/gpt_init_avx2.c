/* gpt_init.c's normals built for AVX2 alone: CMakeLists.txt leaves FMA out of this file's flags, since a fused
 * multiply-add rounds once where the baseline rounds twice, and every CPU must make the same model. */
#include "model/gpt_init_body.h"

void gpt_init_normals_avx2(uint64_t base, size_t first, size_t count, float scale, float *out);

void gpt_init_normals_avx2(uint64_t base, size_t first, size_t count, float scale, float *out)
{
    gpt_init_normals_body(base, first, count, scale, out);
}
