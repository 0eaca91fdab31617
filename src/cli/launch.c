/* Start-up and shutdown of multi-rank runs. */
#include <stdlib.h>
#include <unistd.h>
#include "cli/launch.h"
#include "comm/mpi/comm_mpi.h"

/* The first of the launcher variables that is set, else `fallback`. */
static int env_int(const char *const *vars, int n, int fallback) {
  for (int i = 0; i < n; i++)
    if (getenv(vars[i])) return atoi(getenv(vars[i]));
  return fallback;
}

int loom_launch_env_rank(void) {
  static const char *const VARS[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  return env_int(VARS, 3, 0);
}

int loom_launch_env_size(void) {
  static const char *const VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
  return env_int(VARS, 3, 1);
}

int loom_launch_local_rank(void) {
  static const char *const VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"};
  return env_int(VARS, 4, 0);
}

int loom_launch_default_threads(void) {
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks = local ? atoi(local) : 1;
  if (ranks <= 1) return 0;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores / ranks > 1 ? (int)(cores / ranks) : 1;
}

void loom_launch_init(loom_launch *l) {
  l->world = loom_mpi_launched() ? loom_comm_mpi_world(NULL, NULL) : NULL;
  l->rank = loom_comm_rank(l->world);
  l->size = loom_comm_size(l->world);
}

void loom_launch_finish(loom_launch *l) {
  if (!l->world) return;
  loom_comm_free(l->world);
  l->world = NULL;
  loom_mpi_finalize();
}
