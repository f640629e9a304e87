/* errmsg: writing an error message into a caller's (err, errlen) buffer, the
 * convention every daemon module uses to explain a failure. Thread-safe. */
#ifndef KVNODE_ERRMSG_H
#define KVNODE_ERRMSG_H

#include <stddef.h>

/* Format into err (no-op when err is NULL or errlen is 0). */
void errmsg_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A printable, single-line excerpt of the first bytes of p (a reply body
 * quoted in a message): other bytes become '.', "..." marks a cut. */
void errmsg_snippet(const char *p, size_t n, char *out, size_t cap);

#endif
