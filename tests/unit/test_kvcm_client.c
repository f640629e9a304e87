/* Unit tests of the KVCM client (daemon/kvcm/kvcm_client.c).
 *
 * Most tests start the protocol-true KVCM simulator (kvcm-sim, see tests/sim/kvcmctl.h for
 * which binary; with VALGRIND=1 it runs under valgrind too) on an ephemeral loopback port and
 * check both what the client returns and what the simulator saw (GET /state, GET /recorded):
 * registerInstance (OK, idempotent, DUPLICATE_ENTITY, the exact body), reportEvent
 * (NODE_REGISTER/ADD/DELETE with negative and extreme keys, snapshot replace, rate limit,
 * HOST_DOWN, heartbeat), getHostCacheState, leader discovery through a follower
 * (--follower-of), a leader switch at run time (SERVER_NOT_LEADER -> rediscover -> retry,
 * and only once), and transport failures (connection refused, a delay past the timeout, a
 * garbage body, HTTP 503, a body over max_response_bytes). Trace ids must be unique and
 * carry the prefix. An in-process canned HTTP server covers replies the simulator never
 * sends (numeric codes, a missing leader_endpoint, malformed fields and host entries). */
#include <check.h>

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "kvcm/kvcm_client.h"
#include "kvnode.h"

#include "../sim/kvcmctl.h"

#define INST   "inst-a"
#define GROUP  "group-a"
#define SPEC   "rtp_llm_hbm_16"
#define L1     "ST_EVENT_REPORT_L1P5"
#define HOST_A "10.0.0.1:8080"
#define HOST_B "10.0.0.2:8080"
#define PREFIX "10.0.0.1:8080-1700000000"

/* Slack on top of a timeout for the call to come back (valgrind is slow). */
#define MARGIN_MS 1500u

/* ---- helpers ------------------------------------------------------------------------------ */

static void sim_start(struct kvcmctl *k, const char *const *extra)
{
    kvcmctl_start(k, &(struct kvcmctl_opts){ .valgrind = simctl_under_valgrind(),
                                             .extra = extra });
}

static struct kvcm_client *client_new(const char *const *eps, size_t n, uint32_t timeout_ms,
                                      size_t max_resp, const char *prefix)
{
    struct kvcm_client_config cfg = {
        .endpoints = eps, .n_endpoints = n, .connect_timeout_ms = 1000,
        .request_timeout_ms = timeout_ms, .max_response_bytes = max_resp,
        .trace_prefix = prefix,
    };
    struct kvcm_client *c = NULL;
    char err[256] = "";
    int rc = kvcm_client_create(&cfg, &c, err, sizeof err);
    ck_assert_msg(rc == 0 && c, "kvcm_client_create: %d %s", rc, err);
    ck_assert_str_eq(kvcm_leader(c), "");
    return c;
}

/* A client of one simulator (10 s calls unless said otherwise). */
static struct kvcm_client *client_of(const struct kvcmctl *k)
{
    const char *eps[] = { k->base };
    return client_new(eps, 1, 10000, 0, PREFIX);
}

static const char *const SPEC_NAMES[] = { SPEC };
static const uint64_t SPEC_SIZES[] = { 4096 };

static struct kvcm_instance instance(uint32_t tp)
{
    return (struct kvcm_instance){
        .instance_group = GROUP, .instance_id = INST, .block_size = 16,
        .model_name = "qwen", .dtype = "fp16", .extra = "layers=2", .tp_size = tp,
        .spec_names = SPEC_NAMES, .spec_sizes = SPEC_SIZES, .n_specs = 1,
    };
}

static void expect_status(int got, const struct kvcm_result *r, int want)
{
    ck_assert_msg(got == want && r->status == want, "want %s, got %s (%s), http %d",
                  kvcm_status_name(want), kvcm_status_name(got), r->message, r->http_status);
}

static void register_ok(struct kvcm_client *c)
{
    struct kvcm_instance in = instance(1);
    struct kvcm_result r;
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_OK);
}

/* reportEvent for (INST, host, L1) with events (stolen). */
static int report(struct kvcm_client *c, const char *host, json_t *events,
                  struct kvcm_result *r)
{
    ck_assert_ptr_nonnull(events);
    int st = kvcm_report_events(c, INST, host, L1, events, 0, r);
    json_decref(events);
    return st;
}

static json_t *ev_list(json_t *a, json_t *b, json_t *cc)
{
    json_t *l = json_array();
    ck_assert_ptr_nonnull(l);
    json_t *e[] = { a, b, cc };
    for (size_t i = 0; i < 3; i++)
        if (e[i])
            ck_assert_int_eq(json_array_append_new(l, e[i]), 0);
    return l;
}

static json_t *ev_register(void)
{
    static const char *const mediums[] = { "hbm", "dram" };
    json_t *e = kvcm_event_node_register(mediums, 2);
    ck_assert_ptr_nonnull(e);
    return e;
}

static json_t *ev_add(int64_t key)
{
    char uri[96];
    snprintf(uri, sizeof uri, "rtp-llm://" HOST_A "/hbm?size=4096&k=%" PRId64, key);
    json_t *e = kvcm_event_block_add(key, "hbm", SPEC, uri);
    ck_assert_ptr_nonnull(e);
    return e;
}

static void node_register(struct kvcm_client *c, const char *host)
{
    struct kvcm_result r;
    expect_status(report(c, host, ev_list(ev_register(), NULL, NULL), &r), &r, KVCM_OK);
}

static void add_keys(struct kvcm_client *c, const char *host, const int64_t *keys, size_t n)
{
    json_t *l = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(l, ev_add(keys[i]));
    struct kvcm_result r;
    expect_status(report(c, host, l, &r), &r, KVCM_OK);
}

/* The reporter (INST, L1, host) in a fresh /state (decref the returned state). */
static json_t *reporter(const struct kvcmctl *k, const char *host, json_t **state)
{
    *state = kvcmctl_state(k, false);
    json_t *rep = kvcmctl_reporter(*state, INST, L1, host);
    ck_assert_msg(rep != NULL, "no reporter %s in /state", host);
    return rep;
}

/* The reporter's keys on medium, joined with ',' ("" when none). */
static const char *keys_on(json_t *rep, const char *medium, char *buf, size_t cap)
{
    buf[0] = '\0';
    size_t i, off = 0;
    json_t *v;
    json_array_foreach(json_object_get(json_object_get(rep, "blocks"), medium), i, v)
        off += (size_t)snprintf(buf + off, cap - off, "%s%s", i ? "," : "", json_string_value(v));
    return buf;
}

/* Recorded requests of one RPC (decref). */
static json_t *recorded(const struct kvcmctl *k, const char *rpc)
{
    char path[96];
    snprintf(path, sizeof path, "/recorded?rpc=%s", rpc);
    return kvcmctl_get_json(k, path);
}

static void control(const struct kvcmctl *k, const char *json)
{
    json_decref(kvcmctl_control(k, json));
}

/* A loopback port nothing listens on. */
static unsigned dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    ck_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    ck_assert(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* ---- statuses, configuration, builders (no network) -------------------------------------- */

START_TEST(status_names_and_parse)
{
    static const int all[] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 20, 100 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *name = kvcm_status_name(all[i]);
        ck_assert_str_ne(name, "UNKNOWN");
        json_t *s = json_string(name), *n = json_integer(all[i]);
        char num[8];
        snprintf(num, sizeof num, "%d", all[i]);
        json_t *ns = json_string(num);
        ck_assert_int_eq(kvcm_status_parse(s), all[i]);
        ck_assert_int_eq(kvcm_status_parse(n), all[i]);
        ck_assert_int_eq(kvcm_status_parse(ns), all[i]);
        json_decref(s);
        json_decref(n);
        json_decref(ns);
    }
    ck_assert_str_eq(kvcm_status_name(KVCM_TRANSPORT), "TRANSPORT");
    ck_assert_str_eq(kvcm_status_name(KVCM_SERVER_NOT_LEADER), "SERVER_NOT_LEADER");
    ck_assert_str_eq(kvcm_status_name(12), "UNKNOWN");
    ck_assert_str_eq(kvcm_status_name(-7), "UNKNOWN");
    const char *bad[] = { "TRANSPORT", "ok", "", "12", "-1", "1x", " 1", "OK ", "99999" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *s = json_string(bad[i]);
        ck_assert_msg(kvcm_status_parse(s) == -2, "\"%s\" parsed", bad[i]);
        json_decref(s);
    }
    json_t *odd[] = { json_integer(12), json_integer(-1), json_real(1.0), json_true(),
                      json_null(), json_object() };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        ck_assert_int_eq(kvcm_status_parse(odd[i]), -2);
        json_decref(odd[i]);
    }
    ck_assert_int_eq(kvcm_status_parse(NULL), -2);
}
END_TEST

START_TEST(create_rejects_bad_config)
{
    char err[256];
    struct kvcm_client *c = (struct kvcm_client *)&err;
    ck_assert_int_eq(kvcm_client_create(NULL, &c, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_ptr_null(c);
    struct kvcm_client_config cfg = { .n_endpoints = 0 };
    err[0] = '\0';
    ck_assert_int_eq(kvcm_client_create(&cfg, &c, err, sizeof err), -KVNODE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "no endpoints"));
    const char *bad[] = { "", "127.0.0.1:6382", "ftp://h:1", "http://", "http:///x", "http://:80",
                          "http://h:1/api", "http://h:1/api/", "http://a b:1", "http://h:1/?q",
                          NULL };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *eps[] = { "http://127.0.0.1:6382", bad[i] };
        cfg = (struct kvcm_client_config){ .endpoints = eps, .n_endpoints = 2 };
        err[0] = '\0';
        ck_assert_msg(kvcm_client_create(&cfg, &c, err, sizeof err) == -KVNODE_EINVAL,
                      "endpoint \"%s\" accepted", bad[i] ? bad[i] : "(null)");
        ck_assert_ptr_null(c);
        ck_assert_msg(strstr(err, "endpoint") != NULL, "message: %s", err);
    }
    char longp[100];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    const char *prefixes[] = { "has space", "tab\there", longp };
    const char *eps[] = { "http://127.0.0.1:6382" };
    for (size_t i = 0; i < 3; i++) {
        cfg = (struct kvcm_client_config){ .endpoints = eps, .n_endpoints = 1,
                                           .trace_prefix = prefixes[i] };
        ck_assert_int_eq(kvcm_client_create(&cfg, &c, err, sizeof err), -KVNODE_EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "trace_prefix"));
    }
    /* trailing slashes are fine; no network call at create */
    const char *ok[] = { "http://127.0.0.1:1/", "https://kvcm.example:6382/base//" };
    c = client_new(ok, 2, 100, 0, NULL);
    kvcm_client_destroy(c);
    kvcm_client_destroy(NULL);
}
END_TEST

START_TEST(event_builders)
{
    json_t *e = kvcm_event_block_add(INT64_MIN, "hbm", SPEC, "rtp-llm://h/hbm?size=1");
    json_t *want = json_pack("{s:s, s:{s:s, s:s, s:[{s:s, s:s}]}}", "event_type",
                             "EVENT_BLOCK_ADD", "block_add", "block_key",
                             "-9223372036854775808", "medium", "hbm", "specs", "name", SPEC,
                             "uri", "rtp-llm://h/hbm?size=1");
    ck_assert_msg(json_equal(e, want), "block_add shape");
    json_decref(e);
    json_decref(want);

    e = kvcm_event_block_delete(INT64_MAX, "dram", SPEC);
    want = json_pack("{s:s, s:{s:s, s:s, s:[s]}}", "event_type", "EVENT_BLOCK_DELETE",
                     "block_delete", "block_key", "9223372036854775807", "medium", "dram",
                     "spec_names", SPEC);
    ck_assert_msg(json_equal(e, want), "block_delete shape");
    json_decref(e);
    json_decref(want);

    static const char *const med[] = { "hbm" };
    e = kvcm_event_node_register(med, 1);
    want = json_pack("{s:s, s:{s:[s]}}", "event_type", "EVENT_NODE_REGISTER", "node_register",
                     "mediums", "hbm");
    ck_assert(json_equal(e, want));
    json_decref(e);
    json_decref(want);
    e = kvcm_event_node_register(NULL, 0);
    ck_assert_int_eq(json_array_size(json_object_get(json_object_get(e, "node_register"),
                                                     "mediums")), 0);
    json_decref(e);
    static const char *const holey[] = { "hbm", NULL };
    ck_assert_ptr_null(kvcm_event_node_register(holey, 2));

    e = kvcm_event_heartbeat(json_pack("{s:s}", "load", "0.5"));
    want = json_pack("{s:s, s:{s:{s:s}}}", "event_type", "EVENT_HEARTBEAT", "heartbeat",
                     "system_status", "load", "0.5");
    ck_assert(json_equal(e, want));
    json_decref(e);
    json_decref(want);
    e = kvcm_event_heartbeat(NULL);
    ck_assert(json_is_object(json_object_get(json_object_get(e, "heartbeat"), "system_status")));
    json_decref(e);
    ck_assert_ptr_null(kvcm_event_heartbeat(json_array()));      /* stolen even then */

    e = kvcm_event_host_down();
    want = json_pack("{s:s, s:{}}", "event_type", "EVENT_HOST_DOWN", "host_down");
    ck_assert(json_equal(e, want));
    json_decref(e);
    json_decref(want);

    json_t *blocks = json_array();
    json_array_append_new(blocks, kvcm_snapshot_block(-42, "hbm", SPEC, "u"));
    e = kvcm_event_snapshot(blocks);
    want = json_pack("{s:s, s:{s:[{s:s, s:s, s:[{s:s, s:s}]}]}}", "event_type",
                     "EVENT_BLOCK_SNAPSHOT", "block_snapshot", "blocks", "block_key", "-42",
                     "medium", "hbm", "specs", "name", SPEC, "uri", "u");
    ck_assert(json_equal(e, want));
    json_decref(e);
    json_decref(want);
    ck_assert_ptr_null(kvcm_event_snapshot(NULL));
    ck_assert_ptr_null(kvcm_event_snapshot(json_object()));     /* stolen even then */
    ck_assert_ptr_null(kvcm_snapshot_block(1, NULL, SPEC, "u"));
    ck_assert_ptr_null(kvcm_event_block_add(1, "hbm", NULL, "u"));
    ck_assert_ptr_null(kvcm_event_block_delete(1, "hbm", NULL));
}
END_TEST

/* ---- registerInstance ---------------------------------------------------------------------- */

START_TEST(register_ok_and_duplicate)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    struct kvcm_client *c = client_of(&k);
    struct kvcm_result r;
    struct kvcm_instance in = instance(1);
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_OK);
    ck_assert_int_eq(r.http_status, 200);
    ck_assert_str_eq(kvcm_leader(c), k.base);            /* discovered on first use */
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_OK);   /* idempotent */
    in = instance(2);
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_DUPLICATE_ENTITY);
    ck_assert_int_eq(r.http_status, 200);
    ck_assert_msg(strstr(r.message, "model_deployment") != NULL, "message: %s", r.message);

    /* the exact body (docs/PROTOCOLS.md §2) */
    json_t *rec = recorded(&k, "registerInstance");
    ck_assert_int_eq(json_array_size(rec), 3);
    json_t *first = json_array_get(rec, 0);
    ck_assert_str_eq(json_string_value(json_object_get(first, "content_type")),
                     "application/json");
    json_t *body = json_deep_copy(json_object_get(first, "body"));
    ck_assert(json_is_string(json_object_get(body, "trace_id")));
    json_object_del(body, "trace_id");
    json_t *want = json_pack(
        "{s:s, s:s, s:i, s:{s:s, s:s, s:b, s:i, s:i, s:i, s:s, s:s, s:s},"
        " s:[{s:s, s:s}], s:[{s:s, s:[s]}]}",
        "instance_group", GROUP, "instance_id", INST, "block_size", 16, "model_deployment",
        "model_name", "qwen", "dtype", "fp16", "use_mla", 0, "tp_size", 1, "dp_size", 1,
        "pp_size", 1, "lora_name", "", "extra", "layers=2", "user_data", "",
        "location_spec_infos", "name", SPEC, "size", "4096",
        "location_spec_groups", "name", "default", "spec_names", SPEC);
    char *got = json_dumps(body, JSON_SORT_KEYS | JSON_COMPACT);
    ck_assert_msg(json_equal(body, want), "registerInstance body: %s", got);
    free(got);
    json_decref(body);
    json_decref(want);
    json_decref(rec);

    /* arguments the client refuses itself: no request goes out */
    in = instance(1);
    in.instance_id = "";
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_INVALID_ARGUMENT);
    ck_assert_int_eq(r.http_status, 0);
    ck_assert_ptr_nonnull(strstr(r.message, "client:"));
    in = instance(1);
    in.n_specs = 0;
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_INVALID_ARGUMENT);
    in = instance(1);
    in.block_size = 0;
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_INVALID_ARGUMENT);
    expect_status(kvcm_register_instance(c, NULL, 0, &r), &r, KVCM_INVALID_ARGUMENT);
    rec = recorded(&k, "registerInstance");
    ck_assert_int_eq(json_array_size(rec), 3);
    json_decref(rec);

    /* a NULL result is allowed */
    in = instance(1);
    ck_assert_int_eq(kvcm_register_instance(c, &in, 0, NULL), KVCM_OK);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- reportEvent ------------------------------------------------------------------------------ */

START_TEST(report_add_delete)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    struct kvcm_client *c = client_of(&k);
    register_ok(c);
    struct kvcm_result r;
    /* before NODE_REGISTER: the server's rule */
    expect_status(report(c, HOST_A, ev_list(ev_add(1), NULL, NULL), &r), &r,
                  KVCM_NODE_NOT_REGISTERED);
    /* NODE_REGISTER + ADDs in one request, negative and extreme keys */
    expect_status(report(c, HOST_A, ev_list(ev_register(), ev_add(-5), ev_add(INT64_MIN)), &r),
                  &r, KVCM_OK);
    ck_assert_int_eq(r.http_status, 200);
    ck_assert_uint_eq(r.retry_after_ms, 0);
    ck_assert(!r.snapshot_required);
    ck_assert_str_eq(r.snapshot_version, "");
    static const int64_t more[] = { 7, INT64_MAX, -1 };
    add_keys(c, HOST_A, more, 3);
    json_t *del = kvcm_event_block_delete(7, "hbm", SPEC);
    json_t *del2 = kvcm_event_block_delete(-1, "hbm", SPEC);
    expect_status(report(c, HOST_A, ev_list(del, del2, NULL), &r), &r, KVCM_OK);

    json_t *st;
    json_t *rep = reporter(&k, HOST_A, &st);
    char buf[256];
    ck_assert_str_eq(keys_on(rep, "hbm", buf, sizeof buf),
                     "-9223372036854775808,-5,9223372036854775807");
    ck_assert_int_eq(json_integer_value(json_object_get(rep, "block_count")), 3);
    ck_assert(json_is_true(json_object_get(rep, "registered")));
    json_decref(st);

    /* the keys went out as decimal strings */
    json_t *rec = recorded(&k, "reportEvent");
    json_t *last = json_array_get(rec, json_array_size(rec) - 1);
    json_t *ev0 = json_array_get(json_object_get(json_object_get(last, "body"), "events"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ev0, "block_delete"),
                                                       "block_key")), "7");
    json_t *b = json_object_get(last, "body");
    ck_assert_str_eq(json_string_value(json_object_get(b, "instance_id")), INST);
    ck_assert_str_eq(json_string_value(json_object_get(b, "host_ip_port")), HOST_A);
    ck_assert_str_eq(json_string_value(json_object_get(b, "storage_type")), L1);
    json_decref(rec);

    /* an empty events array is a no-op OK; a bad argument never leaves the client */
    expect_status(report(c, HOST_A, json_array(), &r), &r, KVCM_OK);
    expect_status(kvcm_report_events(c, INST, HOST_A, L1, NULL, 0, &r), &r,
                  KVCM_INVALID_ARGUMENT);
    json_t *evs = ev_list(ev_add(99), NULL, NULL);
    expect_status(kvcm_report_events(c, "", HOST_A, L1, evs, 0, &r), &r, KVCM_INVALID_ARGUMENT);
    /* the events array is borrowed: still ours afterwards */
    expect_status(kvcm_report_events(c, INST, HOST_A, L1, evs, 0, &r), &r, KVCM_OK);
    ck_assert_int_eq(json_array_size(evs), 1);
    json_decref(evs);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(report_snapshot_and_rate_limit)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    struct kvcm_client *c = client_of(&k);
    register_ok(c);
    node_register(c, HOST_A);
    static const int64_t keys[] = { 1, 2 };
    add_keys(c, HOST_A, keys, 2);
    json_t *blocks = json_array();
    json_array_append_new(blocks, kvcm_snapshot_block(3, "hbm", SPEC, "rtp-llm://a/hbm?size=1"));
    json_array_append_new(blocks, kvcm_snapshot_block(-4, "hbm", SPEC, "rtp-llm://a/hbm?size=1"));
    json_array_append_new(blocks, kvcm_snapshot_block(8, "dram", SPEC, "rtp-llm://a/dram"));
    struct kvcm_result r;
    expect_status(report(c, HOST_A, ev_list(kvcm_event_snapshot(blocks), NULL, NULL), &r), &r,
                  KVCM_OK);
    ck_assert_str_ne(r.snapshot_version, "");
    char v1[sizeof r.snapshot_version];
    snprintf(v1, sizeof v1, "%s", r.snapshot_version);

    json_t *st;
    json_t *rep = reporter(&k, HOST_A, &st);
    char buf[256];
    ck_assert_str_eq(keys_on(rep, "hbm", buf, sizeof buf), "-4,3");
    ck_assert_str_eq(keys_on(rep, "dram", buf, sizeof buf), "8");
    ck_assert_str_eq(json_string_value(json_object_get(rep, "committed_snapshot_version")), v1);
    json_decref(st);

    /* a second snapshot inside the interval: rate limited, retry_after_ms > 0, nothing changes */
    blocks = json_array();
    json_array_append_new(blocks, kvcm_snapshot_block(5, "hbm", SPEC, "u"));
    expect_status(report(c, HOST_A, ev_list(kvcm_event_snapshot(blocks), NULL, NULL), &r), &r,
                  KVCM_SNAPSHOT_RATE_LIMITED);
    ck_assert_uint_gt(r.retry_after_ms, 0);
    ck_assert_uint_le(r.retry_after_ms, 30000);
    ck_assert_str_eq(r.snapshot_version, v1);
    rep = reporter(&k, HOST_A, &st);
    ck_assert_str_eq(keys_on(rep, "hbm", buf, sizeof buf), "-4,3");
    json_decref(st);

    /* a snapshot mixed with an ADD: the server refuses it */
    expect_status(report(c, HOST_A, ev_list(kvcm_event_snapshot(json_array()), ev_add(1), NULL),
                         &r), &r, KVCM_INVALID_ARGUMENT);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(report_host_down_and_heartbeat)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    struct kvcm_client *c = client_of(&k);
    register_ok(c);
    node_register(c, HOST_A);
    struct kvcm_result r;
    expect_status(report(c, HOST_A, ev_list(kvcm_event_heartbeat(json_pack("{s:s, s:s}", "load",
                                                                            "0.5", "blocks",
                                                                            "12")),
                                            NULL, NULL), &r), &r, KVCM_OK);
    static const int64_t keys[] = { 11 };
    add_keys(c, HOST_A, keys, 1);
    json_t *st;
    json_t *rep = reporter(&k, HOST_A, &st);
    ck_assert_int_eq(json_integer_value(json_object_get(rep, "heartbeats")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(rep, "system_status"),
                                                       "load")), "0.5");
    ck_assert_int_ge(json_integer_value(json_object_get(rep, "last_heartbeat_t_ms")), 0);
    json_decref(st);

    /* HOST_DOWN with anything else: refused; alone: OK, the reporter is gone */
    expect_status(report(c, HOST_A, ev_list(kvcm_event_host_down(), ev_add(12), NULL), &r), &r,
                  KVCM_INVALID_ARGUMENT);
    expect_status(report(c, HOST_A, ev_list(kvcm_event_host_down(), NULL, NULL), &r), &r,
                  KVCM_OK);
    rep = reporter(&k, HOST_A, &st);
    ck_assert(json_is_false(json_object_get(rep, "registered")));
    ck_assert_int_eq(json_integer_value(json_object_get(rep, "block_count")), 0);
    json_decref(st);
    /* after HOST_DOWN: register again first */
    expect_status(report(c, HOST_A, ev_list(kvcm_event_heartbeat(NULL), NULL, NULL), &r), &r,
                  KVCM_NODE_NOT_REGISTERED);
    node_register(c, HOST_A);
    expect_status(report(c, HOST_A, ev_list(kvcm_event_heartbeat(NULL), NULL, NULL), &r), &r,
                  KVCM_OK);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- getHostCacheState ------------------------------------------------------------------------- */

START_TEST(host_cache_state_counts)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    struct kvcm_client *c = client_of(&k);
    register_ok(c);
    node_register(c, HOST_A);
    node_register(c, HOST_B);
    static const int64_t keys[] = { -100, 200, INT64_MIN, 4 };
    add_keys(c, HOST_A, keys, 3);
    add_keys(c, HOST_B, keys, 1);
    struct kvcm_host_match h[4];
    memset(h, 0xab, sizeof h);
    size_t nh = 99;
    struct kvcm_result r;
    expect_status(kvcm_host_cache_state(c, INST, keys, 4, 0, h, 4, &nh, &r), &r, KVCM_OK);
    ck_assert_uint_eq(nh, 2);
    ck_assert_str_eq(h[0].host_ip_port, HOST_A);
    ck_assert_uint_eq(h[0].matched, 3);
    ck_assert_str_eq(h[1].host_ip_port, HOST_B);
    ck_assert_uint_eq(h[1].matched, 1);
    /* a prefix miss at key 0: nobody */
    static const int64_t other[] = { 4, -100 };
    expect_status(kvcm_host_cache_state(c, INST, other, 2, 0, h, 4, &nh, &r), &r, KVCM_OK);
    ck_assert_uint_eq(nh, 0);
    /* max caps what is kept, in the server's order */
    expect_status(kvcm_host_cache_state(c, INST, keys, 4, 0, h, 1, &nh, &r), &r, KVCM_OK);
    ck_assert_uint_eq(nh, 1);
    ck_assert_str_eq(h[0].host_ip_port, HOST_A);
    /* the request: QT_PREFIX_MATCH, keys as strings, medium [] */
    json_t *rec = recorded(&k, "getHostCacheState");
    json_t *b = json_object_get(json_array_get(rec, 0), "body");
    json_t *want = json_pack("[s, s, s, s]", "-100", "200", "-9223372036854775808", "4");
    ck_assert(json_equal(json_object_get(b, "block_cache_keys"), want));
    ck_assert_str_eq(json_string_value(json_object_get(b, "query_type")), "QT_PREFIX_MATCH");
    ck_assert(json_is_array(json_object_get(b, "medium")));
    ck_assert_int_eq(json_array_size(json_object_get(b, "medium")), 0);
    json_decref(want);
    json_decref(rec);
    /* an unknown instance */
    nh = 5;
    expect_status(kvcm_host_cache_state(c, "nobody", keys, 4, 0, h, 4, &nh, &r), &r,
                  KVCM_INSTANCE_NOT_EXIST);
    ck_assert_uint_eq(nh, 0);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- leader ------------------------------------------------------------------------------------- */

START_TEST(leader_through_follower)
{
    struct kvcmctl a, b;
    sim_start(&a, NULL);
    char url[160];
    snprintf(url, sizeof url, "%s", a.base);
    const char *fo[] = { "--follower-of", url, NULL };
    sim_start(&b, fo);
    const char *eps[] = { b.base };
    struct kvcm_client *c = client_new(eps, 1, 10000, 0, PREFIX);
    struct kvcm_result r;
    expect_status(kvcm_discover_leader(c, 5000, &r), &r, KVCM_OK);
    ck_assert_str_eq(kvcm_leader(c), a.base);
    register_ok(c);
    node_register(c, HOST_A);
    static const int64_t keys[] = { 1 };
    add_keys(c, HOST_A, keys, 1);
    json_t *st;
    json_t *rep = reporter(&a, HOST_A, &st);
    ck_assert_int_eq(json_integer_value(json_object_get(rep, "block_count")), 1);
    json_decref(st);
    /* the follower saw only getClusterInfo */
    json_t *rec = kvcmctl_recorded(&b, 0);
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e)
        ck_assert_str_eq(json_string_value(json_object_get(e, "rpc")), "getClusterInfo");
    ck_assert_int_ge(json_array_size(rec), 1);
    json_decref(rec);

    /* a follower first in the list of a fresh client: the first RPC discovers on its own */
    const char *eps2[] = { b.base, a.base };
    struct kvcm_client *c2 = client_new(eps2, 2, 10000, 0, "other");
    register_ok(c2);
    ck_assert_str_eq(kvcm_leader(c2), a.base);
    kvcm_client_destroy(c2);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&b);
    kvcmctl_stop_ok(&a);
}
END_TEST

START_TEST(leader_switch_at_run_time)
{
    struct kvcmctl a, b;
    sim_start(&a, NULL);
    char url[160];
    snprintf(url, sizeof url, "%s", a.base);
    const char *fo[] = { "--follower-of", url, NULL };
    sim_start(&b, fo);
    const char *eps[] = { b.base };
    struct kvcm_client *c = client_new(eps, 1, 10000, 0, PREFIX);
    register_ok(c);
    ck_assert_str_eq(kvcm_leader(c), a.base);

    /* B takes over; A follows it */
    control(&b, "{\"leader\": true}");
    char ctl[256];
    snprintf(ctl, sizeof ctl, "{\"follower_of\": \"%s\"}", b.base);
    control(&a, ctl);
    struct kvcm_result r;
    struct kvcm_instance in = instance(1);
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_OK);
    ck_assert_str_eq(kvcm_leader(c), b.base);
    /* A answered SERVER_NOT_LEADER, B took the retry (whose trace id r carries) */
    json_t *ra = recorded(&a, "registerInstance");
    ck_assert_int_eq(json_array_size(ra), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ra, 1), "status")),
                     "SERVER_NOT_LEADER");
    json_t *rb = recorded(&b, "registerInstance");
    ck_assert_int_eq(json_array_size(rb), 1);
    json_t *rb0 = json_array_get(rb, 0);
    ck_assert_str_eq(json_string_value(json_object_get(rb0, "status")), "OK");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(rb0, "body"), "trace_id")),
                     r.trace_id);
    json_decref(ra);
    json_decref(rb);
    json_t *st = kvcmctl_state(&b, false);
    ck_assert_ptr_nonnull(json_object_get(json_object_get(st, "instances"), INST));
    json_decref(st);

    /* nobody leads (each names the other): one rediscovery, one retry, then NOT_LEADER */
    snprintf(ctl, sizeof ctl, "{\"follower_of\": \"%s\"}", a.base);
    control(&b, ctl);
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_SERVER_NOT_LEADER);
    ck_assert_str_eq(kvcm_leader(c), "");
    ra = recorded(&a, "registerInstance");
    rb = recorded(&b, "registerInstance");
    ck_assert_int_eq(json_array_size(ra), 3);
    ck_assert_int_eq(json_array_size(rb), 2);
    json_decref(ra);
    json_decref(rb);
    /* A leads again: the next call rediscovers (the leader was forgotten) */
    control(&a, "{\"leader\": true}");
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_OK);
    ck_assert_str_eq(kvcm_leader(c), a.base);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&b);
    kvcmctl_stop_ok(&a);
}
END_TEST

/* ---- transport failures --------------------------------------------------------------------------- */

START_TEST(transport_connect_refused)
{
    char dead[64];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%u", dead_port());
    const char *eps[] = { dead };
    struct kvcm_client *c = client_new(eps, 1, 5000, 0, PREFIX);
    struct kvcm_result r;
    uint64_t t0 = simctl_now_ms();
    expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_TRANSPORT);
    ck_assert_uint_lt(simctl_now_ms() - t0, MARGIN_MS);
    ck_assert_int_eq(r.http_status, 0);
    ck_assert_msg(strstr(r.message, dead) != NULL, "message: %s", r.message);
    struct kvcm_instance in = instance(1);
    t0 = simctl_now_ms();
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_TRANSPORT);
    ck_assert_uint_lt(simctl_now_ms() - t0, MARGIN_MS);
    ck_assert_str_eq(kvcm_leader(c), "");
    kvcm_client_destroy(c);

    /* the walk goes on past a dead endpoint */
    struct kvcmctl k;
    sim_start(&k, NULL);
    const char *eps2[] = { dead, k.base };
    c = client_new(eps2, 2, 5000, 0, PREFIX);
    expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_OK);
    ck_assert_str_eq(kvcm_leader(c), k.base);
    register_ok(c);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(transport_timeout)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    struct kvcm_client *c;
    const char *eps[] = { k.base };
    c = client_new(eps, 1, 300, 0, PREFIX);
    struct kvcm_result r;
    expect_status(kvcm_discover_leader(c, 10000, &r), &r, KVCM_OK);
    control(&k, "{\"delay_ms\": 4000, \"delay_only\": \"registerInstance\"}");
    struct kvcm_instance in = instance(1);
    uint64_t t0 = simctl_now_ms();
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_TRANSPORT);
    uint64_t took = simctl_now_ms() - t0;
    ck_assert_msg(took >= 250 && took < 300 + MARGIN_MS, "took %" PRIu64 " ms", took);
    ck_assert_msg(strstr(r.message, "imeout") || strstr(r.message, "timed out"), "message: %s",
                  r.message);
    /* an explicit per-call timeout wins over the default */
    t0 = simctl_now_ms();
    expect_status(kvcm_register_instance(c, &in, 100, &r), &r, KVCM_TRANSPORT);
    took = simctl_now_ms() - t0;
    ck_assert_msg(took < 100 + MARGIN_MS, "took %" PRIu64 " ms", took);
    kvcm_client_destroy(c);

    /* everything slow: discovery + call share one deadline; a walk over two slow endpoints
     * stays inside the discovery timeout */
    control(&k, "{\"delay_ms\": 4000, \"delay_only\": null}");
    const char *eps2[] = { k.base, k.base };
    c = client_new(eps2, 2, 400, 0, PREFIX);
    t0 = simctl_now_ms();
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_TRANSPORT);
    took = simctl_now_ms() - t0;
    ck_assert_msg(took < 400 + MARGIN_MS, "took %" PRIu64 " ms", took);
    t0 = simctl_now_ms();
    expect_status(kvcm_discover_leader(c, 600, &r), &r, KVCM_TRANSPORT);
    took = simctl_now_ms() - t0;
    ck_assert_msg(took < 600 + MARGIN_MS, "took %" PRIu64 " ms", took);
    kvcm_client_destroy(c);
    control(&k, "{\"delay_ms\": 0}");
    simctl_sleep_ms(4200);                     /* let the held requests finish */
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(transport_bad_answers)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    struct kvcm_client *c = client_of(&k);
    register_ok(c);
    struct kvcm_instance in = instance(1);
    struct kvcm_result r;

    control(&k, "{\"garbage\": true}");
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_TRANSPORT);
    ck_assert_int_eq(r.http_status, 200);
    ck_assert_msg(strstr(r.message, "not JSON") && strstr(r.message, "<<garbage"), "message: %s",
                  r.message);
    control(&k, "{\"garbage\": false}");
    register_ok(c);                                   /* rediscovers, then fine */

    control(&k, "{\"http_status\": 503, \"fail_only\": \"registerInstance\"}");
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_TRANSPORT);
    ck_assert_int_eq(r.http_status, 503);
    ck_assert_msg(strstr(r.message, "HTTP 503") && strstr(r.message, "/api/registerInstance"),
                  "message: %s", r.message);
    control(&k, "{\"http_status\": 0}");

    /* an injected status code is a valid answer, passed through */
    control(&k, "{\"fail_status\": \"SERVICE_NOT_READY\", \"fail_count\": 1}");
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_SERVICE_NOT_READY);
    register_ok(c);

    /* a reply over max_response_bytes */
    const char *eps[] = { k.base };
    struct kvcm_client *small = client_new(eps, 1, 5000, 64, PREFIX);
    expect_status(kvcm_discover_leader(small, 0, &r), &r, KVCM_TRANSPORT);
    ck_assert_int_eq(r.http_status, 200);
    ck_assert_msg(strstr(r.message, "over 64 bytes"), "message: %s", r.message);
    kvcm_client_destroy(small);

    /* the server closes without answering */
    control(&k, "{\"down\": true}");
    expect_status(kvcm_register_instance(c, &in, 0, &r), &r, KVCM_TRANSPORT);
    ck_assert_int_eq(r.http_status, 0);
    control(&k, "{\"down\": false}");
    register_ok(c);
    kvcm_client_destroy(c);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- trace ids -------------------------------------------------------------------------------- */

START_TEST(trace_ids_unique_and_prefixed)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    /* two incarnations of the same node: epochs differ in the prefix */
    const char *eps[] = { k.base };
    struct kvcm_client *c1 = client_new(eps, 1, 10000, 0, PREFIX);
    struct kvcm_client *c2 = client_new(eps, 1, 10000, 0, "10.0.0.1:8080-1700000001");
    char last1[96] = "", last2[96] = "";
    struct kvcm_result r;
    for (int i = 0; i < 3; i++) {
        struct kvcm_instance in = instance(1);
        expect_status(kvcm_register_instance(c1, &in, 0, &r), &r, KVCM_OK);
        ck_assert_str_ne(r.trace_id, last1);
        snprintf(last1, sizeof last1, "%s", r.trace_id);
        expect_status(kvcm_register_instance(c2, &in, 0, &r), &r, KVCM_OK);
        snprintf(last2, sizeof last2, "%s", r.trace_id);
    }
    ck_assert_str_eq(last1, PREFIX "-4");          /* getClusterInfo took n=1 */
    ck_assert_str_eq(last2, "10.0.0.1:8080-1700000001-4");
    json_t *rec = kvcmctl_recorded(&k, 0);
    ck_assert_int_eq(json_array_size(rec), 8);
    json_t *seen = json_object();
    size_t i;
    json_t *e;
    json_array_foreach(rec, i, e) {
        const char *t = json_string_value(json_object_get(json_object_get(e, "body"),
                                                          "trace_id"));
        ck_assert_ptr_nonnull(t);
        ck_assert_msg(strncmp(t, "10.0.0.1:8080-170000000", 23) == 0, "trace id %s", t);
        ck_assert_msg(json_object_get(seen, t) == NULL, "trace id %s twice", t);
        json_object_set_new(seen, t, json_true());
    }
    ck_assert_ptr_nonnull(json_object_get(seen, last1));
    json_decref(seen);
    json_decref(rec);
    kvcm_client_destroy(c1);
    kvcm_client_destroy(c2);

    /* no prefix given: still a per-process, per-boot one */
    struct kvcm_client *c3 = client_new(eps, 1, 10000, 0, NULL);
    expect_status(kvcm_discover_leader(c3, 0, &r), &r, KVCM_OK);
    ck_assert_msg(strncmp(r.trace_id, "kvnode-", 7) == 0, "trace id %s", r.trace_id);
    kvcm_client_destroy(c3);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- a canned HTTP server for replies the simulator never sends -------------------------------- */

struct canned_route { const char *rpc; int status; const char *body; };

struct canned {
    int lfd, stop[2];
    pthread_t th;
    pthread_mutex_t mu;
    struct canned_route routes[8];
    size_t n_routes;
    unsigned hits;
    char base[64];
};

static void canned_set(struct canned *s, const struct canned_route *routes, size_t n)
{
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++)
        s->routes[i] = routes[i];
    s->n_routes = n;
    pthread_mutex_unlock(&s->mu);
}

static void canned_serve(struct canned *s, int fd)
{
    char req[65536];
    size_t got = 0;
    long clen = -1;
    char *hdr_end = NULL;
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 5000) != 1)
            return;
        ssize_t n = recv(fd, req + got, sizeof req - 1 - got, 0);
        if (n <= 0)
            return;
        got += (size_t)n;
        req[got] = '\0';
        if (!hdr_end && (hdr_end = strstr(req, "\r\n\r\n")) != NULL) {
            const char *cl = strcasestr(req, "\r\nContent-Length:");
            clen = cl ? strtol(cl + 17, NULL, 10) : 0;
        }
        if (hdr_end && (long)(got - (size_t)(hdr_end + 4 - req)) >= clen)
            break;
        if (got == sizeof req - 1)
            return;
    }
    char rpc[64] = "";
    sscanf(req, "POST /api/%63[A-Za-z] ", rpc);
    int status = 404;
    const char *body = "{}";
    pthread_mutex_lock(&s->mu);
    s->hits++;
    for (size_t i = 0; i < s->n_routes; i++)
        if (strcmp(s->routes[i].rpc, rpc) == 0) {
            status = s->routes[i].status;
            body = s->routes[i].body;
        }
    pthread_mutex_unlock(&s->mu);
    char out[8192];
    int n = snprintf(out, sizeof out, "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", status, strlen(body),
                     body);
    ck_assert(n > 0 && (size_t)n < sizeof out);
    for (size_t off = 0; off < (size_t)n;) {
        ssize_t w = send(fd, out + off, (size_t)n - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
}

static void *canned_main(void *arg)
{
    struct canned *s = arg;
    for (;;) {
        struct pollfd p[2] = { { .fd = s->lfd, .events = POLLIN },
                               { .fd = s->stop[0], .events = POLLIN } };
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        canned_serve(s, fd);
        close(fd);
    }
    return NULL;
}

static void canned_start(struct canned *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    ck_assert(pipe(s->stop) == 0);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert(s->lfd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    ck_assert(bind(s->lfd, (struct sockaddr *)&a, sizeof a) == 0);
    ck_assert(listen(s->lfd, 16) == 0);
    ck_assert(getsockname(s->lfd, (struct sockaddr *)&a, &al) == 0);
    snprintf(s->base, sizeof s->base, "http://127.0.0.1:%u", ntohs(a.sin_port));
    ck_assert(pthread_create(&s->th, NULL, canned_main, s) == 0);
}

static void canned_stop(struct canned *s)
{
    ck_assert(write(s->stop[1], "x", 1) == 1);
    pthread_join(s->th, NULL);
    close(s->lfd);
    close(s->stop[0]);
    close(s->stop[1]);
    pthread_mutex_destroy(&s->mu);
}

#define OK_HDR "\"header\":{\"status\":{\"code\":\"OK\",\"message\":\"\"}}"

START_TEST(odd_replies)
{
    struct canned s;
    canned_start(&s);
    const char *eps[] = { s.base };
    struct kvcm_client *c = client_new(eps, 1, 5000, 0, PREFIX);
    struct kvcm_result r;

    /* no leader_endpoint, but the node says it leads itself: use it */
    canned_set(&s, (struct canned_route[]){
        { "getClusterInfo", 200, "{" OK_HDR ",\"self_node_id\":\"n1\",\"leader_node_id\":\"n1\"}" },
    }, 1);
    expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_OK);
    ck_assert_str_eq(kvcm_leader(c), s.base);
    /* a numeric code; an unusable leader_endpoint (port 0) but self-leading */
    canned_set(&s, (struct canned_route[]){
        { "getClusterInfo", 200, "{\"header\":{\"status\":{\"code\":1}},\"self_node_id\":\"n1\","
                                 "\"leader_node_id\":\"n1\",\"leader_endpoint\":{\"host\":"
                                 "\"10.9.9.9\",\"meta_http_port\":0}}" },
    }, 1);
    expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_OK);
    ck_assert_str_eq(kvcm_leader(c), s.base);
    /* leader elsewhere, port as a string; IPv6 hosts get brackets */
    canned_set(&s, (struct canned_route[]){
        { "getClusterInfo", 200, "{" OK_HDR ",\"self_node_id\":\"n1\",\"leader_node_id\":\"n2\","
                                 "\"leader_endpoint\":{\"host\":\"fd00::2\","
                                 "\"meta_http_port\":\"6382\"}}" },
    }, 1);
    expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_OK);
    ck_assert_str_eq(kvcm_leader(c), "http://[fd00::2]:6382");
    /* no usable leader and not the leader itself: fail */
    const char *bad_leaders[] = {
        "{" OK_HDR ",\"self_node_id\":\"n1\",\"leader_node_id\":\"n2\"}",
        "{" OK_HDR ",\"self_node_id\":\"n1\",\"leader_node_id\":\"n2\",\"leader_endpoint\":"
        "{\"host\":\"a/b\",\"meta_http_port\":80}}",
        "{" OK_HDR ",\"self_node_id\":\"n1\",\"leader_node_id\":\"n2\",\"leader_endpoint\":"
        "{\"host\":\"h\",\"meta_http_port\":70000}}",
        "{" OK_HDR ",\"self_node_id\":\"\",\"leader_node_id\":\"\"}",
    };
    for (size_t i = 0; i < sizeof bad_leaders / sizeof bad_leaders[0]; i++) {
        canned_set(&s, (struct canned_route[]){ { "getClusterInfo", 200, bad_leaders[i] } }, 1);
        expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_TRANSPORT);
        ck_assert_msg(strstr(r.message, "leader_endpoint"), "message: %s", r.message);
        ck_assert_str_eq(kvcm_leader(c), "");
    }
    /* replies without a usable header.status */
    const char *no_status[] = { "[]", "{}", "{\"header\":{}}", "{\"header\":{\"status\":{}}}",
                                "{\"header\":{\"status\":{\"code\":\"WHATEVER\"}}}",
                                "{\"header\":{\"status\":{\"code\":12}}}", "" };
    for (size_t i = 0; i < sizeof no_status / sizeof no_status[0]; i++) {
        canned_set(&s, (struct canned_route[]){ { "getClusterInfo", 200, no_status[i] } }, 1);
        expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_TRANSPORT);
        ck_assert_int_eq(r.http_status, 200);
    }
    /* 204 (no body), 301: not a KVCM answer */
    canned_set(&s, (struct canned_route[]){ { "getClusterInfo", 204, "" } }, 1);
    expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_TRANSPORT);
    ck_assert_int_eq(r.http_status, 204);
    canned_set(&s, (struct canned_route[]){ { "getClusterInfo", 301, "{" OK_HDR "}" } }, 1);
    expect_status(kvcm_discover_leader(c, 0, &r), &r, KVCM_TRANSPORT);
    ck_assert_int_eq(r.http_status, 301);

    /* reportEvent reply fields: numbers or strings; malformed ones -> TRANSPORT */
    struct canned_route ok_leader = {
        "getClusterInfo", 200, "{" OK_HDR ",\"self_node_id\":\"n\",\"leader_node_id\":\"n\"}" };
    canned_set(&s, (struct canned_route[]){ ok_leader,
        { "reportEvent", 200, "{\"header\":{\"status\":{\"code\":\"SNAPSHOT_RATE_LIMITED\","
                              "\"message\":\"wait\"}},\"retry_after_ms\":250,"
                              "\"snapshot_required\":true,\"committed_snapshot_version\":\"v7\"}" },
    }, 2);
    json_t *evs = json_array();
    expect_status(kvcm_report_events(c, INST, HOST_A, L1, evs, 0, &r), &r,
                  KVCM_SNAPSHOT_RATE_LIMITED);
    ck_assert_uint_eq(r.retry_after_ms, 250);
    ck_assert(r.snapshot_required);
    ck_assert_str_eq(r.snapshot_version, "v7");
    ck_assert_str_eq(r.message, "wait");
    canned_set(&s, (struct canned_route[]){ ok_leader,
        { "reportEvent", 200, "{" OK_HDR ",\"retry_after_ms\":\"18446744073709551615\","
                              "\"snapshot_required\":null,\"committed_snapshot_version\":null}" },
    }, 2);
    expect_status(kvcm_report_events(c, INST, HOST_A, L1, evs, 0, &r), &r, KVCM_OK);
    ck_assert_uint_eq(r.retry_after_ms, UINT64_MAX);
    ck_assert(!r.snapshot_required);
    const char *bad_fields[] = {
        "{" OK_HDR ",\"retry_after_ms\":-1}",
        "{" OK_HDR ",\"retry_after_ms\":\"18446744073709551616\"}",
        "{" OK_HDR ",\"retry_after_ms\":\"12ms\"}",
        "{" OK_HDR ",\"retry_after_ms\":1.5}",
        "{" OK_HDR ",\"snapshot_required\":\"yes\"}",
        "{" OK_HDR ",\"committed_snapshot_version\":7}",
        "{" OK_HDR ",\"committed_snapshot_version\":\"0123456789012345678901234567890123456789"
        "012345678901234567890123\"}",
    };
    for (size_t i = 0; i < sizeof bad_fields / sizeof bad_fields[0]; i++) {
        canned_set(&s, (struct canned_route[]){ ok_leader, { "reportEvent", 200, bad_fields[i] } },
                   2);
        expect_status(kvcm_report_events(c, INST, HOST_A, L1, evs, 0, &r), &r, KVCM_TRANSPORT);
        ck_assert_msg(strstr(r.message, "malformed"), "message: %s", r.message);
        ck_assert_uint_eq(r.retry_after_ms, 0);
    }
    json_decref(evs);

    /* hosts: garbage entries skipped, counts past the keys asked refused */
    canned_set(&s, (struct canned_route[]){ ok_leader,
        { "getHostCacheState", 200,
          "{" OK_HDR ",\"hosts\":[{\"host_ip_port\":\"a:1\",\"local\":\"3\"},"
          "{\"host_ip_port\":\"b:1\",\"local\":-1},{\"host_ip_port\":\"c:1\",\"local\":\"x\"},"
          "{\"local\":\"2\"},\"junk\",null,{\"host_ip_port\":\"\",\"local\":1},"
          "{\"host_ip_port\":\"e:1\",\"local\":\"99\"},{\"host_ip_port\":\"d:1\",\"local\":2},"
          "{\"host_ip_port\":\"f:1\",\"local\":1.0}]}" },
    }, 2);
    static const int64_t keys[] = { 1, 2, 3 };
    struct kvcm_host_match h[8];
    size_t nh = 0;
    expect_status(kvcm_host_cache_state(c, INST, keys, 3, 0, h, 8, &nh, &r), &r, KVCM_OK);
    ck_assert_uint_eq(nh, 2);
    ck_assert_str_eq(h[0].host_ip_port, "a:1");
    ck_assert_uint_eq(h[0].matched, 3);
    ck_assert_str_eq(h[1].host_ip_port, "d:1");
    ck_assert_uint_eq(h[1].matched, 2);
    canned_set(&s, (struct canned_route[]){ ok_leader,
        { "getHostCacheState", 200, "{" OK_HDR ",\"hosts\":{}}" } }, 2);
    expect_status(kvcm_host_cache_state(c, INST, keys, 3, 0, h, 8, &nh, &r), &r, KVCM_TRANSPORT);
    ck_assert_uint_eq(nh, 0);
    canned_set(&s, (struct canned_route[]){ ok_leader,
        { "getHostCacheState", 200, "{" OK_HDR "}" } }, 2);
    expect_status(kvcm_host_cache_state(c, INST, keys, 3, 0, h, 8, &nh, &r), &r, KVCM_OK);
    ck_assert_uint_eq(nh, 0);
    kvcm_client_destroy(c);
    canned_stop(&s);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("kvcm_client");
    unsigned t_s = simctl_under_valgrind() ? 600 : 60;
    TCase *t = tcase_create("offline");
    tcase_set_timeout(t, t_s);
    tcase_add_test(t, status_names_and_parse);
    tcase_add_test(t, create_rejects_bad_config);
    tcase_add_test(t, event_builders);
    tcase_add_test(t, odd_replies);
    suite_add_tcase(s, t);

    t = tcase_create("rpc");
    tcase_set_timeout(t, t_s);
    tcase_add_test(t, register_ok_and_duplicate);
    tcase_add_test(t, report_add_delete);
    tcase_add_test(t, report_snapshot_and_rate_limit);
    tcase_add_test(t, report_host_down_and_heartbeat);
    tcase_add_test(t, host_cache_state_counts);
    tcase_add_test(t, trace_ids_unique_and_prefixed);
    suite_add_tcase(s, t);

    t = tcase_create("leader");
    tcase_set_timeout(t, t_s);
    tcase_add_test(t, leader_through_follower);
    tcase_add_test(t, leader_switch_at_run_time);
    suite_add_tcase(s, t);

    t = tcase_create("transport");
    tcase_set_timeout(t, t_s);
    tcase_add_test(t, transport_connect_refused);
    tcase_add_test(t, transport_timeout);
    tcase_add_test(t, transport_bad_answers);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
