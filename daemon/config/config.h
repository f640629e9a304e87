/* config: kvnode.conf parsing (libinih), command-line overrides, defaults and
 * validation. Owns struct kvn_config (its fields are config_data.h's, the
 * [tenant.NAME] sections' helpers config_tenant.h's; both included here);
 * the daemon keeps one effective copy on the loop thread. Parsing never
 * touches a running config: a reload builds a new struct and swaps it only
 * when the whole file is valid. */
#ifndef KVNODE_CONFIG_H
#define KVNODE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config/config_data.h"
#include "config/config_tenant.h"

/* Embedded defaults (the values conf/kvnode.conf documents), one per row of
 * the option table. */
void config_defaults(struct kvn_config *cfg);

/* The option table, in config_write order: the i-th option's section and
 * key; false past the last one. For tests and tools that check the
 * documentation covers every option. */
bool config_option_at(size_t i, const char **section, const char **key);

/* Parse `path` on top of *cfg. On failure returns -1, leaves *cfg untouched
 * and writes to err one message with one line per problem ("kvnode.conf:12:
 * [memory] host_bytes: invalid size 'abc' (...)"), including syntax errors,
 * unknown sections/keys and an unopenable file ("<path>: cannot open: <strerror>").
 * A repeated key is not an error: the last one wins. Per-field ranges are
 * checked here; cross-field rules only in config_validate (overrides may
 * still change the outcome). */
int config_load_file(struct kvn_config *cfg, const char *path, char *err, size_t errlen);

/* Apply one "section.key=value" override (command line; blanks around the
 * parts are ignored); "tenant.NAME.key=value" sets a tenant's key, adding
 * the tenant when the configuration has none of that name. Same value
 * checks; errors name the option ("override memory.host_bytes: invalid
 * size ..."). *cfg untouched on -1. */
int config_apply_override(struct kvn_config *cfg, const char *assignment, char *err, size_t errlen);

/* Every field's range again (for structs built by code) plus cross-field
 * checks: low_watermark < high_watermark, slab_bytes <= host_bytes, at most
 * 2^32-1 slabs, socket_path non-empty and shorter than sun_path (108 bytes
 * including the NUL); [persist]: path non-empty when backend = file, url
 * (http:// or https://) and socket_path non-empty when backend = v6d;
 * [kvcm] with enabled = on: every required field (endpoints, host_ip_port,
 * instance_group, instance_id, medium_hbm, medium_host, spec_name,
 * location_uri) non-empty, each missing one named on its own line, media
 * distinct, retry_base <= retry_max, batch_events <= queue_events (with
 * kvcm off its fields are only range-checked); [hbm]: low_watermark <
 * high_watermark, bytes 0 or at least memory.slab_bytes (at most 2^32-1
 * slabs), devices parses (config_hbm_devices). [tenant.NAME] sections:
 * at most CONFIG_TENANTS_MAX, names valid and distinct, each with uids or
 * gids and a host_bytes of at least memory.slab_bytes, hbm_bytes 0 or at
 * least slab_bytes; a uid (gid) in one section at most; host_bytes
 * together at most memory.host_bytes, hbm_bytes together at most
 * hbm.bytes; with [server] allow_uids or allow_gids set, every tenant uid
 * admitted by them (listed, root, the daemon's own user, or one of its
 * groups in allow_gids); with [kvcm] enabled = on, {fingerprint} in
 * [kvcm] instance_id (two tenants' deployments of one layout differ only
 * in it).
 * 0, or -1 with one line per problem in err. */
int config_validate(const struct kvn_config *cfg, char *err, size_t errlen);

/* config_validate, then fill the parsed forms (allow_uid_list,
 * allow_gid_list, socket_gid, admin_listen_addr, hbm_device_list,
 * kvcm.endpoint_list; each tenant's uid_list and gid_list, its host_bytes
 * and hbm_bytes from a share, its unset limits from [server] and
 * [leases]) from their text options. 0, or -1 with err set as
 * config_validate sets it and *cfg untouched. */
int config_resolve(struct kvn_config *cfg, char *err, size_t errlen);

/* Write the effective configuration in kvnode.conf syntax, every option,
 * sizes and durations in the largest exact unit; the output parses back to
 * an identical struct. */
void config_write(const struct kvn_config *cfg, FILE *out);

/* Reload support: how many restart-only options differ between the running
 * and the next config (0: the whole change can be applied live); their
 * "section.key" names go comma-separated into buf (may be NULL). Tenants:
 * one added or removed is "tenant.NAME", a changed size
 * "tenant.NAME.host_bytes" / "tenant.NAME.hbm_bytes" (compared in bytes,
 * a share as it resolves), sections in another order "tenant.order". */
int config_restart_required(const struct kvn_config *running, const struct kvn_config *next,
                            char *buf, size_t buflen);
/* Copy every restart-only option of `running` into `next`, so a reload
 * leaves them as they run. Tenants: next keeps running's sections, in
 * running's order, with running's host_bytes and hbm_bytes; a section both
 * have takes next's uids, gids and limits; one only running has stays as
 * it is, one only next has is left out. The result may break a rule
 * between tenants (a uid moved into a tenant from one kept until restart):
 * config_resolve it again before using it. */
void config_keep_restart_only(struct kvn_config *next, const struct kvn_config *running);
/* true for a known option that may change on reload, false otherwise.
 * section "tenant" or "tenant.NAME": the keys of a tenant section. */
bool config_option_reloadable(const char *section, const char *key);

/* The value parsers (config_parse_size, config_parse_listen, ...) are
 * config_values.h's; the [kvcm] helpers (config_kvcm_expand, ...) are
 * kvcm_config.h's. Both are included above. */

#endif
