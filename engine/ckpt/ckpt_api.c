/* The engine-free checkpoint calls: inspect, verify, keep-last-N rotation, latest. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/log.h"
#include "engine/ckpt/ckpt_files.h"

STRATA_API strata_status strata_checkpoint_inspect(const char *dir, strata_checkpoint_info *out)
{
    if (!dir || !out)
        return err_set(STRATA_EINVAL, "strata_checkpoint_inspect: dir and out must not be NULL");
    memset(out, 0, sizeof *out);
    ckpt_manifest m;
    ERR_CHECK(ckpt_manifest_read(dir, &m));
    out->step = m.step;
    out->iterations = m.iterations;
    out->param_dtype = m.param_dtype;
    out->loss_scale = m.loss_scale;
    out->pending_update = m.pending;
    out->tensors = m.ntensors;
    out->world_size = m.world;
    for (int r = 0; r < m.world; r++)
        for (int f = 0; f < CKPT_FILE_COUNT; f++)
            out->bytes += ckpt_manifest_file_bytes(&m, r, f);
    ckpt_manifest_free(&m);
    return STRATA_OK;
}

STRATA_API strata_status strata_checkpoint_verify(const char *dir)
{
    if (!dir)
        return err_set(STRATA_EINVAL, "strata_checkpoint_verify: dir is NULL");
    return ckpt_verify(dir, NULL, NULL, NULL);
}

typedef struct found {
    char name[256];
    int64_t iterations, step;
} found;

/* Oldest first by strata_step calls: the optimizer's step count stands still over skipped fp16 steps, so two
 * checkpoints can share it (names do not order: "step-10" < "step-9"). */
static int by_age(const void *a, const void *b)
{
    const found *x = a, *y = b;
    if (x->iterations != y->iterations)
        return x->iterations < y->iterations ? -1 : 1;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The checkpoints directly under root, oldest first. Hidden names (a save's temporaries) are skipped, and so are
 * symbolic links unless links is set: a link is the user's, never strata's to rotate away. */
static strata_status scan(const char *root, bool links, found **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d) {
        char eb[96];
        return err_set(STRATA_ENOTFOUND, "checkpoint root \"%s\": cannot open it: %s", root,
                       err_errno_str(errno, eb, sizeof eb));
    }
    size_t cap = 0;
    strata_status st = STRATA_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof((found *)0)->name)
            continue;
        char path[STRATA_PATH_BYTES + 256];
        snprintf(path, sizeof path, "%s/%s", root, de->d_name);
        struct stat sb;
        if ((links ? stat(path, &sb) : lstat(path, &sb)) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        strata_checkpoint_info info;
        if (strata_checkpoint_inspect(path, &info) != STRATA_OK)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            found *grown = realloc(*out, cap * sizeof *grown);
            if (!grown) {
                st = err_set(STRATA_ENOMEM, "checkpoint root \"%s\": out of memory", root);
                break;
            }
            *out = grown;
        }
        snprintf((*out)[*n].name, sizeof (*out)[*n].name, "%s", de->d_name);
        (*out)[*n].iterations = info.iterations;
        (*out)[(*n)++].step = info.step;
    }
    closedir(d);
    err_clear();
    if (st == STRATA_OK && *n)
        qsort(*out, *n, sizeof **out, by_age);
    return st;
}

STRATA_API strata_status strata_checkpoint_prune(const char *root, int keep_last, int *removed)
{
    if (removed)
        *removed = 0;
    if (!root || keep_last < 1)
        return err_set(STRATA_EINVAL, "strata_checkpoint_prune: root must not be NULL and keep_last (%d) must be at "
                       "least 1", keep_last);
    found *list;
    size_t n;
    ERR_CHECK(scan(root, false, &list, &n));
    for (size_t i = 0; i + (size_t)keep_last < n; i++) {
        char path[STRATA_PATH_BYTES + 256];
        snprintf(path, sizeof path, "%s/%s", root, list[i].name);
        if (ckpt_dir_remove(path) != 0) /* it warned, naming what it could not remove */
            continue;
        LOG_INFO(LOG_CORE, "checkpoint rotation: removed \"%s\" (step %lld)", path, (long long)list[i].step);
        if (removed)
            (*removed)++;
    }
    free(list);
    return STRATA_OK;
}

STRATA_API strata_status strata_checkpoint_latest(const char *root, char *out, size_t outlen)
{
    if (!root || !out || outlen == 0)
        return err_set(STRATA_EINVAL, "strata_checkpoint_latest: root and out must not be NULL");
    out[0] = '\0';
    found *list;
    size_t n;
    ERR_CHECK(scan(root, true, &list, &n));
    strata_status st = STRATA_OK;
    if (n == 0)
        st = err_set(STRATA_ENOTFOUND, "checkpoint root \"%s\" holds no checkpoint (no subdirectory with a %s)", root,
                     CKPT_MANIFEST);
    else if ((size_t)snprintf(out, outlen, "%s/%s", root, list[n - 1].name) >= outlen)
        st = err_set(STRATA_EINVAL, "strata_checkpoint_latest: %zu bytes are too few for \"%s/%s\"", outlen, root,
                     list[n - 1].name);
    free(list);
    return st;
}
