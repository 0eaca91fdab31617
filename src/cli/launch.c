/* Start-up and shutdown of multi-rank runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/launch.h"
#include "comm/mpi/comm_mpi.h"

/* The first of the launcher variables that is set, else `fallback`; *name gets which. */
static int env_int(const char *const *vars, int n, int fallback, const char **name) {
  for (int i = 0; i < n; i++)
    if (getenv(vars[i])) {
      if (name) *name = vars[i];
      return atoi(getenv(vars[i]));
    }
  return fallback;
}

static const char *const RANK_VARS[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
static const char *const SIZE_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
static int g_rank = -1; /* the communicator's rank once MPI has started */

int loom_launch_env_rank(void) { return g_rank >= 0 ? g_rank : env_int(RANK_VARS, 3, 0, NULL); }

int loom_launch_env_size(void) { return env_int(SIZE_VARS, 3, 1, NULL); }

int loom_launch_local_rank(void) {
  static const char *const VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"};
  return env_int(VARS, 4, 0, NULL);
}

int loom_launch_default_threads(void) {
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks = local ? atoi(local) : 1;
  if (ranks <= 1) return 0;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores / ranks > 1 ? (int)(cores / ranks) : 1;
}

loom_status loom_launch_init(loom_launch *l, loom_error *err) {
  /* Read before MPI starts: a singleton MPI_Init sets some of these itself. */
  const char *size_var = NULL, *rank_var = NULL;
  const int env_size = env_int(SIZE_VARS, 3, 1, &size_var), env_rank = env_int(RANK_VARS, 3, 0, &rank_var);
  l->world = loom_mpi_launched() ? loom_comm_mpi_world(NULL, NULL) : NULL;
  l->rank = loom_comm_rank(l->world);
  l->size = loom_comm_size(l->world);
  g_rank = l->rank; /* the truth from here on, for whoever reports */
  char said[160] = "";
  if (env_size != l->size) snprintf(said, sizeof said, "%s=%d", size_var, env_size);
  if (env_rank != l->rank)
    snprintf(said + strlen(said), sizeof said - strlen(said), "%s%s=%d", *said ? " and " : "", rank_var, env_rank);
  if (!*said) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_USAGE,
                   "this process is rank %d of %d, but %s say%s otherwise; start every rank with mpirun or srun, or unset "
                   "%s to run alone", l->rank, l->size, said, strstr(said, " and ") ? "" : "s",
                   strstr(said, " and ") ? "them" : "it");
}

void loom_launch_finish(loom_launch *l) {
  if (!l->world) return;
  loom_comm_free(l->world);
  l->world = NULL;
  loom_mpi_finalize();
}
