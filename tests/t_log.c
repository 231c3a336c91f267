/*
 * Logging: the embedder's callback receives what passes the level and subsystem filters,
 * arguments of disabled messages are not evaluated, bad STRATA_LOG values warn once.
 */
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "testlib.h"

static char last_msg[512];
static char last_sub[32];
static int calls;

static void sink(strata_log_level level, const char *subsystem, const char *message, void *user)
{
    (void)level;
    *(int *)user += 1;
    calls++;
    snprintf(last_msg, sizeof last_msg, "%s", message);
    snprintf(last_sub, sizeof last_sub, "%s", subsystem);
}

static int evaluated;
static int side_effect(void)
{
    return ++evaluated;
}

/* Runs this binary again with STRATA_LOG set, and returns what it printed on stderr. */
static void child_stderr(const char *self, const char *env_level, char *out, size_t len)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "STRATA_LOG='%s' '%s' --child 2>&1 >/dev/null", env_level, self);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = '\0';
    if (p)
        pclose(p);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0) {
        /* Two messages at warn: the bad-value warning must still appear only once. */
        LOG_WARN(LOG_IO, "first");
        LOG_WARN(LOG_IO, "second");
        return 0;
    }
    int user_count = 0;
    strata_log_set_callback(sink, &user_count);
    strata_log_set_level(STRATA_LOG_INFO);
    T_OK(strata_log_set_subsystems("all"));

    LOG_INFO(LOG_IO, "read %d bytes", 4096);
    T_EQ_INT(user_count, 1);
    T_EQ_STR(last_msg, "read 4096 bytes");
    T_EQ_STR(last_sub, "io");

    LOG_DEBUG(LOG_IO, "hidden %d", side_effect());
    T_EQ_INT(calls, 1);
    T_EQ_INT(evaluated, 0); /* the level is tested before the arguments are evaluated */

    T_OK(strata_log_set_subsystems("adam,ckpt"));
    LOG_WARN(LOG_IO, "filtered out");
    T_EQ_INT(calls, 1);
    LOG_WARN(LOG_ADAM, "kept");
    T_EQ_INT(calls, 2);
    T_EQ_STR(last_sub, "adam");

    T_STATUS(strata_log_set_subsystems("io,bogus"), STRATA_EINVAL);
    T_EQ_STR(strata_last_error(NULL),
             "strata_log_set_subsystems: unknown subsystem \"bogus\"; allowed: all,core,config,io,adam,dev,sched,ckpt,train,comm");
    T_OK(strata_log_set_subsystems(NULL));

    for (int i = 0; i < 3; i++)
        LOG_ONCE(STRATA_LOG_WARN, LOG_CORE, "once only");
    T_EQ_INT(calls, 3);

    strata_log_set_callback(NULL, NULL);
    char out[2048];
    child_stderr(argv[0], "loud", out, sizeof out);
    T_CONTAINS(out, "STRATA_LOG=\"loud\" is not a level; allowed: off, error, warn, info, debug, trace; using warn");
    const char *first = strstr(out, "is not a level");
    T_CHECK(first && !strstr(first + 1, "is not a level"), "the warning appeared more than once:\n%s", out);
    T_CONTAINS(out, "strata [warn io] first");
    child_stderr(argv[0], "error", out, sizeof out);
    T_CHECK(strstr(out, "first") == NULL, "STRATA_LOG=error still printed a warning:\n%s", out);
    return t_done();
}
