#include "tools/machine_line.h"

#include <sched.h>
#include <stdbool.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "base/size.h"
#include "build_info.h"
#include "strata.h"

/* The value of the first line of a /proc file that starts with key, after its ':'; false when none. */
static bool proc_field(const char *file, const char *key, char *out, size_t len)
{
    FILE *f = fopen(file, "r");
    char line[512];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, key, strlen(key)) != 0 || !colon)
            continue;
        colon += strspn(colon + 1, " \t") + 1;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(out, len, "%s", colon);
        found = true;
    }
    if (f)
        fclose(f);
    return found;
}

static size_t meminfo_bytes(const char *key)
{
    char v[64];
    size_t kib = 0;
    return proc_field("/proc/meminfo", key, v, sizeof v) && sscanf(v, "%zu kB", &kib) == 1 ? kib * 1024 : 0;
}

size_t machine_mem_available_bytes(void)
{
    return meminfo_bytes("MemAvailable");
}

void machine_line_print(FILE *out, const char *prefix)
{
    struct utsname u;
    if (uname(&u) != 0)
        memset(&u, 0, sizeof u);
    char cpu[256] = "?";
    proc_field("/proc/cpuinfo", "model name", cpu, sizeof cpu);
    /* The cores this process may run on (taskset, cgroup cpusets), next to those the machine has. */
    cpu_set_t set;
    int mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    char total[32] = "?", avail[32] = "?";
    size_t t = meminfo_bytes("MemTotal"), a = machine_mem_available_bytes();
    if (t)
        size_format(t, total, sizeof total);
    if (a)
        size_format(a, avail, sizeof avail);
    const char *isa = strata_adam_isa(); /* what the Adam kernels dispatch to (STRATA_ISA may force it) */
    fprintf(out, "%smachine: %s (%s), %s, %ld cores (%d for this process), %s RAM (%s available), Linux %s, "
            "Adam isa %s\n", prefix, u.nodename[0] ? u.nodename : "?", u.machine[0] ? u.machine : "?", cpu,
            sysconf(_SC_NPROCESSORS_ONLN), mine, total, avail, u.release[0] ? u.release : "?", isa ? isa : "?");
    fprintf(out, "%sbuild:   strata %s, %s, %s\n", prefix, strata_version(), STRATA_BUILD_TYPE, STRATA_BUILD_COMPILER);
}
