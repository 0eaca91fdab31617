/* Goodput predicted: the share of wall-clock time that ends up as kept
 * training steps when nodes fail at random (exponentially, a node's mean
 * time between failures MTBF, so the job's is MTBF / nodes), each failure
 * losing the work since the last checkpoint and paying a restart.
 *
 * Persistent checkpoints alone: Daly's expectation ("A higher order
 * estimate of the optimum checkpoint interval for restart dumps", 2006),
 * exact for this failure process, failures during a restart included: with
 * compute tau between saves, a save's stall delta, a restart R and the
 * job's MTBF M,
 *
 *   goodput(tau) = tau / (M e^(R/M) (e^((tau + delta)/M) - 1)),
 *
 * maximised numerically, beside Young's first-order optimum sqrt(2 delta M)
 * and Daly's sqrt(2 delta M) - delta. With in-memory copies: a save every
 * tau of compute, every k-th of them persistent; a failure the copies
 * cover (all but the unrecoverable share) rolls back to the last save of
 * either kind and restarts from memory, any other to the last persistent
 * one; the first-order waste of the two levels is minimised over tau and k.
 * Both are checked against a simulation of the failure process itself
 * (loom_goodput_simulate), which the sim reports beside them. */
#ifndef LOOM_GOODPUT_MODEL_H
#define LOOM_GOODPUT_MODEL_H

#include <stdint.h>
#include "core/status.h"

typedef struct {
  double step_s;       /* one training step */
  double mtbf_s;       /* the job's mean time between failures: a node's over the nodes */
  double relaunch_s;   /* from a failure to ranks running again */
  double save_stall_s, restore_s;             /* a persistent checkpoint's stall on the step loop, its load */
  double local_stall_s, local_restore_s;      /* the same for an in-memory one (stall 0: none) */
  double unrecoverable;                       /* the share of failures the in-memory copies do not cover */
  double min_persistent_s; /* persistent saves no closer than this: the store's write of one, which a save waits for */
} loom_goodput_model;

typedef struct {
  int64_t interval_steps; /* the best whole-step interval */
  double goodput;         /* expected at it */
  double young_s, daly_s; /* the first-order optima, in seconds of compute */
  double optimum_s;       /* the exact expectation's optimum, in seconds */
  double simulated, simulated_se; /* the failure simulation's goodput at interval_steps, and its standard error */
} loom_goodput_level;

typedef struct {
  loom_goodput_level persistent; /* persistent checkpoints alone */
  /* with in-memory copies: a save every local_steps, every persistent_every-th of them persistent */
  int64_t local_steps, persistent_every;
  double local_goodput, local_simulated, local_simulated_se;
} loom_goodput_prediction;

/* Daly's expected goodput of persistent checkpoints every tau seconds of compute. */
double loom_goodput_daly(double tau, double delta, double restart, double mtbf);
/* The two levels' first-order expected goodput: a save every tau, every k-th persistent. */
double loom_goodput_two_level(const loom_goodput_model *m, double tau, int64_t k);
/* Simulates the failure process over `failures` failures (about) and returns the kept share of the wall time; *se
 * its standard error over 20 batches. k: every k-th save persistent (1 with local_stall_s 0: persistent only). */
double loom_goodput_simulate(const loom_goodput_model *m, double tau, int64_t k, int64_t failures, uint64_t seed,
                             double *se);
/* The optima and their simulated check (failures 0: no simulation, simulated NaN). */
loom_status loom_goodput_predict(const loom_goodput_model *m, int64_t failures, loom_goodput_prediction *out,
                                 loom_error *err);

#endif
