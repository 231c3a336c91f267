/* The strata CLI: main() dispatches to one subcommand per file (tools/cmd_*.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata.h"
#include "tools/cli.h"

static const cli_command commands[] = {
    {.name = "train", .run = cmd_train, .passive_openmp = true,
     .summary = "train a GPT model through the public API (the main job)"},
    {.name = "info", .run = cmd_info, .summary = "show version, build options, CPU, NUMA and device backends"},
    {.name = "config", .run = cmd_config,
     .summary = "check a configuration file and print it resolved (`strata config check FILE`)"},
    {.name = "nvme-bench", .run = cmd_nvme_bench,
     .summary = "measure NVMe bandwidth over block size x queue depth x threads; write the best aio block"},
    {.name = "estimate", .run = cmd_estimate,
     .summary = "memory per tier for a model shape and a config, without allocating"},
    {.name = "ckpt", .run = cmd_ckpt, .summary = "inspect or verify a checkpoint (`strata ckpt inspect|verify DIR`)"},
    {.name = "bench", .run = cmd_bench,
     .summary = "kernel and pipeline benchmarks (`strata bench adam`, `strata bench step`)"},
};

/* GNU OpenMP keeps idle threads spinning, and the model alternates OpenMP loops with OpenBLAS's own
 * (pthread) threads: on a few cores the spinners starve the BLAS threads (measured 4-6x slower here).
 * libgomp reads its wait policy only when the process starts, so when the user has not chosen one,
 * choose passive and start again with the same command line. */
static void prefer_passive_openmp(char **argv)
{
    if (getenv("OMP_WAIT_POLICY"))
        return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the spinning policy, only slower */
}

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
        if (strcmp(argv[1], commands[i].name) == 0) {
            if (commands[i].passive_openmp)
                prefer_passive_openmp(argv);
            return commands[i].run(argc - 1, argv + 1);
        }
    fprintf(stderr, "strata: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
