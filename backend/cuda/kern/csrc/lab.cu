// Kernel lab variants (issue 10): candidate decode matvecs y = W·x for one
// activation row over the bytes CMF stores, timed by package lab against the
// production kernels (mv_q4tp_r1, mv_q8row_r1 of matvec.cu, arm 0). None of
// them is used by the engine; a winner is promoted into matvec.cu with the
// lab output that justified it (docs/lab/).
//
// Common signature of the single-tensor kernels: (W, rows, cols, x, y), W
// 16-byte aligned, x 16-byte aligned float32[cols], y float32[rows]. Launch:
// block 128 (4 warps), grid ⌈rows / (4·RPW)⌉ with RPW the rows per warp
// named at each kernel (lab.go's table holds the same numbers). q4tp needs
// cols % 32 == 0. Every kernel triggers its dependents at entry and reads x
// only after griddepcontrol.wait (PDL: weights may be fetched early).
//
// q4tp layout (docs/quant.md): rows·gpr groups of 16 nibble bytes (element
// 8j+n of a group is nibble n of little-endian word j, value − 8), then per
// row two f16 (a, b) of its ladder exp2(a + k·b), then per row ⌈5·gpr/8⌉
// bytes of 5-bit rung codes.
#include "common.cuh"

#define LAB_WARPS 4

struct Q4Row {
  const uint8_t* W;
  size_t poff, coff;
  int gpr, stride;
  __device__ Q4Row(const uint8_t* w, int rows, int cols) : W(w) {
    gpr = cols / 32;
    poff = (size_t)rows * gpr * 16;
    coff = poff + (size_t)rows * 4;
    stride = (5 * gpr + 7) / 8;
  }
  __device__ float rung(int o, int k) const { return q4tp_rung(ld_u16(W + poff + 4 * (size_t)o), ld_u16(W + poff + 4 * (size_t)o + 2), k); }
  __device__ int code(int o, int g) const { return q4tp_code(W + coff + (size_t)o * stride, g); }
  __device__ const uint8_t* group(int o, int g) const { return W + ((size_t)o * gpr + g) * 16; }
};

// Production order of one group: w = nibble − 8, gs = Σ_e w·x in element
// order (the same expression as matvec.cu, so the same FMAs).
__device__ __forceinline__ float q4_group_dot(uint4 c, const float* xr) {
  uint32_t v[4] = {c.x, c.y, c.z, c.w};
  float xv[32];
#pragma unroll
  for (int q = 0; q < 8; q++) {
    float4 t = ((const float4*)xr)[q];
    xv[4 * q] = t.x; xv[4 * q + 1] = t.y; xv[4 * q + 2] = t.z; xv[4 * q + 3] = t.w;
  }
  float gs = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; j++)
#pragma unroll
    for (int n = 0; n < 8; n++) gs += (float)((int)((v[j] >> (4 * n)) & 15u) - 8) * xv[8 * j + n];
  return gs;
}

// Masked nibbles of a word's low half: elements 4h..4h+3 of the word as
// n·16^k (k = 0..3), used against x prescaled by 16^-k.
__device__ __forceinline__ float nib_dot4(uint32_t u, float4 xs) {
  return (float)(u & 0xFu) * xs.x + (float)(u & 0xF0u) * xs.y + (float)(u & 0xF00u) * xs.z + (float)(u & 0xF000u) * xs.w;
}
__device__ __forceinline__ float4 prescale(float4 t) {
  return make_float4(t.x, t.y * (1.0f / 16.0f), t.z * (1.0f / 256.0f), t.w * (1.0f / 4096.0f));
}

// lab_q4_cur: the seed's `cur` — 4 rows per warp, the rows' ladders in
// shared memory (one barrier), one lane per group, no double buffering. RPW 4.
extern "C" __global__ void __launch_bounds__(128) lab_q4_cur(const uint8_t* __restrict__ W, int rows, int cols,
                                                             const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float lad[LAB_WARPS * 4 * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int o0 = (blockIdx.x * LAB_WARPS + warp) * 4;
  pdl_trigger();
  const Q4Row T(W, rows, cols);
  const int nr = o0 < rows ? min(rows - o0, 4) : 0;
  for (int a = 0; a < nr; a++) lad[(warp * 4 + a) * 32 + lane] = T.rung(o0 + a, lane);
  __syncthreads();
  if (nr == 0) return;
  pdl_wait();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int g = lane; g < T.gpr; g += 32) {
    const float* xr = x + (size_t)g * 32;
#pragma unroll
    for (int a = 0; a < 4; a++) {
      if (a >= nr) break;
      const uint4 c = *(const uint4*)T.group(o0 + a, g);
      acc[a] += q4_group_dot(c, xr) * lad[(warp * 4 + a) * 32 + T.code(o0 + a, g)];
    }
  }
#pragma unroll
  for (int a = 0; a < 4; a++) acc[a] = warp_sum(acc[a]);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = acc[a];
}

// lab_q4_shf: the seed's `shf` — as cur, but the ladder rung lives in a
// register of lane k and is fetched by warp shuffle (no shared memory, no
// barrier). Same order as production: expected bitwise. RPW 4.
extern "C" __global__ void __launch_bounds__(128) lab_q4_shf(const uint8_t* __restrict__ W, int rows, int cols,
                                                             const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int o0 = (blockIdx.x * LAB_WARPS + warp) * 4;
  pdl_trigger();
  if (o0 >= rows) return;
  const Q4Row T(W, rows, cols);
  const int nr = min(rows - o0, 4);
  float lad[4];
#pragma unroll
  for (int a = 0; a < 4; a++) lad[a] = T.rung(o0 + min(a, nr - 1), lane);
  pdl_wait();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int g0 = 0; g0 < T.gpr; g0 += 32) {
    const int g = g0 + lane;
    const bool on = g < T.gpr;
    const int gg = on ? g : 0;
#pragma unroll
    for (int a = 0; a < 4; a++) {
      const int o = o0 + min(a, nr - 1);
      const float sc = __shfl_sync(FULL_MASK, lad[a], on ? T.code(o, gg) : 0);
      if (on) acc[a] += q4_group_dot(*(const uint4*)T.group(o, gg), x + (size_t)gg * 32) * sc;
    }
  }
#pragma unroll
  for (int a = 0; a < 4; a++) acc[a] = warp_sum(acc[a]);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = acc[a];
}

// Two lanes per group (16 weights, 8 bytes each), 16 groups per warp step:
// more lanes busy when a row has few groups. RPS rows per warp; masked
// selects the llama.cpp masked-nibble dot (x prescaled by 16^-k, −8·Σx per
// half group) instead of the production decode.
template <int RPS, bool masked>
__device__ __forceinline__ void q4_half_rows(const Q4Row& T, int rows, const float* __restrict__ x, float* __restrict__ y,
                                             int o0, int lane) {
  const int nr = min(rows - o0, RPS);
  float lad[RPS], acc[RPS];
#pragma unroll
  for (int a = 0; a < RPS; a++) {
    lad[a] = T.rung(o0 + min(a, nr - 1), lane);
    acc[a] = 0.0f;
  }
  pdl_wait();
  const int hh = lane & 1;
  for (int g0 = 0; g0 < T.gpr; g0 += 16) {
    const int g = g0 + (lane >> 1);
    const bool on = g < T.gpr;
    const int gg = on ? g : 0;
    const float4* xv = (const float4*)(x + (size_t)gg * 32 + hh * 16);
    float4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
    float m8 = 0.0f;
    if (masked) {
      m8 = -8.0f * ((x0.x + x0.y + x0.z + x0.w) + (x1.x + x1.y + x1.z + x1.w) + (x2.x + x2.y + x2.z + x2.w) +
                    (x3.x + x3.y + x3.z + x3.w));
      x0 = prescale(x0); x1 = prescale(x1); x2 = prescale(x2); x3 = prescale(x3);
    }
#pragma unroll
    for (int a = 0; a < RPS; a++) {
      const int o = o0 + min(a, nr - 1);
      const float sc = __shfl_sync(FULL_MASK, lad[a], on ? T.code(o, gg) : 0);
      const uint2 b = *(const uint2*)(T.group(o, gg) + hh * 8);
      float gs;
      if (masked) {
        gs = nib_dot4(b.x, x0) + nib_dot4(b.x >> 16, x1) + nib_dot4(b.y, x2) + nib_dot4(b.y >> 16, x3) + m8;
      } else {
        const float xs[16] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w, x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        const uint32_t v[2] = {b.x, b.y};
        gs = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
          for (int n = 0; n < 8; n++) gs += (float)((int)((v[j] >> (4 * n)) & 15u) - 8) * xs[8 * j + n];
      }
      if (on) acc[a] += gs * sc;
    }
  }
#pragma unroll
  for (int a = 0; a < RPS; a++) acc[a] = warp_sum(acc[a]);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = acc[a];
}

// lab_q4_hlf: the seed's `hlf`, two lanes per group, production decode. RPW 4.
extern "C" __global__ void __launch_bounds__(128) lab_q4_hlf(const uint8_t* __restrict__ W, int rows, int cols,
                                                             const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, o0 = (blockIdx.x * LAB_WARPS + (threadIdx.x >> 5)) * 4;
  pdl_trigger();
  if (o0 >= rows) return;
  q4_half_rows<4, false>(Q4Row(W, rows, cols), rows, x, y, o0, lane);
}

// lab_q4_hma: the seed's `hma`, two lanes per group with the masked-nibble dot. RPW 4.
extern "C" __global__ void __launch_bounds__(128) lab_q4_hma(const uint8_t* __restrict__ W, int rows, int cols,
                                                             const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, o0 = (blockIdx.x * LAB_WARPS + (threadIdx.x >> 5)) * 4;
  pdl_trigger();
  if (o0 >= rows) return;
  q4_half_rows<4, true>(Q4Row(W, rows, cols), rows, x, y, o0, lane);
}

// lab_q4_hlfm: the seed's `hlfm` — up to three tensors sharing x (q|k|v,
// gate|up) in one launch: rows [0,ra) of A, then B, then C, outputs at
// y[0..ra), y[ra..ra+rb), y[ra+rb..). Params (A, B, C, ra, rb, rc, cols, x,
// y); rb, rc may be 0. Grid ⌈(ra+rb+rc)/16⌉ over whole 4-row warps of each
// tensor (so ⌈ra/4⌉+⌈rb/4⌉+⌈rc/4⌉ warps). RPW 4.
extern "C" __global__ void __launch_bounds__(128) lab_q4_hlfm(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B,
                                                              const uint8_t* __restrict__ C, int ra, int rb, int rc, int cols,
                                                              const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  int w = blockIdx.x * LAB_WARPS + (threadIdx.x >> 5);
  pdl_trigger();
  const int wa = (ra + 3) / 4, wb = (rb + 3) / 4, wc = (rc + 3) / 4;
  if (w < wa) { q4_half_rows<4, false>(Q4Row(A, ra, cols), ra, x, y, 4 * w, lane); return; }
  w -= wa;
  if (w < wb) { q4_half_rows<4, false>(Q4Row(B, rb, cols), rb, x, y + ra, 4 * w, lane); return; }
  w -= wb;
  if (w < wc) q4_half_rows<4, false>(Q4Row(C, rc, cols), rc, x, y + ra + rb, 4 * w, lane);
}

// One lane per group with the masked-nibble dot (x prescaled by 16^-k, −8·Σx
// per group folded in), RPS rows per warp, ladder in registers.
template <int RPS>
__device__ __forceinline__ void q4_masked_rows(const uint8_t* __restrict__ W, int rows, int cols, const float* __restrict__ x,
                                               float* __restrict__ y) {
  const int lane = threadIdx.x & 31, o0 = (blockIdx.x * LAB_WARPS + (threadIdx.x >> 5)) * RPS;
  pdl_trigger();
  if (o0 >= rows) return;
  const Q4Row T(W, rows, cols);
  const int nr = min(rows - o0, RPS);
  float lad[RPS], acc[RPS];
#pragma unroll
  for (int a = 0; a < RPS; a++) {
    lad[a] = T.rung(o0 + min(a, nr - 1), lane);
    acc[a] = 0.0f;
  }
  pdl_wait();
  for (int g0 = 0; g0 < T.gpr; g0 += 32) {
    const int g = g0 + lane;
    const bool on = g < T.gpr;
    const int gg = on ? g : 0;
    const float4* xv = (const float4*)(x + (size_t)gg * 32);
    float4 xs[8];
    float m8 = 0.0f;
#pragma unroll
    for (int q = 0; q < 8; q++) {
      const float4 t = xv[q];
      m8 += (t.x + t.y) + (t.z + t.w);
      xs[q] = prescale(t);
    }
    m8 *= -8.0f;
#pragma unroll
    for (int a = 0; a < RPS; a++) {
      const int o = o0 + min(a, nr - 1);
      const float sc = __shfl_sync(FULL_MASK, lad[a], on ? T.code(o, gg) : 0);
      const uint4 b = *(const uint4*)T.group(o, gg);
      const float gs = nib_dot4(b.x, xs[0]) + nib_dot4(b.x >> 16, xs[1]) + nib_dot4(b.y, xs[2]) + nib_dot4(b.y >> 16, xs[3]) +
                       nib_dot4(b.z, xs[4]) + nib_dot4(b.z >> 16, xs[5]) + nib_dot4(b.w, xs[6]) + nib_dot4(b.w >> 16, xs[7]);
      if (on) acc[a] += (gs + m8) * sc;
    }
  }
#pragma unroll
  for (int a = 0; a < RPS; a++) acc[a] = warp_sum(acc[a]);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = acc[a];
}

// lab_q4_lma: the seed's `lma`, masked nibbles, one lane per group, 2 rows per warp (production's shape). RPW 2.
extern "C" __global__ void __launch_bounds__(128) lab_q4_lma(const uint8_t* __restrict__ W, int rows, int cols,
                                                             const float* __restrict__ x, float* __restrict__ y) {
  q4_masked_rows<2>(W, rows, cols, x, y);
}
// lab_q4_lmb: masked nibbles, 4 rows per warp. RPW 4.
extern "C" __global__ void __launch_bounds__(128) lab_q4_lmb(const uint8_t* __restrict__ W, int rows, int cols,
                                                             const float* __restrict__ x, float* __restrict__ y) {
  q4_masked_rows<4>(W, rows, cols, x, y);
}
// lab_q4_lm8: masked nibbles, 8 rows per warp. RPW 8.
extern "C" __global__ void __launch_bounds__(128) lab_q4_lm8(const uint8_t* __restrict__ W, int rows, int cols,
                                                             const float* __restrict__ x, float* __restrict__ y) {
  q4_masked_rows<8>(W, rows, cols, x, y);
}

// lab_q4_lmd: masked nibbles in production's memory pattern — 2 rows a
// warp, a lane per group, the next step's 16-byte weight loads issued
// (streaming, __ldcs) before this step's math, the first before the PDL
// wait: isolates the math from the access pattern against prod. RPW 2.
extern "C" __global__ void __launch_bounds__(128) lab_q4_lmd(const uint8_t* __restrict__ W, int rows, int cols,
                                                             const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, o0 = (blockIdx.x * LAB_WARPS + (threadIdx.x >> 5)) * 2;
  pdl_trigger();
  if (o0 >= rows) return;
  const Q4Row T(W, rows, cols);
  const int nr = min(rows - o0, 2);
  float lad[2], acc[2] = {0.0f, 0.0f};
  uint4 cur[2], nxt[2];
#pragma unroll
  for (int a = 0; a < 2; a++) {
    const int o = o0 + min(a, nr - 1);
    lad[a] = T.rung(o, lane);
    cur[a] = lane < T.gpr ? __ldcs((const uint4*)T.group(o, lane)) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  for (int g0 = 0; g0 < T.gpr; g0 += 32) {
    const int g = g0 + lane;
    const bool on = g < T.gpr;
    const int gg = on ? g : 0;
#pragma unroll
    for (int a = 0; a < 2; a++)
      nxt[a] = g + 32 < T.gpr ? __ldcs((const uint4*)T.group(o0 + min(a, nr - 1), g + 32)) : make_uint4(0, 0, 0, 0);
    const float4* xv = (const float4*)(x + (size_t)gg * 32);
    float4 xs[8];
    float m8 = 0.0f;
#pragma unroll
    for (int q = 0; q < 8; q++) {
      const float4 t = xv[q];
      m8 += (t.x + t.y) + (t.z + t.w);
      xs[q] = prescale(t);
    }
    m8 *= -8.0f;
#pragma unroll
    for (int a = 0; a < 2; a++) {
      const int o = o0 + min(a, nr - 1);
      const float sc = __shfl_sync(FULL_MASK, lad[a], on ? T.code(o, gg) : 0);
      const uint4 b = cur[a];
      const float gs = nib_dot4(b.x, xs[0]) + nib_dot4(b.x >> 16, xs[1]) + nib_dot4(b.y, xs[2]) + nib_dot4(b.y >> 16, xs[3]) +
                       nib_dot4(b.z, xs[4]) + nib_dot4(b.z >> 16, xs[5]) + nib_dot4(b.w, xs[6]) + nib_dot4(b.w >> 16, xs[7]);
      if (on) acc[a] += (gs + m8) * sc;
      cur[a] = nxt[a];
    }
  }
#pragma unroll
  for (int a = 0; a < 2; a++) acc[a] = warp_sum(acc[a]);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = acc[a];
}

// lab_quant_x: int8 activations for the dp4a forms, once per matvec input
// (llama.cpp's q8_1 for mmvq): per block of 32, d = absmax/127, q = round(x/d),
// xq[32·b ..] the quants, xd[2b] = d, xd[2b+1] = Σq (as float). perm != 0
// stores each 8 quants as (0,2,4,6,1,3,5,7), the order of a q4tp word's low
// and high nibbles. cols need not be a multiple of 32 (the tail is zero).
// Params (x, cols, xq, xd, perm). Launch: grid ⌈cols/32 / 4⌉, block 128 (a warp per block, a lane per element).
extern "C" __global__ void __launch_bounds__(128) lab_quant_x(const float* __restrict__ x, int cols, int8_t* __restrict__ xq,
                                                              float* __restrict__ xd, int perm) {
  const int lane = threadIdx.x & 31, b = blockIdx.x * LAB_WARPS + (threadIdx.x >> 5);
  pdl_trigger();
  if (b * 32 >= cols) return;
  pdl_wait();
  const int i = b * 32 + lane;
  const float v = i < cols ? x[i] : 0.0f;
  const float am = warp_max(fabsf(v));
  const float d = am / 127.0f;
  const int q = am > 0.0f ? __float2int_rn(v / d) : 0;
  int s = q;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
  const int e = lane & 7;
  const int pos = perm ? (lane & ~7) + (e >> 1) + 4 * (e & 1) : lane;
  xq[b * 32 + pos] = (int8_t)q;
  if (lane == 0) {
    xd[2 * b] = d;
    xd[2 * b + 1] = (float)s;
  }
}

// lab_q4_dp4a: q4tp against int8 activations (lab_quant_x with perm=1): per
// group Σ n·q by four dp4a on the masked low and shifted high nibbles,
// then rung·d·(Σ n·q − 8·Σq). One lane per group, 2 rows per warp. Params
// (W, rows, cols, xq, xd, y). RPW 2.
extern "C" __global__ void __launch_bounds__(128) lab_q4_dp4a(const uint8_t* __restrict__ W, int rows, int cols,
                                                              const int8_t* __restrict__ xq, const float* __restrict__ xd,
                                                              float* __restrict__ y) {
  const int lane = threadIdx.x & 31, o0 = (blockIdx.x * LAB_WARPS + (threadIdx.x >> 5)) * 2;
  pdl_trigger();
  if (o0 >= rows) return;
  const Q4Row T(W, rows, cols);
  const int nr = min(rows - o0, 2);
  float lad[2], acc[2] = {0.0f, 0.0f};
#pragma unroll
  for (int a = 0; a < 2; a++) lad[a] = T.rung(o0 + min(a, nr - 1), lane);
  pdl_wait();
  for (int g0 = 0; g0 < T.gpr; g0 += 32) {
    const int g = g0 + lane;
    const bool on = g < T.gpr;
    const int gg = on ? g : 0;
    const int4* qp = (const int4*)(xq + (size_t)gg * 32);
    const int4 q0 = qp[0], q1 = qp[1];
    const int qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const float d = xd[2 * gg], m8 = -8.0f * xd[2 * gg + 1];
#pragma unroll
    for (int a = 0; a < 2; a++) {
      const int o = o0 + min(a, nr - 1);
      const float sc = __shfl_sync(FULL_MASK, lad[a], on ? T.code(o, gg) : 0);
      const uint4 b = *(const uint4*)T.group(o, gg);
      const uint32_t v[4] = {b.x, b.y, b.z, b.w};
      int s = 0;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        s = __dp4a((int)(v[j] & 0x0F0F0F0Fu), qv[2 * j], s);
        s = __dp4a((int)((v[j] >> 4) & 0x0F0F0F0Fu), qv[2 * j + 1], s);
      }
      if (on) acc[a] += sc * (d * ((float)s + m8));
    }
  }
#pragma unroll
  for (int a = 0; a < 2; a++) acc[a] = warp_sum(acc[a]);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = acc[a];
}

// lab_q4_loads: the loads-only ceiling of the q4tp walk — every byte the
// production kernel reads (16 nibble bytes and the code byte(s) per group,
// the row's ladder parameters, x), at the same addresses in the same shape
// (2 rows per warp, a lane per group), XORed instead of multiplied; y gets
// one bit per row so nothing is dropped. RPW 2.
extern "C" __global__ void __launch_bounds__(128) lab_q4_loads(const uint8_t* __restrict__ W, int rows, int cols,
                                                               const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, o0 = (blockIdx.x * LAB_WARPS + (threadIdx.x >> 5)) * 2;
  pdl_trigger();
  if (o0 >= rows) return;
  const Q4Row T(W, rows, cols);
  const int nr = min(rows - o0, 2);
  uint32_t acc = 0;
  for (int a = 0; a < nr; a++) acc ^= ld_u16(W + T.poff + 4 * (size_t)(o0 + a)) ^ ld_u16(W + T.poff + 4 * (size_t)(o0 + a) + 2);
  pdl_wait();
  for (int g = lane; g < T.gpr; g += 32) {
    const uint4* xv = (const uint4*)(x + (size_t)g * 32);
#pragma unroll
    for (int q = 0; q < 8; q++) {
      const uint4 t = xv[q];
      acc ^= t.x ^ t.y ^ t.z ^ t.w;
    }
    for (int a = 0; a < nr; a++) {
      const uint4 b = __ldcs((const uint4*)T.group(o0 + a, g));
      acc ^= b.x ^ b.y ^ b.z ^ b.w ^ (uint32_t)T.code(o0 + a, g);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(FULL_MASK, acc, o);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = (float)(acc & 1u);
}

// lab_q8_dp4a: q8_row (int8 row-major, f16 row scales at rows·cols) against
// int8 activations (lab_quant_x with perm=0): per block of 32, d·Σ w·q by
// eight dp4a, times the row scale at the end. A lane per block, 2 rows per
// warp; rows that are not whole 16-byte chunks take a byte-wise path. Params
// (W, rows, cols, xq, xd, y). RPW 2.
extern "C" __global__ void __launch_bounds__(128) lab_q8_dp4a(const uint8_t* __restrict__ W, int rows, int cols,
                                                              const int8_t* __restrict__ xq, const float* __restrict__ xd,
                                                              float* __restrict__ y) {
  const int lane = threadIdx.x & 31, o0 = (blockIdx.x * LAB_WARPS + (threadIdx.x >> 5)) * 2;
  pdl_trigger();
  if (o0 >= rows) return;
  const int nr = min(rows - o0, 2), nb = (cols + 31) / 32;
  const bool vec = aligned16(W) && cols % 16 == 0;
  pdl_wait();
  float acc[2] = {0.0f, 0.0f};
  for (int bk = lane; bk < nb; bk += 32) {
    const float d = xd[2 * bk];
    const bool full = vec && 32 * bk + 32 <= cols;
    int qv[8];
    if (full) {
      const int4* qp = (const int4*)(xq + (size_t)bk * 32);
      const int4 q0 = qp[0], q1 = qp[1];
      qv[0] = q0.x; qv[1] = q0.y; qv[2] = q0.z; qv[3] = q0.w; qv[4] = q1.x; qv[5] = q1.y; qv[6] = q1.z; qv[7] = q1.w;
    }
    for (int a = 0; a < nr; a++) {
      const uint8_t* row = W + (size_t)(o0 + a) * cols;
      int s = 0;
      if (full) {
        const uint4 w0 = __ldcs((const uint4*)(row + 32 * (size_t)bk)), w1 = __ldcs((const uint4*)(row + 32 * (size_t)bk + 16));
        s = __dp4a((int)w0.x, qv[0], s); s = __dp4a((int)w0.y, qv[1], s);
        s = __dp4a((int)w0.z, qv[2], s); s = __dp4a((int)w0.w, qv[3], s);
        s = __dp4a((int)w1.x, qv[4], s); s = __dp4a((int)w1.y, qv[5], s);
        s = __dp4a((int)w1.z, qv[6], s); s = __dp4a((int)w1.w, qv[7], s);
      } else {
        for (int i = 32 * bk; i < min(cols, 32 * bk + 32); i++) s += (int)(int8_t)row[i] * (int)xq[i];
      }
      acc[a] += d * (float)s;
    }
  }
#pragma unroll
  for (int a = 0; a < 2; a++) acc[a] = warp_sum(acc[a]);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = acc[a] * f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)(o0 + a)));
}

// lab_q8_loads: the loads-only ceiling of the q8_row walk — the row bytes
// in production's 16-byte chunks (2 rows per warp, a lane per chunk), x in
// the matching float4s and the row scale, XORed. Rows of odd length read
// byte-wise. RPW 2.
extern "C" __global__ void __launch_bounds__(128) lab_q8_loads(const uint8_t* __restrict__ W, int rows, int cols,
                                                               const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, o0 = (blockIdx.x * LAB_WARPS + (threadIdx.x >> 5)) * 2;
  pdl_trigger();
  if (o0 >= rows) return;
  const int nr = min(rows - o0, 2);
  const bool vec = aligned16(W) && cols % 16 == 0;
  uint32_t acc = 0;
  for (int a = 0; a < nr; a++) acc ^= ld_u16(W + (size_t)rows * cols + 2 * (size_t)(o0 + a));
  pdl_wait();
  if (vec) {
    const int nch = cols / 16;
    for (int k = lane; k < nch; k += 32) {
      const uint4* xv = (const uint4*)(x + (size_t)k * 16);
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const uint4 t = xv[q];
        acc ^= t.x ^ t.y ^ t.z ^ t.w;
      }
      for (int a = 0; a < nr; a++) {
        const uint4 b = __ldcs((const uint4*)(W + (size_t)(o0 + a) * cols + 16 * (size_t)k));
        acc ^= b.x ^ b.y ^ b.z ^ b.w;
      }
    }
  } else {
    for (int i = lane; i < cols; i += 32) {
      acc ^= __float_as_uint(x[i]);
      for (int a = 0; a < nr; a++) acc ^= W[(size_t)(o0 + a) * cols + i];
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(FULL_MASK, acc, o);
  if (lane == 0)
    for (int a = 0; a < nr; a++) y[o0 + a] = (float)(acc & 1u);
}
