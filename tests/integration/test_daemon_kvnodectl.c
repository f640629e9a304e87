/* Integration: kvnodectl smoke test against a real daemon (skipped, with a
 * note, when $KVNODECTL is not an executable).
 *
 * - `status` exits 0 and shows the socket path;
 * - `put` of a random file (not a whole number of blocks) prints one key per
 *   block, and `get` of those keys with --size gives the file back byte for
 *   byte, through shared memory and with --inline, and so does a get of the
 *   keys file `put --keys-out` wrote, without --size (the file records the
 *   size; issue 33), while a recorded size the keys cannot hold is a usage
 *   error; the gets connect as
 *   readers (memory lent read-only, the daemon's log says so), the puts not;
 * - `namespaces --json` prints a JSON array that has the namespace used. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define FILE_BYTES 300001   /* 4 full 64 KiB blocks and a partial one */

static const char *ctl_path(void)
{
    const char *p = getenv("KVNODECTL");
    return (p && *p && access(p, X_OK) == 0) ? p : NULL;
}

/* Run argv (within 10 s, else it is killed) and assert exit 0, printing
 * stderr otherwise; returns stdout (free it). */
static char *run_ok(char *const argv[], const char *what)
{
    char *text = NULL, *errtext = NULL;
    int st = proc_exit_code(proc_run(&(struct proc_opts){ .argv = (const char *const *)argv }, 10000, &text,
                                     &errtext));
    ck_assert_msg(st == 0, "kvnodectl %s: exit status %d: %s", what, st, st < 0 ? proc_error() : errtext);
    free(errtext);
    ck_assert_msg(text != NULL, "kvnodectl %s: no output", what);
    return text;
}

START_TEST(kvnodectl_status_put_get_namespaces)
{
    const char *ctl = ctl_path();
    if (!ctl) {
        fprintf(stderr, "test_daemon_kvnodectl: SKIPPED: $KVNODECTL (%s) is not an executable\n",
                getenv("KVNODECTL") ? getenv("KVNODECTL") : "unset");
        return;
    }
    kvh_daemon d;
    KVH_START(&d, NULL);
    char *sock = d.sock;

    /* status */
    char *const st_argv[] = { (char *)ctl, (char *)"-S", sock, (char *)"status", NULL };
    char *text = run_ok(st_argv, "status");
    ck_assert_msg(strstr(text, sock) != NULL, "status does not show the socket %s:\n%s", sock, text);
    free(text);

    /* a random file, not a whole number of blocks */
    char data[PATH_MAX + 16], keys[PATH_MAX + 16], back[PATH_MAX + 16];
    snprintf(data, sizeof data, "%s/data.bin", d.dir);
    snprintf(keys, sizeof keys, "%s/keys.txt", d.dir);
    snprintf(back, sizeof back, "%s/back.bin", d.dir);
    unsigned char *orig = malloc(FILE_BYTES);
    ck_assert_ptr_nonnull(orig);
    uint64_t x = kvh_now_ns() | 1;
    for (size_t i = 0; i < FILE_BYTES; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        orig[i] = (unsigned char)(x >> 24);
    }
    FILE *f = fopen(data, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(orig, 1, FILE_BYTES, f), FILE_BYTES);
    ck_assert_int_eq(fclose(f), 0);

    char size_arg[32];
    snprintf(size_arg, sizeof size_arg, "%d", FILE_BYTES);
    for (int inl = 0; inl < 2; inl++) {
        const char *model = inl ? "ctl-smoke-inline" : "ctl-smoke";
        char *const put_argv[] = { (char *)ctl, (char *)"-S", sock, (char *)"put", (char *)"--model",
                                   (char *)model, (char *)"--block-bytes", (char *)"64KiB",
                                   inl ? (char *)"--inline" : data, inl ? data : NULL, NULL };
        text = run_ok(put_argv, "put");
        /* One decimal key per line, one line per block. */
        int lines = 0;
        for (char *p = text; *p; p++)
            lines += *p == '\n';
        ck_assert_msg(lines == (FILE_BYTES + 65535) / 65536, "put printed %d lines for %d blocks:\n%s", lines,
                      (FILE_BYTES + 65535) / 65536, text);
        f = fopen(keys, "w");
        ck_assert_ptr_nonnull(f);
        fputs(text, f);
        ck_assert_int_eq(fclose(f), 0);
        free(text);

        char *const get_argv[] = { (char *)ctl, (char *)"-S", sock, (char *)"get", (char *)"--model",
                                   (char *)model, (char *)"--block-bytes", (char *)"64KiB",
                                   (char *)"--keys-file", keys, (char *)"-o", back, (char *)"--size", size_arg,
                                   inl ? (char *)"--inline" : NULL, NULL };
        text = run_ok(get_argv, "get");
        free(text);
        size_t blen = 0;
        char *got = kvh_read_file(back, &blen);
        ck_assert_ptr_nonnull(got);
        ck_assert_msg(blen == FILE_BYTES, "get wrote %zu bytes, the file has %d", blen, FILE_BYTES);
        ck_assert_msg(memcmp(got, orig, FILE_BYTES) == 0, "get%s returned different bytes",
                      inl ? " --inline" : "");
        free(got);

        /* The same get with the keys file `put --keys-out` wrote and no --size:
         * the file records the input's size, so the bytes are the file's, the
         * last block not padded (issue 33: `cmp` of what was put and got). */
        char keys_out[PATH_MAX + 16];
        snprintf(keys_out, sizeof keys_out, "%s/keys-out.txt", d.dir);
        char *const put2_argv[] = { (char *)ctl, (char *)"-S", sock, (char *)"put", (char *)"--model",
                                    (char *)model, (char *)"--block-bytes", (char *)"64KiB",
                                    (char *)"--keys-out", keys_out, data, NULL };
        free(run_ok(put2_argv, "put --keys-out"));
        char *const get2_argv[] = { (char *)ctl, (char *)"-S", sock, (char *)"get", (char *)"--model",
                                    (char *)model, (char *)"--block-bytes", (char *)"64KiB",
                                    (char *)"--keys-file", keys_out, (char *)"-o", back,
                                    inl ? (char *)"--inline" : NULL, NULL };
        free(run_ok(get2_argv, "get without --size"));
        got = kvh_read_file(back, &blen);
        ck_assert_ptr_nonnull(got);
        ck_assert_msg(blen == FILE_BYTES, "get of a --keys-out file without --size wrote %zu bytes, the file "
                      "has %d", blen, FILE_BYTES);
        ck_assert_msg(memcmp(got, orig, FILE_BYTES) == 0, "get%s of a --keys-out file returned different bytes",
                      inl ? " --inline" : "");
        free(got);
    }
    free(orig);

    /* A keys file whose recorded size its keys cannot hold (edited by hand, or
     * another file's) is refused as a usage error, and nothing is written. */
    f = fopen(keys, "w");
    ck_assert_ptr_nonnull(f);
    fputs("# size 65537\n1\n", f);   /* one key holds at most 65536 bytes */
    ck_assert_int_eq(fclose(f), 0);
    unlink(back);
    char *const bad_argv[] = { (char *)ctl, (char *)"-S", sock, (char *)"get", (char *)"--model",
                               (char *)"ctl-smoke", (char *)"--block-bytes", (char *)"64KiB",
                               (char *)"--keys-file", keys, (char *)"-o", back, NULL };
    char *out_text = NULL, *err_text = NULL;
    int st = proc_exit_code(proc_run(&(struct proc_opts){ .argv = (const char *const *)bad_argv }, 10000,
                                     &out_text, &err_text));
    ck_assert_msg(st == 2, "get of a keys file recording 65537 bytes for one key: exit %d, not 2: %s", st,
                  err_text ? err_text : "");
    ck_assert_msg(err_text && strstr(err_text, "65537"), "the usage error does not name the size: %s",
                  err_text ? err_text : "");
    ck_assert_msg(access(back, F_OK) != 0, "get wrote %s despite the usage error", back);
    free(out_text);
    free(err_text);

    char *log = kvh_read_log(&d);
    ck_assert_ptr_nonnull(log);
    int readers = 0;
    for (const char *p = log; (p = strstr(p, "reader (memory lent read-only)")) != NULL; p++)
        readers++;
    ck_assert_msg(readers == 4, "%d connections declared themselves readers, not the 4 gets", readers);
    free(log);

    /* namespaces --json */
    char *const ns_argv[] = { (char *)ctl, (char *)"-S", sock, (char *)"--json", (char *)"namespaces", NULL };
    text = run_ok(ns_argv, "--json namespaces");
    json_error_t jerr;
    json_t *arr = json_loads(text, 0, &jerr);
    ck_assert_msg(arr != NULL, "namespaces --json is not JSON (%s):\n%s", jerr.text, text);
    ck_assert_msg(json_is_array(arr) && json_array_size(arr) == 2, "namespaces --json: expected an array "
                  "of the 2 namespaces used:\n%s", text);
    size_t i;
    json_t *ns;
    int found = 0;
    json_array_foreach(arr, i, ns) {
        json_t *m = json_object_get(ns, "model");
        if (json_is_string(m) && strcmp(json_string_value(m), "ctl-smoke") == 0) {
            found = 1;
            ck_assert_int_eq(kvh_json_int(ns, "block_bytes"), 65536);
            ck_assert_int_eq(kvh_json_int(ns, "blocks"), (FILE_BYTES + 65535) / 65536);
        }
    }
    ck_assert_msg(found, "namespaces --json lacks model ctl-smoke:\n%s", text);
    json_decref(arr);
    free(text);

    KVH_STOP_DESTROY(&d);
}
END_TEST

int main(void)
{
    const TTest *const tests[] = { kvnodectl_status_put_get_namespaces };
    return kvh_run_suite("daemon_kvnodectl", "kvnodectl", 30, tests, sizeof tests / sizeof tests[0]);
}
