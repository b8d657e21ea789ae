// Batched decode matvec: y[r][o] (=|+=) Σ_i W[o,i]·x[r][i] (+ bias[o]) for
// R = 1..8 activation rows, every weight byte read once for all rows.
//
// Launch shape of mv_{f32,f16,bf16}_r*: grid ⌈rows/8⌉, block 128 (4 warps,
// 2 weight rows per warp, lanes walking the columns in 16-byte chunks);
// mv_{q8row,q4tp}_r* are the quantized-activation kernels below (their own
// launch shape and shared memory).
// Parameters: (W, rows, cols, x, ldx, y, ldy, bias, accumulate): W the
// tensor's bytes as CMF stores them, x and y float32 with row strides ldx
// and ldy (in floats), bias float32[rows] or null, accumulate != 0 adds to
// y (the residual add) instead of storing. The 16-byte path needs W and x
// 16-byte aligned, ldx % 4 == 0 and rows of whole 16-byte chunks; anything
// else takes the element-wise path of the same kernel (slower, same sums).
// q8_2f runs as q82f_prescale (x ⊙ col) followed by mv_q8row: its quants
// and row scales are laid out exactly as q8_row's.
#include "common.cuh"

#define MV_WARPS 4
#define MV_RPW 2

struct FmtF32 {
  static constexpr int E = 4, ES = 4;
  __device__ static void decode(uint4 c, float* w) {
    w[0] = __uint_as_float(c.x); w[1] = __uint_as_float(c.y);
    w[2] = __uint_as_float(c.z); w[3] = __uint_as_float(c.w);
  }
  __device__ static float scalar(const uint8_t* row, int i) { return ((const float*)row)[i]; }
  __device__ static float row_scale(const uint8_t*, int, int, int) { return 1.0f; }
};

struct FmtF16 {
  static constexpr int E = 8, ES = 2;
  __device__ static void decode(uint4 c, float* w) {
    uint32_t v[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 4; j++) { w[2 * j] = f16_to_f32(v[j] & 0xffff); w[2 * j + 1] = f16_to_f32(v[j] >> 16); }
  }
  __device__ static float scalar(const uint8_t* row, int i) { return f16_to_f32(((const uint16_t*)row)[i]); }
  __device__ static float row_scale(const uint8_t*, int, int, int) { return 1.0f; }
};

struct FmtBF16 {
  static constexpr int E = 8, ES = 2;
  __device__ static void decode(uint4 c, float* w) {
    uint32_t v[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 4; j++) { w[2 * j] = bf16_to_f32(v[j] & 0xffff); w[2 * j + 1] = bf16_to_f32(v[j] >> 16); }
  }
  __device__ static float scalar(const uint8_t* row, int i) { return bf16_to_f32(((const uint16_t*)row)[i]); }
  __device__ static float row_scale(const uint8_t*, int, int, int) { return 1.0f; }
};

__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) { return __ldcs((const uint4*)p); }

// Stores one output element with the epilogue.
__device__ __forceinline__ void mv_store(float* y, float v, const float* bias, int o, int accumulate) {
  if (bias) v += bias[o];
  if (accumulate) v += *y;
  *y = v;
}

template <int R, class F>
__device__ __forceinline__ void mv_plain(const uint8_t* __restrict__ W, int rows, int cols,
                                         const float* __restrict__ x, int ldx, float* __restrict__ y, int ldy,
                                         const float* __restrict__ bias, int accumulate) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int o0 = (blockIdx.x * MV_WARPS + warp) * MV_RPW;
  pdl_trigger();
  if (o0 >= rows) return;
  const size_t rb = (size_t)cols * F::ES;
  const bool vec = aligned16(W) && rb % 16 == 0 && aligned16(x) && ldx % 4 == 0;
  float acc[MV_RPW][R];
#pragma unroll
  for (int a = 0; a < MV_RPW; a++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[a][r] = 0.0f;
  bool valid[MV_RPW];
#pragma unroll
  for (int a = 0; a < MV_RPW; a++) valid[a] = o0 + a < rows;

  if (vec) {
    const int nch = (int)(rb / 16);
    uint4 cur[MV_RPW], nxt[MV_RPW];
#pragma unroll
    for (int a = 0; a < MV_RPW; a++)
      cur[a] = (valid[a] && lane < nch) ? ld_stream(W + (size_t)(o0 + a) * rb + (size_t)lane * 16) : make_uint4(0, 0, 0, 0);
    pdl_wait();  // weights never depend on the previous kernel; x does
    for (int k0 = 0; k0 < nch; k0 += 32) {
      const int k = k0 + lane;
#pragma unroll
      for (int a = 0; a < MV_RPW; a++)
        nxt[a] = (valid[a] && k + 32 < nch) ? ld_stream(W + (size_t)(o0 + a) * rb + (size_t)(k + 32) * 16) : make_uint4(0, 0, 0, 0);
      if (k < nch) {
        float w[MV_RPW][F::E];
#pragma unroll
        for (int a = 0; a < MV_RPW; a++) F::decode(cur[a], w[a]);
#pragma unroll
        for (int r = 0; r < R; r++) {
          const float4* xp = (const float4*)(x + (size_t)r * ldx + (size_t)k * F::E);
          float xv[F::E];
#pragma unroll
          for (int q = 0; q < F::E / 4; q++) {
            float4 t = xp[q];
            xv[4 * q] = t.x; xv[4 * q + 1] = t.y; xv[4 * q + 2] = t.z; xv[4 * q + 3] = t.w;
          }
#pragma unroll
          for (int a = 0; a < MV_RPW; a++) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < F::E; e++) s += w[a][e] * xv[e];
            acc[a][r] += s;
          }
        }
      }
#pragma unroll
      for (int a = 0; a < MV_RPW; a++) cur[a] = nxt[a];
    }
  } else {
    pdl_wait();
    for (int i = lane; i < cols; i += 32) {
#pragma unroll
      for (int a = 0; a < MV_RPW; a++) {
        if (!valid[a]) continue;
        float w = F::scalar(W + (size_t)(o0 + a) * rb, i);
#pragma unroll
        for (int r = 0; r < R; r++) acc[a][r] += w * x[(size_t)r * ldx + i];
      }
    }
  }
#pragma unroll
  for (int a = 0; a < MV_RPW; a++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[a][r] = warp_sum(acc[a][r]);
  if (lane == 0) {
#pragma unroll
    for (int a = 0; a < MV_RPW; a++) {
      if (!valid[a]) continue;
      const int o = o0 + a;
      const float s = F::row_scale(W, rows, cols, o);
#pragma unroll
      for (int r = 0; r < R; r++) mv_store(y + (size_t)r * ldy + o, acc[a][r] * s, bias, o, accumulate);
    }
  }
}

// Quantized-activation matvecs (production for q8_row, q8_2f's quants and
// q4tp): y[r][v] (=|+=) W_v·x'[r] (+ bias) over the rows v of up to three
// tensors of one format and width stacked (q|k|v, gate|up: rows0 + rows1
// + rows2 outputs side by side in y), x' the prologue of x:
//   pro 0  x as is;
//   pro 1  RMSNorm of x with weight nw (pro 2: zero-centred, (1+nw)), the
//          arithmetic of rmsnorm (norm.cu) with Σx² summed in another order;
//   pro 3  SwiGLU: silu(x[i])·x[xoff + i], as silu_mul (act.cu).
// Each block computes x' for its R activation rows and quantizes it into
// shared memory, per block of 32 exactly as the CPU's int8 kernels do
// (kernels/quantx.go quantizeBlock: amax over the block, id = 127/amax,
// q = round-half-even(x'·id), d = amax/127; a block with amax < 2^-120 or
// NaN is all zeros). Then every warp walks whole weight rows, a lane per
// group of 32 weights, with dp4a: q4tp adds rung·d·(Σ n·q − 8·Σq) per group
// (n the stored nibble), q8_row d·Σ w·q per block and the row scale at the
// end. Weight loads are double-buffered across batches and rows, and the
// first batch is issued before the prologue (weights never depend on the
// previous kernel). Why int8: float activations cost 4 bytes of L1/L2
// traffic per weight (8× a q4tp weight's bytes); int8 in shared memory
// cost 1 and leave the kernel bound by DRAM. Why the fused prologue: it
// saves the launches of rmsnorm and silu_mul in a decode step.
//
// Parameters: (W0, W1, W2, rows0, rows1, rows2, cols, x, ldx, xoff, y, ldy,
// b0, b1, b2, accumulate, nw, eps, pro); unused tensors have 0 rows.
// Launch: block 512 (16 warps), grid min(⌈rows/16⌉, SMs) (rows =
// rows0+rows1+rows2 in a grid-stride loop), dynamic shared memory R·nb·40
// bytes + 128 a row (nb = ⌈cols/32⌉): the quants at [r][half][b][16] (the
// first and second 16 of each block in two planes of nb·16 + 64 bytes, so
// the lanes' 16-byte reads are conflict-free), then (d, Σq) pairs at [r][b].
#define MQ_WARPS 16  // warps a block (block 512)
#define MQ_GB 4  // 16-byte chunks a lane loads per batch (q4tp: a group each; q8_row: half a block each)
#define MQ_PLAIN 0
#define MQ_NORM 1
#define MQ_NORM1 2
#define MQ_SILU 3

__device__ __forceinline__ int mq_pos(int i, bool perm) {
  // perm: each 8 quants as (0,2,4,6,1,3,5,7), the order of a q4tp word's
  // low and high nibbles.
  const int e = i & 7;
  return perm ? (i & ~7) + (e >> 1) + 4 * (e & 1) : i;
}

// mq_quant4 quantizes four consecutive values v of block b (element e0..e0+3
// of it) held by 8 neighbouring lanes (a block of 32 is 8 lanes × 4). Every
// lane of the warp calls it (the shuffles are warp-wide); store is uniform
// over each 8 lanes.
template <bool PERM>
__device__ __forceinline__ void mq_quant4(const float v[4], int r, int b, int e0, int nb, int ps, int8_t* xq, int2* xds, bool store) {
  float am = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  bool nan = v[0] != v[0] || v[1] != v[1] || v[2] != v[2] || v[3] != v[3];
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) {
    am = fmaxf(am, __shfl_xor_sync(FULL_MASK, am, o));
    const int other = __shfl_xor_sync(FULL_MASK, (int)nan, o);
    nan = nan || other;
  }
  int q[4] = {0, 0, 0, 0};
  float d = 0.0f;
  if (!nan && am >= 0x1p-120f) {
    const float id = __fdiv_rn(127.0f, am);
#pragma unroll
    for (int j = 0; j < 4; j++) q[j] = __float2int_rn(__fmul_rn(v[j], id));
    d = __fdiv_rn(am, 127.0f);
  }
  int s = q[0] + q[1] + q[2] + q[3];
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
  if (!store) return;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int p = mq_pos(e0 + j, PERM);
    xq[(size_t)(r * 2 + (p >> 4)) * ps + (size_t)b * 16 + (p & 15)] = (int8_t)q[j];
  }
  if (e0 == 0) xds[r * nb + b] = make_int2(__float_as_int(d), s);
}

// mq_norm_prefetch: the norm weight's lines into L1 before pdl_wait (it
// does not depend on the previous launch; the prologue reads it).
__device__ __forceinline__ void mq_norm_prefetch(int pro, const float* nw, int cols) {
  if (pro != MQ_NORM && pro != MQ_NORM1) return;
  for (int i = 32 * threadIdx.x; i < cols; i += 32 * blockDim.x) prefetch_l1(nw + i);
}

// mq_prologue fills xq/xds with the quantized x' of R rows (see above).
// Every thread of the block takes part; it ends with __syncthreads.
template <int R, bool PERM>
__device__ __forceinline__ void mq_prologue(const float* __restrict__ x, int ldx, int xoff, int cols, int nb, int ps, int pro,
                                            const float* __restrict__ nw, float eps, int8_t* xq, int2* xds) {
  __shared__ double red[32];
  __shared__ float inv[8];
  const int tid = threadIdx.x;
  const bool norm = pro == MQ_NORM || pro == MQ_NORM1;
  if (R == 1 && norm && cols % 32 == 0 && nb * 8 <= 4 * MQ_WARPS * 32 && aligned16(x) && aligned16(nw)) {
    // One normalised row of at most four quads a thread: x and the norm
    // weight loaded once (one round of loads), Σx² from those values.
    const int nq1 = nb * 8;
    float v[4][4];
    float4 wv[4];
    double ss = 0.0;
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int qd = u * MQ_WARPS * 32 + tid;
      float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f), w4 = t;
      if (qd < nq1) t = ((const float4*)x)[qd], w4 = ((const float4*)nw)[qd];
      v[u][0] = t.x, v[u][1] = t.y, v[u][2] = t.z, v[u][3] = t.w;
      wv[u] = w4;
    }
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
      for (int j = 0; j < 4; j++) ss += (double)v[u][j] * (double)v[u][j];
    ss = block_sum_d(ss, red);
    const float iv = rms_inv(ss, cols, eps);
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (u * MQ_WARPS * 32 >= nq1) break;  // block-uniform
      const float w[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
      for (int j = 0; j < 4; j++) v[u][j] = rms_apply(v[u][j], iv, w[j], pro == MQ_NORM1);
      const int qd = u * MQ_WARPS * 32 + tid;
      mq_quant4<PERM>(v[u], 0, qd >> 3, 4 * (qd & 7), nb, ps, xq, xds, qd < nq1);
    }
    __syncthreads();
    return;
  }
  if (norm) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      const float* xr = x + (size_t)r * ldx;
      double ss = 0.0;
#pragma unroll 4
      for (int i = tid; i < cols; i += MQ_WARPS * 32) ss += (double)xr[i] * (double)xr[i];
      ss = block_sum_d(ss, red);  // ends with a barrier; red is rewritten only after the next one
      if (tid == 0) inv[r] = rms_inv(ss, cols, eps);
    }
    __syncthreads();
  }
  // Quads: thread t takes elements 4q..4q+3 of quad q = t, t + 256, ...
  // over R rows × nb blocks × 8 quads; the 8 quads of a block sit in 8
  // neighbouring lanes (nb·8 quads a row, a multiple of 8).
  const int nq = R * nb * 8;
  const bool vec = aligned16(x) && ldx % 4 == 0 && xoff % 4 == 0 && (!norm || aligned16(nw));
  // The loop is uniform over the block (every lane reaches every shuffle);
  // quads past nq compute zeros and store nothing.
  for (int base = 0; base < nq; base += MQ_WARPS * 32 * 4) {
    float v[4][4];
#pragma unroll
    for (int u = 0; u < 4; u++) {  // four quads' loads in flight
      if (R <= 4 && base + u * MQ_WARPS * 32 >= nq) break;  // block-uniform: no quad of the block left (R ≤ 4: the larger R keep their registers)
      const int qd = base + u * MQ_WARPS * 32 + tid;
      const int r = qd / (nb * 8), i = 4 * (qd - r * nb * 8);
      const float* xr = x + (size_t)r * ldx;
#pragma unroll
      for (int j = 0; j < 4; j++) v[u][j] = 0.0f;
      if (qd >= nq) continue;
      if (vec && i + 4 <= cols) {
        const float4 t = *(const float4*)(xr + i);
        v[u][0] = t.x, v[u][1] = t.y, v[u][2] = t.z, v[u][3] = t.w;
        if (pro == MQ_SILU) {
          const float4 w = *(const float4*)(xr + xoff + i);
          const float g[4] = {t.x, t.y, t.z, t.w}, up[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int j = 0; j < 4; j++) v[u][j] = g[j] / (1.0f + expf(-g[j])) * up[j];
        } else if (norm) {
          const float4 w = *(const float4*)(nw + i);
          const float wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int j = 0; j < 4; j++) v[u][j] = rms_apply(v[u][j], inv[r], wv[j], pro == MQ_NORM1);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
          if (i + j >= cols) continue;
          float e = xr[i + j];
          if (pro == MQ_SILU) e = e / (1.0f + expf(-e)) * xr[xoff + i + j];
          else if (norm) e = rms_apply(e, inv[r], nw[i + j], pro == MQ_NORM1);
          v[u][j] = e;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (R <= 4 && base + u * MQ_WARPS * 32 >= nq) break;
      const int qd = base + u * MQ_WARPS * 32 + tid;
      const int r = qd / (nb * 8), k = qd - r * nb * 8;
      mq_quant4<PERM>(v[u], r, k >> 3, 4 * (k & 7), nb, ps, xq, xds, qd < nq);
    }
  }
  __syncthreads();
}

// q4tp rows by lane segments (the decode matvecs of narrow rows, where a
// whole warp on a row of 24 or 64 groups spends more instructions on the
// row's set-up and reduction than on its groups): a row of nb groups is
// taken by L = q4s_lanes(nb) lanes, lane i of the segment on groups i,
// i + L, ... (consecutive lanes on consecutive 16-byte groups: whole
// 128-byte lines for L ≥ 8), Q4S_T groups a lane loaded at once; each
// group's rung computed from its code, exp2f(a + code·b) as q4tp_rung
// (bitwise the ladder's entry); the segment's sum by a shuffle tree over
// its L lanes. x' is quantized in shared memory as mq_prologue leaves it
// (row xr, PERM order). L depends on nb only, so every kernel that takes a
// matrix's rows this way gets the same sums.
#define Q4S_T 8
__host__ __device__ __forceinline__ int q4s_lanes(int nb) { return nb <= 32 ? 4 : nb <= 64 ? 8 : nb <= 128 ? 16 : 32; }

// One lane's loads of a row's groups t0 + i + L·t (t < Q4S_T): the
// 16-byte quants and the 5-bit codes (zeros where !ok or past the row).
struct Q4Seg {
  uint4 w[Q4S_T];
  int code[Q4S_T];
};

__device__ __forceinline__ int q4tp_code_g(const uint8_t* __restrict__ codes, int g) {
  const int bit = 5 * g, cb = bit >> 3, sh = bit & 7;
  uint32_t v = __ldg(codes + cb);
  if (sh > 3) v |= (uint32_t)__ldg(codes + cb + 1) << 8;
  return (int)((v >> sh) & 31u);
}

template <int L>
__device__ __forceinline__ void q4s_load(Q4Seg& s, const uint8_t* __restrict__ W, int rows, int nb, int o, int t0, bool ok) {
  const int li = threadIdx.x & (L - 1);
  const int stride = (5 * nb + 7) / 8;
  const uint8_t* q = W + (size_t)o * nb * 16;
  const uint8_t* crow = W + (size_t)rows * nb * 16 + (size_t)rows * 4 + (size_t)o * stride;
#pragma unroll
  for (int t = 0; t < Q4S_T; t++) {
    const int g = t0 + li + L * t;
    const bool on = ok && g < nb;
    s.w[t] = on ? __ldcs((const uint4*)(q + (size_t)g * 16)) : make_uint4(0, 0, 0, 0);
    s.code[t] = on ? q4tp_code_g(crow, g) : 0;
  }
}

// The row's ladder parameters (a, b) as one 32-bit load (0 where !ok).
__device__ __forceinline__ uint32_t q4s_ab(const uint8_t* __restrict__ W, int rows, int nb, int o, bool ok) {
  return ok ? __ldg((const unsigned*)(W + (size_t)rows * nb * 16 + 4 * (size_t)o)) : 0u;
}

// acc + this lane's groups of s against row xr of the quantized x'.
template <int L>
__device__ __forceinline__ float q4s_dot(const Q4Seg& s, uint32_t ab, int nb, int t0, int xr, int ps, const int8_t* xq,
                                         const int2* xds, float acc) {
  const int li = threadIdx.x & (L - 1);
  const float a = f16_to_f32((uint16_t)(ab & 0xffff)), b = f16_to_f32((uint16_t)(ab >> 16));
#pragma unroll
  for (int t = 0; t < Q4S_T; t++) {
    const int g = t0 + li + L * t;
    if (g < nb) {
      const float sc = exp2f(__fadd_rn(a, __fmul_rn((float)s.code[t], b)));
      const uint32_t wv[4] = {s.w[t].x, s.w[t].y, s.w[t].z, s.w[t].w};
      const int4 q0 = *(const int4*)(xq + (size_t)(2 * xr) * ps + (size_t)g * 16);
      const int4 q1 = *(const int4*)(xq + (size_t)(2 * xr + 1) * ps + (size_t)g * 16);
      const int2 ds = xds[xr * nb + g];
      int si = -8 * ds.y;
      si = __dp4a((int)(wv[0] & 0x0F0F0F0Fu), q0.x, si); si = __dp4a((int)((wv[0] >> 4) & 0x0F0F0F0Fu), q0.y, si);
      si = __dp4a((int)(wv[1] & 0x0F0F0F0Fu), q0.z, si); si = __dp4a((int)((wv[1] >> 4) & 0x0F0F0F0Fu), q0.w, si);
      si = __dp4a((int)(wv[2] & 0x0F0F0F0Fu), q1.x, si); si = __dp4a((int)((wv[2] >> 4) & 0x0F0F0F0Fu), q1.y, si);
      si = __dp4a((int)(wv[3] & 0x0F0F0F0Fu), q1.z, si); si = __dp4a((int)((wv[3] >> 4) & 0x0F0F0F0Fu), q1.w, si);
      acc += __fmul_rn(sc, __int_as_float(ds.x)) * (float)si;
    }
  }
  return acc;
}

// The sum over a segment's L lanes (every lane of it gets it).
template <int L>
__device__ __forceinline__ float seg_sum(float v) {
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

// Row o of a q4tp matrix of rows × nb groups against row xr of x', by a
// segment of L lanes (all of them call it; every lane gets the sum).
template <int L>
__device__ __forceinline__ float q4s_row(const uint8_t* __restrict__ W, int rows, int nb, int o, bool ok, int xr, int ps,
                                         const int8_t* xq, const int2* xds) {
  const uint32_t ab = q4s_ab(W, rows, nb, o, ok);
  float acc = 0.0f;
  for (int t0 = 0; t0 < nb; t0 += L * Q4S_T) {
    Q4Seg s;
    q4s_load<L>(s, W, rows, nb, o, t0, ok);
    acc = q4s_dot<L>(s, ab, nb, t0, xr, ps, xq, xds, acc);
  }
  return seg_sum<L>(acc);
}

// q4_prefetch_part: part p of P of row o's bytes (a q4tp matrix of rows ×
// nb groups) into L2: its quants' 128-byte lines p, p + P, ..., and for
// p == 0 its ladder and codes, for p == P − 1 its last quant line.
__device__ __forceinline__ void q4_prefetch_part(const uint8_t* W, int rows, int nb, int o, int p, int P) {
  const uint8_t* q = W + (size_t)o * nb * 16;
  const int n = nb * 16;
  for (int off = 128 * p; off < n; off += 128 * P) prefetch_l2(q + off);
  if (p == P - 1) prefetch_l2(q + n - 1);
  if (p == 0) {
    const size_t poff = (size_t)rows * nb * 16, coff = poff + (size_t)rows * 4;
    const int stride = (5 * nb + 7) / 8;
    prefetch_l2(W + poff + 4 * (size_t)o);
    prefetch_l2(W + coff + (size_t)o * stride);
    prefetch_l2(W + coff + (size_t)o * stride + stride - 1);
  }
}

#define MQ_PARAMS                                                                                              \
  const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, const uint8_t *__restrict__ W2, int rows0,   \
      int rows1, int rows2, int cols, const float *__restrict__ x, int ldx, int xoff, float *__restrict__ y,     \
      int ldy, const float *__restrict__ b0, const float *__restrict__ b1, const float *__restrict__ b2,         \
      int accumulate, const float *__restrict__ nw, float eps, int pro
#define MQ_ARGS W0, W1, W2, rows0, rows1, rows2, cols, x, ldx, xoff, y, ldy, b0, b1, b2, accumulate, nw, eps, pro

// mq_tensor resolves stacked row v to its tensor, the tensor's rows and
// the row within it.
struct MQRow {
  const uint8_t* W;
  const float* bias;
  int rows, o;
};
__device__ __forceinline__ MQRow mq_row(int v, const uint8_t* W0, const uint8_t* W1, const uint8_t* W2, int rows0, int rows1,
                                        int rows2, const float* b0, const float* b1, const float* b2) {
  if (v < rows0) return MQRow{W0, b0, rows0, v};
  if (v < rows0 + rows1) return MQRow{W1, b1, rows1, v - rows0};
  return MQRow{W2, b2, rows2, v - rows0 - rows1};
}

__device__ __forceinline__ void mq_store(float* y, float v, const float* bias, int o, int accumulate) {
  if (bias) v += bias[o];
  if (accumulate) v += *y;
  *y = v;
}

// The quants' plane stride in bytes: nb·16 plus 64 so the two planes of a
// block start 16 banks apart (a warp's lanes read both without conflicts).
__device__ __forceinline__ int mq_plane(int nb) { return nb * 16 + 64; }

// A batch of one weight row's loads: MQ_GB 16-byte chunks a lane (q4tp: a
// group each, with its code; q8_row: a half block each), the row's
// ladder parameters or scale, and where it is (stacked row v, batch bt).
struct MQBatch {
  uint4 w[MQ_GB];
  int code[MQ_GB];  // q4tp rows whose code stride is not a multiple of 4: each lane's codes
  uint32_t cw;      // else word lane of the batch's 640 code bits (lanes 0..19)
  uint32_t ab;
  int v, bt;
};

// q8_row's batch: the chunks and the row scale (no codes: fewer registers,
// so R = 5..8 fit the 128 a thread of a 512-thread block has).
struct MQ8Batch {
  uint4 w[MQ_GB];
  uint32_t ab;
  int v, bt;
};

template <class B>
__device__ __forceinline__ void mq_next(const B& a, B& b, int nbat, int rstep) {
  b.v = a.v, b.bt = a.bt + 1, b.ab = a.ab;
  if (b.bt == nbat) b.bt = 0, b.v = a.v + rstep;
}

template <int R>
__device__ __forceinline__ void mq_q4tp(MQ_PARAMS) {
  extern __shared__ __align__(16) uint8_t mq_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gpr = cols / 32, N = rows0 + rows1 + rows2, ps = mq_plane(gpr);
  int8_t* xq = (int8_t*)mq_smem;
  int2* xds = (int2*)(mq_smem + (size_t)R * 2 * ps);
  pdl_trigger();
  const int stride = (5 * gpr + 7) / 8;
  const int rstep = gridDim.x * MQ_WARPS;
  const int nbat = (gpr + 32 * MQ_GB - 1) / (32 * MQ_GB);
  // A batch's 128 groups have 640 code bits, 20 words of the row's codes:
  // with a code stride of whole words lane l < 20 loads word l and the
  // lanes take their groups' codes by shuffles (one load, not a byte or
  // two per group); the ladder parameters are one 32-bit load.
  const bool cvec = stride % 4 == 0;
  auto load = [&](MQBatch& b) {
    const bool in = b.v < N;
    const MQRow t = mq_row(in ? b.v : 0, W0, W1, W2, rows0, rows1, rows2, b0, b1, b2);
    const size_t poff = (size_t)t.rows * gpr * 16, coff = poff + (size_t)t.rows * 4;
    const uint8_t* crow = t.W + coff + (size_t)t.o * stride;
#pragma unroll
    for (int j = 0; j < MQ_GB; j++) {
      const int g = (b.bt * MQ_GB + j) * 32 + lane;
      const bool on = in && g < gpr;
      b.w[j] = on ? __ldcs((const uint4*)(t.W + ((size_t)t.o * gpr + g) * 16)) : make_uint4(0, 0, 0, 0);
      b.code[j] = (on && !cvec) ? q4tp_code(crow, g) : 0;
    }
    b.cw = 0;
    if (cvec && in && lane < 20) {
      const int off = b.bt * 80 + 4 * lane;
      if (off + 4 <= stride) b.cw = *(const uint32_t*)(crow + off);
      else
        for (int k = 0; off + k < stride && k < 4; k++) b.cw |= (uint32_t)crow[off + k] << (8 * k);
    }
    if (b.bt == 0 && in) b.ab = *(const uint32_t*)(t.W + poff + 4 * (size_t)t.o);
  };
  // Three batches: the one computed and two in flight.
  MQBatch c0, c1, c2;
  c0.v = blockIdx.x * MQ_WARPS + warp, c0.bt = 0, c0.ab = 0;
  load(c0);
  mq_next(c0, c1, nbat, rstep);
  load(c1);
  mq_norm_prefetch(pro, nw, cols);
  pdl_wait();
  mq_prologue<R, true>(x, ldx, xoff, cols, gpr, ps, pro, nw, eps, xq, xds);
  float lad = 0.0f, acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  while (c0.v < N) {  // warp-uniform
    mq_next(c1, c2, nbat, rstep);
    load(c2);
    if (c0.bt == 0) lad = q4tp_rung((uint16_t)(c0.ab & 0xffff), (uint16_t)(c0.ab >> 16), lane);
#pragma unroll
    for (int j = 0; j < MQ_GB; j++) {
      const int g = (c0.bt * MQ_GB + j) * 32 + lane;
      int code = c0.code[j];
      if (cvec) {
        const int bit = 5 * (j * 32 + lane);
        const uint32_t lo = __shfl_sync(FULL_MASK, c0.cw, bit >> 5), hi = __shfl_sync(FULL_MASK, c0.cw, (bit >> 5) + 1);
        code = (int)(__funnelshift_r(lo, hi, bit & 31) & 31u);
      }
      const float sc = __shfl_sync(FULL_MASK, lad, code);
      if (g < gpr) {
        const uint32_t wv[4] = {c0.w[j].x, c0.w[j].y, c0.w[j].z, c0.w[j].w};
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; k++) lo[k] = wv[k] & 0x0F0F0F0Fu, hi[k] = (wv[k] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int r = 0; r < R; r++) {
          const int4 q0 = *(const int4*)(xq + (size_t)(2 * r) * ps + (size_t)g * 16);
          const int4 q1 = *(const int4*)(xq + (size_t)(2 * r + 1) * ps + (size_t)g * 16);
          const int2 ds = xds[r * gpr + g];
          int s = -8 * ds.y;
          s = __dp4a((int)lo[0], q0.x, s); s = __dp4a((int)hi[0], q0.y, s);
          s = __dp4a((int)lo[1], q0.z, s); s = __dp4a((int)hi[1], q0.w, s);
          s = __dp4a((int)lo[2], q1.x, s); s = __dp4a((int)hi[2], q1.y, s);
          s = __dp4a((int)lo[3], q1.z, s); s = __dp4a((int)hi[3], q1.w, s);
          acc[r] += __fmul_rn(sc, __int_as_float(ds.x)) * (float)s;
        }
      }
    }
    if (c0.bt == nbat - 1) {
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
      if (lane == 0) {
        const MQRow t = mq_row(c0.v, W0, W1, W2, rows0, rows1, rows2, b0, b1, b2);
#pragma unroll
        for (int r = 0; r < R; r++) mq_store(y + (size_t)r * ldy + c0.v, acc[r], t.bias, t.o, accumulate);
      }
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] = 0.0f;
    }
    c0 = c1, c1 = c2;
  }
}

// q8_row: a lane per 16-byte chunk (half a block of 32 quants), MQ_GB
// chunks a batch, consecutive lanes on consecutive chunks. Rows that are
// not whole 16-byte chunks (or a tensor not 16-byte aligned) read
// byte-wise.
template <int R>
__device__ __forceinline__ void mq_q8row(MQ_PARAMS) {
  extern __shared__ __align__(16) uint8_t mq_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nb = (cols + 31) / 32, nch = (cols + 15) / 16, N = rows0 + rows1 + rows2, ps = mq_plane(nb);
  int8_t* xq = (int8_t*)mq_smem;
  int2* xds = (int2*)(mq_smem + (size_t)R * 2 * ps);
  pdl_trigger();
  const bool vec = aligned16(W0) && (rows1 == 0 || aligned16(W1)) && (rows2 == 0 || aligned16(W2)) && cols % 16 == 0;
  const int rstep = gridDim.x * MQ_WARPS;
  const int nbat = (nch + 32 * MQ_GB - 1) / (32 * MQ_GB);
  auto load = [&](MQ8Batch& b) {
    const bool in = b.v < N;
    const MQRow t = mq_row(in ? b.v : 0, W0, W1, W2, rows0, rows1, rows2, b0, b1, b2);
#pragma unroll
    for (int j = 0; j < MQ_GB; j++) {
      const int c = (b.bt * MQ_GB + j) * 32 + lane;
      b.w[j] = (vec && in && c < nch) ? __ldcs((const uint4*)(t.W + (size_t)t.o * cols + 16 * (size_t)c)) : make_uint4(0, 0, 0, 0);
    }
    if (b.bt == 0 && in)
      b.ab = vec ? *(const uint16_t*)(t.W + (size_t)t.rows * cols + 2 * (size_t)t.o) : ld_u16(t.W + (size_t)t.rows * cols + 2 * (size_t)t.o);
  };
  MQ8Batch c0, c1, c2;
  c0.v = blockIdx.x * MQ_WARPS + warp, c0.bt = 0, c0.ab = 0;
  load(c0);
  mq_next(c0, c1, nbat, rstep);
  load(c1);
  mq_norm_prefetch(pro, nw, cols);
  pdl_wait();
  mq_prologue<R, false>(x, ldx, xoff, cols, nb, ps, pro, nw, eps, xq, xds);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  while (c0.v < N) {  // warp-uniform
    mq_next(c1, c2, nbat, rstep);
    load(c2);
#pragma unroll
    for (int j = 0; j < MQ_GB; j++) {
      const int c = (c0.bt * MQ_GB + j) * 32 + lane;
      if (c < nch) {
        const int b = c >> 1, h = c & 1;
        if (vec) {
          const uint4 w = c0.w[j];
#pragma unroll
          for (int r = 0; r < R; r++) {
            const int4 q = *(const int4*)(xq + (size_t)(2 * r + h) * ps + (size_t)b * 16);
            int s = 0;
            s = __dp4a((int)w.x, q.x, s); s = __dp4a((int)w.y, q.y, s);
            s = __dp4a((int)w.z, q.z, s); s = __dp4a((int)w.w, q.w, s);
            acc[r] += __int_as_float(xds[r * nb + b].x) * (float)s;
          }
        } else {
          const MQRow t = mq_row(c0.v, W0, W1, W2, rows0, rows1, rows2, b0, b1, b2);
          const uint8_t* row = t.W + (size_t)t.o * cols;
#pragma unroll
          for (int r = 0; r < R; r++) {
            int s = 0;
            for (int i = 16 * c; i < min(cols, 16 * c + 16); i++)
              s += (int)(int8_t)row[i] * (int)xq[(size_t)(2 * r + h) * ps + (size_t)b * 16 + (i & 15)];
            acc[r] += __int_as_float(xds[r * nb + b].x) * (float)s;
          }
        }
      }
    }
    if (c0.bt == nbat - 1) {
      const float rs = f16_to_f32((uint16_t)c0.ab);
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
      if (lane == 0) {
        const MQRow t = mq_row(c0.v, W0, W1, W2, rows0, rows1, rows2, b0, b1, b2);
#pragma unroll
        for (int r = 0; r < R; r++) mq_store(y + (size_t)r * ldy + c0.v, acc[r] * rs, t.bias, t.o, accumulate);
      }
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] = 0.0f;
    }
    c0 = c1, c1 = c2;
  }
}

#define MQ_KERNELS(R)                                                                                        \
  extern "C" __global__ void __launch_bounds__(512, 1) mv_q8row_r##R(MQ_PARAMS) { mq_q8row<R>(MQ_ARGS); }     \
  extern "C" __global__ void __launch_bounds__(512, 1) mv_q4tp_r##R(MQ_PARAMS) { mq_q4tp<R>(MQ_ARGS); }

MQ_KERNELS(1)
MQ_KERNELS(2)
MQ_KERNELS(3)
MQ_KERNELS(4)
MQ_KERNELS(5)
MQ_KERNELS(6)
MQ_KERNELS(7)
MQ_KERNELS(8)

#define MV_PARAMS                                                                                          \
  const uint8_t *__restrict__ W, int rows, int cols, const float *__restrict__ x, int ldx, float *__restrict__ y, \
      int ldy, const float *__restrict__ bias, int accumulate
#define MV_ARGS W, rows, cols, x, ldx, y, ldy, bias, accumulate

#define MV_KERNELS(R)                                                                                          \
  extern "C" __global__ void __launch_bounds__(128) mv_f32_r##R(MV_PARAMS) { mv_plain<R, FmtF32>(MV_ARGS); }   \
  extern "C" __global__ void __launch_bounds__(128) mv_f16_r##R(MV_PARAMS) { mv_plain<R, FmtF16>(MV_ARGS); }   \
  extern "C" __global__ void __launch_bounds__(128) mv_bf16_r##R(MV_PARAMS) { mv_plain<R, FmtBF16>(MV_ARGS); }

MV_KERNELS(1)
MV_KERNELS(2)
MV_KERNELS(3)
MV_KERNELS(4)
MV_KERNELS(5)
MV_KERNELS(6)
MV_KERNELS(7)
MV_KERNELS(8)

// q82f_prescale: xs[r][i] = x[r][i]·col[i], col the q8_2f column field read
// from the tensor's bytes at colOffset (= align4(rows·cols + 2·rows)).
// Launch: grid (⌈cols/256⌉, R), block 256.
extern "C" __global__ void q82f_prescale(const uint8_t* __restrict__ W, long long colOffset, int cols,
                                         const float* __restrict__ x, int ldx, float* __restrict__ xs, int ldxs) {
  pdl_trigger();
  const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (i >= cols) return;
  const float c = ld_f32(W + colOffset + 4 * (size_t)i);
  pdl_wait();
  xs[(size_t)r * ldxs + i] = x[(size_t)r * ldx + i] * c;
}

// mm_{f32,f16,bf16}: Y[t][o] (=|+=) Σ_k W[o,k]·X[t][k] (+ bias[o]) for T
// activation rows over float weights, in float32 FMAs: the steps of more
// than 8 rows (prefill chunks, large batches) where the mv_*_r8 launches
// would re-read W for every 8 rows with ⌈rows/8⌉ blocks (a float router
// over a 512-row chunk: 64 launches of 16 blocks). Exact float32
// arithmetic, unlike gemm_*'s bf16 tensor cores: routing decisions stay
// the matvec's (the sums differ from it only in their order).
// A block of 256 threads takes 32 weight rows × TT tokens (mm_*: 32,
// mm_*_t16: 16, for grids that would not fill the GPU): each K chunk of
// MM_K columns is staged in shared memory (the next chunk's loads in flight
// during the FMAs), and 256 / (2·TT) slices of 2·TT threads each take a
// share of the chunk, a thread 4 rows × 4 tokens of it; the slices' sums
// are added in slice order at the end (deterministic). Params as gemm_*:
// (W, rows, cols, x, ldx, y, ldy, T, bias, accumulate). Launch: grid
// (⌈rows/32⌉, ⌈T/TT⌉), block 256 (kern.FloatMatmulLaunch). The 16-byte
// path needs W and x 16-byte aligned, ldx % 4 == 0 and cols % 8 == 0; else
// element loads.
#define MM_T 32
#define MM_K 64

template <class F>
__device__ __forceinline__ void mm_load8(const uint8_t* row, int k, float* w) {
  if constexpr (F::E == 8) {
    F::decode(*(const uint4*)(row + (size_t)k * F::ES), w);
  } else {
    F::decode(*(const uint4*)(row + (size_t)k * F::ES), w);
    F::decode(*(const uint4*)(row + (size_t)k * F::ES + 16), w + 4);
  }
}

template <class F, int TT>
__device__ __forceinline__ void mm_body(const uint8_t* __restrict__ W, int rows, int cols, const float* __restrict__ x,
                                        int ldx, float* __restrict__ y, int ldy, int T, const float* __restrict__ bias,
                                        int accumulate) {
  constexpr int ST = 2 * TT, NS = 256 / ST, KS = MM_K / NS;  // threads a slice, slices, columns a slice
  constexpr int EX = TT * MM_K / 256, XR = MM_K / EX;        // x columns a thread loads, loaders a token
  constexpr int TILES = (MM_T + TT) * (MM_K + 4), RED = (NS - 1) * 16 * ST;
  static_assert(KS % 4 == 0 && EX % 4 == 0 && TT % 4 == 0, "mm tile");
  __shared__ __align__(16) float sm[TILES > RED ? TILES : RED];
  float(*ws)[MM_K + 4] = reinterpret_cast<float(*)[MM_K + 4]>(sm);
  float(*xs)[MM_K + 4] = reinterpret_cast<float(*)[MM_K + 4]>(sm + MM_T * (MM_K + 4));
  pdl_trigger();
  const int tid = threadIdx.x, sl = tid / ST, l = tid % ST, tx = l & 7, ty = l >> 3;
  const int o0 = blockIdx.x * MM_T, t0 = blockIdx.y * TT;
  const size_t rb = (size_t)cols * F::ES;
  const bool vec = aligned16(W) && rb % 16 == 0 && aligned16(x) && ldx % 4 == 0 && cols % 8 == 0;
  // The loaders: 8 consecutive columns of one weight row, EX of one token.
  const int lr = tid >> 3, lk = (tid & 7) * 8, xr = tid / XR, xk = (tid % XR) * EX;
  const uint8_t* wrow = W + (size_t)min(o0 + lr, rows - 1) * rb;
  const float* xrow = x + (size_t)min(t0 + xr, T - 1) * ldx;
  float wv[8], xv[EX];
  auto load_w = [&](int k0) {
    const int k = k0 + lk;
    if (vec) {
      if (k < cols) {
        mm_load8<F>(wrow, k, wv);
      } else {
#pragma unroll
        for (int j = 0; j < 8; j++) wv[j] = 0.0f;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; j++) wv[j] = k + j < cols ? F::scalar(wrow, k + j) : 0.0f;
    }
  };
  auto load_x = [&](int k0) {
    const int k = k0 + xk;
    if (vec) {
#pragma unroll
      for (int q = 0; q < EX / 4; q++) {
        const float4 a = k < cols ? *(const float4*)(xrow + k + 4 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
        xv[4 * q] = a.x; xv[4 * q + 1] = a.y; xv[4 * q + 2] = a.z; xv[4 * q + 3] = a.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < EX; j++) xv[j] = k + j < cols ? xrow[k + j] : 0.0f;
    }
  };
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
  load_w(0);  // weights never depend on the previous kernel; x does
  pdl_wait();
  load_x(0);
  for (int k0 = 0; k0 < cols; k0 += MM_K) {
    __syncthreads();  // the previous chunk's FMAs are done with the tiles
    *(float4*)&ws[lr][lk] = make_float4(wv[0], wv[1], wv[2], wv[3]);
    *(float4*)&ws[lr][lk + 4] = make_float4(wv[4], wv[5], wv[6], wv[7]);
#pragma unroll
    for (int q = 0; q < EX / 4; q++) *(float4*)&xs[xr][xk + 4 * q] = make_float4(xv[4 * q], xv[4 * q + 1], xv[4 * q + 2], xv[4 * q + 3]);
    __syncthreads();
    if (k0 + MM_K < cols) {
      load_w(k0 + MM_K);
      load_x(k0 + MM_K);
    }
#pragma unroll
    for (int q = 0; q < KS / 4; q++) {
      const int kk = sl * KS + 4 * q;
      float4 a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; i++) a[i] = *(const float4*)&ws[tx + 8 * i][kk];
#pragma unroll
      for (int j = 0; j < 4; j++) b[j] = *(const float4*)&xs[ty + (TT / 4) * j][kk];
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
          float s = acc[i][j];
          s = fmaf(a[i].x, b[j].x, s);
          s = fmaf(a[i].y, b[j].y, s);
          s = fmaf(a[i].z, b[j].z, s);
          s = fmaf(a[i].w, b[j].w, s);
          acc[i][j] = s;
        }
    }
  }
  // Slices 1.. hand their sums to slice 0 (slot (i·4 + j)·ST + l of their
  // share of the tiles' memory: conflict-free), which adds them in order.
  __syncthreads();
  if (sl > 0) {
    float* red = sm + (sl - 1) * 16 * ST;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) red[(i * 4 + j) * ST + l] = acc[i][j];
  }
  __syncthreads();
  if (sl > 0) return;
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int o = o0 + tx + 8 * i, t = t0 + ty + (TT / 4) * j;
      float v = acc[i][j];
#pragma unroll
      for (int s = 0; s < NS - 1; s++) v += sm[s * 16 * ST + (i * 4 + j) * ST + l];
      if (o < rows && t < T) mv_store(y + (size_t)t * ldy + o, v, bias, o, accumulate);
    }
}

#define MM_PARAMS                                                                                            \
  const uint8_t *__restrict__ W, int rows, int cols, const float *__restrict__ x, int ldx, float *__restrict__ y, \
      int ldy, int T, const float *__restrict__ bias, int accumulate
#define MM_ARGS W, rows, cols, x, ldx, y, ldy, T, bias, accumulate
#define MM_KERNELS(name, F)                                                                                    \
  extern "C" __global__ void __launch_bounds__(256) mm_##name(MM_PARAMS) { mm_body<F, 32>(MM_ARGS); }         \
  extern "C" __global__ void __launch_bounds__(256) mm_##name##_t16(MM_PARAMS) { mm_body<F, 16>(MM_ARGS); }
MM_KERNELS(f32, FmtF32)
MM_KERNELS(f16, FmtF16)
MM_KERNELS(bf16, FmtBF16)
