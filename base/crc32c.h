/*
 * CRC-32C (Castagnoli), the checksum of iSCSI, ext4 and btrfs metadata: the SSE4.2 crc32 instruction
 * where the CPU has it (checked once at run time), a table otherwise. Used for checkpoint tensors and
 * for the swap space's per-unit checksums.
 */
#ifndef STRATA_BASE_CRC32C_H
#define STRATA_BASE_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over len bytes of data and returns the new value; crc32c(0, "123456789", 9)
 * is 0xe3069283. Thread-safe. */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

/* The table implementation alone: the oracle of the tests. */
uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len);

/* True when crc32c() uses the SSE4.2 instruction. */
bool crc32c_hw(void);

#endif
