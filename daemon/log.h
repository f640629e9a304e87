/* log: levelled logging for kvnoded. Owns the process-wide level; callable
 * from any thread (one write(2) per line, so lines never interleave). */
#ifndef KVNODE_LOG_H
#define KVNODE_LOG_H

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN = 1, LOG_LEVEL_INFO = 2, LOG_LEVEL_DEBUG = 3 };

void log_set_level(int level);
int  log_get_level(void);
/* "error" | "warn" | "info" | "debug" -> level, or -1. */
int  log_level_parse(const char *name);
const char *log_level_name(int level);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) do { if (log_get_level() >= LOG_LEVEL_DEBUG) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__); } while (0)

#endif
