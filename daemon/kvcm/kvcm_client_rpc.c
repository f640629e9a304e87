/* kvcm_client_rpc: the KVCM RPCs the daemon makes (registerInstance,
 * reportEvent, getHostCacheState) -- arguments checked, the request built,
 * the reply's fields read -- and the EventItem builders for reportEvent.
 * Protocol: see kvcm_client.h; the transport (one deadline, leader
 * handling) is kvcm_client.c's kvcm_call. */
#include "kvcm/kvcm_client.h"
#include "kvcm/kvcm_client_internal.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Absent or JSON null: the field's default (protobuf JSON mapping). */
static bool absent(json_t *v)
{
    return !v || json_is_null(v);
}

/* Argument errors the client refuses on its own. */
#define BAD_ARG(r, ...) kvcm_result_fail((r), KVCM_INVALID_ARGUMENT, "client: " __VA_ARGS__)

/* ---- RPCs -------------------------------------------------------------------------------- */

static json_t *jstr_i64(int64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%" PRId64, v);
    return json_string(b);
}

static json_t *jstr_u64(uint64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%" PRIu64, v);
    return json_string(b);
}

/* Set a new reference; on failure remember it (the value is freed by jansson). */
static void put(json_t *o, const char *k, json_t *v, bool *ok)
{
    if (!v || json_object_set_new(o, k, v) != 0)
        *ok = false;
}

static bool nonempty(const char *s)
{
    return s && *s;
}

int kvcm_register_instance(struct kvcm_client *c, const struct kvcm_instance *inst,
                           uint32_t timeout_ms, struct kvcm_result *r)
{
    struct kvcm_result scratch;
    if (!r)
        r = &scratch;
    kvcm_result_reset(r);
    if (!inst || !nonempty(inst->instance_id) || !inst->instance_group || !inst->model_name ||
        !inst->dtype) {
        BAD_ARG(r, "registerInstance needs instance_id (non-empty), instance_group, model_name "
                "and dtype");
        return r->status;
    }
    if (inst->block_size == 0 || inst->block_size > INT32_MAX || inst->tp_size == 0 ||
        inst->tp_size > INT32_MAX) {
        BAD_ARG(r, "registerInstance: block_size and tp_size must be in 1..%d", INT32_MAX);
        return r->status;
    }
    if (inst->n_specs == 0 || !inst->spec_names || !inst->spec_sizes) {
        BAD_ARG(r, "registerInstance: at least one location spec required");
        return r->status;
    }
    for (size_t i = 0; i < inst->n_specs; i++)
        if (!nonempty(inst->spec_names[i]) || inst->spec_sizes[i] == 0) {
            BAD_ARG(r, "registerInstance: spec %zu needs a non-empty name and a size > 0", i);
            return r->status;
        }
    bool ok = true;
    json_t *doc = json_object(), *md = json_object(), *infos = json_array(),
           *names = json_array(), *group = json_object(), *groups = json_array();
    if (!doc || !md || !infos || !names || !group || !groups) {
        json_decref(doc);
        json_decref(md);
        json_decref(infos);
        json_decref(names);
        json_decref(group);
        json_decref(groups);
        kvcm_result_fail(r, KVCM_TRANSPORT, "registerInstance: out of memory");
        return r->status;
    }
    for (size_t i = 0; i < inst->n_specs; i++) {
        json_t *si = json_object();
        if (!si) {
            ok = false;
            break;
        }
        put(si, "name", json_string(inst->spec_names[i]), &ok);
        put(si, "size", jstr_u64(inst->spec_sizes[i]), &ok);
        if (json_array_append_new(infos, si) != 0 ||
            json_array_append_new(names, json_string(inst->spec_names[i])) != 0)
            ok = false;
    }
    put(md, "model_name", json_string(inst->model_name), &ok);
    put(md, "dtype", json_string(inst->dtype), &ok);
    put(md, "use_mla", json_false(), &ok);
    put(md, "tp_size", json_integer(inst->tp_size), &ok);
    put(md, "dp_size", json_integer(1), &ok);
    put(md, "pp_size", json_integer(1), &ok);
    put(md, "lora_name", json_string(""), &ok);
    put(md, "extra", json_string(inst->extra ? inst->extra : ""), &ok);
    put(md, "user_data", json_string(""), &ok);
    put(group, "name", json_string("default"), &ok);
    put(group, "spec_names", names, &ok);
    if (json_array_append_new(groups, group) != 0)
        ok = false;
    put(doc, "instance_group", json_string(inst->instance_group), &ok);
    put(doc, "instance_id", json_string(inst->instance_id), &ok);
    put(doc, "block_size", json_integer(inst->block_size), &ok);
    put(doc, "model_deployment", md, &ok);
    put(doc, "location_spec_infos", infos, &ok);
    put(doc, "location_spec_groups", groups, &ok);
    if (!ok) {
        json_decref(doc);
        kvcm_result_fail(r, KVCM_TRANSPORT, "registerInstance: out of memory (or a string that is "
                         "not UTF-8)");
        return r->status;
    }
    json_t *reply = kvcm_call(c, "registerInstance", doc, timeout_ms, r);
    json_decref(doc);
    json_decref(reply);
    return r->status;
}

/* retry_after_ms, snapshot_required, committed_snapshot_version of a reportEvent reply. */
static void report_fields(json_t *reply, struct kvcm_result *r)
{
    json_t *ra = json_object_get(reply, "retry_after_ms");
    json_t *sr = json_object_get(reply, "snapshot_required");
    json_t *sv = json_object_get(reply, "committed_snapshot_version");
    const char *bad = NULL;
    if (!absent(ra) && !kvcm_json_u64(ra, &r->retry_after_ms))
        bad = "retry_after_ms (not a non-negative int64)";
    else if (!absent(sr) && !json_is_boolean(sr))
        bad = "snapshot_required (not a bool)";
    else if (!absent(sv) && (!json_is_string(sv) ||
                             json_string_length(sv) >= sizeof r->snapshot_version ||
                             strlen(json_string_value(sv)) != json_string_length(sv)))
        bad = "committed_snapshot_version (not a string under 64 bytes)";
    if (bad) {
        int was = r->status;
        r->retry_after_ms = 0;
        r->snapshot_version[0] = '\0';
        kvcm_result_fail(r, KVCM_TRANSPORT, "reportEvent: %s reply with a malformed %s",
                         kvcm_status_name(was), bad);
        return;
    }
    r->snapshot_required = json_is_true(sr);
    if (json_is_string(sv))
        snprintf(r->snapshot_version, sizeof r->snapshot_version, "%s", json_string_value(sv));
}

int kvcm_report_events(struct kvcm_client *c, const char *instance_id, const char *host_ip_port,
                       const char *storage_type, json_t *events, uint32_t timeout_ms,
                       struct kvcm_result *r)
{
    struct kvcm_result scratch;
    if (!r)
        r = &scratch;
    kvcm_result_reset(r);
    if (!nonempty(instance_id) || !nonempty(host_ip_port) || !nonempty(storage_type) ||
        !json_is_array(events)) {
        BAD_ARG(r, "reportEvent needs instance_id, host_ip_port, storage_type (non-empty) and "
                "an events array");
        return r->status;
    }
    json_t *doc = json_pack("{s:s, s:s, s:s, s:O}", "instance_id", instance_id, "host_ip_port",
                            host_ip_port, "storage_type", storage_type, "events", events);
    if (!doc) {
        kvcm_result_fail(r, KVCM_TRANSPORT, "reportEvent: out of memory (or a string that is not "
                         "UTF-8)");
        return r->status;
    }
    json_t *reply = kvcm_call(c, "reportEvent", doc, timeout_ms, r);
    json_decref(doc);
    if (reply)
        report_fields(reply, r);
    json_decref(reply);
    return r->status;
}

int kvcm_host_cache_state(struct kvcm_client *c, const char *instance_id, const int64_t *keys,
                          size_t n, uint32_t timeout_ms, struct kvcm_host_match *hosts,
                          size_t max, size_t *nhosts, struct kvcm_result *r)
{
    struct kvcm_result scratch;
    size_t nh_scratch;
    if (!r)
        r = &scratch;
    if (!nhosts)
        nhosts = &nh_scratch;
    kvcm_result_reset(r);
    *nhosts = 0;
    if (!nonempty(instance_id) || (n && !keys) || (max && !hosts)) {
        BAD_ARG(r, "getHostCacheState needs instance_id (non-empty), keys and a hosts array");
        return r->status;
    }
    bool ok = true;
    json_t *doc = json_object(), *ks = json_array();
    if (!doc || !ks) {
        json_decref(doc);
        json_decref(ks);
        kvcm_result_fail(r, KVCM_TRANSPORT, "getHostCacheState: out of memory");
        return r->status;
    }
    for (size_t i = 0; ok && i < n; i++)
        if (json_array_append_new(ks, jstr_i64(keys[i])) != 0)
            ok = false;
    put(doc, "instance_id", json_string(instance_id), &ok);
    put(doc, "query_type", json_string("QT_PREFIX_MATCH"), &ok);
    put(doc, "block_cache_keys", ks, &ok);
    put(doc, "medium", json_array(), &ok);
    if (!ok) {
        json_decref(doc);
        kvcm_result_fail(r, KVCM_TRANSPORT, "getHostCacheState: out of memory (or an instance_id "
                         "that is not UTF-8)");
        return r->status;
    }
    json_t *reply = kvcm_call(c, "getHostCacheState", doc, timeout_ms, r);
    json_decref(doc);
    if (reply && r->status == KVCM_OK) {
        json_t *hv = json_object_get(reply, "hosts");
        if (!absent(hv) && !json_is_array(hv)) {
            kvcm_result_fail(r, KVCM_TRANSPORT, "getHostCacheState: OK reply whose hosts is not an "
                             "array");
        } else {
            size_t i;
            json_t *e;
            json_array_foreach(hv, i, e) {
                if (*nhosts >= max)
                    break;
                json_t *hip = json_object_get(e, "host_ip_port");
                uint64_t local;
                /* malformed entries are skipped: a count past the keys asked is garbage too */
                if (!json_is_object(e) || !json_is_string(hip) || json_string_length(hip) == 0 ||
                    json_string_length(hip) >= sizeof hosts->host_ip_port ||
                    strlen(json_string_value(hip)) != json_string_length(hip) ||
                    !kvcm_json_u64(json_object_get(e, "local"), &local) || local > n)
                    continue;
                struct kvcm_host_match *m = &hosts[(*nhosts)++];
                snprintf(m->host_ip_port, sizeof m->host_ip_port, "%s", json_string_value(hip));
                m->matched = local;
            }
        }
    }
    json_decref(reply);
    return r->status;
}

/* ---- EventItem builders ------------------------------------------------------------------ */

/* {event_type: type, <payload_name>: payload} (payload stolen). */
static json_t *event(const char *type, const char *payload_name, json_t *payload)
{
    json_t *e = payload ? json_object() : NULL;
    bool ok = e != NULL;
    if (e) {
        put(e, "event_type", json_string(type), &ok);
        put(e, payload_name, payload, &ok);
        payload = NULL;
    }
    json_decref(payload);
    if (!ok) {
        json_decref(e);
        return NULL;
    }
    return e;
}

/* [{name: spec, uri: uri}] */
static json_t *specs_of(const char *spec_name, const char *uri)
{
    json_t *sp = json_object(), *a = json_array();
    bool ok = sp && a && spec_name && uri;
    if (ok) {
        put(sp, "name", json_string(spec_name), &ok);
        put(sp, "uri", json_string(uri), &ok);
        if (json_array_append(a, sp) != 0)
            ok = false;
    }
    json_decref(sp);
    if (!ok) {
        json_decref(a);
        return NULL;
    }
    return a;
}

/* {block_key, medium, specs:[{name, uri}]}: block_add's payload and a snapshot block. */
static json_t *block_of(int64_t key, const char *medium, const char *spec_name, const char *uri)
{
    json_t *b = medium ? json_object() : NULL;
    bool ok = b != NULL;
    if (b) {
        put(b, "block_key", jstr_i64(key), &ok);
        put(b, "medium", json_string(medium), &ok);
        put(b, "specs", specs_of(spec_name, uri), &ok);
    }
    if (!ok) {
        json_decref(b);
        return NULL;
    }
    return b;
}

json_t *kvcm_event_node_register(const char *const *mediums, size_t n)
{
    json_t *p = json_object(), *a = json_array();
    bool ok = p && a && (mediums || n == 0);
    for (size_t i = 0; ok && i < n; i++)
        if (!mediums[i] || json_array_append_new(a, json_string(mediums[i])) != 0)
            ok = false;
    if (ok) {
        put(p, "mediums", a, &ok);
        a = NULL;
    }
    json_decref(a);
    if (!ok) {
        json_decref(p);
        return NULL;
    }
    return event("EVENT_NODE_REGISTER", "node_register", p);
}

json_t *kvcm_event_block_add(int64_t key, const char *medium, const char *spec_name,
                             const char *uri)
{
    return event("EVENT_BLOCK_ADD", "block_add", block_of(key, medium, spec_name, uri));
}

json_t *kvcm_event_block_delete(int64_t key, const char *medium, const char *spec_name)
{
    json_t *p = medium && spec_name ? json_object() : NULL;
    bool ok = p != NULL;
    if (p) {
        json_t *names = json_array();
        if (!names || json_array_append_new(names, json_string(spec_name)) != 0)
            ok = false;
        put(p, "block_key", jstr_i64(key), &ok);
        put(p, "medium", json_string(medium), &ok);
        if (ok)
            put(p, "spec_names", names, &ok);
        else
            json_decref(names);
    }
    if (!ok) {
        json_decref(p);
        return NULL;
    }
    return event("EVENT_BLOCK_DELETE", "block_delete", p);
}

json_t *kvcm_event_heartbeat(json_t *system_status)
{
    if (!system_status)
        system_status = json_object();
    if (!json_is_object(system_status)) {
        json_decref(system_status);
        return NULL;
    }
    json_t *p = json_object();
    bool ok = p != NULL;
    if (p)
        put(p, "system_status", system_status, &ok);
    else
        json_decref(system_status);
    if (!ok) {
        json_decref(p);
        return NULL;
    }
    return event("EVENT_HEARTBEAT", "heartbeat", p);
}

json_t *kvcm_event_host_down(void)
{
    return event("EVENT_HOST_DOWN", "host_down", json_object());
}

json_t *kvcm_event_snapshot(json_t *blocks)
{
    if (!json_is_array(blocks)) {
        json_decref(blocks);
        return NULL;
    }
    json_t *p = json_object();
    bool ok = p != NULL;
    if (p)
        put(p, "blocks", blocks, &ok);
    else
        json_decref(blocks);
    if (!ok) {
        json_decref(p);
        return NULL;
    }
    return event("EVENT_BLOCK_SNAPSHOT", "block_snapshot", p);
}

json_t *kvcm_snapshot_block(int64_t key, const char *medium, const char *spec_name,
                            const char *uri)
{
    return block_of(key, medium, spec_name, uri);
}
