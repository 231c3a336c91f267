/* The checkpoint root of a run: checked, locked and cleaned (see ckpt_root.h). */
#include "engine/ckpt/ckpt_root.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "engine/ckpt/ckpt_files.h"

#define PROBE_BYTES 4096

static strata_status root_errno(int errnum, const char *what, const char *root, const char *doing, const char *hint)
{
    char eb[96];
    return err_set(errnum == ENOSPC || errnum == EDQUOT ? STRATA_ENOSPC : err_from_errno(errnum),
                   "%s \"%s\": %s failed: %s; %s", what, root, doing, err_errno_str(errnum, eb, sizeof eb), hint);
}

static const char *const writable_hint = "the checkpoint root must be a directory this user can write, on a "
                                         "filesystem with free space — pick another --save directory";

/* Writes, fsyncs and removes a test file in root: what a save does first, tried before any step. */
static strata_status probe(const char *root, const char *what)
{
    char host[64] = "host", path[STRATA_PATH_BYTES + 128];
    gethostname(host, sizeof host - 1);
    snprintf(path, sizeof path, "%s/.strata-probe.%s.%ld", root, host, (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return root_errno(errno, what, root, "creating a test file in it", writable_hint);
    static const char zeros[PROBE_BYTES];
    int errnum = 0;
    ssize_t n = write(fd, zeros, sizeof zeros);
    if (n != (ssize_t)sizeof zeros)
        errnum = n < 0 ? errno : ENOSPC;
    else if (fsync(fd) != 0 && errno != EINVAL)
        errnum = errno;
    close(fd);
    if (unlink(path) != 0 && !errnum)
        errnum = errno;
    return errnum ? root_errno(errnum, what, root, "writing a test file in it", writable_hint) : STRATA_OK;
}

strata_status ckpt_root_check(const char *root, const char *what)
{
    if (!root || !root[0])
        return err_set(STRATA_EINVAL, "%s: the checkpoint root is empty; name a directory", what);
    if (strlen(root) > STRATA_PATH_BYTES - 64)
        return err_set(STRATA_EINVAL, "%s \"%.64s...\": the path is longer than %d bytes", what, root,
                       STRATA_PATH_BYTES - 64);
    if (mkdir(root, 0755) != 0 && errno != EEXIST)
        return root_errno(errno, what, root, "creating the directory",
                          "its parent must exist and be writable (strata creates one level) — create it first or "
                          "pick another --save directory");
    struct stat sb;
    if (stat(root, &sb) != 0)
        return root_errno(errno, what, root, "stat", writable_hint);
    if (!S_ISDIR(sb.st_mode))
        return err_set(STRATA_EINVAL, "%s \"%s\" exists and is not a directory; checkpoints are saved as "
                       "directories under it (\"%s/step-N\") — pick a directory", what, root, root);
    return probe(root, what);
}

/* What the lock file says about its holder, without its newline ("" when it says nothing yet). */
static void holder_of(int fd, char *out, size_t len)
{
    ssize_t n = pread(fd, out, len - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
}

strata_status ckpt_root_lock(const char *root, const char *what, int *fd_out)
{
    *fd_out = -1;
    char path[STRATA_PATH_BYTES + 64];
    snprintf(path, sizeof path, "%s/%s", root, CKPT_ROOT_LOCK);
    /* O_NOFOLLOW: a link planted at the lock's name must not make us create or truncate its target. */
    static const char *const lock_hint = "it must be a regular file (strata makes it) — remove what is there, or "
                                         "pick another --save directory";
    int fd = open(path, O_RDWR | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return root_errno(errno, what, root, "opening its lock file " CKPT_ROOT_LOCK, lock_hint);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return root_errno(EINVAL, what, root, "opening its lock file " CKPT_ROOT_LOCK, lock_hint);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int errnum = errno;
        char holder[256];
        holder_of(fd, holder, sizeof holder);
        close(fd);
        if (errnum == ENOLCK || errnum == EOPNOTSUPP || errnum == ENOSYS) {
            /* A filesystem without locks (some network ones) would otherwise refuse every run. */
            char eb[96];
            LOG_WARN(LOG_CORE, "%s \"%s\": the filesystem cannot lock %s (%s): a second run on this root would not "
                     "be refused — make sure only one run saves here", what, root, CKPT_ROOT_LOCK,
                     err_errno_str(errnum, eb, sizeof eb));
            return STRATA_OK;
        }
        if (errnum != EWOULDBLOCK)
            return root_errno(errnum, what, root, "locking " CKPT_ROOT_LOCK, "pick another --save directory");
        return err_set(STRATA_EBUSY, "%s \"%s\" is in use by another run (%s; it holds \"%s\"); two runs saving "
                       "under one root would overwrite each other's checkpoints — wait for it to finish, stop it, "
                       "or pick another --save directory", what, root,
                       holder[0] ? holder : "a process that has not recorded itself yet", path);
    }
    char host[64] = "?", when[32] = "?", line[192];
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof line, "pid %ld on host %s, started %s\n", (long)getpid(), host, when);
    /* Who holds it is information for a refused run, not the lock itself: a failure to record it is not fatal. */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
        LOG_WARN(LOG_CORE, "%s \"%s\": could not record this run in %s: %s", what, root, path, strerror(errno));
    *fd_out = fd;
    return STRATA_OK;
}

void ckpt_root_unlock(int fd)
{
    if (fd >= 0)
        close(fd);
}

/* ".step-<digits>.tmp": the temporary name ckpt_dir_sibling gives ROOT/step-N. */
static bool staging_name(const char *name)
{
    if (strncmp(name, ".step-", 6) != 0)
        return false;
    size_t digits = strspn(name + 6, "0123456789");
    return digits > 0 && strcmp(name + 6 + digits, ".tmp") == 0;
}

strata_status ckpt_root_clean(const char *root, int *removed)
{
    if (removed)
        *removed = 0;
    DIR *d = opendir(root);
    if (!d)
        return root_errno(errno, "checkpoint root", root, "opening", writable_hint);
    strata_status st = STRATA_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!staging_name(de->d_name))
            continue;
        char path[STRATA_PATH_BYTES + 300];
        snprintf(path, sizeof path, "%s/%s", root, de->d_name);
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (!S_ISDIR(sb.st_mode)) {
            LOG_WARN(LOG_CORE, "checkpoint root: kept \"%s\": it has the name of a save's staging directory but is %s, "
                     "not a directory strata made; remove it by hand if it is not yours", path,
                     S_ISLNK(sb.st_mode) ? "a symbolic link" : "not a directory");
            continue;
        }
        int r = ckpt_dir_remove(path); /* never follows a link inside it; warns itself on failure */
        if (r == 0) {
            LOG_WARN(LOG_CORE, "checkpoint root: removed \"%s\", the staging directory of a save that was "
                     "interrupted (killed or crashed); the checkpoints beside it are untouched", path);
            if (removed)
                (*removed)++;
        } else if (st == STRATA_OK) {
            char eb[96];
            st = err_set(err_from_errno(-r), "checkpoint root: removing the stale staging directory \"%s\" failed: "
                         "%s; remove it by hand", path, err_errno_str(-r, eb, sizeof eb));
        }
    }
    closedir(d);
    return st;
}
