/* `strata info`: what this strata is and what this machine offers it. */
#include <hwloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/size.h"
#include "build_info.h"
#include "gpu/device.h"
#include "strata.h"
#include "tools/cli.h"

static void print_cpu(void)
{
    static const char *const features[] = {"sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                                           "avx512vl", "avx512bf16"};
    char line[256] = "";
    size_t used = 0;
    __builtin_cpu_init();
    for (size_t i = 0; i < sizeof features / sizeof features[0]; i++) {
        bool has = false;
        /* __builtin_cpu_supports needs a literal, hence the switch by index. */
        switch (i) {
        case 0: has = __builtin_cpu_supports("sse4.2"); break;
        case 1: has = __builtin_cpu_supports("avx"); break;
        case 2: has = __builtin_cpu_supports("avx2"); break;
        case 3: has = __builtin_cpu_supports("fma"); break;
        case 4: has = __builtin_cpu_supports("f16c"); break;
        case 5: has = __builtin_cpu_supports("avx512f"); break;
        case 6: has = __builtin_cpu_supports("avx512bw"); break;
        case 7: has = __builtin_cpu_supports("avx512vl"); break;
        case 8: has = __builtin_cpu_supports("avx512bf16"); break;
        }
        if (has)
            used += (size_t)snprintf(line + used, sizeof line - used, "%s%s", used ? " " : "", features[i]);
    }
    printf("  %-18s %s\n", "cpu isa", line[0] ? line : "(none of interest)");
}

static void print_topology(void)
{
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
        printf("  %-18s unavailable (hwloc could not load the topology)\n", "topology");
        return;
    }
    int packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    int pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    hwloc_obj_t root = hwloc_get_root_obj(topo);
    const char *model = hwloc_obj_get_info_by_name(root, "CPUModel");
    if (!model) {
        hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
        model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
    }
    printf("  %-18s %s\n", "cpu model", model ? model : "(unknown)");
    printf("  %-18s %d package(s), %d core(s), %d hardware thread(s)\n", "cpu topology", packages, cores, pus);
    for (int i = 0; i < numa; i++) {
        hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        char mem[32], cpus[128];
        hwloc_bitmap_list_snprintf(cpus, sizeof cpus, node->cpuset);
        printf("  %-18s node %u: %s, cpus %s\n", i == 0 ? "numa" : "", node->os_index,
               size_format((size_t)node->attr->numanode.local_memory, mem, sizeof mem), cpus);
    }
    hwloc_topology_destroy(topo);
}

static void print_limits(void)
{
    struct rlimit rl;
    char buf[32];
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
        printf("  %-18s %s\n", "memlock limit",
               rl.rlim_cur == RLIM_INFINITY ? "unlimited" : size_format((size_t)rl.rlim_cur, buf, sizeof buf));
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
        printf("  %-18s %s\n", "memory", size_format((size_t)pages * (size_t)page, buf, sizeof buf));
}

static void print_backends(void)
{
    static const struct {
        strata_backend_kind kind;
        const char *name;
    } kinds[] = {{STRATA_BACKEND_HOST, "host"}, {STRATA_BACKEND_CUDA, "cuda"}, {STRATA_BACKEND_AUTO, "auto picks"}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        char detail[512] = "";
        strata_status st = dev_probe(kinds[i].kind, detail, sizeof detail);
        printf("  %-18s %s%s\n", kinds[i].name, st == STRATA_OK ? "" : "unavailable: ", detail);
    }
}

int cmd_info(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: strata info\n\nPrints the version, how this strata was built, the CPU's instruction sets,\n"
               "cores and NUMA nodes (hwloc), memory limits and which device backends can run here (and why not).\n");
        return CLI_EXIT_OK;
    }
    if (argc > 1) {
        fprintf(stderr, "strata info: unexpected argument \"%s\" (see strata info --help)\n", argv[1]);
        return CLI_EXIT_USAGE;
    }
    printf("strata %s\n\nbuild\n", strata_version());
    printf("  %-18s %s\n", "type", STRATA_BUILD_TYPE);
    printf("  %-18s %s\n", "compiler", STRATA_BUILD_COMPILER);
    printf("  %-18s %s%s%s\n", "cuda backend", strcmp(STRATA_BUILD_CUDA, "ON") == 0 ? "built for " : "not built",
           strcmp(STRATA_BUILD_CUDA, "ON") == 0 ? STRATA_BUILD_CUDA_ARCHS : "",
           strcmp(STRATA_BUILD_CUDA, "ON") == 0 ? "" : " (nvcc was not found at configure time)");
    printf("  %-18s %s\n", "sanitizers", STRATA_BUILD_SANITIZE[0] ? STRATA_BUILD_SANITIZE : "none");
    printf("\nmachine\n");
    print_cpu();
    print_topology();
    print_limits();
    printf("\ndevice backends\n");
    print_backends();
    return CLI_EXIT_OK;
}
