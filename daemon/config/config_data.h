/* config_data: what a configuration holds -- struct kvn_config, its
 * [tenant.NAME] sections (struct config_tenant) and their constants. No
 * code: config.h (reading, checking and writing a configuration) and the
 * pieces below it (config_types, the option types; config_tenant, the
 * tenant sections) all build on this header, so none of them needs
 * config.h. Every module that includes config.h sees it. */
#ifndef KVNODE_CONFIG_DATA_H
#define KVNODE_CONFIG_DATA_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config_values.h"
#include "config/kvcm_config.h"

#define CONFIG_ERR_MAX 2048
#define CONFIG_LISTEN_MAX 160   /* [admin] listen text, NUL included */
#define CONFIG_IDLIST_MAX 512   /* allow_uids / allow_gids text, NUL included */
#define CONFIG_OBJECT_NS_MAX 128 /* [persist] object_namespace, NUL included (V6D_OBJECT_NS_MAX) */
#define CONFIG_REDIS_NODES_MAX 1024 /* [persist] nodes, NUL included */
#define CONFIG_REDIS_USER_MAX  128  /* [persist] user, NUL included */
#define CONFIG_TENANTS_MAX      16 /* [tenant.NAME] sections */
#define CONFIG_TENANT_NAME_MAX  32 /* NAME: 1..31 of [A-Za-z0-9_-], NUL included */
#define CONFIG_TENANT_DEFAULT "default" /* the tenant of clients no [tenant.NAME] lists */

/* [tenant.NAME]: engines that trust each other, named by peer credentials,
 * with memory of their own (issue 15). Clients whose uid is in uid_list or
 * whose gid is in gid_list belong to it; a client in no section belongs to
 * the tenant "default", which gets what the sections leave of
 * memory.host_bytes and hbm.bytes. No section at all: one tenant, "default",
 * with everything (a single-tenant node, as before tenants existed). */
struct config_tenant {
    char     name[CONFIG_TENANT_NAME_MAX];
    char     uids[CONFIG_IDLIST_MAX];    /* users (names or numbers) (reloadable: new connections) */
    char     gids[CONFIG_IDLIST_MAX];    /* groups (reloadable: new connections) */
    struct config_idlist uid_list;       /* uids resolved */
    struct config_idlist gid_list;       /* gids resolved */
    uint64_t host_bytes;                 /* its host tier, carved out of memory.host_bytes (restart) */
    uint64_t hbm_bytes;                  /* its HBM per device, out of hbm.bytes; 0: none (restart) */
    uint32_t max_namespaces;             /* namespaces it may hold active (reloadable) */
    uint32_t max_clients;                /* connections at once (reloadable); unset: its memory's share of
                                            [server] max_clients */
    double   max_reserved_per_client;    /* share of its memory one connection may reserve (reloadable) */
    /* host_bytes / hbm_bytes written "N%": N (1..100) of memory.host_bytes /
     * hbm.bytes; 0: written as a size. config_resolve turns a share into
     * bytes (rounded down to whole 64KiB) in host_bytes / hbm_bytes; the
     * share is kept so /config prints what was written. */
    uint32_t host_share;
    uint32_t hbm_share;
    /* CONFIG_TENANT_INHERIT_* bits: the limits the section leaves unset,
     * which config_resolve copies from [server] max_namespaces, [server]
     * max_clients and [leases] max_reserved_per_client (and copies again on
     * every resolve, so they follow those options). Before config_resolve
     * an unset limit is 0. */
    uint32_t inherited;
};
#define CONFIG_TENANT_INHERIT_MAX_NAMESPACES 1u
#define CONFIG_TENANT_INHERIT_MAX_CLIENTS    2u
#define CONFIG_TENANT_INHERIT_MAX_RESERVED   4u

struct kvn_config {
    /* [server] */
    char     socket_path[PATH_MAX];  /* unix socket engines connect to */
    unsigned socket_mode;            /* permission bits of the socket file, e.g. 0660 */
    char     socket_group[CONFIG_NAME_MAX]; /* group owning the socket file ("": leave it) */
    char     allow_uids[CONFIG_IDLIST_MAX]; /* users allowed to connect ("": anyone) */
    char     allow_gids[CONFIG_IDLIST_MAX]; /* groups allowed to connect ("": anyone) */
    uint32_t socket_gid;             /* socket_group resolved (when it is set; config_resolve) */
    struct config_idlist allow_uid_list; /* allow_uids resolved */
    struct config_idlist allow_gid_list; /* allow_gids resolved */
    uint32_t max_frame_bytes;        /* largest accepted frame (header excluded) */
    uint32_t max_keys_per_request;   /* largest key chain in one request */
    uint32_t max_clients;            /* connections beyond this are refused */
    uint32_t max_namespaces;         /* distinct (deployment, tp_rank) pairs */
    uint32_t request_timeout_ms;     /* bound on a deferred reply (promotion waits) */
    uint32_t shutdown_timeout_ms;    /* SIGTERM: bound on finishing in-flight work */
    uint32_t frame_timeout_ms;       /* a frame in progress that stops arriving is dropped */
    uint64_t max_buffered_input_bytes; /* room for frames being received, all clients together */
    uint32_t hello_timeout_ms;       /* a connection without HELLO this long after accept is closed */
    uint64_t max_buffered_output_bytes; /* unread replies, all clients together (each tenant its share) */
    uint32_t worker_stall_timeout_ms; /* a worker silent this long is stalled (/readyz, watchdog) */

    /* [memory] */
    uint64_t host_bytes;             /* size of the host-memory tier (memfd arena) */
    uint64_t slab_bytes;             /* allocator slab; largest block size accepted */
    double   high_watermark;         /* fraction of host_bytes that starts eviction */
    double   low_watermark;          /* eviction stops below this fraction */
    int      pin_host;               /* CONFIG_PIN_{AUTO,ON,OFF}: cudaHostRegister the arena */
    int      numa;                   /* CONFIG_NUMA_{AUTO,OFF}: host memory placement (restart) */
    uint64_t namespace_quota;        /* host-tier bytes one namespace may hold (0: no quota) */
    int      huge_pages;             /* CONFIG_HUGE_{OFF,AUTO,ON}: back the host arena with huge pages (restart) */
    uint64_t pin_chunk_bytes;        /* pin_host registers the arena in chunks of this (restart) */

    /* [hbm] (restart-only except the watermarks and release_timeout) */
    int      hbm_backend;            /* CONFIG_HBM_*: auto (cuda when a GPU is visible), cuda, sim, none */
    uint64_t hbm_bytes;              /* GPU memory owned per device, 0: no HBM tier */
    char     hbm_devices[CONFIG_IDLIST_MAX]; /* "all", or device ordinals (config_hbm_devices) */
    struct config_devices hbm_device_list;   /* hbm_devices parsed */
    double   hbm_high_watermark;     /* fraction of a device's arena that starts demotion (reloadable) */
    double   hbm_low_watermark;      /* demotion stops below this fraction (reloadable) */
    int      hbm_required;           /* 1: start fails when HBM is asked for (bytes > 0) and unavailable */
    uint64_t hbm_copy_batch_bytes;   /* largest demotion batch (one transfer job) */
    uint32_t hbm_release_timeout_ms; /* stop: how long clients lent HBM get to unmap it and close;
                                        0: told, not waited for (reloadable) */
    uint32_t hbm_alloc_retry_ms;     /* an HBM region short of memory at start is retried this long */

    /* [leases] */
    uint32_t read_lease_ttl_ms;      /* reaper ends read leases older than this */
    uint32_t write_lease_ttl_ms;     /* reaper aborts write leases older than this */
    uint32_t reaper_interval_ms;     /* how often the reaper runs */
    uint32_t max_leases_per_client;  /* open leases per connection */
    double   max_reserved_per_client; /* share of the host tier one connection may hold
                                         in uncommitted put reservations */

    /* [log] */
    int      log_level;              /* LOG_LEVEL_* */

    /* [admin] */
    char     admin_listen[CONFIG_LISTEN_MAX]; /* "HOST:PORT", "unix:PATH" or "off" */
    struct config_listen admin_listen_addr;   /* admin_listen parsed */
    uint32_t admin_max_connections;  /* admin connections beyond this are refused */
    uint32_t admin_request_timeout_ms; /* a request must arrive whole within this */

    /* [persist] */
    int      persist_backend;        /* CONFIG_BACKEND_*: off, file (default), v6d, redis (restart) */
    int      persist_policy;         /* CONFIG_POLICY_*: when blocks are written (reloadable) */
    char     persist_path[PATH_MAX]; /* file: root directory (restart) */
    uint64_t persist_capacity;       /* file: segment bytes on disk before the oldest are dropped, 0: none (restart) */
    int      persist_fsync;          /* CONFIG_FSYNC_*: never, batch, always (restart) */
    uint64_t persist_segment_bytes;  /* file: a segment closes at this size (restart) */
    int      persist_direct_io;      /* file: CONFIG_DIRECT_*: auto, on, off (restart) */
    uint32_t persist_workers;        /* worker threads (restart) */
    uint32_t persist_queue;          /* outstanding store jobs before drops (restart) */
    char     persist_url[CONFIG_URL_MAX];   /* v6d: control-plane base URL (restart) */
    char     persist_socket[PATH_MAX];      /* v6d: data-plane unix socket (restart) */
    uint32_t persist_connect_timeout_ms;    /* v6d: connect bound (restart) */
    uint32_t persist_timeout_ms;            /* v6d: bound on one store call (restart) */
    int      persist_lookup;         /* CONFIG_LOOKUP_*: ask the store about keys the index
                                        lacks (auto: only for stores no scan can enumerate) */
    uint32_t persist_lookup_negative_ttl_ms; /* how long a store miss is remembered, so the same
                                        unknown key is not asked about again; 0: never (reloadable) */
    char     persist_object_namespace[CONFIG_OBJECT_NS_MAX]; /* v6d: first part of every object
                                        key, rtp-llm's kvs_object_namespace (restart) */
    uint32_t persist_tombstones;     /* deleted keys hidden from lookups when the store cannot
                                        delete them (v6d), oldest forgotten first (restart) */
    char     persist_nodes[CONFIG_REDIS_NODES_MAX]; /* redis: seed nodes HOST:PORT,... (restart) */
    char     persist_user[CONFIG_REDIS_USER_MAX];   /* redis: ACL user, "": none (restart) */
    char     persist_password_file[PATH_MAX];       /* redis: file with the password, "": the
                                        environment's KVNODE_REDIS_PASSWORD, if any (restart) */

    /* [kvs_server] (restart-only but max_connections, request_timeout; off by default): the rtp-llm
       KVS protocol served to engines (daemon/net/kvs_server.h) */
    int      kvs_enabled;            /* 0 off, 1 on */
    char     kvs_listen[CONFIG_LISTEN_MAX];   /* HTTP control plane: loopback "HOST:PORT" or "unix:PATH" */
    struct config_listen kvs_listen_addr;     /* kvs_listen parsed */
    char     kvs_socket_path[PATH_MAX];       /* data plane (vineyard handshake) unix socket */
    uint32_t kvs_max_body_bytes;     /* largest HTTP request body */
    uint32_t kvs_max_keys;           /* object keys in one acquire */
    uint32_t kvs_max_leases;         /* HTTP leases alive at once (all tenants) */
    uint32_t kvs_default_term_ms;    /* lease term when a request names none */
    uint32_t kvs_max_term_ms;        /* longest term a request may ask for */
    uint32_t kvs_tp_size;            /* TP size of the engines served (namespace identity) */
    uint32_t kvs_max_connections;    /* HTTP connections open at once (reloadable) */
    uint64_t kvs_max_output_bytes;   /* unsent reply bytes of one HTTP connection (reloadable) */
    uint64_t kvs_max_output_total_bytes; /* ... of all of them (reloadable) */
    uint64_t kvs_max_input_total_bytes;  /* bytes of requests being received, all connections (reloadable) */
    uint32_t kvs_request_timeout_ms; /* an HTTP request must arrive whole within this (reloadable) */

    /* [kvcm] (every option restart-only; nothing is sent unless enabled):
       struct kvcm_config, kvcm_config.h */
    struct kvcm_config kvcm;

    /* [tenant.NAME] sections, in file order (0: a single-tenant node) */
    uint32_t ntenants;
    struct config_tenant tenants[CONFIG_TENANTS_MAX];
};

enum { CONFIG_BACKEND_OFF = 0, CONFIG_BACKEND_FILE = 1, CONFIG_BACKEND_V6D = 2, CONFIG_BACKEND_REDIS = 3 };
/* write_through: persist on commit; write_back: persist when a block leaves
 * memory; off: write nothing (the store still serves reads and deletes). */
enum { CONFIG_POLICY_WRITE_THROUGH = 0, CONFIG_POLICY_WRITE_BACK = 1, CONFIG_POLICY_OFF = 2 };
enum { CONFIG_LOOKUP_AUTO = 0, CONFIG_LOOKUP_ON = 1, CONFIG_LOOKUP_OFF = 2 };
/* The store's own values (KVS_FSYNC_*, KVS_DIRECT_*; persist.c checks they agree):
 * config sits below persist and names them itself. */
enum { CONFIG_FSYNC_NEVER = 0, CONFIG_FSYNC_BATCH = 1, CONFIG_FSYNC_ALWAYS = 2 };
enum { CONFIG_DIRECT_AUTO = 0, CONFIG_DIRECT_ON = 1, CONFIG_DIRECT_OFF = 2 };

enum { CONFIG_PIN_AUTO = 0, CONFIG_PIN_ON = 1, CONFIG_PIN_OFF = 2 };
enum { CONFIG_HUGE_OFF = 0, CONFIG_HUGE_AUTO = 1, CONFIG_HUGE_ON = 2 };
enum { CONFIG_NUMA_AUTO = 0, CONFIG_NUMA_OFF = 1 };
enum { CONFIG_HBM_AUTO = 0, CONFIG_HBM_CUDA = 1, CONFIG_HBM_SIM = 2, CONFIG_HBM_NONE = 3 };

/* The ranges the [tenant.NAME] limits share with the options they default
 * to ([server] max_namespaces, [server] max_clients, [leases]
 * max_reserved_per_client): one spelling for both tables. */
#define CONFIG_MAX_NAMESPACES_MIN 1
#define CONFIG_MAX_NAMESPACES_MAX 65536
#define CONFIG_MAX_CLIENTS_MIN 1
#define CONFIG_MAX_CLIENTS_MAX 65536
#define CONFIG_MAX_RESERVED_RANGE .dmin = 0.0, .dmax = 1.0, .dmin_open = true   /* (0, 1] */

#endif
