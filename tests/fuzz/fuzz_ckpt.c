/* libFuzzer harness: the checkpoint parsers on arbitrary bytes, read both as a safetensors file and as a
 * manifest. They must refuse with STRATA_ECORRUPT (never crash, over-read or leak), and what they accept
 * must be consistent: every tensor inside the data it claims, and a header rebuilt from the parsed tensors
 * must parse again to the same tensors. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ckpt/ckpt_format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void safetensors(const uint8_t *data, size_t size)
{
    ckpt_st_header h;
    strata_status st = ckpt_st_header_parse(data, size, size, false, "fuzz", &h);
    if (st != STRATA_OK) {
        if (st != STRATA_ECORRUPT && st != STRATA_ENOMEM)
            __builtin_trap();
        return;
    }
    uint64_t data_bytes = size - h.data_start, total = 0;
    for (size_t i = 0; i < h.ntensors; i++) {
        const ckpt_tensor *t = &h.tensors[i];
        if (t->begin > t->end || t->end > data_bytes || t->end - t->begin != t->numel * ckpt_dtype_bytes(t->dtype))
            __builtin_trap();
        total += t->end - t->begin;
    }
    /* Round trip: the same tensors laid out back to back. */
    uint8_t *head = NULL;
    size_t head_len = 0;
    if (ckpt_st_header_build(h.tensors, h.ntensors, false, &head, &head_len) == STRATA_OK) {
        ckpt_st_header again;
        if (ckpt_st_header_parse(head, head_len, head_len + total, false, "rebuilt", &again) != STRATA_OK ||
            again.ntensors != h.ntensors)
            __builtin_trap();
        for (size_t i = 0; i < again.ntensors; i++)
            if (strcmp(again.tensors[i].name, h.tensors[i].name) != 0 || again.tensors[i].numel != h.tensors[i].numel)
                __builtin_trap();
        ckpt_st_header_free(&again);
        free(head);
    }
    ckpt_st_header_free(&h);
}

static void manifest(const uint8_t *data, size_t size)
{
    ckpt_manifest m;
    strata_status st = ckpt_manifest_parse((const char *)data, size, "fuzz", &m);
    if (st != STRATA_OK) {
        if (st != STRATA_ECORRUPT && st != STRATA_ENOMEM)
            __builtin_trap();
        return;
    }
    for (size_t i = 0; i < m.ntensors; i++) {
        const ckpt_tensor *t = &m.tensors[i];
        if (t->file < 0 || t->file >= CKPT_FILE_COUNT || t->rank < 0 || t->rank >= m.world ||
            t->end > ckpt_manifest_file_bytes(&m, t->rank, t->file) || t->first + t->numel > t->total ||
            ckpt_manifest_piece(&m, t->file, t->name, t->first) != t)
            __builtin_trap();
    }
    char *text = NULL;
    if (ckpt_manifest_build(&m, NULL, &text) == STRATA_OK) {
        ckpt_manifest again;
        if (ckpt_manifest_parse(text, strlen(text), "rebuilt", &again) != STRATA_OK || again.ntensors != m.ntensors ||
            again.step != m.step || again.world != m.world)
            __builtin_trap();
        ckpt_manifest_free(&again);
        free(text);
    }
    ckpt_manifest_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    safetensors(data, size);
    manifest(data, size);
    return 0;
}
