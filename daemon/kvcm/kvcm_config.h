/* kvcm_config: the [kvcm] option checks, next to the code that uses the
 * options. config.c's table calls them for the [kvcm] rows (parse/check
 * step) and from config_validate (the rules between [kvcm] options); the
 * helpers the KVCM code calls at run time (config_kvcm_expand,
 * config_kvcm_endpoints, config_kvcm_storage_type_name) are declared in
 * config.h and defined here. Pure functions, any thread. */
#ifndef KVNODE_KVCM_CONFIG_H
#define KVNODE_KVCM_CONFIG_H

#include <stddef.h>

#include "config.h"

struct errbuf;

/* Template placeholders, one bit each: which ones an option may use. */
enum {
    KVCM_VAR_MODEL = 1u << 0, KVCM_VAR_DTYPE = 1u << 1, KVCM_VAR_BLOCK_TOKENS = 1u << 2,
    KVCM_VAR_TP_SIZE = 1u << 3, KVCM_VAR_FINGERPRINT = 1u << 4, KVCM_VAR_HOST_IP_PORT = 1u << 5,
    KVCM_VAR_MEDIUM = 1u << 6, KVCM_VAR_BLOCK_BYTES = 1u << 7, KVCM_VAR_KEY = 1u << 8,
};
/* What identifies a deployment: instance_id's placeholders. */
#define KVCM_VARS_DEPLOYMENT (KVCM_VAR_MODEL | KVCM_VAR_DTYPE | KVCM_VAR_BLOCK_TOKENS | KVCM_VAR_TP_SIZE | \
                              KVCM_VAR_FINGERPRINT)

/* The wire names of [kvcm] storage_type, in CONFIG_KVCM_STORAGE_* order. */
extern const char *const kvcm_config_storage_names[2];

/* Option `key`'s template t: every '{' opens a placeholder in `vars`,
 * closed by '}'; no stray '}'. 0, or -1 with problem set. */
int kvcm_config_check_template(const char *key, unsigned vars, const char *t, char *problem, size_t len);

/* host_ip_port s (non-empty): HOST:PORT, port 1..65535, naming this host
 * uniquely (no loopback, unspecified or localhost names). `shown` is s as
 * messages print it. 0, or -1 with problem set. */
int kvcm_config_check_host_ip_port(const char *s, const char *shown, char *problem, size_t len);

/* Split an endpoints list (see config_kvcm_endpoints) into list, which is
 * zeroed first. 0, or -1 with problem (may be NULL) set. */
int kvcm_config_split_endpoints(const char *text, struct config_urllist *list, size_t max, char *problem,
                                size_t len);

/* The rules between [kvcm] options, with enabled = on: every required field
 * set (each missing one on its own line), media distinct, retry_base <=
 * retry_max, batch_events <= queue_events. Off: nothing. */
void kvcm_config_validate(const struct kvn_config *cfg, struct errbuf *errors);

#endif
