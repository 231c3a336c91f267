#include "testlib.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int t_failures;
int t_checks;

/* How the test ended: t_done() and t_skip() say so; anything else reaches no_check_at_exit() undecided. */
static bool ended;
static pid_t test_pid;

static void report_no_check(void)
{
    fprintf(stderr, "FAIL %s: ran no check (a test that checks nothing proves nothing)\n",
            program_invocation_short_name);
}

/* The exit status is out of reach here, so a process that ran no check and did not end through t_done() or
 * t_skip() is failed with _exit(1) (exit() again would be undefined). One that failed another way exits 1
 * all the same. */
static void no_check_at_exit(void)
{
    if (ended || t_checks > 0 || t_failures > 0 || getpid() != test_pid)
        return;
    report_no_check();
    fflush(NULL);
    _exit(1);
}

__attribute__((constructor)) static void watch_exit(void)
{
    test_pid = getpid();
    atexit(no_check_at_exit);
}

void t_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    t_failures++;
}

void t_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    t_scratch_cleanup();
    ended = true;
    exit(77);
}

int t_done(void)
{
    t_scratch_cleanup();
    ended = true;
    printf("%d checks, %d failed (seed %" PRIu64 ")\n", t_checks, t_failures, t_rng_seed());
    if (t_checks == 0 && t_failures == 0) {
        fflush(stdout);
        report_no_check();
        return 1;
    }
    return t_failures ? 1 : 0;
}

static uint64_t rng_state[4];
static uint64_t seed_value;
static bool seeded;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t t_rng_seed(void)
{
    if (!seeded) {
        const char *env = getenv("STRATA_TEST_SEED");
        if (env && *env) {
            seed_value = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed_value = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
        }
        uint64_t x = seed_value;
        for (int i = 0; i < 4; i++)
            rng_state[i] = splitmix(&x);
        seeded = true;
        printf("seed %" PRIu64 " (set STRATA_TEST_SEED to reproduce)\n", seed_value);
    }
    return seed_value;
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t t_rand_u64(void)
{
    t_rng_seed();
    /* xoshiro256** */
    uint64_t *s = rng_state;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double t_rand_unit(void)
{
    return (double)(t_rand_u64() >> 11) * 0x1.0p-53;
}

float t_rand_normal(void)
{
    double u1 = t_rand_unit(), u2 = t_rand_unit();
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void t_rand_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len >= 8) {
        uint64_t v = t_rand_u64();
        memcpy(p, &v, 8);
        p += 8;
        len -= 8;
    }
    if (len) {
        uint64_t v = t_rand_u64();
        memcpy(p, &v, len);
    }
}

size_t t_rand_range(size_t lo, size_t hi)
{
    return lo + (size_t)(t_rand_u64() % (uint64_t)(hi - lo + 1));
}

int t_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    if (d)
        closedir(d);
    return n;
}

int t_each_open_fd(bool (*fn)(int fd, const char *target, void *ctx), void *ctx)
{
    DIR *d = opendir("/proc/self/fd");
    int found = -1;
    for (struct dirent *e; d && found < 0 && (e = readdir(d));) {
        char link[300], target[4200];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (fn(atoi(e->d_name), target, ctx))
            found = atoi(e->d_name);
    }
    if (d)
        closedir(d);
    return found;
}

static char scratch_path[4096];

const char *t_scratch_dir(const char *name)
{
    const char *base = getenv("STRATA_SCRATCH");
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0700);
    snprintf(scratch_path, sizeof scratch_path, "%s/%s.XXXXXX", base, name);
    if (!mkdtemp(scratch_path)) {
        fprintf(stderr, "FAIL: mkdtemp(%s): %s\n", scratch_path, strerror(errno));
        ended = true; /* failed, and said why */
        exit(1);
    }
    return scratch_path;
}

void t_scratch_cleanup(void)
{
    if (!scratch_path[0])
        return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch_path);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", scratch_path);
    scratch_path[0] = '\0';
}
