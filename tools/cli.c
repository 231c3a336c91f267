/* Helpers shared by the CLI's subcommands. */
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"

bool cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    return false;
}

void cli_subcommand_error(const char *command, int argc, char **argv, const cli_subcommand *subs)
{
    char allowed[256] = "";
    size_t used = 0;
    const cli_subcommand *hit = NULL;
    for (const cli_subcommand *s = subs; s->name; s++) {
        if (argc >= 2 && strcmp(argv[1], s->name) == 0)
            hit = s;
        if (used < sizeof allowed)
            used += (size_t)snprintf(allowed + used, sizeof allowed - used, "%s%s", s == subs ? "" : ", ", s->name);
    }
    if (argc < 2)
        fprintf(stderr, "strata %s: a subcommand is needed: %s\n", command, allowed);
    else if (!hit)
        fprintf(stderr, "strata %s: unknown subcommand \"%s\"; allowed: %s\n", command, argv[1], allowed);
    else
        fprintf(stderr, "strata %s %s: takes %s; got %d argument%s\n", command, hit->name, hit->takes, argc - 2,
                argc == 3 ? "" : "s");
}
