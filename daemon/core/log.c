/* log: levelled logging for kvnoded (see log.h).
 *
 * Each call formats the whole record into one stack buffer and hands it to a
 * single write(2): stderr may be shared by several threads and by journald's
 * stream reader, and one write per record is what keeps lines whole. */
#include "core/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOG_MSG_MAX 4096   /* one formatted message, before prefixing */
#define LOG_OUT_MAX 8192   /* the whole record: every line with its prefix */

static atomic_int log_threshold = LOG_LEVEL_INFO;
/* -1: not detected yet; 0: plain stderr; 1: stderr is the journal stream. */
static atomic_int log_journal = -1;

static const char *const log_names[] = { "error", "warn", "info", "debug" };
/* sd-daemon(3) priority prefixes: LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG. */
static const int log_priorities[] = { 3, 4, 6, 7 };

static int log_clamp(int level)
{
    if (level < LOG_LEVEL_ERROR)
        return LOG_LEVEL_ERROR;
    if (level > LOG_LEVEL_DEBUG)
        return LOG_LEVEL_DEBUG;
    return level;
}

void log_set_level(int level)
{
    atomic_store_explicit(&log_threshold, log_clamp(level), memory_order_relaxed);
}

int log_get_level(void)
{
    return atomic_load_explicit(&log_threshold, memory_order_relaxed);
}

int log_level_parse(const char *name)
{
    if (!name)
        return -1;
    for (int i = LOG_LEVEL_ERROR; i <= LOG_LEVEL_DEBUG; i++)
        if (strcasecmp(name, log_names[i]) == 0)
            return i;
    return -1;
}

const char *log_level_name(int level)
{
    if (level < LOG_LEVEL_ERROR || level > LOG_LEVEL_DEBUG)
        return "unknown";
    return log_names[level];
}

/* JOURNAL_STREAM is inherited by children whose stderr may point elsewhere,
 * so it only counts when its "device:inode" is the file stderr refers to
 * (systemd.exec(5)). */
static bool log_stderr_is_journal(void)
{
    const char *env = getenv("JOURNAL_STREAM");
    if (!env || !*env)
        return false;
    uintmax_t dev, ino;
    char tail;
    if (sscanf(env, "%ju:%ju%c", &dev, &ino, &tail) != 2)
        return false;
    struct stat st;
    if (fstat(STDERR_FILENO, &st) < 0)
        return false;
    return (uintmax_t)st.st_dev == dev && (uintmax_t)st.st_ino == ino;
}

void log_init(void)
{
    atomic_store_explicit(&log_journal, log_stderr_is_journal() ? 1 : 0, memory_order_relaxed);
}

static bool log_to_journal(void)
{
    int j = atomic_load_explicit(&log_journal, memory_order_relaxed);
    if (j < 0) {
        /* Lazy first detection; racing threads compute the same answer. */
        log_init();
        j = atomic_load_explicit(&log_journal, memory_order_relaxed);
    }
    return j == 1;
}

static size_t log_prefix(char *buf, size_t len, int level)
{
    int n;
    if (log_to_journal()) {
        /* journald records time, identifier and pid itself. */
        n = snprintf(buf, len, "<%d>%s: ", log_priorities[level], log_names[level]);
    } else {
        struct timespec ts;
        struct tm tm;
        char when[32] = "";
        if (clock_gettime(CLOCK_REALTIME, &ts) == 0 && gmtime_r(&ts.tv_sec, &tm))
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
        else
            ts.tv_nsec = 0;
        n = snprintf(buf, len, "%s.%03ldZ kvnoded[%ld] %s: ", when, ts.tv_nsec / 1000000L,
                     (long)getpid(), log_names[level]);
    }
    if (n < 0)
        return 0;
    return (size_t)n < len ? (size_t)n : len - 1;
}

static void log_write_all(const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(STDERR_FILENO, buf, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;   /* nowhere left to report a logging failure */
        }
        buf += w;
        len -= (size_t)w;
    }
}

void log_msg(int level, const char *fmt, ...)
{
    level = log_clamp(level);
    if (level > log_get_level())
        return;

    int saved_errno = errno;   /* callers often log and then inspect errno */
    char msg[LOG_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        snprintf(msg, sizeof msg, "(unformattable log message)");
    else if ((size_t)n >= sizeof msg)
        memcpy(msg + sizeof msg - 4, "...", 4);

    char prefix[128];
    size_t plen = log_prefix(prefix, sizeof prefix, level);

    /* Every line of a multi-line message gets the prefix, so the journal
     * keeps its priority and a grep for the level finds all of it. */
    char out[LOG_OUT_MAX];
    size_t used = 0;
    const char *line = msg;
    size_t mlen = strlen(msg);
    if (mlen > 0 && msg[mlen - 1] == '\n')
        msg[--mlen] = '\0';
    for (;;) {
        const char *nl = strchr(line, '\n');
        size_t llen = nl ? (size_t)(nl - line) : strlen(line);
        if (used + plen + llen + 1 > sizeof out) {
            static const char cut[] = "...\n";
            if (used + sizeof cut - 1 <= sizeof out) {
                memcpy(out + used, cut, sizeof cut - 1);
                used += sizeof cut - 1;
            }
            break;
        }
        memcpy(out + used, prefix, plen);
        used += plen;
        memcpy(out + used, line, llen);
        used += llen;
        out[used++] = '\n';
        if (!nl)
            break;
        line = nl + 1;
    }
    log_write_all(out, used);
    errno = saved_errno;
}

bool log_limit_pass(struct log_limit *l, uint64_t now_ms, uint64_t interval_ms, uint64_t *suppressed)
{
    if (l->passed_once && now_ms - l->last_ms < interval_ms) {
        l->suppressed++;
        return false;
    }
    if (suppressed)
        *suppressed = l->suppressed;
    l->suppressed = 0;
    l->last_ms = now_ms;
    l->passed_once = true;
    return true;
}

const char *log_tenant_prefix(const char *tenant, char *buf, size_t len)
{
    bool named = tenant && *tenant;
    snprintf(buf, len, "%s%s%s", named ? "tenant " : "", named ? tenant : "", named ? ": " : "");
    return buf;
}

const char *log_limit_note(uint64_t held, const char *what, char *buf, size_t len)
{
    if (held == 0 || len == 0)
        return "";
    snprintf(buf, len, " (%" PRIu64 " more %s since the last message)", held, what);
    return buf;
}
