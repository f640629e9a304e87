/* warm: warm restarts (issue 33) — the host tier handed from a daemon that
 * stops cleanly to the next one, so its blocks are served at once.
 *
 * At a clean stop (once the connections and their leases are gone and the
 * store's drain is over) warm_build writes a snapshot of every tenant's
 * sealed host blocks (cache_handover_collect) into a memfd: a header (magic,
 * format version, the writer's version, the memory.* geometry it depends
 * on, the sizes of its records), per tenant its name, host tier size and
 * counts, its namespaces' layouts and fingerprints and its blocks, all
 * covered by a CRC-32C; the memfd is sealed (no write, no resize) and goes,
 * with each tenant's host memfd, to systemd's fd store (warm_handover_systemd)
 * or to a `kvnoded --takeover` peer (takeover.h). Names tell the fds apart:
 * WARM_FD_SNAPSHOT, WARM_FD_HOST_PREFIX<tenant>.
 *
 * At start warm_open reads what was handed over and checks it (seals,
 * magic, version, record sizes, checksum, every count inside the memfd,
 * memory.slab_bytes and memory.huge_pages as now, each tenant's host memfd
 * present); tenants_create checks the rest (host tier sizes, every block
 * inside its arena and on a slot, no overlap, layouts of this tenant) and
 * adopts; warm_finish records the outcome for /stats and /metrics. Anything
 * that does not check out closes every fd and the start is cold, with one
 * log line saying why. HBM blocks are not handed over (device memory is the
 * process's): they are dropped at the stop, and come back from the store
 * (as ghosts, by the recovery scan) where it holds them.
 *
 * Loop thread (main) only. */
#ifndef KVNODE_WARM_H
#define KVNODE_WARM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sdnotify.h"

struct kvn_config;
struct tenants;
struct tenants_warm;

#define WARM_FD_SNAPSHOT SDN_STORED_PREFIX "snapshot"
#define WARM_FD_HOST_PREFIX SDN_STORED_PREFIX "host-"
/* The snapshot and one host memfd per tenant. */
#define WARM_FDS_MAX (1 + 17)

/* What /stats and /metrics show of this start's hand-over. */
struct warm_status {
    const char *state;          /* "none" (nothing handed over), "adopted", "refused" */
    const char *source;         /* "systemd", "takeover", "" */
    char     why[512];          /* refused: why */
    char     from_version[64];  /* the version of the daemon that handed over */
    uint64_t blocks, bytes;     /* adopted */
    uint64_t dropped_blocks;    /* blocks of tenants no longer configured */
    double   seconds;           /* reading, checking and adopting */
    /* at this daemon's stop */
    uint64_t handed_blocks, handed_bytes;
    bool     handed_over;       /* the next start has it (systemd took it, or a takeover peer) */
};
const struct warm_status *warm_status(void);

/* A snapshot read and checked, its records still in its mapping. */
struct warm_snapshot;

/* fds (named, taken: each is closed or handed on) from systemd's fd store or
 * a takeover (source "systemd" / "takeover"). 1 with *tw filled and *snap
 * set when there is a snapshot that checks out (tenants_create takes tw's
 * fds); 0 when nothing was handed over or it does not check out (every fd
 * closed, the reason logged and kept for warm_status). */
int  warm_open(const struct sdn_fd *fds, size_t n, const char *source, const struct kvn_config *cfg,
               struct tenants_warm *tw, struct warm_snapshot **snap);
/* After tenants_create: the outcome logged and kept; snap freed (NULL ok).
 * Under systemd the stored fds are removed from its store either way. */
void warm_finish(struct warm_snapshot *snap, const struct tenants_warm *tw, struct tenants *ts);

/* At a clean stop: the snapshot and a dup of each tenant's host memfd, named,
 * into fds (WARM_FDS_MAX). Returns how many, 0 when there is nothing to hand
 * over (or no memory for it: logged). */
size_t warm_build(struct tenants *ts, const struct kvn_config *cfg, struct sdn_fd *fds);
/* Under systemd: warm_build's fds into the fd store. Logs what it did. */
void warm_handover_systemd(struct tenants *ts, const struct kvn_config *cfg);
void warm_close_fds(struct sdn_fd *fds, size_t n);
/* A takeover peer got warm_build's fds (warm_status()->handed_over). */
void warm_handed_over(void);

#endif
