/* kvnodectl: what every command uses: allocation, error reports, the
 * connection to the daemon, its stats document and JSON output. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

/* ------------------------------------------------------------------------ */
/* allocation and error reports                                              */

void oom(void)
{
    fputs(PROG ": out of memory\n", stderr);
    exit(EXIT_ERR);
}

void *xreallocarray(void *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        oom();
    size_t bytes = n * size;
    p = realloc(p, bytes ? bytes : 1);
    if (!p)
        oom();
    return p;
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        oom();
    return s;
}

int usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs(PROG ": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nTry '" PROG " --help' for more information.\n", stderr);
    return EXIT_USAGE;
}

int io_error(const char *what)
{
    fprintf(stderr, PROG ": %s: %s\n", what, strerror(errno));
    return EXIT_ERR;
}

/* A failed call on a connected client. */
int lib_error(int rc, const kvnode_client *c)
{
    const char *msg = c ? kvnode_last_error(c) : NULL;
    if (msg && *msg)
        fprintf(stderr, PROG ": %s: %s\n", kvnode_strerror(rc), msg);
    else
        fprintf(stderr, PROG ": %s\n", kvnode_strerror(rc));
    return EXIT_ERR;
}

/* A failed kvnode_connect: exit 1 when the daemon or library rejected what we
 * asked for (layout, argument, memory), 4 for every other failure. */
static int connect_error(int rc, const char *path)
{
    const char *msg = kvnode_connect_error();
    if (msg && *msg)
        fprintf(stderr, PROG ": %s: %s\n", kvnode_strerror(rc), msg);
    else
        fprintf(stderr, PROG ": %s: %s\n", kvnode_strerror(rc), path);
    if (rc == -KVNODE_ELAYOUT || rc == -KVNODE_EINVAL || rc == -KVNODE_ENOMEM)
        return EXIT_ERR;
    return EXIT_CONNECT;
}

/* ------------------------------------------------------------------------ */
/* connection                                                                */

static void apply_timeout_env(const struct ctl *x)
{
    /* The library reads KVNODE_TIMEOUT_MS; setting it makes -t bound the
     * connect handshake too, not only the calls after it. */
    if (x->timeout_ms > 0) {
        char b[16];
        snprintf(b, sizeof b, "%d", x->timeout_ms);
        setenv("KVNODE_TIMEOUT_MS", b, 1);
    }
}

int ctl_connect(const struct ctl *x, const kvnode_layout *layout, bool reader, kvnode_client **c)
{
    apply_timeout_env(x);
    /* kvnodectl reads blocks with the CPU: it declares no GPU, whatever
     * KVNODE_CUDA_DEVICE says, and is never lent HBM. */
    int rc = kvnode_connect_revision(x->socket, layout, layout ? x->revision : NULL, -1,
                                     reader ? KVNODE_CONNECT_READER : 0, c);
    if (rc < 0) {
        *c = NULL;
        return connect_error(rc, x->socket);
    }
    if (x->timeout_ms > 0)
        kvnode_set_timeout(*c, x->timeout_ms);
    if (layout) {
        uint64_t bb = kvnode_block_bytes(*c);
        if (bb && bb != layout->block_bytes) {
            fprintf(stderr, PROG ": daemon reports %" PRIu64 " bytes per block, expected %" PRIu64 "\n",
                    bb, layout->block_bytes);
            kvnode_close(*c);
            *c = NULL;
            return EXIT_ERR;
        }
    }
    return EXIT_OK;
}

/* Fetch and parse the stats document of an observer connection. */
int fetch_stats(const struct ctl *x, json_t **doc)
{
    kvnode_client *c;
    int ex = ctl_connect(x, NULL, false, &c);
    if (ex)
        return ex;
    char *text = NULL;
    int rc = kvnode_stats_json(c, &text);
    if (rc < 0) {
        ex = lib_error(rc, c);
        kvnode_close(c);
        free(text);
        return ex;
    }
    kvnode_close(c);
    json_error_t err;
    *doc = json_loads(text ? text : "", 0, &err);
    free(text);
    if (!*doc) {
        fprintf(stderr, PROG ": daemon sent invalid stats JSON: %s (line %d, column %d)\n",
                err.text, err.line, err.column);
        return EXIT_ERR;
    }
    if (!json_is_object(*doc)) {
        fprintf(stderr, PROG ": daemon sent a stats document that is not a JSON object\n");
        json_decref(*doc);
        *doc = NULL;
        return EXIT_ERR;
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* output                                                                    */

int print_json(json_t *doc, size_t flags)
{
    char *s = json_dumps(doc, flags | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (!s)
        oom();
    puts(s);
    free(s);
    return EXIT_OK;
}
