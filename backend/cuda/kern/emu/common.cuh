// A host emulation of the CUDA features deltanet.cu uses, so that its
// kernels' own source runs without a GPU (scripts/emu-deltanet): blocks one
// at a time, one std::thread per CUDA thread, __syncthreads a barrier of
// the block, __shfl_xor_sync and __ballot_sync an exchange through memory
// between two barriers of the warp, cp.async a plain copy (deltanet.cu's
// dn_cp16 without __CUDA_ARCH__), __shared__ variables static (one block runs at a
// time), dynamic shared memory a NaN-filled buffer per block. Not a model
// of the hardware's timing or memory ordering beyond those barriers: it
// checks indexing, the partition of work, the reductions and the
// synchronisation points, not performance. Stands in for csrc/common.cuh
// (the functions below the marker are copied from it verbatim).
#pragma once
#include <cstdint>
#include <cmath>
#include <thread>
#include <barrier>
#include <vector>
#include <memory>
#define __global__
#define __launch_bounds__(...)
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define FULL_MASK 0xffffffffu
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) float4 { float x, y, z, w; };
inline int min(int a, int b) { return a < b ? a : b; }
extern thread_local dim3 threadIdx;
extern dim3 blockIdx, blockDim, gridDim;
extern std::barrier<>* g_bar;
extern std::vector<std::unique_ptr<std::barrier<>>> g_wbar;
extern double g_wbuf[32][32];
extern float* g_dyn_smem;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline double __shfl_xor_sync(unsigned, double v, int o) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  g_wbuf[w][lane] = v;
  g_wbar[w]->arrive_and_wait();
  double r = g_wbuf[w][lane ^ o];
  g_wbar[w]->arrive_and_wait();
  return r;
}
inline unsigned __ballot_sync(unsigned, bool p) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  g_wbuf[w][lane] = p ? 1.0 : 0.0;
  g_wbar[w]->arrive_and_wait();
  unsigned m = 0;
  for (int l = 0; l < 32; l++)
    if (g_wbuf[w][l] != 0.0) m |= 1u << l;
  g_wbar[w]->arrive_and_wait();
  return m;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }
inline void pdl_wait() {}
inline void pdl_trigger() {}
// Verbatim from csrc/common.cuh (keep in step):
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}
__device__ __forceinline__ float rms_inv(double ss, int n, float eps) {
  const float ms = (float)(ss / (double)n);
  return (float)(1.0 / sqrt((double)(ms + eps)));
}
__device__ __forceinline__ float rms_apply(float v, float inv, float w, int one_plus) {
  return one_plus ? (v * inv) * (1.0f + w) : w * (v * inv);
}
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
