/*
 * The checkpoint directory on disk, without an engine: crash-safe replacement of a directory (ckpt_dir.c), checked
 * writes, reading and cross-checking the manifest against the safetensors headers, checksum
 * verification, and keep-last-N rotation. `strata ckpt` uses these directly.
 */
#ifndef STRATA_ENGINE_CKPT_FILES_H
#define STRATA_ENGINE_CKPT_FILES_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/ckpt/ckpt_format.h"

/* A file being written: buffered, every write(2) checked (short writes finished, ENOSPC named). */
typedef struct ckpt_writer {
    int fd;
    char path[STRATA_PATH_BYTES + 64];
    uint8_t *buf;
    size_t used, cap;
    uint64_t written;
} ckpt_writer;

strata_status ckpt_writer_open(ckpt_writer *w, const char *dir, const char *name);
strata_status ckpt_writer_put(ckpt_writer *w, const void *data, size_t len);
/* Flushes, fsyncs and closes; on failure the file is closed all the same. */
strata_status ckpt_writer_close(ckpt_writer *w);
/* Closes without syncing (after a failure). Safe on a closed writer. */
void ckpt_writer_abort(ckpt_writer *w);

/* The directory functions (ckpt_dir.c). A save writes into ".<name>.tmp" beside dir and publishes it with
 * ckpt_dir_commit; a crash at any point leaves the old or the new complete checkpoint at dir, plus at most that
 * stale temporary, which the next ckpt_dir_begin removes. */

/* "<parent>/.<base><suffix>" for dir "<parent>/<base>" (into out, len bytes): the temporary and old names live
 * next to dir, on its filesystem. STRATA_EINVAL when dir has no last component or out is too short. */
strata_status ckpt_dir_sibling(const char *dir, const char *suffix, char *out, size_t len);
/* Starts a save to dir: removes a stale temporary directory (all of it) and makes a fresh one, named in tmp (len
 * bytes). STRATA_EINVAL when dir exists and is neither empty nor a checkpoint (it is never replaced). */
strata_status ckpt_dir_begin(const char *dir, char *tmp, size_t len);
/* The name of that temporary directory, without making it (the ranks other than 0 of a sharded save). */
strata_status ckpt_dir_tmp(const char *dir, char *tmp, size_t len);
/* Makes tmp (complete, its files fsynced) the checkpoint at dir: fsync tmp, then an atomic exchange with an
 * existing dir (rename where there is none), fsync the parent, remove the old one. Where the filesystem has no
 * exchange, the old one is renamed aside to ".<name>.old" first, which ckpt_manifest_read falls back to. */
strata_status ckpt_dir_commit(const char *tmp, const char *dir);
/* Removes a checkpoint directory (the manifest first) with everything in it: a checkpoint is replaced as a whole,
 * so files a trainer added beside strata's go with it (after a failed save, when a save replaced it, by
 * rotation). Symbolic links are removed, never followed; a dir that is a link loses the link only. Returns 0 or
 * the first failure's negative errno, which it also logs as a warning. */
int ckpt_dir_remove(const char *dir);
/* Makes the finished file tmp (written with ckpt_writer, fsynced) the file at path: one rename, then an fsync of
 * path's directory. A crash leaves the old file at path or the new one. */
strata_status ckpt_file_publish(const char *tmp, const char *path);

/* Opens path read-only if it is a regular file, without blocking on what is not (a FIFO, a device), and without
 * following a symbolic link as its last component unless follow (a checkpoint holds only the files strata wrote; a
 * model downloaded elsewhere is often a link into a cache). Returns the descriptor, or -1 with errno set; *kind names
 * what the path is when that is why ("a symbolic link", "a FIFO", "a directory", ...). */
int ckpt_open_regular(const char *path, bool follow, const char **kind);
/* Reads exactly len bytes at offset off of fd: a short read is STRATA_ECORRUPT (the file is truncated), a failed one
 * STRATA_EIO, each naming `<noun> "<path>": <what>` ("checkpoint", "weights"). */
strata_status ckpt_read_exact(int fd, const char *noun, const char *path, uint64_t off, void *buf, size_t len,
                              const char *what);

/* Reads and parses the safetensors header of the open file fd of file_bytes bytes (ckpt_st_header_parse: foreign
 * says which dtypes it may hold); errors name `<noun> "<path>"`. free h with ckpt_st_header_free. */
strata_status ckpt_st_header_read(int fd, const char *noun, const char *path, uint64_t file_bytes, bool foreign,
                                  ckpt_st_header *h);

/* Reads and parses dir's manifest (size-bounded). */
strata_status ckpt_manifest_read(const char *dir, ckpt_manifest *m);

/* An open checkpoint data file whose safetensors header agrees with the manifest on every piece it holds. */
typedef struct ckpt_file {
    int fd;                  /* -1 once closed */
    int rank, kind;          /* whose file, and which (CKPT_FILE_*) */
    char path[STRATA_PATH_BYTES + 128];
    uint64_t data_start, bytes;
} ckpt_file;

/* Opens rank's file of a kind in dir and checks its size and header against m: it holds exactly the manifest's
 * pieces of that rank and kind. STRATA_ECORRUPT names the file and tensor that disagree, or the missing file. */
strata_status ckpt_file_open(const char *dir, const ckpt_manifest *m, int rank, int kind, ckpt_file *f);
/* Opens a file that ckpt_file_open checked and ckpt_file_close closed again (its size is checked once more). */
strata_status ckpt_file_reopen(ckpt_file *f);
void ckpt_file_close(ckpt_file *f);

/* Reads len bytes at off of the data section, checked (a short read is STRATA_ECORRUPT naming what). */
strata_status ckpt_file_read(const ckpt_file *f, uint64_t off, void *buf, size_t len, const char *what);

/* Reads every piece of every rank's files of dir and compares its crc32c (that the pieces cover each tensor
 * exactly once is checked by the manifest's parser). bad_out (may be NULL) receives the number of pieces or files
 * that failed; the first failure is the returned STRATA_ECORRUPT. report (may be NULL) is called per piece with its
 * verdict. */
typedef void (*ckpt_verify_fn)(const ckpt_tensor *t, bool ok, uint32_t actual, void *user);
strata_status ckpt_verify(const char *dir, ckpt_verify_fn report, void *user, size_t *bad_out);

#endif
