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
// this one is used; rows past the length are zero-filled). Warp w serves
// query heads w and w+4 of the kv head (a pass covers 8 heads; larger
// groups take several passes). Per tile and head: lane t scores position t
// (its K row against q from shared memory, four partial sums), one warp
// max and sum update the head's running (m, l), then lanes take head
// dimensions (a float4 each) and accumulate Σ_t p_t·v_t. A split covers
// chunk = max(⌈len/nsplit⌉, AT_TP) positions, so short rows use fewer
// splits; splits past the length return at once (no partial, not
// counted). With one split holding positions (nact = 1, nsplit = 1
// among them) its block writes the normalised output itself. Otherwise
// it writes its partial — o at part[((r·nq + h)·nsplit + s)·hd + d], then
// (m, l) at part[R·nq·nsplit·hd + ((r·nq + h)·nsplit + s)·2] (R = gridDim.z)
// — and the last of its (row, kv head)'s nact blocks to finish, counted in
// cnt[r·nkv + kh] (which it resets to 0 for the next launch), merges the
// splits that hold positions, in split order, so the result does not
// depend on which block came last.
// attn_tiles_h reads a float16 cache (rope_qk_append_h's), converting in
// the compute phase: half the bytes, twice the blocks an SM.
// Requires hd % 4 == 0 (f16: hd % 8 == 0), hd ≤ 256, ldq % 4 == 0,
// ldo % 4 == 0, nsplit ≤ 64. Launch: grid (nsplit, nkv, R), block 128,
// dynamic shared memory kern.AttnTilesShared(hd, f16) = 4·8·hd +
// 4·AT_TP·stride·(4 or 2) bytes (stride: at_stride(hd) floats, hd + 8
// halves); cnt zeroed before the first launch; part R·nq·nsplit·(hd + 2)
// floats.
#define AT_TP 32
__host__ __device__ __forceinline__ int at_stride(int hd) { return 4 * ((hd / 4) | 1); }  // conflict-free LDS.128 by row

// 16 bytes global → shared, or 16 zero bytes when !pred (src not read).
__device__ __forceinline__ void at_cp16(void* dst, const void* src, bool pred) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(pred ? 16 : 0) : "memory");
}

__device__ __forceinline__ void at_fma4(float4& o, float p, const float4 v) {
  o.x = fmaf(p, v.x, o.x);
  o.y = fmaf(p, v.y, o.y);
  o.z = fmaf(p, v.z, o.z);
  o.w = fmaf(p, v.w, o.w);
}

// Cache element types: row stride in shared memory (elements; 16-byte
// aligned rows, conflict-free reads), four elements as floats, and the
// partial dot product of q (floats) with a K row over the head.
struct AtF32 {
  typedef float T;
  __device__ static int stride(int hd) { return at_stride(hd); }
  __device__ static float4 ld4(const float* p) { return *(const float4*)p; }
  __device__ static float dot(const float* kr, const float* qg, int hd) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll 4
    for (int d = 0; d < hd; d += 4) {
      const float4 k = *(const float4*)(kr + d), x = *(const float4*)(qg + d);
      s0 = fmaf(k.x, x.x, s0);
      s1 = fmaf(k.y, x.y, s1);
      s2 = fmaf(k.z, x.z, s2);
      s3 = fmaf(k.w, x.w, s3);
    }
    return (s0 + s1) + (s2 + s3);
  }
};
struct AtF16 {
  typedef __half T;
  // 16 bytes of padding: LDS.128 by row conflict-free for hd % 16 == 0
  // (64, 128, 256); 2- to 8-way conflicts for hd % 16 == 8 (72, 88, ...).
  __device__ static int stride(int hd) { return hd + 8; }
  __device__ static float4 ld4(const __half* p) {
    const uint2 u = *(const uint2*)p;
    const float2 a = __half22float2(*(const __half2*)&u.x), b = __half22float2(*(const __half2*)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
  }
  __device__ static float dot(const __half* kr, const float* qg, int hd) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll 2
    for (int d = 0; d < hd; d += 8) {
      const uint4 u = *(const uint4*)(kr + d);
      const float4 x0 = *(const float4*)(qg + d), x1 = *(const float4*)(qg + d + 4);
      const float2 a = __half22float2(*(const __half2*)&u.x), b = __half22float2(*(const __half2*)&u.y);
      const float2 c = __half22float2(*(const __half2*)&u.z), e = __half22float2(*(const __half2*)&u.w);
      s0 = fmaf(a.x, x0.x, s0);
      s1 = fmaf(a.y, x0.y, s1);
      s2 = fmaf(b.x, x0.z, s2);
      s3 = fmaf(b.y, x0.w, s3);
      s0 = fmaf(c.x, x1.x, s0);
      s1 = fmaf(c.y, x1.y, s1);
      s2 = fmaf(e.x, x1.z, s2);
      s3 = fmaf(e.y, x1.w, s3);
    }
    return (s0 + s1) + (s2 + s3);
  }
};

// The four values of v at columns c..c+3 of an f16 row in gemmh_acth's order (gh_store).
__device__ __forceinline__ void at_storeh(uint16_t* __restrict__ row, int c, float4 v) {
  gh_store(row, c, v.x);
  gh_store(row, c + 1, v.y);
  gh_store(row, c + 2, v.z);
  gh_store(row, c + 3, v.w);
}

// outh, when not null: the output also as the half wide GEMM's f16
// activations, rows of nq·hd in gemmh_acth's order (o_proj's input, so it
// needs no gemmh_acth launch).
// Split s of attn_tiles and attn_mma_h: the row's length len = pos + 1
// clamped to [0, ctx], chunks of ⌈len/nsplit⌉ positions but at least
// AT_TP, and the split's positions [t0, t1) (empty past the length).
__device__ __forceinline__ void at_split(int pos, int ctx, int nsplit, int s, int& len, int& chunk, int& t0, int& t1) {
  len = pos + 1;
  len = len < 0 ? 0 : (len > ctx ? ctx : len);
  chunk = max((len + nsplit - 1) / nsplit, AT_TP);
  t0 = min(len, s * chunk);
  t1 = min(len, t0 + chunk);
}

// The split merge of attn_tiles and attn_mma_h, in every block of (row
// r = blockIdx.z, kv head kh = blockIdx.y) after it wrote its partials:
// the last of them to finish merges (last: a shared flag).
__device__ __forceinline__ void attn_tiles_merge(float* __restrict__ part, int* __restrict__ cnt, float* __restrict__ out,
                                                 int ldo, int nq, int nkv, int hd, int nsplit, int len, int chunk,
                                                 uint16_t* __restrict__ outh, int* last_, int counted) {
  int& last = *last_;
  const int kh = blockIdx.y, r = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = nq / nkv, hd4 = hd / 4;
  float* po = part;                                          // o partials
  float* pml = part + (size_t)gridDim.z * nq * nsplit * hd;  // (m, l) partials
  // Partials written, then counted.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(&cnt[r * nkv + kh], 1);
    last = done == counted - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Splits 0..nact-1 hold positions. Warp w merges heads w, w + warps, ...:
  // split k's weight e^(m_k−M)/L held by lane k mod 32 (w0 for k < 32, w1
  // above), then Σ_k w_k·o_k, a float4 of dimensions a lane, eight splits'
  // loads in flight.
  const int nact = min(nsplit, (len + chunk - 1) / chunk);
  for (int g = warp; g < G; g += blockDim.x / 32) {
    const int h = kh * G + g;
    const size_t ph = ((size_t)r * nq + h) * nsplit;
    const int k1 = lane + 32;
    const float2 a0 = lane < nact ? __ldcg((const float2*)(pml + 2 * (ph + lane))) : make_float2(-INFINITY, 0.0f);
    const float2 a1 = k1 < nact ? __ldcg((const float2*)(pml + 2 * (ph + k1))) : make_float2(-INFINITY, 0.0f);
    const float M = warp_max(fmaxf(a0.x, a1.x));
    float w0 = 0.0f, w1 = 0.0f;
    if (M != -INFINITY) {
      w0 = a0.x != -INFINITY ? expf(a0.x - M) : 0.0f;
      w1 = a1.x != -INFINITY ? expf(a1.x - M) : 0.0f;
    }
    const float L = warp_sum(a0.y * w0 + a1.y * w1);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    w0 *= inv;
    w1 *= inv;
    float* orow = out + (size_t)r * ldo + (size_t)h * hd;
    for (int j = 0; j < 2; j++) {  // warp-uniform bounds: the shuffles see every lane
      const int d4 = lane + 32 * j;
      if (32 * j >= hd4) break;
      const bool in = d4 < hd4;
      float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int k0 = 0; k0 < nact; k0 += 8) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
          const int k = k0 + u;
          v[u] = in && k < nact ? __ldcg((const float4*)(po + (ph + k) * hd) + d4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
          const int k = k0 + u;
          const float wk = __shfl_sync(FULL_MASK, k < 32 ? w0 : w1, k & 31);
          at_fma4(O, wk, v[u]);
        }
      }
      if (in) *(float4*)(orow + 4 * d4) = O;
      if (in && outh) at_storeh(outh + (size_t)r * nq * hd, h * hd + 4 * d4, O);
    }
  }
  if (threadIdx.x == 0) cnt[r * nkv + kh] = 0;
}

// attn_rope_tiles(_h)'s own work (decode steps: each row a sequence of
// its own): rope_qk_append's for the row's kv head, so that no launch runs
// between the q|k|v product and the attention. The norm weights and the
// frequencies are staged in shared memory before pdl_wait, the row's
// cosines and sines computed once a block into a table; every block
// normalises and rotates its query heads as it loads them
// (rope_qk_append's arithmetic, then the scale: the bits attn_tiles sees
// after rope_qk_append); the split that holds position pos[r] (the last
// one) also normalises and rotates the kv head's new key and appends it
// and the new value to the caches before it reads them back as the other
// rows. q|k|v are not changed in place.
struct AtRope {
  const float* __restrict__ inv;  // inverse frequencies, rot/2
  float mscale;
  int rot;
  const float* __restrict__ qw;  // q/k norm weights (hd) or null
  const float* __restrict__ kw;
  float eps;
  int one_plus;
};
#define AT_RMAX 256  // head dimensions attn_tiles takes
struct AtRopeSmem {
  float w[2][AT_RMAX];      // q and k norm weights
  float inv[AT_RMAX / 2];   // frequencies
  float cs[2][AT_RMAX / 2];  // the row's cosines and sines
  float kv[2][AT_RMAX];     // the new key and value
};

// Head xh of hd floats in shared memory, by one warp: the norm (nw in
// shared memory, or none: head_norm's order, lanes over i, i + 32, ...,
// the warp's tree), the rotation of the pairs below rot by the table,
// then every element times f.
__device__ __forceinline__ void at_rope_head(float* xh, int hd, const float* nw, bool norm, const AtRope& rp,
                                             const AtRopeSmem& rs, float f) {
  const int lane = threadIdx.x & 31, half = rp.rot / 2;
  if (norm) {
    double ss = 0.0;
    for (int i = lane; i < hd; i += 32) ss += (double)xh[i] * (double)xh[i];
    ss = warp_sum_d(ss);
    const float v = rms_inv(ss, hd, rp.eps);
    for (int i = lane; i < hd; i += 32) xh[i] = rms_apply(xh[i], v, nw[i], rp.one_plus);
    __syncwarp();
  }
  for (int i = lane; i < half; i += 32) rope_rot(xh[i], xh[i + half], rs.cs[0][i], rs.cs[1][i]);
  __syncwarp();
  if (f != 1.0f)
    for (int i = lane; i < hd; i += 32) xh[i] = xh[i] * f;
  __syncwarp();
}

template <class E, bool ROPE = false>
__device__ __forceinline__ void attn_tiles_body(const float* __restrict__ q, int ldq, const typename E::T* __restrict__ kc,
                                                const typename E::T* __restrict__ vc, const int* __restrict__ pos,
                                                const int* __restrict__ slot, float* __restrict__ part, int* __restrict__ cnt,
                                                float* __restrict__ out, int ldo, int nq, int nkv, int hd, int ctx, int nsplit,
                                                float scale, uint16_t* __restrict__ outh, AtRope rp = AtRope{}) {
  typedef typename E::T T;
  extern __shared__ float4 at_sm4[];
  float* sm = (float*)at_sm4;
  __shared__ int last;
  __shared__ __align__(16) AtRopeSmem rs;  // ROPE only (unreferenced, so not allocated, otherwise)
  if (ROPE) {  // before pdl_wait: none of it comes from the previous launch
    for (int i = threadIdx.x; i < hd; i += 128) {
      rs.w[0][i] = rp.qw ? rp.qw[i] : 0.0f;
      rs.w[1][i] = rp.kw ? rp.kw[i] : 0.0f;
    }
    for (int i = threadIdx.x; i < rp.rot / 2; i += 128) rs.inv[i] = rp.inv[i];
    __syncthreads();
  }
  pdl_trigger();
  pdl_wait();
  const int s = blockIdx.x, kh = blockIdx.y, r = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = nq / nkv, hd4 = hd / 4, st = E::stride(hd);
  const int epc = 16 / (int)sizeof(T), cpr = hd / epc;  // elements a 16-byte copy, copies a row
  int len, chunk, t0, t1;
  at_split(pos[r], ctx, nsplit, s, len, chunk, t0, t1);
  // Splits past the length have nothing to add: they neither write a
  // partial nor count; with one split holding positions it writes the
  // output itself (what the merge of one partial computes, bitwise).
  const int nact = max(1, min(nsplit, (len + chunk - 1) / chunk));
  if (s >= nact) return;
  const bool single = nact == 1;
  const int ntile = (t1 - t0 + AT_TP - 1) / AT_TP;
  const size_t cbase = ((size_t)slot[r] * nkv + kh) * ctx * hd;
  float* qs = sm;                       // [8][hd], scaled
  T* ks = (T*)(qs + 8 * hd);            // [2][AT_TP][st]
  T* vs = ks + 2 * AT_TP * st;          // [2][AT_TP][st]
  float* po = part;                                          // o partials
  float* pml = part + (size_t)gridDim.z * nq * nsplit * hd;  // (m, l) partials
  const int tpos = pos[r];
  // The split holding position tpos appends its key and value (ROPE).
  const bool app = ROPE && s == nact - 1 && tpos >= 0 && tpos < ctx;
  if (ROPE) {
    for (int i = threadIdx.x; i < rp.rot / 2; i += 128) rope_cs(tpos, rs.inv[i], rp.mscale, rs.cs[0][i], rs.cs[1][i]);
  }

  for (int g0 = 0; g0 < G; g0 += 8) {
    const int ng = min(8, G - g0);
    __syncthreads();  // the previous pass is done with qs and the ring
    const float* qr = q + (size_t)r * ldq + (size_t)(kh * G + g0) * hd;
    if (ROPE) {
      const bool ak = app && g0 == 0;  // this pass also rotates and appends the new key
      const float* kr = q + (size_t)r * ldq + (size_t)(nq + kh) * hd;
      // One round of 16-byte loads (hd and ldq are multiples of 4).
      for (int e = threadIdx.x; e < ng * hd / 4; e += 128) ((float4*)qs)[e] = ((const float4*)qr)[e];
      if (ak)
        for (int e = threadIdx.x; e < hd / 4; e += 128) {
          ((float4*)rs.kv[0])[e] = ((const float4*)kr)[e];
          ((float4*)rs.kv[1])[e] = ((const float4*)(kr + (size_t)nkv * hd))[e];
        }
      __syncthreads();  // the heads, the table
      // Items ng (the key) and 0..ng-1 (query heads), a warp each in turn.
      for (int g = warp; g < ng + (ak ? 1 : 0); g += 4) {
        if (g < ng) at_rope_head(qs + g * hd, hd, rs.w[0], rp.qw != nullptr, rp, rs, scale);
        else at_rope_head(rs.kv[0], hd, rs.w[1], rp.kw != nullptr, rp, rs, 1.0f);
      }
      __syncthreads();
      if (ak) {  // into the caches at tpos, visible to this block's tile copies below
        T* kd = const_cast<T*>(kc) + cbase + (size_t)tpos * hd;
        T* vd = const_cast<T*>(vc) + cbase + (size_t)tpos * hd;
        for (int e = threadIdx.x; e < hd; e += 128) {
          kd[e] = kv_elem(rs.kv[0][e], kd);
          vd[e] = kv_elem(rs.kv[1][e], vd);
        }
        __threadfence();
        __syncthreads();
      }
    } else {
      for (int e = threadIdx.x; e < ng * hd; e += 128) qs[e] = qr[e] * scale;
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float4 o[2][2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
      for (int j = 0; j < 2; j++) o[hh][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0; i <= ntile; i++) {
      if (i < ntile) {  // queue tile i into stage i&1, rows past t1 zeroed
        const int b = i & 1, ta = t0 + i * AT_TP;
        for (int c = threadIdx.x; c < AT_TP * cpr; c += 128) {
          const int row = c / cpr, e0 = (c - row * cpr) * epc;
          const bool in = ta + row < t1;
          const size_t off = in ? cbase + (size_t)(ta + row) * hd + e0 : 0;
          at_cp16(ks + (b * AT_TP + row) * st + e0, kc + off, in);
          at_cp16(vs + (b * AT_TP + row) * st + e0, vc + off, in);
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
      const T* kt = ks + b * AT_TP * st;
      const T* vt = vs + b * AT_TP * st;
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int g = warp + 4 * hh;
        if (g >= ng) break;
        const float d = E::dot(kt + lane * st, qs + g * hd, hd);
        const float sc = lane < n ? d : -INFINITY;
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
        // Σ_t p_t·v_t over the tile in steps of 8 (zeroed rows past n,
        // where p is 0 too).
        for (int ta = 0; ta < n; ta += 8) {
#pragma unroll
          for (int u = 0; u < 8; u++) {
            const float pt = __shfl_sync(FULL_MASK, p, ta + u);
            const T* vr = vt + (ta + u) * st;
#pragma unroll
            for (int j = 0; j < 2; j++) {
              const int d4 = lane + 32 * j;
              if (d4 < hd4) at_fma4(o[hh][j], pt, E::ld4(vr + 4 * d4));
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
      const size_t ph = ((size_t)r * nq + h) * nsplit + s;
      const float inv = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
      float* dst = single ? out + (size_t)r * ldo + (size_t)h * hd : po + ph * hd;
      const float f = single ? inv : 1.0f;
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const int d4 = lane + 32 * j;
        if (d4 < hd4) {
          const float4 v = o[hh][j];
          const float4 y = make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
          *(float4*)(dst + 4 * d4) = y;
          if (single && outh) at_storeh(outh + (size_t)r * nq * hd, h * hd + 4 * d4, y);
        }
      }
      if (!single && lane == 0) *(float2*)(pml + 2 * ph) = make_float2(m[hh], l[hh]);
    }
  }
  if (!single) attn_tiles_merge(part, cnt, out, ldo, nq, nkv, hd, nsplit, len, chunk, outh, &last, nact);
}

#define ATTN_TILES_PARAMS(T)                                                                                           \
  const float *__restrict__ q, int ldq, const T *__restrict__ kc, const T *__restrict__ vc, const int *__restrict__ pos, \
      const int *__restrict__ slot, float *__restrict__ part, int *__restrict__ cnt, float *__restrict__ out, int ldo,   \
      int nq, int nkv, int hd, int ctx, int nsplit, float scale, uint16_t *__restrict__ outh
extern "C" __global__ void __launch_bounds__(128) attn_tiles(ATTN_TILES_PARAMS(float)) {
  attn_tiles_body<AtF32>(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, nq, nkv, hd, ctx, nsplit, scale, outh);
}
extern "C" __global__ void __launch_bounds__(128) attn_tiles_h(ATTN_TILES_PARAMS(__half)) {
  attn_tiles_body<AtF16>(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, nq, nkv, hd, ctx, nsplit, scale, outh);
}

// attn_rope_tiles(_h): rope_qk_append(_h) then attn_tiles(_h) in one
// launch (AtRope), for steps whose rows are each a sequence of its own
// (decode): attn_tiles' parameters, then (inv, mscale, rot, qw, kw, eps,
// one_plus) as rope_qk_append's; q is the q|k|v row (ldq its width).
#define ATTN_ROPE_PARAMS                                                                                     \
  const float *__restrict__ inv, float mscale, int rot, const float *__restrict__ qw, const float *__restrict__ kw, \
      float eps, int one_plus
extern "C" __global__ void __launch_bounds__(128) attn_rope_tiles(ATTN_TILES_PARAMS(float), ATTN_ROPE_PARAMS) {
  attn_tiles_body<AtF32, true>(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, nq, nkv, hd, ctx, nsplit, scale, outh,
                               AtRope{inv, mscale, rot, qw, kw, eps, one_plus});
}
extern "C" __global__ void __launch_bounds__(128) attn_rope_tiles_h(ATTN_TILES_PARAMS(__half), ATTN_ROPE_PARAMS) {
  attn_tiles_body<AtF16, true>(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, nq, nkv, hd, ctx, nsplit, scale, outh,
                               AtRope{inv, mscale, rot, qw, kw, eps, one_plus});
}

// attn_mma_h_d<HD>: attn_tiles_h's attention on m16n8k16 f16 tensor cores,
// for the steps whose GEMMs take the half wide tiles (their activations
// are f16 already; kern.AttnMMAFits): attn_tiles_h's parameters, grid
// (nsplit, nkv, R), block 32·NW (NW warps: 4 for hd 64, 2 for 128, so that
// a block's rings fit 48 KB and five blocks an SM), splits (chunks of ≥
// AT_TP positions), split
// merge and outputs. A block's G ≤ 16 query heads are the rows of one
// 16-row A tile: f16(q·scale), rows past G zero, its hd/16 fragments held
// in registers. Warp w takes the split's tiles of AM_TP = 16 positions w,
// w+NW, ... through its own two-stage cp.async ring of K and V rows (rows
// past the length zero-filled), and per tile: S = Q·Kᵀ (hd/8 mma, f32),
// positions past the length −inf, the online softmax on S's fragments (a
// head's running max m over its quad, p = e^(s−m) in f32 rounded to f16,
// l the sum of the rounded p), P as the A operand straight from S's
// fragments, O += P·V (hd/8 mma, V by ldmatrix.trans). The warps'
// (m, l, O) are merged in warp order through shared memory; then, as
// attn_tiles: the output O/l and its f16 copy (one split), or the split's
// partial (O, m, l) and the last block's merge. Rounding: q·scale and p
// to f16 (relative 2^-11) besides the f16 cache, f32 sums: not
// attn_tiles_h's bits. Dynamic shared memory kern.AttnMMAShared(hd) =
// 2·(16 + NW·2·2·AM_TP)·(hd + 8) bytes.
#define AM_TP 16
template <int HD, int NW>
__device__ __forceinline__ void attn_mma_body(const float* __restrict__ q, int ldq, const __half* __restrict__ kc,
                                              const __half* __restrict__ vc, const int* __restrict__ pos,
                                              const int* __restrict__ slot, float* __restrict__ part, int* __restrict__ cnt,
                                              float* __restrict__ out, int ldo, int nq, int nkv, int ctx, int nsplit,
                                              float scale, uint16_t* __restrict__ outh) {
  constexpr int LDS = HD + 8, NK = HD / 16, NO = HD / 8, CPR = HD / 8;  // halves a row, k steps, n tiles, copies a row
  constexpr int TILE = AM_TP * LDS;                                      // halves of a K or V tile
  constexpr int NT = 32 * NW;                                            // threads
  // The merge's m, l and O (floats) fit where the rings were.
  static_assert(HD % 16 == 0 && NO % 2 == 0 && 4 * (2 * 16 * NW + NW * 16 * HD) <= 2 * NW * 2 * 2 * TILE, "attn_mma layout");
  extern __shared__ float4 at_sm4[];
  __half* const qs = reinterpret_cast<__half*>(at_sm4);  // [16][LDS]
  __shared__ int last;
  pdl_trigger();
  pdl_wait();
  const int s = blockIdx.x, kh = blockIdx.y, r = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g4 = lane >> 2, q4 = lane & 3;
  const int G = nq / nkv;
  int len, chunk, t0, t1;
  at_split(pos[r], ctx, nsplit, s, len, chunk, t0, t1);
  const int ntile = (t1 - t0 + AM_TP - 1) / AM_TP;
  const size_t cbase = ((size_t)slot[r] * nkv + kh) * ctx * HD;
  __half* const ring = qs + 16 * LDS + warp * 2 * 2 * TILE;  // the warp's [stage][K, V][AM_TP][LDS]

  const float* qr = q + (size_t)r * ldq + (size_t)kh * G * HD;
  for (int e = tid; e < 16 * HD; e += NT) {
    const int row = e / HD, d = e - row * HD;
    qs[row * LDS + d] = __float2half_rn(row < G ? qr[row * HD + d] * scale : 0.0f);
  }
  __syncthreads();
  uint32_t qa[NK][4];
#pragma unroll
  for (int kk = 0; kk < NK; kk++)
    gq_ldsm4(qa[kk], reinterpret_cast<const uint8_t*>(qs + (lane & 15) * LDS + kk * 16 + (lane >> 4) * 8));

  const int nt = ntile > warp ? (ntile - warp + NW - 1) / NW : 0;  // the warp's tiles warp + NW·j
  auto issue = [&](int j) {
    const int ta = t0 + (warp + NW * j) * AM_TP;
    __half* st = ring + (j & 1) * 2 * TILE;
#pragma unroll
    for (int c = lane; c < AM_TP * CPR; c += 32) {
      const int row = c / CPR, e0 = (c - row * CPR) * 8;
      const bool in = ta + row < t1;
      const size_t off = in ? cbase + (size_t)(ta + row) * HD + e0 : 0;
      at_cp16(st + row * LDS + e0, kc + off, in);
      at_cp16(st + TILE + row * LDS + e0, vc + off, in);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  // Rows g4 (index 0) and g4 + 8 (index 1) of the lane's fragments.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
  if (nt > 0) issue(0);
#pragma unroll 1
  for (int j = 0; j < nt; j++) {
    if (j + 1 < nt) {
      issue(j + 1);
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncwarp();
    const __half* kt = ring + (j & 1) * 2 * TILE;
    const __half* vt = kt + TILE;
    const int n = min(AM_TP, t1 - (t0 + (warp + NW * j) * AM_TP));  // ≥ 1 positions in the tile
    float sc[2][4];
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
      for (int e = 0; e < 4; e++) sc[u][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
      uint32_t kb[4];  // b0, b1 of positions 0-7, then of 8-15
      gq_ldsm4(kb, reinterpret_cast<const uint8_t*>(kt + ((lane & 7) + ((lane >> 4) << 3)) * LDS + kk * 16 + ((lane >> 3) & 1) * 8));
      gh_mma(sc[0], qa[kk], kb[0], kb[1]);
      gh_mma(sc[1], qa[kk], kb[2], kb[3]);
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        if (8 * u + 2 * q4 + e >= n) sc[u][e] = sc[u][2 + e] = -INFINITY;
        mx[0] = fmaxf(mx[0], sc[u][e]);
        mx[1] = fmaxf(mx[1], sc[u][2 + e]);
      }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 2));
      const float mn = fmaxf(m[h], mx[h]);  // finite: position 0 of the tile is in
      corr[h] = expf(m[h] - mn);            // 0 on the first tile
      m[h] = mn;
      l[h] *= corr[h];
    }
    uint32_t pa[4];  // P's A fragment: (row g4, positions 2q4..), (g4+8, ..), (g4, 8+2q4..), (g4+8, 8+..)
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const __half2 p = __floats2half2_rn(expf(sc[u][2 * h] - m[h]), expf(sc[u][2 * h + 1] - m[h]));
        const float2 pf = __half22float2(p);
        l[h] += pf.x + pf.y;
        pa[2 * u + h] = *reinterpret_cast<const uint32_t*>(&p);
      }
#pragma unroll
    for (int nn = 0; nn < NO; nn++) {
      o[nn][0] *= corr[0];
      o[nn][1] *= corr[0];
      o[nn][2] *= corr[1];
      o[nn][3] *= corr[1];
    }
#pragma unroll
    for (int nn = 0; nn < NO; nn += 2) {
      uint32_t vb[4];  // b0, b1 of dimensions 8nn.., then of 8nn+8..
      gq_ldsm4<true>(vb, reinterpret_cast<const uint8_t*>(vt + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDS + nn * 8 + (lane >> 4) * 8));
      gh_mma(o[nn], pa, vb[0], vb[1]);
      gh_mma(o[nn + 1], pa, vb[2], vb[3]);
    }
    __syncwarp();  // the stage is refilled two tiles on
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(FULL_MASK, l[h], 1);
    l[h] += __shfl_xor_sync(FULL_MASK, l[h], 2);
  }
  // The warps' states through shared memory (the rings are done): m, l
  // [NW][16], O [NW][16][HD].
  __syncthreads();
  float* const ms = reinterpret_cast<float*>(qs + 16 * LDS);
  float* const ls = ms + 16 * NW;
  float* const os = ls + 16 * NW;
  if (q4 == 0) {
    ms[warp * 16 + g4] = m[0];
    ms[warp * 16 + g4 + 8] = m[1];
    ls[warp * 16 + g4] = l[0];
    ls[warp * 16 + g4 + 8] = l[1];
  }
#pragma unroll
  for (int nn = 0; nn < NO; nn++) {
    *reinterpret_cast<float2*>(os + (warp * 16 + g4) * HD + nn * 8 + 2 * q4) = make_float2(o[nn][0], o[nn][1]);
    *reinterpret_cast<float2*>(os + (warp * 16 + g4 + 8) * HD + nn * 8 + 2 * q4) = make_float2(o[nn][2], o[nn][3]);
  }
  __syncthreads();
  float* const po = part;
  float* const pml = part + (size_t)gridDim.z * nq * nsplit * HD;
  for (int e = tid; e < G * HD; e += NT) {
    const int g = e / HD, d = e - g * HD, h = kh * G + g;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; w++) M = fmaxf(M, ms[w * 16 + g]);
    float L = 0.0f, O = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
      const float mw = ms[w * 16 + g];
      if (mw == -INFINITY) continue;  // a warp without positions
      const float f = expf(mw - M);
      L += f * ls[w * 16 + g];
      O += f * os[(w * 16 + g) * HD + d];
    }
    if (nsplit == 1) {
      const float y = L > 0.0f ? O / L : 0.0f;
      out[(size_t)r * ldo + (size_t)h * HD + d] = y;
      if (outh) gh_store(outh + (size_t)r * nq * HD, h * HD + d, y);
    } else {
      const size_t ph = ((size_t)r * nq + h) * nsplit + s;
      po[ph * HD + d] = O;
      if (d == 0) *(float2*)(pml + 2 * ph) = make_float2(M, L);
    }
  }
  if (nsplit > 1) attn_tiles_merge(part, cnt, out, ldo, nq, nkv, HD, nsplit, len, chunk, outh, &last, nsplit);
}
extern "C" __global__ void __launch_bounds__(128) attn_mma_h_d64(ATTN_TILES_PARAMS(__half)) {
  attn_mma_body<64, 4>(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, nq, nkv, ctx, nsplit, scale, outh);
}
extern "C" __global__ void __launch_bounds__(64) attn_mma_h_d128(ATTN_TILES_PARAMS(__half)) {
  attn_mma_body<128, 2>(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, nq, nkv, ctx, nsplit, scale, outh);
}
// The 4-warp variant (74 KB of shared memory), compared by CORTIQ_CUDA_ATTN=w4.
extern "C" __global__ void __launch_bounds__(128) attn_mma_h_d128w4(ATTN_TILES_PARAMS(__half)) {
  attn_mma_body<128, 4>(q, ldq, kc, vc, pos, slot, part, cnt, out, ldo, nq, nkv, ctx, nsplit, scale, outh);
}
