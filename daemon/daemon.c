/* daemon: see daemon.h. */
#include "daemon.h"

#include "admin.h"

int daemon_load_config(const struct daemon *d, struct kvn_config *cfg, char *err, size_t errlen)
{
    config_defaults(cfg);
    if (d->config_path && config_load_file(cfg, d->config_path, err, errlen) < 0)
        return -1;
    for (int i = 0; i < d->noverrides; i++)
        if (config_apply_override(cfg, d->overrides[i], err, errlen) < 0)
            return -1;
    return config_validate(cfg, err, errlen);
}

void daemon_stats_json(void *arg, json_t *root)
{
    const struct daemon *d = arg;
    json_t *reloads = json_object();
    const char *admin = d->admin ? admin_address(d->admin) : NULL;

    json_object_set_new(root, "admin", admin ? json_string(admin) : json_null());
    json_object_set_new(reloads, "ok_total", json_integer((json_int_t)d->reloads_ok));
    json_object_set_new(reloads, "failed_total", json_integer((json_int_t)d->reloads_failed));
    json_object_set_new(reloads, "last_error", json_string(d->last_reload_error));
    json_object_set_new(root, "reloads", reloads);
}
