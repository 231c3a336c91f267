/* `strata nvme-bench` end to end: the table and the best settings, --json with each reading row's verified
 * figure beside the unverified one, --write-config in the config vocabulary, a bad argument refused, and
 * Ctrl-C leaves no file behind. */
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"

/* Runs a shell command, returns its exit status and (up to len bytes of) its stdout. */
static int run(const char *cmd, char *out, size_t len)
{
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = '\0';
    int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    const char *bin = getenv("STRATA_BIN");
    if (!bin || access(bin, X_OK) != 0)
        t_skip("STRATA_BIN does not name the strata binary (run through ctest)");
    char dir[4096], data[4200], cfgfile[4200], cmd[12000];
    snprintf(dir, sizeof dir, "%s", t_scratch_dir("t_nvme_cli"));
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(cfgfile, sizeof cfgfile, "%s/aio.json", dir);
    mkdir(data, 0700);
    static char out[1 << 16];
    const char *grid = "--size 16MiB --bs 128KiB,1MiB --qd 1,4 --threads 1 --seconds 0.2";

    snprintf(cmd, sizeof cmd, "%s nvme-bench %s %s --write-config %s 2>&1", bin, data, grid, cfgfile);
    T_EQ_INT(run(cmd, out, sizeof out), 0);
    T_CONTAINS(out, "machine:");
    T_CONTAINS(out, "mode          bs   qd  thr     GB/s verified    p50_us    p99_us  cpu_s/GB  #wrong errors");
    T_CONTAINS(out, "columns: GB/s with the reads timed only; verified: the same pass again");
    T_CONTAINS(out, "(verified ");
    T_CONTAINS(out, "best: block_size");
    T_CONTAINS(out, "#wrong 0, errors 0");
    json_error_t jerr;
    json_t *cfg = json_load_file(cfgfile, 0, &jerr);
    T_CHECK(cfg != NULL, "--write-config output is not JSON: %s", jerr.text);
    json_int_t bs = json_integer_value(json_object_get(json_object_get(cfg, "aio"), "block_size"));
    json_int_t qd = json_integer_value(json_object_get(json_object_get(cfg, "aio"), "queue_depth"));
    T_CHECK(bs == 131072 || bs == 1048576, "aio.block_size = %lld is not from the grid", (long long)bs);
    T_CHECK(qd == 1 || qd == 4, "aio.queue_depth = %lld is not from the grid", (long long)qd);
    json_decref(cfg);
    T_EQ_INT(t_dir_entries(data), 0);

    snprintf(cmd, sizeof cmd, "%s nvme-bench %s %s --modes read,rw --json 2>/dev/null", bin, data, grid);
    T_EQ_INT(run(cmd, out, sizeof out), 0);
    json_t *j = json_loads(out, 0, &jerr);
    T_CHECK(j != NULL, "--json output is not JSON: %s\n%s", jerr.text, out);
    T_EQ_INT(json_array_size(json_object_get(j, "results")), 2 * 2 * 2);
    T_EQ_INT(json_integer_value(json_object_get(j, "wrong")), 0);
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(j, "results"), i, row) {
        double gbps = json_real_value(json_object_get(row, "gbps"));
        double verified = json_real_value(json_object_get(row, "gbps_verified"));
        T_CHECK(gbps > 0 && verified > 0, "row %zu: gbps %.3f, gbps_verified %.3f (both passes must have run)", i,
                gbps, verified);
    }
    json_decref(j);

    /* A write has nothing to verify: its row has no verified figure. */
    snprintf(cmd, sizeof cmd,
             "%s nvme-bench %s --size 16MiB --bs 1MiB --qd 4 --threads 1 --seconds 0.2 --modes write --json 2>/dev/null",
             bin, data);
    T_EQ_INT(run(cmd, out, sizeof out), 0);
    j = json_loads(out, 0, &jerr);
    T_CHECK(j != NULL, "--json output is not JSON: %s\n%s", jerr.text, out);
    T_CHECK(json_is_null(json_object_get(json_array_get(json_object_get(j, "results"), 0), "gbps_verified")),
            "a write row's gbps_verified is not null:\n%s", out);
    json_decref(j);

    snprintf(cmd, sizeof cmd, "%s nvme-bench %s --threads 0 2>&1", bin, data);
    T_EQ_INT(run(cmd, out, sizeof out), 2);
    T_CONTAINS(out, "bad value \"0\" for --threads");

    /* Ctrl-C in the middle of a long pass: exit 130 and the directory is empty. */
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execl(bin, bin, "nvme-bench", data, "--size", "1GiB", "--seconds", "0", "--bs", "128KiB", "--qd", "1",
              (char *)NULL);
        _exit(127);
    }
    usleep(700 * 1000);
    T_EQ_INT(t_dir_entries(data), 0); /* private files are never visible, even while running */
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    T_CHECK(WIFEXITED(status) && (WEXITSTATUS(status) == 130 || WEXITSTATUS(status) == 1),
            "after SIGINT: status %#x (expected exit 130, or 1 when still writing the test data)", status);
    T_EQ_INT(t_dir_entries(data), 0);
    return t_done();
}
