/* Training data for `strata train` (see data.h). The built-in corpus is generated, not downloaded: a small
 * grammar of subjects, verbs, objects and endings, so the byte statistics a tiny model can learn (spelling,
 * word order, punctuation) are real but the text needs no file. */
#include "model/data.h"
#include "model/gpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* What a path that is not a regular file is, for the message that refuses it. */
static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO (named pipe)"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
                            : "not a regular file";
}

strata_status data_load(const char *path, gpt_data *out, char *errmsg, size_t errlen)
{
    out->bytes = NULL;
    out->len = 0;
    /* O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever; what is not a regular file is then
     * refused by fstat, before anything is read. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int err = errno;
        snprintf(errmsg, errlen, "--data \"%s\": cannot open: %s", path, strerror(err));
        if (fd >= 0)
            close(fd);
        return err == ENOENT ? STRATA_ENOTFOUND : STRATA_EIO;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        snprintf(errmsg, errlen, "--data \"%s\" is %s; --data expects a regular file of training text (read whole, "
                 "one byte per token)", path, file_kind(sb.st_mode));
        return STRATA_EINVAL;
    }
    if (sb.st_size == 0) {
        close(fd);
        snprintf(errmsg, errlen, "--data \"%s\": the file is empty; give a text file of at least --seq + 1 bytes",
                 path);
        return STRATA_EINVAL;
    }
    out->bytes = malloc((size_t)sb.st_size);
    if (!out->bytes) {
        close(fd);
        snprintf(errmsg, errlen, "--data \"%s\": out of memory for %lld bytes", path, (long long)sb.st_size);
        return STRATA_ENOMEM;
    }
    int err = 0;
    while (out->len < (size_t)sb.st_size) {
        ssize_t n = read(fd, out->bytes + out->len, (size_t)sb.st_size - out->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            err = n < 0 ? errno : 0;
            break;
        }
        out->len += (size_t)n;
    }
    close(fd);
    if (err || out->len == 0) {
        snprintf(errmsg, errlen, "--data \"%s\": reading failed after %zu of %lld bytes: %s", path, out->len,
                 (long long)sb.st_size, err ? strerror(err) : "the file shrank to nothing while it was read");
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
