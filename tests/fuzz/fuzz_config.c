/* libFuzzer harness: the JSON configuration loader on arbitrary text. Any input must give STRATA_OK or
 * STRATA_ECONFIG with a message, never a crash, a leak or undefined behaviour; a config it accepts must
 * also pass strata_config_validate (the loader may not let through what validation refuses). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    strata_config cfg;
    strata_config_init(&cfg);
    char err[4096];
    strata_status st = strata_config_load_json_string(&cfg, text, "fuzz", err, sizeof err);
    if (st != STRATA_OK && st != STRATA_ECONFIG)
        __builtin_trap();
    if (st == STRATA_ECONFIG && err[0] == '\0')
        __builtin_trap(); /* a refusal must say why */
    if (st == STRATA_OK && strata_config_validate(&cfg, NULL, 0) != STRATA_OK)
        __builtin_trap();
    free(text);
    return 0;
}
