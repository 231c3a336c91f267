/*
 * Proves that accum_add_threads, the gradient hand-off's accumulation over a team of threads, gives accum_add's bits
 * for fp32, bf16 and fp16 sources (random patterns: NaNs, infinities and subnormals included), adding and
 * overwriting, at 1 to 5 threads and at counts below, at and past the size where it goes parallel and ending inside
 * a piece.
 */
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "offload/accum.h"
#include "testlib.h"

int main(void)
{
    const strata_dtype dtypes[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16};
    const size_t piece = (size_t)1 << 16;
    const size_t counts[] = {0, 1, 3 * piece + 5, 4 * piece, 4 * piece + 1, t_rand_range(5 * piece, 40 * piece)};
    size_t most = 0;
    for (size_t c = 0; c < ARRAY_LEN(counts); c++)
        most = counts[c] > most ? counts[c] : most;
    void *src = malloc(most * 4);
    float *start = malloc(most * 4), *want = malloc(most * 4), *got = malloc(most * 4);
    T_CHECK(src && start && want && got, "out of memory");
    for (size_t d = 0; d < ARRAY_LEN(dtypes); d++)
        for (size_t c = 0; c < ARRAY_LEN(counts); c++)
            for (int overwrite = 0; overwrite < 2; overwrite++)
                for (int threads = 1; threads <= 5; threads++) {
                    size_t n = counts[c];
                    t_rand_bytes(src, n * strata_dtype_bytes(dtypes[d]));
                    for (size_t i = 0; i < n; i++)
                        start[i] = t_rand_normal();
                    memcpy(want, start, n * 4);
                    memcpy(got, start, n * 4);
                    accum_add(want, src, dtypes[d], n, overwrite);
                    accum_add_threads(got, src, dtypes[d], n, overwrite, threads);
                    size_t bad = 0, first_bad = 0;
                    for (size_t i = 0; i < n; i++)
                        if (memcmp(&want[i], &got[i], 4) != 0 && bad++ == 0)
                            first_bad = i;
                    T_CHECK(bad == 0, "%s, n %zu, %s, %d threads: %zu elements differ, the first at %zu: %a, serial %a",
                            strata_dtype_name(dtypes[d]), n, overwrite ? "overwrite" : "add", threads, bad, first_bad,
                            bad ? got[first_bad] : 0.0f, bad ? want[first_bad] : 0.0f);
                }
    free(src), free(start), free(want), free(got);
    return t_done();
}
