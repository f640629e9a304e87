/* curlinit: see curlinit.h. */
#include "core/curlinit.h"

#include <pthread.h>

static pthread_once_t curlinit_flag = PTHREAD_ONCE_INIT;
static CURLcode curlinit_rc;

static void curlinit_run(void)
{
    curlinit_rc = curl_global_init(CURL_GLOBAL_ALL);
}

CURLcode curlinit_once(void)
{
    pthread_once(&curlinit_flag, curlinit_run);
    return curlinit_rc;
}
