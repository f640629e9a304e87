/* kvcm-sim: a protocol-true simulator of the Tair KVCache Manager (KVCM) meta service as
 * kvnode's KVCM publisher and query paths speak to it (docs/PROTOCOLS.md §2): HTTP/JSON,
 * one process, one libevent loop, all state in memory.
 *
 * RPCs: POST /api/<rpc>, body and reply in the protobuf JSON mapping (snake_case names, enums
 * by name, int64 as strings; on input enums may also be numbers, int64 also JSON numbers,
 * unknown fields are ignored, null means "absent"). Transport status is 200 unless a fault
 * says otherwise; the outcome is header.status.code (the enum NAME) with header.status.message.
 * Replies print every field, defaults included (as the real server does). Any other /api/ name
 * -> HTTP 404, another method -> 405, a body over 64 MiB -> 413 (refused before it is read).
 *
 *   registerInstance  instance_id (non-empty), block_size > 0, location_spec_infos (non-empty,
 *                     unique non-empty names, size > 0), location_spec_groups (names known),
 *                     model_deployment. Identical info again -> OK (trace_id and
 *                     model_deployment.user_data do not count); different -> DUPLICATE_ENTITY.
 *   reportEvent       instance_id, host_ip_port, storage_type (ST_EVENT_REPORT_L1P5 | _L2),
 *                     events[]. Reporter identity = instance_id + storage_type + host_ip_port.
 *                     Checked in this order; nothing is applied unless all pass:
 *                     INVALID_ARGUMENT: instance_id or host_ip_port missing, `#` in
 *                       host_ip_port, storage_type missing or not an event-report type, events
 *                       not an array.
 *                     INSTANCE_NOT_EXIST: instance_id never registered.
 *                     OK, a no-op: empty events (registered or not).
 *                     INVALID_ARGUMENT: an EventItem without the payload object of its
 *                       event_type (even if empty), or with a second payload; EVENT_UNSPECIFIED
 *                       or an unknown type; a bad block_key (int64 decimal); an empty medium or
 *                       `#` in one; BLOCK_ADD / snapshot item without specs, with a spec name
 *                       the instance did not register, or a URI carrying "s_version=" (the
 *                       server appends it); BLOCK_DELETE with empty or unregistered spec_names;
 *                       a snapshot or a HOST_DOWN not alone in its request.
 *                     NODE_NOT_REGISTERED: any event but NODE_REGISTER (ADD, DELETE, HEARTBEAT,
 *                       SNAPSHOT, HOST_DOWN) from a reporter that has not sent NODE_REGISTER, or
 *                       has sent HOST_DOWN since (a NODE_REGISTER earlier in the same request
 *                       counts).
 *                     SNAPSHOT_REQUIRED (+ snapshot_required=true): ADD/DELETE while the
 *                       snapshot_required fault asks this reporter for a snapshot.
 *                     SNAPSHOT_RATE_LIMITED (+ retry_after_ms): a snapshot less than
 *                       --snapshot-interval-s after this reporter's last successful one (failed
 *                       snapshots do not start the cooldown; HOST_DOWN does not end it).
 *                     Applying: events in order, so within one request the last operation per
 *                     (key, medium, spec) wins (--legacy-order: all other events first, then all
 *                     DELETEs, as older servers did). BLOCK_ADD merges specs into (key, medium);
 *                     BLOCK_DELETE removes spec names (a location without specs disappears); a
 *                     snapshot replaces the reporter's whole state (all media); HEARTBEAT stores
 *                     the time and system_status (data events do not refresh it); HOST_DOWN
 *                     unregisters the reporter and drops its blocks. NODE_REGISTER merges mediums.
 *                     Reply: header, item_results [], extra_info "", committed_snapshot_version
 *                     (this reporter's last committed snapshot token, "" before any),
 *                     retry_after_ms, snapshot_required.
 *   getClusterInfo    any node answers: self_node_id, leader_node_id,
 *                     leader_endpoint {node_id, host, meta_rpc_port, meta_http_port}.
 *   getHostCacheState query_type must be QT_PREFIX_MATCH (UNSPECIFIED -> INVALID_ARGUMENT,
 *                     others UNSUPPORTED); block_cache_keys (ordered int64); medium [] (empty:
 *                     any medium). hosts [{host_ip_port, local, p2p_1_fetch, p2p_1_total_match}]
 *                     (int64 as strings): per host_ip_port of the instance (any storage type),
 *                     the run of keys it holds from key 0 to its first miss; 0 omitted; sorted
 *                     by count, then host. No P2P here: p2p_1_fetch "0", p2p_1_total_match=local.
 *   On a follower every RPC but getClusterInfo answers SERVER_NOT_LEADER.
 *
 * Simulator-only endpoints (never subject to faults):
 *   GET  /state      {leader, instances {id: registered info}, reporters {"<instance_id>#
 *                    <storage_type>#<host_ip_port>": {instance_id, storage_type, host_ip_port,
 *                    registered, mediums, blocks {medium: [keys as strings, numerically
 *                    sorted]}, block_count, heartbeats, last_heartbeat_t_ms (the clock of
 *                    /recorded's t_ms) and last_heartbeat_age_ms (both -1: never),
 *                    system_status (of the last heartbeat), events {type: applied count},
 *                    snapshots, snapshot_rate_limited, committed_snapshot_version,
 *                    snapshot_required, requests, rejected {code: n}, uncoalesced_requests
 *                    (requests naming one (key, medium) more than once), registrations}},
 *                    recorded (requests so far), recorded_dropped (past --record-max)}.
 *                    GET /state?specs=1 adds block_specs {medium: {key: {spec: uri}}}.
 *   GET  /recorded   JSON array, arrival order, of every /api/ request: {seq, rpc, method,
 *                    t_ms (since start), unix_ms, content_type, body (parsed JSON, or null and
 *                    raw: its first 4 KiB when not JSON), status (code name answered, or null),
 *                    http_status, injected (fault applied, if any), response}. ?since=SEQ keeps
 *                    seq >= SEQ; ?rpc=NAME one RPC. Entries are filled in when answered (a
 *                    delayed one shows status null until then). At most --record-max kept.
 *   GET  /control    the current fault and leader settings.
 *   POST /control    change them: a JSON object with any of
 *                      delay_ms N            hold matching requests N ms before handling them
 *                      delay_only "rpc"      only this RPC is delayed ("" / null: all);
 *                                            "snapshot": only reportEvent requests carrying
 *                                            an EVENT_BLOCK_SNAPSHOT (heartbeats and other
 *                                            reports pass undelayed)
 *                      fail_status "NAME"    answer matching requests with this code (a name or
 *                                            number) without applying them ("OK" = a lost
 *                                            write); "" / null clears
 *                      fail_count N          only the next N matching requests fail, then
 *                                            fail_status / http_status clear (0: until changed)
 *                      fail_only "rpc"       only this RPC fails ("" / null: all)
 *                      http_status N         answer matching requests with transport status N
 *                                            (and a non-KVCM body); 0 clears
 *                      retry_after_ms N      retry_after_ms on injected failures, and instead
 *                                            of the computed one on SNAPSHOT_RATE_LIMITED
 *                      garbage true          requests are handled, the reply body is not JSON
 *                      down true             every /api/ connection is closed unanswered
 *                      snapshot_required true every registered reporter (and each one that
 *                                            registers while it is on) must send a snapshot
 *                                            before ADD/DELETE; false clears
 *                      snapshot_interval_s S snapshot cooldown
 *                      legacy_order B        ADDs before DELETEs within a request
 *                      leader true | follower_of "URL" | leader_endpoint "HOST:PORT"
 *                    Unknown fields or bad values -> 400 and nothing changes. Answers 200 with
 *                    the new settings.
 *   POST /reset      forget instances, reporters and recordings; settings back to the options.
 *
 * Usage: kvcm-sim [--http 127.0.0.1:0] [--node-id ID] [--rpc-port N]
 *                 [--leader | --follower-of URL] [--leader-endpoint HOST:HTTPPORT]
 *                 [--snapshot-interval-s S (30)] [--legacy-order] [--record-max N (100000)]
 *                 [--delay-ms N [--delay-only RPC|snapshot]] [--fail-status NAME [--fail-count N]
 *                 [--fail-only RPC]] [--http-status N] [--retry-after-ms N] [--garbage] [--down]
 *                 [--snapshot-required]
 * The node id defaults to HOST:PORT as bound; a follower's leader endpoint comes from
 * --leader-endpoint, else from the --follower-of URL. Prints "http=HOST:PORT" on stdout once
 * bound. SIGTERM/SIGINT: clean exit 0. Bad arguments: exit 2. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <jansson.h>

#define KVCM_MAX_BODY    (64u << 20)   /* request body cap, refused before it is read */
#define KVCM_MAX_HEADERS (64u << 10)
#define KVCM_RAW_KEEP    4096u         /* recorded prefix of a body that is not JSON */

/* ------------------------------------------------------------------------- */
/* protocol enums */

enum code {
    C_UNSPECIFIED = 0, C_OK = 1, C_UNSUPPORTED = 2, C_INTERNAL_ERROR = 3,
    C_SERVICE_NOT_READY = 4, C_INVALID_ARGUMENT = 5, C_DUPLICATE_ENTITY = 6,
    C_REACH_MAX_ENTITY_CAPACITY = 7, C_INSTANCE_NOT_EXIST = 8, C_SERVER_NOT_LEADER = 9,
    C_NODE_NOT_REGISTERED = 10, C_SNAPSHOT_IN_PROGRESS = 11, C_SNAPSHOT_RATE_LIMITED = 13,
    C_SNAPSHOT_REQUIRED = 14, C_IO_ERROR = 20, C_UNKNOWN_ERROR = 100,
};

struct named { const char *name; int num; };

static const struct named CODES[] = {
    { "UNSPECIFIED", 0 }, { "OK", 1 }, { "UNSUPPORTED", 2 }, { "INTERNAL_ERROR", 3 },
    { "SERVICE_NOT_READY", 4 }, { "INVALID_ARGUMENT", 5 }, { "DUPLICATE_ENTITY", 6 },
    { "REACH_MAX_ENTITY_CAPACITY", 7 }, { "INSTANCE_NOT_EXIST", 8 },
    { "SERVER_NOT_LEADER", 9 }, { "NODE_NOT_REGISTERED", 10 },
    { "SNAPSHOT_IN_PROGRESS", 11 }, { "SNAPSHOT_RATE_LIMITED", 13 },
    { "SNAPSHOT_REQUIRED", 14 }, { "IO_ERROR", 20 }, { "UNKNOWN_ERROR", 100 },
    { "ERROR_MAX", 65535 }, { NULL, 0 },
};

enum evtype {
    EV_UNSPEC = 0, EV_NODE_REGISTER = 1, EV_BLOCK_ADD = 2, EV_BLOCK_DELETE = 3,
    EV_HOST_DOWN = 4, EV_HEARTBEAT = 5, EV_BLOCK_SNAPSHOT = 6, EV_COUNT = 7,
};

static const struct named EVENT_TYPES[] = {
    { "EVENT_UNSPECIFIED", 0 }, { "EVENT_NODE_REGISTER", 1 }, { "EVENT_BLOCK_ADD", 2 },
    { "EVENT_BLOCK_DELETE", 3 }, { "EVENT_HOST_DOWN", 4 }, { "EVENT_HEARTBEAT", 5 },
    { "EVENT_BLOCK_SNAPSHOT", 6 }, { NULL, 0 },
};

/* the oneof payload key of each event type */
static const char *const PAYLOAD[EV_COUNT] = {
    NULL, "node_register", "block_add", "block_delete", "host_down", "heartbeat",
    "block_snapshot",
};

static const struct named STORAGE_TYPES[] = {
    { "ST_UNSPECIFIED", 0 }, { "ST_3FS", 1 }, { "ST_MOONCAKE", 2 }, { "ST_TAIRMEMPOOL", 3 },
    { "ST_NFS", 4 }, { "ST_VCNS_3FS", 5 }, { "ST_DUMMY", 6 }, { "ST_EVENT_REPORT_L1P5", 7 },
    { "ST_EVENT_REPORT_L2", 8 }, { NULL, 0 },
};

static const struct named QUERY_TYPES[] = {
    { "QT_UNSPECIFIED", 0 }, { "QT_BATCH_GET", 1 }, { "QT_PREFIX_MATCH", 2 },
    { "QT_REVERSE_ROLL_SW_MATCH", 3 }, { "QT_PREFIX_MATCH_WITH_MAMBA", 4 }, { NULL, 0 },
};

static const char *enum_name(const struct named *t, int num)
{
    for (; t->name; t++)
        if (t->num == num)
            return t->name;
    return "UNKNOWN";
}

/* An enum value: its name, or its number (a JSON integer). */
static bool enum_parse(const struct named *t, json_t *v, int *out)
{
    for (const struct named *e = t; e->name; e++) {
        if ((json_is_string(v) && strcmp(json_string_value(v), e->name) == 0) ||
            (json_is_integer(v) && json_integer_value(v) == e->num)) {
            *out = e->num;
            return true;
        }
    }
    return false;
}

static const char *code_name(int c) { return enum_name(CODES, c); }

/* ------------------------------------------------------------------------- */
/* state */

struct spec { char *name, *uri; struct spec *next; };
struct med  { char *name; struct spec *specs; struct med *next; };
struct blk  { int64_t key; struct med *meds; struct blk *next; };
struct blkmap { struct blk **b; size_t nb, n; };

struct instance {
    char            *id;
    json_t          *info;           /* canonical registered info */
    struct instance *next;
};

struct reporter {
    char            *instance_id, *host;
    int              storage_type;
    bool             registered, need_snapshot, ever_snapshot;
    json_t          *mediums;        /* array of strings, in registration order */
    struct blkmap    blocks;
    uint64_t         last_hb_ms;     /* 0: never */
    uint64_t         heartbeats;
    json_t          *system_status;
    uint64_t         events[EV_COUNT];
    uint64_t         requests, snapshots, rate_limited, uncoalesced, registrations;
    uint64_t         last_snapshot_ms, snap_seq;
    char             version[64];
    json_t          *rejected;       /* {code name: count} */
    struct reporter *next;
};

struct faults {
    unsigned  delay_ms;
    char      delay_only[64];
    int       fail_status;           /* -1: none */
    unsigned  fail_count;            /* 0: until changed */
    char      fail_only[64];
    int       http_status;           /* 0: none */
    uint64_t  retry_after_ms;        /* 0: computed */
    bool      garbage, down, snapshot_required, legacy_order;
    double    snapshot_interval_s;
    bool      leader;
    char      leader_host[128];
    unsigned  leader_port;
};

struct call {                        /* an /api/ request being handled */
    struct evhttp_request *req;
    char                   rpc[64];
    json_t                *body;     /* NULL: not JSON */
    json_t                *rec;      /* its /recorded entry (own reference) */
    struct event          *ev;       /* delay timer */
    struct call           *prev, *next;
};

static struct {
    /* options */
    char          http_host[64];
    unsigned      http_port, bound_port, rpc_port;
    char          node_id[160];
    size_t        record_max;
    struct faults f0;                /* as given on the command line (restored by /reset) */
    /* runtime */
    struct faults f;
    struct event_base *base;
    struct evhttp     *http;
    struct event      *sigterm, *sigint;
    uint64_t           start_ms, boot_unix_ms;
    struct instance   *instances;
    struct reporter   *reporters;
    json_t            *recorded;
    uint64_t           rec_seq, rec_dropped;
    struct call       *pending;
} S;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "kvcm-sim: out of memory\n");
        abort();
    }
    return p;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xcalloc(1, n);
    memcpy(p, s, n);
    return p;
}

static json_t *jstr_i64(int64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, v);
    return json_string(b);
}

static json_t *jstr_u64(uint64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, v);
    return json_string(b);
}

/* ------------------------------------------------------------------------- */
/* blocks: key -> medium -> spec name -> uri */

static size_t bucket_of(int64_t k, size_t nb)
{
    uint64_t x = (uint64_t)k * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 29) & (nb - 1);
}

static struct blk *blk_find(struct blkmap *m, int64_t key)
{
    if (!m->nb)
        return NULL;
    for (struct blk *b = m->b[bucket_of(key, m->nb)]; b; b = b->next)
        if (b->key == key)
            return b;
    return NULL;
}

static void blkmap_grow(struct blkmap *m)
{
    size_t nb = m->nb ? m->nb * 2 : 64;
    struct blk **nbk = xcalloc(nb, sizeof *nbk);
    for (size_t i = 0; i < m->nb; i++) {
        struct blk *b = m->b[i];
        while (b) {
            struct blk *nx = b->next;
            size_t h = bucket_of(b->key, nb);
            b->next = nbk[h];
            nbk[h] = b;
            b = nx;
        }
    }
    free(m->b);
    m->b = nbk;
    m->nb = nb;
}

static struct blk *blk_get(struct blkmap *m, int64_t key)
{
    struct blk *b = blk_find(m, key);
    if (b)
        return b;
    if (m->n + 1 > m->nb)
        blkmap_grow(m);
    b = xcalloc(1, sizeof *b);
    b->key = key;
    size_t h = bucket_of(key, m->nb);
    b->next = m->b[h];
    m->b[h] = b;
    m->n++;
    return b;
}

static void spec_free_list(struct spec *s)
{
    while (s) {
        struct spec *nx = s->next;
        free(s->name);
        free(s->uri);
        free(s);
        s = nx;
    }
}

static void med_free_list(struct med *d)
{
    while (d) {
        struct med *nx = d->next;
        spec_free_list(d->specs);
        free(d->name);
        free(d);
        d = nx;
    }
}

static void blk_remove(struct blkmap *m, int64_t key)
{
    if (!m->nb)
        return;
    struct blk **pp = &m->b[bucket_of(key, m->nb)];
    while (*pp && (*pp)->key != key)
        pp = &(*pp)->next;
    struct blk *b = *pp;
    if (!b)
        return;
    *pp = b->next;
    med_free_list(b->meds);
    free(b);
    m->n--;
}

static void blkmap_clear(struct blkmap *m)
{
    for (size_t i = 0; i < m->nb; i++) {
        struct blk *b = m->b[i];
        while (b) {
            struct blk *nx = b->next;
            med_free_list(b->meds);
            free(b);
            b = nx;
        }
    }
    free(m->b);
    memset(m, 0, sizeof *m);
}

static struct med *med_find(struct blk *b, const char *medium)
{
    for (struct med *d = b->meds; d; d = d->next)
        if (strcmp(d->name, medium) == 0)
            return d;
    return NULL;
}

/* ADD: merge specs [{name, uri}] into (key, medium). */
static void loc_add(struct blkmap *m, int64_t key, const char *medium, json_t *specs)
{
    struct blk *b = blk_get(m, key);
    struct med *d = med_find(b, medium);
    if (!d) {
        d = xcalloc(1, sizeof *d);
        d->name = xstrdup(medium);
        d->next = b->meds;
        b->meds = d;
    }
    size_t i;
    json_t *sp;
    json_array_foreach(specs, i, sp) {
        const char *name = json_string_value(json_object_get(sp, "name"));
        json_t *u = json_object_get(sp, "uri");
        const char *uri = json_is_string(u) ? json_string_value(u) : "";
        struct spec *s = d->specs;
        while (s && strcmp(s->name, name) != 0)
            s = s->next;
        if (!s) {
            s = xcalloc(1, sizeof *s);
            s->name = xstrdup(name);
            s->next = d->specs;
            d->specs = s;
        } else {
            free(s->uri);
        }
        s->uri = xstrdup(uri);
    }
}

/* DELETE: drop spec names from (key, medium); empty locations and keys disappear. */
static void loc_delete(struct blkmap *m, int64_t key, const char *medium, json_t *names)
{
    struct blk *b = blk_find(m, key);
    struct med *d = b ? med_find(b, medium) : NULL;
    if (!d)
        return;
    size_t i;
    json_t *n;
    json_array_foreach(names, i, n) {
        struct spec **pp = &d->specs;
        while (*pp && strcmp((*pp)->name, json_string_value(n)) != 0)
            pp = &(*pp)->next;
        if (*pp) {
            struct spec *s = *pp;
            *pp = s->next;
            s->next = NULL;
            spec_free_list(s);
        }
    }
    if (d->specs)
        return;
    struct med **mp = &b->meds;
    while (*mp != d)
        mp = &(*mp)->next;
    *mp = d->next;
    d->next = NULL;
    med_free_list(d);
    if (!b->meds)
        blk_remove(m, key);
}

/* ------------------------------------------------------------------------- */
/* instances and reporters */

static struct instance *instance_find(const char *id)
{
    for (struct instance *i = S.instances; i; i = i->next)
        if (strcmp(i->id, id) == 0)
            return i;
    return NULL;
}

static bool instance_has_spec(const struct instance *in, const char *name)
{
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(in->info, "location_spec_infos"), i, v)
        if (strcmp(json_string_value(json_object_get(v, "name")), name) == 0)
            return true;
    return false;
}

static struct reporter *reporter_find(const char *inst, int st, const char *host, bool create)
{
    for (struct reporter *r = S.reporters; r; r = r->next)
        if (r->storage_type == st && strcmp(r->instance_id, inst) == 0 &&
            strcmp(r->host, host) == 0)
            return r;
    if (!create)
        return NULL;
    struct reporter *r = xcalloc(1, sizeof *r);
    r->instance_id = xstrdup(inst);
    r->host = xstrdup(host);
    r->storage_type = st;
    r->mediums = json_array();
    r->system_status = json_object();
    r->rejected = json_object();
    /* append: /state lists reporters in order of first contact */
    struct reporter **pp = &S.reporters;
    while (*pp)
        pp = &(*pp)->next;
    *pp = r;
    return r;
}

static void reporter_free(struct reporter *r)
{
    blkmap_clear(&r->blocks);
    json_decref(r->mediums);
    json_decref(r->system_status);
    json_decref(r->rejected);
    free(r->instance_id);
    free(r->host);
    free(r);
}

static void forget_all(void)
{
    while (S.instances) {
        struct instance *i = S.instances;
        S.instances = i->next;
        json_decref(i->info);
        free(i->id);
        free(i);
    }
    while (S.reporters) {
        struct reporter *r = S.reporters;
        S.reporters = r->next;
        reporter_free(r);
    }
}

/* ------------------------------------------------------------------------- */
/* protobuf-JSON field readers (null = absent). Each returns false on a type error. */

static json_t *jget(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

static bool parse_i64_text(const char *s, int64_t *out)
{
    if (!*s || (!(*s >= '0' && *s <= '9') && *s != '-'))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s)
        return false;
    *out = (int64_t)v;
    return true;
}

/* int64: a JSON integer, an integral real, or a decimal string. */
static bool j_i64(json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d >= -9.2e18 && d <= 9.2e18) || d != (double)(int64_t)d)
            return false;
        *out = (int64_t)d;
        return true;
    }
    return json_is_string(v) && parse_i64_text(json_string_value(v), out);
}

/* A field of an integer type (absent -> 0) within [lo, hi]. */
static bool f_int(json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = jget(o, k);
    *out = 0;
    if (!v)
        return true;
    return j_i64(v, out) && *out >= lo && *out <= hi;
}

/* A string field (absent -> ""). */
static bool f_str(json_t *o, const char *k, const char **out)
{
    json_t *v = jget(o, k);
    *out = "";
    if (!v)
        return true;
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return false;
    *out = json_string_value(v);
    return true;
}

static bool f_bool(json_t *o, const char *k, bool *out)
{
    json_t *v = jget(o, k);
    *out = false;
    if (!v)
        return true;
    if (!json_is_boolean(v))
        return false;
    *out = json_is_true(v);
    return true;
}

/* A repeated field (absent -> empty): *out is NULL for "empty", else the array. */
static bool f_arr(json_t *o, const char *k, json_t **out)
{
    json_t *v = jget(o, k);
    *out = NULL;
    if (!v)
        return true;
    if (!json_is_array(v))
        return false;
    *out = json_array_size(v) ? v : NULL;
    return true;
}

/* A message field: absent -> NULL and true; present but not an object -> false. */
static bool f_obj(json_t *o, const char *k, json_t **out)
{
    json_t *v = jget(o, k);
    *out = v;
    return !v || json_is_object(v);
}

/* ------------------------------------------------------------------------- */
/* replies */

static json_t *resp_new(int code, const char *trace_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static json_t *resp_new(int code, const char *trace_id, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return json_pack("{s:{s:{s:s, s:s}, s:s, s:s}}", "header", "status", "code", code_name(code),
                     "message", msg, "request_id", trace_id ? trace_id : "",
                     "tracer_result", "");
}

static int resp_code(json_t *resp)
{
    int c = 0;
    enum_parse(CODES, json_object_get(json_object_get(json_object_get(resp, "header"),
                                                       "status"), "code"), &c);
    return c;
}

static const char *trace_of(json_t *body)
{
    json_t *t = json_object_get(body, "trace_id");
    return json_is_string(t) ? json_string_value(t) : "";
}

/* reportEvent reply fields beyond the header */
static json_t *report_reply(json_t *resp, const struct reporter *r, uint64_t retry_after,
                            bool snapshot_required)
{
    json_object_set_new(resp, "item_results", json_array());
    json_object_set_new(resp, "extra_info", json_string(""));
    json_object_set_new(resp, "committed_snapshot_version", json_string(r ? r->version : ""));
    json_object_set_new(resp, "retry_after_ms", jstr_u64(retry_after));
    json_object_set_new(resp, "snapshot_required", json_boolean(snapshot_required));
    return resp;
}

/* ------------------------------------------------------------------------- */
/* registerInstance */

/* The info that must match for a re-registration to be idempotent, canonicalised
 * (defaults filled in, int64 as numbers). NULL and a message on a bad request. */
static json_t *canonical_info(json_t *b, char *err, size_t cap)
{
    const char *group, *id;
    int64_t bs, qt = 0;
    json_t *infos, *groups, *md, *qtv = jget(b, "query_type");
    if (!f_str(b, "instance_group", &group) || !f_str(b, "instance_id", &id) || !*id) {
        snprintf(err, cap, "instance_id: required non-empty string (instance_group a string)");
        return NULL;
    }
    if (!f_int(b, "block_size", 1, INT32_MAX, &bs) || bs <= 0) {
        snprintf(err, cap, "block_size: required int32 > 0");
        return NULL;
    }
    int q = 0;
    if (qtv && !enum_parse(QUERY_TYPES, qtv, &q)) {
        snprintf(err, cap, "query_type: unknown value");
        return NULL;
    }
    qt = q;
    if (!f_arr(b, "location_spec_infos", &infos) || !infos) {
        snprintf(err, cap, "location_spec_infos: required non-empty array");
        return NULL;
    }
    json_t *ci = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(infos, i, v) {
        const char *name;
        int64_t size;
        if (!json_is_object(v) || !f_str(v, "name", &name) || !*name ||
            !f_int(v, "size", 1, INT64_MAX, &size) || size <= 0) {
            snprintf(err, cap, "location_spec_infos[%zu]: needs a non-empty name and size > 0", i);
            json_decref(ci);
            return NULL;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(json_string_value(json_object_get(json_array_get(ci, j), "name")),
                       name) == 0) {
                snprintf(err, cap, "location_spec_infos[%zu]: duplicate name \"%.100s\"", i,
                         name);
                json_decref(ci);
                return NULL;
            }
        json_array_append_new(ci, json_pack("{s:s, s:I}", "name", name, "size",
                                            (json_int_t)size));
    }
    json_t *cg = json_array();
    if (!f_arr(b, "location_spec_groups", &groups))
        goto bad_groups;
    json_array_foreach(groups, i, v) {
        const char *gname;
        json_t *names;
        if (!json_is_object(v) || !f_str(v, "name", &gname) || !f_arr(v, "spec_names", &names))
            goto bad_groups;
        json_t *cn = json_array();
        size_t j;
        json_t *n;
        json_array_foreach(names, j, n) {
            bool known = false;
            size_t k;
            json_t *inf;
            json_array_foreach(ci, k, inf)
                known = known || (json_is_string(n) &&
                                  json_equal(n, json_object_get(inf, "name")));
            if (!known) {
                json_decref(cn);
                snprintf(err, cap, "location_spec_groups[%zu].spec_names[%zu]: not in "
                         "location_spec_infos", i, j);
                json_decref(ci);
                json_decref(cg);
                return NULL;
            }
            json_array_append(cn, n);
        }
        json_array_append_new(cg, json_pack("{s:s, s:o}", "name", gname, "spec_names", cn));
    }
    if (!f_obj(b, "model_deployment", &md)) {
        snprintf(err, cap, "model_deployment: must be an object");
        json_decref(ci);
        json_decref(cg);
        return NULL;
    }
    const char *mn, *dt, *lora, *extra, *ud;
    bool mla;
    int64_t tp, dp, pp;
    json_t *empty = json_object();
    json_t *m = md ? md : empty;
    bool ok = f_str(m, "model_name", &mn) && f_str(m, "dtype", &dt) &&
              f_bool(m, "use_mla", &mla) && f_int(m, "tp_size", INT32_MIN, INT32_MAX, &tp) &&
              f_int(m, "dp_size", INT32_MIN, INT32_MAX, &dp) &&
              f_int(m, "pp_size", INT32_MIN, INT32_MAX, &pp) && f_str(m, "lora_name", &lora) &&
              f_str(m, "extra", &extra) && f_str(m, "user_data", &ud);
    if (!ok) {
        json_decref(empty);
        snprintf(err, cap, "model_deployment: a field has the wrong type");
        json_decref(ci);
        json_decref(cg);
        return NULL;
    }
    /* user_data is not part of the identity (meta_service.proto) */
    json_t *cm = json_pack("{s:s, s:s, s:b, s:I, s:I, s:I, s:s, s:s}", "model_name", mn,
                           "dtype", dt, "use_mla", mla, "tp_size", (json_int_t)tp, "dp_size",
                           (json_int_t)dp, "pp_size", (json_int_t)pp, "lora_name", lora,
                           "extra", extra);
    json_decref(empty);
    return json_pack("{s:s, s:s, s:I, s:o, s:o, s:o, s:I}", "instance_group", group,
                     "instance_id", id, "block_size", (json_int_t)bs, "location_spec_infos", ci,
                     "model_deployment", cm, "location_spec_groups", cg, "query_type",
                     (json_int_t)qt);
bad_groups:
    snprintf(err, cap, "location_spec_groups: must be [{name, spec_names:[...]}]");
    json_decref(ci);
    json_decref(cg);
    return NULL;
}

static json_t *rpc_register(json_t *body)
{
    const char *tr = trace_of(body);
    char err[256];
    json_t *info = canonical_info(body, err, sizeof err);
    if (!info)
        return resp_new(C_INVALID_ARGUMENT, tr, "%s", err);
    const char *id = json_string_value(json_object_get(info, "instance_id"));
    struct instance *in = instance_find(id);
    json_t *resp;
    if (in) {
        if (json_equal(in->info, info)) {
            resp = resp_new(C_OK, tr, "instance %s already registered with the same info", id);
        } else {
            const char *field = "?", *k;
            json_t *v;
            json_object_foreach(info, k, v)
                if (!json_equal(v, json_object_get(in->info, k))) {
                    field = k;
                    break;
                }
            resp = resp_new(C_DUPLICATE_ENTITY, tr,
                            "instance %s already registered with different %s", id, field);
        }
        json_decref(info);
    } else {
        in = xcalloc(1, sizeof *in);
        in->id = xstrdup(id);
        in->info = info;
        in->next = S.instances;
        S.instances = in;
        resp = resp_new(C_OK, tr, "instance %s registered", id);
    }
    json_object_set_new(resp, "storage_configs", json_string(""));
    json_object_set_new(resp, "extra_info", json_string(""));
    return resp;
}

/* ------------------------------------------------------------------------- */
/* reportEvent */

struct pev {                 /* one validated EventItem */
    int         type;
    int64_t     key;
    const char *medium;
    json_t     *specs;       /* ADD: array of {name, uri} (never NULL) */
    json_t     *names;       /* DELETE: spec_names */
    json_t     *mediums;     /* NODE_REGISTER (may be NULL) */
    json_t     *status;      /* HEARTBEAT system_status (may be NULL) */
    json_t     *blocks;      /* SNAPSHOT items (may be NULL: empty snapshot) */
    int64_t    *bkeys;       /* SNAPSHOT: parsed block keys */
};

static bool medium_ok(const char *m) { return *m && !strchr(m, '#'); }

/* specs [{name, uri}] of an ADD or snapshot item */
static bool check_specs(const struct instance *in, json_t *specs, char *err, size_t cap,
                        const char *where)
{
    if (!specs) {
        snprintf(err, cap, "%s.specs: required non-empty array of {name, uri}", where);
        return false;
    }
    size_t i;
    json_t *sp;
    json_array_foreach(specs, i, sp) {
        const char *name, *uri;
        if (!json_is_object(sp) || !f_str(sp, "name", &name) || !f_str(sp, "uri", &uri) ||
            !*name) {
            snprintf(err, cap, "%s.specs[%zu]: must be {name (non-empty), uri}", where, i);
            return false;
        }
        if (!instance_has_spec(in, name)) {
            snprintf(err, cap, "%s.specs[%zu]: spec name \"%.80s\" is not registered", where, i,
                     name);
            return false;
        }
        if (strstr(uri, "s_version=")) {
            snprintf(err, cap, "%s.specs[%zu]: uri carries s_version= (the server sets it)",
                     where, i);
            return false;
        }
    }
    return true;
}

static bool check_key_medium(json_t *p, int64_t *key, const char **medium, char *err,
                             size_t cap, const char *where)
{
    json_t *k = jget(p, "block_key");
    if (!k || !j_i64(k, key)) {
        snprintf(err, cap, "%s.block_key: required int64 (a decimal string)", where);
        return false;
    }
    if (!f_str(p, "medium", medium) || !medium_ok(*medium)) {
        snprintf(err, cap, "%s.medium: required non-empty string without '#'", where);
        return false;
    }
    return true;
}

/* Validate one EventItem into *e. */
static bool check_event(const struct instance *in, json_t *item, size_t idx, struct pev *e,
                        char *err, size_t cap)
{
    char where[64];
    snprintf(where, sizeof where, "events[%zu]", idx);
    memset(e, 0, sizeof *e);
    if (!json_is_object(item)) {
        snprintf(err, cap, "%s: must be an object", where);
        return false;
    }
    json_t *tv = jget(item, "event_type");
    if (!tv || !enum_parse(EVENT_TYPES, tv, &e->type) || e->type == EV_UNSPEC) {
        snprintf(err, cap, "%s.event_type: required, one of EVENT_NODE_REGISTER .. "
                 "EVENT_BLOCK_SNAPSHOT", where);
        return false;
    }
    for (int t = 1; t < EV_COUNT; t++)
        if (t != e->type && jget(item, PAYLOAD[t])) {
            snprintf(err, cap, "%s: %s carries a %s payload (oneof: only %s)", where,
                     enum_name(EVENT_TYPES, e->type), PAYLOAD[t], PAYLOAD[e->type]);
            return false;
        }
    json_t *p = jget(item, PAYLOAD[e->type]);
    if (!json_is_object(p)) {
        snprintf(err, cap, "%s: %s needs its payload object \"%s\" (even if empty)", where,
                 enum_name(EVENT_TYPES, e->type), PAYLOAD[e->type]);
        return false;
    }
    snprintf(where + strlen(where), sizeof where - strlen(where), ".%s", PAYLOAD[e->type]);
    size_t i;
    json_t *v;
    switch (e->type) {
    case EV_NODE_REGISTER:
        if (!f_arr(p, "mediums", &e->mediums))
            goto bad_mediums;
        json_array_foreach(e->mediums, i, v)
            if (!json_is_string(v) || !medium_ok(json_string_value(v)))
                goto bad_mediums;
        return true;
    case EV_BLOCK_ADD: {
        if (!check_key_medium(p, &e->key, &e->medium, err, cap, where))
            return false;
        const char *uri;
        if (!f_arr(p, "specs", &e->specs) || !f_str(p, "uri", &uri)) {
            snprintf(err, cap, "%s.specs: must be an array", where);
            return false;
        }
        return check_specs(in, e->specs, err, cap, where);
    }
    case EV_BLOCK_DELETE:
        if (!check_key_medium(p, &e->key, &e->medium, err, cap, where))
            return false;
        if (!f_arr(p, "spec_names", &e->names) || !e->names) {
            snprintf(err, cap, "%s.spec_names: required non-empty array", where);
            return false;
        }
        json_array_foreach(e->names, i, v)
            if (!json_is_string(v) || !instance_has_spec(in, json_string_value(v))) {
                snprintf(err, cap, "%s.spec_names[%zu]: not a registered spec name", where, i);
                return false;
            }
        return true;
    case EV_HEARTBEAT: {
        if (!f_obj(p, "system_status", &e->status))
            goto bad_status;
        const char *k;
        json_object_foreach(e->status, k, v)
            if (!json_is_string(v))
                goto bad_status;
        return true;
    }
    case EV_HOST_DOWN:
        return true;
    case EV_BLOCK_SNAPSHOT:
        if (!f_arr(p, "blocks", &e->blocks)) {
            snprintf(err, cap, "%s.blocks: must be an array", where);
            return false;
        }
        e->bkeys = xcalloc(json_array_size(e->blocks), sizeof *e->bkeys);
        json_array_foreach(e->blocks, i, v) {
            char w2[96];
            snprintf(w2, sizeof w2, "%s.blocks[%zu]", where, i);
            const char *medium;
            json_t *specs;
            if (!json_is_object(v)) {
                snprintf(err, cap, "%s: must be an object", w2);
                return false;
            }
            if (!check_key_medium(v, &e->bkeys[i], &medium, err, cap, w2))
                return false;
            if (!f_arr(v, "specs", &specs)) {
                snprintf(err, cap, "%s.specs: must be an array", w2);
                return false;
            }
            if (!check_specs(in, specs, err, cap, w2))
                return false;
        }
        return true;
    }
    return false;
bad_mediums:
    snprintf(err, cap, "%s.mediums: must be an array of non-empty strings without '#'", where);
    return false;
bad_status:
    snprintf(err, cap, "%s.system_status: must be an object of strings", where);
    return false;
}

struct locref { int64_t key; const char *medium; };

static int locref_cmp(const void *a, const void *b)
{
    const struct locref *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return strcmp(x->medium, y->medium);
}

static void apply_event(struct reporter *r, const struct pev *e, uint64_t t)
{
    size_t i;
    json_t *v;
    switch (e->type) {
    case EV_NODE_REGISTER:
        r->registered = true;
        r->registrations++;
        json_array_foreach(e->mediums, i, v) {
            bool have = false;
            size_t j;
            json_t *w;
            json_array_foreach(r->mediums, j, w)
                have = have || json_equal(v, w);
            if (!have)
                json_array_append(r->mediums, v);
        }
        if (S.f.snapshot_required)
            r->need_snapshot = true;
        break;
    case EV_BLOCK_ADD:
        loc_add(&r->blocks, e->key, e->medium, e->specs);
        break;
    case EV_BLOCK_DELETE:
        loc_delete(&r->blocks, e->key, e->medium, e->names);
        break;
    case EV_HEARTBEAT:
        r->last_hb_ms = t;
        r->heartbeats++;
        json_object_clear(r->system_status);
        if (e->status)
            json_object_update(r->system_status, e->status);
        break;
    case EV_HOST_DOWN:
        r->registered = false;
        r->need_snapshot = false;
        r->version[0] = '\0';
        blkmap_clear(&r->blocks);
        break;
    case EV_BLOCK_SNAPSHOT:
        blkmap_clear(&r->blocks);
        json_array_foreach(e->blocks, i, v)
            loc_add(&r->blocks, e->bkeys[i],
                    json_string_value(json_object_get(v, "medium")),
                    json_object_get(v, "specs"));
        r->snapshots++;
        r->ever_snapshot = true;
        r->last_snapshot_ms = t;
        r->need_snapshot = false;
        snprintf(r->version, sizeof r->version, "%" PRIu64 "-%" PRIu64, S.boot_unix_ms,
                 ++r->snap_seq);
        break;
    }
    r->events[e->type]++;
}

static json_t *rpc_report(json_t *body)
{
    const char *tr = trace_of(body);
    const char *inst, *host;
    json_t *stv = jget(body, "storage_type"), *events;
    int st = 0;
    if (!f_str(body, "instance_id", &inst) || !*inst)
        return report_reply(resp_new(C_INVALID_ARGUMENT, tr, "instance_id: required"), NULL, 0,
                            false);
    if (!f_str(body, "host_ip_port", &host) || !*host || strchr(host, '#'))
        return report_reply(resp_new(C_INVALID_ARGUMENT, tr,
                                     "host_ip_port: required non-empty string without '#'"),
                            NULL, 0, false);
    if (!stv || !enum_parse(STORAGE_TYPES, stv, &st) ||
        (st != 7 && st != 8))
        return report_reply(resp_new(C_INVALID_ARGUMENT, tr,
                                     "storage_type: required, ST_EVENT_REPORT_L1P5 or "
                                     "ST_EVENT_REPORT_L2"), NULL, 0, false);
    if (!f_arr(body, "events", &events))
        return report_reply(resp_new(C_INVALID_ARGUMENT, tr, "events: must be an array"), NULL,
                            0, false);
    const struct instance *in = instance_find(inst);
    if (!in)
        return report_reply(resp_new(C_INSTANCE_NOT_EXIST, tr, "instance %s is not registered",
                                     inst), NULL, 0, false);
    struct reporter *r = reporter_find(inst, st, host, true);
    r->requests++;
    size_t n = json_array_size(events);
    if (n == 0)
        return report_reply(resp_new(C_OK, tr, "no events"), r, 0, r->need_snapshot);

    struct pev *ev = xcalloc(n, sizeof *ev);
    char err[320];
    int code = C_OK;
    uint64_t retry = 0, t = now_ms();
    json_t *resp = NULL;
    size_t n_snap = 0, n_down = 0;
    for (size_t i = 0; i < n; i++) {
        if (!check_event(in, json_array_get(events, i), i, &ev[i], err, sizeof err)) {
            code = C_INVALID_ARGUMENT;
            goto reject;
        }
        n_snap += ev[i].type == EV_BLOCK_SNAPSHOT;
        n_down += ev[i].type == EV_HOST_DOWN;
    }
    if (n_snap && n > 1) {
        code = C_INVALID_ARGUMENT;
        snprintf(err, sizeof err, "EVENT_BLOCK_SNAPSHOT must be alone in its request "
                 "(%zu events)", n);
        goto reject;
    }
    if (n_down && n > 1) {
        code = C_INVALID_ARGUMENT;
        snprintf(err, sizeof err, "EVENT_HOST_DOWN must be alone in its request (%zu events)", n);
        goto reject;
    }
    bool reg = r->registered, need = r->need_snapshot;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].type == EV_NODE_REGISTER) {
            reg = true;
            need = need || S.f.snapshot_required;
        } else if (!reg) {
            code = C_NODE_NOT_REGISTERED;
            snprintf(err, sizeof err, "events[%zu] %s: reporter %s#%s#%s has not sent "
                     "EVENT_NODE_REGISTER%s", i, enum_name(EVENT_TYPES, ev[i].type), inst,
                     enum_name(STORAGE_TYPES, st), host,
                     r->events[EV_HOST_DOWN] ? " since its EVENT_HOST_DOWN" : "");
            goto reject;
        } else if (need && (ev[i].type == EV_BLOCK_ADD || ev[i].type == EV_BLOCK_DELETE)) {
            code = C_SNAPSHOT_REQUIRED;
            snprintf(err, sizeof err, "events[%zu]: a snapshot is required first", i);
            goto reject;
        }
    }
    if (n_snap && r->ever_snapshot) {
        uint64_t iv = (uint64_t)(S.f.snapshot_interval_s * 1000.0);
        if (t - r->last_snapshot_ms < iv) {
            code = C_SNAPSHOT_RATE_LIMITED;
            retry = S.f.retry_after_ms ? S.f.retry_after_ms : iv - (t - r->last_snapshot_ms);
            r->rate_limited++;
            snprintf(err, sizeof err, "at most one snapshot per %.3g s; retry in %" PRIu64 " ms",
                     S.f.snapshot_interval_s, retry);
            goto reject;
        }
    }

    /* apply: in order (last op wins), or ADDs before DELETEs (--legacy-order) */
    struct locref *locs = xcalloc(n, sizeof *locs);
    size_t nl = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].type == EV_BLOCK_ADD || ev[i].type == EV_BLOCK_DELETE)
            locs[nl++] = (struct locref){ ev[i].key, ev[i].medium };
        if (!(S.f.legacy_order && ev[i].type == EV_BLOCK_DELETE))
            apply_event(r, &ev[i], t);
    }
    if (S.f.legacy_order)
        for (size_t i = 0; i < n; i++)
            if (ev[i].type == EV_BLOCK_DELETE)
                apply_event(r, &ev[i], t);
    qsort(locs, nl, sizeof *locs, locref_cmp);
    for (size_t i = 1; i < nl; i++)
        if (locref_cmp(&locs[i - 1], &locs[i]) == 0) {
            r->uncoalesced++;
            break;
        }
    free(locs);
    resp = report_reply(resp_new(C_OK, tr, "%zu events applied", n), r, 0, r->need_snapshot);
    goto out;

reject:
    resp = report_reply(resp_new(code, tr, "%s", err), r, retry,
                        code == C_SNAPSHOT_REQUIRED || r->need_snapshot);
out:
    for (size_t i = 0; i < n; i++)
        free(ev[i].bkeys);
    free(ev);
    return resp;
}

/* ------------------------------------------------------------------------- */
/* getClusterInfo, getHostCacheState */

static json_t *rpc_cluster_info(json_t *body)
{
    json_t *resp = resp_new(C_OK, trace_of(body), "ok");
    char leader_id[160];
    if (S.f.leader)
        snprintf(leader_id, sizeof leader_id, "%s", S.node_id);
    else
        snprintf(leader_id, sizeof leader_id, "%s:%u", S.f.leader_host, S.f.leader_port);
    json_object_set_new(resp, "self_node_id", json_string(S.node_id));
    json_object_set_new(resp, "leader_node_id", json_string(leader_id));
    json_object_set_new(resp, "leader_endpoint",
                        json_pack("{s:s, s:s, s:i, s:i, s:s}", "node_id", leader_id,
                                  "host", S.f.leader ? S.http_host : S.f.leader_host,
                                  "meta_rpc_port", S.f.leader ? (int)S.rpc_port : 0,
                                  "meta_http_port",
                                  (int)(S.f.leader ? S.bound_port : S.f.leader_port),
                                  "custom_info", ""));
    return resp;
}

struct hostmatch { const char *host; int64_t n; };

static int hostmatch_cmp(const void *a, const void *b)
{
    const struct hostmatch *x = a, *y = b;
    if (x->n != y->n)
        return x->n > y->n ? -1 : 1;
    return strcmp(x->host, y->host);
}

static bool medium_allowed(json_t *filter, const char *m)
{
    if (!filter)
        return true;
    size_t i;
    json_t *v;
    json_array_foreach(filter, i, v)
        if (strcmp(json_string_value(v), m) == 0)
            return true;
    return false;
}

/* Does any registered reporter of (inst, host) hold key in an allowed medium? */
static bool host_holds(const char *inst, const char *host, int64_t key, json_t *filter)
{
    for (struct reporter *r = S.reporters; r; r = r->next) {
        if (!r->registered || strcmp(r->instance_id, inst) || strcmp(r->host, host))
            continue;
        struct blk *b = blk_find(&r->blocks, key);
        for (struct med *d = b ? b->meds : NULL; d; d = d->next)
            if (medium_allowed(filter, d->name))
                return true;
    }
    return false;
}

static json_t *rpc_host_cache_state(json_t *body)
{
    const char *tr = trace_of(body);
    const char *inst;
    json_t *qtv = jget(body, "query_type"), *keys, *filter;
    int qt = 0;
    if (!f_str(body, "instance_id", &inst) || !*inst)
        return resp_new(C_INVALID_ARGUMENT, tr, "instance_id: required");
    if (qtv && !enum_parse(QUERY_TYPES, qtv, &qt))
        return resp_new(C_INVALID_ARGUMENT, tr, "query_type: unknown value");
    if (qt == 0)
        return resp_new(C_INVALID_ARGUMENT, tr, "query_type: required (QT_PREFIX_MATCH)");
    if (qt != 2)
        return resp_new(C_UNSUPPORTED, tr, "query_type %s is not supported here",
                        enum_name(QUERY_TYPES, qt));
    if (!f_arr(body, "block_cache_keys", &keys))
        return resp_new(C_INVALID_ARGUMENT, tr, "block_cache_keys: must be an array");
    if (!f_arr(body, "medium", &filter))
        return resp_new(C_INVALID_ARGUMENT, tr, "medium: must be an array of strings");
    size_t i, nk = json_array_size(keys);
    json_t *v;
    json_array_foreach(filter, i, v)
        if (!json_is_string(v))
            return resp_new(C_INVALID_ARGUMENT, tr, "medium[%zu]: must be a string", i);
    int64_t *k = xcalloc(nk, sizeof *k);
    json_array_foreach(keys, i, v)
        if (!j_i64(v, &k[i])) {
            free(k);
            return resp_new(C_INVALID_ARGUMENT, tr, "block_cache_keys[%zu]: not an int64", i);
        }
    if (!instance_find(inst)) {
        free(k);
        return resp_new(C_INSTANCE_NOT_EXIST, tr, "instance %s is not registered", inst);
    }
    size_t nh = 0;
    for (struct reporter *r = S.reporters; r; r = r->next)
        nh++;
    struct hostmatch *hm = xcalloc(nh, sizeof *hm);
    size_t m = 0;
    for (struct reporter *r = S.reporters; r; r = r->next) {
        if (!r->registered || strcmp(r->instance_id, inst) != 0)
            continue;
        bool seen = false;
        for (size_t j = 0; j < m; j++)
            seen = seen || strcmp(hm[j].host, r->host) == 0;
        if (seen)
            continue;
        int64_t c = 0;
        while ((size_t)c < nk && host_holds(inst, r->host, k[c], filter))
            c++;
        if (c > 0)
            hm[m++] = (struct hostmatch){ r->host, c };
    }
    qsort(hm, m, sizeof *hm, hostmatch_cmp);
    json_t *hosts = json_array();
    for (size_t j = 0; j < m; j++)
        json_array_append_new(hosts, json_pack("{s:s, s:o, s:s, s:o}", "host_ip_port",
                                               hm[j].host, "local", jstr_i64(hm[j].n),
                                               "p2p_1_fetch", "0", "p2p_1_total_match",
                                               jstr_i64(hm[j].n)));
    free(hm);
    free(k);
    json_t *resp = resp_new(C_OK, tr, "%zu hosts match", m);
    json_object_set_new(resp, "hosts", hosts);
    return resp;
}

/* ------------------------------------------------------------------------- */
/* /state, /recorded, /control */

static json_t *state_json(bool with_specs)
{
    json_t *insts = json_object(), *reps = json_object();
    for (struct instance *i = S.instances; i; i = i->next)
        json_object_set(insts, i->id, i->info);
    uint64_t t = now_ms();
    for (struct reporter *r = S.reporters; r; r = r->next) {
        /* (medium, key) pairs, sorted */
        size_t np = 0;
        for (size_t b = 0; b < r->blocks.nb; b++)
            for (struct blk *k = r->blocks.b[b]; k; k = k->next)
                for (struct med *d = k->meds; d; d = d->next)
                    np++;
        struct locref *p = xcalloc(np, sizeof *p);
        np = 0;
        for (size_t b = 0; b < r->blocks.nb; b++)
            for (struct blk *k = r->blocks.b[b]; k; k = k->next)
                for (struct med *d = k->meds; d; d = d->next)
                    p[np++] = (struct locref){ k->key, d->name };
        qsort(p, np, sizeof *p, locref_cmp);   /* by key, then medium: stable per medium */
        json_t *blocks = json_object(), *specs = with_specs ? json_object() : NULL;
        for (size_t j = 0; j < np; j++) {
            json_t *arr = json_object_get(blocks, p[j].medium);
            if (!arr) {
                arr = json_array();
                json_object_set_new(blocks, p[j].medium, arr);
            }
            json_array_append_new(arr, jstr_i64(p[j].key));
            if (specs) {
                json_t *mo = json_object_get(specs, p[j].medium);
                if (!mo) {
                    mo = json_object();
                    json_object_set_new(specs, p[j].medium, mo);
                }
                json_t *so = json_object();
                struct med *d = med_find(blk_find(&r->blocks, p[j].key), p[j].medium);
                for (struct spec *s = d->specs; s; s = s->next)
                    json_object_set_new(so, s->name, json_string(s->uri));
                char kb[32];
                snprintf(kb, sizeof kb, "%" PRId64, p[j].key);
                json_object_set_new(mo, kb, so);
            }
        }
        free(p);
        json_t *evs = json_object();
        for (int e = 1; e < EV_COUNT; e++)
            json_object_set_new(evs, enum_name(EVENT_TYPES, e),
                                json_integer((json_int_t)r->events[e]));
        json_t *o = json_pack(
            "{s:s, s:s, s:s, s:b, s:O, s:o, s:I, s:I, s:I, s:I, s:O, s:o, s:I, s:I, s:s, s:b,"
            " s:I, s:O, s:I, s:I}",
            "instance_id", r->instance_id,
            "storage_type", enum_name(STORAGE_TYPES, r->storage_type),
            "host_ip_port", r->host, "registered", r->registered, "mediums", r->mediums,
            "blocks", blocks, "block_count", (json_int_t)r->blocks.n,
            "heartbeats", (json_int_t)r->heartbeats,
            "last_heartbeat_t_ms",
            r->last_hb_ms ? (json_int_t)(r->last_hb_ms - S.start_ms) : -1,
            "last_heartbeat_age_ms", r->last_hb_ms ? (json_int_t)(t - r->last_hb_ms) : -1,
            "system_status", r->system_status, "events", evs,
            "snapshots", (json_int_t)r->snapshots,
            "snapshot_rate_limited", (json_int_t)r->rate_limited,
            "committed_snapshot_version", r->version, "snapshot_required", r->need_snapshot,
            "requests", (json_int_t)r->requests, "rejected", r->rejected,
            "uncoalesced_requests", (json_int_t)r->uncoalesced,
            "registrations", (json_int_t)r->registrations);
        if (specs)
            json_object_set_new(o, "block_specs", specs);
        char id[1024];
        snprintf(id, sizeof id, "%s#%s#%s", r->instance_id,
                 enum_name(STORAGE_TYPES, r->storage_type), r->host);
        json_object_set_new(reps, id, o);
    }
    return json_pack("{s:b, s:o, s:o, s:I, s:I}", "leader", S.f.leader, "instances", insts,
                     "reporters", reps, "recorded", (json_int_t)S.rec_seq,
                     "recorded_dropped", (json_int_t)S.rec_dropped);
}

static json_t *faults_json(const struct faults *f)
{
    char ep[160] = "";
    if (f->leader_host[0])
        snprintf(ep, sizeof ep, "%s:%u", f->leader_host, f->leader_port);
    return json_pack("{s:I, s:s, s:s?, s:I, s:s, s:I, s:I, s:b, s:b, s:b, s:b, s:f, s:b, s:s}",
                     "delay_ms", (json_int_t)f->delay_ms, "delay_only", f->delay_only,
                     "fail_status", f->fail_status >= 0 ? code_name(f->fail_status) : NULL,
                     "fail_count", (json_int_t)f->fail_count, "fail_only", f->fail_only,
                     "http_status", (json_int_t)f->http_status,
                     "retry_after_ms", (json_int_t)f->retry_after_ms, "garbage", f->garbage,
                     "down", f->down, "snapshot_required", f->snapshot_required,
                     "legacy_order", f->legacy_order, "snapshot_interval_s",
                     f->snapshot_interval_s, "leader", f->leader, "leader_endpoint", ep);
}

static bool rpc_known(const char *rpc)
{
    return strcmp(rpc, "registerInstance") == 0 || strcmp(rpc, "reportEvent") == 0 ||
           strcmp(rpc, "getClusterInfo") == 0 || strcmp(rpc, "getHostCacheState") == 0;
}

/* "HOST:PORT" -> host, port (port 1..65535) */
static bool parse_endpoint(const char *s, char *host, size_t cap, unsigned *port)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || (size_t)(colon - s) >= cap)
        return false;
    char *end;
    errno = 0;
    unsigned long v = strtoul(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || v == 0 || v > 65535)
        return false;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port = (unsigned)v;
    return true;
}

/* "http://HOST:PORT[/...]" -> host, port */
static bool parse_url(const char *url, char *host, size_t cap, unsigned *port)
{
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    char hp[192];
    size_t n = strcspn(p, "/?#");
    if (n == 0 || n >= sizeof hp)
        return false;
    memcpy(hp, p, n);
    hp[n] = '\0';
    return parse_endpoint(hp, host, cap, port);
}

/* an RPC-name filter: "name", "/api/name", "" */
static bool set_rpc_filter(char *dst, size_t cap, json_t *v)
{
    if (!v || json_is_null(v)) {
        dst[0] = '\0';
        return true;
    }
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    if (strncmp(s, "/api/", 5) == 0)
        s += 5;
    if (*s && !rpc_known(s))
        return false;
    snprintf(dst, cap, "%s", s);
    return true;
}

/* the delay filter: an RPC filter, or "snapshot" (reportEvent with a snapshot event) */
static bool set_delay_filter(char *dst, size_t cap, json_t *v)
{
    if (json_is_string(v) && strcmp(json_string_value(v), "snapshot") == 0) {
        snprintf(dst, cap, "snapshot");
        return true;
    }
    return set_rpc_filter(dst, cap, v);
}

static bool control_apply(json_t *doc, char *err, size_t cap)
{
    struct faults f = S.f;
    bool mark_need = false;
    const char *k;
    json_t *v;
    json_object_foreach(doc, k, v) {
        int64_t n = 0;
        bool int_ok = json_is_integer(v) && (n = json_integer_value(v)) >= 0;
        if (strcmp(k, "delay_ms") == 0) {
            if (!int_ok || n > 600000)
                goto bad;
            f.delay_ms = (unsigned)n;
        } else if (strcmp(k, "delay_only") == 0) {
            if (!set_delay_filter(f.delay_only, sizeof f.delay_only, v))
                goto bad;
        } else if (strcmp(k, "fail_only") == 0) {
            if (!set_rpc_filter(f.fail_only, sizeof f.fail_only, v))
                goto bad;
        } else if (strcmp(k, "fail_status") == 0) {
            int c;
            if (json_is_null(v) || (json_is_string(v) && !*json_string_value(v)))
                f.fail_status = -1;
            else if (enum_parse(CODES, v, &c) && c != C_UNSPECIFIED)
                f.fail_status = c;
            else
                goto bad;
        } else if (strcmp(k, "fail_count") == 0) {
            if (!int_ok || n > UINT_MAX)
                goto bad;
            f.fail_count = (unsigned)n;
        } else if (strcmp(k, "http_status") == 0) {
            if (!int_ok || (n != 0 && (n < 100 || n > 599)))
                goto bad;
            f.http_status = (int)n;
        } else if (strcmp(k, "retry_after_ms") == 0) {
            if (!int_ok)
                goto bad;
            f.retry_after_ms = (uint64_t)n;
        } else if (strcmp(k, "snapshot_interval_s") == 0) {
            if (!json_is_number(v) || !(json_number_value(v) >= 0) ||
                json_number_value(v) > 1e6)
                goto bad;
            f.snapshot_interval_s = json_number_value(v);
        } else if (strcmp(k, "garbage") == 0 || strcmp(k, "down") == 0 ||
                   strcmp(k, "snapshot_required") == 0 || strcmp(k, "legacy_order") == 0 ||
                   strcmp(k, "leader") == 0) {
            if (!json_is_boolean(v))
                goto bad;
            bool b = json_is_true(v);
            if (strcmp(k, "garbage") == 0) {
                f.garbage = b;
            } else if (strcmp(k, "down") == 0) {
                f.down = b;
            } else if (strcmp(k, "snapshot_required") == 0) {
                mark_need = b;
                f.snapshot_required = b;
            } else if (strcmp(k, "legacy_order") == 0) {
                f.legacy_order = b;
            } else {
                f.leader = b;
            }
        } else if (strcmp(k, "follower_of") == 0) {
            if (!json_is_string(v) ||
                !parse_url(json_string_value(v), f.leader_host, sizeof f.leader_host,
                           &f.leader_port))
                goto bad;
            f.leader = false;
        } else if (strcmp(k, "leader_endpoint") == 0) {
            if (!json_is_string(v) ||
                !parse_endpoint(json_string_value(v), f.leader_host, sizeof f.leader_host,
                                &f.leader_port))
                goto bad;
        } else {
            snprintf(err, cap, "unknown control field \"%.100s\"", k);
            return false;
        }
    }
    if (!f.leader && !f.leader_host[0]) {
        snprintf(err, cap, "a follower needs follower_of or leader_endpoint");
        return false;
    }
    S.f = f;
    for (struct reporter *r = S.reporters; r; r = r->next) {
        if (!f.snapshot_required)
            r->need_snapshot = false;
        else if (mark_need && r->registered)
            r->need_snapshot = true;
    }
    return true;
bad:
    snprintf(err, cap, "control field \"%.100s\": bad value", k);
    return false;
}

/* ------------------------------------------------------------------------- */
/* HTTP plumbing */

static void send_json(struct evhttp_request *req, int status, json_t *doc)
{
    struct evbuffer *b = evbuffer_new();
    char *s = json_dumps(doc, JSON_COMPACT);
    if (s) {
        evbuffer_add(b, s, strlen(s));
        free(s);
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "application/json");
    evhttp_send_reply(req, status, NULL, b);
    evbuffer_free(b);
}

static void send_error(struct evhttp_request *req, int status, const char *msg)
{
    json_t *d = json_pack("{s:s, s:i}", "error", msg, "status", status);
    send_json(req, status, d);
    json_decref(d);
}

static const char *query_param(struct evhttp_request *req, const char *name, char *buf,
                               size_t cap)
{
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *q = uri ? evhttp_uri_get_query(uri) : NULL;
    struct evkeyvalq kv;
    const char *res = NULL;
    if (q && evhttp_parse_query_str(q, &kv) == 0) {
        const char *v = evhttp_find_header(&kv, name);
        if (v) {
            snprintf(buf, cap, "%s", v);
            res = buf;
        }
        evhttp_clear_headers(&kv);
    }
    return res;
}

static json_t *body_json(struct evhttp_request *req, json_t **raw)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    const char *p = n ? (const char *)evbuffer_pullup(in, (ev_ssize_t)n) : "";
    json_t *doc = json_loadb(p, n, 0, NULL);
    if (!doc && raw) {
        /* printable ASCII only, so that /recorded stays valid JSON */
        char keep[KVCM_RAW_KEEP + 1];
        size_t k = n < KVCM_RAW_KEEP ? n : KVCM_RAW_KEEP;
        for (size_t i = 0; i < k; i++)
            keep[i] = p[i] >= 0x20 && p[i] < 0x7f ? p[i] : '?';
        keep[k] = '\0';
        *raw = json_string(keep);
    }
    return doc;
}

static void call_free(struct call *c)
{
    if (c->ev) {
        if (c->prev) c->prev->next = c->next; else S.pending = c->next;
        if (c->next) c->next->prev = c->prev;
        event_free(c->ev);
    }
    json_decref(c->body);
    json_decref(c->rec);
    free(c);
}

/* Answer an /api/ call and complete its recording. */
static void call_answer(struct call *c, int http_status, json_t *resp, const char *injected)
{
    json_t *rec = c->rec;
    json_object_set_new(rec, "http_status", json_integer(http_status));
    json_object_set_new(rec, "status", resp ? json_string(code_name(resp_code(resp)))
                                            : json_null());
    if (resp)
        json_object_set(rec, "response", resp);
    if (S.f.garbage && !injected)
        injected = "garbage";
    if (injected)
        json_object_set_new(rec, "injected", json_string(injected));
    if (S.f.garbage) {
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "{\"header\": <<garbage %d", http_status);
        evhttp_add_header(evhttp_request_get_output_headers(c->req), "Content-Type",
                          "application/json");
        evhttp_send_reply(c->req, http_status, NULL, b);
        evbuffer_free(b);
    } else if (resp) {
        send_json(c->req, http_status, resp);
    } else {
        send_error(c->req, http_status, "injected http_status");
    }
    json_decref(resp);
}

static void api_process(struct call *c)
{
    struct faults *f = &S.f;
    bool matches = !f->fail_only[0] || strcmp(f->fail_only, c->rpc) == 0;
    if ((f->fail_status >= 0 || f->http_status) && matches) {
        const char *inj = f->http_status ? "http_status" : "fail_status";
        int hs = f->http_status ? f->http_status : 200;
        json_t *resp = NULL;
        if (!f->http_status) {
            resp = resp_new(f->fail_status, trace_of(c->body), "injected failure");
            if (strcmp(c->rpc, "reportEvent") == 0)
                report_reply(resp, NULL, f->retry_after_ms, false);
        }
        if (f->fail_count && --f->fail_count == 0) {
            f->fail_status = -1;
            f->http_status = 0;
            f->fail_only[0] = '\0';
        }
        call_answer(c, hs, resp, inj);
        return;
    }
    json_t *resp;
    if (!c->body || !json_is_object(c->body)) {
        resp = resp_new(C_INVALID_ARGUMENT, "", "the body is not a JSON object");
        if (strcmp(c->rpc, "reportEvent") == 0)
            report_reply(resp, NULL, 0, false);
    } else if (strcmp(c->rpc, "getClusterInfo") == 0) {
        resp = rpc_cluster_info(c->body);
    } else if (!f->leader) {
        char ep[160];
        snprintf(ep, sizeof ep, "%s:%u", f->leader_host, f->leader_port);
        resp = resp_new(C_SERVER_NOT_LEADER, trace_of(c->body), "not the leader; leader is %s",
                        ep);
        if (strcmp(c->rpc, "reportEvent") == 0)
            report_reply(resp, NULL, 0, false);
    } else if (strcmp(c->rpc, "registerInstance") == 0) {
        resp = rpc_register(c->body);
    } else if (strcmp(c->rpc, "reportEvent") == 0) {
        resp = rpc_report(c->body);
        int code = resp_code(resp);
        if (code != C_OK) {
            /* count the rejection on the reporter, when it is known */
            const char *inst = json_string_value(json_object_get(c->body, "instance_id"));
            const char *host = json_string_value(json_object_get(c->body, "host_ip_port"));
            int st = 0;
            enum_parse(STORAGE_TYPES, json_object_get(c->body, "storage_type"), &st);
            struct reporter *r = inst && host ? reporter_find(inst, st, host, false) : NULL;
            if (r) {
                json_t *cnt = json_object_get(r->rejected, code_name(code));
                json_object_set_new(r->rejected, code_name(code),
                                    json_integer(cnt ? json_integer_value(cnt) + 1 : 1));
            }
        }
    } else {
        resp = rpc_host_cache_state(c->body);
    }
    call_answer(c, 200, resp, NULL);
}

static void delayed_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    struct call *c = arg;
    api_process(c);
    call_free(c);
}

/* Whether the delay fault applies to this request (see delay_only). */
static bool delay_matches(const char *rpc, json_t *body)
{
    if (!S.f.delay_only[0])
        return true;
    if (strcmp(S.f.delay_only, "snapshot") != 0)
        return strcmp(S.f.delay_only, rpc) == 0;
    if (strcmp(rpc, "reportEvent") != 0)
        return false;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(body, "events"), i, e) {
        int t = 0;
        if (enum_parse(EVENT_TYPES, json_object_get(e, "event_type"), &t) &&
            t == EV_BLOCK_SNAPSHOT)
            return true;
    }
    return false;
}

static void api_request(struct evhttp_request *req, const char *rpc)
{
    struct call *c = xcalloc(1, sizeof *c);
    c->req = req;
    snprintf(c->rpc, sizeof c->rpc, "%s", rpc);
    json_t *raw = NULL;
    c->body = body_json(req, &raw);
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    c->rec = json_pack("{s:I, s:s, s:s, s:I, s:I, s:s?, s:O?, s:n, s:n}",
                       "seq", (json_int_t)S.rec_seq++, "rpc", rpc,
                       "method", m == EVHTTP_REQ_POST ? "POST" : m == EVHTTP_REQ_GET ? "GET"
                                                                                       : "OTHER",
                       "t_ms", (json_int_t)(now_ms() - S.start_ms),
                       "unix_ms", (json_int_t)unix_ms(), "content_type", ct,
                       "body", c->body, "status", "http_status");
    if (raw)
        json_object_set_new(c->rec, "raw", raw);
    json_array_append(S.recorded, c->rec);
    while (S.record_max && json_array_size(S.recorded) > S.record_max) {
        json_array_remove(S.recorded, 0);
        S.rec_dropped++;
    }

    if (m != EVHTTP_REQ_POST) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "POST");
        json_object_set_new(c->rec, "http_status", json_integer(405));
        send_error(req, 405, "RPCs are POST");
        call_free(c);
        return;
    }
    if (!rpc_known(rpc)) {
        json_object_set_new(c->rec, "http_status", json_integer(404));
        send_error(req, 404, "no such rpc");
        call_free(c);
        return;
    }
    if (S.f.down) {
        json_object_set_new(c->rec, "injected", json_string("down"));
        /* close the connection unanswered; this frees req with it */
        evhttp_connection_free(evhttp_request_get_connection(req));
        call_free(c);
        return;
    }
    if (S.f.delay_ms && delay_matches(rpc, c->body)) {
        json_object_set_new(c->rec, "injected", json_string("delay"));
        c->ev = evtimer_new(S.base, delayed_cb, c);
        struct timeval tv = { .tv_sec = S.f.delay_ms / 1000,
                              .tv_usec = (S.f.delay_ms % 1000) * 1000 };
        c->next = S.pending;
        if (S.pending) S.pending->prev = c;
        S.pending = c;
        evtimer_add(c->ev, &tv);
        return;
    }
    api_process(c);
    call_free(c);
}

static void http_cb(struct evhttp_request *req, void *arg)
{
    (void)arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    char buf[128];
    if (!path) {
        /* libevent calls back without a URI when it refuses a request, e.g. a body over
         * the cap (413, refused on its Content-Length before anything is read) */
        int rc = evhttp_request_get_response_code(req);
        send_error(req, rc >= 400 && rc < 600 ? rc : 400,
                   rc == 413 ? "request body too large" : "bad request");
        return;
    }
    if (strncmp(path, "/api/", 5) == 0) {
        api_request(req, path + 5);
    } else if (strcmp(path, "/state") == 0 && m == EVHTTP_REQ_GET) {
        const char *sp = query_param(req, "specs", buf, sizeof buf);
        json_t *d = state_json(sp && strcmp(sp, "0") != 0);
        send_json(req, 200, d);
        json_decref(d);
    } else if (strcmp(path, "/recorded") == 0 && m == EVHTTP_REQ_GET) {
        const char *since = query_param(req, "since", buf, sizeof buf);
        long long from = since ? atoll(since) : 0;
        char rbuf[64];
        const char *rpc = query_param(req, "rpc", rbuf, sizeof rbuf);
        json_t *out = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(S.recorded, i, e) {
            if (json_integer_value(json_object_get(e, "seq")) < from)
                continue;
            if (rpc && strcmp(json_string_value(json_object_get(e, "rpc")), rpc) != 0)
                continue;
            json_array_append(out, e);
        }
        send_json(req, 200, out);
        json_decref(out);
    } else if (strcmp(path, "/control") == 0 &&
               (m == EVHTTP_REQ_GET || m == EVHTTP_REQ_POST)) {
        if (m == EVHTTP_REQ_POST) {
            json_t *doc = body_json(req, NULL);
            char err[256];
            if (!json_is_object(doc)) {
                json_decref(doc);
                send_error(req, 400, "control: body must be a JSON object");
                return;
            }
            bool ok = control_apply(doc, err, sizeof err);
            json_decref(doc);
            if (!ok) {
                send_error(req, 400, err);
                return;
            }
        }
        json_t *d = faults_json(&S.f);
        send_json(req, 200, d);
        json_decref(d);
    } else if (strcmp(path, "/reset") == 0 && m == EVHTTP_REQ_POST) {
        forget_all();
        json_array_clear(S.recorded);
        S.rec_seq = S.rec_dropped = 0;
        S.f = S.f0;
        json_t *d = faults_json(&S.f);
        send_json(req, 200, d);
        json_decref(d);
    } else if (strcmp(path, "/state") == 0 || strcmp(path, "/recorded") == 0 ||
               strcmp(path, "/control") == 0 || strcmp(path, "/reset") == 0) {
        send_error(req, 405, "method not allowed");
    } else {
        send_error(req, 404, "no such route");
    }
}

/* ------------------------------------------------------------------------- */
/* main */

static void stop_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)sig; (void)what; (void)arg;
    event_base_loopexit(S.base, NULL);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: kvcm-sim [--http HOST:PORT] [--node-id ID] [--rpc-port N]\n"
            "                [--leader | --follower-of URL] [--leader-endpoint HOST:HTTPPORT]\n"
            "                [--snapshot-interval-s S] [--legacy-order] [--record-max N]\n"
            "                [--delay-ms N [--delay-only RPC|snapshot]] [--fail-status NAME\n"
            "                [--fail-count N] [--fail-only RPC]] [--http-status N]\n"
            "                [--retry-after-ms N] [--garbage] [--down] [--snapshot-required]\n");
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv)
{
    static const struct option opts[] = {
        { "http",                required_argument, NULL, 'h' },
        { "node-id",             required_argument, NULL, 'n' },
        { "rpc-port",            required_argument, NULL, 'p' },
        { "leader",              no_argument,       NULL, 'L' },
        { "follower-of",         required_argument, NULL, 'F' },
        { "leader-endpoint",     required_argument, NULL, 'E' },
        { "snapshot-interval-s", required_argument, NULL, 'i' },
        { "legacy-order",        no_argument,       NULL, 'o' },
        { "record-max",          required_argument, NULL, 'r' },
        { "delay-ms",            required_argument, NULL, 'd' },
        { "delay-only",          required_argument, NULL, 'D' },
        { "fail-status",         required_argument, NULL, 's' },
        { "fail-count",          required_argument, NULL, 'c' },
        { "fail-only",           required_argument, NULL, 'O' },
        { "http-status",         required_argument, NULL, 'H' },
        { "retry-after-ms",      required_argument, NULL, 'R' },
        { "garbage",             no_argument,       NULL, 'g' },
        { "down",                no_argument,       NULL, 'x' },
        { "snapshot-required",   no_argument,       NULL, 'q' },
        { NULL, 0, NULL, 0 },
    };
    const char *http = "127.0.0.1:0", *follower_of = NULL, *leader_ep = NULL;
    bool leader_flag = false;
    uint64_t v;
    int ch;
    struct faults *f = &S.f0;
    f->fail_status = -1;
    f->snapshot_interval_s = 30;
    f->leader = true;
    S.record_max = 100000;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        json_t *j;
        bool ok;
        switch (ch) {
        case 'h': http = optarg; break;
        case 'n': snprintf(S.node_id, sizeof S.node_id, "%s", optarg); break;
        case 'p':
            if (!parse_u64(optarg, &v) || v > 65535) goto bad;
            S.rpc_port = (unsigned)v;
            break;
        case 'L': leader_flag = true; break;
        case 'F': follower_of = optarg; break;
        case 'E': leader_ep = optarg; break;
        case 'i': {
            char *end;
            f->snapshot_interval_s = strtod(optarg, &end);
            if (*end || end == optarg || !(f->snapshot_interval_s >= 0) ||
                f->snapshot_interval_s > 1e6)
                goto bad;
            break;
        }
        case 'o': f->legacy_order = true; break;
        case 'r':
            if (!parse_u64(optarg, &v) || v > 100000000) goto bad;
            S.record_max = (size_t)v;
            break;
        case 'd':
            if (!parse_u64(optarg, &v) || v > 600000) goto bad;
            f->delay_ms = (unsigned)v;
            break;
        case 'D':
        case 'O':
            j = json_string(optarg);
            ok = j && (ch == 'D' ? set_delay_filter(f->delay_only, sizeof f->delay_only, j)
                                 : set_rpc_filter(f->fail_only, sizeof f->fail_only, j));
            json_decref(j);
            if (!ok) goto bad;
            break;
        case 's': {
            int c = 0;
            j = json_string(optarg);
            ok = j && enum_parse(CODES, j, &c) && c != C_UNSPECIFIED;
            json_decref(j);
            if (!ok) goto bad;
            f->fail_status = c;
            break;
        }
        case 'c':
            if (!parse_u64(optarg, &v) || v > UINT_MAX) goto bad;
            f->fail_count = (unsigned)v;
            break;
        case 'H':
            if (!parse_u64(optarg, &v) || v < 100 || v > 599) goto bad;
            f->http_status = (int)v;
            break;
        case 'R':
            if (!parse_u64(optarg, &v)) goto bad;
            f->retry_after_ms = v;
            break;
        case 'g': f->garbage = true; break;
        case 'x': f->down = true; break;
        case 'q': f->snapshot_required = true; break;
        default: usage(); return -1;
        }
    }
    if (optind != argc) {
        usage();
        return -1;
    }
    if (leader_flag && follower_of) {
        fprintf(stderr, "kvcm-sim: --leader and --follower-of exclude each other\n");
        return -1;
    }
    if (leader_ep && !parse_endpoint(leader_ep, f->leader_host, sizeof f->leader_host,
                                     &f->leader_port)) {
        fprintf(stderr, "kvcm-sim: bad --leader-endpoint %s (want HOST:PORT)\n", leader_ep);
        return -1;
    }
    if (follower_of) {
        char h[128];
        unsigned p;
        if (!parse_url(follower_of, h, sizeof h, &p)) {
            fprintf(stderr, "kvcm-sim: bad --follower-of %s (want http://HOST:PORT)\n",
                    follower_of);
            return -1;
        }
        if (!leader_ep) {
            snprintf(f->leader_host, sizeof f->leader_host, "%s", h);
            f->leader_port = p;
        }
        f->leader = false;
    }
    const char *colon = strrchr(http, ':');
    if (!colon || colon == http || (size_t)(colon - http) >= sizeof S.http_host ||
        !parse_u64(colon + 1, &v) || v > 65535) {
        fprintf(stderr, "kvcm-sim: bad --http %s (want HOST:PORT)\n", http);
        return -1;
    }
    memcpy(S.http_host, http, (size_t)(colon - http));
    S.http_port = (unsigned)v;
    return 0;
bad:
    fprintf(stderr, "kvcm-sim: bad option value \"%s\"\n", optarg);
    usage();
    return -1;
}

static int setup(void)
{
    S.base = event_base_new();
    S.http = S.base ? evhttp_new(S.base) : NULL;
    if (!S.http)
        return -1;
    evhttp_set_max_body_size(S.http, KVCM_MAX_BODY);
    evhttp_set_max_headers_size(S.http, KVCM_MAX_HEADERS);
    evhttp_set_allowed_methods(S.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                               EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD | EVHTTP_REQ_PATCH |
                               EVHTTP_REQ_OPTIONS);
    evhttp_set_gencb(S.http, http_cb, NULL);
    struct evhttp_bound_socket *bs =
        evhttp_bind_socket_with_handle(S.http, S.http_host, (ev_uint16_t)S.http_port);
    if (!bs) {
        fprintf(stderr, "kvcm-sim: cannot bind http %s:%u\n", S.http_host, S.http_port);
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) != 0)
        return -1;
    S.bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (!S.node_id[0])
        snprintf(S.node_id, sizeof S.node_id, "%s:%u", S.http_host, S.bound_port);

    S.sigterm = evsignal_new(S.base, SIGTERM, stop_cb, NULL);
    S.sigint = evsignal_new(S.base, SIGINT, stop_cb, NULL);
    if (!S.sigterm || !S.sigint || evsignal_add(S.sigterm, NULL) || evsignal_add(S.sigint, NULL))
        return -1;

    printf("http=%s:%u\n", S.http_host, S.bound_port);
    fflush(stdout);
    return 0;
}

static void teardown(void)
{
    while (S.pending) {
        struct call *c = S.pending;
        evhttp_send_error(c->req, 503, "shutting down");
        call_free(c);
    }
    if (S.http)
        evhttp_free(S.http);
    if (S.sigterm) event_free(S.sigterm);
    if (S.sigint) event_free(S.sigint);
    if (S.base)
        event_base_free(S.base);
    forget_all();
    json_decref(S.recorded);
    libevent_global_shutdown();
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (parse_args(argc, argv) != 0)
        return 2;
    S.f = S.f0;
    S.start_ms = now_ms();
    S.boot_unix_ms = unix_ms();
    S.recorded = json_array();
    int rc = 1;
    if (setup() == 0 && event_base_dispatch(S.base) == 0)
        rc = 0;
    teardown();
    return rc;
}
