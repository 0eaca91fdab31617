/* The collective watchdog: with a timeout set, every blocking operation of
 * the MPI backend is started non-blocking and polled against the clock.
 * When one has waited longer than the timeout, its rank tells every other
 * rank on a private duplicate of the world communicator, and every rank
 * that is itself waiting in a collective or transfer answers the same way.
 * After a grace period the lowest waiting rank names the ranks that never
 * answered (stalled outside communication, or dead) and what each waiting
 * rank waits in, then aborts the job. A hang becomes one clear line and a
 * non-zero exit, as with NCCL's watchdog in PyTorch. */
#ifndef LOOM_WATCHDOG_H
#define LOOM_WATCHDOG_H

#include <mpi.h>

/* Collective over MPI_COMM_WORLD once, at start-up. */
void loom_watchdog_init(void);
/* Seconds a blocking operation may wait; 0 turns the watchdog off. */
void loom_watchdog_set_timeout(double seconds);
double loom_watchdog_timeout(void);
/* Completes req (MPI_Wait when off); `what` names the operation and group. */
void loom_watchdog_complete(MPI_Request *req, const char *what);
/* The same for any wait: polls done(ctx) until it returns non-zero, under
 * the timeout when one is set (the NCCL side waits for GPU streams so). */
void loom_watchdog_poll(int (*done)(void *ctx), void *ctx, const char *what);
/* Runs fn (once; the latest registered) just before the watchdog aborts the job: NCCL aborts its communicators. */
void loom_watchdog_on_abort(void (*fn)(void));

#endif
