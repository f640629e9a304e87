/* crc32c: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum of the file backend's block headers and payloads.
 *
 * crc32c(0, "123456789", 9) == 0xE3069283. Software slice-by-8 tables; on
 * x86-64 the SSE4.2 crc32 instruction when the CPU has it (same results).
 * Thread-safe (the tables are built before main). */
#ifndef KVNODE_KVS_CRC32C_H
#define KVNODE_KVS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) over len bytes of data. */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);
/* The portable implementation only (for tests comparing both paths). */
uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len);

#endif
