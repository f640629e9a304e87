/* kvnodectl: operator command-line tool of kvnoded. This file: the options,
 * --help, the argument order, the command table and main().
 *
 * Observer commands (status, stats, namespaces, ping, reload) connect without a layout
 * and read the daemon's statistics document; data commands (match, put, get,
 * delete) bind the namespace given by the layout options and move blocks with
 * the public client API (lib/kvnode.h) only. The put/get keying (one FNV-1a
 * digest per block as a "token", block_tokens 1) is a smoke test of the
 * daemon, not any engine's keying; see kvnodectl(1). ctl.h says which file
 * owns which command.
 *
 * Exit codes: 0 ok, 1 daemon/library/I-O error, 2 usage, 3 partial result,
 * 4 cannot connect. Single-threaded; owns nothing beyond one command. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ctl.h"

#ifndef KVNODE_VERSION_STRING
#define KVNODE_VERSION_STRING "unknown"
#endif

#define DEFAULT_SOCKET "/run/kvnode/kvnode.sock"

/* ------------------------------------------------------------------------ */
/* options                                                                   */

enum {
    OPT_JSON = 256, OPT_MODEL, OPT_DTYPE, OPT_BLOCK_TOKENS, OPT_BLOCK_BYTES,
    OPT_LAYERS, OPT_KV_HEADS, OPT_HEAD_DIM, OPT_TP_SIZE, OPT_TP_RANK, OPT_EXTRA,
    OPT_KEYS_FILE, OPT_KEYS_OUT, OPT_SIZE, OPT_REQUIRE_ALL, OPT_INLINE, OPT_ADMIN, OPT_REVISION,
};

static const char short_opts[] = "+S:t:hVo:";
static const struct option long_opts[] = {
    {"socket",       required_argument, NULL, 'S'},
    {"json",         no_argument,       NULL, OPT_JSON},
    {"timeout",      required_argument, NULL, 't'},
    {"help",         no_argument,       NULL, 'h'},
    {"version",      no_argument,       NULL, 'V'},
    {"model",        required_argument, NULL, OPT_MODEL},
    {"dtype",        required_argument, NULL, OPT_DTYPE},
    {"block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS},
    {"block-bytes",  required_argument, NULL, OPT_BLOCK_BYTES},
    {"layers",       required_argument, NULL, OPT_LAYERS},
    {"kv-heads",     required_argument, NULL, OPT_KV_HEADS},
    {"head-dim",     required_argument, NULL, OPT_HEAD_DIM},
    {"tp-size",      required_argument, NULL, OPT_TP_SIZE},
    {"tp-rank",      required_argument, NULL, OPT_TP_RANK},
    {"extra",        required_argument, NULL, OPT_EXTRA},
    {"revision",     required_argument, NULL, OPT_REVISION},
    {"keys-file",    required_argument, NULL, OPT_KEYS_FILE},
    {"keys-out",     required_argument, NULL, OPT_KEYS_OUT},
    {"output",       required_argument, NULL, 'o'},
    {"size",         required_argument, NULL, OPT_SIZE},
    {"require-all",  no_argument,       NULL, OPT_REQUIRE_ALL},
    {"inline",       no_argument,       NULL, OPT_INLINE},
    {"admin",        required_argument, NULL, OPT_ADMIN},
    {NULL, 0, NULL, 0},
};

/* ------------------------------------------------------------------------ */
/* option values                                                             */

/* Unsigned decimal with no sign, no junk, within max. */
static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

static bool parse_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    if (!parse_u64(s, UINT32_MAX, &v))
        return false;
    *out = (uint32_t)v;
    return true;
}

/* SIZE: decimal bytes with an optional binary suffix: K, M, G, T, with or
 * without "iB" (KiB, MiB, ...), or B; case-insensitive. K = 1024. */
static bool parse_size(const char *s, uint64_t *out)
{
    static const char *const units[] = {"", "k", "m", "g", "t"};
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return false;
    unsigned shift = 0;
    if (*end) {
        size_t i, n = sizeof units / sizeof units[0];
        for (i = 1; i < n; i++)
            if (tolower((unsigned char)*end) == units[i][0])
                break;
        if (i < n) {
            shift = 10 * (unsigned)i;
            end++;
            if (strcasecmp(end, "ib") == 0)
                end += 2;
        } else if (strcasecmp(end, "b") == 0) {
            end++;
        }
        if (*end)
            return false;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return false;
    *out = (uint64_t)v << shift;
    return true;
}

static bool is_negative_number(const char *s)
{
    if (s[0] != '-' || !s[1])
        return false;
    for (s++; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* ------------------------------------------------------------------------ */
/* argument handling                                                         */

static void print_help(void)
{
    fputs(
"Usage: " PROG " [OPTION]... COMMAND [ARG]...\n"
"Operator tool of kvnoded, the node-local KV-cache daemon.\n"
"\n"
"Commands:\n"
"  status                        summary: version, uptime, tiers, namespaces, clients, leases\n"
"  stats                         the daemon's whole statistics document\n"
"  namespaces                    table of the namespaces\n"
"  ping                          check that the daemon answers\n"
"  reload                        make the daemon re-read its config file (root or its user)\n"
"  purge deployment ID [tenant T] drop every block of a deployment (memory, HBM, store)\n"
"  purge model NAME [tenant T]   the same for every deployment of a model\n"
"  metrics [--admin ADDR]        print the Prometheus metrics from the admin HTTP listener\n"
"  match  LAYOUT KEY...          length of the cached prefix of a key chain\n"
"  put    LAYOUT FILE            store FILE as a chain of blocks; print the keys\n"
"  get    LAYOUT -o OUT KEY...   read a chain of blocks into OUT\n"
"  delete LAYOUT KEY...          remove keys\n"
"\n"
"Global options:\n"
"  -S, --socket PATH       daemon socket (default $KVNODE_SOCKET, else " DEFAULT_SOCKET ")\n"
"      --json              machine-readable output\n"
"  -t, --timeout MS        per-call timeout in milliseconds (default $KVNODE_TIMEOUT_MS, else 10000)\n"
"  -h, --help              show this help and exit\n"
"  -V, --version           show the version and exit\n"
"\n"
"Layout options (match, put, get, delete):\n"
"      --model M           model name (required)\n"
"      --dtype D           data type (default bf16)\n"
"      --block-tokens N    tokens per block (default 16)\n"
"      --block-bytes SIZE  bytes of one block (required)\n"
"      --layers N, --kv-heads N, --head-dim N   (default 1 each)\n"
"      --tp-size N         tensor-parallel size (default 1)\n"
"      --tp-rank N         tensor-parallel rank (default 0)\n"
"      --extra S           free-form layout discriminator\n"
"      --revision R        the model's weights revision (part of the namespace identity)\n"
"\n"
"Command options:\n"
"      --keys-file F       keys, one decimal per line ('-': stdin) (match, get, delete)\n"
"      --require-all       match: exit 3 unless every key is cached\n"
"      --keys-out F        put: write the keys to F instead of standard output, with the\n"
"                          input's size (a '# size N' line: get gives back those bytes)\n"
"  -o, --output OUT        get: output file ('-': standard output)\n"
"      --size BYTES        get: truncate the output to BYTES (default: the size the keys\n"
"                          file records, else whole blocks)\n"
"      --inline            put, get: move the bytes inside the messages (no shared memory)\n"
"      --admin ADDR        metrics: admin address (HOST:PORT or unix:PATH; default: asked\n"
"                          from the daemon's stats)\n"
"\n"
"SIZE and BYTES take the suffixes K, M, G, T (powers of 1024; KiB, MiB, ... also accepted).\n"
"Put negative keys after '--' or in a keys file if they could be taken for options.\n"
"Exit status: 0 ok, 1 error, 2 usage error, 3 partial result, 4 cannot connect.\n"
"See kvnodectl(1).\n", stdout);
}

static const struct option *find_long(const char *name, size_t len)
{
    const struct option *hit = NULL;
    for (const struct option *o = long_opts; o->name; o++) {
        if (strncmp(o->name, name, len) != 0)
            continue;
        if (strlen(o->name) == len)
            return o;
        if (hit)
            return NULL;   /* ambiguous: getopt_long will say so */
        hit = o;
    }
    return hit;
}

/* Reorder argv to: options (with their values) "--" operands, so options may
 * come before or after the command and negative keys ("-42") are operands,
 * not options. Returns a malloc()ed vector of argc+2 entries (NULL-ended);
 * *missing names a last option that lacks its required value. */
static char **reorder_args(int argc, char **argv, int *nargc, const char **missing)
{
    char **opts = xreallocarray(NULL, (size_t)argc + 2, sizeof *opts);
    char **ops = xreallocarray(NULL, (size_t)argc + 1, sizeof *ops);
    int no = 0, np = 0;
    bool end = false;
    *missing = NULL;
    opts[no++] = (char *)PROG;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (end || a[0] != '-' || a[1] == '\0' || is_negative_number(a)) {
            ops[np++] = a;
        } else if (strcmp(a, "--") == 0) {
            end = true;
        } else if (a[1] == '-') {
            opts[no++] = a;
            const char *eq = strchr(a + 2, '=');
            const struct option *o = find_long(a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
            if (!eq && o && o->has_arg == required_argument) {
                if (i + 1 >= argc) {
                    *missing = a;
                    break;
                }
                opts[no++] = argv[++i];
            }
        } else {
            opts[no++] = a;
            for (const char *p = a + 1; *p; p++) {
                const char *s = strchr(short_opts + 1, *p);
                if (s && *s != ':' && s[1] == ':') {
                    if (p[1] == '\0') {
                        if (i + 1 >= argc)
                            *missing = a;
                        else
                            opts[no++] = argv[++i];
                    }
                    break;
                }
            }
        }
    }
    opts[no++] = (char *)"--";
    memcpy(opts + no, ops, (size_t)np * sizeof *ops);
    opts[no + np] = NULL;
    free(ops);
    *nargc = no + np;
    return opts;
}

static void mark(struct ctl *x, unsigned flag, const char *spelling)
{
    x->given |= flag;
    for (unsigned b = 0; b < 8; b++)
        if (flag == 1u << b)
            x->given_name[b] = spelling;
}

struct command {
    const char *name;
    unsigned allowed;   /* F_* */
    int (*run)(const struct ctl *, char **, int);
    int (*run_noargs)(const struct ctl *);   /* instead of run: takes no arguments */
};

static const struct command commands[] = {
    {"status",     0, NULL, cmd_status},
    {"stats",      0, NULL, cmd_stats},
    {"namespaces", 0, NULL, cmd_namespaces},
    {"ping",       0, NULL, cmd_ping},
    {"reload",     0, NULL, cmd_reload},
    {"purge",      0, cmd_purge, NULL},
    {"metrics",    F_ADMIN, NULL, cmd_metrics},
    {"match",      F_LAYOUT | F_KEYS_FILE | F_REQUIRE_ALL, cmd_match, NULL},
    {"put",        F_LAYOUT | F_KEYS_OUT | F_INLINE, cmd_put, NULL},
    {"get",        F_LAYOUT | F_KEYS_FILE | F_OUTPUT | F_SIZE | F_INLINE, cmd_get, NULL},
    {"delete",     F_LAYOUT | F_KEYS_FILE, cmd_delete, NULL},
};

int main(int argc, char **argv)
{
    struct ctl x = {0};
    x.layout.dtype = "bf16";
    x.layout.block_tokens = 16;
    x.layout.num_layers = x.layout.kv_heads = x.layout.head_dim = 1;
    x.layout.tp_size = 1;
    const char *env = getenv("KVNODE_SOCKET");
    x.socket = env && *env ? env : DEFAULT_SOCKET;

    int nargc, ex = EXIT_OK;
    const char *missing;
    char **nargv = reorder_args(argc, argv, &nargc, &missing);
    if (missing) {
        free(nargv);
        return usage_error("option '%s' requires an argument", missing);
    }
    bool help = false, version = false;
    int opt;
    uint64_t u64;
    uint32_t *u32 = NULL;
    while ((opt = getopt_long(nargc, nargv, short_opts, long_opts, NULL)) != -1) {
        switch (opt) {
        case 'S':
            if (!*optarg) {
                ex = usage_error("--socket: empty path");
                goto out;
            }
            x.socket = optarg;
            break;
        case OPT_JSON: x.json = 1; break;
        case 't':
            if (!parse_u64(optarg, INT_MAX, &u64) || u64 == 0) {
                ex = usage_error("--timeout: '%s' is not a positive number of milliseconds", optarg);
                goto out;
            }
            x.timeout_ms = (int)u64;
            break;
        case 'h': help = true; break;
        case 'V': version = true; break;
        case OPT_MODEL:
            if (!*optarg) {
                ex = usage_error("--model: empty name");
                goto out;
            }
            x.layout.model = optarg;
            mark(&x, F_LAYOUT, "--model");
            break;
        case OPT_DTYPE:
            if (!*optarg) {
                ex = usage_error("--dtype: empty name");
                goto out;
            }
            x.layout.dtype = optarg;
            mark(&x, F_LAYOUT, "--dtype");
            break;
        case OPT_EXTRA:
            x.layout.extra = optarg;
            mark(&x, F_LAYOUT, "--extra");
            break;
        case OPT_REVISION:
            x.revision = optarg;
            mark(&x, F_LAYOUT, "--revision");
            break;
        case OPT_BLOCK_BYTES:
            if (!parse_size(optarg, &u64) || u64 == 0) {
                ex = usage_error("--block-bytes: invalid size '%s' (expected e.g. 65536, 64K or 2MiB)",
                                 optarg);
                goto out;
            }
            x.layout.block_bytes = u64;
            mark(&x, F_LAYOUT, "--block-bytes");
            break;
        case OPT_BLOCK_TOKENS: u32 = &x.layout.block_tokens; goto number;
        case OPT_LAYERS:       u32 = &x.layout.num_layers;   goto number;
        case OPT_KV_HEADS:     u32 = &x.layout.kv_heads;     goto number;
        case OPT_HEAD_DIM:     u32 = &x.layout.head_dim;     goto number;
        case OPT_TP_SIZE:      u32 = &x.layout.tp_size;      goto number;
        case OPT_TP_RANK:      u32 = &x.layout.tp_rank;      goto number;
        number:
            if (!parse_u32(optarg, u32)) {
                ex = usage_error("invalid number '%s' (expected 0..%u)", optarg, UINT32_MAX);
                goto out;
            }
            mark(&x, F_LAYOUT, "layout options");
            break;
        case OPT_KEYS_FILE: x.keys_file = optarg; mark(&x, F_KEYS_FILE, "--keys-file"); break;
        case OPT_KEYS_OUT:  x.keys_out = optarg;  mark(&x, F_KEYS_OUT, "--keys-out");   break;
        case 'o':           x.output = optarg;    mark(&x, F_OUTPUT, "--output");       break;
        case OPT_SIZE:
            if (!parse_size(optarg, &x.size)) {
                ex = usage_error("--size: invalid size '%s'", optarg);
                goto out;
            }
            mark(&x, F_SIZE, "--size");
            break;
        case OPT_REQUIRE_ALL: x.require_all = 1; mark(&x, F_REQUIRE_ALL, "--require-all"); break;
        case OPT_INLINE:      x.use_inline = 1;  mark(&x, F_INLINE, "--inline");          break;
        case OPT_ADMIN:
            if (!*optarg) {
                ex = usage_error("--admin: empty address");
                goto out;
            }
            x.admin = optarg;
            mark(&x, F_ADMIN, "--admin");
            break;
        default:
            /* getopt_long printed what was wrong */
            fputs("Try '" PROG " --help' for more information.\n", stderr);
            ex = EXIT_USAGE;
            goto out;
        }
    }
    if (help) {
        print_help();
        goto out;
    }
    if (version) {
        printf(PROG " %s (libkvnode %s)\n", KVNODE_VERSION_STRING, kvnode_version());
        goto out;
    }
    if (optind >= nargc) {
        ex = usage_error("missing command");
        goto out;
    }
    const char *name = nargv[optind];
    const struct command *cmd = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0)
            cmd = &commands[i];
    if (!cmd) {
        ex = usage_error("unknown command '%s'", name);
        goto out;
    }
    unsigned extra = x.given & ~cmd->allowed;
    if (extra) {
        for (unsigned b = 0; b < 8; b++)
            if (extra & (1u << b)) {
                ex = usage_error("%s cannot be used with %s", x.given_name[b], cmd->name);
                goto out;
            }
    }
    if (cmd->allowed & F_LAYOUT) {
        if (!x.layout.model) {
            ex = usage_error("%s: --model is required", cmd->name);
            goto out;
        }
        if (!x.layout.block_bytes) {
            ex = usage_error("%s: --block-bytes is required", cmd->name);
            goto out;
        }
        if (!x.layout.block_tokens || !x.layout.tp_size) {
            ex = usage_error("--block-tokens and --tp-size must be at least 1");
            goto out;
        }
        if (x.layout.tp_rank >= x.layout.tp_size) {
            ex = usage_error("--tp-rank %" PRIu32 " is not below --tp-size %" PRIu32, x.layout.tp_rank,
                             x.layout.tp_size);
            goto out;
        }
    }
    char **args = nargv + optind + 1;
    int nargs = nargc - optind - 1;
    if (cmd->run)
        ex = cmd->run(&x, args, nargs);
    else if (nargs)
        ex = usage_error("%s takes no arguments", cmd->name);
    else
        ex = cmd->run_noargs(&x);
out:
    free(nargv);
    /* Data on standard output that could not be written is an error. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (ex == EXIT_OK || ex == EXIT_PARTIAL) {
            fprintf(stderr, PROG ": write error on standard output: %s\n", strerror(errno ? errno : EIO));
            ex = EXIT_ERR;
        }
    }
    return ex;
}
