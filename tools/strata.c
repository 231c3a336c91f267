/* The strata CLI: one binary, one subcommand per file (tools/cmd_*.c). */
#include <stdio.h>
#include <string.h>

#include "strata.h"
#include "tools/cli.h"

static const cli_command commands[] = {
    {"train", "train a GPT model through the public API (the main job)", cmd_train},
    {"info", "show version, build options, CPU, NUMA and device backends", cmd_info},
    {"config", "check a configuration file and print it resolved (`strata config check FILE`)", cmd_config},
    {"nvme-bench", "measure NVMe bandwidth over block size x queue depth x threads; write the best aio block",
     cmd_nvme_bench},
    {"estimate", "memory per tier for a model shape and a config, without allocating", cmd_estimate},
    {"ckpt", "inspect or verify a checkpoint (`strata ckpt inspect|verify DIR`)", cmd_ckpt},
    {"bench", "kernel and pipeline benchmarks (`strata bench adam`, `strata bench step`)", cmd_bench},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: strata <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`strata <command> --help` shows a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("strata %s\n", strata_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "strata: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
