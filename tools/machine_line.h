/* The machine and build lines the C benchmarks print first (`strata bench adam`, `strata bench step`,
 * `strata nvme-bench`, benchmarks/b_stall), so that every figure names its machine the same way.
 * benchmarks/lib.sh prints the same fields for the shell benchmarks. */
#ifndef STRATA_TOOLS_MACHINE_LINE_H
#define STRATA_TOOLS_MACHINE_LINE_H

#include <stddef.h>
#include <stdio.h>

/* Prints two lines to out, each after prefix ("" or "# "):
 *   machine: HOST (ARCH), CPU MODEL, N cores (M for this process), TOTAL RAM (AVAILABLE available), Linux RELEASE,
 *            Adam isa ISA
 *   build:   strata VERSION, BUILD TYPE, COMPILER
 * A field that cannot be read prints as "?". */
void machine_line_print(FILE *out, const char *prefix);

/* MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read. */
size_t machine_mem_available_bytes(void);

#endif
