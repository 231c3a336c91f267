/* Size strings: every unit, fractions, and the strings that must be refused. */
#include "base/size.h"
#include "testlib.h"

int main(void)
{
    static const struct {
        const char *text;
        size_t bytes;
    } good[] = {
        {"0", 0}, {"4096", 4096}, {"1k", 1024}, {"1KiB", 1024}, {"1kB", 1000}, {"1 MiB", 1048576},
        {"512MiB", 512ull << 20}, {"8GiB", 8ull << 30}, {"8gib", 8ull << 30}, {"1.5GiB", 3ull << 29},
        {"2TB", 2000000000000ull}, {"1T", 1ull << 40}, {"  64M ", 64ull << 20}, {"10B", 10},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t v = 7;
        T_CHECK(size_parse(good[i].text, &v), "\"%s\" refused", good[i].text);
        T_CHECK(v == good[i].bytes, "\"%s\" -> %zu, expected %zu", good[i].text, v, good[i].bytes);
    }
    static const char *const bad[] = {"", "GiB", "-1", "8 gigs", "1.5B", "8GiB extra", "1e400", "0x10", "nan",
                                      "99999999999TiB", NULL};
    for (size_t i = 0; bad[i]; i++) {
        size_t v;
        T_CHECK(!size_parse(bad[i], &v), "\"%s\" accepted as %zu", bad[i], v);
    }
    T_CHECK(!size_parse(NULL, NULL), "NULL accepted");
    /* Random whole numbers of bytes round-trip through every binary unit. */
    for (int i = 0; i < 1000; i++) {
        size_t n = t_rand_range(0, 1u << 20);
        char buf[64];
        size_t v;
        snprintf(buf, sizeof buf, "%zuKiB", n);
        T_CHECK(size_parse(buf, &v) && v == n * 1024, "\"%s\" -> %zu", buf, v);
    }
    return t_done();
}
