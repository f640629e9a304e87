/* kvnodectl: the data commands, which bind the namespace of the layout
 * options and move blocks: match, delete, put, get; keys come from the
 * command line or a keys file. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctl.h"

/* Keys per request and bytes per batch; a request refused as too big is
 * retried with half as many keys. */
#define BATCH_KEYS  256u
#define BATCH_BYTES (64u << 20)

/* ------------------------------------------------------------------------ */
/* keys                                                                      */

/* A signed decimal key, surrounding blanks allowed. */
static bool parse_key(const char *s, kvnode_key *out)
{
    while (*s == ' ' || *s == '\t')
        s++;
    if (!((*s >= '0' && *s <= '9') || ((*s == '-' || *s == '+') && s[1] >= '0' && s[1] <= '9')))
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno)
        return false;
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')
        end++;
    if (*end)
        return false;
    *out = (kvnode_key)v;
    return true;
}

/* has_size: the keys file recorded the size of the data the keys were put
 * from (`# size N`, written by put --keys-out), so get can give back exactly
 * those bytes instead of whole blocks. */
struct keyvec { kvnode_key *v; size_t n, cap; bool has_size; uint64_t size; };

/* The comment `# size N` (N decimal) that put --keys-out writes first. */
#define SIZE_COMMENT "# size "

static bool parse_size_comment(const char *p, uint64_t *out)
{
    if (strncmp(p, SIZE_COMMENT, strlen(SIZE_COMMENT)) != 0)
        return false;
    p += strlen(SIZE_COMMENT);
    if (*p < '0' || *p > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno)
        return false;
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')
        end++;
    if (*end)
        return false;
    *out = v;
    return true;
}

static void keyvec_push(struct keyvec *kv, kvnode_key k)
{
    if (kv->n == kv->cap) {
        kv->cap = kv->cap ? 2 * kv->cap : 64;
        kv->v = xreallocarray(kv->v, kv->cap, sizeof *kv->v);
    }
    kv->v[kv->n++] = k;
}

/* One decimal key per line; blank lines and lines starting with '#' are
 * skipped, except one `# size N`, which is kept in kv->size. "-" is standard
 * input. Returns an exit code. */
static int read_keys_file(const char *path, struct keyvec *kv)
{
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "r");
    if (!f)
        return io_error(path);
    char *line = NULL;
    size_t cap = 0;
    unsigned long lineno = 0;
    int rc = EXIT_OK;
    errno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        uint64_t size;
        if (parse_size_comment(p, &size)) {
            if (kv->has_size) {
                rc = usage_error("%s:%lu: a second '" SIZE_COMMENT "N' line (a keys file records one size)",
                                 is_stdin ? "<stdin>" : path, lineno);
                break;
            }
            kv->has_size = true;
            kv->size = size;
            continue;
        }
        if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0')
            continue;
        kvnode_key k;
        if (!parse_key(p, &k)) {
            p[strcspn(p, "\r\n")] = '\0';
            rc = usage_error("%s:%lu: invalid key '%s' (expected a signed 64-bit decimal integer)",
                             is_stdin ? "<stdin>" : path, lineno, p);
            break;
        }
        keyvec_push(kv, k);
    }
    if (rc == EXIT_OK && ferror(f))
        rc = io_error(path);
    free(line);
    if (!is_stdin)
        fclose(f);
    return rc;
}

/* Put every data byte to out, then check the stream (flush included). */
static bool write_all(FILE *out, const void *p, size_t n)
{
    return fwrite(p, 1, n, out) == n;
}

/* ------------------------------------------------------------------------ */
/* data commands                                                             */

static size_t batch_keys(const kvnode_layout *l)
{
    uint64_t by_bytes = BATCH_BYTES / l->block_bytes;
    if (by_bytes < 1)
        by_bytes = 1;
    return by_bytes < BATCH_KEYS ? (size_t)by_bytes : BATCH_KEYS;
}

/* Keys from the command line and/or --keys-file (not both). */
static int collect_keys(const struct ctl *x, char **args, int nargs, struct keyvec *kv)
{
    if (nargs > 0 && x->keys_file)
        return usage_error("give keys either as arguments or with --keys-file, not both");
    if (x->keys_file) {
        int ex = read_keys_file(x->keys_file, kv);
        if (ex)
            return ex;
        if (kv->n == 0)
            return usage_error("%s: no keys", x->keys_file);
        return EXIT_OK;
    }
    if (nargs == 0)
        return usage_error("no keys given (arguments or --keys-file)");
    for (int i = 0; i < nargs; i++) {
        kvnode_key k;
        if (!parse_key(args[i], &k))
            return usage_error("invalid key '%s' (expected a signed 64-bit decimal integer)", args[i]);
        keyvec_push(kv, k);
    }
    return EXIT_OK;
}

static const char *ns_desc(const kvnode_layout *l, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s tp %" PRIu32 "/%" PRIu32, l->model, l->dtype, l->tp_rank, l->tp_size);
    return buf;
}

/* match and delete: send the keys in batches (a batch refused as too big is
 * retried with half as many keys). match stops at the first key that is not
 * stored, so *count is the length of the stored prefix; delete goes through
 * every key and *count is how many were deleted. *nkeys: the keys given. */
static int match_or_delete(const struct ctl *x, char **args, int nargs, bool del, size_t *count,
                           size_t *nkeys, kvnode_tiers *tiers)
{
    struct keyvec kv = {0};
    int ex = collect_keys(x, args, nargs, &kv);
    if (ex) {
        free(kv.v);
        return ex;
    }
    kvnode_client *c;
    if ((ex = ctl_connect(x, &x->layout, !del, &c))) {
        free(kv.v);
        return ex;
    }
    size_t batch = BATCH_KEYS, done = 0, total = 0;
    while (done < kv.n) {
        size_t n = kv.n - done < batch ? kv.n - done : batch, k = 0;
        kvnode_tiers t;
        int rc = del ? kvnode_delete(c, kv.v + done, n, &k) : kvnode_match_tiers(c, kv.v + done, n, &t);
        if (!del && rc == 0) {
            k = t.matched;
            tiers->hbm += t.hbm;
            tiers->host += t.host;
            tiers->store += t.store;
        }
        if (rc == -KVNODE_ETOOBIG && batch > 1) {
            batch /= 2;
            continue;
        }
        if (rc < 0) {
            ex = lib_error(rc, c);
            break;
        }
        total += k < n ? k : n;
        done += n;
        if (!del && k < n)
            break;
    }
    kvnode_close(c);
    *count = total;
    *nkeys = kv.n;
    free(kv.v);
    return ex;
}

int cmd_match(const struct ctl *x, char **args, int nargs)
{
    size_t matched, nkeys;
    kvnode_tiers t = { 0 };
    int ex = match_or_delete(x, args, nargs, false, &matched, &nkeys, &t);
    if (ex)
        return ex;
    if (x->json)
        printf("{\"matched\":%zu,\"keys\":%zu,\"hbm\":%zu,\"host\":%zu,\"store\":%zu}\n",
               matched, nkeys, t.hbm, t.host, t.store);
    else if (t.store || t.hbm)
        printf("matched %zu of %zu (%zu in GPU memory, %zu in host memory, %zu only in the store)\n",
               matched, nkeys, t.hbm, t.host, t.store);
    else
        printf("matched %zu of %zu\n", matched, nkeys);
    return x->require_all && matched < nkeys ? EXIT_PARTIAL : EXIT_OK;
}

int cmd_delete(const struct ctl *x, char **args, int nargs)
{
    size_t deleted, nkeys;
    int ex = match_or_delete(x, args, nargs, true, &deleted, &nkeys, NULL);
    if (ex)
        return ex;
    if (x->json)
        printf("{\"deleted\":%zu,\"keys\":%zu}\n", deleted, nkeys);
    else
        printf("deleted %zu of %zu\n", deleted, nkeys);
    return EXIT_OK;
}

static uint64_t fnv1a64(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Read one block: up to len bytes, the rest zero-filled. Returns the data
 * bytes read (0 at end of file); *err on a read error. */
static size_t read_block(FILE *f, unsigned char *buf, size_t len, bool *err)
{
    size_t got = fread(buf, 1, len, f);
    if (got < len) {
        if (ferror(f))
            *err = true;
        memset(buf + got, 0, len - got);
    }
    return got;
}

int cmd_put(const struct ctl *x, char **args, int nargs)
{
    if (nargs != 1)
        return usage_error(nargs ? "put takes one FILE" : "put: missing FILE");
    const kvnode_layout *l = &x->layout;
    const char *path = args[0];
    bool is_stdin = strcmp(path, "-") == 0;
    const char *disp = is_stdin ? "<stdin>" : path;
    if (l->block_bytes > SIZE_MAX / 2)
        return usage_error("--block-bytes %" PRIu64 " is too large for this machine", l->block_bytes);
    size_t bb = (size_t)l->block_bytes;

    int ex = EXIT_OK;
    FILE *in = NULL, *spool = NULL, *keys_out = NULL;
    kvnode_client *c = NULL;
    unsigned char *buf = NULL;
    const void **src = NULL;
    int64_t *tokens = NULL;
    kvnode_key *keys = NULL;
    size_t n = 0, cap = 0, stored = 0;
    uint64_t total = 0;
    bool err = false;

    in = is_stdin ? stdin : fopen(path, "rb");
    if (!in)
        return io_error(path);
    if (x->keys_out && !(keys_out = fopen(x->keys_out, "w"))) {
        ex = io_error(x->keys_out);
        goto out;
    }
    if ((ex = ctl_connect(x, l, false, &c)))
        goto out;

    /* Pass 1: one digest per block. Input that cannot be read twice (a pipe)
     * is spooled to an anonymous temporary file. */
    struct stat st;
    if (fstat(fileno(in), &st) == 0 && !S_ISREG(st.st_mode) && !(spool = tmpfile())) {
        ex = io_error("temporary file");
        goto out;
    }
    size_t batch = batch_keys(l);
    buf = xreallocarray(NULL, batch, bb);
    for (;;) {
        size_t got = read_block(in, buf, bb, &err);
        if (err) {
            ex = io_error(disp);
            goto out;
        }
        if (got == 0)
            break;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            tokens = xreallocarray(tokens, cap, sizeof *tokens);
        }
        tokens[n++] = (int64_t)fnv1a64(buf, bb);
        total += got;
        if (spool && !write_all(spool, buf, bb)) {
            ex = io_error("temporary file");
            goto out;
        }
        if (got < bb)
            break;
    }
    keys = xreallocarray(NULL, n, sizeof *keys);
    if (n && kvnode_hash_tokens(tokens, n, 1, keys, n) != n) {
        fprintf(stderr, PROG ": kvnode_hash_tokens returned fewer keys than blocks\n");
        ex = EXIT_ERR;
        goto out;
    }

    /* Pass 2: store batch by batch (the digest is checked again, so a file
     * changed in between is refused rather than stored under wrong keys). */
    FILE *data = spool ? spool : in;
    if (n && (fflush(data) != 0 || fseeko(data, 0, SEEK_SET) != 0)) {
        ex = io_error(spool ? "temporary file" : disp);
        goto out;
    }
    clearerr(data);
    src = xreallocarray(NULL, batch, sizeof *src);
    size_t done = 0, req = batch;
    while (done < n) {
        size_t m = n - done < batch ? n - done : batch;
        for (size_t i = 0; i < m; i++) {
            unsigned char *b = buf + i * bb;
            read_block(data, b, bb, &err);
            if (err) {
                ex = io_error(spool ? "temporary file" : disp);
                goto out;
            }
            if ((int64_t)fnv1a64(b, bb) != tokens[done + i]) {
                fprintf(stderr, PROG ": %s: changed while it was being read\n", disp);
                ex = EXIT_ERR;
                goto out;
            }
            src[i] = b;
        }
        /* A request refused as too big is retried with half as many keys. */
        int rc = 0;
        size_t k = 0;
        while (k < m) {
            size_t r = m - k < req ? m - k : req;
            rc = x->use_inline ? kvnode_put_inline(c, keys + done + k, r, src + k)
                               : kvnode_put(c, keys + done + k, r, src + k);
            if (rc == -KVNODE_ETOOBIG && req > 1) {
                req /= 2;
                continue;
            }
            if (rc < 0)
                break;
            k += r;
        }
        done += k;
        stored = done;
        if (rc < 0) {
            ex = lib_error(rc, c);
            if (stored)
                fprintf(stderr, PROG ": %zu of %zu blocks were stored before the error\n", stored, n);
            goto out;
        }
    }

    /* A keys file records the input's size, so that get gives back exactly
     * the bytes put (the last block is stored zero-padded). */
    if (keys_out)
        fprintf(keys_out, SIZE_COMMENT "%" PRIu64 "\n", total);
    FILE *kout = keys_out ? keys_out : stdout;
    for (size_t i = 0; i < n; i++)
        fprintf(kout, "%" PRId64 "\n", (int64_t)keys[i]);
    if (keys_out) {
        int werr = ferror(keys_out);
        int cerr = fclose(keys_out);
        keys_out = NULL;
        if (werr || cerr) {
            if (werr)
                errno = EIO;
            ex = io_error(x->keys_out);
            goto out;
        }
    }
    /* When the keys go to standard output the summary goes to stderr. */
    FILE *sum = x->keys_out ? stdout : stderr;
    char nsb[512];
    if (x->json)
        fprintf(sum, "{\"stored\":%zu,\"bytes\":%" PRIu64 ",\"block_bytes\":%" PRIu64 "}\n", n, total,
                l->block_bytes);
    else
        fprintf(sum, "stored %zu block%s (%" PRIu64 " bytes) in namespace %s\n", n, n == 1 ? "" : "s",
                total, ns_desc(l, nsb, sizeof nsb));
out:
    if (c)
        kvnode_close(c);
    if (keys_out)
        fclose(keys_out);
    if (spool)
        fclose(spool);
    if (in && !is_stdin)
        fclose(in);
    free(buf);
    free(src);
    free(tokens);
    free(keys);
    return ex;
}

int cmd_get(const struct ctl *x, char **args, int nargs)
{
    if (!x->output)
        return usage_error("get: -o OUT is required");
    const kvnode_layout *l = &x->layout;
    if (l->block_bytes > SIZE_MAX / 2)
        return usage_error("--block-bytes %" PRIu64 " is too large for this machine", l->block_bytes);
    size_t bb = (size_t)l->block_bytes;
    struct keyvec kv = {0};
    int ex = collect_keys(x, args, nargs, &kv);
    if (ex) {
        free(kv.v);
        return ex;
    }
    /* --size wins over the size a keys file records; that one must fit its keys. */
    if (kv.has_size && !(x->given & F_SIZE) &&
        (kv.size > (uint64_t)kv.n * bb || kv.size <= (uint64_t)(kv.n - 1) * bb)) {
        ex = usage_error("%s records a size of %" PRIu64 " bytes, which %zu keys of %zu-byte blocks cannot "
                         "hold (give --size, or the keys file put --keys-out wrote)",
                         x->keys_file, kv.size, kv.n, bb);
        free(kv.v);
        return ex;
    }
    bool to_stdout = strcmp(x->output, "-") == 0;
    kvnode_client *c = NULL;
    FILE *out = NULL;
    unsigned char *buf = NULL;
    void **dst = NULL;
    size_t got_total = 0;
    uint64_t written = 0, limit = (x->given & F_SIZE) ? x->size : kv.has_size ? kv.size : UINT64_MAX;

    if ((ex = ctl_connect(x, l, true, &c)))
        goto done;
    out = to_stdout ? stdout : fopen(x->output, "wb");
    if (!out) {
        ex = io_error(x->output);
        goto done;
    }
    size_t batch = batch_keys(l);
    buf = xreallocarray(NULL, batch, bb);
    dst = xreallocarray(NULL, batch, sizeof *dst);
    for (size_t i = 0; i < batch; i++)
        dst[i] = buf + i * bb;
    while (got_total < kv.n) {
        size_t n = kv.n - got_total < batch ? kv.n - got_total : batch, got = 0;
        int rc = x->use_inline ? kvnode_get_inline(c, kv.v + got_total, n, dst, &got)
                               : kvnode_get(c, kv.v + got_total, n, dst, &got);
        if (rc == -KVNODE_ETOOBIG && batch > 1) {
            batch /= 2;
            continue;
        }
        if (rc < 0) {
            ex = lib_error(rc, c);
            goto done;
        }
        if (got > n)
            got = n;
        uint64_t want = (uint64_t)got * bb;
        if (want > limit - written)
            want = limit - written;
        if (want && !write_all(out, buf, (size_t)want)) {
            ex = io_error(x->output);
            goto done;
        }
        written += want;
        got_total += got;
        if (got < n)
            break;
    }
    if (to_stdout ? fflush(out) != 0 : fclose(out) != 0) {
        if (!to_stdout)
            out = NULL;
        ex = io_error(x->output);
        goto done;
    }
    if (!to_stdout)
        out = NULL;
    FILE *sum = to_stdout ? stderr : stdout;
    if (x->json)
        fprintf(sum, "{\"got\":%zu,\"keys\":%zu,\"bytes\":%" PRIu64 "}\n", got_total, kv.n, written);
    else
        fprintf(sum, "got %zu of %zu blocks\n", got_total, kv.n);
    if (got_total < kv.n)
        ex = EXIT_PARTIAL;
done:
    if (c)
        kvnode_close(c);
    if (out && !to_stdout)
        fclose(out);
    free(buf);
    free(dst);
    free(kv.v);
    return ex;
}
