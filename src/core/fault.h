/* The fault registry: named points where a test makes loom fail on purpose,
 * as a lost node, a hung kernel or a full memory would. Tests arm them with
 * loom_fault_arm; shell tests through the environment,
 *
 *   LOOM_FAULT=name:rank:step[:arg][,name:rank:step[:arg]...]
 *
 * where rank and step may be `*` (any). What `step` counts is the point's:
 * the training step (1-based) for step faults, the checkpoint's step for
 * kill_in_save, kill_in_stage and kill_in_write, the allocation's number (1-based, since arming) for alloc.
 * Unarmed, a point costs one branch. */
#ifndef LOOM_FAULT_H
#define LOOM_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

typedef enum {
  LOOM_FAULT_SETUP,        /* a rank fails alone while setting up, as a missing file on one node would */
  LOOM_FAULT_STALL,        /* a rank hangs before the step, outside communication, as a stuck kernel would */
  LOOM_FAULT_NAN_GRAD,     /* a NaN in the rank's grads at the step */
  LOOM_FAULT_SLOW,         /* each forward sleeps arg ms on the rank (a throttled device) */
  LOOM_FAULT_KILL_IN_SAVE, /* the rank dies after writing its shard, before the manifest */
  LOOM_FAULT_KILL_IN_STAGE, /* the rank dies with half its pieces copied to host memory (async save) */
  LOOM_FAULT_KILL_IN_WRITE, /* the rank dies halfway through writing its shard file (its .tmp half written) */
  LOOM_FAULT_ALLOC,        /* the allocation fails (loom_fault_malloc and friends) */
  LOOM_FAULT_KILL,         /* the rank dies (SIGKILL) before the step, as a lost process or node */
  LOOM_FAULT_SKIP_COLLECTIVE, /* the rank skips its arg-th collective of the step (1 without arg), as a bug on one
                                 rank would: a hang (comm/flight_recorder.h) */
  LOOM_FAULT_COUNT
} loom_fault_point;

/* The point's name in LOOM_FAULT ("setup", "stall", ...). */
const char *loom_fault_name(loom_fault_point p);
/* Adds the faults a spec names (the syntax above); an unknown name or a bad
 * field is refused with the whole spec left unarmed. NULL or "" arms nothing. */
loom_status loom_fault_arm(const char *spec, loom_error *err);
/* Arms what LOOM_FAULT says; its errors name the variable. */
loom_status loom_fault_arm_from_env(loom_error *err);
void loom_fault_disarm(void);
/* This process's rank, which the faults' rank fields match (0 until set). */
void loom_fault_set_rank(int rank);
/* Whether point p fires here at `step`; *arg gets its argument (0 if none). */
bool loom_fault_fires(loom_fault_point p, int64_t step, double *arg);
/* malloc, calloc and realloc that fail when the alloc point fires on this call. */
void *loom_fault_malloc(size_t bytes);
void *loom_fault_calloc(size_t count, size_t size);
void *loom_fault_realloc(void *p, size_t bytes);

#endif
