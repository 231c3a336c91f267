/*
 * strata_config_load_json(): walks a JSON document against the key table in config_schema.c.
 *
 * Every problem is reported (not just the first) and nothing is applied unless the whole
 * document is valid: the walk fills a copy of the caller's config, which is copied back only
 * when the walk and the cross-field validation both pass.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/size.h"
#include "engine/config/config_report.h"
#include "engine/config/config_schema.h"
#include "engine/config/config.h"

typedef struct walk_ctx {
    strata_config cfg;
    cfg_report *report;
    bool ignore_unimplemented;
    bool bf16_on, fp16_on;
    const char *optimizer_type; /* as written, NULL when absent */
    int adam_w_mode;            /* -1 absent, else 0/1 */
} walk_ctx;

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* The value as it appears in JSON, shortened for messages. */
static const char *show(const json_t *v, char *buf, size_t len)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (!s) {
        snprintf(buf, len, "(value)");
        return buf;
    }
    if (strlen(s) > 60)
        snprintf(buf, len, "%.57s...", s);
    else
        snprintf(buf, len, "%s", s);
    free(s);
    return buf;
}

/* "auto" is the placeholder of transformers' DeepSpeed integration, which fills it from TrainingArguments and the
 * model before DeepSpeed reads the file; where strata has no value to put there, the message says who fills it. */
static void wrong_type(walk_ctx *c, const char *path, const json_t *v, const char *expected)
{
    char shown[80];
    bool is_auto = json_is_string(v) && strcmp(json_string_value(v), "auto") == 0;
    cfg_report_add(c->report, "%s = %s has the wrong type (%s); expected %s%s", path, show(v, shown, sizeof shown),
                   type_name(v), expected,
                   is_auto ? "; \"auto\" is filled in by transformers' Trainer from its TrainingArguments "
                             "(strata.torch.hf.StrataTrainer and strata.torch.hf.fill_auto fill it the same way): "
                             "elsewhere write the value" : "");
}

static void out_of_range(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v)
{
    char shown[80], range[96];
    cfg_range_format(k, range, sizeof range);
    if (strncmp(range, "at least", 8) == 0) /* unbounded above: only a value past 2^64 gets here that way */
        cfg_report_add(c->report, "%s = %s is out of range: %s and below 2^64 allowed", path,
                       show(v, shown, sizeof shown), range);
    else
        cfg_report_add(c->report, "%s = %s is out of range %s", path, show(v, shown, sizeof shown), range);
}

/* A JSON number as a double, or false when v is not a number. */
static bool number_of(const json_t *v, double *out)
{
    if (json_is_integer(v)) {
        *out = (double)json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        *out = json_real_value(v);
        return true;
    }
    return false;
}

static void set_enum(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    const char *name = json_is_string(v) ? json_string_value(v) : json_is_true(v) ? "true" : json_is_false(v) ? "false" : NULL;
    char allowed[128], shown[80];
    cfg_choices_format(k->choices, allowed, sizeof allowed);
    if (!name) {
        char expected[160];
        snprintf(expected, sizeof expected, "one of %s", allowed);
        wrong_type(c, path, v, expected);
        return;
    }
    for (size_t i = 0; k->choices[i].name; i++) {
        if (strcasecmp(name, k->choices[i].name) == 0) {
            *(int *)field = k->choices[i].value;
            return;
        }
    }
    cfg_report_add(c->report, "%s = %s is not allowed; allowed: %s", path, show(v, shown, sizeof shown), allowed);
}

static void set_paths(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    (void)k;
    strata_offload_config *o = field;
    const char *hint = "a path string or an array of up to 8 path strings (several paths are striped)";
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_string(v) && !json_is_array(v)) {
        wrong_type(c, path, v, hint);
        return;
    }
    if (n == 0 || n > STRATA_MAX_NVME_PATHS) {
        cfg_report_add(c->report, "%s has %zu paths; allowed: 1 to %d", path, n, STRATA_MAX_NVME_PATHS);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *item = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(item)) {
            wrong_type(c, path, item, hint);
            return;
        }
        const char *s = json_string_value(item);
        if (!*s || strlen(s) >= STRATA_PATH_BYTES) {
            cfg_report_add(c->report, "%s: path \"%.60s\" must be non-empty and shorter than %d bytes", path, s,
                           STRATA_PATH_BYTES);
            return;
        }
        snprintf(o->nvme_path[i], STRATA_PATH_BYTES, "%s", s);
    }
    o->nvme_path_count = (int)n;
}

static void set_betas(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    (void)k, (void)field;
    double b1, b2;
    if (!json_is_array(v) || json_array_size(v) != 2 || !number_of(json_array_get(v, 0), &b1) ||
        !number_of(json_array_get(v, 1), &b2)) {
        wrong_type(c, path, v, "an array of two numbers, e.g. [0.9, 0.999]");
        return;
    }
    if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1)) {
        char shown[80];
        cfg_report_add(c->report, "%s = %s is out of range: each beta must be in [0, 1)", path,
                       show(v, shown, sizeof shown));
        return;
    }
    c->cfg.beta1 = (float)b1;
    c->cfg.beta2 = (float)b2;
    c->cfg.beta1_exact = b1;
    c->cfg.beta2_exact = b2;
}

/* The setters: one per key kind, each checking the JSON type and the range before it writes the field. */

static void set_bool(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    (void)k;
    if (!json_is_boolean(v))
        return wrong_type(c, path, v, "true or false");
    *(bool *)field = json_is_true(v);
}

static void set_int(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    char range[96], expected[160];
    cfg_range_format(k, range, sizeof range);
    snprintf(expected, sizeof expected, "an integer in %s", range);
    if (!json_is_integer(v))
        return wrong_type(c, path, v, expected);
    double d = (double)json_integer_value(v);
    if (d < k->min || d > k->max)
        return out_of_range(c, k, path, v);
    *(int *)field = (int)json_integer_value(v);
}

static void set_count(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0)
        return; /* DeepSpeed's "auto": keep strata's default */
    char range[96], expected[160];
    cfg_range_format(k, range, sizeof range);
    snprintf(expected, sizeof expected, "a whole number of elements (%s) or \"auto\"", range);
    double d;
    if (!number_of(v, &d) || d != floor(d))
        return wrong_type(c, path, v, expected);
    if (d < k->min || d > k->max)
        return out_of_range(c, k, path, v);
    *(size_t *)field = (size_t)d;
}

static void set_bytes(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    size_t bytes;
    double d;
    char shown[80];
    if (json_is_string(v)) {
        if (!size_parse(json_string_value(v), &bytes)) {
            cfg_report_add(c->report, "%s = %s is not a size; expected bytes as a number or a string like "
                           "\"512MiB\", \"8GiB\", \"1.5TB\"", path, show(v, shown, sizeof shown));
            return;
        }
        d = (double)bytes;
    } else if (number_of(v, &d) && d == floor(d) && d >= 0) {
        bytes = 0; /* converted only after the range check: a huge double does not fit a size_t */
    } else {
        return wrong_type(c, path, v, "a number of bytes or a size string like \"8GiB\"");
    }
    if (d < k->min || d > k->max)
        return out_of_range(c, k, path, v);
    if (!json_is_string(v))
        bytes = (size_t)d;
    *(size_t *)field = bytes;
}

/* CFG_FLOAT and CFG_DOUBLE; a float also keeps the exact double it was given (cfg_set_exact). */
static void set_number(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    char range[96], expected[160];
    cfg_range_format(k, range, sizeof range);
    snprintf(expected, sizeof expected, "a number in %s", range);
    double d;
    if (!number_of(v, &d))
        return wrong_type(c, path, v, expected);
    if (!(d >= k->min && d <= k->max))
        return out_of_range(c, k, path, v);
    if (k->kind == CFG_FLOAT) {
        *(float *)field = (float)d;
        cfg_set_exact(&c->cfg, k->offset, d);
    } else {
        *(double *)field = d;
    }
}

static void set_string(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    (void)k;
    if (!json_is_string(v))
        return wrong_type(c, path, v, "a string");
    if (strlen(json_string_value(v)) >= STRATA_PATH_BYTES) {
        cfg_report_add(c->report, "%s is %zu bytes long; at most %d allowed", path, strlen(json_string_value(v)),
                       STRATA_PATH_BYTES - 1);
        return;
    }
    snprintf((char *)field, STRATA_PATH_BYTES, "%s", json_string_value(v));
}

/* bf16.enabled / fp16.enabled: remembered, resolved into param_dtype once the whole file is read. */
static void set_precision(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    (void)k, (void)field;
    if (!json_is_boolean(v))
        return wrong_type(c, path, v, "true or false");
    if (strncmp(path, "bf16", 4) == 0)
        c->bf16_on = json_is_true(v);
    else
        c->fp16_on = json_is_true(v);
}

static void set_optimizer(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    (void)k, (void)field;
    if (!json_is_string(v))
        return wrong_type(c, path, v, "\"Adam\" or \"AdamW\"");
    if (strcasecmp(json_string_value(v), "adam") != 0 && strcasecmp(json_string_value(v), "adamw") != 0) {
        char shown[80];
        cfg_report_add(c->report, "%s = %s is not implemented; allowed: \"Adam\", \"AdamW\"", path,
                       show(v, shown, sizeof shown));
        return;
    }
    c->optimizer_type = json_string_value(v);
}

static void set_adam_w_mode(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field)
{
    (void)k, (void)field;
    if (!json_is_boolean(v))
        return wrong_type(c, path, v, "true or false");
    c->adam_w_mode = json_is_true(v);
}

typedef void (*value_setter)(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v, void *field);

/* Sections, unimplemented and renamed keys have no setter: the walk handles them. */
static const value_setter setters[] = {
    [CFG_BOOL] = set_bool,         [CFG_INT] = set_int,           [CFG_COUNT] = set_count,
    [CFG_BYTES] = set_bytes,       [CFG_FLOAT] = set_number,      [CFG_DOUBLE] = set_number,
    [CFG_ENUM] = set_enum,         [CFG_PATHS] = set_paths,       [CFG_STRING] = set_string,
    [CFG_BETAS] = set_betas,       [CFG_PRECISION] = set_precision, [CFG_OPTIMIZER] = set_optimizer,
    [CFG_ADAM_W_MODE] = set_adam_w_mode,
};

/* Applies one scalar value to its field; the key kind says how. */
static void apply_value(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v)
{
    if ((size_t)k->kind < sizeof setters / sizeof setters[0] && setters[k->kind])
        setters[k->kind](c, k, path, v, (char *)&c->cfg + k->offset);
}

static void unknown_key(walk_ctx *c, const char *path)
{
    const cfg_key *near = cfg_key_suggest(path);
    if (near) {
        cfg_report_add(c->report, "unknown key %s; did you mean %s?", path, near->path);
        return;
    }
    /* Nothing close: list what this section does accept. */
    const char *dot = strrchr(path, '.');
    size_t plen = dot ? (size_t)(dot - path) : 0;
    char known[512];
    size_t used = 0;
    known[0] = '\0';
    for (size_t i = 0; i < cfg_key_count && used < sizeof known; i++) {
        const char *kp = cfg_keys[i].path;
        const char *kdot = strrchr(kp, '.');
        size_t klen = kdot ? (size_t)(kdot - kp) : 0;
        if (klen != plen || strncmp(kp, path, plen) != 0 || cfg_keys[i].kind == CFG_UNIMPLEMENTED ||
            cfg_keys[i].kind == CFG_PLANNED)
            continue;
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", used ? ", " : "", kdot ? kdot + 1 : kp);
    }
    cfg_report_add(c->report, "unknown key %s; keys allowed %s%.*s: %s", path, plen ? "in " : "at the top level",
                   (int)plen, path, known);
}

/* Whether v is one of the values (JSON text) a key accepts because they are what strata does anyway. */
static bool is_what_strata_does(const cfg_choice *accepted, const json_t *v)
{
    for (size_t i = 0; accepted && accepted[i].name; i++) {
        json_t *want = json_loads(accepted[i].name, JSON_DECODE_ANY, NULL);
        double a, b;
        bool same = json_equal(want, (json_t *)v) || (number_of(want, &a) && number_of(v, &b) && a == b);
        json_decref(want);
        if (same)
            return true;
    }
    return false;
}

/* A DeepSpeed key strata knows but does not implement: an error that says why and what strata does instead,
 * or only a warning with strata.ignore_unimplemented. A key whose value is what strata does anyway
 * (pin_memory = true) passes silently. */
static void unimplemented(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v)
{
    if (!k->choices) {
        if (c->ignore_unimplemented)
            LOG_WARN(LOG_CONFIG, "%s is a DeepSpeed key that strata does not implement (%s); ignored because "
                     "strata.ignore_unimplemented = true", path, k->help);
        else
            cfg_report_add(c->report, "%s is a DeepSpeed key that strata does not implement: %s; or set "
                           "strata.ignore_unimplemented = true to only warn", path, k->help);
        return;
    }
    if (is_what_strata_does(k->choices, v))
        return;
    char shown[80], allowed[64];
    show(v, shown, sizeof shown);
    size_t used = 0;
    allowed[0] = '\0';
    for (size_t i = 0; k->choices[i].name && used < sizeof allowed; i++)
        used += (size_t)snprintf(allowed + used, sizeof allowed - used, "%s%s", i ? " or " : "", k->choices[i].name);
    if (c->ignore_unimplemented)
        LOG_WARN(LOG_CONFIG, "%s = %s is a DeepSpeed setting that strata does not implement (%s); ignored because "
                 "strata.ignore_unimplemented = true", path, shown, k->help);
    else
        cfg_report_add(c->report, "%s = %s is a DeepSpeed setting that strata does not implement: %s; write %s (what "
                       "strata does) or remove the key; or set strata.ignore_unimplemented = true to only warn",
                       path, shown, k->help, allowed);
}

/* A DeepSpeed tuning hint whose job strata's planner does itself (reduce_bucket_size and the like): a value of the
 * key's type is accepted with one notice per key and process, saying what strata plans instead; any other value
 * is a type error. Not read otherwise, so it changes nothing. */
static void planned(walk_ctx *c, const cfg_key *k, const char *path, const json_t *v)
{
    char shown[80], expected[160];
    double d;
    if (k->choices) {
        if (!is_what_strata_does(k->choices, v)) {
            size_t used = 0;
            for (size_t i = 0; k->choices[i].name && used < sizeof expected; i++)
                used += (size_t)snprintf(expected + used, sizeof expected - used, "%s%s", i ? " or " : "",
                                         k->choices[i].name);
            return wrong_type(c, path, v, expected);
        }
    } else if (!(json_is_string(v) && strcmp(json_string_value(v), "auto") == 0)) {
        char range[96];
        cfg_range_format(k, range, sizeof range);
        snprintf(expected, sizeof expected, "a whole number of elements (%s) or \"auto\"", range);
        if (!number_of(v, &d) || d != floor(d))
            return wrong_type(c, path, v, expected);
        if (d < k->min || d > k->max)
            return out_of_range(c, k, path, v);
    }
    if (cfg_key_first_notice(k))
        LOG_WARN(LOG_CONFIG, "%s = %s is a DeepSpeed tuning hint that strata plans itself (%s); accepted, not read",
                 path, show(v, shown, sizeof shown), k->help);
}

static void walk(walk_ctx *c, const json_t *obj, const char *prefix)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        char path[256];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key);
        const cfg_key *k = cfg_key_find(path);
        if (!k) {
            unknown_key(c, path);
            continue;
        }
        switch (k->kind) {
        case CFG_SECTION:
            if (!json_is_object(value))
                wrong_type(c, path, value, "an object { ... }");
            else
                walk(c, value, path);
            break;
        case CFG_UNIMPLEMENTED:
            unimplemented(c, k, path, value);
            break;
        case CFG_PLANNED:
            planned(c, k, path, value);
            break;
        case CFG_RENAMED: {
            const cfg_key *target = cfg_key_find(k->help);
            const char *tleaf = strrchr(k->help, '.') + 1;
            if (json_object_get(obj, tleaf)) {
                cfg_report_add(c->report, "%s and %s are both set; %s is the old name of %s: keep only %s", path,
                               k->help, path, k->help, k->help);
                break;
            }
            LOG_WARN(LOG_CONFIG, "%s is the old name of %s; reading it as %s (rename it to silence this notice)", path, k->help, k->help);
            apply_value(c, target, path, value);
            break;
        }
        default:
            apply_value(c, k, path, value);
        }
    }
}

/* The precision and optimizer keys interact, so they are resolved after the walk. */
static void resolve_interactions(walk_ctx *c)
{
    if (c->bf16_on && c->fp16_on)
        cfg_report_add(c->report, "bf16.enabled and fp16.enabled are both true; enable at most one");
    else if (c->bf16_on)
        c->cfg.param_dtype = STRATA_DTYPE_BF16;
    else if (c->fp16_on)
        c->cfg.param_dtype = STRATA_DTYPE_FP16;

    if (c->optimizer_type) {
        bool adamw = strcasecmp(c->optimizer_type, "adamw") == 0;
        if (adamw && c->adam_w_mode == 0)
            cfg_report_add(c->report, "optimizer.type = \"AdamW\" contradicts optimizer.params.adam_w_mode = false; "
                           "use \"Adam\" with adam_w_mode = false for L2 decay");
        /* DeepSpeed's "Adam" is decoupled (AdamW) unless adam_w_mode is false. */
        c->cfg.optimizer = adamw || c->adam_w_mode != 0 ? STRATA_OPTIMIZER_ADAMW : STRATA_OPTIMIZER_ADAM;
    } else if (c->adam_w_mode >= 0) {
        c->cfg.optimizer = c->adam_w_mode ? STRATA_OPTIMIZER_ADAMW : STRATA_OPTIMIZER_ADAM;
    }
}

static strata_status load_document(strata_config *cfg, json_t *root, const char *origin, cfg_report *report)
{
    walk_ctx c = {.report = report, .adam_w_mode = -1};
    if (!cfg_from_caller(cfg, &c.cfg, report))
        return cfg_report_finish(report, STRATA_ECONFIG);
    if (!json_is_object(root)) {
        cfg_report_add(report, "%s: the top level must be a JSON object { ... }, not %s", origin, type_name(root));
        return cfg_report_finish(report, STRATA_ECONFIG);
    }
    /* Read the switch first so that it applies to keys that come before it in the file. */
    json_t *ign = json_object_get(json_object_get(root, "strata"), "ignore_unimplemented");
    c.ignore_unimplemented = json_is_true(ign) || (!ign && c.cfg.ignore_unimplemented);

    walk(&c, root, "");
    resolve_interactions(&c);
    if (report->count == 0)
        cfg_validate_into(&c.cfg, report);
    if (report->count)
        return cfg_report_finish(report, STRATA_ECONFIG);
    cfg_to_caller(&c.cfg, cfg);
    return STRATA_OK;
}

static strata_status parse_error(cfg_report *report, const char *origin, const json_error_t *je, strata_status st)
{
    cfg_report_add(report, "%s:%d:%d: malformed JSON: %s", origin, je->line, je->column, je->text);
    return cfg_report_finish(report, st);
}

STRATA_API strata_status strata_config_load_json_string(strata_config *cfg, const char *json, const char *origin,
                                                       char *err, size_t errlen)
{
    cfg_report report;
    cfg_report_init(&report, err, errlen);
    if (!cfg || !json) {
        cfg_report_add(&report, "strata_config_load_json_string: cfg and json must not be NULL");
        return cfg_report_finish(&report, STRATA_EINVAL);
    }
    if (!origin)
        origin = "<string>";
    json_error_t je;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return parse_error(&report, origin, &je, STRATA_ECONFIG);
    strata_status st = load_document(cfg, root, origin, &report);
    json_decref(root);
    return st;
}

STRATA_API strata_status strata_config_load_json(strata_config *cfg, const char *path, char *err, size_t errlen)
{
    cfg_report report;
    cfg_report_init(&report, err, errlen);
    if (!cfg || !path) {
        cfg_report_add(&report, "strata_config_load_json: cfg and path must not be NULL");
        return cfg_report_finish(&report, STRATA_EINVAL);
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        char why[128];
        int e = errno;
        cfg_report_add(&report, "cannot open \"%s\": %s", path, err_errno_str(e, why, sizeof why));
        return cfg_report_finish(&report, e == ENOENT ? STRATA_ENOTFOUND : STRATA_EIO);
    }
    json_error_t je;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    if (!root)
        return parse_error(&report, path, &je, STRATA_ECONFIG);
    strata_status st = load_document(cfg, root, path, &report);
    json_decref(root);
    return st;
}
