// Shared helpers of cortiq's CUDA kernels (sm_90a; every kernel also builds
// for compute_90 PTX). Activations and the KV cache are float32; weights are
// read as CMF stores them (docs/quant.md), never converted.
#pragma once
#include <stdint.h>
#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu

// Programmatic dependent launch: pdl_wait blocks until the grids this one
// depends on have finished and their writes are visible; pdl_trigger lets
// the next grid on the stream begin launching. Both are no-ops when the
// launch did not ask for PDL, and compile to nothing before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

// f16 and bf16 bit patterns to float (exact).
__device__ __forceinline__ float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
// gemmh_acth's value of v (f16, |v| > 65504 saturated, a NaN kept) at
// column c of a row in its order (element 8q + m of each block of 32 at
// 2q + m/4 + 8·(m%4)): the half wide GEMM's activations.
__device__ __forceinline__ void gh_store(uint16_t* __restrict__ row, int c, float v) {
  if (fabsf(v) > 65504.0f) v = copysignf(65504.0f, v);
  const int k = c & 31, m = k & 7, q = k >> 3;
  row[(c & ~31) + 2 * q + (m >> 2) + 8 * (m & 3)] = __half_as_ushort(__float2half_rn(v));
}
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// Unaligned little-endian loads of stored scales (q8 row scales sit at
// rows·cols, which may be odd).
// prefetch_l2 asks for p's cache line in L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// prefetch_l1 asks for it in this multiprocessor's L1 (and L2).
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return (uint16_t)p[0] | ((uint16_t)p[1] << 8); }
__device__ __forceinline__ float ld_f32(const uint8_t* p) {
  return __uint_as_float((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

__device__ __forceinline__ bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// q4tp: rung k of a row's ladder, exp2(a + k·b) with the sum in float32
// and no FMA, as docs/quant.md fixes it.
__device__ __forceinline__ float q4tp_rung(uint16_t a, uint16_t b, int k) {
  return exp2f(__fadd_rn(f16_to_f32(a), __fmul_rn((float)k, f16_to_f32(b))));
}

// q4tp: the 5-bit code of group g from a row's code bytes.
__host__ __device__ __forceinline__ int q4tp_code(const uint8_t* codes, int g) {
  int bit = 5 * g, cb = bit >> 3, sh = bit & 7;
  uint32_t v = codes[cb];
  if (sh > 3) v |= (uint32_t)codes[cb + 1] << 8;
  return (int)((v >> sh) & 31u);
}

// RMSNorm's arithmetic (the CPU's): inv = float(1/sqrt(float(Σx²/n) + eps))
// from Σx² in float64; y = w·(x·inv), or (x·inv)·(1+w) zero-centred.
__device__ __forceinline__ float rms_inv(double ss, int n, float eps) {
  const float ms = (float)(ss / (double)n);
  return (float)(1.0 / sqrt((double)(ms + eps)));
}

__device__ __forceinline__ float rms_apply(float v, float inv, float w, int one_plus) {
  return one_plus ? (v * inv) * (1.0f + w) : w * (v * inv);
}

// RoPE at position pos of the pair with inverse frequency f (NeoX
// pairing): rope_cs gives its cosine and sine, float(pos·f) with sin and
// cos in double, both times mscale; rope_rot rotates the pair (a, b) =
// (x[i], x[i + rot/2]) by them. Explicit roundings (no contraction), so
// every kernel that rotates gets the same bits.
__device__ __forceinline__ void rope_cs(int pos, float f, float mscale, float& c, float& s) {
  const float ang = __fmul_rn((float)pos, f);
  double sd, cd;
  sincos((double)ang, &sd, &cd);
  c = __fmul_rn((float)cd, mscale);
  s = __fmul_rn((float)sd, mscale);
}
__device__ __forceinline__ void rope_rot(float& a, float& b, float c, float s) {
  const float a0 = a, b0 = b;
  a = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b0, s));
  b = __fadd_rn(__fmul_rn(b0, c), __fmul_rn(a0, s));
}
__device__ __forceinline__ void rope_pair(float& a, float& b, int pos, float f, float mscale) {
  float c, s;
  rope_cs(pos, f, mscale, c, s);
  rope_rot(a, b, c, s);
}

// A K/V cache element from a float: itself (float32 caches) or rounded to
// nearest even (float16 caches).
__device__ __forceinline__ float kv_elem(float v, float*) { return v; }
__device__ __forceinline__ __half kv_elem(float v, __half*) { return __float2half_rn(v); }

// Block-wide deterministic reductions for blocks of up to 1024 threads: a
// fixed shuffle tree per warp, then warp 0 over the warps' results. sh
// needs 32 slots. Every thread gets the result.
__device__ __forceinline__ double block_sum_d(double v, double* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    double t = lane < nw ? sh[lane] : 0.0;
    t = warp_sum_d(t);
    if (lane == 0) sh[0] = t;
  }
  __syncthreads();
  return sh[0];
}

__device__ __forceinline__ float block_sum_f(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    float t = lane < nw ? sh[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) sh[0] = t;
  }
  __syncthreads();
  return sh[0];
}

__device__ __forceinline__ float block_max_f(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    float t = lane < nw ? sh[lane] : -INFINITY;
    t = warp_max(t);
    if (lane == 0) sh[0] = t;
  }
  __syncthreads();
  return sh[0];
}

__device__ __forceinline__ int block_sum_i(int v, int* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    int t = lane < nw ? sh[lane] : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL_MASK, t, o);
    if (lane == 0) sh[0] = t;
  }
  __syncthreads();
  return sh[0];
}

// Four 8×8 b16 matrices (here 8 rows × 16 bytes) from shared memory
// (ldmatrix): lane l gives the address of row l%8 of matrix l/8 and
// receives, in r[i], row l/4, elements 2(l%4) and 2(l%4)+1 of matrix i
// (TRANS: column l/4, rows 2(l%4) and 2(l%4)+1).
template <bool TRANS = false>
__device__ __forceinline__ void gq_ldsm4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// c += A·B for A 16×16 f16 (row), B 16×8 f16 (col), f32.
__device__ __forceinline__ void gh_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
