/* How this process was started: alone, or as one rank of an mpirun/srun job.
 * MPI is only initialised in the second case, so single-rank commands never
 * depend on an MPI runtime. */
#ifndef LOOM_LAUNCH_H
#define LOOM_LAUNCH_H

#include "comm/comm.h"

typedef struct {
  loom_comm *world; /* NULL when started alone */
  int rank, size;
} loom_launch;

/* This process's rank as the launcher set it in the environment (0 alone),
 * readable before MPI starts; after loom_launch_init, the communicator's. */
int loom_launch_env_rank(void);
/* The job's world size as the launcher set it (1 alone). */
int loom_launch_env_size(void);
/* This rank's index among the ranks of its node (mpirun's or srun's local
 * rank; 0 alone): which GPU it drives. */
int loom_launch_local_rank(void);
/* CPU threads per rank when the user gives none: the cores shared out among
 * the ranks of this node (OMPI_COMM_WORLD_LOCAL_SIZE), at least 1; 0 when
 * started alone (keep the library defaults). */
int loom_launch_default_threads(void);
/* Starts MPI when a launcher started this process. The communicator's size
 * and rank are the truth: where the launcher's environment says otherwise
 * (variables set by hand, a process started outside mpirun), refuses,
 * naming the variables; the job must not run as something it is not. */
loom_status loom_launch_init(loom_launch *l, loom_error *err);
void loom_launch_finish(loom_launch *l);

#endif
