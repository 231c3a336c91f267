/* CRC-32C: SSE4.2 instruction or a slicing table, chosen once. */
#include "base/crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82f63b78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int s = 1; s < 8; s++)
            table[s][n] = (table[s - 1][n] >> 8) ^ table[0][table[s - 1][n] & 0xff];
}

/* Slicing-by-8: eight table lookups per 8 bytes (about 1 GB/s), the fallback and the oracle. */
uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&table_once, build_table);
    const uint8_t *p = data;
    crc = ~crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^ table[5][(v >> 16) & 0xff] ^
              table[4][(v >> 24) & 0xff] ^ table[3][(v >> 32) & 0xff] ^ table[2][(v >> 40) & 0xff] ^
              table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

/* The crc32 instruction, 8 bytes per step. One dependent chain runs at about 8 bytes per 3 cycles,
 * several times the drive's bandwidth, so the three-way interleave is not worth its complexity here. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data, size_t len)
{
    const uint8_t *p = data;
    uint64_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

bool crc32c_hw(void)
{
    return __builtin_cpu_supports("sse4.2");
}

uint32_t crc32c(uint32_t crc, const void *data, size_t len)
{
    return crc32c_hw() ? crc32c_sse42(crc, data, len) : crc32c_sw(crc, data, len);
}
#else
bool crc32c_hw(void)
{
    return false;
}

uint32_t crc32c(uint32_t crc, const void *data, size_t len)
{
    return crc32c_sw(crc, data, len);
}
#endif
