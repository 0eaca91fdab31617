// Fused causal attention under ops.h's flash contract: nothing T x T ever
// reaches memory. Queries and keys go in tiles of 32, one per lane; a
// block of four warps holds one tile of each kind, and its running sums in
// shared memory.
//
// Forward: a block owns 32 query rows of one head and walks the key tiles
// up to the diagonal (from its window's first under a sliding window) with the online softmax (running max m, sum l, output
// rescaled by exp(m_old - m_new)); it writes out = o / l and lse = m + log l.
// Backward, deterministic (no atomics): delta = dout . out per row first;
// then one kernel per key tile of one key/value head accumulates dk and dv
// over every query row (of every query head it serves) at or below the
// diagonal, and one per query tile accumulates dq over the keys, each
// rebuilding p = exp(s - lse). Dropout is op_math.h's mask, as everywhere.
//
// The arithmetic is fp32 on CUDA cores; qkv holds bf16 values in bf16 runs.
#include "backend/cuda/cuda_context.cuh"

namespace loom_cuda {
namespace {

constexpr int TILE = 32;                      // rows of a tile: one per lane
constexpr int WARPS = 4;                      // per block
constexpr int ROWS_PER_WARP = TILE / WARPS;   // the rows (or keys) each warp owns
constexpr int MAX_HEAD_DIM = LOOM_ATTN_MAX_HEAD_DIM; // what fits a block's shared memory
constexpr unsigned FULL = 0xffffffffu;

// Where things are: qkv rows [t, b] of q (H heads) | k (K) | v (K), q and k D wide, v Dv; out rows [t, b] of H
// heads Dv wide; lse [b, h, t].
struct Layout {
  AttnArgs a;
  int K, w3, group;
  float scale;
  __device__ size_t q(int t, int b, int h) const { return ((size_t)t * a.B + b) * w3 + (size_t)h * a.D; }
  __device__ size_t k(int t, int b, int g) const { return ((size_t)t * a.B + b) * w3 + (size_t)(a.H + g) * a.D; }
  __device__ size_t v(int t, int b, int g) const {
    return ((size_t)t * a.B + b) * w3 + (size_t)(a.H + K) * a.D + (size_t)g * a.Dv;
  }
  __device__ size_t o(int t, int b, int h) const { return ((size_t)t * a.B + b) * a.H * a.Dv + (size_t)h * a.Dv; }
  __device__ size_t row(int b, int h, int t) const { return ((size_t)b * a.H + h) * a.T + t; }
};

Layout layout_of(const AttnArgs &a, int K) { return Layout{a, K, (a.H + K) * a.D + K * a.Dv, a.H / K, a.scale}; }

__device__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(FULL, v, off));
  return v;
}

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(FULL, v, off);
  return v;
}

// Rows t0.. of one head of src (row i at src + at(t0 + i)) into a [TILE][D + 1]
// tile (padded: lanes reading a column each hit distinct banks); rows past T are zero.
template <typename At> __device__ void load_tile(float *tile, const float *src, At at, int t0, int T, int D) {
  for (int i = threadIdx.x; i < TILE * D; i += blockDim.x) {
    const int r = i / D, d = i % D, t = t0 + r;
    tile[r * (D + 1) + d] = t < T ? src[at(t) + d] : 0.0f;
  }
}

// The keys and values of key/value head g from k0, between barriers: every
// warp is done with the previous tile before it is overwritten.
__device__ void next_kv_tile(float *k, float *v, const float *qkv, const Layout &L, int b, int g, int k0) {
  __syncthreads();
  load_tile(k, qkv, [&](int t) { return L.k(t, b, g); }, k0, L.a.T, L.a.D);
  load_tile(v, qkv, [&](int t) { return L.v(t, b, g); }, k0, L.a.T, L.a.Dv);
  __syncthreads();
}

__device__ float dot_rows(const float *x, const float *y, int D) {
  float acc = 0.0f;
  for (int d = 0; d < D; d++) acc += x[d] * y[d];
  return acc;
}

// acc[d] (+)= sum over the tile's rows j of w[j] * rows[j][d], for this lane's columns d.
__device__ void add_weighted_rows(float *acc, float scale, const float *w, const float *rows, int D) {
  for (int d = threadIdx.x % 32; d < D; d += 32) {
    float sum = acc[d] * scale;
    for (int j = 0; j < TILE; j++) sum += w[j] * rows[j * (D + 1) + d];
    acc[d] = sum;
  }
}

// The first key tile (aligned) a query tile from t0 reaches: 0, or under a window its first row's window's first.
__device__ int first_key_tile(const AttnArgs &a, int t0) { return a.window > 0 ? max(0, t0 - a.window) / TILE * TILE : 0; }

// The query tiles a key tile from k0 reaches end before this: T, or under a window past its last key's window.
__device__ int query_tiles_end(const AttnArgs &a, int k0) { return a.window > 0 ? min(a.T, k0 + TILE + a.window) : a.T; }

__global__ void forward_kernel(float *out, float *lse, const float *qkv, Layout L) {
  LOOM_DYNAMIC_SHARED(float, smem);
  const int D = L.a.D, P = D + 1, Dv = L.a.Dv, Pv = Dv + 1, T = L.a.T;
  float *q = smem, *k = q + TILE * P, *v = k + TILE * P, *o = v + TILE * Pv; // o: [TILE][Dv]
  __shared__ float m_row[TILE], l_row[TILE], weights[WARPS][TILE];
  const int b = blockIdx.x / L.a.H, h = blockIdx.x % L.a.H, g = h / L.group, t0 = blockIdx.y * TILE;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  load_tile(q, qkv, [&](int t) { return L.q(t, b, h); }, t0, T, D);
  for (int i = threadIdx.x; i < TILE * Dv; i += blockDim.x) o[i] = 0.0f;
  if (threadIdx.x < TILE) m_row[threadIdx.x] = -INFINITY, l_row[threadIdx.x] = 0.0f;
  const int last = min(t0 + TILE, T) - 1;
  for (int k0 = first_key_tile(L.a, t0); k0 <= last; k0 += TILE) {
    next_kv_tile(k, v, qkv, L, b, g, k0);
    for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
      const int r = warp * ROWS_PER_WARP + rr, tq = t0 + r, tk = k0 + lane;
      if (tq >= T) break; // the same for the whole warp
      const float m_old = m_row[r];
      const bool seen = loom_attn_sees(L.a.window, tq, tk);
      const float s = seen ? dot_rows(q + r * P, k + lane * P, D) * L.scale : -INFINITY;
      const float m_new = fmaxf(m_old, warp_max(s));
      // a row that has seen no key yet (a tile before its window) keeps nothing: alpha 1, every p 0
      const float p = seen ? expf(s - m_new) : 0.0f, alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
      const float sum = warp_sum(p);
      weights[warp][lane] = seen ? p * keep_factor(L.a, b, h, tq, tk) : 0.0f;
      __syncwarp();
      add_weighted_rows(o + r * Dv, alpha, weights[warp], v, Dv);
      if (lane == 0) m_row[r] = m_new, l_row[r] = l_row[r] * alpha + sum;
      __syncwarp();
    }
  }
  __syncwarp();
  for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
    const int r = warp * ROWS_PER_WARP + rr, tq = t0 + r;
    if (tq >= T) break;
    const float inv = 1.0f / l_row[r];
    for (int d = lane; d < Dv; d += 32) out[L.o(tq, b, h) + d] = o[r * Dv + d] * inv;
    if (lane == 0) lse[L.row(b, h, tq)] = m_row[r] + logf(l_row[r]);
  }
}

// delta[b, h, t] = dout . out over the row: the softmax backward's sum of p dp (ops.h). One warp per row.
__global__ void delta_kernel(float *delta, const float *dout, const float *out, Layout L) {
  const size_t row = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
  if (row >= (size_t)L.a.B * L.a.H * L.a.T) return;
  const int t = (int)(row % L.a.T), h = (int)(row / L.a.T % L.a.H), b = (int)(row / ((size_t)L.a.T * L.a.H));
  const float *dy = dout + L.o(t, b, h), *y = out + L.o(t, b, h);
  float acc = 0.0f;
  for (int d = threadIdx.x % 32; d < L.a.Dv; d += 32) acc += dy[d] * y[d];
  acc = warp_sum(acc);
  if (threadIdx.x % 32 == 0) delta[row] = acc;
}

// dq for 32 query rows of one head, over the keys up to the diagonal.
__global__ void dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *delta, Layout L) {
  LOOM_DYNAMIC_SHARED(float, smem);
  const int D = L.a.D, P = D + 1, Dv = L.a.Dv, Pv = Dv + 1, T = L.a.T;
  float *q = smem, *dy = q + TILE * P, *k = dy + TILE * Pv, *v = k + TILE * P, *dq = v + TILE * Pv; // dq: [TILE][D]
  __shared__ float weights[WARPS][TILE];
  const int b = blockIdx.x / L.a.H, h = blockIdx.x % L.a.H, g = h / L.group, t0 = blockIdx.y * TILE;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  load_tile(q, qkv, [&](int t) { return L.q(t, b, h); }, t0, T, D);
  load_tile(dy, dout, [&](int t) { return L.o(t, b, h); }, t0, T, Dv);
  for (int i = threadIdx.x; i < TILE * D; i += blockDim.x) dq[i] = 0.0f;
  const int last = min(t0 + TILE, T) - 1;
  for (int k0 = first_key_tile(L.a, t0); k0 <= last; k0 += TILE) {
    next_kv_tile(k, v, qkv, L, b, g, k0);
    for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
      const int r = warp * ROWS_PER_WARP + rr, tq = t0 + r, tk = k0 + lane;
      if (tq >= T) break;
      float ds = 0.0f;
      if (loom_attn_sees(L.a.window, tq, tk)) {
        const float p = expf(dot_rows(q + r * P, k + lane * P, D) * L.scale - lse[L.row(b, h, tq)]);
        const float dp = dot_rows(dy + r * Pv, v + lane * Pv, Dv) * keep_factor(L.a, b, h, tq, tk);
        ds = p * (dp - delta[L.row(b, h, tq)]) * L.scale;
      }
      weights[warp][lane] = ds;
      __syncwarp();
      add_weighted_rows(dq + r * D, 1.0f, weights[warp], k, D);
      __syncwarp();
    }
  }
  __syncwarp();
  for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
    const int r = warp * ROWS_PER_WARP + rr, tq = t0 + r;
    if (tq >= T) break;
    for (int d = lane; d < D; d += 32) dqkv[L.q(tq, b, h) + d] += dq[r * D + d];
  }
}

// dk and dv for 32 keys of one key/value head, over every query row at or
// below the diagonal of every query head it serves.
__global__ void dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *delta, Layout L) {
  LOOM_DYNAMIC_SHARED(float, smem);
  const int D = L.a.D, P = D + 1, Dv = L.a.Dv, Pv = Dv + 1, T = L.a.T;
  float *k = smem, *v = k + TILE * P, *q = v + TILE * Pv, *dy = q + TILE * P, *dk = dy + TILE * Pv, *dv = dk + TILE * D;
  __shared__ float row_lse[TILE], row_delta[TILE], pw[WARPS][TILE], dsw[WARPS][TILE];
  const int b = blockIdx.x / L.K, g = blockIdx.x % L.K, k0 = blockIdx.y * TILE;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  load_tile(k, qkv, [&](int t) { return L.k(t, b, g); }, k0, T, D);
  load_tile(v, qkv, [&](int t) { return L.v(t, b, g); }, k0, T, Dv);
  for (int i = threadIdx.x; i < TILE * D; i += blockDim.x) dk[i] = 0.0f;
  for (int i = threadIdx.x; i < TILE * Dv; i += blockDim.x) dv[i] = 0.0f;
  for (int h = g * L.group; h < (g + 1) * L.group; h++)
    for (int q0 = k0; q0 < query_tiles_end(L.a, k0); q0 += TILE) {
      __syncthreads();
      load_tile(q, qkv, [&](int t) { return L.q(t, b, h); }, q0, T, D);
      load_tile(dy, dout, [&](int t) { return L.o(t, b, h); }, q0, T, Dv);
      if (threadIdx.x < TILE) {
        const int t = q0 + threadIdx.x;
        row_lse[threadIdx.x] = t < T ? lse[L.row(b, h, t)] : 0.0f;
        row_delta[threadIdx.x] = t < T ? delta[L.row(b, h, t)] : 0.0f;
      }
      __syncthreads();
      for (int kk = 0; kk < ROWS_PER_WARP; kk++) {
        const int j = warp * ROWS_PER_WARP + kk, tk = k0 + j, tq = q0 + lane;
        if (tk >= T) break;
        float pz = 0.0f, ds = 0.0f;
        if (tq < T && loom_attn_sees(L.a.window, tq, tk)) {
          const float p = expf(dot_rows(q + lane * P, k + j * P, D) * L.scale - row_lse[lane]);
          const float keep = keep_factor(L.a, b, h, tq, tk);
          const float dp = dot_rows(dy + lane * Pv, v + j * Pv, Dv) * keep;
          pz = p * keep;
          ds = p * (dp - row_delta[lane]) * L.scale;
        }
        pw[warp][lane] = pz;
        dsw[warp][lane] = ds;
        __syncwarp();
        add_weighted_rows(dv + j * Dv, 1.0f, pw[warp], dy, Dv);
        add_weighted_rows(dk + j * D, 1.0f, dsw[warp], q, D);
        __syncwarp();
      }
    }
  __syncthreads();
  for (int i = threadIdx.x; i < TILE * D; i += blockDim.x) {
    const int j = i / D, d = i % D, tk = k0 + j;
    if (tk < T) dqkv[L.k(tk, b, g) + d] += dk[i];
  }
  for (int i = threadIdx.x; i < TILE * Dv; i += blockDim.x) {
    const int j = i / Dv, d = i % Dv, tk = k0 + j;
    if (tk < T) dqkv[L.v(tk, b, g) + d] += dv[i];
  }
}

// Dynamic shared memory of a kernel holding `tiles` padded tiles of each of q/k's width D and v's Dv, and `accs`
// [TILE][D] and [TILE][Dv] sums of each.
struct TileCount {
  int qk_tiles, v_tiles, qk_accs, v_accs;
};
size_t shared_bytes(int D, int Dv, TileCount n) {
  return ((size_t)n.qk_tiles * TILE * (D + 1) + (size_t)n.v_tiles * TILE * (Dv + 1) + (size_t)n.qk_accs * TILE * D +
          (size_t)n.v_accs * TILE * Dv) *
         sizeof(float);
}
constexpr TileCount FORWARD_TILES{2, 1, 0, 1}, DQ_TILES{2, 2, 1, 0}, DKV_TILES{2, 2, 1, 1};

template <typename Kernel> void allow_shared(Kernel kernel, size_t bytes) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), "attention shared memory");
}

void check_head_dim(int D) {
  if (D >= 1 && D <= MAX_HEAD_DIM) return;
  fprintf(stderr, "loom: fused attention takes head dims 1..%d, not %d (loom_cuda_set_attention CUBLAS takes any)\n",
          MAX_HEAD_DIM, D);
  abort();
}

} // namespace

bool flash_attention_fits(Backend &g, int D, int Dv) {
  if (D < 1 || D > MAX_HEAD_DIM || Dv < 1 || Dv > MAX_HEAD_DIM) return false;
  if (!g.shared_optin) check(cudaDeviceGetAttribute(&g.shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g.device),
                             "shared memory limit");
  const size_t need = shared_bytes(D, Dv, DKV_TILES); // the dk/dv kernel's, the most of the three
  if (need <= (size_t)g.shared_optin) return true;
  if (!g.flash_refused) // once per context
    fprintf(stderr, "loom: the fused attention at head dims %d (q, k) and %d (v) needs %zu B of shared memory per block, "
                    "this GPU allows %d: attention runs on cuBLAS\n", D, Dv, need, g.shared_optin);
  g.flash_refused = true;
  return false;
}

void flash_attention_forward(Backend &g, float *out, float *lse, const float *qkv, const AttnArgs &a, int K) {
  check_head_dim(a.D), check_head_dim(a.Dv);
  const Layout L = layout_of(a, K);
  const size_t bytes = shared_bytes(a.D, a.Dv, FORWARD_TILES);
  allow_shared(forward_kernel, bytes);
  const dim3 grid(a.B * a.H, (a.T + TILE - 1) / TILE); // heads in x, which takes 2^31 - 1 blocks; y takes 65535
  LAUNCH(forward_kernel, grid, WARPS * 32, bytes, g.stream, out, lse, qkv, L);
  launched("fused attention forward");
}

void flash_attention_backward(Backend &g, float *dqkv, const float *dout, const float *out, const float *qkv,
                              const float *lse, const AttnArgs &a, int K) {
  check_head_dim(a.D), check_head_dim(a.Dv);
  const Layout L = layout_of(a, K);
  const size_t rows = (size_t)a.B * a.H * a.T;
  float *delta = (float *)grow(g, g.scratch, g.scratch_bytes, rows * sizeof(float), "attention row sums");
  LAUNCH(delta_kernel, (unsigned)((rows + WARPS - 1) / WARPS), WARPS * 32, 0, g.stream, delta, dout, out, L);
  launched("fused attention delta");
  const size_t dq_bytes = shared_bytes(a.D, a.Dv, DQ_TILES), dkv_bytes = shared_bytes(a.D, a.Dv, DKV_TILES);
  allow_shared(dq_kernel, dq_bytes);
  allow_shared(dkv_kernel, dkv_bytes);
  const unsigned tiles = (unsigned)((a.T + TILE - 1) / TILE);
  LAUNCH(dq_kernel, dim3(a.B * a.H, tiles), WARPS * 32, dq_bytes, g.stream, dqkv, dout, qkv, lse, delta, L);
  launched("fused attention dq");
  LAUNCH(dkv_kernel, dim3(a.B * K, tiles), WARPS * 32, dkv_bytes, g.stream, dqkv, dout, qkv, lse, delta, L);
  launched("fused attention dk dv");
}

} // namespace loom_cuda
