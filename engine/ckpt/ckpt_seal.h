/*
 * The manifest's own fields under checksums (format version 3). Every top-level field of the manifest has a
 * crc32c in "field_crc32c" (an object: field name -> 8 hex digits), taken over the field's value in a canonical
 * form (compact JSON with sorted keys, which a parse and a dump reproduce exactly). A reader recomputes each one, so
 * an edited "step", a swapped tensor entry or a dropped field is refused naming the field, and every reader of the
 * manifest (strata_load, `strata ckpt verify/inspect`, strata_checkpoint_inspect) refuses it alike. This protects
 * against accidents (an editor, a bad copy), not against someone who recomputes the checksums.
 * Manifests of versions 1 and 2 have none: they are read with a warning.
 */
#ifndef STRATA_ENGINE_CKPT_SEAL_H
#define STRATA_ENGINE_CKPT_SEAL_H

#include <jansson.h>

#include "strata.h"

#define CKPT_SEAL_KEY "field_crc32c"

/* Adds CKPT_SEAL_KEY over every other field of root (a manifest being built). STRATA_ENOMEM only. */
strata_status ckpt_seal(json_t *root);
/* Checks root's CKPT_SEAL_KEY (version >= 3: required) against its fields: STRATA_ECORRUPT naming origin and the
 * first field that is edited, missing or added. Version < 3: STRATA_OK, with a warning once per process. */
strata_status ckpt_seal_check(const json_t *root, int version, const char *origin);

#endif
