/*
 * The configuration vocabulary as one table: every key strata reads, its JSON path, its type,
 * where it lands in strata_config, what values are allowed and what it means. The JSON loader,
 * `strata config check`'s table and the "did you mean" suggestions all read this table, so a
 * key is added in exactly one place.
 */
#ifndef STRATA_ENGINE_CONFIG_SCHEMA_H
#define STRATA_ENGINE_CONFIG_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "strata.h"

typedef enum cfg_kind {
    CFG_SECTION,    /* a JSON object holding more keys */
    CFG_BOOL,       /* bool field */
    CFG_INT,        /* int field, integer in [min, max] */
    CFG_COUNT,      /* size_t element count: integer (1e8 style reals allowed) in [min, max]; "auto" keeps default */
    CFG_BYTES,      /* size_t bytes: integer or "8GiB"-style string, in [min, max] */
    CFG_FLOAT,      /* float field, number in [min, max] */
    CFG_DOUBLE,     /* double field, number in [min, max] */
    CFG_ENUM,       /* int-sized enum field from a string in `choices` */
    CFG_PATHS,      /* nvme_path: one string or an array of strings */
    CFG_STRING,     /* char[STRATA_PATH_BYTES] field */
    CFG_BETAS,      /* [beta1, beta2] */
    CFG_PRECISION,  /* bf16.enabled / fp16.enabled: sets param_dtype */
    CFG_OPTIMIZER,  /* optimizer.type */
    CFG_ADAM_W_MODE,/* optimizer.params.adam_w_mode (DeepSpeed's Adam switch) */
    CFG_UNIMPLEMENTED, /* a DeepSpeed key strata knows but does not implement (no field) */
    CFG_PLANNED,    /* a DeepSpeed tuning hint whose job strata's planner does itself (no field): accepted with one
                       warning per key and process that says so */
    CFG_RENAMED,    /* an old spelling: accepted with a notice, stored as `target` */
} cfg_kind;

typedef struct cfg_choice {
    const char *name;
    int value;
} cfg_choice;

typedef struct cfg_key {
    const char *path;          /* "zero_optimization.offload_param.device" */
    cfg_kind kind;
    size_t offset;             /* into strata_config */
    double min, max;           /* inclusive range for numbers */
    const cfg_choice *choices; /* CFG_ENUM: NULL-terminated. CFG_UNIMPLEMENTED: the values (JSON text) that are
                                  what strata does anyway, accepted silently; NULL: every value is refused.
                                  CFG_PLANNED: the values (JSON text) accepted; NULL: a whole number of elements in
                                  [min, max] or "auto" */
    const char *help;          /* CFG_UNIMPLEMENTED: why, and what strata does instead; CFG_PLANNED: what strata
                                  plans the job from; CFG_RENAMED: the new path */
} cfg_key;

/* The table, in the order `strata config check` prints it. */
extern const cfg_key cfg_keys[];
extern const size_t cfg_key_count;

/* True for a key that sets a field of strata_config (what `strata config check` lists and what
 * t_config_keys proves has an effect); false for sections, renamed, unimplemented and planned keys. */
bool cfg_key_is_setting(const cfg_key *key);

/* True the first time it is called for key in this process, false after: a CFG_PLANNED key's notice is printed once
 * however often a config is loaded (strata.torch loads one several times). Thread-safe. */
bool cfg_key_first_notice(const cfg_key *key);

/* The entry for a full path, or NULL. */
const cfg_key *cfg_key_find(const char *path);

/* The known key nearest to an unknown path, by edit distance on its last segment among
 * siblings and by exact last segment anywhere (a key put in the wrong section); NULL when
 * nothing is close. */
const cfg_key *cfg_key_suggest(const char *path);

/* Formats the field of cfg described by key into buf ("1048576 (1.00 MiB)", "nvme", "[0.9, 0.999]"). */
void cfg_key_format(const cfg_key *key, const strata_config *cfg, char *buf, size_t len);

/* The field of cfg described by key as a typed JSON value (true, 3, 6e-4, "nvme", ["/a", "/b"], [0.9, 0.999]),
 * exact where the display form rounds; a new reference. For strata_config_to_json. */
json_t *cfg_key_value_json(const cfg_key *key, const strata_config *cfg);

/* The allowed range of a numeric key for messages: "[1, 1024]", "(0, 1e+06]", "at least 1", "[4.00 KiB, 64.00 MiB]". */
void cfg_range_format(const cfg_key *key, char *buf, size_t len);

/* "none", "cpu", "nvme" style list of a key's choices, for messages. */
void cfg_choices_format(const cfg_choice *choices, char *buf, size_t len);

#endif
