/* The option parser of the `strata` commands: see options.h. */
#include "tools/options.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/nearest.h"
#include "base/size.h"
#include "base/util.h"
#include "tools/cli.h"

#define HELP_WIDTH 118
#define HELP_COLUMN 21 /* where the help of an option starts, as the hand-written usages had it */

typedef struct found {
    const cli_opt *opt;
    const cli_opt_group *group;
} found;

static found find(const cli_spec *spec, const char *name)
{
    for (size_t g = 0; g < spec->ngroups; g++)
        for (size_t k = 0; k < spec->groups[g].count; k++)
            if (strcmp(spec->groups[g].opts[k].name, name) == 0)
                return (found){&spec->groups[g].opts[k], &spec->groups[g]};
    return (found){NULL, NULL};
}

/* A command with this many options or fewer lists them all when one it does not know is given. */
#define FEW_OPTIONS 4

/* "--to FILE, --dtype DTYPE" into buf. */
static const char *list_options(const cli_opt_group *group, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < group->count && used < len; k++) {
        const cli_opt *o = &group->opts[k];
        used += (size_t)snprintf(buf + used, len - used, "%s%s%s%s", k ? ", " : "", o->name, o->meta ? " " : "",
                                 o->meta ? o->meta : "");
    }
    return buf;
}

/* An unknown option, with the known one nearest to it when one is close (the config keys' rule, base/nearest.h);
 * a command of a few options lists them instead. */
static void unknown_option(const cli_spec *spec, const char *name, char *err, size_t len)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t g = 0; g < spec->ngroups; g++)
        for (size_t k = 0; k < spec->groups[g].count; k++) {
            const char *known = spec->groups[g].opts[k].name;
            size_t d = nearest_distance(name + 2, known + 2);
            if (d < best_d) {
                best_d = d;
                best = known;
            }
        }
    if (name[2] && best && nearest_is_close(name + 2, best_d))
        snprintf(err, len, "unknown option %s; did you mean %s? (see `strata %s --help`)", name, best, spec->command);
    else if (spec->ngroups == 1 && spec->groups[0].count <= FEW_OPTIONS)
        snprintf(err, len, "unknown option %s; allowed: %s (see `strata %s --help`)", name,
                 list_options(&spec->groups[0], (char[256]){0}, 256), spec->command);
    else
        snprintf(err, len, "unknown option %s; see `strata %s --help`", name, spec->command);
}

/* A size range: "[4 KiB, 1 GiB]", "at least 8 MiB", "" (any size). */
static void size_range(const cli_opt *o, char *buf, size_t len)
{
    char a[32], b[32];
    if (o->hi > 0)
        snprintf(buf, len, "[%s, %s]", size_format((size_t)o->lo, a, sizeof a), size_format((size_t)o->hi, b, sizeof b));
    else if (o->lo > 0)
        snprintf(buf, len, "at least %s", size_format((size_t)o->lo, a, sizeof a));
    else
        buf[0] = '\0';
}

/* The range of an option as messages and --help state it: "[1, 4096]", "(0, 10)", "at least 1". */
static const char *cli_opt_range(const cli_opt *o, char *buf, size_t len)
{
    switch (o->kind) {
    case CLI_LL:
        snprintf(buf, len, "at least %.0f", o->lo);
        break;
    case CLI_REAL:
        snprintf(buf, len, "%c%.15g, %.15g%c", o->open_lo ? '(' : '[', o->lo, o->hi, o->open_hi ? ')' : ']');
        break;
    case CLI_SIZE:
    case CLI_SIZE_LIST:
        size_range(o, buf, len);
        break;
    case CLI_INT:
    case CLI_INT_LIST:
    case CLI_COUNT:
        snprintf(buf, len, "[%.0f, %.0f]", o->lo, o->hi);
        break;
    default:
        snprintf(buf, len, "%s", o->choices ? o->choices : "");
    }
    return buf;
}

/* "a size in [4 KiB, 1 GiB]", "a size of at least 8 MiB, a multiple of 4 KiB", "a size". */
static void describe_size(const cli_opt *o, const char *range, char *buf, size_t len)
{
    char align[32];
    snprintf(buf, len, "a size%s%s%s%s", o->hi > 0 ? " in " : o->lo > 0 ? " of " : "", range,
             o->align ? ", a multiple of " : "", o->align ? size_format(o->align, align, sizeof align) : "");
}

/* What a bad value should have been: "a whole number in [1, 4096]", "a learning rate in (0, 10)", "a comma-separated
 * list of at most 16 values, each a whole number in [1, 64]". */
static void describe(const cli_opt *o, char *buf, size_t len)
{
    char range[64];
    cli_opt_range(o, range, sizeof range);
    bool list = o->kind == CLI_INT_LIST || o->kind == CLI_SIZE_LIST;
    size_t at = list ? (size_t)snprintf(buf, len, "a comma-separated list of at most %d values, each ", CLI_LIST_MAX) : 0;
    at = MIN(at, len - 1);
    switch (o->kind) {
    case CLI_INT:
    case CLI_INT_LIST:
    case CLI_COUNT:
        snprintf(buf + at, len - at, "a whole number in %s", range);
        break;
    case CLI_LL:
        snprintf(buf + at, len - at, "a whole number of %s", range);
        break;
    case CLI_REAL:
        snprintf(buf + at, len - at, "%s in %s", o->what ? o->what : "a number", range);
        break;
    case CLI_SIZE:
    case CLI_SIZE_LIST:
        describe_size(o, range, buf + at, len - at);
        break;
    default:
        snprintf(buf + at, len - at, "%s", o->what ? o->what : "a value");
    }
}

/* "a, b, c" from "a|b|c". */
static void list_choices(const char *choices, char *buf, size_t len)
{
    size_t n = 0;
    for (const char *c = choices; *c && n + 3 < len; c++)
        n += (size_t)(*c == '|' ? snprintf(buf + n, len - n, ", ") : snprintf(buf + n, len - n, "%c", *c));
    buf[MIN(n, len - 1)] = '\0';
}

/* The message of a bad value. A choice lists the allowed values; a list names the value it could not take. Any other
 * option with a hint says what the value is not and what it means; one without says what it must be (the wording
 * `strata train` has always used). */
static void bad_value(const cli_opt *o, const char *v, char *err, size_t len)
{
    char what[192], allowed[256];
    describe(o, what, sizeof what);
    if (o->kind == CLI_CHOICE) {
        list_choices(o->choices, allowed, sizeof allowed);
        snprintf(err, len, "%s \"%s\": allowed: %s%s%s%s", o->name, v, allowed, o->hint ? " (" : "",
                 o->hint ? o->hint : "", o->hint ? ")" : "");
    } else if (o->kind == CLI_INT_LIST || o->kind == CLI_SIZE_LIST) {
        snprintf(err, len, "bad value \"%s\" for %s: it must be %s%s%s", v, o->name, what, o->hint ? "; " : "",
                 o->hint ? o->hint : "");
    } else if (o->hint) {
        snprintf(err, len, "%s \"%s\" is not %s; %s", o->name, v, what, o->hint);
    } else {
        snprintf(err, len, "%s \"%s\"%s must be %s", o->name, v, o->kind == CLI_REAL ? ":" : "", what);
    }
}

/* A count like 7.5e9, 7.5B, 125M, 4K or 350000000 into *out; false when it is not one or not whole. */
static bool parse_count(const char *text, double lo, double hi, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno)
        return false;
    const char *suffixes = "KMBT";
    if (*end && end[1] == '\0' && strchr(suffixes, *end))
        v *= pow(1e3, (double)(strchr(suffixes, *end) - suffixes + 1));
    else if (*end)
        return false;
    if (!(v >= lo && v <= hi) || fabs(v - round(v)) > 1e-6 * v)
        return false;
    *out = (size_t)llround(v);
    return true;
}

static int choice_index(const char *choices, const char *v)
{
    size_t n = strlen(v);
    int k = 0;
    for (const char *c = choices; c; c = strchr(c, '|'), c = c ? c + 1 : NULL, k++)
        if (strncmp(c, v, n) == 0 && (c[n] == '|' || c[n] == '\0'))
            return k;
    return -1;
}

static bool parse_whole(const cli_opt *o, const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < (long long)o->lo || n > (long long)o->hi)
        return false;
    *out = n;
    return true;
}

static bool parse_real(const cli_opt *o, const char *v, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(o->open_lo ? x > o->lo : x >= o->lo) || !(o->open_hi ? x < o->hi : x <= o->hi))
        return false;
    *out = x;
    return true;
}

static bool parse_size(const cli_opt *o, const char *v, size_t *out)
{
    size_t n;
    if (!size_parse(v, &n) || (double)n < o->lo || (o->hi > 0 && (double)n > o->hi) || (o->align && n % o->align))
        return false;
    *out = n;
    return true;
}

/* A comma-separated list of at most CLI_LIST_MAX values, each taken by parse_size or parse_whole. */
static bool parse_list(const cli_opt *o, const char *v, void *dst)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    bool sizes = o->kind == CLI_SIZE_LIST;
    int n = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long x = 0;
        if (n == CLI_LIST_MAX || (sizes ? !parse_size(o, tok, &((cli_size_list *)dst)->v[n]) : !parse_whole(o, tok, &x)))
            return false;
        if (!sizes)
            ((cli_int_list *)dst)->v[n] = (int)x;
        n++;
    }
    *(sizes ? &((cli_size_list *)dst)->n : &((cli_int_list *)dst)->n) = n;
    return n > 0;
}

/* Stores v into dst as o's kind; false when it is not a value o takes. */
static bool store(const cli_opt *o, const char *v, void *dst)
{
    long long n;
    switch (o->kind) {
    case CLI_SWITCH:
        return *(bool *)dst = true;
    case CLI_TEXT:
        *(const char **)dst = v;
        return true;
    case CLI_CHOICE:
        return (*(int *)dst = choice_index(o->choices, v)) >= 0;
    case CLI_INT:
        return parse_whole(o, v, &n) && (*(int *)dst = (int)n, true);
    case CLI_LL:
        return parse_whole(o, v, dst);
    case CLI_REAL:
        return parse_real(o, v, dst);
    case CLI_SIZE:
        return parse_size(o, v, dst);
    case CLI_COUNT:
        return parse_count(v, o->lo, o->hi, dst);
    case CLI_INT_LIST:
    case CLI_SIZE_LIST:
        return parse_list(o, v, dst);
    case CLI_CUSTOM:
        return o->parse(v, dst);
    }
    return false;
}

int cli_parse(const cli_spec *spec, int argc, char **argv, void *args, const char **operands, int max_operands,
              int *noperands, char *err, size_t err_bytes)
{
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) {
            if (!spec->operands || n == max_operands) {
                snprintf(err, err_bytes, "argument \"%s\": unexpected; see `strata %s --help`", a, spec->command);
                return CLI_EXIT_USAGE;
            }
            operands[n++] = a;
            continue;
        }
        /* "--name=value" is "--name value" (getopt_long's spelling, which nvme-bench used to take). */
        char name[64];
        const char *v = strchr(a, '=');
        if (v) {
            snprintf(name, sizeof name, "%.*s", (int)(v - a), a);
            a = name;
            v++;
        }
        found f = find(spec, a);
        if (!f.opt) {
            unknown_option(spec, a, err, err_bytes);
            return CLI_EXIT_USAGE;
        }
        if (f.opt->kind == CLI_SWITCH && v) {
            snprintf(err, err_bytes, "%s takes no value; see `strata %s --help`", a, spec->command);
            return CLI_EXIT_USAGE;
        }
        if (f.opt->kind != CLI_SWITCH && !v) {
            if (i + 1 >= argc) {
                snprintf(err, err_bytes, "%s needs a value; see `strata %s --help`", a, spec->command);
                return CLI_EXIT_USAGE;
            }
            v = argv[++i];
        }
        if (!store(f.opt, v, (char *)args + f.group->base + f.opt->offset)) {
            bad_value(f.opt, v, err, err_bytes);
            return CLI_EXIT_USAGE;
        }
        if (f.group->mark_given)
            *(bool *)((char *)args + f.group->mark) = true;
    }
    if (noperands)
        *noperands = n;
    return 0;
}

int cli_parse_or_say(const cli_spec *spec, int argc, char **argv, void *args)
{
    char err[1024];
    int rc = cli_parse(spec, argc, argv, args, NULL, 0, NULL, err, sizeof err);
    if (rc)
        fprintf(stderr, "strata %s: %s\n", spec->command, err);
    return rc;
}

/* Prints words (separated by single spaces) from column col, wrapped at HELP_WIDTH, continuation lines indented to
 * indent; a word never breaks. */
static void print_wrapped(FILE *out, const char *const *words, size_t n, int col, int indent)
{
    for (size_t k = 0; k < n; k++) {
        int w = (int)strlen(words[k]);
        if (k > 0 && col + 1 + w > HELP_WIDTH) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (k > 0) {
            fputc(' ', out);
            col++;
        }
        col += fprintf(out, "%s", words[k]);
    }
    fputc('\n', out);
}

/* Splits text at spaces into words (pointers into copy); returns their count. */
static size_t split_words(const char *text, char *copy, size_t copy_bytes, const char **words, size_t max)
{
    snprintf(copy, copy_bytes, "%s", text);
    size_t n = 0;
    for (char *save, *w = strtok_r(copy, " ", &save); w && n < max; w = strtok_r(NULL, " ", &save))
        words[n++] = w;
    return n;
}

void cli_print_usage(const cli_spec *spec, FILE *out)
{
    char items[64][96];
    const char *words[64];
    size_t n = 0;
    if (spec->operands)
        words[n++] = spec->operands;
    for (size_t g = 0; g < spec->ngroups; g++)
        for (size_t k = 0; k < spec->groups[g].count && n < 64; k++, n++) {
            const cli_opt *o = &spec->groups[g].opts[k];
            snprintf(items[n], sizeof items[n], "[%s%s%s]", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
            words[n] = items[n];
        }
    int at = fprintf(out, "usage: strata %s ", spec->command);
    print_wrapped(out, words, n, at, at);
}

void cli_print_options(const cli_spec *spec, FILE *out)
{
    for (size_t g = 0; g < spec->ngroups; g++) {
        if (spec->groups[g].title)
            fprintf(out, "%s\n", spec->groups[g].title);
        for (size_t k = 0; k < spec->groups[g].count; k++) {
            const cli_opt *o = &spec->groups[g].opts[k];
            char range[64], help[1024], copy[1024];
            const char *at = strstr(o->help, "{}"), *words[256];
            if (at)
                snprintf(help, sizeof help, "%.*s%s%s", (int)(at - o->help), o->help,
                         cli_opt_range(o, range, sizeof range), at + 2);
            else
                snprintf(help, sizeof help, "%s", o->help);
            int col = fprintf(out, "  %s%s%s", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
            /* the help starts at HELP_COLUMN, on the next line when the option itself reaches it */
            fprintf(out, col < HELP_COLUMN ? "%*s" : "\n%*s", col < HELP_COLUMN ? HELP_COLUMN - col : HELP_COLUMN, "");
            size_t n = split_words(help, copy, sizeof copy, words, 256);
            print_wrapped(out, words, n, HELP_COLUMN, HELP_COLUMN);
        }
    }
}

void cli_print_help(const cli_spec *spec, FILE *out)
{
    cli_print_usage(spec, out);
    if (spec->about)
        fprintf(out, "\n%s\n\n", spec->about);
    cli_print_options(spec, out);
    if (spec->footer)
        fprintf(out, "%s\n", spec->footer);
}
