// Prefill GEMM over weights as stored: Y[t][o] (=|+=) Σ_k W[o,k]·X[t][k]
// (+ bias[o]) for a chunk of T rows, on tensor cores (mma.sync m16n8k16
// bf16, float32 accumulation, fragments loaded with ldmatrix; PTX rather
// than WMMA so that the fragment layout is known and the epilogue can use
// it). A block computes 128 weight rows × BM
// tokens (BM = 128 for gemm_<fmt>, 64 for gemm_<fmt>_t64) with 256 threads
// = 8 warps in a 2 (tokens) × 4 (weight rows) grid, each warp BM/2 × 32 as
// (BM/32) × 4 tiles of 16 tokens × 8 weight rows.
// K advances in steps of 32 (a q4tp group is one step) through two shared
// memory stages: while the tensor cores work on one stage, the next step's
// weights and activations are loaded into registers, then dequantized /
// rounded to bf16 into the other stage (one __syncthreads per step).
// Precision: activations and non-q8 weights are rounded to bf16 (q4tp:
// (nibble−8)·rung in float32, then bf16); q8 quants are exact in bf16 and
// their row scale is applied in the epilogue.
// Global loads are 16 bytes (q4tp: 8) when cols % 32 == 0, W and X are
// 16-byte aligned and ldx % 4 == 0; otherwise an element-wise guarded path
// (any cols for the non-q4tp formats). Rows past `rows` or T read the last
// valid row; their results are never stored.
// Launch of every gemm_* / gemm_*_t64: grid (⌈rows/128⌉, ⌈T/BM⌉), block 256,
// no dynamic shared memory, parameters (W, rows, cols, X, ldx, Y, ldy, T,
// bias, accumulate). q8_2f runs as q82f_prescale (grid.y = T) followed by
// gemm_q8row.
#include "common.cuh"
#include <cuda_bf16.h>

#define GM_BN 128  // weight rows (outputs) per block
#define GM_BK 32
#define GM_LD (GM_BK + 8)  // bf16 per shared row: 80 B, 16-byte multiple, ldmatrix conflict-free
#define GM_LDE (32 + 8)    // floats per row of a warp's epilogue strip (float2 stores conflict-free)
#define GM_THREADS 256

// d += A·B for A 16×16 (row-major fragment a), B 16×8 (column-major b0, b1).
__device__ __forceinline__ void gm_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t gm_pack(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Stores 16 packed bf16 (8 words) at a 16-byte aligned shared address.
__device__ __forceinline__ void gm_st16(__nv_bfloat16* dst, const uint32_t* p) {
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(p[0], p[1], p[2], p[3]);
  d[1] = make_uint4(p[4], p[5], p[6], p[7]);
}

// Weight stagers: thread tid stages 16 consecutive k (k0 + (tid%2)·16 ..)
// of weight row o0 + tid/2; load fetches them into registers, store writes
// them as bf16 into the stage; zeros for k ≥ cols.
struct GemmF32 {
  const float* w;
  float v[16];
  __device__ GemmF32(const uint8_t* W, int rows, int cols, int o) : w((const float*)W + (size_t)min(o, rows - 1) * cols) {}
  __device__ void load(int cols, int k, bool fast) {
    if (fast) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const float4 f = reinterpret_cast<const float4*>(w + k)[i];
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 16; e++) v[e] = k + e < cols ? w[k + e] : 0.0f;
    }
  }
  __device__ void store(__nv_bfloat16* dst) const {
    uint32_t p[8];
#pragma unroll
    for (int i = 0; i < 8; i++) p[i] = gm_pack(v[2 * i], v[2 * i + 1]);
    gm_st16(dst, p);
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};

// 16-bit formats: the raw words, two elements each (low half first).
struct Gemm16 {
  const uint16_t* w;
  uint32_t u[8];
  __device__ Gemm16(const uint8_t* W, int rows, int cols, int o) : w((const uint16_t*)W + (size_t)min(o, rows - 1) * cols) {}
  __device__ void load(int cols, int k, bool fast) {
    if (fast) {
      const uint4 a = reinterpret_cast<const uint4*>(w + k)[0], b = reinterpret_cast<const uint4*>(w + k)[1];
      u[0] = a.x, u[1] = a.y, u[2] = a.z, u[3] = a.w, u[4] = b.x, u[5] = b.y, u[6] = b.z, u[7] = b.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const uint32_t lo = k + 2 * i < cols ? w[k + 2 * i] : 0u, hi = k + 2 * i + 1 < cols ? w[k + 2 * i + 1] : 0u;
        u[i] = lo | hi << 16;
      }
    }
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};
struct GemmBF16 : Gemm16 {
  __device__ GemmBF16(const uint8_t* W, int rows, int cols, int o) : Gemm16(W, rows, cols, o) {}
  __device__ void store(__nv_bfloat16* dst) const { gm_st16(dst, u); }
};
struct GemmF16 : Gemm16 {
  __device__ GemmF16(const uint8_t* W, int rows, int cols, int o) : Gemm16(W, rows, cols, o) {}
  __device__ void store(__nv_bfloat16* dst) const {
    uint32_t p[8];
#pragma unroll
    for (int i = 0; i < 8; i++) p[i] = gm_pack(f16_to_f32(u[i] & 0xffffu), f16_to_f32(u[i] >> 16));
    gm_st16(dst, p);
  }
};

struct GemmQ8 {
  const int8_t* w;
  uint32_t u[4];
  __device__ GemmQ8(const uint8_t* W, int rows, int cols, int o) : w((const int8_t*)W + (size_t)min(o, rows - 1) * cols) {}
  __device__ void load(int cols, int k, bool fast) {
    if (fast) {
      const uint4 a = *reinterpret_cast<const uint4*>(w + k);
      u[0] = a.x, u[1] = a.y, u[2] = a.z, u[3] = a.w;
    } else {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        uint32_t x = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) x |= (k + 4 * i + j < cols ? (uint32_t)(uint8_t)w[k + 4 * i + j] : 0u) << (8 * j);
        u[i] = x;
      }
    }
  }
  // int8 to float without the conversion unit: 0x4B0000bb is 2^23 + bb,
  // bb = the byte with its sign bit flipped (q + 128), so the float is
  // exactly 2^23 + 128 + q.
  __device__ static float q8f(uint32_t flipped, int j) {
    return __int_as_float(__byte_perm(flipped, 0x4B000000u, 0x7440u | j)) - 8388736.0f;
  }
  __device__ void store(__nv_bfloat16* dst) const {
    uint32_t p[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t x = u[i] ^ 0x80808080u;
#pragma unroll
      for (int j = 0; j < 2; j++) p[2 * i + j] = gm_pack(q8f(x, 2 * j), q8f(x, 2 * j + 1));
    }
    gm_st16(dst, p);
  }
  __device__ static float scale(const uint8_t* W, int rows, int cols, int o) {
    return f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)o));
  }
};

// q4tp: cols % 32 == 0 always (the launcher checks); the row's ladder
// parameters stay in registers, each step loads half a group (8 bytes) and
// its 5-bit code.
struct GemmQ4TP {
  const uint8_t* nib;
  const uint8_t* code;
  uint16_t a, b;
  uint2 v;
  int c;
  __device__ GemmQ4TP(const uint8_t* W, int rows, int cols, int o) {
    o = min(o, rows - 1);
    const int gpr = cols / 32;
    const size_t poff = (size_t)rows * gpr * 16, coff = poff + (size_t)rows * 4;
    a = ld_u16(W + poff + 4 * (size_t)o);
    b = ld_u16(W + poff + 4 * (size_t)o + 2);
    nib = W + (size_t)o * gpr * 16 + (threadIdx.x & 1) * 8;
    code = W + coff + (size_t)o * ((5 * gpr + 7) / 8);
  }
  __device__ void load(int, int k, bool) {
    const int g = k / 32;
    v = *reinterpret_cast<const uint2*>(nib + (size_t)g * 16);
    c = q4tp_code(code, g);
  }
  __device__ void store(__nv_bfloat16* dst) const {
    const float s = q4tp_rung(a, b, c);
    const uint32_t wd[2] = {v.x, v.y};
    uint32_t p[8];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int n = 0; n < 8; n += 2)
        p[4 * j + n / 2] = gm_pack((float)((int)((wd[j] >> (4 * n)) & 15u) - 8) * s,
                                   (float)((int)((wd[j] >> (4 * n + 4)) & 15u) - 8) * s);
    gm_st16(dst, p);
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};

// Activation stager: BM tokens × 32 k per step, N = BM/8 consecutive k of
// one token per thread (BM = 128: 16, two threads a row; BM = 64: 8, four).
template <int BM>
struct GemmX {
  static constexpr int N = BM / 8, TPR = GM_BK / N;
  const float* x;
  float v[N];
  __device__ GemmX(const float* X, int ldx, int T, int t0)
      : x(X + (size_t)min(t0 + (int)threadIdx.x / TPR, T - 1) * ldx + (threadIdx.x % TPR) * N) {}
  __device__ void load(int cols, int k0, bool fast) {
    if (fast) {
#pragma unroll
      for (int i = 0; i < N / 4; i++) {
        const float4 f = reinterpret_cast<const float4*>(x + k0)[i];
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
      }
    } else {
      const int k = k0 + (threadIdx.x % TPR) * N;
#pragma unroll
      for (int e = 0; e < N; e++) v[e] = k + e < cols ? x[k0 + e] : 0.0f;
    }
  }
  __device__ void store(__nv_bfloat16* stage) const {
    uint32_t p[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++) p[i] = gm_pack(v[2 * i], v[2 * i + 1]);
    uint4* d = reinterpret_cast<uint4*>(stage + (threadIdx.x / TPR) * GM_LD + (threadIdx.x % TPR) * N);
#pragma unroll
    for (int j = 0; j < N / 8; j++) d[j] = make_uint4(p[4 * j], p[4 * j + 1], p[4 * j + 2], p[4 * j + 3]);
  }
};

template <class F, int BM>
__device__ __forceinline__ void gemm_body(const uint8_t* __restrict__ W, int rows, int cols,
                                          const float* __restrict__ X, int ldx, float* __restrict__ Y, int ldy, int T,
                                          const float* __restrict__ bias, int accumulate) {
  constexpr int FT = BM / 32;                 // 16-token tiles per warp (BM/2 tokens)
  constexpr int STAGE = (BM + GM_BN) * GM_LD;  // bf16 per stage: BM token rows, then 128 weight rows
  static_assert(2 * STAGE * 2 >= 8 * 16 * GM_LDE * 4, "epilogue strips fit in the stages");
  __shared__ __align__(128) __nv_bfloat16 sm[2 * STAGE];
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int o0 = blockIdx.x * GM_BN, t0 = blockIdx.y * BM;
  const int wm = (warp >> 2) * (BM / 2), wn = (warp & 3) * 32;  // the warp's corner (token, weight row)
  const bool fastW = cols % GM_BK == 0 && aligned16(W);
  const bool fastX = cols % GM_BK == 0 && ldx % 4 == 0 && aligned16(X);
  const int wr = tid >> 1, wk = (tid & 1) * 16;  // this thread's weight row and k offset in a tile
  F w(W, rows, cols, o0 + wr);
  GemmX<BM> x(X, ldx, T, t0);
  // acc[i][n]: tokens wm+16i+g (+8 for [2], [3]), weight rows wn+8n+2q (+1
  // for [1], [3]), g = lane/4, q = lane%4 (the m16n8 accumulator layout).
  float acc[FT][4][4];
#pragma unroll
  for (int i = 0; i < FT; i++)
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][n][e] = 0.0f;
  // ldmatrix rows of this lane: A (tokens) lane%16 at k + 8·(lane/16);
  // B (weight rows) lane%8 + 8·(lane/16) at k + 8·((lane/8)%2).
  const int arow = (wm + (lane & 15)) * GM_LD + (lane >> 4) * 8;
  const int brow = (wn + (lane & 7) + (lane >> 4) * 8) * GM_LD + ((lane >> 3) & 1) * 8;

  const int nk = (cols + GM_BK - 1) / GM_BK;
  w.load(cols, wk, fastW);  // weights never depend on the previous kernel
  pdl_wait();
  x.load(cols, 0, fastX);
  w.store(sm + BM * GM_LD + wr * GM_LD + wk);
  x.store(sm);
  __syncthreads();
  for (int s = 0; s < nk; s++) {
    const __nv_bfloat16* As = sm + (s & 1) * STAGE;
    const __nv_bfloat16* Bs = As + BM * GM_LD;
    const bool more = s + 1 < nk;
    if (more) {  // the next step into registers, in flight during the MMAs
      w.load(cols, (s + 1) * GM_BK + wk, fastW);
      x.load(cols, (s + 1) * GM_BK, fastX);
    }
#pragma unroll
    for (int kk = 0; kk < GM_BK; kk += 16) {
      uint32_t fa[FT][4], fb[2][4];  // fb[p]: weight rows wn+16p.. : (b0, b1) of tile 2p, then of 2p+1
#pragma unroll
      for (int i = 0; i < FT; i++) gq_ldsm4(fa[i], As + arow + 16 * i * GM_LD + kk);
#pragma unroll
      for (int p = 0; p < 2; p++) gq_ldsm4(fb[p], Bs + brow + 16 * p * GM_LD + kk);
#pragma unroll
      for (int i = 0; i < FT; i++)
#pragma unroll
        for (int n = 0; n < 4; n++) gm_mma(acc[i][n], fa[i], fb[n >> 1][(n & 1) * 2], fb[n >> 1][(n & 1) * 2 + 1]);
    }
    if (more) {  // the other stage was last read before the previous step's barrier
      __nv_bfloat16* nx = sm + ((s + 1) & 1) * STAGE;
      w.store(nx + BM * GM_LD + wr * GM_LD + wk);
      x.store(nx);
    }
    __syncthreads();
  }

  // Epilogue: each warp writes its fragments through a 16×32 strip of
  // shared memory (the stages are free after the loop's last barrier);
  // lane = weight row within the strip, so a row of Y is 128 B at a time.
  float* ep = reinterpret_cast<float*>(sm) + warp * 16 * GM_LDE;
  const int o = o0 + wn + lane;
  const bool ok = o < rows;
  const float sc = ok ? F::scale(W, rows, cols, o) : 0.0f;
  const float bv = ok && bias ? bias[o] : 0.0f;
#pragma unroll
  for (int i = 0; i < FT; i++) {
#pragma unroll
    for (int n = 0; n < 4; n++) {
      const int c = n * 8 + 2 * (lane & 3), g = lane >> 2;
      *reinterpret_cast<float2*>(ep + g * GM_LDE + c) = make_float2(acc[i][n][0], acc[i][n][1]);
      *reinterpret_cast<float2*>(ep + (g + 8) * GM_LDE + c) = make_float2(acc[i][n][2], acc[i][n][3]);
    }
    __syncwarp();
    if (ok) {
      for (int r = 0; r < 16; r++) {
        const int t = t0 + wm + 16 * i + r;
        if (t >= T) break;
        float v = ep[r * GM_LDE + lane] * sc;
        if (bias) v += bv;
        float* y = Y + (size_t)t * ldy + o;
        if (accumulate) v += *y;
        *y = v;
      }
    }
    __syncwarp();
  }
}

#define GEMM_PARAMS                                                                                         \
  const uint8_t *__restrict__ W, int rows, int cols, const float *__restrict__ X, int ldx, float *__restrict__ Y, \
      int ldy, int T, const float *__restrict__ bias, int accumulate
#define GEMM_ARGS W, rows, cols, X, ldx, Y, ldy, T, bias, accumulate
// MINB: blocks per SM the 128-token variant is compiled for (2 caps it at
// 128 registers: no spills for q8/q4tp; the float formats spill at 128).
#define GEMM_KERNELS(name, F, MINB)                                                                   \
  extern "C" __global__ void __launch_bounds__(GM_THREADS, MINB) gemm_##name(GEMM_PARAMS) {           \
    gemm_body<F, 128>(GEMM_ARGS);                                                                     \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(GM_THREADS) gemm_##name##_t64(GEMM_PARAMS) {           \
    gemm_body<F, 64>(GEMM_ARGS);                                                                      \
  }

GEMM_KERNELS(f32, GemmF32, 1)
GEMM_KERNELS(f16, GemmF16, 1)
GEMM_KERNELS(bf16, GemmBF16, 1)
GEMM_KERNELS(q8row, GemmQ8, 2)
GEMM_KERNELS(q4tp, GemmQ4TP, 2)
