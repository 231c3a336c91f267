/* Checksums over the manifest's own fields (see ckpt_seal.h). */
#include "engine/ckpt/ckpt_seal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/log.h"

/* The crc32c of a value's canonical text; false when out of memory. */
static bool field_crc(const json_t *v, uint32_t *out)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    if (!text)
        return false;
    *out = crc32c(0, text, strlen(text));
    free(text);
    return true;
}

strata_status ckpt_seal(json_t *root)
{
    json_t *seal = json_object();
    const char *key;
    json_t *val;
    bool ok = seal != NULL;
    json_object_foreach(root, key, val) {
        uint32_t crc;
        char hex[16];
        if (!ok || !field_crc(val, &crc)) {
            ok = false;
            break;
        }
        snprintf(hex, sizeof hex, "%08x", crc);
        ok = json_object_set_new(seal, key, json_string(hex)) == 0;
    }
    if (!ok || json_object_set_new(root, CKPT_SEAL_KEY, seal) != 0) {
        if (ok) /* json_object_set_new released seal already on failure */
            seal = NULL;
        json_decref(seal);
        return err_set(STRATA_ENOMEM, "checkpoint: out of memory building the manifest's checksums");
    }
    return STRATA_OK;
}

strata_status ckpt_seal_check(const json_t *root, int version, const char *origin)
{
    if (version < 3) {
        LOG_ONCE(STRATA_LOG_WARN, LOG_CORE, "%s: a manifest of format version %d has no checksums over its own "
                 "fields (an edited step or tensor entry would go unnoticed); it is read as it is — save it again "
                 "to protect it", origin, version);
        return STRATA_OK;
    }
    const json_t *seal = json_object_get(root, CKPT_SEAL_KEY);
    if (!json_is_object(seal))
        return err_set(STRATA_ECORRUPT, "%s: \"%s\" (the checksums of the manifest's fields, required from format "
                       "version 3) is missing or not an object; the manifest was damaged or edited", origin,
                       CKPT_SEAL_KEY);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)root, key, val) {
        if (strcmp(key, CKPT_SEAL_KEY) == 0)
            continue;
        const json_t *want = json_object_get(seal, key);
        uint32_t crc;
        if (!field_crc(val, &crc))
            return err_set(STRATA_ENOMEM, "%s: out of memory checking field \"%s\"", origin, key);
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", crc);
        if (!json_is_string(want))
            return err_set(STRATA_ECORRUPT, "%s: field \"%s\" has no checksum in \"%s\": it was added after the "
                           "manifest was written; remove it, or restore the manifest", origin, key, CKPT_SEAL_KEY);
        if (strcmp(json_string_value(want), hex) != 0)
            return err_set(STRATA_ECORRUPT, "%s: field \"%s\" does not match its checksum (crc32c %s, recorded %s): "
                           "the manifest was edited or damaged after it was written; restore it or use another "
                           "checkpoint", origin, key, hex, json_string_value(want));
    }
    json_object_foreach((json_t *)seal, key, val)
        if (!json_object_get(root, key))
            return err_set(STRATA_ECORRUPT, "%s: field \"%s\" has a checksum but is missing: it was removed after the "
                           "manifest was written; restore the manifest", origin, key);
    return STRATA_OK;
}
