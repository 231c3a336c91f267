/*
 * Proves that the test library fails a test that ran no check: this program runs itself in each mode below
 * and expects the exit status and message given. A test that returns 0 having checked nothing is a failure
 * whether it ends through t_done() or not; one check, a skip, or a forked child that checks nothing (only the
 * test's own process is judged) are not.
 */
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"

typedef struct mode {
    const char *name;
    int want_status;
    const char *want_output; /* NULL: the output must not say "ran no check" */
} mode;

static const mode modes[] = {
    {"none-done", 1, "ran no check"},   /* return t_done() with no check */
    {"none-return", 1, "ran no check"}, /* return 0 from main, never calling t_done() */
    {"one-check", 0, NULL},
    {"skip", 77, NULL},
    {"child-no-check", 0, NULL}, /* a forked child exits 0 before the parent's one check */
};

static int run_mode(const char *name)
{
    if (strcmp(name, "none-done") == 0)
        return t_done();
    if (strcmp(name, "none-return") == 0)
        return 0;
    if (strcmp(name, "skip") == 0)
        t_skip("skipping on purpose");
    if (strcmp(name, "child-no-check") == 0) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0)
            exit(0);
        int status = 0;
        waitpid(pid, &status, 0);
        T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child: status 0x%x, expected exit 0", status);
        return t_done();
    }
    T_CHECK(1, "one check that passes");
    return t_done();
}

int main(int argc, char **argv)
{
    if (argc == 2)
        return run_mode(argv[1]);
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        t_skip("cannot find this program's path in /proc/self/exe");
    self[len] = '\0';
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        const mode *m = &modes[i];
        char cmd[4200], out[8192] = "";
        snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", self, m->name);
        FILE *p = popen(cmd, "r");
        T_CHECK(p != NULL, "popen(%s) failed", cmd);
        if (!p)
            continue;
        size_t got = fread(out, 1, sizeof out - 1, p);
        out[got] = '\0';
        int status = pclose(p);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        T_CHECK(code == m->want_status, "mode %s: exit status %d, expected %d; its output:\n%s", m->name, code,
                m->want_status, out);
        if (m->want_output)
            T_CONTAINS(out, m->want_output);
        else
            T_CHECK(!strstr(out, "ran no check"), "mode %s: said \"ran no check\" wrongly:\n%s", m->name, out);
    }
    return t_done();
}
