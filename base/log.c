/* Logging: environment parsing, filtering, the embedder's callback. */
#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/error.h"

_Atomic int log_level_now = STRATA_LOG_WARN;
_Atomic unsigned log_subsys_mask = ~0u;

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static strata_log_fn sink_fn;
static void *sink_user;

static const char *const level_names[] = {"off", "error", "warn", "info", "debug", "trace"};

static const struct {
    log_subsys id;
    const char *name;
} subsys_names[] = {
#define LOG_NAME_(id, name) {id, name},
    LOG_SUBSYS_LIST(LOG_NAME_)
#undef LOG_NAME_
};

const char *log_level_name(strata_log_level level)
{
    if ((unsigned)level < sizeof level_names / sizeof level_names[0])
        return level_names[level];
    return "?";
}

const char *log_subsys_name(log_subsys sub)
{
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
        if (subsys_names[i].id == sub)
            return subsys_names[i].name;
    return "?";
}

bool log_parse_level(const char *text, strata_log_level *out)
{
    for (size_t i = 0; i < sizeof level_names / sizeof level_names[0]; i++) {
        if (strcasecmp(text, level_names[i]) == 0) {
            *out = (strata_log_level)i;
            return true;
        }
    }
    if (strcasecmp(text, "warning") == 0) {
        *out = STRATA_LOG_WARN;
        return true;
    }
    return false;
}

/* Parses "io,adam" into a mask; on an unknown name returns false and names it in bad. */
static bool parse_subsys_list(const char *list, unsigned *mask, char *bad, size_t badlen)
{
    if (!list || !*list || strcasecmp(list, "all") == 0) {
        *mask = ~0u;
        return true;
    }
    unsigned m = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        bool found = false;
        for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++) {
            if (strcasecmp(tok, subsys_names[i].name) == 0) {
                m |= subsys_names[i].id;
                found = true;
            }
        }
        if (!found) {
            snprintf(bad, badlen, "%s", tok);
            return false;
        }
    }
    *mask = m;
    return true;
}

static void subsys_choices(char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0] && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? "," : "", subsys_names[i].name);
}

/* Reads STRATA_LOG and STRATA_LOG_SUBSYS once. A bad value warns (once) and keeps the default. */
static void init_from_env(void)
{
    const char *lv = getenv("STRATA_LOG");
    if (lv && *lv) {
        strata_log_level level;
        if (log_parse_level(lv, &level))
            atomic_store(&log_level_now, level);
        else
            fprintf(stderr, "strata [warn config] STRATA_LOG=\"%s\" is not a level; allowed: off, error, warn, "
                            "info, debug, trace; using warn\n", lv);
    }
    const char *ss = getenv("STRATA_LOG_SUBSYS");
    if (ss && *ss) {
        unsigned mask;
        char bad[64], choices[128];
        if (parse_subsys_list(ss, &mask, bad, sizeof bad)) {
            atomic_store(&log_subsys_mask, mask);
        } else {
            subsys_choices(choices, sizeof choices);
            fprintf(stderr, "strata [warn config] STRATA_LOG_SUBSYS: unknown subsystem \"%s\"; allowed: all,%s; "
                            "logging every subsystem\n", bad, choices);
        }
    }
}

void log_init_once(void)
{
    pthread_once(&env_once, init_from_env);
}

void log_emit(strata_log_level level, log_subsys sub, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&sink_lock);
    strata_log_fn fn = sink_fn;
    void *user = sink_user;
    pthread_mutex_unlock(&sink_lock);

    if (fn) {
        fn(level, log_subsys_name(sub), msg, user);
        return;
    }
    /* One fprintf per line so that lines from several threads do not interleave. */
    fprintf(stderr, "strata [%s %s] %s\n", log_level_name(level), log_subsys_name(sub), msg);
}

STRATA_API void strata_log_set_callback(strata_log_fn fn, void *user)
{
    pthread_mutex_lock(&sink_lock);
    sink_fn = fn;
    sink_user = user;
    pthread_mutex_unlock(&sink_lock);
}

STRATA_API void strata_log_set_level(strata_log_level level)
{
    log_init_once();
    if (level > STRATA_LOG_TRACE)
        level = STRATA_LOG_TRACE;
    atomic_store(&log_level_now, (int)level);
}

STRATA_API strata_status strata_log_set_subsystems(const char *list)
{
    log_init_once();
    unsigned mask;
    char bad[64], choices[128];
    if (!parse_subsys_list(list, &mask, bad, sizeof bad)) {
        subsys_choices(choices, sizeof choices);
        return err_set(STRATA_EINVAL, "strata_log_set_subsystems: unknown subsystem \"%s\"; allowed: all,%s", bad,
                       choices);
    }
    atomic_store(&log_subsys_mask, mask);
    return STRATA_OK;
}
