// The emulated GPU's memory. Device allocations come from one arena the
// host cannot touch: it is mapped PROT_NONE except while device work runs,
// so host code that dereferences a device pointer faults, and the fault is
// named. Each allocation sits between two redzones (poisoned under ASan,
// canary bytes otherwise, checked after every kernel) and starts filled
// with 0xff bytes, a NaN in fp32, bf16 and fp64, so a kernel that reads what
// nothing wrote shows it (compute-sanitizer's initcheck). Managed memory is
// host memory the device may also use.
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <iterator>
#include <map>
#include <vector>

#include "emu.h"
#ifdef LOOM_EMU_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace loom_emu {
namespace {

constexpr size_t ARENA = (size_t)1 << 38; // address space reserved, not memory
constexpr size_t REDZONE = 256;           // cudaMalloc's alignment
constexpr unsigned char CANARY = 0xa5, UNWRITTEN = 0xff;

struct Allocation {
  size_t bytes;  // as asked
  size_t span;   // with both redzones, rounded
  bool managed;
};

struct Memory {
  char *arena = nullptr;
  size_t top = 0;                       // arena bytes ever used (the high-water mark)
  size_t in_use = 0;                    // device memory allocated (device_memory() the most)
  std::map<size_t, size_t> holes;       // free arena ranges: offset -> bytes
  std::map<uintptr_t, Allocation> live; // by user pointer
  int access = 0;                       // nested DeviceAccess scopes
  struct sigaction previous;
};

Memory &mem() {
  static Memory m;
  return m;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Host code touched the arena outside device work: say so, then die as the fault would.
void on_segv(int sig, siginfo_t *info, void *uctx) {
  Memory &m = mem();
  const char *addr = (const char *)info->si_addr;
  if (m.arena && addr >= m.arena && addr < m.arena + ARENA) {
    char where[160];
    describe(addr, where, sizeof where);
    char line[320];
    const int n = snprintf(line, sizeof line,
                           "loom emu: host code dereferenced device memory at %p (%s): device memory is not host "
                           "memory; copy it with cudaMemcpy\n",
                           (const void *)addr, where);
    if (n > 0) (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
  }
  // Let the previous handler (ASan's, or the default) report and end the process.
  if (m.previous.sa_flags & SA_SIGINFO) {
    if (m.previous.sa_sigaction) {
      m.previous.sa_sigaction(sig, info, uctx);
      return;
    }
  } else if (m.previous.sa_handler != SIG_DFL && m.previous.sa_handler != SIG_IGN) {
    m.previous.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void open_arena(Memory &m) {
  if (m.arena) return;
  void *p = mmap(nullptr, ARENA, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "loom emu: cannot reserve the device's address space\n");
    abort();
  }
  m.arena = (char *)p;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &m.previous);
}

void set_access(Memory &m, int prot) {
  if (m.top && mprotect(m.arena, round_up(m.top, 4096), prot) != 0) {
    fprintf(stderr, "loom emu: mprotect of device memory failed\n");
    abort();
  }
}

// The first byte of [p, p + n) that is not `want`, or nullptr.
const unsigned char *first_not(const unsigned char *p, size_t n, unsigned char want) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != want) return p + i;
  return nullptr;
}

const std::pair<const uintptr_t, Allocation> *holding(const void *p) {
  Memory &m = mem();
  auto it = m.live.upper_bound((uintptr_t)p);
  if (it == m.live.begin()) return nullptr;
  --it;
  const uintptr_t at = (uintptr_t)p;
  return at < it->first + round_up(it->second.bytes ? it->second.bytes : 1, REDZONE) ? &*it : nullptr;
}

} // namespace

size_t device_memory() {
  static const size_t bytes = [] {
    const char *mib = getenv("LOOM_EMU_MEMORY_MIB");
    return (mib && atol(mib) > 0 ? (size_t)atol(mib) : 16384) << 20;
  }();
  return bytes;
}

DeviceAccess::DeviceAccess() {
  Memory &m = mem();
  if (m.access++ == 0) set_access(m, PROT_READ | PROT_WRITE);
}

DeviceAccess::~DeviceAccess() {
  Memory &m = mem();
  if (--m.access == 0) set_access(m, PROT_NONE);
}

void *device_alloc(size_t bytes) {
  LOOM_EMU_LOCK;
  Memory &m = mem();
  open_arena(m);
  const size_t user = round_up(bytes ? bytes : 1, REDZONE), span = user + 2 * REDZONE;
  if (m.in_use + span > device_memory()) return nullptr;
  size_t at = m.top;
  auto hole = m.holes.begin();
  for (; hole != m.holes.end(); ++hole)
    if (hole->second >= span) break;
  if (hole != m.holes.end()) {
    at = hole->first;
    const size_t rest = hole->second - span;
    m.holes.erase(hole);
    if (rest) m.holes[at + span] = rest;
  } else {
    if (m.top + span > ARENA) return nullptr;
    m.top += span;
  }
  m.in_use += span;
  char *base = m.arena + at, *p = base + REDZONE;
  {
    DeviceAccess access;
    UNPOISON(base, span);
    memset(base, CANARY, REDZONE);
    memset(p, UNWRITTEN, user);
    memset(p + user, CANARY, REDZONE);
    POISON(base, REDZONE);
    POISON(p + user, REDZONE);
    if (user > bytes) POISON(p + bytes, user - bytes);
  }
  m.live[(uintptr_t)p] = Allocation{bytes, span, false};
  return p;
}

void *managed_alloc(size_t bytes) {
  LOOM_EMU_LOCK;
  Memory &m = mem();
  open_arena(m);
  const size_t span = round_up(bytes ? bytes : 1, 4096);
  void *p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  memset(p, UNWRITTEN, span);
  m.live[(uintptr_t)p] = Allocation{bytes, span, true};
  return p;
}

bool release(void *p) {
  LOOM_EMU_LOCK;
  Memory &m = mem();
  auto it = m.live.find((uintptr_t)p);
  if (it == m.live.end()) return false;
  const Allocation a = it->second;
  m.live.erase(it);
  if (a.managed) {
    munmap(p, a.span);
    return true;
  }
  char *base = (char *)p - REDZONE;
  POISON(base, a.span); // a kernel still using it is a use after free
  size_t at = (size_t)(base - m.arena), span = a.span;
  m.in_use -= span;
  auto next = m.holes.lower_bound(at);
  if (next != m.holes.end() && next->first == at + span) { // merge with the hole after
    span += next->second;
    next = m.holes.erase(next);
  }
  if (next != m.holes.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == at) { // and the one before
      before->second += span;
      return true;
    }
  }
  m.holes[at] = span;
  return true;
}

Space space_of(const void *p) {
  LOOM_EMU_LOCK;
  Memory &m = mem();
  if (m.arena && (const char *)p >= m.arena && (const char *)p < m.arena + ARENA) return SPACE_DEVICE;
  const auto *a = holding(p);
  if (a && a->second.managed) return SPACE_MANAGED;
  return SPACE_HOST;
}

bool inside_allocation(const void *p, size_t bytes) {
  LOOM_EMU_LOCK;
  const auto *a = holding(p);
  return a && (uintptr_t)p + bytes <= a->first + a->second.bytes;
}

void describe(const void *p, char *out, size_t len) {
  const auto *a = holding(p);
  if (!a) {
    snprintf(out, len, "in no live allocation");
    return;
  }
  snprintf(out, len, "byte %zu of a %zu-byte %s allocation at %p", (size_t)((uintptr_t)p - a->first), a->second.bytes,
           a->second.managed ? "managed" : "device", (void *)a->first);
}

bool redzones_intact(char *what, size_t len) {
  Memory &m = mem();
  for (const auto &[at, a] : m.live) {
    if (a.managed) continue;
    const unsigned char *p = (const unsigned char *)at, *base = p - REDZONE;
    const size_t user = round_up(a.bytes ? a.bytes : 1, REDZONE);
    UNPOISON(base, REDZONE);
    UNPOISON(p + user, REDZONE);
    const unsigned char *bad = first_not(base, REDZONE, CANARY);
    const unsigned char *after = bad ? nullptr : first_not(p + user, REDZONE, CANARY);
    POISON(base, REDZONE);
    POISON(p + user, REDZONE);
    if (bad || after) {
      const long off = bad ? (long)(bad - p) : (long)(after - p);
      snprintf(what, len, "wrote byte %ld of the %zu-byte allocation at %p (%s its bounds)", off, a.bytes, (void *)p,
               bad ? "before" : "past");
      UNPOISON(bad ? base : p + user, REDZONE); // the canary again, so the report comes once
      memset(bad ? (void *)base : (void *)(p + user), CANARY, REDZONE);
      POISON(bad ? base : p + user, REDZONE);
      return false;
    }
  }
  return true;
}

struct Snapshot {
  std::vector<std::pair<char *, std::vector<char>>> parts;
};

Snapshot *snapshot_take() {
  Snapshot *s = new Snapshot;
  for (const auto &[at, a] : mem().live) {
    char *p = (char *)at;
    s->parts.emplace_back(p, std::vector<char>(p, p + a.bytes));
  }
  return s;
}

void snapshot_restore(const Snapshot *s) {
  for (const auto &[p, bytes] : s->parts)
    if (mem().live.count((uintptr_t)p)) memcpy(p, bytes.data(), bytes.size());
}

// Two fp32 words that differ by more than rounding (or one is NaN and not the other).
static bool words_differ(uint32_t a, uint32_t b) {
  if (a == b) return false;
  float x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  if (x != x || y != y) return true;
  return fabsf(x - y) > 1e-5f * fmaxf(fabsf(x), fabsf(y)) + 1e-30f;
}

bool snapshot_differs(const Snapshot *s, char *out, size_t len) {
  for (const auto &[p, bytes] : s->parts) {
    if (!mem().live.count((uintptr_t)p)) continue;
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      uint32_t a, b;
      memcpy(&a, bytes.data() + i, 4);
      memcpy(&b, p + i, 4);
      if (words_differ(a, b)) {
        snprintf(out, len, "word %zu of the %zu-byte allocation at %p: 0x%08x one way, 0x%08x the other", i / 4,
                 bytes.size(), (void *)p, a, b);
        return true;
      }
    }
  }
  return false;
}

void snapshot_free(Snapshot *s) { delete s; }

} // namespace loom_emu
