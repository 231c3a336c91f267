/* `strata config check FILE`: every problem with exit code 2, or the resolved configuration as a table. */
#include <stdio.h>
#include <string.h>

#include "base/size.h"
#include "engine/config/config_schema.h"
#include "engine/plan/plan.h"
#include "nvme/io.h"
#include "nvme/swap.h"
#include "strata.h"
#include "tools/cli.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata config check FILE\n"
            "       strata config defaults\n\n"
            "check     load FILE (DeepSpeed vocabulary plus a \"strata\" section) over the defaults and check every\n"
            "          nvme_path training would use on this machine, as training checks it (a directory, writable,\n"
            "          O_DIRECT or the buffered fallback, room for one aio.block_size); print every problem and exit\n"
            "          2, or print the paths, their free space and the resolved configuration\n"
            "defaults  print the default configuration as the same table\n");
}

/* Prints one row per key and whether its value differs from the default. */
static void print_table(const strata_config *cfg, const strata_config *defaults)
{
    printf("%-56s %-28s %s\n", "KEY", "VALUE", "VS DEFAULT");
    for (size_t i = 0; i < cfg_key_count; i++) {
        const cfg_key *k = &cfg_keys[i];
        if (!cfg_key_is_setting(k))
            continue;
        char value[256], def[256];
        cfg_key_format(k, cfg, value, sizeof value);
        cfg_key_format(k, defaults, def, sizeof def);
        printf("%-56s %-28s %s\n", k->path, value, strcmp(value, def) == 0 ? "same" : "changed");
    }
}

/* What one usable nvme_path offers, as a line of the report. */
static void describe_path(const char *dir, const swap_path_report *r, strata_switch direct, char *buf, size_t len)
{
    char free_h[32];
    const char *io = r->direct                       ? "O_DIRECT"
                     : direct == STRATA_SWITCH_OFF ? "buffered I/O (strata.aio.direct = false)"
                                                   : "O_DIRECT refused, so buffered I/O (strata.aio.direct = auto "
                                                     "falls back; true would make this an error)";
    snprintf(buf, len, "nvme_path \"%s\": directory, writable, %s, %s free\n", dir, io,
             size_format((size_t)r->free_bytes, free_h, sizeof free_h));
}

/* Checks every nvme_path training would open with the function training checks them with (swap_check_path), for
 * the least swap training ever puts there; problems go to stderr, the description of the good paths into report.
 * Returns the CLI exit code. */
static int check_swap_paths(const char *file, const strata_config *cfg, char *report, size_t len)
{
    report[0] = '\0';
    const char *paths[PLAN_MAX_SWAP_PATHS];
    int n = plan_swap_paths(cfg, paths);
    if (n == 0)
        return CLI_EXIT_OK;
    nvme_io *io;
    if (nvme_io_create(&cfg->aio, &io) != STRATA_OK) {
        fprintf(stderr, "%s: cannot check the nvme_paths: %s\n", file, strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    int rc = CLI_EXIT_OK;
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        swap_path_report r;
        if (swap_check_path(io, paths[i], swap_min_bytes(io), &r) != STRATA_OK) {
            fprintf(stderr, "%s: %s\n", file, strata_last_error(NULL));
            rc = CLI_EXIT_USAGE;
            continue;
        }
        if (used < len) {
            describe_path(paths[i], &r, cfg->aio.direct, report + used, len - used);
            used += strlen(report + used);
        }
    }
    nvme_io_destroy(io);
    return rc;
}

int cmd_config(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    strata_config defaults;
    strata_config_init(&defaults);
    if (argc == 2 && strcmp(argv[1], "defaults") == 0) {
        print_table(&defaults, &defaults);
        return CLI_EXIT_OK;
    }
    if (argc != 3 || strcmp(argv[1], "check") != 0) {
        static const cli_subcommand subs[] = {
            {"check", "one FILE, a JSON config"}, {"defaults", "no arguments"}, {NULL, NULL}};
        cli_subcommand_error("config", argc, argv, subs);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    strata_config cfg = defaults;
    char err[8192];
    strata_status st = strata_config_load_json(&cfg, argv[2], err, sizeof err);
    if (st != STRATA_OK) {
        fprintf(stderr, "%s\n", err);
        return CLI_EXIT_USAGE;
    }
    char paths[PLAN_MAX_SWAP_PATHS * (STRATA_PATH_BYTES + 192)];
    int rc = check_swap_paths(argv[2], &cfg, paths, sizeof paths);
    if (rc != CLI_EXIT_OK)
        return rc;
    printf("%s: ok\n\n%s%s", argv[2], paths, paths[0] ? "\n" : "");
    print_table(&cfg, &defaults);
    return CLI_EXIT_OK;
}
