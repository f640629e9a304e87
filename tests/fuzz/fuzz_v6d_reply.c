/* Fuzz target: the v6d backend's acquire-reply parser
 * (v6d_parse_acquire_reply, daemon/persist/kvs/v6d.h).
 *
 * The bytes are the HTTP body (an exact-size copy, not NUL-terminated), parsed
 * for a fixed list of requested keys with a roomy and with a tight lease_id
 * buffer. Must hold for any input: 0 or -KVNODE_EPROTO (-KVNODE_ENOMEM only
 * for lack of memory); lease_id always terminated within its buffer; on
 * error a message and every object absent and zeroed; the same answer on a
 * second parse; a tight buffer never changes the objects of a success. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kvnode.h"
#include "persist/kvs/v6d.h"

static const char *const keys[] = {
    "a", "b", "c",
    "kvnode/v1/demo-0123456789abcdef/tp-0/group-0/block--42",
    "kvnode/v1/demo-0123456789abcdef/tp-0/group-0/block-7",
};
#define NKEYS (sizeof keys / sizeof keys[0])

static int parse(const char *body, size_t len, char *lease, size_t cap, struct v6d_obj *objs,
                 char *err, size_t errlen)
{
    memset(lease, 0x55, cap);
    memset(objs, 0x55, NKEYS * sizeof *objs);
    memset(err, 0x55, errlen);
    err[0] = '\0';
    int rc = v6d_parse_acquire_reply(body, len, keys, NKEYS, lease, cap, objs, err, errlen);
    FUZZ_CHECK(rc == 0 || rc == -KVNODE_EPROTO || rc == -KVNODE_ENOMEM);
    FUZZ_CHECK(memchr(lease, '\0', cap) != NULL);
    if (rc < 0) {
        FUZZ_CHECK(err[0] != '\0' && memchr(err, '\0', errlen) != NULL);
        for (size_t i = 0; i < NKEYS; i++)
            FUZZ_CHECK(!objs[i].present && objs[i].offset == 0 && objs[i].size == 0);
    } else {
        for (size_t i = 0; i < NKEYS; i++)
            FUZZ_CHECK(objs[i].present == 0 || objs[i].present == 1);
    }
    return rc;
}

static int same_objs(const struct v6d_obj *a, const struct v6d_obj *b)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (a[i].present != b[i].present || a[i].offset != b[i].offset || a[i].size != b[i].size)
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = malloc(size ? size : 1);
    FUZZ_CHECK(body != NULL);
    memcpy(body, data, size);

    char lease[128], lease2[128], tight[4], err[256];
    struct v6d_obj objs[NKEYS], objs2[NKEYS];
    int rc = parse(body, size, lease, sizeof lease, objs, err, sizeof err);
    int rc2 = parse(body, size, lease2, sizeof lease2, objs2, err, sizeof err);
    FUZZ_CHECK(rc == rc2 && strcmp(lease, lease2) == 0);
    FUZZ_CHECK(same_objs(objs, objs2));

    int rc3 = parse(body, size, tight, sizeof tight, objs2, err, sizeof err);
    if (rc == 0 && strlen(lease) < sizeof tight) {
        FUZZ_CHECK(rc3 == 0 && strcmp(tight, lease) == 0);
        FUZZ_CHECK(same_objs(objs, objs2));
    }
    if (rc3 == 0)
        FUZZ_CHECK(rc == 0 && strcmp(tight, lease) == 0);
    free(body);
    return 0;
}
