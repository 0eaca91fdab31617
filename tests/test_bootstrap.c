/* The unique-id bootstrap over MPI groups (run at np 4 as tp 2 x dp 2):
 * every member of a group ends with the id its rank 0 created, distinct
 * groups get distinct ids, and a creator's failure reaches every member.
 * With NCCL built in, the same holds for ncclGetUniqueId's ids. */
#include <string.h>
#include "comm/bootstrap.h"
#include "comm/mpi/comm_mpi.h"
#include "tensor_parallel/parallel_state.h"
#include "test_util.h"
#ifdef LOOM_HAVE_NCCL
#include "comm/nccl/nccl_id.h"
#endif

enum { ID_BYTES = 128 };
static loom_comm *g_world;

/* A test id: the creating rank's world rank, then a pattern from it. */
static int fake_id(void *id, size_t bytes, void *ctx) {
  const int creator = *(const int *)ctx;
  unsigned char *b = id;
  for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(creator * 31 + (int)i * 7);
  memcpy(b, &creator, sizeof creator);
  return 0;
}

static int failing_id(void *id, size_t bytes, void *ctx) {
  (void)id, (void)bytes, (void)ctx;
  return 5;
}

/* Every rank's id of `group`, gathered over the world as floats (one byte each). */
static void gather_ids(const unsigned char *id, float *all) {
  float mine[ID_BYTES];
  for (int i = 0; i < ID_BYTES; i++) mine[i] = id[i];
  loom_comm_allgather(g_world, mine, all, ID_BYTES);
}

/* Whether world ranks a and b share a group of kind `dp` (else tp) in a tp 2 x dp 2 grid. */
static int same_group(int a, int b, int dp) { return dp ? a % 2 == b % 2 : a / 2 == b / 2; }

START_TEST(members_share_their_group_rank_0s_id) {
  ck_assert_int_eq(g_world->size, 4);
  loom_parallel ps;
  loom_parallel_init(&ps, g_world, 2, 1, 2, 1, false);
  for (int dp = 0; dp < 2; dp++) {
    loom_comm *group = dp ? ps.dp_group : ps.tp_group;
    unsigned char id[ID_BYTES];
    memset(id, 0xee, sizeof id);
    int me = ps.rank;
    ck_assert_int_eq(loom_comm_bootstrap_id(group, id, sizeof id, fake_id, &me), 0);
    int creator;
    memcpy(&creator, id, sizeof creator);
    const int group_rank_0 = dp ? ps.tp_rank : ps.rank - ps.tp_rank; /* tp fastest, then dp */
    ck_assert_msg(creator == group_rank_0, "rank %d got the id of rank %d, not %d", ps.rank, creator, group_rank_0);
    float all[4 * ID_BYTES];
    gather_ids(id, all);
    for (int a = 0; a < 4; a++)
      for (int b = 0; b < 4; b++) {
        const int equal = memcmp(all + a * ID_BYTES, all + b * ID_BYTES, sizeof(float) * ID_BYTES) == 0;
        ck_assert_msg(equal == same_group(a, b, dp), "ranks %d and %d: ids %s", a, b, equal ? "equal" : "differ");
      }
  }
  /* A failure to create reaches every member, not just the creator. */
  unsigned char id[ID_BYTES];
  ck_assert_int_eq(loom_comm_bootstrap_id(ps.tp_group, id, sizeof id, failing_id, NULL), 5);
  loom_parallel_free(&ps);
}
END_TEST

#ifdef LOOM_HAVE_NCCL
START_TEST(nccl_ids_reach_the_group) {
  unsigned char id[ID_BYTES];
  ck_assert_int_eq(loom_comm_bootstrap_id(g_world, id, sizeof id, loom_nccl_create_id, NULL), 0);
  float all[4 * ID_BYTES];
  gather_ids(id, all);
  for (int r = 1; r < 4; r++) ck_assert_mem_eq(all, all + r * ID_BYTES, sizeof(float) * ID_BYTES);
}
END_TEST
#endif

int main(int argc, char **argv) {
  g_world = loom_comm_mpi_world(&argc, &argv);
  Suite *s = suite_create("bootstrap");
  TCase *tc = tcase_create("bootstrap");
  tcase_add_test(tc, members_share_their_group_rank_0s_id);
#ifdef LOOM_HAVE_NCCL
  tcase_add_test(tc, nccl_ids_reach_the_group);
#endif
  suite_add_tcase(s, tc);
  return tu_run_mpi(s, g_world);
}
