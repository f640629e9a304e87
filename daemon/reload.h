/* reload: SIGHUP (and admin-requested) configuration reload. Parses and
 * validates the whole file first; on any error keeps the running
 * configuration and records the error; otherwise applies every reloadable
 * option at once and reports changed restart-only options as not applied.
 *
 * Loop thread only. */
#ifndef KVNODE_RELOAD_H
#define KVNODE_RELOAD_H

#include <stddef.h>

#include "config/config.h"

struct daemon;

struct reload_result {
    int  ok;                           /* 1 applied, 0 kept the running config */
    char error[CONFIG_ERR_MAX];        /* why not, when !ok */
    char not_applied[1024];            /* restart-only options that changed */
};

/* Returns 0 when the new configuration was applied, -1 otherwise. */
int reload_run(struct daemon *d, struct reload_result *res);

#endif
