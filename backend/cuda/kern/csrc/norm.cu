// RMSNorm, whole rows and per head, with the CPU's arithmetic: Σx² in
// float64 by a fixed reduction tree (deterministic), inv =
// float(1/sqrt(float(Σx²/n) + eps)), y = w·(x·inv) or (1+w)·(x·inv).
#include "common.cuh"

// rmsnorm: y[r][i] = norm(x[r])[i]·(w[i] or 1+w[i]); y may alias x.
// Launch: grid R, block 256 (any multiple of 32 up to 1024).
extern "C" __global__ void rmsnorm(const float* x, int ldx, const float* __restrict__ w, float* y, int ldy, int n,
                                   float eps, int one_plus) {
  __shared__ double sh[32];
  pdl_trigger();
  pdl_wait();
  const float* xr = x + (size_t)blockIdx.x * ldx;
  double ss = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
  ss = block_sum_d(ss, sh);
  const float inv = rms_inv(ss, n, eps);
  float* yr = y + (size_t)blockIdx.x * ldy;
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = rms_apply(xr[i], inv, w[i], one_plus);
}

// head_rmsnorm: in place over each head of x[r][h·hd .. (h+1)·hd) (the q/k
// norm of Qwen3), one weight vector w[hd] for all heads.
// Launch: grid (nheads, R), block 32 (one warp per head).
extern "C" __global__ void head_rmsnorm(float* x, int ldx, const float* __restrict__ w, int hd, float eps,
                                        int one_plus) {
  pdl_trigger();
  pdl_wait();
  float* xh = x + (size_t)blockIdx.y * ldx + (size_t)blockIdx.x * hd;
  double ss = 0.0;
  for (int i = threadIdx.x; i < hd; i += 32) ss += (double)xh[i] * (double)xh[i];
  ss = warp_sum_d(ss);
  const float inv = rms_inv(ss, hd, eps);
  for (int i = threadIdx.x; i < hd; i += 32) xh[i] = rms_apply(xh[i], inv, w[i], one_plus);
}
