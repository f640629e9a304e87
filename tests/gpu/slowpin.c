/* slowpin: the libcuda.so.1 that `gpu-check.sh --sim` gives kvnoded for its
 * demotion behaviour: the strict fake CUDA, with every cuMemHostRegister_v2
 * delayed by GPU_CHECK_PIN_DELAY_MS (default 100), so the daemon's
 * background pinning is still running when demotion starts, as it is with
 * a large host arena on a real GPU. (The fake registers at once.)
 *
 * Only that entry point is defined here; the fake is a dependency of this
 * object, so the daemon's dlsym on this library's handle finds every other
 * entry point in the fake. */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

int cuMemHostRegister_v2(void *p, size_t size, unsigned int flags);

int cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    static int (*real)(void *, size_t, unsigned int);
    if (!real) {
        void *f = dlsym(RTLD_NEXT, "cuMemHostRegister_v2");
        if (!f)
            return 999;     /* CUDA_ERROR_UNKNOWN: no fake underneath */
        *(void **)&real = f;
    }
    const char *v = getenv("GPU_CHECK_PIN_DELAY_MS");
    long ms = v && *v ? strtol(v, NULL, 10) : 100;
    if (ms > 0 && ms <= 60000) {
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
    return real(p, size, flags);
}
