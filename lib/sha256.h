/* sha256: FIPS 180-4 SHA-256 of short messages, for folding foreign keys
 * (kvnode_fold_text) without a crypto library. Uses the x86 SHA extensions
 * when the CPU has them (checked once), portable C otherwise. */
#ifndef KVNODE_SHA256_H
#define KVNODE_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* digest = SHA-256 of len bytes at msg (msg may be NULL when len is 0). */
void sha256_digest(const void *msg, size_t len, unsigned char digest[32]);

/* Which compression sha256 uses: 1 the SHA extensions, 0 portable C. Tests
 * call sha256_use_shani(0) to check the portable one on any CPU (and (1) to
 * go back, which only takes effect where the CPU has the extensions). */
int  sha256_shani(void);
void sha256_use_shani(int on);

#endif
