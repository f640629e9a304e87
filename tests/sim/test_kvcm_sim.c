/* Tests of the KVCM simulator (tests/sim/kvcm_sim.c).
 *
 * Each test starts the simulator (see kvcmctl.h for which binary) as a child process on an
 * ephemeral loopback port, speaks the KVCM HTTP/JSON protocol to it with libcurl, checks
 * that it rejects what the real server rejects (with the right header.status.code), and
 * compares GET /state and GET /recorded with what was sent; then it stops it with SIGTERM
 * and requires exit status 0. With VALGRIND=1 the simulator itself runs under valgrind (any
 * error or definite leak -> exit 99 -> fail).
 *
 * KVCM_SIM_DUMP=1 prints the /recorded document of recorded_in_order (one request/response
 * pair of each RPC) on stdout. */
#include <check.h>

#include <curl/curl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "kvcmctl.h"

#define INST   "inst-a"
#define SPEC   "rtp_llm_hbm_16"
#define L1     "ST_EVENT_REPORT_L1P5"
#define L2     "ST_EVENT_REPORT_L2"
#define HOST_A "10.0.0.1:8080"
#define HOST_B "10.0.0.2:8080"
#define HOST_C "10.0.0.3:8080"

/* ---- simulator process ---------------------------------------------------------------------- */

static void sim_start(struct kvcmctl *k, const char *const *extra)
{
    kvcmctl_start(k, &(struct kvcmctl_opts){ .valgrind = simctl_under_valgrind(),
                                             .extra = extra });
}

/* ---- HTTP (libcurl) ------------------------------------------------------------------------- */

/* One request through kvh_http_try (kvh_http.h); returns the HTTP status (-1 on a transport
 * failure), body in *out. */
static long http(const struct kvcmctl *k, const char *method, const char *path, const char *body,
                 long timeout_ms, char **out)
{
    return kvh_http_try(k->http, method, path, body, out, NULL, 0, timeout_ms, NULL);
}

/* POST /api/<rpc> with a document (stolen); returns the HTTP status, reply in *reply. */
static long rpc(const struct kvcmctl *k, const char *name, json_t *doc, json_t **reply)
{
    char *txt = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    char path[96], *out = NULL;
    snprintf(path, sizeof path, "/api/%s", name);
    long st = http(k, "POST", path, txt, 30000, &out);
    free(txt);
    if (reply)
        *reply = json_loads(out, 0, NULL);
    free(out);
    return st;
}

static const char *code_of(json_t *reply)
{
    const char *c = json_string_value(json_object_get(
        json_object_get(json_object_get(reply, "header"), "status"), "code"));
    return c ? c : "(none)";
}

/* rpc() that requires transport 200 and header.status.code == code; returns the reply. */
static json_t *call(const struct kvcmctl *k, const char *name, json_t *doc, const char *code)
{
    char *txt = json_dumps(doc, JSON_COMPACT);
    json_t *reply = NULL;
    long st = rpc(k, name, doc, &reply);
    ck_assert_msg(st == 200, "%s %s: HTTP %ld", name, txt, st);
    ck_assert_msg(reply != NULL, "%s %s: reply is not JSON", name, txt);
    ck_assert_msg(strcmp(code_of(reply), code) == 0, "%s %s: want %s, got %s (%s)", name, txt,
                  code, code_of(reply),
                  json_string_value(json_object_get(
                      json_object_get(json_object_get(reply, "header"), "status"), "message")));
    free(txt);
    return reply;
}

static void expect(const struct kvcmctl *k, const char *name, json_t *doc, const char *code)
{
    json_decref(call(k, name, doc, code));
}

/* ---- protocol bodies ------------------------------------------------------------------------ */

static json_t *reg_body(const char *inst, int block_size, const char *dtype)
{
    return json_pack("{s:s, s:s, s:s, s:i, s:{s:s, s:s, s:b, s:i, s:i, s:i},"
                     " s:[{s:s, s:s}], s:[{s:s, s:[s]}]}",
                     "trace_id", "t-reg", "instance_group", "g", "instance_id", inst,
                     "block_size", block_size, "model_deployment", "model_name", "m", "dtype",
                     dtype, "use_mla", 0, "tp_size", 1, "dp_size", 1, "pp_size", 1,
                     "location_spec_infos", "name", SPEC, "size", "4096",
                     "location_spec_groups", "name", "default", "spec_names", SPEC);
}

static void register_instance(const struct kvcmctl *k)
{
    expect(k, "registerInstance", reg_body(INST, 16, "fp16"), "OK");
}

static json_t *ev_register(void)
{
    return json_pack("{s:s, s:{s:[s, s]}}", "event_type", "EVENT_NODE_REGISTER",
                     "node_register", "mediums", "hbm", "dram");
}

static json_t *specs_of(const char *medium)
{
    char uri[128];
    snprintf(uri, sizeof uri, "rtp-llm://" HOST_A "/%s?size=4096", medium);
    return json_pack("[{s:s, s:s}]", "name", SPEC, "uri", uri);
}

static json_t *ev_add(const char *key, const char *medium)
{
    return json_pack("{s:s, s:{s:s, s:s, s:o}}", "event_type", "EVENT_BLOCK_ADD", "block_add",
                     "block_key", key, "medium", medium, "specs", specs_of(medium));
}

static json_t *ev_del(const char *key, const char *medium)
{
    return json_pack("{s:s, s:{s:s, s:s, s:[s]}}", "event_type", "EVENT_BLOCK_DELETE",
                     "block_delete", "block_key", key, "medium", medium, "spec_names", SPEC);
}

static json_t *ev_hb(const char *name, const char *value)
{
    return json_pack("{s:s, s:{s:{s:s}}}", "event_type", "EVENT_HEARTBEAT", "heartbeat",
                     "system_status", name, value);
}

static json_t *ev_down(void)
{
    return json_pack("{s:s, s:{}}", "event_type", "EVENT_HOST_DOWN", "host_down");
}

/* A snapshot of keys (NULL-terminated), each "key@medium". */
static json_t *ev_snap(const char *const *items)
{
    json_t *blocks = json_array();
    for (; *items; items++) {
        char key[64];
        const char *at = strchr(*items, '@');
        snprintf(key, sizeof key, "%.*s", (int)(at - *items), *items);
        json_array_append_new(blocks, json_pack("{s:s, s:s, s:o}", "block_key", key, "medium",
                                                at + 1, "specs", specs_of(at + 1)));
    }
    return json_pack("{s:s, s:{s:o}}", "event_type", "EVENT_BLOCK_SNAPSHOT", "block_snapshot",
                     "blocks", blocks);
}

/* A reportEvent body for (INST, host, storage type); events stolen. */
static json_t *report(const char *host, const char *st, json_t *events)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "trace_id", "t-ev", "instance_id", INST,
                     "host_ip_port", host, "storage_type", st, "events", events);
}

static void node_register(const struct kvcmctl *k, const char *host, const char *st)
{
    expect(k, "reportEvent", report(host, st, json_pack("[o]", ev_register())), "OK");
}

/* The reporter's keys on a medium joined with ',' into buf ("" when none). */
static const char *keys_on(json_t *rep, const char *medium, char *buf, size_t cap)
{
    buf[0] = '\0';
    size_t i, off = 0;
    json_t *v;
    json_array_foreach(json_object_get(json_object_get(rep, "blocks"), medium), i, v)
        off += (size_t)snprintf(buf + off, cap - off, "%s%s", i ? "," : "", json_string_value(v));
    return buf;
}

static json_int_t ifield(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    ck_assert_msg(json_is_integer(v), "field %s is not an integer", k);
    return json_integer_value(v);
}

/* ---- tests: registerInstance ---------------------------------------------------------------- */

START_TEST(register_idempotent_and_duplicate)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    register_instance(&k);
    register_instance(&k);
    /* trace_id, user_data and int64 spelling do not count */
    json_t *b = reg_body(INST, 16, "fp16");
    json_object_set_new(b, "trace_id", json_string("another"));
    json_object_set_new(json_object_get(b, "model_deployment"), "user_data",
                        json_string("free text"));
    json_object_set_new(json_array_get(json_object_get(b, "location_spec_infos"), 0), "size",
                        json_integer(4096));
    expect(&k, "registerInstance", b, "OK");
    /* different info -> DUPLICATE_ENTITY, naming what differs */
    json_t *r = call(&k, "registerInstance", reg_body(INST, 32, "fp16"), "DUPLICATE_ENTITY");
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(json_object_get(
        json_object_get(r, "header"), "status"), "message")), "block_size"));
    json_decref(r);
    expect(&k, "registerInstance", reg_body(INST, 16, "bf16"), "DUPLICATE_ENTITY");
    /* the header echoes trace_id as request_id */
    r = call(&k, "registerInstance", reg_body("inst-b", 16, "fp16"), "OK");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(r, "header"),
                                                       "request_id")), "t-reg");
    json_decref(r);
    /* malformed registrations */
    b = reg_body("", 16, "fp16");
    expect(&k, "registerInstance", b, "INVALID_ARGUMENT");
    expect(&k, "registerInstance", reg_body("inst-c", 0, "fp16"), "INVALID_ARGUMENT");
    b = reg_body("inst-c", 16, "fp16");
    json_object_del(b, "location_spec_infos");
    expect(&k, "registerInstance", b, "INVALID_ARGUMENT");
    b = reg_body("inst-c", 16, "fp16");
    json_array_set_new(json_object_get(json_array_get(json_object_get(b, "location_spec_groups"),
                                                      0), "spec_names"), 0,
                       json_string("unknown_spec"));
    expect(&k, "registerInstance", b, "INVALID_ARGUMENT");

    json_t *s = kvcmctl_state(&k, false);
    json_t *insts = json_object_get(s, "instances");
    ck_assert_uint_eq(json_object_size(insts), 2);
    ck_assert_int_eq(ifield(json_object_get(insts, INST), "block_size"), 16);
    ck_assert_ptr_null(json_object_get(insts, "inst-c"));
    json_decref(s);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- tests: reportEvent rules --------------------------------------------------------------- */

START_TEST(report_unknown_instance)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    json_t *b = report(HOST_A, L1, json_pack("[o]", ev_register()));
    json_t *r = call(&k, "reportEvent", b, "INSTANCE_NOT_EXIST");
    /* every reportEvent reply field is printed */
    ck_assert_str_eq(json_string_value(json_object_get(r, "retry_after_ms")), "0");
    ck_assert(json_is_false(json_object_get(r, "snapshot_required")));
    ck_assert_str_eq(json_string_value(json_object_get(r, "committed_snapshot_version")), "");
    ck_assert(json_is_array(json_object_get(r, "item_results")));
    json_decref(r);
    expect(&k, "reportEvent", report(HOST_A, L1, json_array()), "INSTANCE_NOT_EXIST");
    expect(&k, "getHostCacheState",
           json_pack("{s:s, s:s, s:[s]}", "instance_id", INST, "query_type", "QT_PREFIX_MATCH",
                     "block_cache_keys", "1"), "INSTANCE_NOT_EXIST");
    register_instance(&k);
    node_register(&k, HOST_A, L1);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(node_register_required)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    register_instance(&k);
    const char *const snap[] = { "1@hbm", NULL };
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("1", "hbm"))),
           "NODE_NOT_REGISTERED");
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_hb("load", "1"))),
           "NODE_NOT_REGISTERED");
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_snap(snap))),
           "NODE_NOT_REGISTERED");
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_down())),
           "NODE_NOT_REGISTERED");
    /* empty events: a no-op OK, even unregistered */
    expect(&k, "reportEvent", report(HOST_A, L1, json_array()), "OK");
    node_register(&k, HOST_A, L1);
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("1", "hbm"))), "OK");
    /* identity includes storage_type */
    expect(&k, "reportEvent", report(HOST_A, L2, json_pack("[o]", ev_add("1", "hbm"))),
           "NODE_NOT_REGISTERED");
    /* a NODE_REGISTER earlier in the same request counts */
    expect(&k, "reportEvent",
           report(HOST_B, L1, json_pack("[o, o, o]", ev_register(), ev_add("7", "dram"),
                                        ev_hb("gpu_util", "0.5"))), "OK");

    json_t *s = kvcmctl_state(&k, false);
    char buf[128];
    json_t *a = kvcmctl_reporter(s, INST, L1, HOST_A);
    ck_assert_ptr_nonnull(a);
    ck_assert(json_is_true(json_object_get(a, "registered")));
    ck_assert_str_eq(keys_on(a, "hbm", buf, sizeof buf), "1");
    ck_assert_int_eq(ifield(json_object_get(a, "rejected"), "NODE_NOT_REGISTERED"), 4);
    ck_assert_int_eq(ifield(a, "heartbeats"), 0);              /* data is not a heartbeat */
    ck_assert_int_eq(ifield(a, "last_heartbeat_age_ms"), -1);
    ck_assert_int_eq(ifield(json_object_get(a, "events"), "EVENT_BLOCK_ADD"), 1);
    json_t *l2 = kvcmctl_reporter(s, INST, L2, HOST_A);
    ck_assert(json_is_false(json_object_get(l2, "registered")));
    ck_assert_int_eq(ifield(l2, "block_count"), 0);
    json_t *b = kvcmctl_reporter(s, INST, L1, HOST_B);
    ck_assert_str_eq(keys_on(b, "dram", buf, sizeof buf), "7");
    ck_assert_int_eq(ifield(b, "heartbeats"), 1);
    ck_assert_int_ge(ifield(b, "last_heartbeat_age_ms"), 0);
    ck_assert_int_ge(ifield(b, "last_heartbeat_t_ms"), 0);
    ck_assert_int_eq(ifield(a, "last_heartbeat_t_ms"), -1);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(b, "system_status"),
                                                       "gpu_util")), "0.5");
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(b, "mediums"), 1)),
                     "dram");
    json_decref(s);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* Each entry: a reportEvent body (as text, %s = the registered host) that must be refused
 * with INVALID_ARGUMENT and change nothing. */
static const char *const INVALID_REPORTS[] = {
    /* '#' in host_ip_port or medium */
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"10.0.0.1#x:80\",\"storage_type\":"
    "\"ST_EVENT_REPORT_L1P5\",\"events\":[]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_add\":{\"block_key\":\"1\","
    "\"medium\":\"hb#m\",\"specs\":[{\"name\":\"rtp_llm_hbm_16\",\"uri\":\"u\"}]}}]}",
    /* payload missing, wrong, doubled, or missing although empty */
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\"}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_delete\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\",\"spec_names\":[\"rtp_llm_hbm_16\"]}}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_add\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\",\"specs\":[{\"name\":\"rtp_llm_hbm_16\",\"uri\":\"u\"}]},"
    "\"heartbeat\":{}}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_HEARTBEAT\"}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_HOST_DOWN\"}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_NODE_REGISTER\",\"node_register\":null}]}",
    /* BLOCK_DELETE spec_names empty / unknown */
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_DELETE\",\"block_delete\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\",\"spec_names\":[]}}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_DELETE\",\"block_delete\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\",\"spec_names\":[\"nope\"]}}]}",
    /* ADD: no specs, unregistered spec, URI with s_version=, bad key, no medium */
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_add\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\",\"specs\":[]}}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_add\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\",\"specs\":[{\"name\":\"other\",\"uri\":\"u\"}]}}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_add\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\",\"specs\":[{\"name\":\"rtp_llm_hbm_16\",\"uri\":\"u?s_version=3\"}]}}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_add\":{\"block_key\":\"12a\","
    "\"medium\":\"hbm\",\"specs\":[{\"name\":\"rtp_llm_hbm_16\",\"uri\":\"u\"}]}}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_add\":{\"block_key\":\"1\","
    "\"specs\":[{\"name\":\"rtp_llm_hbm_16\",\"uri\":\"u\"}]}}]}",
    /* event types */
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BOGUS\",\"host_down\":{}}]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_UNSPECIFIED\"}]}",
    /* storage_type missing or not an event-report type */
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"events\":[]}",
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_3FS\","
    "\"events\":[]}",
    /* a valid ADD next to an invalid event: nothing applied */
    "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"%s\",\"storage_type\":\"ST_EVENT_REPORT_L1P5\","
    "\"events\":[{\"event_type\":\"EVENT_BLOCK_ADD\",\"block_add\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\",\"specs\":[{\"name\":\"rtp_llm_hbm_16\",\"uri\":\"u\"}]}},"
    "{\"event_type\":\"EVENT_BLOCK_DELETE\",\"block_delete\":{\"block_key\":\"1\","
    "\"medium\":\"hbm\"}}]}",
    /* not JSON */
    "{\"instance_id\": nope",
    NULL,
};

START_TEST(invalid_arguments)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    register_instance(&k);
    node_register(&k, HOST_A, L1);
    for (size_t i = 0; INVALID_REPORTS[i]; i++) {
        char body[2048], *out = NULL;
        snprintf(body, sizeof body, INVALID_REPORTS[i], HOST_A);
        ck_assert_int_eq(http(&k, "POST", "/api/reportEvent", body, 30000, &out), 200);
        json_t *r = json_loads(out, 0, NULL);
        ck_assert_msg(r && strcmp(code_of(r), "INVALID_ARGUMENT") == 0,
                      "case %zu: %s -> %s", i, body, out);
        json_decref(r);
        free(out);
    }
    json_t *s = kvcmctl_state(&k, false);
    json_t *a = kvcmctl_reporter(s, INST, L1, HOST_A);
    ck_assert_int_eq(ifield(a, "block_count"), 0);
    ck_assert_int_eq(ifield(json_object_get(a, "events"), "EVENT_BLOCK_ADD"), 0);
    json_decref(s);
    /* the protobuf JSON mapping's other spellings are accepted: enums by number, int64 as a
     * JSON number, unknown fields ignored, null as absent */
    const char *ok = "{\"instance_id\":\"inst-a\",\"host_ip_port\":\"" HOST_A "\","
                     "\"storage_type\":7,\"future_field\":{\"x\":1},\"trace_id\":null,"
                     "\"events\":[{\"event_type\":2,\"block_add\":{\"block_key\":-42,"
                     "\"medium\":\"hbm\",\"specs\":[{\"name\":\"rtp_llm_hbm_16\"}],"
                     "\"extra\":true}}]}";
    char *out = NULL;
    ck_assert_int_eq(http(&k, "POST", "/api/reportEvent", ok, 30000, &out), 200);
    json_t *r = json_loads(out, 0, NULL);
    ck_assert_str_eq(code_of(r), "OK");
    json_decref(r);
    free(out);
    s = kvcmctl_state(&k, false);
    char buf[64];
    ck_assert_str_eq(keys_on(kvcmctl_reporter(s, INST, L1, HOST_A), "hbm", buf, sizeof buf),
                     "-42");
    json_decref(s);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(snapshot_rules)
{
    struct kvcmctl k;
    bool vg = simctl_under_valgrind();
    const char *interval = vg ? "4" : "1";
    sim_start(&k, (const char *const[]){ "--snapshot-interval-s", interval, NULL });
    register_instance(&k);
    node_register(&k, HOST_A, L1);
    expect(&k, "reportEvent",
           report(HOST_A, L1, json_pack("[o, o, o]", ev_add("1", "hbm"), ev_add("2", "hbm"),
                                        ev_add("9", "dram"))), "OK");
    const char *const snap1[] = { "3@hbm", "4@hbm", "5@dram", NULL };
    /* a snapshot is never mixed with another event */
    expect(&k, "reportEvent",
           report(HOST_A, L1, json_pack("[o, o]", ev_snap(snap1), ev_add("6", "hbm"))),
           "INVALID_ARGUMENT");
    expect(&k, "reportEvent",
           report(HOST_A, L1, json_pack("[o, o]", ev_hb("a", "b"), ev_snap(snap1))),
           "INVALID_ARGUMENT");
    /* alone: it replaces the whole state, all media */
    json_t *r = call(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_snap(snap1))),
                     "OK");
    const char *v1s = json_string_value(json_object_get(r, "committed_snapshot_version"));
    ck_assert(v1s && *v1s);
    char v1[64];
    snprintf(v1, sizeof v1, "%s", v1s);
    json_decref(r);
    json_t *s = kvcmctl_state(&k, false);
    json_t *a = kvcmctl_reporter(s, INST, L1, HOST_A);
    char buf[128];
    ck_assert_str_eq(keys_on(a, "hbm", buf, sizeof buf), "3,4");
    ck_assert_str_eq(keys_on(a, "dram", buf, sizeof buf), "5");
    ck_assert_int_eq(ifield(a, "snapshots"), 1);
    ck_assert_str_eq(json_string_value(json_object_get(a, "committed_snapshot_version")), v1);
    json_decref(s);
    /* a second one within the interval -> SNAPSHOT_RATE_LIMITED with retry_after_ms */
    const char *const snap2[] = { NULL };
    r = call(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_snap(snap2))),
             "SNAPSHOT_RATE_LIMITED");
    const char *ra = json_string_value(json_object_get(r, "retry_after_ms"));
    ck_assert_ptr_nonnull(ra);
    long retry = atol(ra);
    ck_assert_int_gt(retry, 0);
    ck_assert_int_le(retry, atol(interval) * 1000);
    ck_assert_str_eq(json_string_value(json_object_get(r, "committed_snapshot_version")), v1);
    json_decref(r);
    /* ADD/DELETE are not rate limited; state unchanged by the refused snapshot */
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("6", "hbm"))), "OK");
    s = kvcmctl_state(&k, false);
    a = kvcmctl_reporter(s, INST, L1, HOST_A);
    ck_assert_str_eq(keys_on(a, "hbm", buf, sizeof buf), "3,4,6");
    ck_assert_int_eq(ifield(a, "snapshot_rate_limited"), 1);
    json_decref(s);
    /* after retry_after_ms it is accepted; an empty snapshot empties the host */
    simctl_sleep_ms((unsigned)retry + 50);
    r = call(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_snap(snap2))), "OK");
    ck_assert_str_ne(json_string_value(json_object_get(r, "committed_snapshot_version")), v1);
    json_decref(r);
    s = kvcmctl_state(&k, false);
    a = kvcmctl_reporter(s, INST, L1, HOST_A);
    ck_assert_int_eq(ifield(a, "block_count"), 0);
    ck_assert_int_eq(ifield(a, "snapshots"), 2);
    json_decref(s);
    /* the cooldown is per reporter */
    node_register(&k, HOST_B, L1);
    expect(&k, "reportEvent", report(HOST_B, L1, json_pack("[o]", ev_snap(snap1))), "OK");
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(host_down_rules)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    register_instance(&k);
    node_register(&k, HOST_A, L1);
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("1", "hbm"))), "OK");
    /* HOST_DOWN must be alone */
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o, o]", ev_down(), ev_hb("a", "b"))),
           "INVALID_ARGUMENT");
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o, o]", ev_add("2", "hbm"),
                                                          ev_down())), "INVALID_ARGUMENT");
    json_t *s = kvcmctl_state(&k, false);
    json_t *a = kvcmctl_reporter(s, INST, L1, HOST_A);
    ck_assert(json_is_true(json_object_get(a, "registered")));
    ck_assert_int_eq(ifield(a, "block_count"), 1);
    json_decref(s);
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_down())), "OK");
    s = kvcmctl_state(&k, false);
    a = kvcmctl_reporter(s, INST, L1, HOST_A);
    ck_assert(json_is_false(json_object_get(a, "registered")));
    ck_assert_int_eq(ifield(a, "block_count"), 0);
    ck_assert_int_eq(ifield(json_object_get(a, "events"), "EVENT_HOST_DOWN"), 1);
    json_decref(s);
    /* the host no longer holds anything */
    json_t *r = call(&k, "getHostCacheState",
                     json_pack("{s:s, s:s, s:[s]}", "instance_id", INST, "query_type",
                               "QT_PREFIX_MATCH", "block_cache_keys", "1"), "OK");
    ck_assert_uint_eq(json_array_size(json_object_get(r, "hosts")), 0);
    json_decref(r);
    /* until it registers again: data, heartbeats, another HOST_DOWN -> NODE_NOT_REGISTERED */
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("1", "hbm"))),
           "NODE_NOT_REGISTERED");
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_hb("a", "b"))),
           "NODE_NOT_REGISTERED");
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_down())),
           "NODE_NOT_REGISTERED");
    node_register(&k, HOST_A, L1);
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("1", "hbm"))), "OK");
    s = kvcmctl_state(&k, false);
    a = kvcmctl_reporter(s, INST, L1, HOST_A);
    ck_assert(json_is_true(json_object_get(a, "registered")));
    ck_assert_int_eq(ifield(a, "registrations"), 2);
    ck_assert_int_eq(ifield(a, "block_count"), 1);
    json_decref(s);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* One request that does not coalesce per key: key 1 added then deleted, key 2 deleted then
 * added, key 3 on two media with the dram copy deleted, key 4 plain. */
static json_t *uncoalesced_events(void)
{
    return json_pack("[o, o, o, o, o, o, o, o]", ev_add("1", "hbm"), ev_del("1", "hbm"),
                     ev_del("2", "hbm"), ev_add("2", "hbm"), ev_add("3", "hbm"),
                     ev_add("3", "dram"), ev_del("3", "dram"), ev_add("4", "hbm"));
}

START_TEST(last_op_wins_within_a_request)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    register_instance(&k);
    node_register(&k, HOST_A, L1);
    expect(&k, "reportEvent", report(HOST_A, L1, uncoalesced_events()), "OK");
    json_t *s = kvcmctl_state(&k, false);
    json_t *a = kvcmctl_reporter(s, INST, L1, HOST_A);
    char buf[128];
    ck_assert_str_eq(keys_on(a, "hbm", buf, sizeof buf), "2,3,4");
    ck_assert_str_eq(keys_on(a, "dram", buf, sizeof buf), "");
    ck_assert_int_eq(ifield(a, "uncoalesced_requests"), 1);   /* the publisher's mistake */
    json_decref(s);
    /* a coalesced request is not counted */
    expect(&k, "reportEvent",
           report(HOST_A, L1, json_pack("[o, o]", ev_add("5", "hbm"), ev_add("5", "dram"))),
           "OK");
    s = kvcmctl_state(&k, true);
    a = kvcmctl_reporter(s, INST, L1, HOST_A);
    ck_assert_int_eq(ifield(a, "uncoalesced_requests"), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(
                         json_object_get(a, "block_specs"), "dram"), "5"), SPEC)),
                     "rtp-llm://" HOST_A "/dram?size=4096");
    json_decref(s);
    kvcmctl_stop_ok(&k);

    /* an older server (--legacy-order) applies ADDs before DELETEs: key 2 ends up deleted */
    sim_start(&k, (const char *const[]){ "--legacy-order", NULL });
    register_instance(&k);
    node_register(&k, HOST_A, L1);
    expect(&k, "reportEvent", report(HOST_A, L1, uncoalesced_events()), "OK");
    s = kvcmctl_state(&k, false);
    ck_assert_str_eq(keys_on(kvcmctl_reporter(s, INST, L1, HOST_A), "hbm", buf, sizeof buf),
                     "3,4");
    json_decref(s);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- tests: leader / follower --------------------------------------------------------------- */

START_TEST(follower_and_cluster_info)
{
    struct kvcmctl l, f;
    sim_start(&l, (const char *const[]){ "--leader", "--rpc-port", "6381", NULL });
    char follow[160];
    snprintf(follow, sizeof follow, "%s/", l.base);
    sim_start(&f, (const char *const[]){ "--follower-of", follow, NULL });
    const char *lport = strrchr(l.http, ':') + 1;

    /* the leader names itself */
    json_t *r = call(&l, "getClusterInfo", json_pack("{s:s, s:s}", "trace_id", "c1",
                                                     "instance_id", ""), "OK");
    ck_assert_str_eq(json_string_value(json_object_get(r, "self_node_id")), l.http);
    ck_assert_str_eq(json_string_value(json_object_get(r, "leader_node_id")), l.http);
    json_t *ep = json_object_get(r, "leader_endpoint");
    ck_assert_str_eq(json_string_value(json_object_get(ep, "host")), "127.0.0.1");
    ck_assert_int_eq(ifield(ep, "meta_http_port"), atoi(lport));
    ck_assert_int_eq(ifield(ep, "meta_rpc_port"), 6381);
    json_decref(r);

    /* the follower names the leader and refuses everything else */
    r = call(&f, "getClusterInfo", json_pack("{s:s, s:s}", "trace_id", "c2", "instance_id", ""),
             "OK");
    ck_assert_str_eq(json_string_value(json_object_get(r, "self_node_id")), f.http);
    ck_assert_str_eq(json_string_value(json_object_get(r, "leader_node_id")), l.http);
    ep = json_object_get(r, "leader_endpoint");
    ck_assert_str_eq(json_string_value(json_object_get(ep, "host")), "127.0.0.1");
    ck_assert_int_eq(ifield(ep, "meta_http_port"), atoi(lport));
    json_decref(r);
    expect(&f, "registerInstance", reg_body(INST, 16, "fp16"), "SERVER_NOT_LEADER");
    expect(&f, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_register())),
           "SERVER_NOT_LEADER");
    expect(&f, "reportEvent", report(HOST_A, L1, json_array()), "SERVER_NOT_LEADER");
    expect(&f, "getHostCacheState",
           json_pack("{s:s, s:s, s:[s]}", "instance_id", INST, "query_type", "QT_PREFIX_MATCH",
                     "block_cache_keys", "1"), "SERVER_NOT_LEADER");
    json_t *s = kvcmctl_state(&f, false);
    ck_assert(json_is_false(json_object_get(s, "leader")));
    ck_assert_uint_eq(json_object_size(json_object_get(s, "instances")), 0);
    json_decref(s);

    /* at run time: another leader endpoint, then a failover to the follower */
    json_decref(kvcmctl_control(&f, "{\"leader_endpoint\":\"10.1.2.3:6382\"}"));
    r = call(&f, "getClusterInfo", json_object(), "OK");
    ep = json_object_get(r, "leader_endpoint");
    ck_assert_str_eq(json_string_value(json_object_get(ep, "host")), "10.1.2.3");
    ck_assert_int_eq(ifield(ep, "meta_http_port"), 6382);
    ck_assert_str_eq(json_string_value(json_object_get(r, "leader_node_id")), "10.1.2.3:6382");
    json_decref(r);
    json_decref(kvcmctl_control(&f, "{\"leader\":true}"));
    expect(&f, "registerInstance", reg_body(INST, 16, "fp16"), "OK");
    json_decref(kvcmctl_control(&l, "{\"follower_of\":\"http://127.0.0.1:1\"}"));
    expect(&l, "registerInstance", reg_body(INST, 16, "fp16"), "SERVER_NOT_LEADER");
    kvcmctl_stop_ok(&f);
    kvcmctl_stop_ok(&l);
}
END_TEST

/* ---- tests: getHostCacheState --------------------------------------------------------------- */

static json_t *hcs(const char *const *keys, const char *medium)
{
    json_t *ka = json_array();
    for (; *keys; keys++)
        json_array_append_new(ka, json_string(*keys));
    json_t *b = json_pack("{s:s, s:s, s:s, s:o}", "trace_id", "q", "instance_id", INST,
                          "query_type", "QT_PREFIX_MATCH", "block_cache_keys", ka);
    if (medium)
        json_object_set_new(b, "medium", json_pack("[s]", medium));
    return b;
}

/* "host=local/p2p_1_fetch/p2p_1_total_match;..." of a reply */
static const char *hosts_str(json_t *r, char *buf, size_t cap)
{
    buf[0] = '\0';
    size_t i, off = 0;
    json_t *h;
    json_array_foreach(json_object_get(r, "hosts"), i, h)
        off += (size_t)snprintf(buf + off, cap - off, "%s%s=%s/%s/%s", i ? ";" : "",
                                json_string_value(json_object_get(h, "host_ip_port")),
                                json_string_value(json_object_get(h, "local")),
                                json_string_value(json_object_get(h, "p2p_1_fetch")),
                                json_string_value(json_object_get(h, "p2p_1_total_match")));
    return buf;
}

START_TEST(host_cache_state_counts)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    register_instance(&k);
    node_register(&k, HOST_A, L1);
    node_register(&k, HOST_B, L2);
    node_register(&k, HOST_C, L1);
    expect(&k, "reportEvent",
           report(HOST_A, L1, json_pack("[o, o, o, o]", ev_add("1", "hbm"), ev_add("2", "hbm"),
                                        ev_add("3", "hbm"), ev_add("4", "dram"))), "OK");
    expect(&k, "reportEvent",
           report(HOST_B, L2, json_pack("[o, o]", ev_add("1", "hbm"), ev_add("2", "dram"))),
           "OK");
    expect(&k, "reportEvent",   /* C lacks key 1: a count of 0, omitted */
           report(HOST_C, L1, json_pack("[o, o]", ev_add("2", "hbm"), ev_add("3", "hbm"))),
           "OK");
    const char *const keys[] = { "1", "2", "3", "4", "5", NULL };
    char buf[256];
    json_t *r = call(&k, "getHostCacheState", hcs(keys, NULL), "OK");
    ck_assert_str_eq(hosts_str(r, buf, sizeof buf),
                     HOST_A "=4/0/4;" HOST_B "=2/0/2");
    json_decref(r);
    r = call(&k, "getHostCacheState", hcs(keys, "hbm"), "OK");
    ck_assert_str_eq(hosts_str(r, buf, sizeof buf), HOST_A "=3/0/3;" HOST_B "=1/0/1");
    json_decref(r);
    /* a host's reporters of both storage types count together */
    node_register(&k, HOST_A, L2);
    expect(&k, "reportEvent", report(HOST_A, L2, json_pack("[o]", ev_add("5", "hbm"))), "OK");
    r = call(&k, "getHostCacheState", hcs(keys, NULL), "OK");
    ck_assert_str_eq(hosts_str(r, buf, sizeof buf), HOST_A "=5/0/5;" HOST_B "=2/0/2");
    json_decref(r);
    /* keys as JSON numbers; no keys; the query types */
    r = call(&k, "getHostCacheState",
             json_pack("{s:s, s:s, s:[i, i]}", "instance_id", INST, "query_type",
                       "QT_PREFIX_MATCH", "block_cache_keys", 1, 2), "OK");
    ck_assert_str_eq(hosts_str(r, buf, sizeof buf), HOST_A "=2/0/2;" HOST_B "=2/0/2");
    json_decref(r);
    const char *const none[] = { NULL };
    r = call(&k, "getHostCacheState", hcs(none, NULL), "OK");
    ck_assert(json_is_array(json_object_get(r, "hosts")));
    ck_assert_uint_eq(json_array_size(json_object_get(r, "hosts")), 0);
    json_decref(r);
    json_t *b = hcs(keys, NULL);
    json_object_set_new(b, "query_type", json_string("QT_BATCH_GET"));
    expect(&k, "getHostCacheState", b, "UNSUPPORTED");
    b = hcs(keys, NULL);
    json_object_del(b, "query_type");
    expect(&k, "getHostCacheState", b, "INVALID_ARGUMENT");
    b = hcs(keys, NULL);
    json_object_set_new(b, "query_type", json_integer(2));
    expect(&k, "getHostCacheState", b, "OK");
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- tests: fault injection ----------------------------------------------------------------- */

START_TEST(fault_injection)
{
    struct kvcmctl k;
    bool vg = simctl_under_valgrind();
    /* from the command line: the first call fails */
    sim_start(&k, (const char *const[]){ "--fail-status", "SERVICE_NOT_READY", "--fail-count",
                                         "1", NULL });
    expect(&k, "getClusterInfo", json_object(), "SERVICE_NOT_READY");
    expect(&k, "getClusterInfo", json_object(), "OK");
    register_instance(&k);

    /* fail_status on one RPC, N times, not applied, with retry_after_ms */
    json_t *c = kvcmctl_control(&k, "{\"fail_status\":\"INTERNAL_ERROR\",\"fail_count\":2,"
                                    "\"fail_only\":\"reportEvent\",\"retry_after_ms\":250}");
    ck_assert_str_eq(json_string_value(json_object_get(c, "fail_status")), "INTERNAL_ERROR");
    json_decref(c);
    expect(&k, "getClusterInfo", json_object(), "OK");
    for (int i = 0; i < 2; i++) {
        json_t *r = call(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_register())),
                         "INTERNAL_ERROR");
        ck_assert_str_eq(json_string_value(json_object_get(r, "retry_after_ms")), "250");
        json_decref(r);
    }
    json_t *s = kvcmctl_state(&k, false);
    ck_assert_ptr_null(kvcmctl_reporter(s, INST, L1, HOST_A));   /* nothing applied */
    json_decref(s);
    node_register(&k, HOST_A, L1);                               /* the count ran out */
    c = kvcmctl_control(&k, "{}");
    ck_assert(json_is_null(json_object_get(c, "fail_status")));
    json_decref(c);

    /* delay on one RPC */
    json_decref(kvcmctl_control(&k, "{\"delay_ms\":400,\"delay_only\":\"reportEvent\"}"));
    uint64_t t0 = simctl_now_ms();
    expect(&k, "getClusterInfo", json_object(), "OK");
    if (!vg)
        ck_assert_uint_lt(simctl_now_ms() - t0, 390);
    t0 = simctl_now_ms();
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_hb("a", "b"))), "OK");
    ck_assert_uint_ge(simctl_now_ms() - t0, 390);
    /* a client that gives up early leaves the simulator healthy */
    ck_assert_int_eq(http(&k, "POST", "/api/reportEvent", "{}", 100, NULL), -1);
    /* delay only snapshots: other reports pass at once */
    json_decref(kvcmctl_control(&k, "{\"delay_ms\":400,\"delay_only\":\"snapshot\"}"));
    t0 = simctl_now_ms();
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_hb("a", "b"))), "OK");
    if (!vg)
        ck_assert_uint_lt(simctl_now_ms() - t0, 390);
    const char *const snap0[] = { "9@hbm", NULL };
    t0 = simctl_now_ms();
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_snap(snap0))), "OK");
    ck_assert_uint_ge(simctl_now_ms() - t0, 390);
    json_decref(kvcmctl_control(&k, "{\"delay_ms\":0}"));

    /* transport status */
    json_decref(kvcmctl_control(&k, "{\"http_status\":503}"));
    ck_assert_int_eq(rpc(&k, "getClusterInfo", json_object(), NULL), 503);
    json_decref(kvcmctl_control(&k, "{\"http_status\":0}"));
    expect(&k, "getClusterInfo", json_object(), "OK");

    /* garbage: handled, but the reply is not JSON */
    json_decref(kvcmctl_control(&k, "{\"garbage\":true}"));
    char *out = NULL;
    ck_assert_int_eq(http(&k, "POST", "/api/getClusterInfo", "{}", 30000, &out), 200);
    ck_assert_uint_gt(strlen(out), 0);
    ck_assert_ptr_null(json_loads(out, 0, NULL));
    free(out);
    json_decref(kvcmctl_control(&k, "{\"garbage\":false}"));

    /* down: connections closed unanswered; the control plane still answers */
    json_decref(kvcmctl_control(&k, "{\"down\":true}"));
    ck_assert_int_eq(rpc(&k, "getClusterInfo", json_object(), NULL), -1);
    ck_assert_int_eq(rpc(&k, "reportEvent", report(HOST_A, L1, json_array()), NULL), -1);
    json_decref(kvcmctl_control(&k, "{\"down\":false}"));
    expect(&k, "getClusterInfo", json_object(), "OK");

    /* snapshot_required: data refused until the reporter sends a snapshot */
    json_decref(kvcmctl_control(&k, "{\"snapshot_required\":true,\"snapshot_interval_s\":0}"));
    json_t *r = call(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("1", "hbm"))),
                     "SNAPSHOT_REQUIRED");
    ck_assert(json_is_true(json_object_get(r, "snapshot_required")));
    json_decref(r);
    r = call(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_hb("a", "b"))), "OK");
    ck_assert(json_is_true(json_object_get(r, "snapshot_required")));
    json_decref(r);
    const char *const snap[] = { "1@hbm", NULL };
    r = call(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_snap(snap))), "OK");
    ck_assert(json_is_false(json_object_get(r, "snapshot_required")));
    json_decref(r);
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("2", "hbm"))), "OK");
    /* ... and again after each registration while it is on */
    node_register(&k, HOST_A, L1);
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("3", "hbm"))),
           "SNAPSHOT_REQUIRED");
    json_decref(kvcmctl_control(&k, "{\"snapshot_required\":false}"));
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_add("3", "hbm"))), "OK");

    /* bad control requests change nothing */
    const char *bad[] = { "{\"bogus\":1}", "{\"fail_status\":\"NOPE\"}",
                          "{\"delay_only\":\"nope\"}", "{\"delay_ms\":-1}",
                          "{\"http_status\":42}", "{\"leader\":\"yes\"}", "[1]", "nope",
                          "{\"delay_ms\":5,\"down\":7}", NULL };
    for (int i = 0; bad[i]; i++)
        ck_assert_msg(kvcmctl_http(&k, "POST", "/control", bad[i], NULL) == 400, "%s", bad[i]);
    c = kvcmctl_get_json(&k, "/control");
    ck_assert_int_eq(ifield(c, "delay_ms"), 0);
    ck_assert(json_is_false(json_object_get(c, "down")));
    json_decref(c);

    /* the record shows what was injected */
    json_t *rec = kvcmctl_recorded(&k, 0);
    size_t i, n_down = 0, n_fail = 0, n_delay = 0, n_garbage = 0, n_http = 0;
    json_t *e;
    json_array_foreach(rec, i, e) {
        const char *inj = json_string_value(json_object_get(e, "injected"));
        if (!inj)
            continue;
        n_down += strcmp(inj, "down") == 0;
        n_fail += strcmp(inj, "fail_status") == 0;
        n_delay += strcmp(inj, "delay") == 0;
        n_garbage += strcmp(inj, "garbage") == 0;
        n_http += strcmp(inj, "http_status") == 0;
    }
    ck_assert_uint_eq(n_down, 2);
    ck_assert_uint_eq(n_fail, 3);
    ck_assert_uint_eq(n_delay, 3);
    ck_assert_uint_eq(n_garbage, 1);
    ck_assert_uint_eq(n_http, 1);
    json_decref(rec);

    /* stop while a delayed request is pending: still a clean exit */
    json_decref(kvcmctl_control(&k, "{\"delay_ms\":5000,\"delay_only\":null}"));
    ck_assert_int_eq(http(&k, "POST", "/api/getClusterInfo", "{}", 100, NULL), -1);
    kvcmctl_stop_ok(&k);
}
END_TEST

/* ---- tests: recording, reset, HTTP edges, arguments ----------------------------------------- */

START_TEST(recorded_in_order)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    expect(&k, "getClusterInfo", json_pack("{s:s, s:s}", "trace_id", "r0", "instance_id", ""),
           "OK");
    register_instance(&k);
    node_register(&k, HOST_A, L1);
    expect(&k, "reportEvent",
           report(HOST_A, L1, json_pack("[o, o]", ev_add("11", "hbm"), ev_del("10", "hbm"))),
           "OK");
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_hb("queue", "3"))), "OK");
    const char *const snap[] = { "11@hbm", "12@dram", NULL };
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_snap(snap))), "OK");
    const char *const keys[] = { "11", "12", NULL };
    expect(&k, "getHostCacheState", hcs(keys, NULL), "OK");
    expect(&k, "reportEvent", report(HOST_A, L1, json_pack("[o]", ev_down())), "OK");
    ck_assert_int_eq(rpc(&k, "noSuchRpc", json_object(), NULL), 404);

    const char *want_rpc[] = { "getClusterInfo", "registerInstance", "reportEvent",
                               "reportEvent", "reportEvent", "reportEvent",
                               "getHostCacheState", "reportEvent", "noSuchRpc" };
    const char *want_first_event[] = { NULL, NULL, "EVENT_NODE_REGISTER", "EVENT_BLOCK_ADD",
                                       "EVENT_HEARTBEAT", "EVENT_BLOCK_SNAPSHOT", NULL,
                                       "EVENT_HOST_DOWN", NULL };
    json_t *rec = kvcmctl_recorded(&k, 0);
    if (getenv("KVCM_SIM_DUMP")) {
        char *d = json_dumps(rec, JSON_INDENT(1));
        printf("%s\n", d);
        free(d);
    }
    size_t n = sizeof want_rpc / sizeof want_rpc[0];
    ck_assert_uint_eq(json_array_size(rec), n);
    json_int_t last_t = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(rec, i);
        ck_assert_int_eq(ifield(e, "seq"), (json_int_t)i);
        ck_assert_str_eq(json_string_value(json_object_get(e, "rpc")), want_rpc[i]);
        ck_assert_str_eq(json_string_value(json_object_get(e, "method")), "POST");
        ck_assert_str_eq(json_string_value(json_object_get(e, "content_type")),
                         "application/json");
        ck_assert_int_ge(ifield(e, "t_ms"), last_t);
        last_t = ifield(e, "t_ms");
        ck_assert_int_gt(ifield(e, "unix_ms"), 0);
        ck_assert_int_eq(ifield(e, "http_status"), i + 1 < n ? 200 : 404);
        if (i + 1 < n) {
            ck_assert_str_eq(json_string_value(json_object_get(e, "status")), "OK");
            ck_assert_str_eq(code_of(json_object_get(e, "response")), "OK");
        }
        if (want_first_event[i]) {
            json_t *ev0 = json_array_get(json_object_get(json_object_get(e, "body"), "events"), 0);
            ck_assert_str_eq(json_string_value(json_object_get(ev0, "event_type")),
                             want_first_event[i]);
        }
    }
    /* the body is the request as sent */
    json_t *add = json_object_get(json_array_get(rec, 3), "body");
    ck_assert_str_eq(json_string_value(json_object_get(add, "host_ip_port")), HOST_A);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(
                         json_object_get(add, "events"), 1), "block_delete"), "block_key")), "10");
    json_decref(rec);
    /* filters */
    rec = kvcmctl_recorded(&k, 7);
    ck_assert_uint_eq(json_array_size(rec), 2);
    ck_assert_int_eq(ifield(json_array_get(rec, 0), "seq"), 7);
    json_decref(rec);
    rec = kvcmctl_get_json(&k, "/recorded?rpc=reportEvent");
    ck_assert_uint_eq(json_array_size(rec), 5);
    json_decref(rec);
    /* a body that is not JSON is kept raw */
    ck_assert_int_eq(http(&k, "POST", "/api/reportEvent", "not json\x01", 30000, NULL), 200);
    rec = kvcmctl_recorded(&k, 9);
    ck_assert(json_is_null(json_object_get(json_array_get(rec, 0), "body")));
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(rec, 0), "raw")),
                     "not json?");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(rec, 0), "status")),
                     "INVALID_ARGUMENT");
    json_decref(rec);

    /* reset forgets everything */
    ck_assert_int_eq(kvcmctl_http(&k, "POST", "/reset", "", NULL), 200);
    rec = kvcmctl_recorded(&k, 0);
    ck_assert_uint_eq(json_array_size(rec), 0);
    json_decref(rec);
    json_t *s = kvcmctl_state(&k, false);
    ck_assert_uint_eq(json_object_size(json_object_get(s, "instances")), 0);
    ck_assert_uint_eq(json_object_size(json_object_get(s, "reporters")), 0);
    json_decref(s);
    expect(&k, "reportEvent", report(HOST_A, L1, json_array()), "INSTANCE_NOT_EXIST");
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(record_max_keeps_the_newest)
{
    struct kvcmctl k;
    sim_start(&k, (const char *const[]){ "--record-max", "3", NULL });
    for (int i = 0; i < 5; i++)
        expect(&k, "getClusterInfo", json_object(), "OK");
    json_t *rec = kvcmctl_recorded(&k, 0);
    ck_assert_uint_eq(json_array_size(rec), 3);
    ck_assert_int_eq(ifield(json_array_get(rec, 0), "seq"), 2);
    json_decref(rec);
    json_t *s = kvcmctl_state(&k, false);
    ck_assert_int_eq(ifield(s, "recorded_dropped"), 2);
    json_decref(s);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(http_edges)
{
    struct kvcmctl k;
    sim_start(&k, NULL);
    ck_assert_int_eq(rpc(&k, "getCacheLocation", json_object(), NULL), 404);
    ck_assert_int_eq(http(&k, "GET", "/api/reportEvent", NULL, 30000, NULL), 405);
    ck_assert_int_eq(http(&k, "GET", "/nope", NULL, 30000, NULL), 404);
    ck_assert_int_eq(http(&k, "POST", "/state", "{}", 30000, NULL), 405);
    /* a body over 64 MiB is refused on its Content-Length, before it is read */
    const char *big = "POST /api/reportEvent HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: 67108865\r\n\r\n{";
    char *resp = NULL;
    ck_assert_int_gt(kvcmctl_exchange(&k, big, strlen(big), &resp, 30000), 0);
    int st = 0;
    ck_assert_int_eq(sscanf(resp, "HTTP/1.%*d %d", &st), 1);
    ck_assert_int_eq(st, 413);
    free(resp);
    /* the simulator is still fine */
    expect(&k, "getClusterInfo", json_object(), "OK");
    /* a body that is not an object */
    ck_assert_int_eq(http(&k, "POST", "/api/registerInstance", "[1,2]", 30000, &resp), 200);
    json_t *r = json_loads(resp, 0, NULL);
    ck_assert_str_eq(code_of(r), "INVALID_ARGUMENT");
    json_decref(r);
    free(resp);
    kvcmctl_stop_ok(&k);
}
END_TEST

START_TEST(bad_arguments_exit_2)
{
    char binbuf[512];
    const char *bin = kvcmctl_bin(binbuf, sizeof binbuf);
    const char *const argvs[][6] = {
        { bin, "--http", "nocolon", NULL },
        { bin, "--follower-of", "nourl", NULL },
        { bin, "--leader", "--follower-of", "http://127.0.0.1:1", NULL },
        { bin, "--leader-endpoint", "host:0", NULL },
        { bin, "--fail-status", "NOPE", NULL },
        { bin, "--snapshot-interval-s", "-1", NULL },
        { bin, "--delay-only", "nope", NULL },
        { bin, "--bogus", NULL },
        { bin, "stray", NULL },
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
    Suite *s = suite_create("kvcm_sim");
    TCase *t = tcase_create("protocol");
    tcase_set_timeout(t, simctl_under_valgrind() ? 300 : 60);
    tcase_add_test(t, register_idempotent_and_duplicate);
    tcase_add_test(t, report_unknown_instance);
    tcase_add_test(t, node_register_required);
    tcase_add_test(t, invalid_arguments);
    tcase_add_test(t, snapshot_rules);
    tcase_add_test(t, host_down_rules);
    tcase_add_test(t, last_op_wins_within_a_request);
    tcase_add_test(t, follower_and_cluster_info);
    tcase_add_test(t, host_cache_state_counts);
    suite_add_tcase(s, t);
    TCase *f = tcase_create("sim");
    tcase_set_timeout(f, simctl_under_valgrind() ? 300 : 60);
    tcase_add_test(f, fault_injection);
    tcase_add_test(f, recorded_in_order);
    tcase_add_test(f, record_max_keeps_the_newest);
    tcase_add_test(f, http_edges);
    tcase_add_test(f, bad_arguments_exit_2);
    suite_add_tcase(s, f);
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
