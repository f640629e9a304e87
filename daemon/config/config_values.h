/* config_values: kvnode.conf values as text and back -- sizes, durations,
 * fractions, modes, counts, user and group lists, device lists, listen
 * addresses, lists and URLs -- and the collector the checks report
 * problems into (struct errbuf). The lowest layer of the configuration: it
 * knows nothing of struct kvn_config or the option table, so config (the
 * table, config.h) and kvcm_config (the [kvcm] rules) both build on
 * it and neither needs the other's internals. config.h includes this
 * header, so every module that includes config.h sees these parsers. Pure
 * functions (the id lists ask the user/group database), any thread. */
#ifndef KVNODE_CONFIG_VALUES_H
#define KVNODE_CONFIG_VALUES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CONFIG_NAME_MAX   64    /* socket_group text, NUL included */
#define CONFIG_IDS_MAX    64    /* ids in one allow list */
#define CONFIG_URL_MAX    512   /* [persist] url text, one [kvcm] endpoint, NUL included */
#define CONFIG_HBM_DEVICES_MAX 16

/* Parsed forms of the list and address options. config_resolve fills them
 * from the text options once the configuration is complete (the daemon's
 * last step after defaults, file and overrides), so the modules use these
 * and never parse the text again; the text stays what /config prints and
 * what a reload compares. Until config_resolve they are zero. */
enum { CONFIG_LISTEN_OFF = 0, CONFIG_LISTEN_TCP = 1, CONFIG_LISTEN_UNIX = 2 };
struct config_listen {           /* [admin] listen: config_parse_listen */
    int      kind;               /* CONFIG_LISTEN_* */
    char     host[64];           /* TCP: without brackets */
    uint16_t port;               /* TCP */
    char     path[108];          /* UNIX */
};
struct config_idlist {           /* [server] allow_uids / allow_gids: config_parse_idlist */
    size_t   n;                  /* 0: the list is empty */
    uint32_t id[CONFIG_IDS_MAX];
};
struct config_devices {          /* [hbm] devices: config_hbm_devices */
    size_t   n;                  /* 0: every visible device ("all") */
    int      dev[CONFIG_HBM_DEVICES_MAX];
};

/* An [admin] listen address, parsed (struct config_listen above): "off";
 * "unix:PATH" (PATH non-empty and shorter than sun_path); or "HOST:PORT" with
 * HOST an IPv4 literal, "localhost", or a bracketed IPv6 literal
 * ("[::1]:9180"), and PORT 0..65535 (0: an ephemeral port chosen at bind
 * time). 0, or -1 with problem set. */
int config_parse_listen(const char *text, struct config_listen *out, char *problem, size_t len);

/* Helpers shared with kvnodectl-style parsing; 0 on success, -1 on bad input.
 * Grammar: DIGITS[UNIT] and nothing else -- no sign, no fraction ("1.5G" is
 * rejected: write 1536M), no space before the unit ("12 KiB" is rejected).
 * Sizes: no unit or B = bytes; K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB, P.., E..
 * are all binary (1K = 1024) and case-insensitive; overflow of 64 bits
 * (e.g. "20EiB") is rejected. Durations: ms, s, m, h (case-insensitive); a
 * bare number is milliseconds; the result must fit in 32 bits of ms. */
int config_parse_size(const char *text, uint64_t *out);      /* "1GiB", "512M", "4096" */
int config_parse_duration_ms(const char *text, uint32_t *out); /* "30s", "500ms", "2m", "100" (ms) */

/* Resolve an allow list ("alice, 1001 bob", names or numbers; groups when
 * `groups`) into ids. 0, or -1 with problem naming the bad entry. */
/* Whether l lists id. */
bool config_idlist_has(const struct config_idlist *l, uint32_t id);
/* Whether l lists gid or one of groups (sorted ascending: a binary search
 * per listed id, since a peer may have thousands of groups). */
bool config_idlist_has_group(const struct config_idlist *l, gid_t gid, const gid_t *groups, size_t ngroups);
/* [server] allow_uids / allow_gids applied to a peer: empty lists admit
 * everyone; root and the daemon's own user always; else its uid listed, or
 * its primary group or one of its (sorted) supplementary groups. The engine
 * socket and the KVS front end admit peers by this. */
bool config_peer_admitted(const struct config_idlist *uids, const struct config_idlist *gids, uid_t uid, gid_t gid,
                          const gid_t *groups, size_t ngroups);

int config_parse_idlist(const char *text, int groups, uint32_t *ids, size_t max, size_t *n,
                        char *problem, size_t len);
/* Resolve a group name or number. 0, or -1 with problem set. */
int config_parse_group(const char *text, uint32_t *gid, char *problem, size_t len);

/* [hbm] devices: "all" (or empty) gives *n = 0 (every visible device);
 * otherwise distinct ordinals 0..CONFIG_HBM_DEVICES_MAX-1 separated by
 * commas and/or blanks. 0, or -1 with problem naming the bad entry. */
int config_hbm_devices(const char *text, int *out, size_t max, size_t *n, char *problem, size_t len);

/* ---- for the option checks (config_types.c, kvcm_config.c) ---- */

/* DIGITS[UNIT] as config_parse_size / config_parse_duration_ms read it, the
 * result in bytes / ms without their range limits. 0, -EINVAL for malformed
 * text, -ERANGE when it overflows 64 bits. */
int config_scan_size(const char *text, uint64_t *out);
int config_scan_duration(const char *text, uint64_t *out);
/* Plain digits; -1 otherwise. */
int config_parse_count(const char *text, uint64_t *out);
/* Octal digits, at most 6; -1 otherwise. */
int config_parse_mode(const char *text, uint64_t *out);
/* A finite decimal number (no inf, nan, hex or blanks); -1 otherwise. */
int config_parse_fraction(const char *text, double *out);

/* The largest exact unit ("64MiB", "1500ms", "0s"); shortest %g that reads
 * back as exactly d. */
void config_format_size(uint64_t v, char *buf, size_t len);
void config_format_duration(uint64_t ms, char *buf, size_t len);
void config_format_fraction(double d, char *buf, size_t len);

/* The next item of a list whose items are separated by commas and/or
 * blanks: *start and *len receive it and *p moves past it; false (nothing
 * set) when only separators are left. */
bool config_list_next(const char **p, const char **start, size_t *len);

/* True when the URL s[0..n) carries userinfo ("user:password@") in its
 * authority: after an optional "scheme://", before the first '/', '?' or
 * '#'. Such a URL is refused, not stored: /config, --check-config and error
 * messages print URLs, so a password in one would reach every reader. */
bool config_url_has_credentials(const char *s, size_t n);

/* ---- messages ---- */

/* The value as the user typed it, cut to VALUE_SHOW characters plus "..."
 * (into buf when cut). */
const char *config_show(const char *text, char *buf, size_t len);

/* Collects one error per line into the caller's buffer. Room for a final
 * "(N more errors not shown)" line is always kept free. */
struct errbuf {
    char *buf;
    size_t cap, len;
    unsigned count, dropped;
};

/* Start collecting into buf (cap bytes; buf NULL: only count). */
void config_errbuf_init(struct errbuf *eb, char *buf, size_t cap);
__attribute__((format(printf, 2, 3)))
void config_errbuf_add(struct errbuf *eb, const char *fmt, ...);
/* Append "(N more errors not shown)" when lines were dropped. */
void config_errbuf_finish(struct errbuf *eb);

#endif
