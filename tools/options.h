/* The one option parser of the `strata` commands: each command describes its options in a table (name, kind,
 * destination, range, help) and this file parses argv against it, says what is wrong with a bad option (the option,
 * the value, the allowed range or values and a hint), and prints the usage line and option list from the same
 * table, so that --help states the ranges the parser applies. */
#ifndef STRATA_TOOLS_OPTIONS_H
#define STRATA_TOOLS_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* What an option's value is, and the type of its destination. */
typedef enum cli_opt_kind {
    CLI_SWITCH, /* no value: bool, set true */
    CLI_TEXT,   /* const char *, kept as given */
    CLI_CHOICE, /* int: the index of the value among choices ("device|host|nvme"), as written */
    CLI_INT,    /* int in [lo, hi] */
    CLI_LL,     /* long long of at least lo (hi is only the type's bound) */
    CLI_REAL,   /* double in lo..hi, each end open or closed (open_lo, open_hi) */
    CLI_SIZE,   /* size_t: bytes or a string like 2GiB, in [lo, hi] (hi 0: no bound) and a multiple of align */
    CLI_COUNT,  /* size_t: a whole count written 7.5e9, 7.5B, 125M or 350000000, in [lo, hi] */
    CLI_INT_LIST,  /* cli_int_list: comma-separated whole numbers, each in [lo, hi] */
    CLI_SIZE_LIST, /* cli_size_list: comma-separated sizes, each in [lo, hi] and a multiple of align */
    CLI_CUSTOM,    /* parse(text, destination) decides; what says what it takes */
} cli_opt_kind;

#define CLI_LIST_MAX 16
typedef struct cli_int_list {
    int v[CLI_LIST_MAX];
    int n;
} cli_int_list;
typedef struct cli_size_list {
    size_t v[CLI_LIST_MAX];
    int n;
} cli_size_list;

typedef struct cli_opt {
    const char *name; /* "--layers" */
    cli_opt_kind kind;
    size_t offset; /* of the destination in the command's argument struct (plus the group's base) */
    double lo, hi;
    bool open_lo, open_hi;
    size_t align; /* CLI_SIZE, CLI_SIZE_LIST: the value is a multiple of it (0: any) */
    const char *meta;    /* the value's placeholder in --help: "N", "SIZE", "FILE" */
    const char *help;    /* one line for --help; "{}" in it is replaced by the range */
    const char *hint;    /* added to a bad value's message: what the value means, an example */
    const char *choices; /* CLI_CHOICE: the allowed values, '|'-separated */
    const char *what;    /* CLI_REAL, CLI_CUSTOM: what the value is, for messages ("a learning rate") */
    bool (*parse)(const char *text, void *dst); /* CLI_CUSTOM */
} cli_opt;

/* A table of options whose destinations lie at base in the argument struct (a shared table, such as the model
 * shape's, is one group of each command that uses it). When mark_given, any option of the group that is given sets
 * the bool at mark. A title heads the group's options in --help. */
typedef struct cli_opt_group {
    const cli_opt *opts;
    size_t count;
    size_t base;
    bool mark_given;
    size_t mark;
    const char *title;
} cli_opt_group;

/* A command's whole command line. */
typedef struct cli_spec {
    const char *command;  /* "train", "bench step": messages say `strata <command>` */
    const char *operands; /* in the usage line, e.g. "PATH [PATH...]"; NULL: the command takes none */
    const cli_opt_group *groups;
    size_t ngroups;
    const char *about;  /* what the command does, between the usage line and the options; NULL: nothing */
    const char *footer; /* after the options; NULL: nothing */
} cli_spec;

/* An entry of the common shape: flag of kind into field of the argument struct type, range [lo, hi], help. */
#define CLI_OPTION(type, flag, kind_, field, lo_, hi_, meta_, text)                                                 \
    {.name = (flag), .kind = (kind_), .offset = offsetof(type, field), .lo = (lo_), .hi = (hi_), .meta = (meta_),   \
     .help = (text)}

#define CLI_GROUP(table) {(table), sizeof(table) / sizeof((table)[0]), 0, false, 0, NULL}

/* Parses argv (argv[0] is the command) into args. Operands (arguments that are not options) go to
 * operands[0..*noperands) when the spec takes them (at most max_operands; operands may be NULL otherwise). Returns 0,
 * or CLI_EXIT_USAGE with the reason, without a prefix, in err. */
int cli_parse(const cli_spec *spec, int argc, char **argv, void *args, const char **operands, int max_operands,
              int *noperands, char *err, size_t err_bytes);

/* cli_parse for a command that has no operands and prints its own errors as "strata <command>: <reason>". */
int cli_parse_or_say(const cli_spec *spec, int argc, char **argv, void *args);

/* "usage: strata <command> [operands] [--name META]..." wrapped to the terminal width of the house (118). */
void cli_print_usage(const cli_spec *spec, FILE *out);
/* One line per option, "  --name META  help", wrapped and indented. */
void cli_print_options(const cli_spec *spec, FILE *out);
/* --help: the usage line, the about text, the options and the footer. */
void cli_print_help(const cli_spec *spec, FILE *out);

#endif
