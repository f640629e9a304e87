/* replay: runs a fuzz target without libFuzzer (`make check`, any compiler).
 *
 * Usage: fuzz_<target>_replay [CORPUS_DIR]   (default: FUZZ_CORPUS, baked in
 * at build time, relative to the repository root the tests run from).
 * Calls LLVMFuzzerTestOneInput on every file of the directory (in name
 * order), on the empty input, and on FUZZ_MUTATIONS deterministic mutations
 * of each file (fixed seed: bit flips, byte changes, truncations, inserts,
 * deletions, duplicated chunks, splices with another file). A target
 * abort()s on a broken invariant; this driver then names the input and the
 * mutation on stderr before dying, so the run fails. An empty or missing
 * corpus fails too. Ends with "<target> replay: N passed, 0 failed". */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

#ifndef FUZZ_NAME
#define FUZZ_NAME "fuzz"
#endif
#ifndef FUZZ_CORPUS
#define FUZZ_CORPUS "tests/fuzz/corpus"
#endif
#ifndef FUZZ_MUTATIONS
#define FUZZ_MUTATIONS 200
#endif
#define REPLAY_MAX_INPUT (64u << 10)

struct input {
    char *name;
    uint8_t *data;
    size_t size;
};

static char current[512];               /* what runs now, for the crash note */

static void on_crash(int sig)
{
    static const char pre[] = "\n*** " FUZZ_NAME " replay: crashed on ";
    ssize_t ignored = write(2, pre, sizeof pre - 1);
    ignored = write(2, current, strnlen(current, sizeof current));
    ignored = write(2, "\n", 1);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct input *)a)->name, ((const struct input *)b)->name);
}

static struct input *load_corpus(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, FUZZ_NAME " replay: cannot open corpus %s (run from the repository root)\n",
                dir);
        return NULL;
    }
    struct input *in = NULL;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        uint8_t *buf = malloc(REPLAY_MAX_INPUT);
        FUZZ_CHECK(buf != NULL);
        size_t got = fread(buf, 1, REPLAY_MAX_INPUT, f);
        fclose(f);
        in = realloc(in, (n + 1) * sizeof *in);
        FUZZ_CHECK(in != NULL);
        in[n].name = strdup(de->d_name);
        FUZZ_CHECK(in[n].name != NULL);
        in[n].data = buf;
        in[n].size = got;
        n++;
    }
    closedir(d);
    if (n)
        qsort(in, n, sizeof *in, by_name);
    *count = n;
    return in;
}

/* One mutation of src into out (capacity REPLAY_MAX_INPUT * 2); returns its size. */
static size_t mutate(const struct input *src, const struct input *other, uint8_t *out)
{
    size_t n = src->size;
    memcpy(out, src->data, n);
    int rounds = 1 + (int)rnd_below(4);
    for (int r = 0; r < rounds; r++) {
        switch (rnd_below(8)) {
        case 0:                                     /* flip one bit */
            if (n)
                out[rnd_below(n)] ^= (uint8_t)(1u << rnd_below(8));
            break;
        case 1: {                                   /* an interesting byte */
            static const uint8_t vals[] = { 0x00, 0x01, 0x7f, 0x80, 0xff, '\n', '=', '[', '"',
                                            '{', '}', ',', ':', '0', '9', '-', '.' };
            if (n)
                out[rnd_below(n)] = vals[rnd_below(sizeof vals)];
            break;
        }
        case 2:                                     /* random byte */
            if (n)
                out[rnd_below(n)] = (uint8_t)rnd();
            break;
        case 3:                                     /* truncate */
            n = rnd_below(n + 1);
            break;
        case 4: {                                   /* insert random bytes */
            size_t k = 1 + rnd_below(8), at = rnd_below(n + 1);
            if (n + k > REPLAY_MAX_INPUT)
                break;
            memmove(out + at + k, out + at, n - at);
            for (size_t i = 0; i < k; i++)
                out[at + i] = (uint8_t)rnd();
            n += k;
            break;
        }
        case 5: {                                   /* delete a range */
            if (!n)
                break;
            size_t at = rnd_below(n), k = 1 + rnd_below(n - at);
            memmove(out + at, out + at + k, n - at - k);
            n -= k;
            break;
        }
        case 6: {                                   /* duplicate a chunk */
            if (!n)
                break;
            size_t at = rnd_below(n), k = 1 + rnd_below(n - at < 64 ? n - at : 64);
            size_t to = rnd_below(n + 1);
            if (n + k > REPLAY_MAX_INPUT)
                break;
            uint8_t tmp[64];
            memcpy(tmp, out + at, k);
            memmove(out + to + k, out + to, n - to);
            memcpy(out + to, tmp, k);
            n += k;
            break;
        }
        default: {                                  /* splice with another input */
            size_t cut = rnd_below(n + 1), from = rnd_below(other->size + 1);
            size_t k = other->size - from;
            if (cut + k > REPLAY_MAX_INPUT)
                k = REPLAY_MAX_INPUT - cut;
            memcpy(out + cut, other->data + from, k);
            n = cut + k;
            break;
        }
        }
    }
    return n;
}

static void run_one(const uint8_t *data, size_t size)
{
    /* an exact-size copy, so a read past the input is a sanitizer report */
    uint8_t *copy = malloc(size ? size : 1);
    FUZZ_CHECK(copy != NULL);
    memcpy(copy, data, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : FUZZ_CORPUS;
    size_t n = 0, passed = 0;
    struct input *in = load_corpus(dir, &n);
    if (!in || n == 0) {
        fprintf(stderr, FUZZ_NAME " replay: no inputs in %s\n", dir);
        printf(FUZZ_NAME " replay: 0 passed, 1 failed\n");
        return 1;
    }
    signal(SIGABRT, on_crash);
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    signal(SIGFPE, on_crash);

    snprintf(current, sizeof current, "the empty input");
    run_one((const uint8_t *)"", 0);
    passed++;
    uint8_t *buf = malloc(REPLAY_MAX_INPUT * 2);
    FUZZ_CHECK(buf != NULL);
    for (size_t i = 0; i < n; i++) {
        snprintf(current, sizeof current, "%s/%s", dir, in[i].name);
        run_one(in[i].data, in[i].size);
        passed++;
        for (int m = 0; m < FUZZ_MUTATIONS; m++) {
            size_t len = mutate(&in[i], &in[rnd_below(n)], buf);
            snprintf(current, sizeof current, "%s/%s mutation %d (%zu bytes)", dir, in[i].name,
                     m, len);
            run_one(buf, len);
            passed++;
        }
    }
    free(buf);
    for (size_t i = 0; i < n; i++) {
        free(in[i].name);
        free(in[i].data);
    }
    free(in);
    printf(FUZZ_NAME " replay: %zu passed, 0 failed\n", passed);
    return 0;
}
