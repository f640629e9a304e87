/* log: levelled logging for kvnoded. Owns the process-wide level; callable
 * from any thread (one write(2) per line, so lines never interleave). */
#ifndef KVNODE_LOG_H
#define KVNODE_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN = 1, LOG_LEVEL_INFO = 2, LOG_LEVEL_DEBUG = 3 };

/* (Re)detect whether stderr is the journal (JOURNAL_STREAM matches stderr's
 * device:inode): then records carry an sd-daemon "<N>" priority prefix and no
 * timestamp. Optional: the first log_msg detects it; call again after
 * redirecting stderr. */
void log_init(void);
/* Out-of-range levels are clamped to error..debug. */
void log_set_level(int level);
int  log_get_level(void);
/* "error" | "warn" | "info" | "debug" (case-insensitive) -> level, or -1. */
int  log_level_parse(const char *name);
const char *log_level_name(int level);   /* "unknown" when out of range */

/* One record on stderr, written with one write(2):
 *   "2024-05-01T12:00:00.123Z kvnoded[<pid>] <level>: <message>\n"
 * or, to the journal, "<N><level>: <message>\n". Every line of a multi-line
 * message gets the prefix. Messages above the level are dropped; errno is
 * preserved. */
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Rate limit for a message about a condition that may recur many times a
 * second (a listener out of descriptors, refused connections): the first
 * occurrence passes, then at most one per interval. Zero-initialise. */
struct log_limit {
    uint64_t last_ms;        /* when a message last passed */
    uint64_t suppressed;     /* occurrences held back since then */
    bool     passed_once;
};
/* true when a message may be written now; *suppressed (may be NULL) then
 * holds how many occurrences were held back since the last one. */
bool log_limit_pass(struct log_limit *l, uint64_t now_ms, uint64_t interval_ms, uint64_t *suppressed);
/* " (N more <what> since the last message)", or "" when held is 0; into buf. */
const char *log_limit_note(uint64_t held, const char *what, char *buf, size_t len);
/* "tenant NAME: " for a named tenant, "" for NULL or "" (the default tenant);
 * always written into buf, which it returns. */
#define LOG_TENANT_PREFIX_MAX 48
const char *log_tenant_prefix(const char *tenant, char *buf, size_t len);

#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) do { if (log_get_level() >= LOG_LEVEL_DEBUG) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__); } while (0)

#endif
