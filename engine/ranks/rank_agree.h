/*
 * Ranks agree on everything that changes the math (DESIGN.md, Ranks). At finalize every rank compares the config
 * settings that change the arithmetic or the layout, its model, the initial weights its init callbacks gave and the
 * values its trainer declared (strata_engine_agree_on: step counts, accumulation, batch); at every step the step's
 * own arguments (lr, step number, micro-batches) ride in the flags the step already all-reduces. A difference fails
 * every rank at once with one message naming the first differing field, both values and the ranks. Private to
 * rank_agree.c.
 */
#ifndef STRATA_ENGINE_RANK_AGREE_H
#define STRATA_ENGINE_RANK_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

typedef struct rank_agree rank_agree;
struct strata_engine;

/* Frees what the engine's agreement holds. NULL is a no-op. */
void agree_destroy(rank_agree *a);

/* Per module, the crc32c of the initial fp32 values finalize writes (registry size), for tiers_write_initial to
 * fill; NULL when out of memory (the weights are then not compared, and finalize says so). */
uint32_t *agree_weight_crcs(struct strata_engine *e);

/* The end of finalize, on every rank whatever its outcome (local is this rank's status so far): every rank learns
 * every other's status and what it must agree on. STRATA_ECOMM naming the first rank that failed (with its
 * message), STRATA_ECONFIG naming the first field that differs from rank 0's (config key, model, trainer value,
 * initial weights of a module) with both values; local's own error when it was this rank. */
strata_status agree_finalize(struct strata_engine *e, strata_status local);

/* One step's arguments, compared across ranks inside the step's flag all-reduce. */
typedef struct agree_step {
    double lr;             /* the step's learning rate, resolved (parameter group 0's) */
    uint64_t step;         /* the trainer's step number (strata_step calls so far) */
    uint64_t micro_batches; /* the most hand-overs any module got this step */
    uint64_t groups;       /* a digest of every parameter group's values this step (opt_groups_frozen_digest) */
} agree_step;

/* Words agree_step adds to an all-reduce with COMM_MAX. */
#define AGREE_STEP_WORDS 8
/* Writes s into words[0..AGREE_STEP_WORDS) so that their maximum over the ranks shows whether they all agree. */
void agree_step_pack(const agree_step *s, uint64_t *words);
/* After the all-reduce: STRATA_OK when every rank had s; otherwise every rank (all see the same maxima) exchanges
 * its values and fails with STRATA_ECONFIG naming the field, both values and the ranks. A collective. */
strata_status agree_step_check(struct strata_engine *e, const agree_step *s, const uint64_t *reduced);

#endif
