/* Fuzz target: the KVS front end's /acquire body (kvs_acquire_req_parse,
 * daemon/net/kvs_acquire_wire.h).
 *
 * The bytes are the HTTP body (an exact-size copy, not NUL-terminated),
 * parsed twice: as the front end does (the fixed-shape scanner, jansson for
 * anything else) and by jansson alone. Must hold for any input: the same
 * status both ways (0, 400, 413 or 500) with the same message; on 0 the
 * same scope, term, keys (bytes and lengths, each within the body's copy
 * or the tree) and sizes (each 1..2^32-1, one per key of a create); on an
 * error a terminated, non-empty message. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "net/kvs_acquire_wire.h"

static const struct kvs_acquire_limits lim = { .max_keys = 256, .max_term_s = 600 };
static const struct kvs_acquire_limits lim_json = { .max_keys = 256, .max_term_s = 600, .general_only = true };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = malloc(size ? size : 1);
    struct kvs_acquire_req a, b;
    char ma[512], mb[512];
    FUZZ_CHECK(body != NULL);
    memcpy(body, data, size);
    memset(ma, 0x55, sizeof ma);
    memset(mb, 0x55, sizeof mb);
    int sa = kvs_acquire_req_parse(body, size, &lim, &a, ma, sizeof ma);
    int sb = kvs_acquire_req_parse(body, size, &lim_json, &b, mb, sizeof mb);
    free(body);   /* the request owns its own copy */
    FUZZ_CHECK(sa == sb);
    FUZZ_CHECK(sa == 0 || sa == 400 || sa == 413 || sa == 500);
    if (sa != 0) {
        FUZZ_CHECK(memchr(ma, '\0', sizeof ma) && memchr(mb, '\0', sizeof mb));
        FUZZ_CHECK(ma[0] != '\0' && strcmp(ma, mb) == 0);
        return 0;
    }
    FUZZ_CHECK(!b.fast);
    FUZZ_CHECK(a.create == b.create && a.has_term == b.has_term && a.term_s == b.term_s && a.n == b.n);
    FUZZ_CHECK(a.n <= lim.max_keys && (!a.has_term || a.term_s <= lim.max_term_s));
    FUZZ_CHECK((a.sizes != NULL) == (a.create && a.n > 0) && (b.sizes != NULL) == (b.create && b.n > 0));
    for (size_t i = 0; i < a.n; i++) {
        FUZZ_CHECK(a.keys[i].len == b.keys[i].len);
        FUZZ_CHECK(memcmp(a.keys[i].s, b.keys[i].s, a.keys[i].len) == 0);
        if (a.create)
            FUZZ_CHECK(a.sizes[i] == b.sizes[i] && a.sizes[i] >= 1 && a.sizes[i] <= UINT32_MAX);
    }
    kvs_acquire_req_free(&a);
    kvs_acquire_req_free(&b);
    return 0;
}
