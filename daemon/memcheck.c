/* memcheck: admission of the memory tiers (see memcheck.h). */
#include "memcheck.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/devmem.h"

#define MIB (UINT64_C(1) << 20)
/* cgroup v1 reports "no limit" as a huge page-aligned number
 * (PAGE_COUNTER_MAX pages); anything this large is no limit. */
#define CGROUP_V1_UNLIMITED (UINT64_C(1) << 62)
#define SMALL_FILE_MAX 16384   /* memory.stat of a busy cgroup fits */

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

static void note_unread(struct memcheck_room *room, const char *fmt, const char *a, const char *b)
{
    size_t used = strlen(room->unread);
    if (used + 2 >= sizeof room->unread)
        return;
    if (used)
        used += (size_t)snprintf(room->unread + used, sizeof room->unread - used, "; ");
    if (used < sizeof room->unread)
        snprintf(room->unread + used, sizeof room->unread - used, fmt, a, b);
}

/* The whole of a small file, NUL-terminated. Bytes read, or -1 (errno set). */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got + 1 < len) {
        ssize_t n = read(fd, buf + got, len - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

/* DIGITS at *p (leading blanks skipped); 0 and *p past them, or -1. */
static int parse_u64(const char **p, uint64_t *out)
{
    const char *s = *p + strspn(*p, " \t");
    uint64_t v = 0;
    if (*s < '0' || *s > '9')
        return -1;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *p = s;
    *out = v;
    return 0;
}

/* The value of "key <number>" (meminfo: "key: <number> kB") in text, or -1. */
static int find_field(const char *text, const char *key, uint64_t *out)
{
    size_t klen = strlen(key);
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, key, klen) != 0 || (line[klen] != ' ' && line[klen] != '\t'))
            continue;
        const char *p = line + klen;
        return parse_u64(&p, out);
    }
    return -1;
}

static void probe_meminfo(const char *path, struct memcheck_room *room)
{
    char buf[SMALL_FILE_MAX];
    uint64_t total_kb, avail_kb;
    if (read_small(path, buf, sizeof buf) < 0) {
        note_unread(room, "%s: %s", path, strerror(errno));
        return;
    }
    if (find_field(buf, "MemTotal:", &total_kb) == 0 && total_kb <= UINT64_MAX / 1024)
        room->mem_total = total_kb * 1024;
    if (find_field(buf, "MemAvailable:", &avail_kb) == 0 && avail_kb <= UINT64_MAX / 1024)
        room->mem_available = avail_kb * 1024;
    else
        note_unread(room, "%s: %s", path, "no MemAvailable line");
    /* The default-size hugetlb pool: its pages are not in MemAvailable. */
    uint64_t free_pages, rsvd_pages = 0, page_kb;
    if (find_field(buf, "HugePages_Free:", &free_pages) == 0 && find_field(buf, "Hugepagesize:", &page_kb) == 0 &&
        page_kb <= UINT64_MAX / 1024) {
        (void)find_field(buf, "HugePages_Rsvd:", &rsvd_pages);
        room->hugetlb_page = page_kb * 1024;
        uint64_t pages = free_pages > rsvd_pages ? free_pages - rsvd_pages : 0;
        room->hugetlb_free = pages <= UINT64_MAX / room->hugetlb_page ? pages * room->hugetlb_page : UINT64_MAX;
    }
}

/* One cgroup directory's limit and unreclaimable usage. 1 with a limit,
 * 0 without one (no file, or unlimited). */
static int read_cgroup_dir(const char *dir, bool v2, uint64_t *limit, uint64_t *usage)
{
    char path[PATH_MAX + 32], buf[SMALL_FILE_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes") >=
            sizeof path ||
        read_small(path, buf, sizeof buf) < 0)
        return 0;
    const char *p = buf;
    if (parse_u64(&p, limit) < 0 || (!v2 && *limit >= CGROUP_V1_UNLIMITED))
        return 0;   /* "max", or v1's "no limit" */
    *usage = 0;
    p = buf;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes") <
            sizeof path &&
        read_small(path, buf, sizeof buf) >= 0)
        (void)parse_u64(&p, usage);
    /* Page cache is reclaimed before the limit bites: it is room. Shared
     * memory (another arena, tmpfs) is on the anon lists, so stays counted. */
    if ((size_t)snprintf(path, sizeof path, "%s/memory.stat", dir) < sizeof path &&
        read_small(path, buf, sizeof buf) >= 0) {
        uint64_t active = 0, inactive = 0;
        (void)find_field(buf, v2 ? "active_file" : "total_active_file", &active);
        (void)find_field(buf, v2 ? "inactive_file" : "total_inactive_file", &inactive);
        *usage = sat_sub(*usage, sat_add(active, inactive));
    }
    return 1;
}

/* The cgroup at base + rel and each ancestor up to base: the one leaving
 * the least room goes into room when it leaves less than the one there. */
static void probe_hierarchy(const char *base, const char *rel, bool v2, struct memcheck_room *room)
{
    char path[PATH_MAX];
    if (rel[0] != '/' || strstr(rel, "/..") || strlen(rel) >= sizeof path) {
        /* Outside our cgroup namespace's view: its files are not reachable. */
        note_unread(room, "cgroup path '%.64s' under %s", rel, base);
        return;
    }
    snprintf(path, sizeof path, "%s", rel);
    size_t n = strlen(path);
    while (n > 0 && path[n - 1] == '/')
        path[--n] = '\0';
    for (;;) {
        char dir[PATH_MAX];
        uint64_t limit, usage;
        if ((size_t)snprintf(dir, sizeof dir, "%s%s", base, path) < sizeof dir &&
            read_cgroup_dir(dir, v2, &limit, &usage)) {
            bool tighter = room->cgroup_limit == MEMCHECK_UNKNOWN ||
                           sat_sub(sat_sub(limit, usage), memcheck_margin(limit)) <
                               sat_sub(sat_sub(room->cgroup_limit, room->cgroup_usage),
                                       memcheck_margin(room->cgroup_limit));
            if (tighter) {
                room->cgroup_limit = limit;
                room->cgroup_usage = usage;
                if ((size_t)snprintf(room->cgroup_file, sizeof room->cgroup_file, "%s/%s", dir,
                                     v2 ? "memory.max" : "memory.limit_in_bytes") >= sizeof room->cgroup_file)
                    room->cgroup_file[0] = '\0';   /* cannot happen: the file was read by that name */
            }
        }
        if (path[0] == '\0')
            break;
        char *slash = strrchr(path, '/');
        *slash = '\0';
    }
}

static void probe_cgroups(const char *self, const char *root, struct memcheck_room *room)
{
    char buf[SMALL_FILE_MAX];
    if (read_small(self, buf, sizeof buf) < 0) {
        note_unread(room, "%s: %s", self, strerror(errno));
        return;
    }
    /* "ID:CONTROLLERS:PATH": v2 is "0::PATH", v1's memory hierarchy lists
     * "memory" among its controllers. */
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = *c2 = '\0';
        const char *controllers = c1 + 1, *path = c2 + 1;
        char base[PATH_MAX + 16];
        if (strcmp(line, "0") == 0 && controllers[0] == '\0') {
            probe_hierarchy(root, path, true, room);
            continue;
        }
        for (const char *c = controllers; *c;) {
            size_t len = strcspn(c, ",");
            if (len == 6 && strncmp(c, "memory", 6) == 0) {
                snprintf(base, sizeof base, "%s/memory", root);
                probe_hierarchy(base, path, false, room);
                break;
            }
            c += len + (c[len] == ',');
        }
    }
}

void memcheck_probe(const struct memcheck_sources *src, struct memcheck_room *room)
{
    const struct memcheck_sources none = { 0 };
    if (!src)
        src = &none;
    memset(room, 0, sizeof *room);
    room->mem_total = room->mem_available = room->cgroup_limit = MEMCHECK_UNKNOWN;
    probe_meminfo(src->meminfo ? src->meminfo : "/proc/meminfo", room);
    probe_cgroups(src->self_cgroup ? src->self_cgroup : "/proc/self/cgroup",
                  src->cgroup_root ? src->cgroup_root : "/sys/fs/cgroup", room);
}

uint64_t memcheck_margin(uint64_t total)
{
    uint64_t share = total == MEMCHECK_UNKNOWN ? 0 : total / MEMCHECK_MARGIN_SHARE;
    return share > MEMCHECK_MARGIN_MIN ? share : MEMCHECK_MARGIN_MIN;
}

/* [hbm] devices as config_resolve parsed it (hbm_device_list), as gpu.c reads it. */
static unsigned sim_devices(const struct kvn_config *cfg)
{
    const struct config_devices *devs = &cfg->hbm_device_list;
    unsigned count = 0;
    if (devs->n == 0)
        return DEVMEM_SIM_DEVICES;
    for (size_t i = 0; i < devs->n && i < CONFIG_HBM_DEVICES_MAX; i++)
        if (devs->dev[i] < DEVMEM_SIM_DEVICES)   /* others are left out at start */
            count++;
    return count;
}

/* With [tenant.NAME] sections the tenants' arenas split memory.host_bytes
 * and hbm.bytes (each rounded down to its own slabs): the totals below
 * bound them all. */
uint64_t memcheck_demand(const struct kvn_config *cfg, char *what, size_t whatlen)
{
    uint64_t host = cfg->slab_bytes ? cfg->host_bytes / cfg->slab_bytes * cfg->slab_bytes : cfg->host_bytes;
    unsigned sims = cfg->hbm_backend == CONFIG_HBM_SIM && cfg->hbm_bytes > 0 ? sim_devices(cfg) : 0;
    uint64_t total = host;
    for (unsigned i = 0; i < sims; i++)
        total = sat_add(total, cfg->hbm_bytes);
    if (what && whatlen) {
        if (sims)
            snprintf(what, whatlen, "memory.host_bytes + hbm.bytes x %u (hbm.backend = sim keeps each "
                     "simulated GPU in host memory)", sims);
        else
            snprintf(what, whatlen, "memory.host_bytes");
    }
    return total;
}

void memcheck_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
    if (bytes == MEMCHECK_UNKNOWN) {
        snprintf(buf, len, "unknown");
        return;
    }
    unsigned u = 0;
    while (u + 1 < sizeof units / sizeof units[0] && bytes >> (10 * (u + 1)) != 0)
        u++;
    uint64_t unit = UINT64_C(1) << (10 * u);
    if (bytes % unit == 0)
        snprintf(buf, len, "%" PRIu64 "%s", bytes / unit, units[u]);
    else
        snprintf(buf, len, "%.1f%s", (double)bytes / (double)unit, units[u]);
}

int memcheck_admit(const struct kvn_config *cfg, const struct memcheck_room *room, char *msg, size_t msglen)
{
    char what[160], want[32], avail[32], margin[32], allowed_s[32], limit[32], usage[32];
    uint64_t demand = memcheck_demand(cfg, what, sizeof what);
    /* memory.huge_pages != off and the pool holds the host arena: the arena
     * (kvnoded tries the pool first) takes pool pages, which MemAvailable
     * does not count; only the rest of the demand is checked against it. */
    char pool[160] = "";
    uint64_t host = cfg->slab_bytes ? cfg->host_bytes / cfg->slab_bytes * cfg->slab_bytes : cfg->host_bytes;
    uint64_t host_pages = room->hugetlb_page ? (host + room->hugetlb_page - 1) / room->hugetlb_page : 0;
    if (cfg->huge_pages != CONFIG_HUGE_OFF && room->hugetlb_page && room->hugetlb_free != MEMCHECK_UNKNOWN &&
        host_pages * room->hugetlb_page <= room->hugetlb_free) {
        char pool_free[32];
        memcheck_format_size(room->hugetlb_free, pool_free, sizeof pool_free);
        snprintf(pool, sizeof pool, "; memory.host_bytes comes from the hugetlb pool (%s free), not MemAvailable",
                 pool_free);
        demand -= host;
    }
    memcheck_format_size(demand, want, sizeof want);

    uint64_t by_mem = MEMCHECK_UNKNOWN, by_cgroup = MEMCHECK_UNKNOWN;
    uint64_t mem_margin = memcheck_margin(room->mem_total);
    uint64_t cg_margin = memcheck_margin(room->cgroup_limit);
    if (room->mem_available != MEMCHECK_UNKNOWN)
        by_mem = sat_sub(room->mem_available, mem_margin);
    if (room->cgroup_limit != MEMCHECK_UNKNOWN)
        by_cgroup = sat_sub(sat_sub(room->cgroup_limit, room->cgroup_usage), cg_margin);
    bool cgroup_binds = by_cgroup < by_mem;
    uint64_t allowed = cgroup_binds ? by_cgroup : by_mem;
    memcheck_format_size(allowed, allowed_s, sizeof allowed_s);

    if (allowed != MEMCHECK_UNKNOWN && demand > allowed) {
        const char *sim = strchr(what, '+') ? " (or hbm.bytes)" : "";
        if (cgroup_binds) {
            memcheck_format_size(room->cgroup_limit, limit, sizeof limit);
            memcheck_format_size(room->cgroup_usage, usage, sizeof usage);
            memcheck_format_size(cg_margin, margin, sizeof margin);
            snprintf(msg, msglen,
                     "%s: %s (%" PRIu64 " bytes) exceeds what kvnoded's cgroup may still hold: its memory "
                     "limit is %s (%" PRIu64 " bytes, %s), %s of it is in use, and %s is kept free, which "
                     "leaves %s; lower memory.host_bytes%s to at most %" PRIu64 "MiB, or raise the limit "
                     "(MemoryMax= of the service)",
                     what, want, demand, limit, room->cgroup_limit, room->cgroup_file, usage, margin, allowed_s,
                     sim, allowed / MIB);
        } else {
            memcheck_format_size(room->mem_available, avail, sizeof avail);
            memcheck_format_size(mem_margin, margin, sizeof margin);
            snprintf(msg, msglen,
                     "%s: %s (%" PRIu64 " bytes) exceeds the host memory this machine can give: MemAvailable "
                     "is %s (%" PRIu64 " bytes, /proc/meminfo) and %s is kept free, which leaves %s; lower "
                     "memory.host_bytes%s to at most %" PRIu64 "MiB (or free memory first)",
                     what, want, demand, avail, room->mem_available, margin, allowed_s, sim, allowed / MIB);
        }
        return -1;
    }

    char cg[PATH_MAX + 128];
    if (room->cgroup_limit == MEMCHECK_UNKNOWN) {
        snprintf(cg, sizeof cg, "no cgroup memory limit");
    } else {
        memcheck_format_size(room->cgroup_limit, limit, sizeof limit);
        memcheck_format_size(room->cgroup_usage, usage, sizeof usage);
        snprintf(cg, sizeof cg, "cgroup limit %s with %s in use, %s", limit, usage, room->cgroup_file);
    }
    memcheck_format_size(room->mem_available, avail, sizeof avail);
    snprintf(msg, msglen, "memory: reserving %" PRIu64 " bytes (%s) of host memory for %s; %s may be reserved "
             "(MemAvailable %s, %s; a margin is kept free)%s%s%s",
             demand, want, what, allowed == MEMCHECK_UNKNOWN ? "an unknown amount" : allowed_s, avail, cg, pool,
             room->unread[0] ? "; not checked: " : "", room->unread);
    return 0;
}
