/* The caching allocator (core/block_cache.h) over a counting malloc with a
 * byte limit, standing in for cudaMalloc. */
#include <check.h>
#include <stdlib.h>
#include "core/block_cache.h"

typedef struct {
  size_t live, limit; /* bytes the raw allocator has out, and its capacity */
  int allocs, releases;
} raw_state;

typedef struct {
  size_t size;
} raw_header;

static void *raw_alloc(void *ctx, size_t bytes) {
  raw_state *s = ctx;
  if (s->live + bytes > s->limit) return NULL;
  raw_header *h = malloc(sizeof *h + bytes);
  h->size = bytes;
  s->live += bytes;
  s->allocs++;
  return h + 1;
}

static void raw_release(void *ctx, void *p) {
  raw_state *s = ctx;
  raw_header *h = (raw_header *)p - 1;
  s->live -= h->size;
  s->releases++;
  free(h);
}

static loom_block_cache *cache_over(raw_state *s, size_t limit) {
  *s = (raw_state){.limit = limit};
  loom_block_cache *c = loom_block_cache_new((loom_raw_memory){raw_alloc, raw_release, s});
  ck_assert_ptr_nonnull(c);
  return c;
}

START_TEST(freed_blocks_serve_later_requests) {
  raw_state s;
  loom_block_cache *c = cache_over(&s, 1 << 20);
  void *a = loom_block_cache_alloc(c, 1000);
  ck_assert_ptr_nonnull(a);
  ck_assert(loom_block_cache_free(c, a));
  void *b = loom_block_cache_alloc(c, 900); /* rounds to 1024, the same block */
  ck_assert_ptr_eq(a, b);
  ck_assert_int_eq(s.allocs, 1);
  loom_block_cache_stats st = loom_block_cache_stats_of(c);
  ck_assert_uint_eq(st.in_use, 1024);
  ck_assert_uint_eq(st.reserved, 1024);
  ck_assert_uint_eq(st.raw_allocs, 1);
  ck_assert_uint_eq(st.reuses, 1);
  loom_block_cache_delete(c);
  ck_assert_int_eq(s.releases, 1);
  ck_assert_uint_eq(s.live, 0);
}
END_TEST

START_TEST(a_block_much_larger_than_asked_is_not_used) {
  raw_state s;
  loom_block_cache *c = cache_over(&s, 1 << 20);
  void *big = loom_block_cache_alloc(c, 8192);
  ck_assert(loom_block_cache_free(c, big));
  void *small = loom_block_cache_alloc(c, 4096); /* would waste half of big */
  ck_assert_ptr_ne(small, big);
  ck_assert_int_eq(s.allocs, 2);
  void *fits = loom_block_cache_alloc(c, 7000); /* wastes 1024 of 8192: reuse */
  ck_assert_ptr_eq(fits, big);
  loom_block_cache_delete(c);
}
END_TEST

START_TEST(the_smallest_fitting_block_wins) {
  raw_state s;
  loom_block_cache *c = cache_over(&s, 1 << 20);
  void *b5 = loom_block_cache_alloc(c, 5120), *b4 = loom_block_cache_alloc(c, 4608);
  ck_assert(loom_block_cache_free(c, b5));
  ck_assert(loom_block_cache_free(c, b4));
  ck_assert_ptr_eq(loom_block_cache_alloc(c, 4096), b4);
  ck_assert_ptr_eq(loom_block_cache_alloc(c, 4096), b5);
  loom_block_cache_delete(c);
}
END_TEST

START_TEST(peaks_and_ownership) {
  raw_state s;
  loom_block_cache *c = cache_over(&s, 1 << 20);
  char *a = loom_block_cache_alloc(c, 3 * LOOM_BLOCK_ALIGN), *b = loom_block_cache_alloc(c, 0);
  ck_assert_ptr_nonnull(b);
  ck_assert_ptr_ne(a, b);
  ck_assert(loom_block_cache_owns(c, a));
  ck_assert(loom_block_cache_owns(c, a + 3 * LOOM_BLOCK_ALIGN - 1)); /* a view inside the block */
  ck_assert(!loom_block_cache_owns(c, &s));
  ck_assert(loom_block_cache_free(c, a));
  ck_assert(!loom_block_cache_owns(c, a)); /* cached, not handed out */
  ck_assert(!loom_block_cache_free(c, a)); /* twice */
  ck_assert(!loom_block_cache_free(c, b + 1)); /* not a block's start */
  loom_block_cache_stats st = loom_block_cache_stats_of(c);
  ck_assert_uint_eq(st.in_use, LOOM_BLOCK_ALIGN);
  ck_assert_uint_eq(st.peak_in_use, 4 * LOOM_BLOCK_ALIGN);
  ck_assert_uint_eq(st.reserved, 4 * LOOM_BLOCK_ALIGN);
  loom_block_cache_trim(c);
  st = loom_block_cache_stats_of(c);
  ck_assert_uint_eq(st.reserved, LOOM_BLOCK_ALIGN);
  ck_assert_uint_eq(st.peak_reserved, 4 * LOOM_BLOCK_ALIGN);
  ck_assert_uint_eq(s.live, LOOM_BLOCK_ALIGN);
  loom_block_cache_delete(c);
  ck_assert_uint_eq(s.live, 0);
}
END_TEST

START_TEST(out_of_memory_gives_the_cache_back_first) {
  raw_state s;
  loom_block_cache *c = cache_over(&s, 16 * 1024);
  void *a = loom_block_cache_alloc(c, 12 * 1024);
  ck_assert(loom_block_cache_free(c, a));
  void *b = loom_block_cache_alloc(c, 6 * 1024); /* a would waste half: the raw memory is short until a goes back */
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(s.releases, 1);
  ck_assert_uint_eq(loom_block_cache_stats_of(c).reserved, 6 * 1024);
  ck_assert_ptr_null(loom_block_cache_alloc(c, 32 * 1024)); /* more than there is */
  ck_assert_ptr_null(loom_block_cache_alloc(c, SIZE_MAX - 1)); /* the rounding would overflow */
  ck_assert_uint_eq(loom_block_cache_stats_of(c).in_use, 6 * 1024);
  loom_block_cache_delete(c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("block_cache");
  TCase *tc = tcase_create("cache");
  tcase_add_test(tc, freed_blocks_serve_later_requests);
  tcase_add_test(tc, a_block_much_larger_than_asked_is_not_used);
  tcase_add_test(tc, the_smallest_fitting_block_wins);
  tcase_add_test(tc, peaks_and_ownership);
  tcase_add_test(tc, out_of_memory_gives_the_cache_back_first);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  const int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
