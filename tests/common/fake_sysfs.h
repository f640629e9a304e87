/* A fake sysfs tree (for $KVNODE_SYSFS_ROOT, daemon/mem/numa.h): NUMA node
 * directories and PCI devices with vendor, class and numa_node files, so
 * tests can describe a machine of several NUMA nodes and GPUs on one that
 * has neither. Header-only; used by unit and integration tests. */
#ifndef KVNODE_TEST_FAKE_SYSFS_H
#define KVNODE_TEST_FAKE_SYSFS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rmtree.h"

static inline int fake_sysfs_mkdirs(const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && access(buf, F_OK) != 0)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) == 0 || access(buf, F_OK) == 0 ? 0 : -1;
}

static inline int fake_sysfs_write(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* <root>/devices/system/node/node0 .. node<nodes-1>. */
static inline int fake_sysfs_nodes(const char *root, unsigned nodes)
{
    char path[512];
    for (unsigned n = 0; n < nodes; n++) {
        snprintf(path, sizeof path, "%s/devices/system/node/node%u", root, n);
        if (fake_sysfs_mkdirs(path) != 0)
            return -1;
    }
    snprintf(path, sizeof path, "%s/bus/pci/devices", root);
    return fake_sysfs_mkdirs(path);
}

/* One PCI device: vendor "0x10de", class "0x030200" (3D controller) etc. */
static inline int fake_sysfs_pci(const char *root, const char *bus_id, const char *vendor,
                                 const char *cls, int node)
{
    char dir[512], num[32];
    snprintf(dir, sizeof dir, "%s/bus/pci/devices/%s", root, bus_id);
    snprintf(num, sizeof num, "%d\n", node);
    if (fake_sysfs_mkdirs(dir) != 0 || fake_sysfs_write(dir, "vendor", vendor) != 0 ||
        fake_sysfs_write(dir, "class", cls) != 0 || fake_sysfs_write(dir, "numa_node", num) != 0)
        return -1;
    return 0;
}

/* Remove the tree. */
static inline void fake_sysfs_remove(const char *root)
{
    test_rmtree(root);
}

#endif
