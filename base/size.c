#include "base/size.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *unit;
    double factor;
} units[] = {
    {"", 1.0},          {"b", 1.0},
    {"k", 1024.0},      {"kib", 1024.0},      {"kb", 1e3},
    {"m", 1048576.0},   {"mib", 1048576.0},   {"mb", 1e6},
    {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
    {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
};

bool size_parse(const char *text, size_t *out)
{
    if (!text)
        return false;
    while (isspace((unsigned char)*text))
        text++;
    /* Plain decimal only: strtod alone would also take hex, exponents, "inf" and "nan". */
    size_t digits = strspn(text, "0123456789.");
    if (digits == 0 || memchr(text, '.', digits) != memrchr(text, '.', digits))
        return false;
    char *end;
    double value = strtod(text, &end);
    if (end != text + digits || !isfinite(value))
        return false;
    while (isspace((unsigned char)*end))
        end++;
    char unit[8];
    size_t n = 0;
    while (*end && !isspace((unsigned char)*end) && n + 1 < sizeof unit)
        unit[n++] = *end++;
    unit[n] = '\0';
    while (isspace((unsigned char)*end))
        end++;
    if (*end)
        return false;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(unit, units[i].unit) == 0) {
            double bytes = value * units[i].factor;
            if (bytes >= 18446744073709549568.0 || bytes != floor(bytes))
                return false;
            *out = (size_t)bytes;
            return true;
        }
    }
    return false;
}

const char *size_format(size_t bytes, char *buf, size_t len)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%zu B", bytes);
    else
        snprintf(buf, len, "%.2f %s", v, names[u]);
    return buf;
}
