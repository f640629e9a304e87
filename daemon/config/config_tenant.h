/* config_tenant: the [tenant.NAME] sections of kvnode.conf (issue 15): a
 * second, small option table of the same option types (config_types.h)
 * with its own rows and constants, for every section's keys. config.c
 * hands it the sections (their headers, keys, the checks, config_write,
 * the reload comparison) through the second part of this header; it never
 * calls back into config.c. The first part is for everyone that reads a
 * resolved configuration's tenants. */
#ifndef KVNODE_CONFIG_TENANT_H
#define KVNODE_CONFIG_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config_data.h"

struct opt_def;
struct errbuf;

/* The keys of a [tenant.NAME] section, in config_write order: the i-th
 * key; false past the last one. For the documentation checks, like
 * config_option_at. */
bool config_tenant_option_at(size_t i, const char **key);

/* What the tenant "default" gets of a resolved configuration once the
 * [tenant.NAME] sections have taken theirs: *host of memory.host_bytes,
 * *hbm of hbm.bytes (per device). 0 when what is left does not hold one
 * memory.slab_bytes slab: the default tenant then has no memory in that
 * tier. Without sections: memory.host_bytes and hbm.bytes. Either pointer
 * may be NULL. */
void config_tenant_default_bytes(const struct kvn_config *cfg, uint64_t *host, uint64_t *hbm);
/* The connections the tenant "default" may hold of a resolved
 * configuration: [server] max_clients less what the sections' max_clients
 * take (0 when they take all). Without sections: max_clients. */
uint32_t config_tenant_default_clients(const struct kvn_config *cfg);
/* part of total in the proportion of a tenant's host memory to
 * memory.host_bytes (its share of a node-wide bound, rounded down). */
uint64_t config_tenant_share_of(const struct kvn_config *cfg, uint64_t host_bytes, uint64_t total);

/* ---- for config.c: the sections in the option table's walks ---- */

#define TENANT_PREFIX "tenant."
#define TENANT_PREFIX_LEN (sizeof TENANT_PREFIX - 1)

/* Whether the section name s[0..len) is "tenant." followed by anything. */
bool config_tenant_section(const char *s, size_t len);
/* The index of the tenant NAME (s[0..len), the part after "tenant.") in
 * cfg, added with every key unset when cfg has none of that name. -1 with
 * problem set when NAME is invalid or CONFIG_TENANTS_MAX are there. */
int config_tenant_find_or_add(struct kvn_config *cfg, const char *s, size_t len, char *problem, size_t plen);
/* The index of the tenant NAME, or -1. */
int config_tenant_find(const struct kvn_config *cfg, const char *name);
/* The row of a tenant section's key as it applies to tenant i (offsets
 * into cfg->tenants[i], the inherited type and range); false for an unknown
 * key. */
bool config_tenant_option(const char *key, size_t i, struct opt_def *out);
/* Whether some tenant row has this key (for "it belongs in" hints). */
bool config_tenant_key_known(const char *key);
/* "uids, gids, ... or max_reserved_per_client", for messages. */
const char *config_tenant_keys_hint(void);
/* The [tenant.NAME] checks of config_validate (field by field and between
 * sections); with `resolved`, the tenants' parsed forms go into it. */
void config_tenant_check(const struct kvn_config *cfg, struct kvn_config *resolved, struct errbuf *errors);
/* config_write's [tenant.NAME] sections. */
void config_tenant_write(const struct kvn_config *cfg, FILE *out);
/* The tenants' part of config_restart_required: the count, names appended
 * to buf at *used. */
int config_tenant_restart_required(const struct kvn_config *running, const struct kvn_config *next, char *buf,
                                   size_t buflen, size_t *used);
/* The tenants' part of config_keep_restart_only. */
void config_tenant_keep_restart_only(struct kvn_config *next, const struct kvn_config *running);

#endif
