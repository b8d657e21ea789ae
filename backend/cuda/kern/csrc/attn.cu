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

// attn_tiles: the decode attention of attn_split + attn_merge in one launch,
// built for bandwidth. One block per (split, kv head, row), 4 warps; the
// positions of a split go through shared memory in tiles of AT_TP, K and V
// copied by cp.async into a two-stage ring (the next tile in flight while
// this one is used). Warp w serves query heads w and w+4 of the kv head
// (a pass covers 8 heads; larger groups take several passes). Per tile and
// head: lane t scores position t (its K row against q from shared memory),
// one warp max and sum update the head's running (m, l), then lanes take
// head dimensions (a float4 each) and accumulate Σ_t p_t·v_t. A split
// covers chunk = max(⌈len/nsplit⌉, AT_TP) positions, so short rows use
// fewer splits; splits past the length write an empty state.
// With nsplit = 1 the block writes the normalised output itself. Otherwise
// it writes its partial (attn_split's layout), and the last block of its
// (row, kv head) to finish — counted in cnt[r·nkv + kh], which it resets to
// 0 for the next launch — merges the splits in split order (attn_merge's
// arithmetic), so the result does not depend on which block came last.
// Requires hd % 4 == 0, hd ≤ 256, 16-byte aligned rows (ldq % 4 == 0).
// Launch: grid (nsplit, nkv, R), block 128, dynamic shared memory
// kern.AttnTilesShared(hd) = 4·(8·hd + 4·AT_TP·at_stride(hd)) bytes; cnt
// zeroed before the first launch.
#define AT_TP 32
__host__ __device__ __forceinline__ int at_stride(int hd) { return 4 * ((hd / 4) | 1); }  // conflict-free LDS.128 by row

__device__ __forceinline__ void at_cp16(float* dst, const float* src) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

extern "C" __global__ void __launch_bounds__(128)
    attn_tiles(const float* __restrict__ q, int ldq, const float* __restrict__ kc, const float* __restrict__ vc,
               const int* __restrict__ pos, const int* __restrict__ slot, float* __restrict__ part, int* __restrict__ cnt,
               float* __restrict__ out, int ldo, int nq, int nkv, int hd, int ctx, int nsplit, float scale) {
  extern __shared__ float4 at_sm4[];
  float* sm = (float*)at_sm4;
  __shared__ int last;
  pdl_trigger();
  pdl_wait();
  const int s = blockIdx.x, kh = blockIdx.y, r = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = nq / nkv, hd4 = hd / 4, st = at_stride(hd);
  int len = pos[r] + 1;
  len = len < 0 ? 0 : (len > ctx ? ctx : len);
  const int chunk = max((len + nsplit - 1) / nsplit, AT_TP);
  const int t0 = min(len, s * chunk), t1 = min(len, t0 + chunk);
  const int ntile = (t1 - t0 + AT_TP - 1) / AT_TP;
  const size_t cbase = ((size_t)slot[r] * nkv + kh) * ctx * hd;
  float* qs = sm;                  // [8][hd], scaled
  float* ks = qs + 8 * hd;         // [2][AT_TP][st]
  float* vs = ks + 2 * AT_TP * st;  // [2][AT_TP][st]

  for (int g0 = 0; g0 < G; g0 += 8) {
    const int ng = min(8, G - g0);
    __syncthreads();  // the previous pass is done with qs and the ring
    const float* qr = q + (size_t)r * ldq + (size_t)(kh * G + g0) * hd;
    for (int e = threadIdx.x; e < ng * hd; e += 128) qs[e] = qr[e] * scale;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float4 o[2][2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
      for (int j = 0; j < 2; j++) o[hh][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0; i <= ntile; i++) {
      if (i < ntile) {  // queue tile i into stage i&1
        const int b = i & 1, ta = t0 + i * AT_TP, n = min(AT_TP, t1 - ta);
        for (int c = threadIdx.x; c < n * hd4; c += 128) {
          const int row = c / hd4, c4 = c - row * hd4;
          const size_t off = cbase + (size_t)(ta + row) * hd + 4 * c4;
          at_cp16(ks + (b * AT_TP + row) * st + 4 * c4, kc + off);
          at_cp16(vs + (b * AT_TP + row) * st + 4 * c4, vc + off);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
      }
      if (i == 0) continue;
      // use tile i-1 (stage (i-1)&1): wait for all but the group just queued
      if (i < ntile) {
        asm volatile("cp.async.wait_group 1;" ::: "memory");
      } else {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
      }
      __syncthreads();
      const int b = (i - 1) & 1, n = min(AT_TP, t1 - (t0 + (i - 1) * AT_TP));
      const float* kt = ks + b * AT_TP * st;
      const float* vt = vs + b * AT_TP * st;
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int g = warp + 4 * hh;
        if (g >= ng) break;
        const float4* kr = (const float4*)(kt + lane * st);
        const float4* qg = (const float4*)(qs + g * hd);
        float sc = 0.0f;
#pragma unroll 4
        for (int d4 = 0; d4 < hd4; d4++) {
          const float4 k = kr[d4], x = qg[d4];
          sc += k.x * x.x + k.y * x.y + k.z * x.z + k.w * x.w;
        }
        sc = lane < n ? sc : -INFINITY;
        const float mn = fmaxf(m[hh], warp_max(sc));  // finite: n ≥ 1
        const float corr = expf(m[hh] - mn);          // 0 on the first tile (m = -inf)
        const float p = expf(sc - mn);                // 0 past the length
        l[hh] = l[hh] * corr + warp_sum(p);
        m[hh] = mn;
#pragma unroll
        for (int j = 0; j < 2; j++) {
          o[hh][j].x *= corr;
          o[hh][j].y *= corr;
          o[hh][j].z *= corr;
          o[hh][j].w *= corr;
        }
        for (int t = 0; t < n; t++) {
          const float pt = __shfl_sync(FULL_MASK, p, t);
          const float4* vr = (const float4*)(vt + t * st);
#pragma unroll
          for (int j = 0; j < 2; j++) {
            const int d4 = lane + 32 * j;
            if (d4 < hd4) {
              const float4 v = vr[d4];
              o[hh][j].x += pt * v.x;
              o[hh][j].y += pt * v.y;
              o[hh][j].z += pt * v.z;
              o[hh][j].w += pt * v.w;
            }
          }
        }
      }
      __syncthreads();  // stage (i-1)&1 is refilled at the next iteration
    }
    // This pass's heads: the output (one split) or the partial.
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int g = warp + 4 * hh;
      if (g >= ng) break;
      const int h = kh * G + g0 + g;
      if (nsplit == 1) {
        const float inv = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
        float* orow = out + (size_t)r * ldo + (size_t)h * hd;
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int d4 = lane + 32 * j;
          if (d4 < hd4) {
            const float4 v = o[hh][j];
            *(float4*)(orow + 4 * d4) = l[hh] > 0.0f ? make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv)
                                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
        }
      } else {
        float* pp = part + (((size_t)r * nq + h) * nsplit + s) * (hd + 2);
        if (lane == 0) {
          pp[0] = m[hh];
          pp[1] = l[hh];
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int d4 = lane + 32 * j;
          if (d4 < hd4) {
            pp[2 + 4 * d4] = o[hh][j].x;
            pp[3 + 4 * d4] = o[hh][j].y;
            pp[4 + 4 * d4] = o[hh][j].z;
            pp[5 + 4 * d4] = o[hh][j].w;
          }
        }
      }
    }
  }
  if (nsplit == 1) return;
  // The last split block of (r, kh) merges: partials written, then counted.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(&cnt[r * nkv + kh], 1);
    last = done == nsplit - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Warp w merges heads w, w+4, ...: split k's weight e^(m_k−M)/L held by
  // lane k mod 32 (w0 for k < 32, w1 above), then Σ_k w_k·o_k[d] in order.
  for (int g = warp; g < G; g += 4) {
    const int h = kh * G + g;
    const float* p = part + ((size_t)r * nq + h) * nsplit * (hd + 2);
    const int k1 = lane + 32;
    const float m0 = lane < nsplit ? __ldcg(p + (size_t)lane * (hd + 2)) : -INFINITY;
    const float m1 = k1 < nsplit ? __ldcg(p + (size_t)k1 * (hd + 2)) : -INFINITY;
    const float M = warp_max(fmaxf(m0, m1));
    float w0 = 0.0f, w1 = 0.0f;
    if (M != -INFINITY) {
      w0 = m0 != -INFINITY ? expf(m0 - M) : 0.0f;
      w1 = m1 != -INFINITY ? expf(m1 - M) : 0.0f;
    }
    const float L = warp_sum((w0 != 0.0f ? __ldcg(p + (size_t)lane * (hd + 2) + 1) * w0 : 0.0f) +
                             (w1 != 0.0f ? __ldcg(p + (size_t)k1 * (hd + 2) + 1) * w1 : 0.0f));
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    w0 *= inv;
    w1 *= inv;
    for (int d = lane; d < hd; d += 32) {
      float O = 0.0f;
      for (int k = 0; k < nsplit; k++) {
        const float wk = __shfl_sync(FULL_MASK, k < 32 ? w0 : w1, k & 31);
        if (wk != 0.0f) O += wk * __ldcg(p + (size_t)k * (hd + 2) + 2 + d);
      }
      out[(size_t)r * ldo + (size_t)h * hd + d] = O;
    }
  }
  if (threadIdx.x == 0) cnt[r * nkv + kh] = 0;
}
