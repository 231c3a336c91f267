/*
 * Replacing a checkpoint directory as a whole, crash-safely: a save writes into a temporary directory beside the
 * checkpoint (".<name>.tmp"), then exchanges the two names in one atomic step and removes the previous checkpoint,
 * which the exchange left at the temporary name. Every state a crash can leave has the old or the new complete
 * checkpoint under the name, plus at most a stale temporary that the next save removes first.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "engine/ckpt/ckpt_files.h"

/* Directories nested deeper than this inside a checkpoint are not removed (strata writes none; a trainer's extra
 * files may hold a few levels). It bounds the recursion's stack. */
#define REMOVE_MAX_DEPTH 16

static strata_status errno_err(int errnum, const char *what, const char *path, const char *hint)
{
    char eb[96];
    return err_set(err_from_errno(errnum), "checkpoint: %s \"%s\" failed: %s%s", what, path,
                   err_errno_str(errnum, eb, sizeof eb), hint);
}

strata_status ckpt_dir_sibling(const char *dir, const char *suffix, char *out, size_t len)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t slash = n;
    while (slash > 0 && dir[slash - 1] != '/')
        slash--;
    if (n == slash)
        return err_set(STRATA_EINVAL, "checkpoint directory \"%s\" has no name to save under", dir);
    int w = snprintf(out, len, "%.*s.%.*s%s", (int)slash, dir, (int)(n - slash), dir + slash, suffix);
    if (w < 0 || (size_t)w >= len)
        return err_set(STRATA_EINVAL, "checkpoint directory \"%s\" is too long (at most %zu bytes)", dir, len - 16);
    return STRATA_OK;
}

static void parent_of(const char *dir, char *out, size_t len)
{
    snprintf(out, len, "%s", dir);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/')
        out[--n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(out, len, ".");
    else if (slash == out)
        out[1] = '\0';
    else
        *slash = '\0';
}

static strata_status fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno_err(errno, "opening directory", dir, "");
    strata_status st = STRATA_OK;
    if (fsync(fd) != 0 && errno != EINVAL)
        st = errno_err(errno, "fsync of directory", dir, "");
    close(fd);
    return st;
}

/* Removes name (relative to the directory open at dfd) and, when it is a directory, everything in it. A symbolic
 * link is removed itself, never followed (O_NOFOLLOW also where it was swapped in after the lstat): the removal
 * cannot leave the directory it was given. Goes on past a failure so that as much as possible goes; returns 0 or
 * the first failure's negative errno. */
static int remove_at(int dfd, const char *name, int depth)
{
    struct stat sb;
    if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(sb.st_mode))
        return unlinkat(dfd, name, 0) == 0 || errno == ENOENT ? 0 : -errno;
    if (depth >= REMOVE_MAX_DEPTH)
        return -ELOOP;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int r = -errno;
        close(fd);
        return r;
    }
    int first = 0;
    /* The manifest first: a removal cut short leaves no directory that claims to be a checkpoint. */
    if (depth == 0 && unlinkat(fd, CKPT_MANIFEST, 0) != 0 && errno != ENOENT)
        first = -errno;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        int r = remove_at(fd, de->d_name, depth + 1);
        if (r && !first)
            first = r;
    }
    closedir(d);
    if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT && !first)
        first = -errno;
    return first;
}

int ckpt_dir_remove(const char *dir_in)
{
    /* "link/" makes the kernel resolve the link even under AT_SYMLINK_NOFOLLOW and O_NOFOLLOW: the removal would
     * empty the link's target and then fail on the link (ENOTDIR). Without the trailing slashes it removes the
     * link itself. */
    char dir[STRATA_PATH_BYTES + 300];
    snprintf(dir, sizeof dir, "%s", dir_in);
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--)
        dir[n - 1] = '\0';
    int r = remove_at(AT_FDCWD, dir, 0);
    if (r) {
        char eb[96];
        LOG_WARN(LOG_CORE, "checkpoint: could not remove \"%s\": %s; remove it by hand", dir,
                 err_errno_str(-r, eb, sizeof eb));
    }
    return r;
}

/* True when dir is an empty directory (what a user may create to save into). */
static bool empty_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    struct dirent *de;
    bool empty = true;
    while (empty && (de = readdir(d)) != NULL)
        empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0;
    closedir(d);
    return empty;
}

strata_status ckpt_dir_tmp(const char *dir, char *tmp, size_t len)
{
    return ckpt_dir_sibling(dir, ".tmp", tmp, len);
}

strata_status ckpt_dir_begin(const char *dir, char *tmp, size_t len)
{
    /* A save replaces dir as a whole: never a directory that holds something other than a checkpoint. */
    char manifest[STRATA_PATH_BYTES + 96];
    snprintf(manifest, sizeof manifest, "%s/%s", dir, CKPT_MANIFEST);
    struct stat sb;
    if (stat(dir, &sb) == 0 && (!S_ISDIR(sb.st_mode) || (access(manifest, F_OK) != 0 && !empty_dir(dir))))
        return err_set(STRATA_EINVAL, "strata_save: \"%s\" exists and is not a strata checkpoint (no %s); "
                       "refusing to replace it — save to a new or empty directory", dir, CKPT_MANIFEST);
    ERR_CHECK(ckpt_dir_tmp(dir, tmp, len));
    /* What a crashed save left behind: its partial files, or the previous checkpoint it had exchanged out. */
    int r = remove_at(AT_FDCWD, tmp, 0);
    if (r)
        return errno_err(-r, "removing the stale temporary directory", tmp,
                         "; a save uses that name for itself — remove it by hand");
    if (mkdir(tmp, 0755) != 0)
        return errno_err(errno, "creating", tmp, "; the parent directory must exist and be writable");
    return STRATA_OK;
}

/* Without an atomic exchange: the old checkpoint moves aside to ".<name>.old" first. A crash between the two
 * renames leaves it there, which ckpt_manifest_read falls back to while the name is missing. */
static strata_status commit_aside(const char *tmp, const char *dir, const char *parent)
{
    char old[STRATA_PATH_BYTES + 64];
    ERR_CHECK(ckpt_dir_sibling(dir, ".old", old, sizeof old));
    ckpt_dir_remove(old);
    bool had = rename(dir, old) == 0;
    if (!had && errno != ENOENT)
        return errno_err(errno, "moving aside", dir, "");
    if (rename(tmp, dir) != 0)
        return errno_err(errno, "renaming the new checkpoint to", dir, "");
    ERR_CHECK(fsync_dir(parent));
    ckpt_dir_remove(old);
    return STRATA_OK;
}

strata_status ckpt_dir_commit(const char *tmp, const char *dir)
{
    char parent[STRATA_PATH_BYTES + 64];
    parent_of(dir, parent, sizeof parent);
    ERR_CHECK(fsync_dir(tmp));
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        ERR_CHECK(fsync_dir(parent));
        ckpt_dir_remove(tmp); /* now the previous checkpoint; a crash here leaves it for the next save */
        return STRATA_OK;
    }
    int ex = errno;
    if (ex == ENOENT) { /* the first save under this name */
        char old[STRATA_PATH_BYTES + 64];
        if (rename(tmp, dir) != 0)
            return errno_err(errno, "renaming the new checkpoint to", dir, "");
        ERR_CHECK(fsync_dir(parent));
        /* An interrupted save's ".old" copy (see commit_aside) is superseded now. */
        if (ckpt_dir_sibling(dir, ".old", old, sizeof old) == STRATA_OK)
            ckpt_dir_remove(old);
        return STRATA_OK;
    }
    /* RENAME_EXCHANGE needs Linux 3.15 and a filesystem that implements it (not every network or FUSE one). */
    if (ex != EINVAL && ex != ENOSYS && ex != EOPNOTSUPP)
        return errno_err(ex, "exchanging the new checkpoint with", dir, "");
    return commit_aside(tmp, dir, parent);
}

strata_status ckpt_file_publish(const char *tmp, const char *path)
{
    char parent[STRATA_PATH_BYTES + 64];
    parent_of(path, parent, sizeof parent);
    if (rename(tmp, path) != 0)
        return errno_err(errno, "renaming the finished file to", path, "");
    return fsync_dir(parent);
}
