// The emulated GPU's SIMT engine. A launch's blocks run one after another;
// a block's threads run as fibers on the host thread that waits for the
// device, each until it reaches a barrier, a warp operation or its end, in
// an order LOOM_EMU_SEED varies (so that a missing barrier changes results
// rather than hiding behind one lucky order). __syncthreads() releases
// when every thread of the block has reached it; a warp operation when every
// lane its mask names has reached the same one. What compute-sanitizer's
// synccheck reports is a fault here, naming the kernel, block and thread: a
// barrier some threads of the block exit without reaching, a mask that
// names an exited or missing lane, lanes that meet at different warp
// operations, threads that wait for each other forever. A launch over
// sm_90's limits is refused. With LOOM_EMU_RACECHECK=1 every launch runs
// twice, in two orders, from the same memory, and a kernel whose results
// differ (beyond float rounding) is reported as racing, as racecheck would.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <memory>
#include <string>
#include <vector>

#include "emu.h"
#ifdef LOOM_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace loom_emu {

Coordinates here;

struct Launch {
  std::string name;
  dim3 grid, block;
  size_t dynamic_shared;
  void (*body)(void *);
  void *closure;
  void (*destroy)(void *);
  char *shared_begin, *shared_end;
  uint64_t number; // launches so far: one key of the order
  ~Launch() { destroy(closure); }
};

namespace {

constexpr int MAX_THREADS = 1024, MAX_DIM_Z = 64;
constexpr unsigned MAX_GRID_Y = 65535;
constexpr size_t DEFAULT_SHARED = 48 << 10, OPTIN_SHARED = 227 << 10;
// A thread's stack. Kernels are shallow; small stacks, side by side in one
// mapping, keep a block's 1024 of them within the TLB's reach (a switch
// from thread to thread touches each one's top). A guard page under each.
#ifdef LOOM_EMU_ASAN
constexpr size_t STACK = 256 << 10;
#else
constexpr size_t STACK = 28 << 10;
#endif
constexpr size_t GUARD = 4096;

// ---- fibers ----
#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer
// in *save, and resumes the stack at `to`. The FP control words are left as
// they are: every fiber runs on one host thread, and no kernel changes them.
asm(".text\n.globl loom_emu_switch\n.hidden loom_emu_switch\n.type loom_emu_switch,@function\n"
    "loom_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size loom_emu_switch, .-loom_emu_switch\n");
extern "C" void loom_emu_switch(void **save, void *to);
struct Context {
  void *sp = nullptr;
};
void start_context(Context &c, char *stack, size_t size, void (*entry)()) {
  uint64_t *sp = (uint64_t *)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
  *--sp = 0;               // entry's return address: it never returns
  *--sp = (uint64_t)entry; // where the first switch to it returns to
  for (int i = 0; i < 6; i++) *--sp = 0;
  c.sp = sp;
}
inline void switch_context(Context &from, Context &to) { loom_emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
void start_context(Context &c, char *stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
inline void switch_context(Context &from, Context &to) { swapcontext(&from.uc, &to.uc); }
#endif

enum State { READY, RUNNING, AT_BARRIER, AT_WARP, EXITED };

struct Lane {
  uint3 idx;
  int tid;
  State state;
  uint64_t value, result;
  int arg, width;
  Context ctx;
  char *stack;
  void *fake_stack = nullptr; // ASan's
};

struct Warp {
  bool pending;
  WarpOp op;
  unsigned mask, arrived, exists, exited;
};

struct Block {
  Launch *launch;
  uint3 idx;
  std::vector<Lane> lanes;
  std::vector<Warp> warps;
  int live, at_barrier, exited;
  bool failed;
  std::string error;
  Lane *current;
};

Block *g_block;
Context g_scheduler;
#ifdef LOOM_EMU_ASAN
void *g_scheduler_fake;
const void *g_scheduler_stack;
size_t g_scheduler_stack_size;
#endif
std::vector<char> g_dynamic;
size_t g_max_dynamic_allowed = DEFAULT_SHARED; // the largest cudaFuncSetAttribute granted
uint64_t g_launches;

const char *op_name(WarpOp op) {
  switch (op) {
  case WARP_SYNC: return "__syncwarp";
  case WARP_SHFL_DOWN: return "__shfl_down_sync";
  case WARP_SHFL_XOR: return "__shfl_xor_sync";
  case WARP_BALLOT: return "__ballot_sync";
  }
  return "a warp operation";
}

char *stack_for(size_t i) {
  static char *stacks = nullptr;
  if (!stacks) {
    const size_t bytes = (size_t)MAX_THREADS * (STACK + GUARD);
    stacks = (char *)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) {
      fprintf(stderr, "loom emu: out of memory for thread stacks\n");
      abort();
    }
    for (size_t t = 0; t < (size_t)MAX_THREADS; t++) mprotect(stacks + t * (STACK + GUARD), GUARD, PROT_NONE);
  }
  return stacks + i * (STACK + GUARD) + GUARD;
}

void to_lane(Lane &l) {
  here.thread = l.idx;
  g_block->current = &l;
  l.state = RUNNING;
#ifdef LOOM_EMU_ASAN
  __sanitizer_start_switch_fiber(&g_scheduler_fake, l.stack, STACK);
#endif
  switch_context(g_scheduler, l.ctx);
#ifdef LOOM_EMU_ASAN
  __sanitizer_finish_switch_fiber(g_scheduler_fake, nullptr, nullptr);
#endif
}

void to_scheduler(Lane &l, bool exiting) {
#ifdef LOOM_EMU_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &l.fake_stack, g_scheduler_stack, g_scheduler_stack_size);
#endif
  switch_context(l.ctx, g_scheduler);
#ifdef LOOM_EMU_ASAN
  __sanitizer_finish_switch_fiber(l.fake_stack, &g_scheduler_stack, &g_scheduler_stack_size);
#endif
}

// Ends the block with a synccheck fault; the calling lane never resumes.
void fail(Lane *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fail(Lane *l, const char *fmt, ...) {
  Block &b = *g_block;
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  char where[128] = "";
  if (l) snprintf(where, sizeof where, ", thread (%u,%u,%u)", l->idx.x, l->idx.y, l->idx.z);
  char line[800];
  snprintf(line, sizeof line, "kernel %s, block (%u,%u,%u)%s: %s", b.launch->name.c_str(), b.idx.x, b.idx.y, b.idx.z,
           where, what);
  b.failed = true;
  b.error = line;
  if (l) to_scheduler(*l, false);
}

void lane_main() {
#ifdef LOOM_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_scheduler_stack, &g_scheduler_stack_size);
#endif
  Block &b = *g_block;
  Lane &me = *b.current;
  b.launch->body(b.launch->closure);
  me.state = EXITED;
  b.live--;
  b.exited++;
  Warp &w = b.warps[me.tid / 32];
  const unsigned bit = 1u << (me.tid % 32);
  w.exited |= bit;
  if (w.pending && (w.mask & bit) && !(w.arrived & bit))
    fail(&me, "lane %d exited while lanes 0x%08x wait for it at %s (mask 0x%08x)", me.tid % 32, w.arrived,
         op_name(w.op), w.mask);
  to_scheduler(me, true);
  abort(); // never resumed
}

// The i-th of n in an order keyed by (seed, key): an affine bijection, the identity under seed 0.
struct Order {
  uint64_t a = 1, b = 0, n = 1;
  Order(uint64_t n_, uint64_t s, uint64_t key) : n(n_ ? n_ : 1) {
    if (!s) return;
    uint64_t h = (s + 0x9e3779b97f4a7c15ull) * (key * 2 + 1) ^ (key >> 7);
    h ^= h >> 31, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 29;
    b = h % n;
    a = (h >> 17) % n | 1;
    auto gcd = [](uint64_t x, uint64_t y) { while (y) { const uint64_t t = x % y; x = y, y = t; } return x; };
    while (gcd(a, n) != 1) a++;
    a %= n;
    if (!a) a = 1;
  }
  uint64_t at(uint64_t i) const { return (a * i + b) % n; }
};

// Fills [p, p + n) with 0xff bytes without ASan's checks: the __shared__
// section holds instrumented globals with redzones between them.
__attribute__((no_sanitize("address"))) void fill_unwritten(char *p, size_t n) {
  volatile char *v = p;
  for (size_t i = 0; i < n; i++) v[i] = (char)0xff;
}

// Runs one block to its end; false after a fault (b.error says what).
bool run_block(Block &b, uint64_t order_seed) {
  Launch &l = *b.launch;
  const dim3 d = l.block;
  const int n = (int)(d.x * d.y * d.z);
  fill_unwritten(l.shared_begin, (size_t)(l.shared_end - l.shared_begin));
  if (g_dynamic.size() < l.dynamic_shared) g_dynamic.resize(l.dynamic_shared);
  fill_unwritten(g_dynamic.data(), l.dynamic_shared);
  b.lanes.resize((size_t)n);
  b.warps.assign((size_t)(n + 31) / 32, Warp{false, WARP_SYNC, 0, 0, 0, 0});
  for (int w = 0; w < (n + 31) / 32; w++) b.warps[w].exists = n - 32 * w >= 32 ? 0xffffffffu : (1u << (n - 32 * w)) - 1;
  for (int t = 0; t < n; t++) {
    Lane &x = b.lanes[t];
    x.tid = t;
    x.idx = uint3{(unsigned)t % d.x, (unsigned)t / d.x % d.y, (unsigned)t / (d.x * d.y)};
    x.state = READY;
    x.stack = stack_for((size_t)t);
    x.fake_stack = nullptr;
#ifdef LOOM_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(x.stack, STACK); // an abandoned fiber's frames
#endif
    start_context(x.ctx, x.stack, STACK, lane_main);
  }
  b.live = n, b.at_barrier = 0, b.exited = 0, b.failed = false;
  here.block = b.idx;
  here.block_dim = l.block;
  here.grid_dim = l.grid;
  const Order order((uint64_t)n, order_seed, l.number * 0x10001 + b.idx.x + 977 * b.idx.y + 31337 * b.idx.z);
  std::vector<Lane *> turns((size_t)n); // the order the threads take their turns in, every round
  for (int i = 0; i < n; i++) turns[(size_t)i] = &b.lanes[order.at((uint64_t)i)];
  for (;;) {
    bool ran = false;
    for (Lane *turn : turns) {
      Lane &x = *turn;
      if (x.state != READY) continue;
      to_lane(x);
      ran = true;
      if (b.failed) return false;
    }
    if (b.live == 0) return true;
    if (b.at_barrier == b.live) {
      if (b.exited) {
        const Lane *gone = nullptr;
        for (const Lane &x : b.lanes)
          if (x.state == EXITED) {
            gone = &x;
            break;
          }
        fail(nullptr, "__syncthreads() reached by %d of the block's %d threads: thread (%u,%u,%u) and %d more exited "
                      "without reaching it",
             b.live, n, gone->idx.x, gone->idx.y, gone->idx.z, b.exited - 1);
        return false;
      }
      for (Lane &x : b.lanes)
        if (x.state == AT_BARRIER) x.state = READY;
      b.at_barrier = 0;
      continue;
    }
    if (!ran) {
      for (size_t w = 0; w < b.warps.size(); w++)
        if (b.warps[w].pending) {
          fail(nullptr, "threads wait for each other forever: warp %zu's %s (mask 0x%08x) has lanes 0x%08x, while %d "
                        "thread(s) wait at __syncthreads()",
               w, op_name(b.warps[w].op), b.warps[w].mask, b.warps[w].arrived, b.at_barrier);
          return false;
        }
      fail(nullptr, "threads wait for each other forever");
      return false;
    }
  }
}

// Every block of the launch, in the seed's order.
bool run_blocks(Launch &l, uint64_t order_seed, std::string &error) {
  const uint64_t count = (uint64_t)l.grid.x * l.grid.y * l.grid.z;
  const Order order(count, order_seed, l.number);
  Block b;
  b.launch = &l;
  g_block = &b;
  for (uint64_t i = 0; i < count; i++) {
    const uint64_t k = order.at(i);
    b.idx = uint3{(unsigned)(k % l.grid.x), (unsigned)(k / l.grid.x % l.grid.y), (unsigned)(k / ((uint64_t)l.grid.x * l.grid.y))};
    if (!run_block(b, order_seed)) {
      error = b.error;
      g_block = nullptr;
      return false;
    }
  }
  g_block = nullptr;
  return true;
}

bool racecheck() {
  static const bool on = getenv("LOOM_EMU_RACECHECK") && atoi(getenv("LOOM_EMU_RACECHECK")) != 0;
  return on;
}

} // namespace

bool run_launch(Launch *l) {
  std::string error;
  Snapshot *before = racecheck() ? snapshot_take() : nullptr;
  bool ok = run_blocks(*l, seed(), error);
  if (ok && before) { // again from the same memory in another order; the two must agree
    Snapshot *first = snapshot_take();
    snapshot_restore(before);
    ok = run_blocks(*l, seed() * 0x2545f4914f6cdd1dull + 0x6a09e667ull, error);
    char diff[256];
    if (ok && snapshot_differs(first, diff, sizeof diff)) {
      fault(cudaErrorLaunchFailure,
            "racecheck: kernel %s: its results depend on the order its threads ran (%s): a shared-memory race (a "
            "missing __syncthreads or __syncwarp) or a data race between threads",
            l->name.c_str(), diff);
      snapshot_free(first);
      snapshot_free(before);
      return false;
    }
    snapshot_free(first);
  }
  if (before) snapshot_free(before);
  if (!ok) {
    fault(cudaErrorLaunchFailure, "%s", error.c_str());
    return false;
  }
  char what[256];
  if (!redzones_intact(what, sizeof what)) {
    fault(cudaErrorIllegalAddress, "kernel %s %s", l->name.c_str(), what);
    return false;
  }
  return true;
}

void *dynamic_shared() { return g_dynamic.data(); }

void sync_block() {
  Block &b = *g_block;
  Lane &me = *b.current;
  me.state = AT_BARRIER;
  b.at_barrier++;
  to_scheduler(me, false);
}

uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  Block &b = *g_block;
  Lane &me = *b.current;
  const int lane = me.tid % 32, warp = me.tid / 32;
  Warp &w = b.warps[warp];
  if (!(mask >> lane & 1)) fail(&me, "%s with mask 0x%08x, which leaves out the calling lane %d", op_name(op), mask, lane);
  if (mask & ~w.exists)
    fail(&me, "%s with mask 0x%08x names lanes 0x%08x that warp %d of this block does not have", op_name(op), mask,
         mask & ~w.exists, warp);
  if (mask & w.exited)
    fail(&me, "%s with mask 0x%08x names lanes 0x%08x, which have exited", op_name(op), mask, mask & w.exited);
  if (width < 1 || width > 32 || (width & (width - 1))) fail(&me, "%s with width %d", op_name(op), width);
  if (w.pending && (w.op != op || w.mask != mask))
    fail(&me, "the lanes of warp %d meet at different warp operations: %s with mask 0x%08x, and %s with mask 0x%08x",
         warp, op_name(w.op), w.mask, op_name(op), mask);
  if (!w.pending) w.pending = true, w.op = op, w.mask = mask, w.arrived = 0;
  me.value = value, me.arg = arg, me.width = width;
  w.arrived |= 1u << lane;
  if (w.arrived != mask) {
    me.state = AT_WARP;
    to_scheduler(me, false);
    return me.result;
  }
  // The last lane to arrive: every lane's result, then all of them go on.
  Lane *lanes = &b.lanes[(size_t)warp * 32];
  uint64_t ballot = 0;
  for (int i = 0; i < 32; i++)
    if (mask >> i & 1) ballot |= (lanes[i].value & 1) << i;
  for (int i = 0; i < 32; i++) {
    if (!(mask >> i & 1)) continue;
    Lane &x = lanes[i];
    const int seg = i / x.width;
    int src = i;
    if (op == WARP_SHFL_DOWN && (i % x.width) + x.arg < x.width) src = i + x.arg;
    if (op == WARP_SHFL_XOR && ((i ^ x.arg) & 31) / x.width == seg) src = (i ^ x.arg) & 31;
    if (!(mask >> src & 1))
      fail(&me, "%s: lane %d reads lane %d, which mask 0x%08x leaves out", op_name(op), i, src, mask);
    x.result = op == WARP_BALLOT ? ballot : op == WARP_SYNC ? 0 : lanes[src].value;
    if (&x != &me) x.state = READY;
  }
  w.pending = false;
  return me.result;
}

cudaError_t launch_kernel(const char *name, dim3 grid, dim3 block, size_t dynamic_shared, cudaStream_t stream,
                          void (*body)(void *), void *closure, void (*destroy)(void *), char *shared_begin,
                          char *shared_end) {
  LOOM_EMU_LOCK;
  auto l = std::make_shared<Launch>();
  l->name = name, l->grid = grid, l->block = block, l->dynamic_shared = dynamic_shared;
  l->body = body, l->closure = closure, l->destroy = destroy;
  l->shared_begin = shared_begin, l->shared_end = shared_end ? shared_end : shared_begin;
  l->number = ++g_launches;
  if (sticky()) return sticky();
  const uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (!block.x || !block.y || !block.z || block.x > MAX_THREADS || block.y > MAX_THREADS || block.z > MAX_DIM_Z ||
      threads > MAX_THREADS)
    return refuse(cudaErrorInvalidConfiguration,
                  "kernel %s: a block of (%u,%u,%u) threads: sm_90 takes at most %d threads a block, (1024,1024,64) "
                  "in each dimension",
                  name, block.x, block.y, block.z, MAX_THREADS);
  if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > MAX_GRID_Y || grid.z > MAX_GRID_Y)
    return refuse(cudaErrorInvalidConfiguration,
                  "kernel %s: a grid of (%u,%u,%u) blocks: sm_90 takes 1..2^31-1 in x and 1..65535 in y and z", name,
                  grid.x, grid.y, grid.z);
  if (dynamic_shared > g_max_dynamic_allowed || dynamic_shared > OPTIN_SHARED)
    return refuse(cudaErrorInvalidValue,
                  "kernel %s: %zu bytes of dynamic shared memory: sm_90 gives %zu without "
                  "cudaFuncAttributeMaxDynamicSharedMemorySize, at most %zu with it",
                  name, dynamic_shared, DEFAULT_SHARED, OPTIN_SHARED);
  enqueue(stream, "a kernel", [l] {
    run_launch(l.get());
    return true;
  });
  return sticky();
}

} // namespace loom_emu

using namespace loom_emu;

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  LOOM_EMU_LOCK;
  if (!func) return refuse(cudaErrorInvalidValue, "cudaFuncSetAttribute: a null kernel");
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return refuse(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not emulated", (int)attr);
  if (value < 0 || (size_t)value > OPTIN_SHARED)
    return refuse(cudaErrorInvalidValue, "cudaFuncSetAttribute: %d bytes of dynamic shared memory: sm_90 allows at most %zu",
                  value, OPTIN_SHARED);
  // Kept per device, not per kernel: a launch knows its kernel's name, not its address.
  if ((size_t)value > g_max_dynamic_allowed) g_max_dynamic_allowed = (size_t)value;
  return cudaSuccess;
}
