/* Training data for `strata train` (see data.h). The built-in corpus is generated, not downloaded: a small
 * grammar of subjects, verbs, objects and endings, so the byte statistics a tiny model can learn (spelling,
 * word order, punctuation) are real but the text needs no file. */
#include "model/data.h"
#include "model/gpt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const subjects[] = {"the cat", "a dog", "the old man", "my sister", "the engine", "a small bird",
                                       "the teacher", "our neighbour", "the river", "a young girl", "the machine",
                                       "the children"};
static const char *const verbs[] = {"sees", "likes", "follows", "carries", "finds", "moves", "watches", "builds",
                                    "remembers", "opens"};
static const char *const objects[] = {"the red ball", "a heavy box", "the green door", "an apple", "the long road",
                                      "a quiet house", "the blue sky", "a warm fire", "the last train", "the garden"};
static const char *const endings[] = {" every morning", " in the rain", " with great care", " before dinner",
                                      " near the sea", "", "", " again and again"};

strata_status data_builtin(size_t len, gpt_data *out)
{
    out->bytes = malloc(len + 128);
    out->len = 0;
    if (!out->bytes)
        return STRATA_ENOMEM;
    uint64_t state = 0x5eed;
    while (out->len < len) {
        char sentence[160];
        state = gpt_mix64(state);
        int n = snprintf(sentence, sizeof sentence, "%s %s %s%s.%s", subjects[state % COUNT(subjects)],
                         verbs[(state >> 8) % COUNT(verbs)], objects[(state >> 16) % COUNT(objects)],
                         endings[(state >> 24) % COUNT(endings)], (state >> 32) % 5 == 0 ? "\n" : " ");
        sentence[0] = (char)(sentence[0] - 'a' + 'A'); /* every sentence starts lower-case in the tables */
        size_t take = (size_t)n < len - out->len ? (size_t)n : len - out->len;
        memcpy(out->bytes + out->len, sentence, take);
        out->len += take;
    }
    return STRATA_OK;
}

strata_status data_load(const char *path, gpt_data *out, char *errmsg, size_t errlen)
{
    out->bytes = NULL;
    out->len = 0;
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        int err = errno;
        snprintf(errmsg, errlen, "--data \"%s\": cannot open: %s", path, strerror(err));
        if (f)
            fclose(f);
        return err == ENOENT ? STRATA_ENOTFOUND : STRATA_EIO;
    }
    if (sb.st_size == 0) {
        fclose(f);
        snprintf(errmsg, errlen, "--data \"%s\": the file is empty; give a text file of at least --seq + 1 bytes",
                 path);
        return STRATA_EINVAL;
    }
    out->bytes = malloc((size_t)sb.st_size);
    if (!out->bytes) {
        fclose(f);
        snprintf(errmsg, errlen, "--data \"%s\": out of memory for %lld bytes", path, (long long)sb.st_size);
        return STRATA_ENOMEM;
    }
    out->len = fread(out->bytes, 1, (size_t)sb.st_size, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || out->len == 0) {
        snprintf(errmsg, errlen, "--data \"%s\": read failed", path);
        data_free(out);
        return STRATA_EIO;
    }
    return STRATA_OK;
}

void data_free(gpt_data *d)
{
    free(d->bytes);
    d->bytes = NULL;
    d->len = 0;
}

void data_batch(const gpt_data *d, uint64_t seed, int64_t step, int micro, int batch, int seq, int32_t *tokens,
                int32_t *targets)
{
    size_t span = d->len - (size_t)seq; /* windows start in [0, span) so that seq + 1 bytes fit */
    for (int b = 0; b < batch; b++) {
        uint64_t key = (uint64_t)step * 1000003u + (uint64_t)micro * 1009u + (uint64_t)b;
        uint64_t r = gpt_mix64(gpt_mix64(seed ^ 0xda7a) ^ gpt_mix64(key));
        size_t start = (size_t)(r % span);
        for (int t = 0; t < seq; t++) {
            tokens[b * seq + t] = d->bytes[start + t];
            targets[b * seq + t] = d->bytes[start + t + 1];
        }
    }
}
