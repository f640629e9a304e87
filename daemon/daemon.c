/* daemon: see daemon.h. */
#include "daemon.h"

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
