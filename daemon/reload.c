/* reload: see reload.h. */
#include "reload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "core/log.h"
#include "net/ops.h"
#include "sdnotify.h"
#include "net/server.h"
#include "tenants/tenants.h"

int reload_run(struct daemon *d, struct reload_result *res)
{
    struct kvn_config *next = malloc(sizeof *next), *old = d->cfg;

    memset(res, 0, sizeof *res);
    sdn_reloading(d);
    if (!next) {
        snprintf(res->error, sizeof res->error, "out of memory");
    } else if (daemon_load_config(d, next, res->error, sizeof res->error) == 0) {
        if (config_restart_required(old, next, res->not_applied, sizeof res->not_applied) > 0) {
            log_warn("reload: %s changed but need%s a restart; keeping the running value%s",
                     res->not_applied, strchr(res->not_applied, ',') ? "" : "s",
                     strchr(res->not_applied, ',') ? "s" : "");
            config_keep_restart_only(next, old);
            /* What is kept and what is new must still agree (a uid moved
             * into a tenant from one that stays until the restart). The
             * message goes after its preamble; cleared when all is well. */
            int n = snprintf(res->error, sizeof res->error, "with %.400s kept as running until a restart, the "
                             "configuration is invalid:\n", res->not_applied);
            size_t at = n > 0 && (size_t)n < sizeof res->error ? (size_t)n : 0;
            if (config_resolve(next, res->error + at, sizeof res->error - at) < 0) {
                res->not_applied[0] = '\0';
                goto fail;
            }
            res->error[0] = '\0';
        }
        d->cfg = next;
        log_set_level(next->log_level);
        tenants_apply_config(d->tenants, next);
        ops_apply_config(d->ops, next);
        server_apply_config(d->server, next);
        free(old);
        d->reloads_ok++;
        d->last_reload_error[0] = '\0';
        res->ok = 1;
        log_info("configuration reloaded");
        sdn_ready(d);
        return 0;
    }
fail:
    free(next);
    d->reloads_failed++;
    snprintf(d->last_reload_error, sizeof d->last_reload_error, "%s", res->error);
    log_error("reload failed; keeping the running configuration:\n%s", res->error);
    sdn_ready(d);
    return -1;
}
