/* `strata config check FILE`: every problem with exit code 2, or the resolved configuration as a table. */
#include <stdio.h>
#include <string.h>

#include "engine/config/config_schema.h"
#include "strata.h"
#include "tools/cli.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata config check FILE\n"
            "       strata config defaults\n\n"
            "check     load FILE (DeepSpeed vocabulary plus a \"strata\" section) over the defaults; print every\n"
            "          problem and exit 2, or print the resolved configuration with the source of each value\n"
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
    printf("%s: ok\n\n", argv[2]);
    print_table(&cfg, &defaults);
    return CLI_EXIT_OK;
}
