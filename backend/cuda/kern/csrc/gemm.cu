// Prefill GEMM over weights as stored: Y[t][o] (=|+=) Σ_k W[o,k]·X[t][k]
// (+ bias[o]) for a chunk of T rows, on tensor cores (WMMA bf16, float32
// accumulation). Each K step of 32 dequantizes a 64×32 weight tile and a
// 64×32 activation tile to bf16 in shared memory (a q4tp group is one K
// step); q8 quants are exact in bf16 and their row scale is applied in the
// epilogue. Precision: activations and non-q8 weights are rounded to bf16.
// First version: no cp.async pipelining, no wgmma (the lab's job).
// Launch of every gemm_*: grid (⌈rows/64⌉, ⌈T/64⌉), block 128, parameters
// (W, rows, cols, X, ldx, Y, ldy, T, bias, accumulate). q8_2f runs as
// q82f_prescale (grid.y = T) followed by gemm_q8row.
#include "common.cuh"
#include <cuda_bf16.h>
#include <mma.h>

#define GM_BM 64  // rows of X (tokens) per block
#define GM_BN 64  // weight rows (outputs) per block
#define GM_BK 32
#define GM_LD (GM_BK + 8)  // bf16 elements per shared row (16-byte multiple, fewer bank conflicts)
#define GM_LDC (GM_BN + 4)

using namespace nvcuda;

// Weight tile loaders: thread tid fills 16 consecutive k of weight row
// n = tid/2 (k = (tid%2)·16 ..), zeros outside the matrix.
struct GemmF32 {
  __device__ static void load(const uint8_t* W, int rows, int cols, int o, int k, __nv_bfloat16* dst) {
    const float* w = (const float*)W + (size_t)o * cols;
    for (int e = 0; e < 16; e++) dst[e] = __float2bfloat16_rn(k + e < cols && o < rows ? w[k + e] : 0.0f);
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};
struct GemmF16 {
  __device__ static void load(const uint8_t* W, int rows, int cols, int o, int k, __nv_bfloat16* dst) {
    const uint16_t* w = (const uint16_t*)W + (size_t)o * cols;
    for (int e = 0; e < 16; e++) dst[e] = __float2bfloat16_rn(k + e < cols && o < rows ? f16_to_f32(w[k + e]) : 0.0f);
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};
struct GemmBF16 {
  __device__ static void load(const uint8_t* W, int rows, int cols, int o, int k, __nv_bfloat16* dst) {
    const uint16_t* w = (const uint16_t*)W + (size_t)o * cols;
    for (int e = 0; e < 16; e++) dst[e] = __ushort_as_bfloat16(k + e < cols && o < rows ? w[k + e] : (uint16_t)0);
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};
struct GemmQ8 {
  __device__ static void load(const uint8_t* W, int rows, int cols, int o, int k, __nv_bfloat16* dst) {
    const int8_t* q = (const int8_t*)W + (size_t)o * cols;
    for (int e = 0; e < 16; e++) dst[e] = __float2bfloat16_rn(k + e < cols && o < rows ? (float)q[k + e] : 0.0f);
  }
  __device__ static float scale(const uint8_t* W, int rows, int cols, int o) {
    return f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)o));
  }
};
struct GemmQ4TP {
  __device__ static void load(const uint8_t* W, int rows, int cols, int o, int k, __nv_bfloat16* dst) {
    if (o >= rows || k >= cols) {
      for (int e = 0; e < 16; e++) dst[e] = __float2bfloat16_rn(0.0f);
      return;
    }
    const int gpr = cols / 32, g = k / 32, half = (k % 32) / 16;
    const size_t poff = (size_t)rows * gpr * 16, coff = poff + (size_t)rows * 4;
    const int stride = (5 * gpr + 7) / 8;
    const float s = q4tp_rung(ld_u16(W + poff + 4 * (size_t)o), ld_u16(W + poff + 4 * (size_t)o + 2),
                              q4tp_code(W + coff + (size_t)o * stride, g));
    const uint2 v = *(const uint2*)(W + ((size_t)o * gpr + g) * 16 + half * 8);
    const uint32_t wd[2] = {v.x, v.y};
    for (int j = 0; j < 2; j++)
      for (int n = 0; n < 8; n++) dst[8 * j + n] = __float2bfloat16_rn((float)((int)((wd[j] >> (4 * n)) & 15u) - 8) * s);
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};

template <class F>
__device__ __forceinline__ void gemm_body(const uint8_t* __restrict__ W, int rows, int cols,
                                          const float* __restrict__ X, int ldx, float* __restrict__ Y, int ldy, int T,
                                          const float* __restrict__ bias, int accumulate) {
  __shared__ __align__(32) __nv_bfloat16 As[GM_BM * GM_LD];
  __shared__ __align__(32) __nv_bfloat16 Bs[GM_BN * GM_LD];
  __shared__ __align__(32) float Cs[GM_BM * GM_LDC];
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5;
  const int o0 = blockIdx.x * GM_BN, t0 = blockIdx.y * GM_BM;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;  // the warp's 32×32 corner
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
  const int lr = tid >> 1, lk = (tid & 1) * 16;  // this thread's tile row and k offset
  bool waited = false;
  for (int k0 = 0; k0 < cols; k0 += GM_BK) {
    __nv_bfloat16 wb[16];
    F::load(W, rows, cols, o0 + lr, k0 + lk, wb);  // weights never depend on the previous kernel
    if (!waited) { pdl_wait(); waited = true; }
    __syncthreads();  // the previous step's tiles are consumed
#pragma unroll
    for (int e = 0; e < 16; e++) Bs[lr * GM_LD + lk + e] = wb[e];
    {
      const int t = t0 + lr;
      const float* xr = X + (size_t)t * ldx;
#pragma unroll
      for (int e = 0; e < 16; e++) {
        const int k = k0 + lk + e;
        As[lr * GM_LD + lk + e] = __float2bfloat16_rn(t < T && k < cols ? xr[k] : 0.0f);
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < GM_BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
#pragma unroll
      for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], As + (wm + 16 * i) * GM_LD + kk, GM_LD);
#pragma unroll
      for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], Bs + (wn + 16 * j) * GM_LD + kk, GM_LD);
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
  if (!waited) pdl_wait();
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 2; j++)
      wmma::store_matrix_sync(Cs + (wm + 16 * i) * GM_LDC + wn + 16 * j, acc[i][j], GM_LDC, wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < GM_BM * GM_BN; e += blockDim.x) {
    const int t = t0 + e / GM_BN, o = o0 + e % GM_BN;
    if (t >= T || o >= rows) continue;
    float v = Cs[(e / GM_BN) * GM_LDC + e % GM_BN] * F::scale(W, rows, cols, o);
    if (bias) v += bias[o];
    float* y = Y + (size_t)t * ldy + o;
    if (accumulate) v += *y;
    *y = v;
  }
}

#define GEMM_PARAMS                                                                                         \
  const uint8_t *__restrict__ W, int rows, int cols, const float *__restrict__ X, int ldx, float *__restrict__ Y, \
      int ldy, int T, const float *__restrict__ bias, int accumulate
#define GEMM_ARGS W, rows, cols, X, ldx, Y, ldy, T, bias, accumulate

extern "C" __global__ void __launch_bounds__(128) gemm_f32(GEMM_PARAMS) { gemm_body<GemmF32>(GEMM_ARGS); }
extern "C" __global__ void __launch_bounds__(128) gemm_f16(GEMM_PARAMS) { gemm_body<GemmF16>(GEMM_ARGS); }
extern "C" __global__ void __launch_bounds__(128) gemm_bf16(GEMM_PARAMS) { gemm_body<GemmBF16>(GEMM_ARGS); }
extern "C" __global__ void __launch_bounds__(128) gemm_q8row(GEMM_PARAMS) { gemm_body<GemmQ8>(GEMM_ARGS); }
extern "C" __global__ void __launch_bounds__(128) gemm_q4tp(GEMM_PARAMS) { gemm_body<GemmQ4TP>(GEMM_ARGS); }
