// Decode attention for GQA as split-K flash-decoding. The sequence length
// is read from device memory (len = pos[r] + 1, at most ctx), so one
// captured graph serves every length: split s of nsplit covers positions
// [s·c, min(len, (s+1)·c)), c = ⌈len/nsplit⌉, computed on the device.
// attn_split writes per (row, query head, split) the running max m, the sum
// l of e^(score−m) and the unnormalised o = Σ e^(score−m)·v; attn_merge
// combines the splits by log-sum-exp in a fixed order (deterministic).
// Partials: part[((r·nq + h)·nsplit + s)·(hd + 2)]: m, l, o[hd].
// KV cache layout as rope.cu: cache[((slot·nkv + h)·ctx + t)·hd + d].
#include "common.cuh"

#define ATT_WARPS 4
#define ATT_MAXG 8  // query heads per pass; larger groups take several passes
#define ATT_MAXD 8  // head_dim ≤ 256

// attn_split: one block per (split, kv head, row) serves the query heads
// of its kv head: warps take positions in turn, lanes the head dimensions.
// Launch: grid (nsplit, nkv, R), block 128, dynamic shared memory
// ATT_WARPS·ATT_MAXG·(hd + 2)·4 bytes.
extern "C" __global__ void __launch_bounds__(128)
    attn_split(const float* __restrict__ q, int ldq, const float* __restrict__ kc, const float* __restrict__ vc,
               const int* __restrict__ pos, const int* __restrict__ slot, float* __restrict__ part, int nq, int nkv,
               int hd, int ctx, int nsplit, float scale) {
  extern __shared__ float sm[];
  pdl_trigger();
  pdl_wait();
  const int s = blockIdx.x, kh = blockIdx.y, r = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = nq / nkv;
  int len = pos[r] + 1;
  len = len < 0 ? 0 : (len > ctx ? ctx : len);
  const int chunk = (len + nsplit - 1) / nsplit;
  const int t0 = s * chunk, t1 = min(len, t0 + chunk);
  const size_t cbase = ((size_t)slot[r] * nkv + kh) * ctx * hd;
  const int nd = (hd + 31) / 32;
  const int pw = hd + 2;  // floats per (warp, head) in shared memory

  for (int g0 = 0; g0 < G; g0 += ATT_MAXG) {
    const int ng = min(ATT_MAXG, G - g0);
    float qv[ATT_MAXG][ATT_MAXD], o[ATT_MAXG][ATT_MAXD], m[ATT_MAXG], l[ATT_MAXG];
#pragma unroll
    for (int g = 0; g < ATT_MAXG; g++) {
      m[g] = -INFINITY;
      l[g] = 0.0f;
#pragma unroll
      for (int j = 0; j < ATT_MAXD; j++) {
        const int d = lane + 32 * j;
        o[g][j] = 0.0f;
        qv[g][j] = (g < ng && j < nd && d < hd) ? q[(size_t)r * ldq + (size_t)(kh * G + g0 + g) * hd + d] : 0.0f;
      }
    }
    for (int t = t0 + warp; t < t1; t += ATT_WARPS) {
      const float* kt = kc + cbase + (size_t)t * hd;
      const float* vt = vc + cbase + (size_t)t * hd;
      float kv[ATT_MAXD], vv[ATT_MAXD];
#pragma unroll
      for (int j = 0; j < ATT_MAXD; j++) {
        const int d = lane + 32 * j;
        const bool in = j < nd && d < hd;
        kv[j] = in ? kt[d] : 0.0f;
        vv[j] = in ? vt[d] : 0.0f;
      }
#pragma unroll
      for (int g = 0; g < ATT_MAXG; g++) {
        if (g >= ng) break;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_MAXD; j++) dot += qv[g][j] * kv[j];
        const float sc = warp_sum(dot) * scale;
        const float mn = fmaxf(m[g], sc);
        const float corr = expf(m[g] - mn);  // 0 on the first position (m = -inf)
        const float p = expf(sc - mn);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int j = 0; j < ATT_MAXD; j++) o[g][j] = o[g][j] * corr + p * vv[j];
        m[g] = mn;
      }
    }
    // Combine the warps' states for each head, in warp order.
    for (int g = 0; g < ng; g++) {
      float* st = sm + (size_t)(warp * ATT_MAXG + g) * pw;
      if (lane == 0) { st[0] = m[g]; st[1] = l[g]; }
#pragma unroll
      for (int j = 0; j < ATT_MAXD; j++) {
        const int d = lane + 32 * j;
        if (j < nd && d < hd) st[2 + d] = o[g][j];
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ng * (hd + 2); e += blockDim.x) {
      const int g = e / (hd + 2), c = e % (hd + 2);
      float M = -INFINITY;
      for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[(size_t)(w * ATT_MAXG + g) * pw]);
      float v;
      if (c == 0) {
        v = M;
      } else {
        v = 0.0f;
        if (M != -INFINITY)
          for (int w = 0; w < ATT_WARPS; w++) {
            const float* st = sm + (size_t)(w * ATT_MAXG + g) * pw;
            if (st[0] != -INFINITY) v += st[c] * expf(st[0] - M);
          }
      }
      const int h = kh * G + g0 + g;
      part[(((size_t)r * nq + h) * nsplit + s) * (hd + 2) + c] = v;
    }
    __syncthreads();
  }
}

// attn_merge: out[r][h·hd + d] = Σ_s o_s[d]·e^(m_s−M) / Σ_s l_s·e^(m_s−M),
// splits in order. A row with no position (len 0) gets zeros.
// Launch: grid (nq, R), block 128.
extern "C" __global__ void attn_merge(const float* __restrict__ part, float* __restrict__ out, int ldo, int nq,
                                      int hd, int nsplit) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, r = blockIdx.y;
  const float* p = part + ((size_t)r * nq + h) * nsplit * (hd + 2);
  float M = -INFINITY;
  for (int s = 0; s < nsplit; s++) M = fmaxf(M, p[(size_t)s * (hd + 2)]);
  float L = 0.0f;
  if (M != -INFINITY)
    for (int s = 0; s < nsplit; s++) {
      const float ms = p[(size_t)s * (hd + 2)];
      if (ms != -INFINITY) L += p[(size_t)s * (hd + 2) + 1] * expf(ms - M);
    }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float O = 0.0f;
    if (M != -INFINITY)
      for (int s = 0; s < nsplit; s++) {
        const float ms = p[(size_t)s * (hd + 2)];
        if (ms != -INFINITY) O += p[(size_t)s * (hd + 2) + 2 + d] * expf(ms - M);
      }
    out[(size_t)r * ldo + (size_t)h * hd + d] = L > 0.0f ? O / L : 0.0f;
  }
}
