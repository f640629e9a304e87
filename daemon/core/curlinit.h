/* curlinit: libcurl's process-wide initialisation, done once for every
 * module that makes HTTP calls (the v6d store backend, the KVCM client),
 * from whichever thread gets there first. */
#ifndef KVNODE_CURLINIT_H
#define KVNODE_CURLINIT_H

#include <curl/curl.h>

/* curl_global_init(CURL_GLOBAL_ALL) on the first call; its result on every call. */
CURLcode curlinit_once(void);

#endif
