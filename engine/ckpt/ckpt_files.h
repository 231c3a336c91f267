/*
 * The checkpoint directory on disk, without an engine: crash-safe replacement of a directory, checked
 * writes, reading and cross-checking the manifest against the safetensors headers, checksum
 * verification, and keep-last-N rotation. `strata ckpt` uses these directly.
 */
#ifndef STRATA_ENGINE_CKPT_FILES_H
#define STRATA_ENGINE_CKPT_FILES_H

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

/* Starts a save to dir: a fresh temporary directory next to it, named in tmp (len bytes). */
strata_status ckpt_dir_begin(const char *dir, char *tmp, size_t len);
/* Makes tmp (complete, its files fsynced) the checkpoint at dir: fsync tmp, then an atomic exchange with an
 * existing dir (rename where there is none), fsync the parent, remove the old one. A crash at any point
 * leaves either the old or the new checkpoint at dir. */
strata_status ckpt_dir_commit(const char *tmp, const char *dir);
/* Removes a checkpoint directory's own files and the directory (after a failed save, or by rotation). */
void ckpt_dir_remove(const char *dir);

/* Reads and parses dir's manifest (size-bounded). */
strata_status ckpt_manifest_read(const char *dir, ckpt_manifest *m);

/* An open checkpoint data file whose safetensors header agrees with the manifest on every tensor. */
typedef struct ckpt_file {
    int fd;
    int index;               /* CKPT_FILE_* */
    char path[STRATA_PATH_BYTES + 128];
    uint64_t data_start;
} ckpt_file;

/* Opens file index of dir and checks its size and header against m. STRATA_ECORRUPT names the file and
 * tensor that disagree; STRATA_ENOTFOUND when the file is missing. */
strata_status ckpt_file_open(const char *dir, const ckpt_manifest *m, int index, ckpt_file *f);
void ckpt_file_close(ckpt_file *f);

/* Reads len bytes at off of the data section, checked (a short read is STRATA_ECORRUPT naming what). */
strata_status ckpt_file_read(const ckpt_file *f, uint64_t off, void *buf, size_t len, const char *what);

/* Reads every tensor of dir and compares its crc32c. bad_out (may be NULL) receives the number of tensors
 * whose checksum failed; the first failure is the returned STRATA_ECORRUPT. report (may be NULL) is called
 * per tensor with its verdict. */
typedef void (*ckpt_verify_fn)(const ckpt_tensor *t, bool ok, uint32_t actual, void *user);
strata_status ckpt_verify(const char *dir, ckpt_verify_fn report, void *user, size_t *bad_out);

#endif
