/* errmsg: see errmsg.h. */
#include "core/errmsg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void errmsg_set(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void errmsg_snippet(const char *p, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    if (!out || cap == 0)
        return;
    for (size_t i = 0; i < n && k + 4 < cap; i++)
        out[k++] = (p[i] >= 0x20 && p[i] < 0x7f) ? p[i] : '.';
    if (n > k && k + 3 < cap) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
}
