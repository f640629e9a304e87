/* kvs/v6d reply: parsing the store's JSON — acquire replies matched to the
 * requested keys, with every number and handle checked (v6d.h says what is
 * a protocol error); the integer helper the data plane uses too. Pure
 * functions, any thread; fuzzed by tests/fuzz/fuzz_v6d_reply.c. */
#include "persist/kvs/v6d_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errmsg.h"
#include "kvnode.h"

/* ---- reply parsing ------------------------------------------------------------ */

/* A non-negative integral JSON number that fits uint64 exactly. */
bool v6d_get_u64(json_t *v, uint64_t *out)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < 0)
            return false;
        *out = (uint64_t)i;
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        /* reals are exact only up to 2^53 */
        if (!isfinite(d) || d < 0 || d != floor(d) || d > 9007199254740992.0)
            return false;
        *out = (uint64_t)d;
        return true;
    }
    return false;
}

/* object_id: absent, or a number; returns false when malformed; *invalid when
 * it is UINT64_MAX (as an integer jansson cannot hold it: it arrives as a real
 * >= 2^64 when the document had to be reparsed, see v6d_parse_doc). */
static bool get_object_id(json_t *v, bool *invalid)
{
    *invalid = false;
    if (!v)
        return true;
    if (json_is_real(v) && json_real_value(v) >= 18446744073709551615.0) {
        *invalid = true;
        return json_real_value(v) <= 18446744073709551616.0;
    }
    uint64_t id;
    if (!v6d_get_u64(v, &id))
        return false;
    *invalid = id == UINT64_MAX;
    return true;
}

json_t *v6d_parse_doc(const char *body, size_t len, char *err, size_t errlen)
{
    json_error_t je;
    json_t *doc = json_loadb(body, len, 0, &je);
    if (!doc && json_error_code(&je) == json_error_numeric_overflow)
        doc = json_loadb(body, len, JSON_DECODE_INT_AS_REAL, &je);   /* e.g. object_id 2^64-1 */
    if (!doc) {
        char s[SNIPPET];
        errmsg_snippet(body, len, s, sizeof s);
        errmsg_set(err, errlen, "malformed JSON (%s): %s", je.text, s);
    }
    return doc;
}

/* Parse one non-null object; *slot gets its key index. */
static int parse_object(json_t *o, size_t idx, const char *const *keys, size_t n, size_t *slot,
                        struct v6d_obj *out, char *err, size_t errlen)
{
    json_t *k = json_object_get(o, "key");
    if (!json_is_object(o) || !json_is_string(k)) {
        errmsg_set(err, errlen, "objects[%zu]: not an object with a string key", idx);
        return -KVNODE_EPROTO;
    }
    size_t i;
    for (i = 0; i < n; i++)
        if (strcmp(keys[i], json_string_value(k)) == 0)
            break;
    if (i == n) {
        errmsg_set(err, errlen, "objects[%zu]: key \"%.200s\" was not requested", idx,
                   json_string_value(k));
        return -KVNODE_EPROTO;
    }
    *slot = i;
    json_t *blobs = json_object_get(o, "blobs");
    json_t *b0 = json_array_get(blobs, 0);
    json_t *type = json_object_get(b0, "type");
    json_t *h = json_object_get(b0, "handle");
    if (!json_is_object(b0) || !json_is_string(type) || !json_is_object(h)) {
        errmsg_set(err, errlen, "objects[%zu]: blobs[0] with type and handle required", idx);
        return -KVNODE_EPROTO;
    }
    if (strcmp(json_string_value(type), "vineyard") != 0) {
        errmsg_set(err, errlen, "objects[%zu]: blobs[0].type \"%.64s\" is not \"vineyard\"", idx,
                   json_string_value(type));
        return -KVNODE_EPROTO;
    }
    uint64_t off, size, msize = 0;
    bool invalid;
    if (!v6d_get_u64(json_object_get(h, "data_offset"), &off) ||
        !v6d_get_u64(json_object_get(h, "data_size"), &size)) {
        errmsg_set(err, errlen, "objects[%zu]: data_offset/data_size must be non-negative "
                   "integers", idx);
        return -KVNODE_EPROTO;
    }
    if (!get_object_id(json_object_get(h, "object_id"), &invalid)) {
        errmsg_set(err, errlen, "objects[%zu]: object_id must be a non-negative integer", idx);
        return -KVNODE_EPROTO;
    }
    json_t *meta = json_object_get(o, "meta");
    if (meta && !json_is_null(meta)) {
        json_t *ms = json_object_get(meta, "size");
        if (!json_is_object(meta) || (ms && !v6d_get_u64(ms, &msize))) {
            errmsg_set(err, errlen, "objects[%zu]: meta.size must be a non-negative integer", idx);
            return -KVNODE_EPROTO;
        }
    }
    out->present = !invalid;
    out->offset = off;
    out->size = msize > 0 ? msize : size;
    return 0;
}

/* create: a create reply, where a null entry or an invalid handle fails the
 * whole store (rtp-llm's client discards; existing objects must be omitted). */
int v6d_parse_acquire(const char *body, size_t len, const char *const *keys, size_t n,
                      char *lease_id, size_t lease_cap, struct v6d_obj *objs, bool create,
                      char *err, size_t errlen)
{
    if (lease_cap)
        lease_id[0] = '\0';
    for (size_t i = 0; i < n; i++)
        objs[i] = (struct v6d_obj){ 0 };
    json_t *doc = v6d_parse_doc(body, len, err, errlen);
    if (!doc)
        return -KVNODE_EPROTO;
    int rc = 0;
    bool *seen = NULL;
    json_t *lid = json_object_get(json_object_get(doc, "lease"), "lease_id");
    if (!json_is_object(doc) || !json_is_string(lid)) {
        errmsg_set(err, errlen, "acquire reply without lease.lease_id");
        rc = -KVNODE_EPROTO;
        goto out;
    }
    if (strlen(json_string_value(lid)) >= lease_cap) {
        errmsg_set(err, errlen, "lease_id of %zu bytes is too long",
                   strlen(json_string_value(lid)));
        rc = -KVNODE_EPROTO;
        goto out;
    }
    snprintf(lease_id, lease_cap, "%s", json_string_value(lid));
    json_t *objects = json_object_get(doc, "objects");
    if (!objects || json_is_null(objects))
        goto out;                                    /* best effort: all absent */
    if (!json_is_array(objects)) {
        errmsg_set(err, errlen, "acquire reply: objects is not an array");
        rc = -KVNODE_EPROTO;
        goto out;
    }
    seen = calloc(n ? n : 1, sizeof *seen);
    if (!seen) {
        errmsg_set(err, errlen, "out of memory");
        rc = -KVNODE_ENOMEM;
        goto out;
    }
    size_t idx;
    json_t *o;
    json_array_foreach(objects, idx, o) {
        if (json_is_null(o) && !create)
            continue;
        if (json_is_null(o)) {
            errmsg_set(err, errlen, "create reply: objects[%zu] is null (an existing object "
                       "must be omitted)", idx);
            rc = -KVNODE_EPROTO;
            goto out;
        }
        size_t slot = 0;
        struct v6d_obj tmp;
        rc = parse_object(o, idx, keys, n, &slot, &tmp, err, errlen);
        if (rc < 0)
            goto out;
        if (create && !tmp.present) {
            errmsg_set(err, errlen, "create reply: objects[%zu] has an invalid object_id", idx);
            rc = -KVNODE_EPROTO;
            goto out;
        }
        if (seen[slot]) {
            errmsg_set(err, errlen, "objects[%zu]: key \"%.200s\" appears twice", idx, keys[slot]);
            rc = -KVNODE_EPROTO;
            goto out;
        }
        seen[slot] = true;
        objs[slot] = tmp;
    }
out:
    if (rc < 0)
        for (size_t i = 0; i < n; i++)
            objs[i] = (struct v6d_obj){ 0 };
    free(seen);
    json_decref(doc);
    return rc;
}

int v6d_parse_acquire_reply(const char *body, size_t len, const char *const *keys, size_t n,
                            char *lease_id, size_t lease_cap, struct v6d_obj *objs,
                            char *err, size_t errlen)
{
    return v6d_parse_acquire(body, len, keys, n, lease_id, lease_cap, objs, false, err, errlen);
}
