// Mixture-of-experts FFN on the device (architectures.md §5): routing, the
// selected experts' SwiGLU products, and the weighted combine, with the
// expert choice never leaving the device (the step stays one graph).
//
//   moe_route    router logits → softmax over all experts (float32, max
//                subtracted, Σ in float64 as kernels.Softmax) → the top k
//                (ties: the lower index) → renormalised when asked.
//   mv_moe_*     one matvec per (row, slot) over the selected expert's
//                weights, found in a device table of expert base pointers:
//                int8 activations as matvec.cu's mq_* kernels.
//   moe_combine  x[r] += Σ_j w[r][j]·y[r·k+j] (+ σ(g[r])·shared[r]), in that
//                order (the CPU's AXPY order).
#include "common.cuh"

// moe_route: one block per activation row. Params (logits, ldl, E, k,
// renorm, ids, w): ids/w [R][k]. Launch: grid R, block 256, E ≤ MOE_MAXE.
// The softmax is spread over the block; the top k in the order greater
// probability, then the lower index (a NaN counts as −1, below every
// probability) are found from the probabilities in shared memory: up to
// MOE_RANKE experts by every entry's rank in that order (one pass, each
// thread counting the entries before its own), above it by k rounds of a
// warp argmax by warp 0, each round marking its pick taken.
#define MOE_MAXE 1024
// Up to MOE_RANKE experts (and at most two a thread) the picks are found
// in one pass: each entry's rank in the order by counting.
#define MOE_RANKE 256
// moe_route_row: the routing of one row of E logits l by a whole block
// (any multiple of 32 threads): the softmax over the block, written back
// into l as probabilities, then the top k (ranks, or warp 0's rounds).
// The logits are read through L2 (another block of moe_router_f32 may
// have written them).
__device__ __forceinline__ void moe_route_row(float* __restrict__ l, int E, int k, int renorm, int* __restrict__ ids,
                                              float* __restrict__ w) {
  __shared__ double red[32];
  __shared__ float fred[32];
  __shared__ float p[MOE_MAXE], q[MOE_MAXE];
  __shared__ int sel[MOE_MAXE];
  const int tid = threadIdx.x, lane = tid & 31;
  float mx = -INFINITY;
  for (int e = tid; e < E; e += blockDim.x) {
    const float v = __ldcg(l + e);
    p[e] = v;
    mx = fmaxf(mx, v);
  }
  mx = block_max_f(mx, fred);
  double s = 0.0;
  for (int e = tid; e < E; e += blockDim.x) {
    const float v = expf(p[e] - mx);
    p[e] = v;
    s += (double)v;
  }
  s = block_sum_d(s, red);
  const float inv = (float)(1.0 / s);
  for (int e = tid; e < E; e += blockDim.x) {
    const float v = p[e] * inv;
    l[e] = v;
    q[e] = v;
    p[e] = v != v ? -1.0f : v;
  }
  __syncthreads();
  if (E <= MOE_RANKE && (int)blockDim.x * 2 >= E) {
    // Each entry's place in the order (greater probability, then the
    // lower index) by counting the entries before it: the k rounds' picks
    // in one pass, the same order.
    for (int e = tid; e < E; e += blockDim.x) {
      const float v = p[e];
      int rank = 0;
      for (int j = 0; j < E; j++) {
        const float u = p[j];
        rank += (u > v) | ((u == v) & (j < e));
      }
      if (rank < k) sel[rank] = e;
    }
    __syncthreads();
    if (tid == 0) {
      float sum = 0.0f;
      for (int j = 0; j < k; j++) {
        const float pv = q[sel[j]];
        ids[j] = sel[j];
        w[j] = pv;
        sum += pv;
      }
      if (renorm)
        for (int j = 0; j < k; j++) w[j] = w[j] / sum;
    }
    return;
  }
  if (tid >= 32) return;
  float sum = 0.0f;
  for (int j = 0; j < k; j++) {
    float bv = -2.0f;  // taken entries hold -2: never picked while k ≤ E
    int bi = E;
    for (int e = lane; e < E; e += 32) {
      const float v = p[e];
      if (v > bv) { bv = v; bi = e; }  // ascending e: a tie keeps the lower index
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
      const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    const float pv = q[bi];  // the probability itself (a NaN stays a NaN)
    if (lane == 0) {
      ids[j] = bi;
      w[j] = pv;
    }
    sum += pv;
    if (lane == (bi & 31)) p[bi] = -2.0f;
    __syncwarp();
  }
  if (renorm && lane == 0)
    for (int j = 0; j < k; j++) w[j] = w[j] / sum;
}

extern "C" __global__ void __launch_bounds__(256) moe_route(float* __restrict__ logits, int ldl, int E, int k, int renorm,
                                                            int* __restrict__ ids, float* __restrict__ w) {
  pdl_trigger();
  pdl_wait();
  const int r = blockIdx.x;
  moe_route_row(logits + (size_t)r * ldl, E, k, renorm, ids + (size_t)r * k, w + (size_t)r * k);
}

// moe_router_f32: a decode step's routing in one launch. Each block takes
// row blockIdx.y of x: its RMSNorm (the rmsnorm kernel's arithmetic:
// Σx² in float64 over the block, then rms_inv and rms_apply per element)
// into shared memory, MR_ROWS router rows of float32 weights W[E][H], a
// warp a row, against the normalised row (the weights and the norm weight
// are loaded before pdl_wait: they do not depend on the previous launch;
// x is loaded in one round, up to MR_X4 16-byte loads a thread in flight),
// and block 0 writes the normalised row to xb (the experts' input). With
// sgw (the shared expert's gate, H floats, 16-byte aligned) the warp of
// row E computes that gate's logit into sg[r] (a plain dot, no routing).
// The last block of a row to finish (a counter per row, cnt[r], back to 0
// after) routes it as moe_route. Params (x, ldx, nw, eps, one_plus, W, H,
// E, k, renorm, logits, ldl, ids, w, xb, ldxb, cnt, sgw, sg). Launch:
// grid (⌈(E + (sgw ? 1 : 0)) / MR_ROWS⌉, R), block 32·MR_ROWS; H % 4 ==
// 0, H ≤ MR_MAXH, W 16-byte aligned, E ≤ MOE_MAXE, cnt zeros.
#define MR_ROWS 4
#define MR_PF 16
#define MR_MAXH 8192
#define MR_X4 (MR_MAXH / 4 / (32 * MR_ROWS))
extern "C" __global__ void __launch_bounds__(32 * MR_ROWS)
    moe_router_f32(const float* __restrict__ x, int ldx, const float* __restrict__ nw, float eps, int one_plus,
                   const float* __restrict__ W, int H, int E, int k, int renorm, float* __restrict__ logits, int ldl,
                   int* __restrict__ ids, float* __restrict__ w, float* __restrict__ xb, int ldxb, int* __restrict__ cnt,
                   const float* __restrict__ sgw, float* __restrict__ sg) {
  __shared__ double red[32];
  __shared__ int last;
  __shared__ __align__(16) float xn[MR_MAXH];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, r = blockIdx.y, nt = 32 * MR_ROWS;
  const int e = blockIdx.x * MR_ROWS + warp, n4 = H / 4;
  const bool gate = sgw != nullptr && e == E;
  const float4* wr = reinterpret_cast<const float4*>(gate ? sgw : W + (size_t)min(e, E - 1) * H);
  float4 pf[MR_PF];
#pragma unroll
  for (int j = 0; j < MR_PF; j++) {
    const int i4 = lane + 32 * j;
    pf[j] = i4 < n4 ? __ldg(wr + i4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const float* xr = x + (size_t)r * ldx;
  const bool vec = aligned16(nw) && aligned16(xr);
  float4* xn4 = reinterpret_cast<float4*>(xn);
  // The norm weight into xn (each thread its own float4s i4 = tid + nt·j,
  // which it alone reads back below: no barrier needed).
  if (vec) {
    float4 t[MR_X4];
#pragma unroll
    for (int j = 0; j < MR_X4; j++)
      if (tid + nt * j < n4) t[j] = __ldg(reinterpret_cast<const float4*>(nw) + tid + nt * j);
#pragma unroll
    for (int j = 0; j < MR_X4; j++)
      if (tid + nt * j < n4) xn4[tid + nt * j] = t[j];
  }
  pdl_trigger();
  pdl_wait();
  double ss = 0.0;
  float inv;
  if (vec) {
    float4 xv[MR_X4];
#pragma unroll
    for (int j = 0; j < MR_X4; j++)
      xv[j] = tid + nt * j < n4 ? reinterpret_cast<const float4*>(xr)[tid + nt * j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < MR_X4; j++) {
      ss += (double)xv[j].x * (double)xv[j].x;
      ss += (double)xv[j].y * (double)xv[j].y;
      ss += (double)xv[j].z * (double)xv[j].z;
      ss += (double)xv[j].w * (double)xv[j].w;
    }
    ss = block_sum_d(ss, red);
    inv = rms_inv(ss, H, eps);
#pragma unroll
    for (int j = 0; j < MR_X4; j++) {
      const int i4 = tid + nt * j;
      if (i4 >= n4) continue;
      const float4 wv = xn4[i4];
      xn4[i4] = make_float4(rms_apply(xv[j].x, inv, wv.x, one_plus), rms_apply(xv[j].y, inv, wv.y, one_plus),
                            rms_apply(xv[j].z, inv, wv.z, one_plus), rms_apply(xv[j].w, inv, wv.w, one_plus));
    }
  } else {
    for (int i = tid; i < H; i += nt) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_d(ss, red);
    inv = rms_inv(ss, H, eps);
    for (int i = tid; i < H; i += nt) xn[i] = rms_apply(xr[i], inv, nw[i], one_plus);
  }
  __syncthreads();
  if (blockIdx.x == 0)
    for (int i = tid; i < H; i += nt) xb[(size_t)r * ldxb + i] = xn[i];
  float acc = 0.0f;
  auto dot4 = [&](float4 wv, int i4) {
    const float4 v = xn4[i4];
    acc += wv.x * v.x;
    acc += wv.y * v.y;
    acc += wv.z * v.z;
    acc += wv.w * v.w;
  };
#pragma unroll
  for (int j = 0; j < MR_PF; j++)
    if (lane + 32 * j < n4) dot4(pf[j], lane + 32 * j);
  for (int i4 = lane + 32 * MR_PF; i4 < n4; i4 += 32) dot4(__ldg(wr + i4), i4);
  acc = warp_sum(acc);
  if (lane == 0 && e < E) logits[(size_t)r * ldl + e] = acc;
  if (lane == 0 && gate) sg[r] = acc;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(cnt + r, 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  moe_route_row(logits + (size_t)r * ldl, E, k, renorm, ids + (size_t)r * k, w + (size_t)r * k);
  if (tid == 0) cnt[r] = 0;
}

// Grouped experts (steps of more than 8 rows: prefill chunks, large
// batches). moe_sort orders the R·k (row, slot) pairs by expert, each
// expert's pairs in slot order and padded to whole tiles of MOE_BM rows;
// moe_gather_q copies each sorted pair's int8 activation row (gemmq_actq's
// layout) into that order; gemmq_moe_<fmt> multiplies each tile of MOE_BM
// sorted rows by its expert's weights on the int8 tensor cores (gemmq.cu's
// body, 32 tokens × 64 weight rows a block): every selected expert's bytes
// are read once per step per 64-row slice, not once per row.
#define MOE_BM 32
#define MOE_MAXSLOT 8192

// moe_sort: perm[i] = the slot (r·k + j) at sorted row i (−1: padding),
// inv[slot] = its sorted row, tile_e[t] = the expert of tile t (−1: unused,
// for t < ntile). Block e sorts expert e: it counts every expert's slots
// (shared-memory atomics; each block the same counts), so its first tile is
// the sum of the tiles of the experts before it, then writes its expert's
// slots in slot order (a block-wide compaction: ballots, then the warps'
// counts in warp order). Block 0 also marks the unused tiles. Params (ids,
// nslot, E, perm, inv, tile_e, ntile). Launch: grid E, block 512; nslot ≤
// MOE_MAXSLOT, E ≤ MOE_MAXE, ntile ≥ ⌈nslot/MOE_BM⌉ + min(E, nslot).
#define MOE_SORT_THREADS 512
extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS) moe_sort(const int* __restrict__ ids, int nslot, int E,
                                                                        int* __restrict__ perm, int* __restrict__ inv,
                                                                        int* __restrict__ tile_e, int ntile) {
  __shared__ int sid[MOE_MAXSLOT];
  __shared__ int cnt[MOE_MAXE];
  __shared__ int wc[MOE_SORT_THREADS / 32];
  __shared__ int red[32];
  pdl_trigger();
  pdl_wait();
  const int e = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = blockDim.x, nw = nt >> 5;
  for (int i = tid; i < E; i += nt) cnt[i] = 0;
  __syncthreads();
  for (int s = tid; s < nslot; s += nt) {
    const int id = ids[s];
    sid[s] = id;
    if (id >= 0 && id < E) atomicAdd(&cnt[id], 1);
  }
  __syncthreads();
  int before = 0, all = 0;
  for (int i = tid; i < E; i += nt) {
    const int t = (cnt[i] + MOE_BM - 1) / MOE_BM;
    all += t;
    if (i < e) before += t;
  }
  const int t0 = block_sum_i(before, red);
  const int total = block_sum_i(all, red);
  const int t1 = t0 + (cnt[e] + MOE_BM - 1) / MOE_BM;
  for (int t = t0 + tid; t < t1; t += nt) tile_e[t] = e;
  if (e == 0)
    for (int t = total + tid; t < ntile; t += nt) tile_e[t] = -1;
  int i = t0 * MOE_BM;
  for (int s0 = 0; s0 < nslot; s0 += nt) {
    const int s = s0 + tid;
    const bool hit = s < nslot && sid[s] == e;
    const unsigned m = __ballot_sync(FULL_MASK, hit);
    if (lane == 0) wc[warp] = __popc(m);
    __syncthreads();
    int off = 0, sum = 0;
    for (int w = 0; w < nw; w++) {
      const int c = wc[w];
      off += w < warp ? c : 0;
      sum += c;
    }
    if (hit) {
      const int at = i + off + __popc(m & ((1u << lane) - 1u));
      perm[at] = s;
      inv[s] = at;
    }
    i += sum;
    __syncthreads();  // wc is rewritten next round
  }
  for (int at = i + tid; at < t1 * MOE_BM; at += nt) perm[at] = -1;
}

// moe_gather_q: sorted row i of a used tile gets the int8 quants and scales
// of activation row perm[i] / k (zeros for padding). Params (XQ, D, cols,
// k, perm, tile_e, XQs, Ds). Launch: grid ntile·MOE_BM, block 128; cols %
// 32 == 0 (rows of 16-byte units).
extern "C" __global__ void __launch_bounds__(128) moe_gather_q(const int8_t* __restrict__ XQ, const float* __restrict__ D, int cols,
                                                              int k, const int* __restrict__ perm,
                                                              const int* __restrict__ tile_e, int8_t* __restrict__ XQs,
                                                              float* __restrict__ Ds) {
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x;
  if (tile_e[i / MOE_BM] < 0) return;
  const int s = perm[i], nb = cols / 32, nu = cols / 16;
  uint4* dq = reinterpret_cast<uint4*>(XQs + (size_t)i * cols);
  float* dd = Ds + (size_t)i * nb;
  if (s < 0) {
    for (int u = threadIdx.x; u < nu; u += blockDim.x) dq[u] = make_uint4(0, 0, 0, 0);
    for (int b = threadIdx.x; b < nb; b += blockDim.x) dd[b] = 0.0f;
    return;
  }
  const uint4* sq = reinterpret_cast<const uint4*>(XQ + (size_t)(s / k) * cols);
  const float* sd = D + (size_t)(s / k) * nb;
  for (int u = threadIdx.x; u < nu; u += blockDim.x) dq[u] = sq[u];
  for (int b = threadIdx.x; b < nb; b += blockDim.x) dd[b] = sd[b];
}

// gemmq_moe_<fmt>: Y[i][o] = Σ_k W_e[o,k]·xq[i,k]·d[i,k/32] for the sorted
// rows i of tile blockIdx.y, e = tile_e[blockIdx.y] (the block exits for
// −1), W_e = table[e], as gemmq_<fmt> (no bias, no accumulate). Params
// (table, tile_e, rows, cols, XQ, D, Y, ldy, T) with T = ntile·MOE_BM.
// Launch: grid (⌈rows/64⌉, ntile), block 256; cols % 32 == 0, every W_e
// 16-byte aligned.
#define GEMMQ_MOE(name, F)                                                                                            \
  extern "C" __global__ void __launch_bounds__(GQ_THREADS, 2)                                                        \
      gemmq_moe_##name(const uint8_t* const* __restrict__ table, const int* __restrict__ tile_e, int rows, int cols, \
                       const int8_t* __restrict__ XQ, const float* __restrict__ D, float* __restrict__ Y, int ldy,   \
                       int T) {                                                                                      \
    pdl_wait(); /* tile_e comes from moe_sort */                                                                     \
    const int e = tile_e[blockIdx.y];                                                                                \
    if (e < 0) return;                                                                                               \
    gemmq_body<F, MOE_BM, 64, 2, 4>(table[e], rows, cols, XQ, D, Y, ldy, T, nullptr, 0);                            \
  }
GEMMQ_MOE(q8row, GemmQQ8)
GEMMQ_MOE(q4tp, GemmQQ4TP)

// mv_moe_{q4tp,q8row}: y[s][m·rowsE + o] = W_{m,ids[s]}[o,:]·x'[xrow(s)]
// for every slot s of nslot (= R·k), matrix m of nmat (1 or 2: gate and up
// in one launch) and row o of rowsE, W_{m,e} at table[m·E + e] (each
// expert a rowsE×cols tensor as CMF stores it). xrow(s) = s / k (xmode 0:
// the gate/up products share their row's activations) or s (xmode 1: the
// down product of each slot's own SwiGLU). xmode 2 (q4tp, nmat 2,
// q4s_lanes(nb) ≤ 16: kern.MoEGLUFits) is xmode 0 with the SwiGLU in the
// epilogue: y[s][o] = silu(gate)·up, g / (1 + expf(−g))·u as
// moe_prologue's ProSilu computes it (bitwise), the gate and up rows of an
// (s, o) taken by two neighbouring segments. The prologue (pro as mq_*)
// quantizes the nx activation rows once a block. q4tp: a segment of
// q4s_lanes(nb) lanes a row (matvec.cu's q4s_row), 32 / that many rows a
// warp at once; q8_row: a warp a row, MOE_RPW rows at once (their loads in
// flight together). Params (table, E, nmat, ids, nslot,
// k, rowsE, cols, x, ldx, xoff, xmode, y, ldy, pro, nw, eps). Launch:
// block 512, grid kern.MoEMatvecLaunch, dynamic shared memory
// MatvecShared(cols, nx) (nx = nslot/k or nslot).
#define MOE_RPW 2
#define MOE_PARAMS                                                                                              \
  const uint8_t* const* __restrict__ table, int E, int nmat, const int* __restrict__ ids, int nslot, int k,      \
      int rowsE, int cols, const float* __restrict__ x, int ldx, int xoff, int xmode, float* __restrict__ y, int ldy, \
      int pro, const float* __restrict__ nw, float eps
#define MOE_ARGS table, E, nmat, ids, nslot, k, rowsE, cols, x, ldx, xoff, xmode, y, ldy, pro, nw, eps

// The prologue over a runtime number of rows (at most 64): mq_prologue's
// arithmetic.
// CG: x read through L2 only (written by other blocks of the same launch
// before a grid barrier: no stale L1 line).
template <bool CG>
__device__ __forceinline__ float moe_ldx(const float* p) { return CG ? __ldcg(p) : *p; }
template <bool CG>
__device__ __forceinline__ float4 moe_ldx4(const float* p) { return CG ? __ldcg((const float4*)p) : *(const float4*)p; }

template <bool PERM, bool CG = false>
__device__ __forceinline__ void moe_prologue(const float* __restrict__ x, int ldx, int xoff, int cols, int nb, int ps, int nx,
                                             int pro, const float* __restrict__ nw, float eps, int8_t* xq, int2* xds) {
  __shared__ double red[32];
  __shared__ float inv[64];
  const int tid = threadIdx.x;
  const bool norm = pro == MQ_NORM || pro == MQ_NORM1;
  if (norm) {
    for (int r = 0; r < nx; r++) {
      const float* xr = x + (size_t)r * ldx;
      double ss = 0.0;
      for (int i = tid; i < cols; i += blockDim.x) ss += (double)moe_ldx<CG>(xr + i) * (double)moe_ldx<CG>(xr + i);
      ss = block_sum_d(ss, red);
      if (tid == 0) inv[r] = rms_inv(ss, cols, eps);
    }
    __syncthreads();
  }
  const int nq = nx * nb * 8, nt = blockDim.x;
  const bool vec = aligned16(x) && ldx % 4 == 0 && xoff % 4 == 0 && (!norm || aligned16(nw));
  // Four quads a thread in flight (their loads first, then their
  // quantization); the u past the block's last quad are skipped
  // block-uniformly (every lane reaches every shuffle).
  for (int base = 0; base < nq; base += 4 * nt) {
    float v[4][4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (base + u * nt >= nq) break;
      const int qd = base + u * nt + tid;
      const int r = qd / (nb * 8), kq = qd - r * nb * 8, i = 4 * kq;
#pragma unroll
      for (int j = 0; j < 4; j++) v[u][j] = 0.0f;
      if (qd >= nq) continue;
      const float* xr = x + (size_t)r * ldx;
      if (vec && i + 4 <= cols) {
        const float4 t = moe_ldx4<CG>(xr + i);
        const float e[4] = {t.x, t.y, t.z, t.w};
        if (pro == MQ_SILU) {
          const float4 w4 = moe_ldx4<CG>(xr + xoff + i);
          const float up[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
          for (int j = 0; j < 4; j++) v[u][j] = e[j] / (1.0f + expf(-e[j])) * up[j];
        } else if (norm) {
          const float4 w4 = *(const float4*)(nw + i);
          const float wv[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
          for (int j = 0; j < 4; j++) v[u][j] = rms_apply(e[j], inv[r], wv[j], pro == MQ_NORM1);
        } else {
#pragma unroll
          for (int j = 0; j < 4; j++) v[u][j] = e[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
          if (i + j >= cols) continue;
          float e = moe_ldx<CG>(xr + i + j);
          if (pro == MQ_SILU) e = e / (1.0f + expf(-e)) * moe_ldx<CG>(xr + xoff + i + j);
          else if (norm) e = rms_apply(e, inv[r], nw[i + j], pro == MQ_NORM1);
          v[u][j] = e;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (base + u * nt >= nq) break;
      const int qd = base + u * nt + tid;
      const int r = qd / (nb * 8), kq = qd - r * nb * 8;
      mq_quant4<PERM>(v[u], r, kq >> 3, 4 * (kq & 7), nb, ps, xq, xds, qd < nq);
    }
  }
  __syncthreads();
}

// moe_prefetch_q8: the bytes of expert row o of W (rowsE rows of cols,
// q8_row: its quants and scale) into L2, for a lane to issue before the
// prologue so that its DRAM latency passes while the activations are
// quantized (q4tp rows: matvec.cu's q4_prefetch_part).
__device__ __forceinline__ void moe_prefetch_q8(const uint8_t* W, int o, int rowsE, int cols) {
  const uint8_t* q = W + (size_t)o * cols;
  for (int off = 0; off < cols; off += 128) prefetch_l2(q + off);
  prefetch_l2(q + cols - 1);
  prefetch_l2(W + (size_t)rowsE * cols + 2 * (size_t)o);
}

// moe_dots_q8: out[u] = W_u[orow[u]]·x'[xr[u]] for U q8_row expert rows
// at once (their loads in flight together), the activations quantized in
// shared memory by moe_prologue: each lane sums its 16-byte chunks in
// order, then the warp's fixed shuffle tree, times the row scale. Every
// lane gets the sums. Warp-uniform. (q4tp rows: matvec.cu's q4s_row.)
template <int U>
__device__ __forceinline__ void moe_dots_q8(const uint8_t* const (&Wr)[U], const int (&orow)[U], const int (&xr)[U], int rowsE,
                                            int cols, int nb, int ps, const int8_t* xq, const int2* xds, float (&out)[U]) {
  const int lane = threadIdx.x & 31;
  const bool vec8 = cols % 16 == 0;
  float acc[U];
#pragma unroll
  for (int u = 0; u < U; u++) acc[u] = 0.0f;
  const int nch = (cols + 15) / 16;
  for (int c = lane; c < nch; c += 32) {
    const int b = c >> 1, h = c & 1;
    uint4 w[U];
    bool al[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      al[u] = vec8 && aligned16(Wr[u]);
      w[u] = al[u] ? __ldcs((const uint4*)(Wr[u] + (size_t)orow[u] * cols + 16 * (size_t)c)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const uint8_t* row = Wr[u] + (size_t)orow[u] * cols;
      int si = 0;
      if (al[u]) {
        const int4 q = *(const int4*)(xq + (size_t)(2 * xr[u] + h) * ps + (size_t)b * 16);
        si = __dp4a((int)w[u].x, q.x, si); si = __dp4a((int)w[u].y, q.y, si);
        si = __dp4a((int)w[u].z, q.z, si); si = __dp4a((int)w[u].w, q.w, si);
      } else {
        for (int i = 16 * c; i < min(cols, 16 * c + 16); i++)
          si += (int)(int8_t)row[i] * (int)xq[(size_t)(2 * xr[u] + h) * ps + (size_t)b * 16 + (i & 15)];
      }
      acc[u] += __int_as_float(xds[xr[u] * nb + b].x) * (float)si;
    }
  }
#pragma unroll
  for (int u = 0; u < U; u++)
    out[u] = warp_sum(acc[u]) * f16_to_f32(ld_u16(Wr[u] + (size_t)rowsE * cols + 2 * (size_t)orow[u]));
}

// moe_table_load: the n expert base pointers of table into shared memory
// (tab, MOE_TAB entries) before pdl_wait (the tables are written once,
// before the first step that reads them), so that the lookup after the
// routing arrives is a shared-memory read, not a dependent L2 round trip.
// Returns the table to read (tab, or table itself when n > MOE_TAB); the
// caller syncs the block before reading tab.
#define MOE_TAB (2 * MOE_MAXE)
__device__ __forceinline__ const uint8_t* const* moe_table_load(const uint8_t* const* __restrict__ table, int n,
                                                               const uint8_t** tab) {
  if (n > MOE_TAB) return table;
  for (int i = threadIdx.x; i < n; i += blockDim.x) tab[i] = table[i];
  return tab;
}

// mv_moe's phases: the L2 prefetch of a warp's rows, then the prologue
// and the products. q4tp takes a row by a segment of L = q4s_lanes(nb)
// lanes (matvec.cu's q4s_row), RW = 32 / L rows a warp a pass: row i of a
// warp's list is v(i) = (gw + (i / RW)·GW)·RW + i % RW (gw the warp's
// index in the grid, GW the grid's warps); the first MOE_PF_ROWS of them
// are prefetched, four lanes a row. q8_row keeps a warp a row, MOE_RPW
// rows at once (lane t prefetches row t % MOE_RPW of its pass t /
// MOE_RPW).
#define MOE_PF_ROWS 16
__device__ __forceinline__ void moe_gu_prefetch_q4(const uint8_t* const* __restrict__ table, int E, int nmat,
                                                   const int* __restrict__ ids, int nslot, int rowsE, int nb, bool glu) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int RW = 32 / q4s_lanes(nb), gw = blockIdx.x * nwarps + warp, GW = gridDim.x * nwarps;
  const int per = nmat * rowsE, N = nslot * per;
  for (int i = lane / 4; i < MOE_PF_ROWS; i += 8) {
    int s, m, o;
    if (glu) {  // xmode 2: output (gw + pass·GW)·RW/2 + seg/2, matrix seg % 2
      const int sg = i % RW, pr = (gw + (i / RW) * GW) * (RW / 2) + sg / 2;
      if (pr >= nslot * rowsE) break;
      s = pr / rowsE, o = pr - s * rowsE, m = sg & 1;
    } else {
      const int v = (gw + (i / RW) * GW) * RW + i % RW;
      if (v >= N) break;
      s = v / per;
      const int rem = v - s * per;
      m = rem / rowsE, o = rem - m * rowsE;
    }
    const int e = ids[s];
    if (e >= 0) q4_prefetch_part(table[(size_t)m * E + e], rowsE, nb, o, lane & 3, 4);
  }
}

template <bool Q4>
__device__ __forceinline__ void moe_gu_prefetch(const uint8_t* const* __restrict__ table, int E, int nmat,
                                                const int* __restrict__ ids, int nslot, int rowsE, int cols, int xmode) {
  if (Q4) {
    moe_gu_prefetch_q4(table, E, nmat, ids, nslot, rowsE, cols / 32, xmode == 2 && q4s_lanes(cols / 32) <= 16);
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int per = nmat * rowsE, N = nslot * per;
  const int v = (blockIdx.x * nwarps + warp) * MOE_RPW + (lane / MOE_RPW) * gridDim.x * nwarps * MOE_RPW + lane % MOE_RPW;
  if (v < N) {
    const int s = v / per, rem = v - s * per, m = rem / rowsE, o = rem - m * rowsE, e = ids[s];
    if (e >= 0) moe_prefetch_q8(table[(size_t)m * E + e], o, rowsE, cols);
  }
}

// mv_moe's q4tp products: RW rows a warp a pass, one a segment (xmode 2:
// RW / 2 outputs a pass, the gate row in the even segment, the up row in
// the odd one).
template <int L>
__device__ __forceinline__ void moe_gu_rows_q4(MOE_PARAMS, int nb, int ps, const int8_t* xq, const int2* xds) {
  constexpr int RW = 32 / L;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, seg = lane / L;
  if (RW >= 2 && xmode == 2) {
    const int N2 = nslot * rowsE;
    for (int p0 = (blockIdx.x * nwarps + warp) * (RW / 2); p0 < N2; p0 += gridDim.x * nwarps * (RW / 2)) {  // warp-uniform
      const int p = p0 + (seg >> 1), pc = min(p, N2 - 1), m = seg & 1;
      const int s = pc / rowsE, o = pc - s * rowsE, e = ids[s];
      const bool ok = p < N2 && e >= 0;
      const float a = q4s_row<L>(table[(size_t)m * E + (e < 0 ? 0 : e)], rowsE, nb, o, ok, s / k, ps, xq, xds);
      const float u = __shfl_xor_sync(FULL_MASK, a, L);  // the odd segment's sum: up
      if ((lane & (2 * L - 1)) == 0 && p < N2) y[(size_t)s * ldy + o] = ok ? a / (1.0f + expf(-a)) * u : 0.0f;
    }
    return;
  }
  const int per = nmat * rowsE, N = nslot * per;
  for (int v0 = (blockIdx.x * nwarps + warp) * RW; v0 < N; v0 += gridDim.x * nwarps * RW) {  // warp-uniform
    const int v = v0 + seg, vc = min(v, N - 1);
    const int s = vc / per, rem = vc - s * per, m = rem / rowsE, o = rem - m * rowsE, e = ids[s];
    const bool ok = v < N && e >= 0;  // no expert (cannot happen for E >= 1): zeros, not a wild read
    const float a = q4s_row<L>(table[(size_t)m * E + (e < 0 ? 0 : e)], rowsE, nb, o, ok, xmode == 1 ? s : s / k, ps, xq, xds);
    if ((lane & (L - 1)) == 0 && v < N) y[(size_t)s * ldy + (size_t)m * rowsE + o] = ok ? a : 0.0f;
  }
}

// mv_moe's q8_row products: a warp a row, MOE_RPW rows at once.
__device__ __forceinline__ void moe_gu_rows_q8(MOE_PARAMS, int nb, int ps, const int8_t* xq, const int2* xds) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int per = nmat * rowsE, N = nslot * per;
  for (int v0 = (blockIdx.x * nwarps + warp) * MOE_RPW; v0 < N; v0 += gridDim.x * nwarps * MOE_RPW) {  // warp-uniform
    const uint8_t* Wr[MOE_RPW];
    int xr[MOE_RPW], orow[MOE_RPW];
    size_t yo[MOE_RPW];
    bool ok[MOE_RPW];
#pragma unroll
    for (int u = 0; u < MOE_RPW; u++) {
      const int v = min(v0 + u, N - 1);
      const int s = v / per, rem = v - s * per, m = rem / rowsE, o = rem - m * rowsE, e = ids[s];
      ok[u] = v0 + u < N && e >= 0;  // no expert (cannot happen for E >= 1): zeros, not a wild read
      Wr[u] = table[(size_t)m * E + (e < 0 ? 0 : e)];
      xr[u] = xmode == 1 ? s : s / k;
      orow[u] = o;
      yo[u] = (size_t)s * ldy + (size_t)m * rowsE + o;
    }
    float a[MOE_RPW];
    moe_dots_q8<MOE_RPW>(Wr, orow, xr, rowsE, cols, nb, ps, xq, xds, a);
#pragma unroll
    for (int u = 0; u < MOE_RPW; u++)
      if (lane == 0 && v0 + u < N) y[yo[u]] = ok[u] ? a[u] : 0.0f;
  }
}

template <bool Q4, bool CG = false>
__device__ __forceinline__ void moe_gu_body(MOE_PARAMS, uint8_t* smem) {
  const int nb = (cols + 31) / 32, ps = mq_plane(nb), nx = xmode == 1 ? nslot : nslot / k;
  int8_t* xq = (int8_t*)smem;
  int2* xds = (int2*)(smem + (size_t)nx * 2 * ps);
  moe_prologue<Q4, CG>(x, ldx, xoff, cols, nb, ps, nx, pro, nw, eps, xq, xds);
  if constexpr (Q4) {
    switch (q4s_lanes(nb)) {
      case 4: moe_gu_rows_q4<4>(MOE_ARGS, nb, ps, xq, xds); break;
      case 8: moe_gu_rows_q4<8>(MOE_ARGS, nb, ps, xq, xds); break;
      case 16: moe_gu_rows_q4<16>(MOE_ARGS, nb, ps, xq, xds); break;
      default: moe_gu_rows_q4<32>(MOE_ARGS, nb, ps, xq, xds); break;
    }
  } else {
    moe_gu_rows_q8(MOE_ARGS, nb, ps, xq, xds);
  }
}

// moe_ids_load: right after pdl_wait, the step's nslot (≤ MOE_SLOTS)
// expert ids into shared memory (sids) in one round of loads, while the
// activation rows (nx rows of span floats, ldx apart) are asked for in L1:
// the weight prefetches and the prologue that follow then wait on no
// global load of their own (the ids were one dependent L2 round trip
// each, the rows another). The caller syncs the block before reading sids.
#define MOE_SLOTS 64
__device__ __forceinline__ void moe_ids_load(const int* __restrict__ ids, int nslot, const float* __restrict__ x, int ldx,
                                             int nx, int span, int* sids) {
  const int tid = threadIdx.x, lpr = (span + 31) / 32;  // 128-byte lines a row
  for (int i = tid; i < nx * lpr; i += blockDim.x) prefetch_l1(x + (size_t)(i / lpr) * ldx + 32 * (i % lpr));
  if (tid < nslot) sids[tid] = ids[tid];
}

template <bool Q4>
__device__ __forceinline__ void mv_moe(MOE_PARAMS) {
  extern __shared__ __align__(16) uint8_t mq_smem[];
  __shared__ const uint8_t* tab[MOE_TAB];
  __shared__ int sids[MOE_SLOTS];
  pdl_trigger();
  const uint8_t* const* tb = moe_table_load(table, E * nmat, tab);
  pdl_wait();  // ids come from moe_route
  moe_ids_load(ids, nslot, x, ldx, xmode == 1 ? nslot : nslot / k, pro == MQ_SILU ? xoff + cols : cols, sids);
  __syncthreads();  // tab, sids
  moe_gu_prefetch<Q4>(tb, E, nmat, sids, nslot, rowsE, cols, xmode);
  moe_gu_body<Q4>(tb, E, nmat, sids, nslot, k, rowsE, cols, x, ldx, xoff, xmode, y, ldy, pro, nw, eps, mq_smem);
}

// mv_moe_dc_{q4tp,q8row}: the down products and the combine in one launch
// (decode steps): y[r][o] += Σ_j w[r·k+j]·D_{ids[r·k+j]}[o]·x'[r·k+j] (+
// σ(g[r])·ys[r·ldy+o] with a shared expert), the slots in order, each
// product as mv_moe_*'s (q4s_row or moe_dots_q8: the same sums), so the
// result equals mv_moe_* then moe_combine. A warp takes one (r, o) and
// its slots, 32 / q4s_lanes(nb) at once (q4tp) or MOE_DC (q8_row). x' is pro's prologue (kern.ProSilu: silu(x)·x[xoff:]) over the
// nslot slot rows. Params (table, E, ids, nslot, k, rowsE, cols, x, ldx,
// xoff, pro, y, ldy, w, ys, g). Launch: block 512, grid
// kern.MoEDownCombineGrid, dynamic shared memory MatvecShared(cols, nslot).
#define MOE_DC 8
#define MOE_DC_PARAMS                                                                                                 \
  const uint8_t* const* __restrict__ table, int E, const int* __restrict__ ids, int nslot, int k, int rowsE, int cols, \
      const float* __restrict__ x, int ldx, int xoff, int pro, float* __restrict__ y, int ldy,                       \
      const float* __restrict__ w, const float* __restrict__ ys, const float* __restrict__ g
#define MOE_DC_ARGS table, E, ids, nslot, k, rowsE, cols, x, ldx, xoff, pro, y, ldy, w, ys, g

// mv_moe_dc's phases: the L2 prefetch, then the prologue and the sums.
// q4tp: a warp's output v = gw + p·GW of pass p takes its k slots' rows,
// RW = 32 / q4s_lanes(nb) slots at once (one a segment); the first
// MOE_PF_ROWS (pass, slot) rows are prefetched, four lanes a row. q8_row:
// lane t prefetches slot t % k of the warp's output t / k (its first 32 /
// k outputs).
template <bool Q4>
__device__ __forceinline__ void moe_dc_prefetch(const uint8_t* const* __restrict__ table, const int* __restrict__ ids, int nslot,
                                                int k, int rowsE, int cols) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, N = nslot / k * rowsE;
  const int gw = blockIdx.x * nwarps + warp, GW = gridDim.x * nwarps;
  if (Q4) {
    for (int i = lane / 4; i < MOE_PF_ROWS; i += 8) {
      const int p = i / k, j = i - p * k, v = gw + p * GW;
      if (v >= N) break;
      const int r = v / rowsE, o = v - r * rowsE, e = ids[r * k + j];
      if (e >= 0) q4_prefetch_part(table[e], rowsE, cols / 32, o, lane & 3, 4);
    }
    return;
  }
  const int v = gw + (lane / k) * GW, j = lane % k;
  if (v < N && lane / k < 32 / k) {
    const int r = v / rowsE, o = v - r * rowsE, e = ids[r * k + j];
    if (e >= 0) moe_prefetch_q8(table[e], o, rowsE, cols);
  }
}

// mv_moe_dc's q4tp sums: a warp an output, RW slots at once; the slots'
// products added in slot order by every lane (lane 0 stores).
template <int L>
__device__ __forceinline__ void moe_dc_rows_q4(MOE_DC_PARAMS, int nb, int ps, const int8_t* xq, const int2* xds) {
  constexpr int RW = 32 / L;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, seg = lane / L;
  const int R = nslot / k, N = R * rowsE;
  for (int v = blockIdx.x * nwarps + warp; v < N; v += gridDim.x * nwarps) {  // warp-uniform
    const int r = v / rowsE, o = v - r * rowsE;
    float acc = y[(size_t)r * ldy + o];
    for (int j0 = 0; j0 < k; j0 += RW) {
      const int j = j0 + seg, s = r * k + min(j, k - 1), e = ids[s];
      const float a = q4s_row<L>(table[e < 0 ? 0 : e], rowsE, nb, o, j < k && e >= 0, s, ps, xq, xds);
#pragma unroll
      for (int u = 0; u < RW; u++) {
        const float au = __shfl_sync(FULL_MASK, a, u * L);
        const int su = r * k + j0 + u;
        if (j0 + u < k) acc += w[su] * (ids[su] < 0 ? 0.0f : au);
      }
    }
    if (ys) acc += 1.0f / (1.0f + expf(-g[r])) * ys[(size_t)r * ldy + o];
    if (lane == 0) y[(size_t)r * ldy + o] = acc;
  }
}

// mv_moe_dc's q8_row sums: a warp an output, MOE_DC slots at once.
__device__ __forceinline__ void moe_dc_rows_q8(MOE_DC_PARAMS, int nb, int ps, const int8_t* xq, const int2* xds) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, N = nslot / k * rowsE;
  for (int v = blockIdx.x * nwarps + warp; v < N; v += gridDim.x * nwarps) {  // warp-uniform
    const int r = v / rowsE, o = v - r * rowsE;
    float acc = y[(size_t)r * ldy + o];
    for (int j0 = 0; j0 < k; j0 += MOE_DC) {
      const uint8_t* Wr[MOE_DC];
      int xr[MOE_DC], orow[MOE_DC];
#pragma unroll
      for (int u = 0; u < MOE_DC; u++) {
        const int s = r * k + min(j0 + u, k - 1), e = ids[s];
        Wr[u] = table[e < 0 ? 0 : e];
        xr[u] = s;
        orow[u] = o;
      }
      float a[MOE_DC];
      moe_dots_q8<MOE_DC>(Wr, orow, xr, rowsE, cols, nb, ps, xq, xds, a);
#pragma unroll
      for (int u = 0; u < MOE_DC; u++) {
        const int s = r * k + j0 + u;
        if (j0 + u < k) acc += w[s] * (ids[s] < 0 ? 0.0f : a[u]);
      }
    }
    if (ys) acc += 1.0f / (1.0f + expf(-g[r])) * ys[(size_t)r * ldy + o];
    if (lane == 0) y[(size_t)r * ldy + o] = acc;
  }
}

template <bool Q4, bool CG = false>
__device__ __forceinline__ void moe_dc_body(MOE_DC_PARAMS, uint8_t* smem) {
  const int nb = (cols + 31) / 32, ps = mq_plane(nb);
  int8_t* xq = (int8_t*)smem;
  int2* xds = (int2*)(smem + (size_t)nslot * 2 * ps);
  moe_prologue<Q4, CG>(x, ldx, xoff, cols, nb, ps, nslot, pro, nullptr, 0.0f, xq, xds);
  if constexpr (Q4) {
    switch (q4s_lanes(nb)) {
      case 4: moe_dc_rows_q4<4>(MOE_DC_ARGS, nb, ps, xq, xds); break;
      case 8: moe_dc_rows_q4<8>(MOE_DC_ARGS, nb, ps, xq, xds); break;
      case 16: moe_dc_rows_q4<16>(MOE_DC_ARGS, nb, ps, xq, xds); break;
      default: moe_dc_rows_q4<32>(MOE_DC_ARGS, nb, ps, xq, xds); break;
    }
  } else {
    moe_dc_rows_q8(MOE_DC_ARGS, nb, ps, xq, xds);
  }
}

template <bool Q4>
__device__ __forceinline__ void mv_moe_dc(MOE_DC_PARAMS) {
  extern __shared__ __align__(16) uint8_t mq_smem[];
  __shared__ const uint8_t* tab[MOE_TAB];
  __shared__ int sids[MOE_SLOTS];
  pdl_trigger();
  const uint8_t* const* tb = moe_table_load(table, E, tab);
  pdl_wait();  // the gate|up products and the routing come from earlier launches
  moe_ids_load(ids, nslot, x, ldx, nslot, xoff + cols, sids);
  __syncthreads();  // tab, sids
  moe_dc_prefetch<Q4>(tb, sids, nslot, k, rowsE, cols);
  moe_dc_body<Q4>(tb, E, sids, nslot, k, rowsE, cols, x, ldx, xoff, pro, y, ldy, w, ys, g, mq_smem);
}

extern "C" __global__ void __launch_bounds__(512, 1) mv_moe_dc_q4tp(MOE_DC_PARAMS) { mv_moe_dc<true>(MOE_DC_ARGS); }
extern "C" __global__ void __launch_bounds__(512, 1) mv_moe_dc_q8row(MOE_DC_PARAMS) { mv_moe_dc<false>(MOE_DC_ARGS); }

// grid_barrier: every block of the launch waits here until all have
// arrived; the blocks must all be resident at once (grid ≤
// multiprocessors, one block each). bar[0] counts the arrivals (back to
// 0 by the last), bar[1] is the generation the last one advances (both
// zero before the first launch; any count of launches after).
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* gen = bar + 1;
    const unsigned g0 = *gen;
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (*gen == g0) __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// mv_moe_ff_{q4tp,q8row}: a decode step's expert FFN in one launch:
// mv_moe_*'s gate|up products of every slot (into gu, ldgu apart: gate at
// 0, up at I; over x with no prologue), a grid barrier, then mv_moe_dc_*'s
// down products and combine over gu (read through L2) into y. Both
// phases' weight rows are prefetched into L2 first, so the down rows'
// latency passes under the gate|up phase. Bitwise mv_moe_* then
// mv_moe_dc_*. Params (tgu, td, E, ids, nslot, k, I, H, x, ldx, gu, ldgu,
// y, ldy, w, ys, g, bar): tgu the gate|up table [gate E | up E], td the
// down table. Launch: grid ≤ multiprocessors (kern.MoEFFGrid: every block
// resident, one an SM), block 512, dynamic shared memory
// kern.MoEFFShared; bar two zeroed uints.
#define MOE_FF_PARAMS                                                                                                \
  const uint8_t* const* __restrict__ tgu, const uint8_t* const* __restrict__ td, int E, const int* __restrict__ ids, \
      int nslot, int k, int I, int H, const float* __restrict__ x, int ldx, float* __restrict__ gu, int ldgu,        \
      float* __restrict__ y, int ldy, const float* __restrict__ w, const float* __restrict__ ys,                    \
      const float* __restrict__ g, unsigned* __restrict__ bar
template <bool Q4>
__device__ __forceinline__ void mv_moe_ff(MOE_FF_PARAMS) {
  extern __shared__ __align__(16) uint8_t mq_smem[];
  pdl_trigger();
  pdl_wait();  // the routing and x come from moe_router_f32
  moe_gu_prefetch<Q4>(tgu, E, 2, ids, nslot, I, H, 0);
  moe_dc_prefetch<Q4>(td, ids, nslot, k, H, I);
  moe_gu_body<Q4>(tgu, E, 2, ids, nslot, k, I, H, x, ldx, 0, 0, gu, ldgu, MQ_PLAIN, nullptr, 0.0f, mq_smem);
  grid_barrier(bar);
  moe_dc_body<Q4, true>(td, E, ids, nslot, k, H, I, gu, ldgu, I, MQ_SILU, y, ldy, w, ys, g, mq_smem);
}
#define MOE_FF_ARGS tgu, td, E, ids, nslot, k, I, H, x, ldx, gu, ldgu, y, ldy, w, ys, g, bar
extern "C" __global__ void __launch_bounds__(512, 1) mv_moe_ff_q4tp(MOE_FF_PARAMS) { mv_moe_ff<true>(MOE_FF_ARGS); }
extern "C" __global__ void __launch_bounds__(512, 1) mv_moe_ff_q8row(MOE_FF_PARAMS) { mv_moe_ff<false>(MOE_FF_ARGS); }

// mv_moe_{f32,f16,bf16}: the same products over float experts (the
// exact path of the f32 reference models): no quantization, a warp a row,
// lanes walking its 16-byte chunks, the SwiGLU prologue (pro = MQ_SILU)
// computed per element from x. Same params; no dynamic shared memory.
template <class F>
__device__ __forceinline__ void mv_moe_float(MOE_PARAMS) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int per = nmat * rowsE, N = nslot * per;
  const size_t rb = (size_t)cols * F::ES;
  const int nch = (int)(rb / 16);
  pdl_trigger();
  pdl_wait();  // ids come from moe_route
  const bool silu = pro == MQ_SILU;
  for (int v = blockIdx.x * nwarps + warp; v < N; v += gridDim.x * nwarps) {  // warp-uniform
    const int s = v / per, rem = v - s * per, m = rem / rowsE, o = rem - m * rowsE, e = ids[s];
    const uint8_t* row = table[(size_t)m * E + (e < 0 ? 0 : e)] + (size_t)o * rb;
    const float* xp = x + (size_t)(xmode == 1 ? s : s / k) * ldx;
    float acc = 0.0f;
    if (aligned16(row) && rb % 16 == 0) {
      for (int c = lane; c < nch; c += 32) {
        float w[F::E];
        F::decode(__ldcs((const uint4*)(row + 16 * (size_t)c)), w);
#pragma unroll
        for (int j = 0; j < F::E; j++) {
          const int i = c * F::E + j;
          float xv = xp[i];
          if (silu) xv = xv / (1.0f + expf(-xv)) * xp[xoff + i];
          acc += w[j] * xv;
        }
      }
    } else {
      for (int i = lane; i < cols; i += 32) {
        float xv = xp[i];
        if (silu) xv = xv / (1.0f + expf(-xv)) * xp[xoff + i];
        acc += F::scalar(row, i) * xv;
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)s * ldy + (size_t)m * rowsE + o] = e < 0 ? 0.0f : acc;
  }
}

extern "C" __global__ void __launch_bounds__(512) mv_moe_f32(MOE_PARAMS) { mv_moe_float<FmtF32>(MOE_ARGS); }
extern "C" __global__ void __launch_bounds__(512) mv_moe_f16(MOE_PARAMS) { mv_moe_float<FmtF16>(MOE_ARGS); }
extern "C" __global__ void __launch_bounds__(512) mv_moe_bf16(MOE_PARAMS) { mv_moe_float<FmtBF16>(MOE_ARGS); }
extern "C" __global__ void __launch_bounds__(512, 1) mv_moe_q4tp(MOE_PARAMS) { mv_moe<true>(MOE_ARGS); }
extern "C" __global__ void __launch_bounds__(512, 1) mv_moe_q8row(MOE_PARAMS) { mv_moe<false>(MOE_ARGS); }

// moe_combine: x[r][i] += Σ_j w[r·k+j]·y[m(r·k+j)·ldy + i], then, with a
// shared expert, += σ(g[r])·ys[r·ldy + i]; m = inv (the grouped path's
// sorted rows) or the identity when inv is null. Params (x, ldx, y, ldy,
// w, k, ys, g, n, inv). Launch: grid (⌈n/256⌉, R), block 256.
extern "C" __global__ void moe_combine(float* __restrict__ x, int ldx, const float* __restrict__ y, int ldy,
                                       const float* __restrict__ w, int k, const float* __restrict__ ys,
                                       const float* __restrict__ g, int n, const int* __restrict__ inv) {
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (i >= n) return;
  float v = x[(size_t)r * ldx + i];
  for (int j = 0; j < k; j++) {
    const int yr = inv ? inv[r * k + j] : r * k + j;
    v += w[r * k + j] * y[(size_t)yr * ldy + i];
  }
  if (ys) v += 1.0f / (1.0f + expf(-g[r])) * ys[(size_t)r * ldy + i];
  x[(size_t)r * ldx + i] = v;
}
