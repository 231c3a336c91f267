/*
 * The model registry: the modules and parameters a trainer adds, and their place in the flat partition.
 *
 * Layout. Every module's parameters are one contiguous, padded range [offset, offset + numel) of a flat
 * partition of registry_total_numel() elements (the full view). Each state class is one tier_array over a
 * view of that partition, so a module fetch moves one range of the parameter array and an optimizer sub-group
 * is one range of all arrays. Ranges start on ENGINE_MODULE_ALIGN elements, which keeps every NVMe transfer
 * 4 KiB aligned for every dtype.
 *
 * Ranks. In a world of N ranks every module is cut into N equal shards of shard_numel elements (a multiple of
 * ENGINE_MODULE_ALIGN; the module is padded to N * shard_numel), and rank r owns shard r: the full-view range
 * [offset + r * shard_numel, offset + (r + 1) * shard_numel). The shard view is this rank's shards, one after
 * another (module i's at shard_offset): a state class the ZeRO stage partitions lives in the shard view, the
 * others in the full view. Cutting each module (rather than the whole partition) keeps a module's all-gather
 * and reduce-scatter one equal-sized collective. With N = 1 both views are the same.
 *
 * Frozen modules (strata_module_freeze) have parameters and nothing else: no gradients, no optimizer state. The
 * layout puts every trained module first, in id order, and the frozen ones after them, so that in both views the
 * trained modules fill [0, trained numel) and the frozen ones the rest. The gradient and optimizer classes live in
 * the trained views (REG_FULL_TRAINED, REG_SHARD_TRAINED): the same positions, but only that leading range, in which
 * a frozen module counts 0 elements. A trained position is the same element in every state class, as before; module
 * positions no longer ascend with ids when a module is frozen (registry_module_at and registry_module_by_position
 * walk them in position order).
 *
 * The registry itself is private to registry.c; the descriptors below are read-only views of it.
 */
#ifndef STRATA_ENGINE_REGISTRY_H
#define STRATA_ENGINE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_adam/driver.h"
#include "engine/plan/plan.h"
#include "strata.h"

#define ENGINE_NAME_BYTES 128
#define ENGINE_MODULE_ALIGN PLAN_MODULE_ALIGN /* see plan_module_layout() */

typedef struct reg_param {
    char name[ENGINE_NAME_BYTES];
    strata_module_id module;
    size_t numel;
    size_t offset;                 /* in the flat partition (after registry_layout) */
    strata_init_fn init;
    void *init_ctx;
    int ndim;                      /* the declared model shape (strata_param_set_shape); 0: none */
    uint64_t dims[STRATA_MAX_DIMS];
    strata_group_id group;         /* its optimizer parameter group (strata_param_set_group); 0 by default */
    bool group_set;                /* set explicitly: a second, different group is refused */
    /* A part of a larger tensor (strata_param_set_part): elements [part_first, part_first + numel) of the tensor
     * part_of, of part_ndim dims part_dims (their product part_total). part_of is "" for a whole tensor. */
    char part_of[ENGINE_NAME_BYTES];
    uint64_t part_first, part_total;
    int part_ndim;
    uint64_t part_dims[STRATA_MAX_DIMS];
} reg_param;

/* The tensor a parameter is, or is a part of, as checkpoints and weight files hold it: elements [first, first +
 * numel) of a tensor of total elements, of ndim dims (0: its shape is not known, only its size). */
typedef struct reg_tensor {
    uint64_t first, total;
    int ndim;
    const uint64_t *dims;
} reg_tensor;

static inline bool registry_param_is_part(const reg_param *p)
{
    return p->part_of[0] != '\0';
}

static inline reg_tensor registry_param_tensor(const reg_param *p)
{
    if (registry_param_is_part(p))
        return (reg_tensor){p->part_first, p->part_total, p->part_ndim, p->part_dims};
    return (reg_tensor){0, p->numel, p->ndim, p->dims};
}

typedef struct reg_module {
    char name[ENGINE_NAME_BYTES];
    strata_param_id *params;
    size_t nparams, cap;
    size_t offset, numel;          /* flat range, padded to ENGINE_MODULE_ALIGN (after registry_layout) */
    size_t used_numel;             /* elements that belong to parameters (without the tail padding) */
    size_t shard_offset, shard_numel; /* this rank's shard: its place in the shard view, and its length */
    bool persistent;               /* below the persistence threshold: stays resident */
    bool frozen;                   /* parameters only: no gradients, no optimizer state (strata_module_freeze) */
} reg_module;

typedef struct registry registry;

strata_status registry_create(registry **out);
void registry_destroy(registry *r);

/* Adds a module or a parameter; errors name the call (what) and say what was wrong. */
strata_status registry_module_add(registry *r, const char *name, strata_module_id *out);
strata_status registry_param_add(registry *r, strata_module_id module, const char *name, size_t numel,
                                 strata_init_fn init, void *init_ctx, strata_param_id *out);
/* Records param's model shape (see strata_param_set_shape); STRATA_EINVAL naming the parameter, the dims, their
 * product and its numel when they do not fit. */
strata_status registry_param_set_shape(registry *r, strata_param_id param, int ndim, const int64_t *dims);
/* Declares param a part of tensor (see strata_param_set_part); STRATA_EINVAL naming the parameter for a bad name,
 * shape or range, STRATA_ESTATE for an unknown param. */
strata_status registry_param_set_part(registry *r, strata_param_id param, const char *tensor, uint64_t first,
                                      int ndim, const int64_t *dims);
/* After registry_layout: the parts of every tensor cover it once, agree on its shape and group and follow each other
 * in the layout, and no whole parameter "<module>.<param>" has a tensor's name (registry_parts.c). STRATA_EINVAL
 * naming the tensor and the parameters; STRATA_ENOMEM. */
strata_status registry_check_parts(const registry *r);
/* Freezes a known module (before layout). */
void registry_module_freeze(registry *r, strata_module_id id);
/* Puts param in group (the caller checked both). */
void registry_param_set_group(registry *r, strata_param_id param, strata_group_id group);
/* Replaces a known param's source of initial values (strata_param_load). */
void registry_param_set_init(registry *r, strata_param_id param, strata_init_fn init, void *init_ctx);
/* "[d0, d1, ...]" into out (len bytes; cut when too short). */
void registry_shape_str(int ndim, const uint64_t *dims, char *out, size_t len);

size_t registry_nmodules(const registry *r);
size_t registry_nparams(const registry *r);
/* The descriptor of a known id (ids below registry_nmodules / registry_nparams). */
const reg_module *registry_module(const registry *r, strata_module_id id);
const reg_param *registry_param(const registry *r, strata_param_id id);
/* The descriptor, or NULL with STRATA_ESTATE naming the call (what) when the id is unknown. */
const reg_module *registry_find_module(const registry *r, strata_module_id id, const char *what);
const reg_param *registry_find_param(const registry *r, strata_param_id id, const char *what);

/* Places every module and parameter in the flat partition, cut into world_size equal shards (see Ranks);
 * modules with fewer used elements than persistence_threshold are marked persistent. Can run
 * again (a retried finalize). */
strata_status registry_layout(registry *r, size_t persistence_threshold, int world_size);
size_t registry_total_numel(const registry *r);
size_t registry_largest_module_numel(const registry *r);
/* The largest module that is not frozen (0 when every module is). */
size_t registry_largest_trained_numel(const registry *r);

/* The views of the partition (see Ranks and Frozen modules): full or sharded, and of those the trained part. */
typedef enum reg_view { REG_FULL, REG_SHARD, REG_FULL_TRAINED, REG_SHARD_TRAINED } reg_view;
/* Whether v is one of this rank's shards, and whether it holds only the trained modules. */
static inline bool registry_view_sharded(reg_view v)
{
    return v == REG_SHARD || v == REG_SHARD_TRAINED;
}
static inline bool registry_view_trained(reg_view v)
{
    return v == REG_FULL_TRAINED || v == REG_SHARD_TRAINED;
}
/* Elements of the view (the full partition, or this rank's shards together). */
size_t registry_view_numel(const registry *r, reg_view v);
/* A module's range in the view (a frozen module's count is 0 in the trained views). */
size_t registry_view_offset(const reg_module *m, reg_view v);
size_t registry_view_count(const reg_module *m, reg_view v);
/* Where the ZeRO stage puts each state class: the full view (replicated on every rank) or this rank's shard
 * view. With one rank both views are the same. */
typedef struct engine_views {
    reg_view param, opt, grad;
} engine_views;

/* The runs of parameter groups (adam_run: from start to the next run's start, one group) in view v as rank `rank`
 * sees it (after registry_layout), ascending, the first starting at 0; padding belongs to the run before it. *out
 * is malloc'ed (free it); STRATA_ENOMEM. */
strata_status registry_group_runs(const registry *r, reg_view v, int rank, adam_run **out, size_t *count);

/* The module holding element pos of the view (pos below the view's numel). */
strata_module_id registry_module_at(const registry *r, reg_view v, size_t pos);
/* The position (as registry_module_by_position counts) of the module holding element pos of the view. */
size_t registry_position_at(const registry *r, reg_view v, size_t pos);
/* The module at position k (0 .. registry_nmodules - 1) in the layout's order: trained modules by id, then frozen. */
strata_module_id registry_module_by_position(const registry *r, size_t k);
/* How many modules are frozen. */
size_t registry_nfrozen(const registry *r);

#endif
