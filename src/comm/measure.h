/* Measuring a machine: the primitives `loom preflight` and `loom sim
 * calibrate` share. Each figure is the best of repeats, so a moment of
 * noise on a shared machine does not drag it down. */
#ifndef LOOM_MEASURE_H
#define LOOM_MEASURE_H

#include <stddef.h>
#include "comm/comm.h"

/* Repeats run(ctx) for at least `seconds` (3 times at least) and returns its shortest time. */
double loom_measure_best_time(void (*run)(void *), void *ctx, double seconds);
/* Host memory bandwidth in GB/s, STREAM's triad over three arrays of `bytes` together. */
double loom_measure_memory_gbs(size_t bytes, double seconds);
/* Seconds of one collective of kind over group on a buffer of `bytes` (an
 * all-reduce's buffer, an all-gather's output, a reduce-scatter's input; a
 * send/recv exchanges bytes with the next rank of a ring): the slowest
 * member's shortest time, agreed on by every member (collective over
 * group); -1 for a group of one. Buffers come from mem. wait (NULL when the
 * group's calls return done, as MPI's do) waits for a queued collective
 * (NCCL's, on a stream): it gets wait_arg and the result buffer. */
double loom_measure_collective_seconds(loom_comm *group, const loom_allocator *mem, loom_collective kind, size_t bytes,
                                       double seconds, void (*wait)(void *arg, const float *result), void *wait_arg);

#endif
