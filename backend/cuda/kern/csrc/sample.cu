// Token selection on the device: argmax, and a temperature / top-k / top-p
// sampler whose parameters and RNG state live in device memory (so a
// captured graph samples anew on every replay and the host never reads the
// logits). Both are deterministic: fixed reduction orders, no float atomics.
#include "common.cuh"

#define SAMPLE_THREADS 1024

// Per-row sampler state, 32 bytes: temperature (≤ 0: greedy), top_k (0:
// off), top_p (≥ 1: off), seed and a draw counter the kernel increments.
struct SampleState {
  float temperature;
  int top_k;
  float top_p;
  uint32_t pad;
  unsigned long long seed;
  unsigned long long counter;
};

// The draw: splitmix64 of seed + (counter+1)·golden, top 24 bits → [0, 1).
__host__ __device__ __forceinline__ float draw_uniform(unsigned long long seed, unsigned long long counter) {
  unsigned long long z = seed + (counter + 1ull) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

// Orderable key of a float: larger floats give larger keys, equal floats
// equal keys (-0 is +0); NaN maps to 0.
__device__ __forceinline__ uint32_t fkey(float v) {
  if (v != v) return 0u;
  if (v == 0.0f) return 0x80000000u;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Block argmax over n values, ties to the lowest index, NaN never chosen
// (all NaN gives index 0). sv and si need 32 slots.
__device__ int block_argmax(const float* x, int n, float* sv, int* si) {
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[i];
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
    const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) { sv[w] = bv; si[w] = bi; }
  __syncthreads();
  if (w == 0) {
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
      const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) si[0] = bi == 0x7fffffff ? 0 : bi;
  }
  __syncthreads();
  return si[0];
}

// argmax: next[r] = the index of the largest logits[r][i], ties to the
// lowest index. Launch: grid R, block 1024.
extern "C" __global__ void argmax(const float* __restrict__ logits, int ld, int n, int* __restrict__ next) {
  __shared__ float sv[32];
  __shared__ int si[32];
  pdl_trigger();
  pdl_wait();
  const int i = block_argmax(logits + (size_t)blockIdx.x * ld, n, sv, si);
  if (threadIdx.x == 0) next[blockIdx.x] = i;
}

// sample: next[r] drawn from softmax(logits[r]/T) restricted to the top_k
// largest logits (ties at the k-th value kept) and then to the smallest
// set of largest probabilities whose mass reaches top_p (ties kept). The
// thresholds are found by bitwise search on orderable keys (32 counting
// or mass passes); the draw walks the kept tokens in index order, each
// thread a contiguous range, with a fixed-order prefix over the threads.
// state[r].counter is incremented. Launch: grid R, block 1024.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample(const float* __restrict__ logits, int ld, int n, SampleState* state, int* __restrict__ next) {
  __shared__ float shf[32];
  __shared__ int shi[32];
  __shared__ double shd[32];
  __shared__ float pre[SAMPLE_THREADS];
  __shared__ int pick;
  pdl_trigger();
  pdl_wait();
  const int r = blockIdx.x, tid = threadIdx.x;
  const float* x = logits + (size_t)r * ld;
  SampleState st = state[r];
  __syncthreads();
  if (tid == 0) state[r].counter = st.counter + 1;
  if (!(st.temperature > 0.0f) || st.top_k == 1 || n <= 1) {
    const int i = block_argmax(x, n, shf, shi);
    if (tid == 0) next[r] = i;
    return;
  }
  const float invT = 1.0f / st.temperature;
  float mx = -INFINITY;
  for (int i = tid; i < n; i += blockDim.x) mx = fmaxf(mx, x[i]);  // fmaxf ignores NaN
  mx = block_max_f(mx, shf);

  // top-k: the largest key T with count(key ≥ T) ≥ k.
  uint32_t T = 1u;  // keeps every non-NaN value
  if (st.top_k > 1 && st.top_k < n) {
    uint32_t t = 0u;
    for (int bit = 31; bit >= 0; bit--) {
      const uint32_t cand = t | (1u << bit);
      int c = 0;
      for (int i = tid; i < n; i += blockDim.x) c += fkey(x[i]) >= cand;
      if (block_sum_i(c, shi) >= st.top_k) t = cand;
    }
    T = t > 1u ? t : 1u;
  }
  // top-p: the largest key T2 ≥ T with mass(key ≥ T2) ≥ top_p · mass(key ≥ T).
  if (st.top_p < 1.0f) {
    double z = 0.0;
    for (int i = tid; i < n; i += blockDim.x)
      if (fkey(x[i]) >= T) z += (double)expf((x[i] - mx) * invT);
    z = block_sum_d(z, shd);
    const double need = (double)st.top_p * z;
    uint32_t t = 0u;
    for (int bit = 31; bit >= 0; bit--) {
      const uint32_t cand = t | (1u << bit);
      const uint32_t th = cand > T ? cand : T;
      double m = 0.0;
      for (int i = tid; i < n; i += blockDim.x)
        if (fkey(x[i]) >= th) m += (double)expf((x[i] - mx) * invT);
      if (block_sum_d(m, shd) >= need) t = cand;
    }
    if (t > T) T = t;
  }
  // The draw over the kept set, in index order.
  const int per = (n + blockDim.x - 1) / blockDim.x;
  const int i0 = min(n, tid * per), i1 = min(n, i0 + per);
  float local = 0.0f;
  for (int i = i0; i < i1; i++)
    if (fkey(x[i]) >= T) local += expf((x[i] - mx) * invT);
  pre[tid] = local;
  __syncthreads();
  if (tid == 0) {  // fixed-order exclusive prefix; 1024 adds, cheap next to the passes above
    float acc = 0.0f;
    for (int j = 0; j < (int)blockDim.x; j++) {
      const float v = pre[j];
      pre[j] = acc;
      acc += v;
    }
    shf[0] = acc;
    pick = -1;
  }
  __syncthreads();
  const float total = shf[0];
  const float target = draw_uniform(st.seed, st.counter) * total;
  const float start = pre[tid];
  if (local > 0.0f && target >= start && target < start + local) {
    float acc = start;
    int last = -1;
    for (int i = i0; i < i1; i++) {
      if (fkey(x[i]) < T) continue;
      last = i;
      acc += expf((x[i] - mx) * invT);
      if (target < acc) break;
    }
    pick = last;  // exactly one thread's range holds the target
  }
  __syncthreads();
  if (tid == 0) {
    int p = pick;
    if (p < 0)  // rounding put the target at the very end: the last kept token
      for (int i = n - 1; i >= 0; i--)
        if (fkey(x[i]) >= T) { p = i; break; }
    next[r] = p < 0 ? 0 : p;
  }
}
