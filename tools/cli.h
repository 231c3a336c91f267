/* What the CLI's subcommands share: the command table entry and exit codes. */
#ifndef STRATA_TOOLS_CLI_H
#define STRATA_TOOLS_CLI_H

#include <stdbool.h>

/* Exit codes: 0 success, 1 the work failed, 2 the user's input (arguments, config) is wrong. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
    bool passive_openmp;               /* mixes OpenMP with OpenBLAS's threads: see tools/main.c */
} cli_command;

/* True when argv holds --help or -h. */
bool cli_wants_help(int argc, char **argv);

/* A subcommand of a command (`strata ckpt inspect`) and the arguments it takes, for messages. */
typedef struct cli_subcommand {
    const char *name;
    const char *takes; /* "one DIR, a checkpoint or a directory holding checkpoints" */
} cli_subcommand;

/* Says on stderr why argv (argv[0] the command) is not a command line the command takes, before the caller prints
 * its usage: no subcommand, an unknown one (named, with the allowed ones), or a known one with the wrong arguments
 * (what it takes). subs ends with a {NULL, NULL} entry. */
void cli_subcommand_error(const char *command, int argc, char **argv, const cli_subcommand *subs);

int cmd_info(int argc, char **argv);
int cmd_config(int argc, char **argv);
int cmd_nvme_bench(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_estimate(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
/* `strata bench step` (tools/bench_step.c), dispatched by cmd_bench. */
int bench_step_main(int argc, char **argv);

#endif
