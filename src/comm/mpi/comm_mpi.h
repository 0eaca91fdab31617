/* The MPI backend of the communicator interface (Open MPI on CPUs). */
#ifndef LOOM_COMM_MPI_H
#define LOOM_COMM_MPI_H

#include <stdbool.h>
#include "comm/comm.h"

/* True when this process was started by mpirun/srun (so MPI must be used). */
bool loom_mpi_launched(void);
/* MPI_Init (once) and a group over MPI_COMM_WORLD. */
loom_comm *loom_comm_mpi_world(int *argc, char ***argv);
/* Ends the whole job from one rank: MPI_Abort with this exit code. */
void loom_mpi_abort(int code);
void loom_mpi_finalize(void);
/* Aborts the job, naming the stalled ranks, when a blocking operation waits
 * longer than timeout_s (0: wait forever); see watchdog.h. */
void loom_comm_mpi_set_watchdog(double timeout_s);

#endif
