/* Placeholder until this command is written (being written now; replaced before commit). */
#include <stdio.h>
#include "tools/cli.h"
int cmd_ckpt(int argc, char **argv) { (void)argc; fprintf(stderr, "strata %s: not built yet\n", argv[0]); return CLI_EXIT_FAIL; }
