/* kvs: the backend table (see kvs.h). */
#include "persist/kvs/kvs.h"

#include <string.h>

static const struct kvs_backend *const kvs_backends[] = {
    &kvs_backend_file,
#ifdef KVNODE_HAVE_V6D
    &kvs_backend_v6d,
#endif
    &kvs_backend_redis,
};

const struct kvs_backend *kvs_backend_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof(kvs_backends) / sizeof(kvs_backends[0]); i++)
        if (strcmp(kvs_backends[i]->name, name) == 0)
            return kvs_backends[i];
    return NULL;
}
