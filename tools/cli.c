/* Helpers shared by the CLI's subcommands. */
#include <string.h>

#include "tools/cli.h"

bool cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    return false;
}
