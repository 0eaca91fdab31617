/* CRC-32C (Castagnoli), the checksum of every tensor in a checkpoint. */
#ifndef LOOM_CRC32C_H
#define LOOM_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC over data; start with crc = 0. crc32c("123456789") = 0xE3069283. */
uint32_t loom_crc32c(uint32_t crc, const void *data, size_t n);
/* The same, byte by byte from a table: the portable path and the reference. */
uint32_t loom_crc32c_table(uint32_t crc, const void *data, size_t n);

/* The CRC of a whole file's bytes (0 for a file that cannot be read, which its size check refuses first). */
uint32_t loom_crc32c_file(const char *path);

#endif
