/* rmtree: remove a directory tree a test made (rm -r, not following links;
 * what cannot be removed is left). Header-only, for every test and bench. */
#ifndef KVNODE_TEST_RMTREE_H
#define KVNODE_TEST_RMTREE_H

#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

static inline int test_rmtree_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* dir NULL or "": nothing. */
static inline void test_rmtree(const char *dir)
{
    if (dir && dir[0])
        nftw(dir, test_rmtree_one, 32, FTW_DEPTH | FTW_PHYS);
}

#endif
