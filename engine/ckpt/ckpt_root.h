/*
 * The root a trainer saves its checkpoints under (ROOT/step-N, `strata train --save ROOT`): checked before the first
 * step, so that a root that cannot take a checkpoint fails the run at its start rather than after hours of training;
 * locked for the run, so that two runs never write the same ROOT/step-N or its temporary; and cleaned, under that
 * lock, of the staging directories (ROOT/.step-N.tmp) a killed save left behind.
 *
 * The lock is flock(2) on ROOT/.strata.lock, held by one process of a run (the trainer's rank 0: every rank of one
 * run writes into the same root, so the run, not the process, is what must be alone). The kernel drops it when its
 * holder exits however it exits, so a SIGKILLed run never leaves a stale lock; the file stays and says who held it
 * last (pid, host, start time), which is what a refused run names. A filesystem that cannot lock at all (flock
 * answers ENOLCK or EOPNOTSUPP, as some network filesystems do) gets a warning and no lock rather than a refused run.
 */
#ifndef STRATA_ENGINE_CKPT_ROOT_H
#define STRATA_ENGINE_CKPT_ROOT_H

#include "strata.h"

#define CKPT_ROOT_LOCK ".strata.lock"

/* Checks that root can take checkpoints: it exists or can be created (one level, like mkdir), is a directory,
 * and takes a test file (created, written, fsynced and removed again; its name carries this host and pid so ranks
 * sharing the root do not collide). what names the root in messages ("--save"). STRATA_EINVAL / EIO / ENOSPC with
 * the path, the errno and a hint. */
strata_status ckpt_root_check(const char *root, const char *what);

/* Takes root's lock for this process (flock, non-blocking) and records this process as its holder; *fd receives the
 * lock's descriptor (-1 on failure), which ckpt_root_unlock releases. STRATA_EBUSY when another process holds it,
 * naming that holder (pid, host, start time); STRATA_OK with *fd = -1 and a warning where the filesystem cannot lock.
 * Not thread-safe with itself on one root. */
strata_status ckpt_root_lock(const char *root, const char *what, int *fd);
/* Releases the lock (closes fd); -1 is a no-op. The lock file stays: removing it would race a new holder. */
void ckpt_root_unlock(int fd);

/* Removes the staging directories of interrupted saves directly under root: only directories named like strata's
 * own (".step-<digits>.tmp"), never through a symbolic link (a link of that name is left, with a warning). Each
 * removal is logged with what it was. Call it holding the lock. *removed (may be NULL) counts them. Returns STRATA_OK
 * or the first failure (the rest are still tried). */
strata_status ckpt_root_clean(const char *root, int *removed);

#endif
