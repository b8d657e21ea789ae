// Batched decode matvec: y[r][o] (=|+=) Σ_i W[o,i]·x[r][i] (+ bias[o]) for
// R = 1..8 activation rows, every weight byte read once for all rows.
//
// Launch shape of every mv_* kernel: grid ⌈rows/8⌉, block 128 (4 warps, 2
// weight rows per warp, lanes walking the columns in 16-byte chunks).
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

// q8_row (and the quants of q8_2f): int8 row-major, f16 scales at rows·cols.
struct FmtQ8 {
  static constexpr int E = 16, ES = 1;
  __device__ static void decode(uint4 c, float* w) {
    uint32_t v[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int b = 0; b < 4; b++) w[4 * j + b] = (float)(int8_t)((v[j] >> (8 * b)) & 0xff);
  }
  __device__ static float scalar(const uint8_t* row, int i) { return (float)(int8_t)row[i]; }
  __device__ static float row_scale(const uint8_t* W, int rows, int cols, int o) {
    return f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)o));
  }
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

// q4tp: lane k of a warp holds rung k of each of its rows' ladders; a
// group's rung is fetched from the lane its code names by a shuffle.
template <int R>
__device__ __forceinline__ void mv_q4tp(const uint8_t* __restrict__ W, int rows, int cols,
                                        const float* __restrict__ x, int ldx, float* __restrict__ y, int ldy,
                                        const float* __restrict__ bias, int accumulate) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int o0 = (blockIdx.x * MV_WARPS + warp) * MV_RPW;
  pdl_trigger();
  if (o0 >= rows) return;  // whole warps leave together: the shuffles below see full warps
  const int gpr = cols / 32;
  const size_t poff = (size_t)rows * gpr * 16, coff = poff + (size_t)rows * 4;
  const int stride = (5 * gpr + 7) / 8;
  const bool xvec = aligned16(x) && ldx % 4 == 0;
  bool valid[MV_RPW];
  float lad[MV_RPW];
  uint4 cur[MV_RPW], nxt[MV_RPW];
#pragma unroll
  for (int a = 0; a < MV_RPW; a++) {
    const int o = o0 + a;
    valid[a] = o < rows;
    lad[a] = valid[a] ? q4tp_rung(ld_u16(W + poff + 4 * (size_t)o), ld_u16(W + poff + 4 * (size_t)o + 2), lane) : 0.0f;
    cur[a] = (valid[a] && lane < gpr) ? ld_stream(W + ((size_t)o * gpr + lane) * 16) : make_uint4(0, 0, 0, 0);
  }
  float acc[MV_RPW][R];
#pragma unroll
  for (int a = 0; a < MV_RPW; a++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[a][r] = 0.0f;
  pdl_wait();
  for (int g0 = 0; g0 < gpr; g0 += 32) {
    const int g = g0 + lane;
    const bool on = g < gpr;
    float sc[MV_RPW];
#pragma unroll
    for (int a = 0; a < MV_RPW; a++) {
      nxt[a] = (valid[a] && g + 32 < gpr) ? ld_stream(W + ((size_t)(o0 + a) * gpr + g + 32) * 16) : make_uint4(0, 0, 0, 0);
      const int code = (valid[a] && on) ? q4tp_code(W + coff + (size_t)(o0 + a) * stride, g) : 0;
      sc[a] = __shfl_sync(FULL_MASK, lad[a], code);
    }
    if (on) {
      float w[MV_RPW][32];
#pragma unroll
      for (int a = 0; a < MV_RPW; a++) {
        uint32_t v[4] = {cur[a].x, cur[a].y, cur[a].z, cur[a].w};
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
          for (int n = 0; n < 8; n++) w[a][8 * j + n] = (float)((int)((v[j] >> (4 * n)) & 15u) - 8);
      }
#pragma unroll
      for (int r = 0; r < R; r++) {
        const float* xr = x + (size_t)r * ldx + (size_t)g * 32;
        float xv[32];
        if (xvec) {
#pragma unroll
          for (int q = 0; q < 8; q++) {
            float4 t = ((const float4*)xr)[q];
            xv[4 * q] = t.x; xv[4 * q + 1] = t.y; xv[4 * q + 2] = t.z; xv[4 * q + 3] = t.w;
          }
        } else {
#pragma unroll
          for (int e = 0; e < 32; e++) xv[e] = xr[e];
        }
#pragma unroll
        for (int a = 0; a < MV_RPW; a++) {
          float gs = 0.0f;
#pragma unroll
          for (int e = 0; e < 32; e++) gs += w[a][e] * xv[e];
          acc[a][r] += gs * sc[a];
        }
      }
    }
#pragma unroll
    for (int a = 0; a < MV_RPW; a++) cur[a] = nxt[a];
  }
#pragma unroll
  for (int a = 0; a < MV_RPW; a++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[a][r] = warp_sum(acc[a][r]);
  if (lane == 0) {
#pragma unroll
    for (int a = 0; a < MV_RPW; a++) {
      if (!valid[a]) continue;
#pragma unroll
      for (int r = 0; r < R; r++) mv_store(y + (size_t)r * ldy + o0 + a, acc[a][r], bias, o0 + a, accumulate);
    }
  }
}

#define MV_PARAMS                                                                                          \
  const uint8_t *__restrict__ W, int rows, int cols, const float *__restrict__ x, int ldx, float *__restrict__ y, \
      int ldy, const float *__restrict__ bias, int accumulate
#define MV_ARGS W, rows, cols, x, ldx, y, ldy, bias, accumulate

#define MV_KERNELS(R)                                                                                          \
  extern "C" __global__ void __launch_bounds__(128) mv_f32_r##R(MV_PARAMS) { mv_plain<R, FmtF32>(MV_ARGS); }   \
  extern "C" __global__ void __launch_bounds__(128) mv_f16_r##R(MV_PARAMS) { mv_plain<R, FmtF16>(MV_ARGS); }   \
  extern "C" __global__ void __launch_bounds__(128) mv_bf16_r##R(MV_PARAMS) { mv_plain<R, FmtBF16>(MV_ARGS); } \
  extern "C" __global__ void __launch_bounds__(128) mv_q8row_r##R(MV_PARAMS) { mv_plain<R, FmtQ8>(MV_ARGS); }  \
  extern "C" __global__ void __launch_bounds__(128) mv_q4tp_r##R(MV_PARAMS) { mv_q4tp<R>(MV_ARGS); }

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
