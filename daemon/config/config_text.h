/* config_text: how kvnode.conf text reads and how a message echoes it --
 * unit multipliers, the sun_path bound, the width of a value in a message,
 * the credentials hint. Shared by the config pieces (config.c,
 * config_types.c, config_values.c) and kvcm_config.c; config.h does
 * not include it, so these short names stay out of the rest of the daemon.
 * Macros only. */
#ifndef KVNODE_CONFIG_TEXT_H
#define KVNODE_CONFIG_TEXT_H

#include <stdint.h>
#include <sys/un.h>

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

#define MS_PER_S UINT64_C(1000)
#define MS_PER_M (60 * MS_PER_S)
#define MS_PER_H (60 * MS_PER_M)

/* sun_path holds the socket path including its terminating NUL. */
#define SUN_PATH_SIZE sizeof(((struct sockaddr_un *)0)->sun_path)

#define VALUE_SHOW  80    /* longest value echoed back in a message ... */
#define SHOWN "%.83s"     /* ... plus "...": the format for it */

#define CREDENTIALS_HINT "not shown here; credentials in a URL would be printed by /config, --check-config " \
                         "and in logs"

#endif
