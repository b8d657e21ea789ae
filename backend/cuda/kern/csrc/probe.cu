// Device read-bandwidth probe: streams n16 16-byte words and adds every
// 32-bit lane into *sink (integer, so the result is exact and the loads
// cannot be dropped). The bandwidth fraction of a benchmark is taken
// against this, run in the same process.
// Launch: grid = 4 × SMs (a grid-stride loop), block 256.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) probe_read(const uint4* __restrict__ p, long long n16,
                                                              unsigned int* __restrict__ sink) {
  unsigned int s = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {  // four loads in flight per thread
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
                d = __ldcs(p + i + 3 * stride);
    s += a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w + c.x + c.y + c.z + c.w + d.x + d.y + d.z + d.w;
  }
  for (; i < n16; i += stride) {
    const uint4 a = __ldcs(p + i);
    s += a.x + a.y + a.z + a.w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sink, s);
}
