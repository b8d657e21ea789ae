// Rotary embedding (NeoX pairing, partial rotary) from an inverse-frequency
// table, positions read from device memory, and the K/V cache append.
// Angles as the CPU computes them: float(pos·inv[i]), sin and cos in double,
// both times mscale (yarn's attention factor, 1 otherwise). The scaling
// types (linear, dynamic, yarn, llama3, freq_factors) only change inv.
// KV cache layout, float32 (the _h kernels: float16):
// cache[((slot·nkv + h)·ctx + t)·hd + d].
#include "common.cuh"

// Rotates one head in place: for i < rot/2, (x[i], x[i+rot/2]) becomes
// (x[i]·c − x[i+rot/2]·s, x[i+rot/2]·c + x[i]·s); dimensions ≥ rot pass.
__device__ __forceinline__ void rope_head(float* xh, int rot, const float* __restrict__ inv, float mscale, int pos) {
  const int half = rot / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float a = xh[i], b = xh[i + half];
    rope_pair(a, b, pos, inv[i], mscale);
    xh[i] = a;
    xh[i + half] = b;
  }
}

// rope: rotates every head of x[r] (nheads heads of hd floats from the row
// start) at position pos[r]. Launch: grid (nheads, R), block 64.
extern "C" __global__ void rope(float* x, int ldx, int hd, int rot, const float* __restrict__ inv, float mscale,
                                const int* __restrict__ pos) {
  pdl_trigger();
  pdl_wait();
  rope_head(x + (size_t)blockIdx.y * ldx + (size_t)blockIdx.x * hd, rot, inv, mscale, pos[blockIdx.y]);
}

template <typename C>
__device__ __forceinline__ void kv_write(const float* k, const float* v, C* kc, C* vc, int slot, int h, int nkv, int ctx,
                                         int hd, int t) {
  const size_t base = (((size_t)slot * nkv + h) * ctx + t) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    kc[base + d] = kv_elem(k[d], kc);
    vc[base + d] = kv_elem(v[d], vc);
  }
}

// kv_append: writes head h of k[r] and v[r] into the caches at position
// pos[r] of sequence slot[r]; a position outside [0, ctx) writes nothing.
// Launch: grid (nkv, R), block 128.
extern "C" __global__ void kv_append(const float* __restrict__ k, int ldk, const float* __restrict__ v, int ldv,
                                     float* kc, float* vc, const int* __restrict__ pos, const int* __restrict__ slot,
                                     int nkv, int hd, int ctx) {
  pdl_trigger();
  pdl_wait();
  const int r = blockIdx.y, h = blockIdx.x, t = pos[r];
  if (t < 0 || t >= ctx) return;
  kv_write(k + (size_t)r * ldk + (size_t)h * hd, v + (size_t)r * ldv + (size_t)h * hd, kc, vc, slot[r], h, nkv, ctx,
           hd, t);
}

// head_norm: head_rmsnorm's arithmetic over one head xh of hd floats in
// place by a whole block: warp 0 sums Σx² as head_rmsnorm's single warp
// does (the same order, so the same inv), every thread applies it.
__device__ __forceinline__ void head_norm(float* xh, int hd, const float* __restrict__ w, float eps, int one_plus) {
  __shared__ float inv;
  if (threadIdx.x < 32) {
    double ss = 0.0;
    for (int i = threadIdx.x; i < hd; i += 32) ss += (double)xh[i] * (double)xh[i];
    ss = warp_sum_d(ss);
    if (threadIdx.x == 0) inv = rms_inv(ss, hd, eps);
  }
  __syncthreads();
  const float v = inv;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) xh[i] = rms_apply(xh[i], v, w[i], one_plus);
  __syncthreads();
}

// rope_qk_append: the decode fusion of the two above over a fused qkv
// buffer qkv[r] = q (nq·hd) | k (nkv·hd) | v (nkv·hd): block h < nq rotates
// q head h in place; block nq + j rotates k head j in place and appends k
// and v head j to the caches. With qw (kw) set, each q (k) head is first
// RMS-normalised in place as head_rmsnorm does (Qwen3's q/k norms: one
// weight vector of hd, eps and one_plus shared by both). Launch: grid
// (nq + nkv, R), block 64.
//
// Heads of up to ROPE_MAXHD dimensions (blocks of 64 threads) take one
// round of loads: the norm weight and the frequencies before pdl_wait
// (they do not depend on the previous launch), the head (and v) into
// shared memory after it; the norm, the rotation and the append then work
// there, with head_norm's, rope_head's and kv_write's arithmetic (the same
// bits), and the head is written back in place.
#define ROPE_MAXHD 256
#define ROPE_T 64
template <typename C>
__device__ __forceinline__ void rope_qk_append_fast(float* qkv, int ld, int nq, int nkv, int hd, int rot,
                                                    const float* __restrict__ inv, float mscale, const int* __restrict__ pos,
                                                    const int* __restrict__ slot, C* kc, C* vc, int ctx,
                                                    const float* __restrict__ qw, const float* __restrict__ kw, float eps,
                                                    int one_plus) {
  constexpr int NE = ROPE_MAXHD / ROPE_T;  // elements a thread
  __shared__ float xs[ROPE_MAXHD], vs[ROPE_MAXHD];
  __shared__ float ninv;
  const int tid = threadIdx.x, r = blockIdx.y, h = blockIdx.x, half = rot / 2;
  const bool isq = h < nq;
  const float* nwp = isq ? qw : kw;
  float wv[NE], fr[NE / 2];
#pragma unroll
  for (int u = 0; u < NE; u++) {
    const int i = tid + ROPE_T * u;
    wv[u] = nwp && i < hd ? nwp[i] : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < NE / 2; u++) {
    const int i = tid + ROPE_T * u;
    fr[u] = i < half ? inv[i] : 0.0f;
  }
  pdl_trigger();
  pdl_wait();
  const int t = pos[r];
  float* row = qkv + (size_t)r * ld;
  float* xh = row + (size_t)(isq ? h : nq + (h - nq)) * hd;
  const float* vh = row + (size_t)(nq + nkv + (h - nq)) * hd;
#pragma unroll
  for (int u = 0; u < NE; u++) {
    const int i = tid + ROPE_T * u;
    if (i < hd) {
      xs[i] = xh[i];
      if (!isq) vs[i] = vh[i];
    }
  }
  __syncthreads();
  if (nwp) {
    if (tid < 32) {  // head_norm's order: lanes over i, i + 32, ..., then the warp's tree
      double ss = 0.0;
      for (int i = tid; i < hd; i += 32) ss += (double)xs[i] * (double)xs[i];
      ss = warp_sum_d(ss);
      if (tid == 0) ninv = rms_inv(ss, hd, eps);
    }
    __syncthreads();
    const float v = ninv;
#pragma unroll
    for (int u = 0; u < NE; u++) {
      const int i = tid + ROPE_T * u;
      if (i < hd) xs[i] = rms_apply(xs[i], v, wv[u], one_plus);
    }
    __syncthreads();
  }
#pragma unroll
  for (int u = 0; u < NE / 2; u++) {  // rope_head's arithmetic
    const int i = tid + ROPE_T * u;
    if (i >= half) continue;
    rope_pair(xs[i], xs[i + half], t, fr[u], mscale);
  }
  __syncthreads();
  const bool app = !isq && t >= 0 && t < ctx;
  const size_t base = app ? (((size_t)slot[r] * nkv + (h - nq)) * ctx + t) * hd : 0;
#pragma unroll
  for (int u = 0; u < NE; u++) {
    const int i = tid + ROPE_T * u;
    if (i >= hd) continue;
    if (nwp || i < 2 * half) xh[i] = xs[i];  // in place: what changed (normed heads: all of it)
    if (app) {
      kc[base + i] = kv_elem(xs[i], kc);
      vc[base + i] = kv_elem(vs[i], vc);
    }
  }
}

template <typename C>
__device__ __forceinline__ void rope_qk_append_body(float* qkv, int ld, int nq, int nkv, int hd, int rot,
                                                    const float* __restrict__ inv, float mscale, const int* __restrict__ pos,
                                                    const int* __restrict__ slot, C* kc, C* vc, int ctx,
                                                    const float* __restrict__ qw, const float* __restrict__ kw, float eps,
                                                    int one_plus) {
  if (hd <= ROPE_MAXHD && blockDim.x == ROPE_T) {
    rope_qk_append_fast(qkv, ld, nq, nkv, hd, rot, inv, mscale, pos, slot, kc, vc, ctx, qw, kw, eps, one_plus);
    return;
  }
  pdl_trigger();
  pdl_wait();
  const int r = blockIdx.y, h = blockIdx.x, t = pos[r];
  float* row = qkv + (size_t)r * ld;
  if (h < nq) {
    if (qw) head_norm(row + (size_t)h * hd, hd, qw, eps, one_plus);
    rope_head(row + (size_t)h * hd, rot, inv, mscale, t);
    return;
  }
  const int j = h - nq;
  float* kh = row + (size_t)(nq + j) * hd;
  if (kw) head_norm(kh, hd, kw, eps, one_plus);
  rope_head(kh, rot, inv, mscale, t);
  __syncthreads();
  if (t < 0 || t >= ctx) return;
  kv_write(kh, row + (size_t)(nq + nkv + j) * hd, kc, vc, slot[r], j, nkv, ctx, hd, t);
}

#define ROPE_QK_PARAMS                                                                                             \
  float *qkv, int ld, int nq, int nkv, int hd, int rot, const float *__restrict__ inv, float mscale,                \
      const int *__restrict__ pos, const int *__restrict__ slot
#define ROPE_QK_NORM_PARAMS const float *__restrict__ qw, const float *__restrict__ kw, float eps, int one_plus
#define ROPE_QK_ARGS qkv, ld, nq, nkv, hd, rot, inv, mscale, pos, slot, kc, vc, ctx, qw, kw, eps, one_plus

extern "C" __global__ void rope_qk_append(ROPE_QK_PARAMS, float* kc, float* vc, int ctx, ROPE_QK_NORM_PARAMS) {
  rope_qk_append_body(ROPE_QK_ARGS);
}

// rope_qk_append_h: the same into a float16 cache (k and v rounded to
// nearest even; q and the rotated k in qkv stay float32).
extern "C" __global__ void rope_qk_append_h(ROPE_QK_PARAMS, __half* kc, __half* vc, int ctx, ROPE_QK_NORM_PARAMS) {
  rope_qk_append_body(ROPE_QK_ARGS);
}
