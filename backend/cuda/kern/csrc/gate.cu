// Gated attention (Qwen3-Next, Qwen3.5: architectures.md §6.3): q_proj holds
// per query head [q_h ; gate_h], and the attention output is multiplied by
// σ(gate) before o_proj.
#include "common.cuh"

// gate_split: from src rows [q_0 g_0 q_1 g_1 … | k | v] (ldsrc) to qkv rows
// [q_0 q_1 … | k | v] (ldq) and gate rows [g_0 g_1 …] (ldg), nq heads of hd,
// kv the width of k|v. Launch: grid (⌈(nq·hd + kv)/256⌉, R), block 256.
extern "C" __global__ void gate_split(const float* __restrict__ src, int ldsrc, float* __restrict__ qkv, int ldq,
                                      float* __restrict__ gate, int ldg, int nq, int hd, int kv) {
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y, qd = nq * hd;
  if (i >= qd + kv) return;
  const float* s = src + (size_t)r * ldsrc;
  if (i < qd) {
    const int h = i / hd, d = i - h * hd;
    qkv[(size_t)r * ldq + i] = s[2 * h * hd + d];
    gate[(size_t)r * ldg + i] = s[2 * h * hd + hd + d];
  } else {
    qkv[(size_t)r * ldq + i] = s[qd + i];
  }
}

// gate_mul: y[r][i] *= σ(g[r][i]) = 1/(1 + e^−g). Launch: grid (⌈n/256⌉, R),
// block 256.
extern "C" __global__ void gate_mul(float* __restrict__ y, int ldy, const float* __restrict__ g, int ldg, int n) {
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (i >= n) return;
  y[(size_t)r * ldy + i] *= 1.0f / (1.0f + expf(-g[(size_t)r * ldg + i]));
}
