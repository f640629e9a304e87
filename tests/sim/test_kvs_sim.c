/* Tests of the KVS protocol simulator (tests/sim/kvs_sim.c).
 *
 * Each test starts $KVS_SIM (default build/kvs-sim) as a child process on a
 * fresh temporary directory and an ephemeral loopback port, reads its
 * "http=" / "socket=" lines, talks to the control plane with libcurl and to
 * the data plane over a raw unix socket, then stops it with SIGTERM and
 * requires exit status 0. With VALGRIND=1 in the environment the simulator
 * itself runs under valgrind (any error or definite leak -> exit 99 -> fail). */
#include <check.h>

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "simctl.h"

#define LAYOUT "rtp_llm_group_block_v1"

/* ---- simulator process ------------------------------------------------------ */

/* Start the simulator (under valgrind when VALGRIND=1) with extra arguments
 * (NULL-terminated list). */
static void sim_start(struct simctl *s, const char *const *extra)
{
    simctl_start(s, &(struct simctl_opts){ .valgrind = simctl_under_valgrind(), .extra = extra });
}

/* ---- HTTP ------------------------------------------------------------------ */

/* One HTTP call; returns the status (-1 on transport failure), body in *out (malloc'd). */
static long http(const struct simctl *s, const char *method, const char *path, const char *body,
                 char **out)
{
    return kvh_http_try(s->http, method, path, body, out, NULL, 0, 30000L, NULL);
}

/* POST a jansson document (stolen); returns status, parsed reply in *reply (may be NULL). */
static long post_json(const struct simctl *s, const char *path, json_t *doc, json_t **reply)
{
    char *txt = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    char *out = NULL;
    long st = http(s, "POST", path, txt, &out);
    free(txt);
    if (reply)
        *reply = json_loads(out, 0, NULL);
    free(out);
    return st;
}

static json_t *metas_of(const uint64_t *sizes, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:I, s:s}", "size", (json_int_t)sizes[i],
                                           "layout", LAYOUT));
    return a;
}

static json_t *keys_of(const char *const *keys, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(keys[i]));
    return a;
}

static long acquire_create(const struct simctl *s, const char *const *keys, const uint64_t *sizes,
                           size_t n, double term, const char *rid, bool ignore, json_t **reply)
{
    return post_json(s, "/acquire",
                     json_pack("{s:s, s:o, s:o, s:f, s:s, s:b}", "scope", "create",
                               "object_keys", keys_of(keys, n), "object_metas",
                               metas_of(sizes, n), "term", term, "request_id", rid,
                               "ignore_existing", ignore),
                     reply);
}

static long acquire_read(const struct simctl *s, const char *const *keys, size_t n, double term,
                         bool best_effort, json_t **reply)
{
    return post_json(s, "/acquire",
                     json_pack("{s:s, s:o, s:f, s:s, s:s, s:i, s:b}", "scope", "read",
                               "object_keys", keys_of(keys, n), "term", term, "request_id",
                               "rd", "peer", "local", "wait_timeout", 0,
                               "best_effort", best_effort),
                     reply);
}

static long lease_call(const struct simctl *s, const char *route, const char *lease_id,
                       const char *rid)
{
    json_t *doc = json_pack("{s:s}", "lease_id", lease_id);
    if (rid)
        json_object_set_new(doc, "request_id", json_string(rid));
    return post_json(s, route, doc, NULL);
}

static const char *lease_id(json_t *reply)
{
    const char *id = json_string_value(json_object_get(json_object_get(reply, "lease"),
                                                       "lease_id"));
    ck_assert_msg(id != NULL, "reply without lease.lease_id");
    return id;
}

/* The object for `key` in a reply (matched by key, never by position), or NULL. */
static json_t *find_obj(json_t *reply, const char *key)
{
    json_t *objs = json_object_get(reply, "objects");
    ck_assert(json_is_array(objs));
    size_t i;
    json_t *o;
    json_array_foreach(objs, i, o) {
        if (json_is_object(o) && strcmp(json_string_value(json_object_get(o, "key")), key) == 0)
            return o;
    }
    return NULL;
}

static size_t count_non_null(json_t *reply)
{
    size_t i, n = 0;
    json_t *o;
    json_array_foreach(json_object_get(reply, "objects"), i, o)
        n += !json_is_null(o);
    return n;
}

static uint64_t handle_u64(json_t *o, const char *field)
{
    json_t *b0 = json_array_get(json_object_get(o, "blobs"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(b0, "type")), "vineyard");
    json_t *v = json_object_get(json_object_get(b0, "handle"), field);
    ck_assert(json_is_integer(v) && json_integer_value(v) >= 0);
    return (uint64_t)json_integer_value(v);
}

static json_int_t state_field(const struct simctl *s, const char *field)
{
    char *out = NULL;
    ck_assert_int_eq(http(s, "GET", "/_sim/state", NULL, &out), 200);
    json_t *st = json_loads(out, 0, NULL);
    free(out);
    ck_assert(st);
    json_int_t v = json_integer_value(json_object_get(st, field));
    json_decref(st);
    return v;
}

/* ---- data plane ---------------------------------------------------------------- */

static int dp_connect(const struct simctl *s)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert(fd >= 0);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    memcpy(a.sun_path, s->sock, strlen(s->sock) + 1);
    ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s",
                  strerror(errno));
    struct timeval tv = { .tv_sec = 10 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void dp_send_raw(int fd, const void *p, size_t n)
{
    ck_assert(send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n);
}

static void dp_send(int fd, const char *json)
{
    uint64_t len = strlen(json);
    unsigned char hdr[8];
    for (int i = 0; i < 8; i++)
        hdr[i] = (unsigned char)(len >> (8 * i));
    dp_send_raw(fd, hdr, 8);
    dp_send_raw(fd, json, len);
}

static bool read_full(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

/* Receive one reply frame as JSON (NULL when the peer closed). */
static json_t *dp_recv(int fd)
{
    unsigned char hdr[8];
    if (!read_full(fd, hdr, 8))
        return NULL;
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--)
        len = (len << 8) | hdr[i];
    ck_assert(len < (16u << 20));
    char *buf = malloc(len + 1);
    ck_assert(buf && read_full(fd, buf, len));
    json_t *doc = json_loadb(buf, len, 0, NULL);
    free(buf);
    ck_assert_msg(doc, "reply frame is not JSON");
    return doc;
}

static int dp_recv_fd(int fd)
{
    char byte;
    struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                          .msg_control = u.buf, .msg_controllen = sizeof u.buf };
    ssize_t r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    ck_assert_msg(r == 1, "fd message: payload of %zd bytes", r);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    ck_assert(cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS);
    int got;
    memcpy(&got, CMSG_DATA(cm), sizeof got);
    return got;
}

static bool peer_closed(int fd)
{
    char c;
    ssize_t r = recv(fd, &c, 1, 0);
    return r == 0 || (r < 0 && errno == ECONNRESET);
}

static const char REGISTER[] = "{\"type\":\"register_request\",\"version\":\"0.0.0\","
                               "\"store_type\":0,\"session_id\":0,\"username\":\"\","
                               "\"password\":\"\"}";

/* Full handshake; returns the mapping of the arena and its size. */
static unsigned char *dp_handshake(const struct simctl *s, size_t *size_out)
{
    int fd = dp_connect(s);
    dp_send(fd, REGISTER);
    json_t *r = dp_recv(fd);
    ck_assert(r);
    char *txt = json_dumps(r, 0);
    ck_assert_msg(strstr(txt, "register_reply") != NULL, "register reply: %s", txt);
    free(txt);
    json_decref(r);
    dp_send(fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}");
    r = dp_recv(fd);
    ck_assert(r);
    json_t *sz = json_object_get(r, "size");
    ck_assert(json_is_integer(sz) && json_integer_value(sz) > 0);
    ck_assert(json_is_integer(json_object_get(r, "offset")));
    size_t size = (size_t)json_integer_value(sz);
    json_decref(r);
    int afd = dp_recv_fd(fd);
    ck_assert(afd >= 0);
    struct stat st;
    ck_assert(fstat(afd, &st) == 0);
    ck_assert_uint_eq((uint64_t)st.st_size, size);
    unsigned char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
    ck_assert(m != MAP_FAILED);
    close(afd);
    close(fd);
    *size_out = size;
    return m;
}

/* ---- tests: data plane ------------------------------------------------------------ */

START_TEST(handshake_yields_arena_fd)
{
    struct simctl s;
    sim_start(&s, (const char *const[]){ "--arena-bytes", "1048576", NULL });
    size_t size;
    unsigned char *m = dp_handshake(&s, &size);
    ck_assert_uint_eq(size, 1048576);
    m[size - 1] = 0xab;   /* the whole mapping is usable */
    /* a second client maps the same arena */
    size_t size2;
    unsigned char *m2 = dp_handshake(&s, &size2);
    ck_assert_uint_eq(size2, size);
    ck_assert_uint_eq(m2[size - 1], 0xab);
    munmap(m, size);
    munmap(m2, size2);

    /* pipelined: register and two fd requests in one write; each fd follows its reply */
    int fd = dp_connect(&s);
    dp_send(fd, REGISTER);
    dp_send(fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}");
    dp_send(fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}");
    json_t *r = dp_recv(fd);
    ck_assert_str_eq(json_string_value(json_object_get(r, "type")), "register_reply");
    json_decref(r);
    for (int i = 0; i < 2; i++) {
        r = dp_recv(fd);
        ck_assert(r);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "size")), 1048576);
        json_decref(r);
        int afd = dp_recv_fd(fd);
        ck_assert(afd >= 0);
        close(afd);
    }
    close(fd);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(data_plane_rejects_bad_messages)
{
    struct simctl s;
    sim_start(&s, NULL);
    int fd = dp_connect(&s);
    /* fd before register -> error reply, connection stays usable */
    dp_send(fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}");
    json_t *r = dp_recv(fd);
    ck_assert(r);
    ck_assert_str_eq(json_string_value(json_object_get(r, "type")), "error_reply");
    json_decref(r);
    /* unknown type, not JSON, JSON without type -> error replies */
    const char *bad[] = { "{\"type\":\"frobnicate_request\"}", "not json", "[1,2]", "{}" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_send(fd, bad[i]);
        r = dp_recv(fd);
        ck_assert_msg(r, "no reply to %s", bad[i]);
        ck_assert_str_eq(json_string_value(json_object_get(r, "type")), "error_reply");
        json_decref(r);
    }
    /* still usable: register works afterwards */
    dp_send(fd, REGISTER);
    r = dp_recv(fd);
    ck_assert_str_eq(json_string_value(json_object_get(r, "type")), "register_reply");
    json_decref(r);
    close(fd);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(oversized_frame_closes_connection)
{
    struct simctl s;
    sim_start(&s, NULL);
    int fd = dp_connect(&s);
    uint64_t len = (16u << 20) + 1;
    unsigned char hdr[8];
    for (int i = 0; i < 8; i++)
        hdr[i] = (unsigned char)(len >> (8 * i));
    dp_send_raw(fd, hdr, 8);
    ck_assert_msg(peer_closed(fd), "oversized frame did not close the connection");
    close(fd);
    /* a huge (64-bit) length too */
    fd = dp_connect(&s);
    memset(hdr, 0xff, sizeof hdr);
    dp_send_raw(fd, hdr, 8);
    ck_assert(peer_closed(fd));
    close(fd);
    ck_assert_int_eq(http(&s, "GET", "/health", NULL, NULL), 200);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(disconnect_mid_handshake)
{
    struct simctl s;
    sim_start(&s, NULL);
    /* half a header */
    int fd = dp_connect(&s);
    dp_send_raw(fd, "\x10\0\0\0", 4);
    close(fd);
    /* header and half a body */
    fd = dp_connect(&s);
    dp_send_raw(fd, "\x40\0\0\0\0\0\0\0{\"type\":", 16);
    close(fd);
    /* register, then ask for the fd and vanish before reading anything */
    fd = dp_connect(&s);
    dp_send(fd, REGISTER);
    dp_send(fd, "{\"type\":\"get_vineyard_mmap_fd_request\"}");
    close(fd);
    /* connect and leave without a byte */
    fd = dp_connect(&s);
    close(fd);
    simctl_sleep_ms(100);
    ck_assert_int_eq(http(&s, "GET", "/health", NULL, NULL), 200);
    size_t size;
    unsigned char *m = dp_handshake(&s, &size);
    munmap(m, size);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- tests: control plane ------------------------------------------------------------ */

START_TEST(create_write_seal_read_roundtrip)
{
    struct simctl s;
    sim_start(&s, (const char *const[]){ "--arena-bytes", "1048576", NULL });
    size_t msize;
    unsigned char *m = dp_handshake(&s, &msize);

    const char *keys[] = { "ns/v1/dep-1/tp-0/group-0/block-1", "ns/v1/dep-1/tp-0/group-0/block-2",
                           "ns/v1/dep-1/tp-0/group-0/block--3" };
    const uint64_t sizes[] = { 4096, 1000, 8192 };
    json_t *cr;
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 3, 30, "w1", true, &cr), 200);
    const char *cl = lease_id(cr);
    ck_assert_str_ne(cl, "");
    /* replies are not in request order: clients must match by key */
    json_t *first = json_array_get(json_object_get(cr, "objects"), 0);
    ck_assert_str_ne(json_string_value(json_object_get(first, "key")), keys[0]);
    uint64_t off[3];
    for (int i = 0; i < 3; i++) {
        json_t *o = find_obj(cr, keys[i]);
        ck_assert_msg(o, "no object for %s", keys[i]);
        off[i] = handle_u64(o, "data_offset");
        ck_assert_uint_eq(handle_u64(o, "data_size"), sizes[i]);
        ck_assert_uint_eq((uint64_t)json_integer_value(
                              json_object_get(json_object_get(o, "meta"), "size")), sizes[i]);
        ck_assert_uint_ne(handle_u64(o, "object_id"), UINT64_MAX);
        ck_assert(off[i] + sizes[i] <= msize);
        memset(m + off[i], 0x11 * (i + 1), sizes[i]);
    }
    /* objects do not overlap */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            if (i != j)
                ck_assert(off[i] + sizes[i] <= off[j] || off[j] + sizes[j] <= off[i]);

    /* create-then-seal visibility: unsealed objects read as null */
    json_t *rr;
    ck_assert_int_eq(acquire_read(&s, keys, 3, 30, true, &rr), 200);
    ck_assert_uint_eq(count_non_null(rr), 0);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(rr), NULL), 204);
    json_decref(rr);
    /* best_effort=false with misses -> 404 */
    ck_assert_int_eq(acquire_read(&s, keys, 3, 30, false, NULL), 404);

    ck_assert_int_eq(lease_call(&s, "/seal", cl, "w1"), 204);
    ck_assert_int_eq(lease_call(&s, "/release", cl, NULL), 204);
    json_decref(cr);

    /* read: same offsets and sizes, same bytes; unknown key -> null */
    const char *rkeys[] = { keys[2], "ns/v1/dep-1/tp-0/group-0/block-99", keys[0], keys[1] };
    ck_assert_int_eq(acquire_read(&s, rkeys, 4, 30, true, &rr), 200);
    ck_assert_uint_eq(count_non_null(rr), 3);
    ck_assert_uint_eq(json_array_size(json_object_get(rr, "objects")), 4);
    ck_assert_ptr_null(find_obj(rr, rkeys[1]));
    for (int i = 0; i < 3; i++) {
        json_t *o = find_obj(rr, keys[i]);
        ck_assert(o);
        ck_assert_uint_eq(handle_u64(o, "data_offset"), off[i]);
        ck_assert_uint_eq(handle_u64(o, "data_size"), sizes[i]);
        for (uint64_t b = 0; b < sizes[i]; b++)
            ck_assert_uint_eq(m[off[i] + b], 0x11u * (unsigned)(i + 1));
    }
    ck_assert_int_eq(state_field(&s, "pinned"), 3);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(rr), NULL), 204);
    /* released twice -> unknown lease */
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(rr), NULL), 404);
    json_decref(rr);
    ck_assert_int_eq(state_field(&s, "leases"), 0);
    ck_assert_int_eq(state_field(&s, "pinned"), 0);
    ck_assert_int_eq(state_field(&s, "sealed"), 3);
    /* /_sim/objects lists each object by key, sealed, with its size */
    char *out = NULL;
    ck_assert_int_eq(http(&s, "GET", "/_sim/objects", NULL, &out), 200);
    json_t *doc = json_loads(out, 0, NULL), *objs = json_object_get(doc, "objects"), *o;
    free(out);
    ck_assert_uint_eq(json_array_size(objs), 3);
    size_t i;
    int seen = 0;
    json_array_foreach(objs, i, o)
        for (int k = 0; k < 3; k++)
            if (strcmp(json_string_value(json_object_get(o, "key")), keys[k]) == 0) {
                ck_assert(json_is_true(json_object_get(o, "sealed")));
                ck_assert_int_eq(json_integer_value(json_object_get(o, "size")), (json_int_t)sizes[k]);
                ck_assert_int_eq(json_integer_value(json_object_get(o, "pins")), 0);
                seen |= 1 << k;
            }
    ck_assert_int_eq(seen, 7);
    json_decref(doc);
    munmap(m, msize);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(ignore_existing)
{
    struct simctl s;
    sim_start(&s, NULL);
    const char *keys[] = { "k1", "k2" };
    const uint64_t sizes[] = { 128, 256 };
    json_t *r;
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 2, 30, "a", true, &r), 200);
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(r), "a"), 204);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(r), NULL), 204);
    json_decref(r);
    /* all exist -> empty lease_id, every object omitted (not null), no lease held */
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 2, 30, "b", true, &r), 200);
    ck_assert_str_eq(lease_id(r), "");
    ck_assert_uint_eq(json_array_size(json_object_get(r, "objects")), 0);
    json_decref(r);
    ck_assert_int_eq(state_field(&s, "leases"), 0);
    /* partly new -> a lease for the new one only */
    const char *mixed[] = { "k1", "k3" };
    ck_assert_int_eq(acquire_create(&s, mixed, sizes, 2, 30, "c", true, &r), 200);
    ck_assert_str_ne(lease_id(r), "");
    ck_assert_uint_eq(json_array_size(json_object_get(r, "objects")), 1);
    ck_assert_ptr_nonnull(find_obj(r, "k3"));
    ck_assert_ptr_null(find_obj(r, "k1"));
    /* an unsealed object is "existing" for another creator, too */
    const char *k3[] = { "k3" };
    json_t *r2;
    ck_assert_int_eq(acquire_create(&s, k3, sizes, 1, 30, "d", true, &r2), 200);
    ck_assert_str_eq(lease_id(r2), "");
    json_decref(r2);
    ck_assert_int_eq(lease_call(&s, "/discard", lease_id(r), NULL), 204);
    json_decref(r);
    /* ignore_existing=false and something exists -> 409 */
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 2, 30, "e", false, NULL), 409);
    /* every control call is counted by route, whatever its outcome */
    ck_assert_int_eq(state_field(&s, "acquire_create_calls"), 5);
    ck_assert_int_eq(state_field(&s, "acquire_read_calls"), 0);
    ck_assert_int_eq(state_field(&s, "seal_calls"), 1);
    ck_assert_int_eq(state_field(&s, "release_calls"), 1);
    ck_assert_int_eq(state_field(&s, "discard_calls"), 1);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(discard_frees)
{
    struct simctl s;
    sim_start(&s, NULL);
    const char *keys[] = { "d1" };
    const uint64_t sizes[] = { 4096 };
    json_t *r;
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 1, 30, "a", true, &r), 200);
    uint64_t off = handle_u64(find_obj(r, "d1"), "data_offset");
    char id[64];
    snprintf(id, sizeof id, "%s", lease_id(r));
    json_decref(r);
    ck_assert_int_eq(state_field(&s, "used_bytes"), 4096);
    ck_assert_int_eq(lease_call(&s, "/discard", id, NULL), 204);
    ck_assert_int_eq(state_field(&s, "used_bytes"), 0);
    ck_assert_int_eq(state_field(&s, "objects"), 0);
    /* the lease is gone: seal, discard and release all 404 */
    ck_assert_int_eq(lease_call(&s, "/seal", id, "a"), 404);
    ck_assert_int_eq(lease_call(&s, "/discard", id, NULL), 404);
    ck_assert_int_eq(lease_call(&s, "/release", id, NULL), 404);
    /* reads miss; the key can be created again, in the freed space */
    ck_assert_int_eq(acquire_read(&s, keys, 1, 30, true, &r), 200);
    ck_assert_uint_eq(count_non_null(r), 0);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(r), NULL), 204);
    json_decref(r);
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 1, 30, "b", true, &r), 200);
    ck_assert_uint_eq(handle_u64(find_obj(r, "d1"), "data_offset"), off);
    /* release of an unsealed create lease discards it too */
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(r), NULL), 204);
    json_decref(r);
    ck_assert_int_eq(state_field(&s, "objects"), 0);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(lease_state_rules)
{
    struct simctl s;
    sim_start(&s, NULL);
    const char *keys[] = { "x" };
    const uint64_t sizes[] = { 64 };
    json_t *c, *r;
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 1, 30, "owner", true, &c), 200);
    /* someone else's lease (another request_id) cannot be sealed */
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(c), "intruder"), 403);
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(c), "owner"), 204);
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(c), "owner"), 409);    /* already sealed */
    ck_assert_int_eq(lease_call(&s, "/discard", lease_id(c), NULL), 409);    /* sealed */
    ck_assert_int_eq(acquire_read(&s, keys, 1, 30, true, &r), 200);
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(r), "rd"), 409);       /* read lease */
    ck_assert_int_eq(lease_call(&s, "/discard", lease_id(r), NULL), 409);    /* read lease */
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(r), NULL), 204);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(c), NULL), 204);
    ck_assert_int_eq(lease_call(&s, "/seal", "no-such-lease", "owner"), 404);
    ck_assert_int_eq(lease_call(&s, "/release", "no-such-lease", NULL), 404);
    ck_assert_int_eq(lease_call(&s, "/discard", "no-such-lease", NULL), 404);
    json_decref(c);
    json_decref(r);
    simctl_stop_ok(&s);
}
END_TEST

struct bad { const char *method, *path, *body; long status; };

START_TEST(malformed_requests_are_4xx)
{
    struct simctl s;
    sim_start(&s, NULL);
    static const struct bad cases[] = {
        { "GET",    "/acquire", NULL, 405 },
        { "PUT",    "/seal", "{}", 405 },
        { "DELETE", "/release", NULL, 405 },
        { "POST",   "/health", "{}", 405 },
        { "GET",    "/nope", NULL, 404 },
        { "POST",   "/acquire/extra", "{}", 404 },
        { "POST",   "/acquire", "", 400 },
        { "POST",   "/acquire", "not json", 400 },
        { "POST",   "/acquire", "[]", 400 },
        { "POST",   "/acquire", "{}", 400 },
        { "POST",   "/acquire", "{\"scope\":1}", 400 },
        { "POST",   "/acquire", "{\"scope\":\"write\",\"object_keys\":[\"a\"],\"term\":1,\"request_id\":\"r\"}", 400 },
#define RD "\"scope\":\"read\",\"peer\":\"local\",\"wait_timeout\":0,\"best_effort\":true,\"request_id\":\"r\""
        { "POST",   "/acquire", "{" RD ",\"term\":1}", 400 },                                   /* no keys */
        { "POST",   "/acquire", "{" RD ",\"term\":1,\"object_keys\":\"a\"}", 400 },
        { "POST",   "/acquire", "{" RD ",\"term\":1,\"object_keys\":[]}", 400 },
        { "POST",   "/acquire", "{" RD ",\"term\":1,\"object_keys\":[1]}", 400 },
        { "POST",   "/acquire", "{" RD ",\"term\":1,\"object_keys\":[\"\"]}", 400 },
        { "POST",   "/acquire", "{" RD ",\"term\":1,\"object_keys\":[\"a\",\"a\"]}", 400 },
        { "POST",   "/acquire", "{" RD ",\"object_keys\":[\"a\"]}", 400 },                   /* no term */
        { "POST",   "/acquire", "{" RD ",\"term\":0,\"object_keys\":[\"a\"]}", 400 },
        { "POST",   "/acquire", "{" RD ",\"term\":-5,\"object_keys\":[\"a\"]}", 400 },
        { "POST",   "/acquire", "{" RD ",\"term\":\"5\",\"object_keys\":[\"a\"]}", 400 },
        { "POST",   "/acquire", "{\"scope\":\"read\",\"peer\":\"local\",\"wait_timeout\":0,\"best_effort\":true,\"term\":1,\"object_keys\":[\"a\"]}", 400 },
        { "POST",   "/acquire", "{\"scope\":\"read\",\"peer\":\"local\",\"wait_timeout\":0,\"best_effort\":true,\"term\":1,\"object_keys\":[\"a\"],\"request_id\":[]}", 400 },
        { "POST",   "/acquire", "{\"scope\":\"read\",\"peer\":\"local\",\"wait_timeout\":0,\"request_id\":\"r\",\"term\":1,\"object_keys\":[\"a\"]}", 400 },
        { "POST",   "/acquire", "{\"scope\":\"read\",\"peer\":\"local\",\"wait_timeout\":0,\"best_effort\":1,\"request_id\":\"r\",\"term\":1,\"object_keys\":[\"a\"]}", 400 },
        { "POST",   "/acquire", "{\"scope\":\"read\",\"wait_timeout\":0,\"best_effort\":true,\"request_id\":\"r\",\"term\":1,\"object_keys\":[\"a\"]}", 400 },
        { "POST",   "/acquire", "{\"scope\":\"read\",\"peer\":\"local\",\"best_effort\":true,\"request_id\":\"r\",\"term\":1,\"object_keys\":[\"a\"]}", 400 },
        { "POST",   "/acquire", "{\"scope\":\"read\",\"peer\":\"local\",\"wait_timeout\":-1,\"best_effort\":true,\"request_id\":\"r\",\"term\":1,\"object_keys\":[\"a\"]}", 400 },
#define CR "\"scope\":\"create\",\"term\":1,\"request_id\":\"r\",\"object_keys\":[\"a\"]"
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true}", 400 },                          /* no metas */
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[{\"size\":1,\"layout\":\"" LAYOUT "\"},{\"size\":1,\"layout\":\"" LAYOUT "\"}]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[1]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[{\"layout\":\"" LAYOUT "\"}]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[{\"size\":0,\"layout\":\"" LAYOUT "\"}]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[{\"size\":-8,\"layout\":\"" LAYOUT "\"}]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[{\"size\":\"8\",\"layout\":\"" LAYOUT "\"}]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[{\"size\":8}]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":true,\"object_metas\":[{\"size\":8,\"layout\":\"other_v2\"}]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"object_metas\":[{\"size\":8,\"layout\":\"" LAYOUT "\"}]}", 400 },
        { "POST",   "/acquire", "{" CR ",\"ignore_existing\":\"yes\",\"object_metas\":[{\"size\":8,\"layout\":\"" LAYOUT "\"}]}", 400 },
        { "POST",   "/seal", "{}", 400 },
        { "POST",   "/seal", "{\"lease_id\":7,\"request_id\":\"r\"}", 400 },
        { "POST",   "/seal", "{\"lease_id\":\"\",\"request_id\":\"r\"}", 400 },
        { "POST",   "/seal", "{\"lease_id\":\"sim-c-1\"}", 400 },
        { "POST",   "/seal", "not json", 400 },
        { "POST",   "/release", "", 400 },
        { "POST",   "/release", "{\"lease_id\":null}", 400 },
        { "POST",   "/discard", "{\"lease_id\":\"\"}", 400 },
        { "POST",   "/discard", "{\"lease_id\":[\"x\"]}", 400 },
        { "POST",   "/discard", "{\"lease_id\":\"a\",\"lease_id\":\"b\"}", 400 },       /* duplicate member */
    };
#undef RD
#undef CR
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        long st = http(&s, cases[i].method, cases[i].path, cases[i].body, &out);
        ck_assert_msg(st == cases[i].status, "case %zu %s %s %s: status %ld, want %ld (%s)", i,
                      cases[i].method, cases[i].path, cases[i].body ? cases[i].body : "-", st,
                      cases[i].status, out);
        json_t *e = json_loads(out, 0, NULL);
        ck_assert_msg(json_is_string(json_object_get(e, "error")),
                      "case %zu: error body is not JSON with \"error\": %s", i, out);
        json_decref(e);
        free(out);
    }
    /* nothing was created, and the simulator is alive */
    ck_assert_int_eq(state_field(&s, "objects"), 0);
    ck_assert_int_eq(state_field(&s, "leases"), 0);
    ck_assert_int_eq(http(&s, "GET", "/health", NULL, NULL), 200);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(integers_of_any_json_number_type_in_term)
{
    struct simctl s;
    sim_start(&s, NULL);
    ck_assert_int_eq(http(&s, "POST", "/acquire",
                          "{\"scope\":\"read\",\"object_keys\":[\"a\"],\"term\":2.5,"
                          "\"request_id\":17,\"peer\":\"local\",\"wait_timeout\":0.0,"
                          "\"best_effort\":true}", NULL), 200);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(leases_expire)
{
    struct simctl s;
    sim_start(&s, NULL);
    const char *keys[] = { "e1" };
    const uint64_t sizes[] = { 512 };
    json_t *c;
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 1, 0.3, "a", true, &c), 200);
    ck_assert_int_eq(state_field(&s, "objects"), 1);
    simctl_sleep_ms(600);
    /* expired create lease: cannot be sealed, its object is gone */
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(c), "a"), 404);
    ck_assert_int_eq(state_field(&s, "objects"), 0);
    ck_assert_int_eq(state_field(&s, "leases"), 0);
    json_decref(c);
    /* sealed object, read lease expires -> unpinned, release 404 */
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 1, 30, "b", true, &c), 200);
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(c), "b"), 204);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(c), NULL), 204);
    json_decref(c);
    json_t *r;
    ck_assert_int_eq(acquire_read(&s, keys, 1, 0.3, true, &r), 200);
    ck_assert_int_eq(state_field(&s, "pinned"), 1);
    simctl_sleep_ms(600);
    ck_assert_int_eq(state_field(&s, "pinned"), 0);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(r), NULL), 404);
    json_decref(r);
    ck_assert_int_eq(state_field(&s, "sealed"), 1);   /* sealed objects outlive leases */
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(max_lease_clamps_term)
{
    struct simctl s;
    sim_start(&s, (const char *const[]){ "--max-lease-s", "0.3", NULL });
    const char *keys[] = { "m1" };
    const uint64_t sizes[] = { 64 };
    json_t *c;
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 1, 3600, "a", true, &c), 200);
    simctl_sleep_ms(600);
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(c), "a"), 404);
    json_decref(c);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(pinned_objects_are_not_evicted)
{
    struct simctl s;
    sim_start(&s, (const char *const[]){ "--arena-bytes", "8192", NULL });
    const char *a[] = { "A" }, *b[] = { "B" };
    const uint64_t half[] = { 4096 }, full[] = { 8192 }, too_big[] = { 8193 };
    json_t *c, *r;
    ck_assert_int_eq(acquire_create(&s, a, half, 1, 30, "a", true, &c), 200);
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(c), "a"), 204);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(c), NULL), 204);
    json_decref(c);
    ck_assert_int_eq(acquire_read(&s, a, 1, 30, true, &r), 200);
    ck_assert_uint_eq(count_non_null(r), 1);
    /* B needs the whole arena, A is pinned -> 507, nothing leaked */
    ck_assert_int_eq(acquire_create(&s, b, full, 1, 30, "b", true, NULL), 507);
    ck_assert_int_eq(state_field(&s, "leases"), 1);
    ck_assert_int_eq(state_field(&s, "used_bytes"), 4096);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(r), NULL), 204);
    json_decref(r);
    /* unpinned: A is evicted to make room */
    ck_assert_int_eq(acquire_create(&s, b, full, 1, 30, "b", true, &c), 200);
    ck_assert_int_eq(lease_call(&s, "/seal", lease_id(c), "b"), 204);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(c), NULL), 204);
    json_decref(c);
    ck_assert_int_eq(acquire_read(&s, a, 1, 30, true, &r), 200);
    ck_assert_uint_eq(count_non_null(r), 0);
    ck_assert_int_eq(lease_call(&s, "/release", lease_id(r), NULL), 204);
    json_decref(r);
    /* larger than the arena */
    ck_assert_int_eq(acquire_create(&s, a, too_big, 1, 30, "c", true, NULL), 507);
    simctl_stop_ok(&s);
}
END_TEST

/* ---- tests: fault switches ---------------------------------------------------------- */

START_TEST(fail_health)
{
    struct simctl s;
    sim_start(&s, (const char *const[]){ "--fail-health", NULL });
    char *out = NULL;
    long st = http(&s, "GET", "/health", NULL, &out);
    ck_assert_int_ne(st, 200);
    ck_assert_int_ge(st, 500);
    free(out);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(delay_ms)
{
    struct simctl s;
    sim_start(&s, (const char *const[]){ "--delay-ms", "400", NULL });
    uint64_t t0 = simctl_now_ms();
    ck_assert_int_eq(http(&s, "GET", "/health", NULL, NULL), 200);
    ck_assert_uint_ge(simctl_now_ms() - t0, 390);
    const char *keys[] = { "slow" };
    const uint64_t sizes[] = { 64 };
    t0 = simctl_now_ms();
    ck_assert_int_eq(acquire_create(&s, keys, sizes, 1, 30, "a", true, NULL), 200);
    ck_assert_uint_ge(simctl_now_ms() - t0, 390);
    /* the data plane is not delayed */
    t0 = simctl_now_ms();
    size_t size;
    unsigned char *m = dp_handshake(&s, &size);
    munmap(m, size);
    if (!simctl_under_valgrind())
        ck_assert_uint_lt(simctl_now_ms() - t0, 390);
    /* a client that gives up before the reply leaves the simulator healthy */
    CURLcode rc = CURLE_OK;
    kvh_http_try(s.http, NULL, "/health", NULL, NULL, NULL, 0, 100L, &rc);
    ck_assert_int_eq(rc, CURLE_OPERATION_TIMEDOUT);
    simctl_sleep_ms(500);
    ck_assert_int_eq(http(&s, "GET", "/health", NULL, NULL), 200);
    /* stop while a delayed request is pending (libcurl closes a timed-out
     * connection at once: the request stays pending in the simulator) */
    kvh_http_try(s.http, NULL, "/health", NULL, NULL, NULL, 0, 100L, NULL);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(garbage_replies)
{
    struct simctl s;
    sim_start(&s, (const char *const[]){ "--garbage", NULL });
    char *out = NULL;
    ck_assert_int_eq(http(&s, "GET", "/health", NULL, &out), 200);
    ck_assert_ptr_null(json_loads(out, 0, NULL));
    free(out);
    const char *body = "{\"scope\":\"read\",\"object_keys\":[\"a\"],\"term\":1,\"request_id\":\"r\","
                       "\"peer\":\"local\",\"wait_timeout\":0,\"best_effort\":true}";
    ck_assert_int_eq(http(&s, "POST", "/acquire", body, &out), 200);
    ck_assert_uint_gt(strlen(out), 0);
    ck_assert_ptr_null(json_loads(out, 0, NULL));
    free(out);
    ck_assert_int_eq(http(&s, "POST", "/acquire", "nope", &out), 400);
    ck_assert_ptr_null(json_loads(out, 0, NULL));
    free(out);
    simctl_stop_ok(&s);
}
END_TEST

START_TEST(bad_arguments_exit_nonzero)
{
    const char *bin = getenv("KVS_SIM");
    if (!bin || !*bin)
        bin = "build/kvs-sim";
    const char *const argvs[][6] = {
        { bin, NULL },                                              /* no --socket */
        { bin, "--socket", "/tmp/x.sock", "--arena-bytes", "0", NULL },
        { bin, "--socket", "/tmp/x.sock", "--http", "nocolon", NULL },
        { bin, "--socket", "/tmp/x.sock", "--bogus", NULL },
    };
    for (size_t i = 0; i < sizeof argvs / sizeof argvs[0]; i++) {
        int st = proc_run(&(struct proc_opts){ .argv = argvs[i], .out = PROC_NULL, .err = PROC_NULL },
                          (int)SIMCTL_DEADLINE_MS, NULL, NULL);
        ck_assert_msg(st >= 0, "argv set %zu: %s", i, proc_error());
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 2, "argv set %zu: status 0x%x", i, st);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("kvs_sim");
    TCase *t = tcase_create("sim");
    tcase_set_timeout(t, simctl_under_valgrind() ? 300 : 60);
    tcase_add_test(t, handshake_yields_arena_fd);
    tcase_add_test(t, data_plane_rejects_bad_messages);
    tcase_add_test(t, oversized_frame_closes_connection);
    tcase_add_test(t, disconnect_mid_handshake);
    tcase_add_test(t, create_write_seal_read_roundtrip);
    tcase_add_test(t, ignore_existing);
    tcase_add_test(t, discard_frees);
    tcase_add_test(t, lease_state_rules);
    tcase_add_test(t, malformed_requests_are_4xx);
    tcase_add_test(t, integers_of_any_json_number_type_in_term);
    tcase_add_test(t, leases_expire);
    tcase_add_test(t, max_lease_clamps_term);
    tcase_add_test(t, pinned_objects_are_not_evicted);
    tcase_add_test(t, fail_health);
    tcase_add_test(t, delay_ms);
    tcase_add_test(t, garbage_replies);
    tcase_add_test(t, bad_arguments_exit_nonzero);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    curl_global_cleanup();
    return failed ? 1 : 0;
}
