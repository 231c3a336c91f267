/*
 * The versioning rule of strata_config (strata.h): struct_size carries the caller's layout; a layout this
 * library does not know (built against a newer header) is refused by every entry point with both sizes named,
 * and nothing is written into the caller's struct; the layout of this header works everywhere.
 */
#include <string.h>

#include "testlib.h"

int main(void)
{
    t_rng_seed();
    strata_config c;
    T_OK(strata_config_init(&c));
    T_EQ_INT(c.struct_size, sizeof c);

    /* A program built against a newer header: its struct is larger than this library's. */
    size_t newer = sizeof c + 64;
    T_STATUS(strata_config_init_sized(&c, newer), STRATA_EINVAL);
    T_CONTAINS(strata_last_error(NULL), "knows layouts of");
    T_EQ_INT(c.struct_size, sizeof c); /* untouched */

    strata_config big = c;
    big.struct_size = (uint32_t)newer;
    big.lr = 0.125f;
    T_STATUS(strata_config_validate(&big, NULL, 0), STRATA_ECONFIG);
    T_CONTAINS(strata_last_error(NULL), "strata_config.struct_size = ");
    strata_engine *e = (strata_engine *)&c; /* not NULL: create must set it to NULL on failure */
    T_STATUS(strata_engine_create(&big, &e), STRATA_ECONFIG);
    T_CHECK(e == NULL, "strata_engine_create left *out = %p on failure", (void *)e);
    T_CONTAINS(strata_last_error(NULL), "build against this strata.h");
    T_STATUS(strata_config_load_json_string(&big, "{\"optimizer\": {\"params\": {\"lr\": 0.5}}}", "t", NULL, 0),
             STRATA_ECONFIG);
    T_CHECK(big.lr == 0.125f, "a refused load wrote lr = %g into the caller's struct (was 0.125)", (double)big.lr);

    /* A struct too small for any released layout. */
    big.struct_size = 16;
    T_STATUS(strata_config_validate(&big, NULL, 0), STRATA_ECONFIG);
    T_CONTAINS(strata_last_error(NULL), "strata_config.struct_size = 16");

    /* This header's layout: loading writes the caller's struct, creating reads it. */
    float lr = (float)(0.001 + t_rand_unit() * 0.01);
    char json[128];
    snprintf(json, sizeof json, "{\"optimizer\": {\"params\": {\"lr\": %.9g}}}", (double)lr);
    T_OK(strata_config_load_json_string(&c, json, "t", NULL, 0));
    T_CHECK(c.lr == lr, "lr after load = %.9g, want %.9g", (double)c.lr, (double)lr);
    T_EQ_INT(c.struct_size, sizeof c);
    c.backend = STRATA_BACKEND_HOST;
    T_OK(strata_engine_create(&c, &e));
    strata_engine_destroy(e);
    return t_done();
}
