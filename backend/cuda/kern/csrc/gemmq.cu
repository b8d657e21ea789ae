// Quantized-activation GEMM on int8 tensor cores ("MMQ"), the CUDA
// device's default for steps of more than 8 rows (off: Options.NoMMQ): Y[t][o] (=|+=) Σ_g s[o][g]·d[t][g]·Σ_{k∈g} wq[o,k]·xq[t,k]
// (+ bias[o]) for q8_row (s = the row scale, applied in the epilogue) and
// q4tp (s = the group's rung, wq = nibble − 8), with xq/d the int8
// activations of kern.ActQuant (blocks of 32: the CPU's rule, the same the
// mq_* matvecs use).
//
// Two kernels a call: gemmq_actq quantizes X once into scratch (xq int8
// [T][cols], d float [T][cols/32]; for q4tp each 8 quants in the order
// (0,2,4,6,1,3,5,7) of a q4tp word's low, then high nibbles, so that a
// word expands to int8 with two masks and no shuffle), then
// gemmq_<fmt>[_t64|_d64] multiplies on mma.sync m16n8k32 s8·s8→s32. A K
// step of 32 is one activation block and one q4tp group: each mma's int32
// partial is converted and scaled (float acc += c·s·d) before the next
// group, since s and d change every 32 k.
//
// Register-staged tiles (256 threads = 8 warps, WM along tokens × 8/WM
// along weight rows; T > 64, and kept for comparison; the cp.async
// small-batch tiles gemmq_<fmt>_s* for T ≤ 64 follow below):
//   gemmq_<fmt>       128 weight rows × 128 tokens, 1 group a stage
//   gemmq_<fmt>_t64   128 weight rows × 64 tokens, 2 groups a stage
//   gemmq_<fmt>_d64   32 weight rows × 64 tokens, 4 groups a stage (T ≤ 64:
//                     batched decode; 4× the blocks of a 128-row tile, so
//                     that narrow outputs still spread over the SMs)
// Stages are register-staged and double-buffered as in gemm.cu: the next
// stage's weights (raw bytes), quants and scales are loaded into registers
// during the MMAs, then expanded into the other shared stage. Shared rows
// are KG·32 + 16 bytes (ldmatrix conflict-free). Fragments are loaded with
// ldmatrix on b16 units: a 16×32-byte int8 tile is the same bytes as a
// 16×16 b16 tile, and the m16n8k32 s8 A/B/C fragments are the m16n8k16
// b16 ones with each b16 pair read as 4 bytes (PTX ISA, "Matrix Fragments
// for mma.m16n8k32").
//
// Launch: gemmq_actq grid (⌈nb/8⌉, T), block 256 (a warp a block of 32),
// parameters (X, ldx, cols, XQ, D, perm); gemmq_* grid (⌈rows/BN⌉,
// ⌈T/BM⌉), block 256, no dynamic shared memory, parameters (W, rows, cols,
// XQ, D, Y, ldy, T, bias, accumulate). Needs cols % 32 == 0 and W 16-byte
// aligned (the launcher checks; st.mv keeps the bf16 GEMM otherwise).
// Rows past `rows` or T read the last valid row and are never stored.
#include "common.cuh"
#include <cuda_fp16.h>

#define GQ_THREADS 256

// One block of 32 activations a warp (lane's value v): amax, 127/amax,
// round-half-even, d = amax/127, zeros for amax < 2^-120 or a NaN
// (kernels/quantx.go); quants at xq[0..32) in perm's order, d at *dp.
__device__ __forceinline__ void gq_quant32(float v, int lane, int perm, int8_t* __restrict__ xq, float* __restrict__ dp) {
  const float am = warp_max(fabsf(v));
  const bool nan = __any_sync(FULL_MASK, v != v);
  int q = 0;
  float d = 0.0f;
  if (!nan && am >= 0x1p-120f) {
    q = __float2int_rn(__fmul_rn(v, __fdiv_rn(127.0f, am)));
    d = __fdiv_rn(am, 127.0f);
  }
  const int e = lane & 7;
  // perm 1: q4tp's order for the register-staged and _s tiles; 2 (q4tp)
  // and 3 (q8_row): the wide tiles' (lane q of a B fragment reads word q).
  const int q8 = lane >> 3;
  const int p = perm == 1   ? (lane & ~7) + (e >> 1) + 4 * (e & 1)
                : perm == 2 ? 4 * q8 + (e >> 1) + 16 * (e & 1)
                : perm == 3 ? 4 * q8 + (e & 3) + 16 * (e >> 2)
                            : lane;
  xq[p] = (int8_t)q;
  if (lane == 0) *dp = d;
}

extern "C" __global__ void __launch_bounds__(GQ_THREADS) gemmq_actq(const float* __restrict__ X, int ldx, int cols,
                                                                    int8_t* __restrict__ XQ, float* __restrict__ D,
                                                                    int perm) {
  pdl_trigger();
  const int lane = threadIdx.x & 31, nb = cols / 32;
  const int b = blockIdx.x * (GQ_THREADS / 32) + (threadIdx.x >> 5), t = blockIdx.y;
  pdl_wait();
  if (b >= nb) return;  // uniform over the warp
  gq_quant32(X[(size_t)t * ldx + b * 32 + lane], lane, perm, XQ + (size_t)t * cols + b * 32, D + (size_t)t * nb + b);
}

// gemmq_actq_pro: gemmq_actq of a prologue of X, so the GEMM needs no
// separate rmsnorm or silu_mul launch: pro 1 (norm) rmsnorm(X[t])·nw
// (one_plus: ·(1 + nw)) with rmsnorm's arithmetic — every block sums the
// row's squares with norm.cu's thread order and tree, so the values equal
// rmsnorm's bit for bit; pro 3 (silu) silu(X[t][i])·U[t][i] with
// silu_mul's expression, U at the same stride. Launch kern.ActProLaunch
// (RMSNorm: fewer blocks a row, each block's warps looping over the row's
// blocks of 32 after summing the whole row); the first six parameters as
// gemmq_actq's.
// The prologue of gemmq_actq_pro and gemmh_acth over row xr: gq_pro_inv
// is RMSNorm's 1/rms for pro 1 (every thread of the block calls it: it
// sums the row's squares with norm.cu's thread order and tree), else 0;
// gq_pro_val is element i's value: pro 0 x itself, 1 rms_apply, 3
// silu(x)·ur[i] with silu_mul's expression; any other pro traps.
__device__ __forceinline__ float gq_pro_inv(const float* __restrict__ xr, int cols, int pro, float eps, double* sh) {
  if (pro != 1) return 0.0f;
  double ss = 0.0;
  for (int i = threadIdx.x; i < cols; i += GQ_THREADS) ss += (double)xr[i] * (double)xr[i];
  ss = block_sum_d(ss, sh);
  return rms_inv(ss, cols, eps);
}
__device__ __forceinline__ float gq_pro_val(float v, int i, int pro, float inv, const float* __restrict__ ur,
                                            const float* __restrict__ nw, int one_plus) {
  if (pro == 1) return rms_apply(v, inv, nw[i], one_plus);
  if (pro == 3) return v / (1.0f + expf(-v)) * ur[i];
  if (pro != 0) __trap();  // no such prologue
  return v;
}

extern "C" __global__ void __launch_bounds__(GQ_THREADS)
    gemmq_actq_pro(const float* __restrict__ X, int ldx, int cols, int8_t* __restrict__ XQ, float* __restrict__ D, int perm,
                   int pro, const float* __restrict__ U, const float* __restrict__ nw, float eps, int one_plus) {
  __shared__ double sh[32];
  pdl_trigger();
  const int lane = threadIdx.x & 31, nb = cols / 32;
  const int b = blockIdx.x * (GQ_THREADS / 32) + (threadIdx.x >> 5), t = blockIdx.y;
  pdl_wait();
  const float* xr = X + (size_t)t * ldx;
  const float inv = gq_pro_inv(xr, cols, pro, eps, sh);
  for (int bb = b; bb < nb; bb += gridDim.x * (GQ_THREADS / 32)) {  // uniform over the warp
    const int i = bb * 32 + lane;
    const float v = gq_pro_val(xr[i], i, pro, inv, U + (size_t)t * ldx, nw, one_plus);
    gq_quant32(v, lane, perm, XQ + (size_t)t * cols + bb * 32, D + (size_t)t * nb + bb);
  }
}


// c = A·B for A 16×32 s8 (row), B 32×8 s8 (col), int32 accumulation
// from GQ_BIAS = the bits of 1.5·2^23: a partial |Σ| < 2^22 (here at most
// 32·127·127) leaves c the bits of the float 1.5·2^23 + Σ exactly, so
// gq_f(c) = Σ as a float with one FADD instead of an I2F conversion
// (quarter-rate or less on the SM's integer-to-float path).
#define GQ_BIAS 0x4B400000
__device__ __forceinline__ void gq_mma(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(GQ_BIAS));
}
__device__ __forceinline__ float gq_f(int c) { return __int_as_float(c) - 12582912.0f; }

// Weight stagers: a unit is half a group (16 int8 weights) of one row;
// load fetches it (zeros past the row's groups), store writes the 16
// int8 at dst and, for q4tp, the group's rung at *rung (first half only).
struct GemmQQ8 {
  const uint8_t* w;
  uint4 v;
  __device__ void init(const uint8_t* W, int rows, int cols, int o) { w = W + (size_t)min(o, rows - 1) * cols; }
  __device__ void load(int nb, int g, int half) {
    v = g < nb ? *reinterpret_cast<const uint4*>(w + (size_t)g * 32 + half * 16) : make_uint4(0, 0, 0, 0);
  }
  __device__ void store(uint8_t* dst, float*, int) const { *reinterpret_cast<uint4*>(dst) = v; }
  static constexpr bool kRung = false;
  __device__ static float scale(const uint8_t* W, int rows, int cols, int o) {
    return f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)o));
  }
};

struct GemmQQ4TP {
  const uint8_t* nib;
  const uint8_t* code;
  uint16_t a, b;
  uint2 v;
  int c;
  __device__ void init(const uint8_t* W, int rows, int cols, int o) {
    o = min(o, rows - 1);
    const int gpr = cols / 32;
    const size_t poff = (size_t)rows * gpr * 16, coff = poff + (size_t)rows * 4;
    a = ld_u16(W + poff + 4 * (size_t)o);
    b = ld_u16(W + poff + 4 * (size_t)o + 2);
    nib = W + (size_t)o * gpr * 16;
    code = W + coff + (size_t)o * ((5 * gpr + 7) / 8);
  }
  __device__ void load(int nb, int g, int half) {
    if (g < nb) {
      v = *reinterpret_cast<const uint2*>(nib + (size_t)g * 16 + half * 8);
      c = half == 0 ? q4tp_code(code, g) : 0;
    } else {
      v = make_uint2(0x88888888u, 0x88888888u);  // nibbles 8: weights 0
      c = -1;
    }
  }
  // Word j of a group holds weights 8j..8j+7, low nibble first: its low
  // nibbles are weights 8j+0,2,4,6, its high ones 8j+1,3,5,7, the order
  // gemmq_actq gives q4tp's quants.
  __device__ static uint32_t lo(uint32_t x) { return __vsub4(x & 0x0F0F0F0Fu, 0x08080808u); }
  __device__ static uint32_t hi(uint32_t x) { return __vsub4((x >> 4) & 0x0F0F0F0Fu, 0x08080808u); }
  __device__ void store(uint8_t* dst, float* rung, int half) const {
    *reinterpret_cast<uint4*>(dst) = make_uint4(lo(v.x), hi(v.x), lo(v.y), hi(v.y));
    if (half == 0) *rung = c < 0 ? 0.0f : q4tp_rung(a, b, c);
  }
  static constexpr bool kRung = true;
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};

template <class F, int BM, int BN, int WM, int KG>
__device__ __forceinline__ void gemmq_body(const uint8_t* __restrict__ W, int rows, int cols,
                                           const int8_t* __restrict__ XQ, const float* __restrict__ D,
                                           float* __restrict__ Y, int ldy, int T, const float* __restrict__ bias,
                                           int accumulate) {
  constexpr int WN = 8 / WM;
  constexpr int TM = BM / WM, TN = BN / WN;  // a warp's tokens and weight rows
  constexpr int FT = TM / 16, FN = TN / 8;   // its m16 and n8 tiles
  static_assert(FT >= 1 && FN >= 2 && FN % 2 == 0 && TM % 16 == 0 && TN % 16 == 0, "warp tile");
  constexpr int LDS = KG * 32 + 16;                         // bytes a shared row
  constexpr int UW = BN * KG * 2 / GQ_THREADS;              // weight units a thread
  constexpr int UX = BM * KG * 2 / GQ_THREADS;              // 16-byte quant units a thread
  static_assert(UW >= 1 && UX >= 1 && UW * GQ_THREADS == BN * KG * 2 && UX * GQ_THREADS == BM * KG * 2, "stagers");
  static_assert(BM * KG <= GQ_THREADS, "one d a thread");
  constexpr int OFF_B = BM * LDS, OFF_D = OFF_B + BN * LDS, OFF_R = OFF_D + BM * KG * 4;
  constexpr int STAGE = OFF_R + BN * KG * 4;
  static_assert(STAGE % 16 == 0, "stage alignment");
  __shared__ __align__(128) uint8_t sm[2 * STAGE];
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int o0 = blockIdx.x * BN, t0 = blockIdx.y * BM;
  const int wm = (warp / WN) * TM, wn = (warp % WN) * TN;
  const int nb = cols / 32, nk = (nb + KG - 1) / KG;

  // Unit u of a stage: row u / (2·KG), group (u / 2) % KG, half u % 2.
  F w[UW];
#pragma unroll
  for (int j = 0; j < UW; j++) w[j].init(W, rows, cols, o0 + (tid + GQ_THREADS * j) / (2 * KG));
  uint4 xv[UX];
  float dv = 0.0f;
  const int8_t* xrow[UX];
#pragma unroll
  for (int j = 0; j < UX; j++) xrow[j] = XQ + (size_t)min(t0 + (tid + GQ_THREADS * j) / (2 * KG), T - 1) * cols;
  const int dt = min(t0 + tid / KG, T - 1), dg = tid % KG;
  auto loadW = [&](int s) {
#pragma unroll
    for (int j = 0; j < UW; j++) {
      const int u = tid + GQ_THREADS * j;
      w[j].load(nb, s * KG + (u / 2) % KG, u & 1);
    }
  };
  auto loadX = [&](int s) {
#pragma unroll
    for (int j = 0; j < UX; j++) {
      const int u = tid + GQ_THREADS * j, g = s * KG + (u / 2) % KG;
      xv[j] = g < nb ? *reinterpret_cast<const uint4*>(xrow[j] + (size_t)g * 32 + (u & 1) * 16) : make_uint4(0, 0, 0, 0);
    }
    if (tid < BM * KG) dv = s * KG + dg < nb ? D[(size_t)dt * nb + s * KG + dg] : 0.0f;
  };
  auto store = [&](uint8_t* st) {
#pragma unroll
    for (int j = 0; j < UW; j++) {
      const int u = tid + GQ_THREADS * j, r = u / (2 * KG), g = (u / 2) % KG;
      w[j].store(st + OFF_B + r * LDS + g * 32 + (u & 1) * 16, reinterpret_cast<float*>(st + OFF_R) + g * BN + r, u & 1);
    }
#pragma unroll
    for (int j = 0; j < UX; j++) {
      const int u = tid + GQ_THREADS * j, r = u / (2 * KG), g = (u / 2) % KG;
      *reinterpret_cast<uint4*>(st + r * LDS + g * 32 + (u & 1) * 16) = xv[j];
    }
    if (tid < BM * KG) reinterpret_cast<float*>(st + OFF_D)[dg * BM + tid / KG] = dv;
  };

  // acc[i][n]: tokens wm+16i+g (+8 for [2], [3]), weight rows wn+8n+2q
  // (+1 for [1], [3]), g = lane/4, q = lane%4.
  float acc[FT][FN][4];
#pragma unroll
  for (int i = 0; i < FT; i++)
#pragma unroll
    for (int n = 0; n < FN; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][n][e] = 0.0f;
  const int arow = (wm + (lane & 15)) * LDS + (lane >> 4) * 16;
  const int brow = (wn + (lane & 7) + (lane >> 4) * 8) * LDS + ((lane >> 3) & 1) * 16;
  const int g4 = lane >> 2, q4 = lane & 3;

  loadW(0);  // weights never depend on the previous kernel
  pdl_wait();
  loadX(0);
  store(sm);
  __syncthreads();
  for (int s = 0; s < nk; s++) {
    const uint8_t* st = sm + (s & 1) * STAGE;
    const bool more = s + 1 < nk;
    if (more) {
      loadW(s + 1);
      loadX(s + 1);
    }
#pragma unroll
    for (int kg = 0; kg < KG; kg++) {
      uint32_t fa[FT][4], fb[FN / 2][4];
#pragma unroll
      for (int i = 0; i < FT; i++) gq_ldsm4(fa[i], st + arow + 16 * i * LDS + kg * 32);
#pragma unroll
      for (int p = 0; p < FN / 2; p++) gq_ldsm4(fb[p], st + OFF_B + brow + 16 * p * LDS + kg * 32);
      const float* sd = reinterpret_cast<const float*>(st + OFF_D) + kg * BM + wm + g4;
      const float* sr = reinterpret_cast<const float*>(st + OFF_R) + kg * BN + wn + 2 * q4;
      float rs[FN][2];
#pragma unroll
      for (int n = 0; n < FN; n++) {
        rs[n][0] = F::kRung ? sr[8 * n] : 1.0f;
        rs[n][1] = F::kRung ? sr[8 * n + 1] : 1.0f;
      }
#pragma unroll
      for (int i = 0; i < FT; i++) {
        const float d0 = sd[16 * i], d1 = sd[16 * i + 8];
#pragma unroll
        for (int n = 0; n < FN; n++) {
          int c[4];
          gq_mma(c, fa[i], fb[n >> 1][(n & 1) * 2], fb[n >> 1][(n & 1) * 2 + 1]);
          acc[i][n][0] += gq_f(c[0]) * (d0 * rs[n][0]);
          acc[i][n][1] += gq_f(c[1]) * (d0 * rs[n][1]);
          acc[i][n][2] += gq_f(c[2]) * (d1 * rs[n][0]);
          acc[i][n][3] += gq_f(c[3]) * (d1 * rs[n][1]);
        }
      }
    }
    if (more) store(sm + ((s + 1) & 1) * STAGE);  // last read before the previous barrier
    __syncthreads();
  }

  // Epilogue straight from the fragments: each thread holds rows o, o+1
  // of tokens t, t+8 per tile.
#pragma unroll
  for (int n = 0; n < FN; n++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int o = o0 + wn + 8 * n + 2 * q4 + h;
      if (o >= rows) continue;
      const float sc = F::scale(W, rows, cols, o), bv = bias ? bias[o] : 0.0f;
#pragma unroll
      for (int i = 0; i < FT; i++) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
          const int t = t0 + wm + 16 * i + g4 + 8 * u;
          if (t >= T) continue;
          float v = acc[i][n][2 * u + h] * sc + bv;
          float* y = Y + (size_t)t * ldy + o;
          if (accumulate) v += *y;
          *y = v;
        }
      }
    }
  }
}

#define GEMMQ_PARAMS                                                                                       \
  const uint8_t *__restrict__ W, int rows, int cols, const int8_t *__restrict__ XQ, const float *__restrict__ D, \
      float *__restrict__ Y, int ldy, int T, const float *__restrict__ bias, int accumulate
#define GEMMQ_ARGS W, rows, cols, XQ, D, Y, ldy, T, bias, accumulate
// MB*: blocks per SM each tile is compiled for (2 caps it at 128
// registers; 1 where 128 would spill).
#define GEMMQ_KERNELS(name, F, MB, MBT, MBD)                                                       \
  extern "C" __global__ void __launch_bounds__(GQ_THREADS, MB) gemmq_##name(GEMMQ_PARAMS) {        \
    gemmq_body<F, 128, 128, 2, 1>(GEMMQ_ARGS);                                                     \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(GQ_THREADS, MBT) gemmq_##name##_t64(GEMMQ_PARAMS) { \
    gemmq_body<F, 64, 128, 2, 2>(GEMMQ_ARGS);                                                      \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(GQ_THREADS, MBD) gemmq_##name##_d64(GEMMQ_PARAMS) { \
    gemmq_body<F, 64, 32, 4, 4>(GEMMQ_ARGS);                                                       \
  }

GEMMQ_KERNELS(q8row, GemmQQ8, 1, 2, 2)
GEMMQ_KERNELS(q4tp, GemmQQ4TP, 1, 1, 2)

// ---------------------------------------------------------------------------
// Small-batch tiles gemmq_<fmt>_s<BM>[h] (batched decode, T ≤ 64; BM = 16,
// 32 or 64 tokens a block, BN = 64 weight rows, two blocks an SM, or 32
// with the suffix h for outputs of at most 4096 rows: at most 128 blocks,
// one an SM, so their rings are deeper, 160–203 KB, to keep as many weight
// bytes in flight with half the blocks): weights stream through an NS-stage
// cp.async ring in shared memory as stored (q8_row's int8, q4tp's raw
// nibble words and its 5-bit codes), no register staging; the int8
// activations and their scales ride the same ring. A stage is KG groups.
// The 8 warps split the block WN ways along weight rows and WK ways along
// K: warp (wn, wk) takes groups wk, wk+WK, ... of every stage for all BM
// tokens and TN = BN/WN rows, so each weight byte is read from shared once.
// q4tp's B fragments are expanded from the raw words in registers: with
// gemmq_actq's order a thread (g = lane/4, q = lane%4) needs words q>>1
// and 2+(q>>1) of row g's group, low nibbles for even q, high ones for odd
// (byte-wise n − 8 as ((n + 0x78) ^ 0x80), exact for n in 0..15). Its rungs
// are computed once per (row, group) a stage ahead from the codes in the
// ring (one phase after their stage has landed), so q4tp waits for two
// stages (cp.async.wait_group NS−3) where q8_row waits for one (NS−2).
// Rounding: each warp accumulates its groups in increasing order exactly
// as the other tiles (acc += f(c)·(d·rung)); the WK partial sums are then
// added in the fixed order wk = 0, 1, ... in shared memory, scaled (q8_row)
// and stored with bias/accumulate: bit-reproducible, and within float32
// rounding of the single-accumulator order (TestGemmQSmallEmulation bounds
// the NMSE against it). Launch: grid (⌈rows/BN⌉, ⌈T/BM⌉), block 256,
// dynamic shared memory NS·stage bytes (kern.GemmQSmallTiles), the same
// parameters as the other tiles.

__device__ __forceinline__ void gq_cp16(void* dst, const void* src, bool pred) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
// gq_cp16 through L1 (cp.async.ca: a block on the same SM reading the same
// 16 bytes soon after may hit there).
__device__ __forceinline__ void gq_cp16ca(void* dst, const void* src, bool pred) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
__device__ __forceinline__ void gq_cp4(void* dst, const void* src, bool pred) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(pred ? 4 : 0) : "memory");
}
__device__ __forceinline__ void gq_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gq_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Formats of the small tiles: kWB weight bytes a row and group, where a
// row's weights start, and whether groups carry rungs.
struct GQSQ8 {
  static constexpr int kWB = 32;
  static constexpr bool kRung = false;
  __device__ static const uint8_t* row(const uint8_t* W, int, int cols, int o) { return W + (size_t)o * cols; }
  // b0, b1 of the m16n8k32 B fragment: bytes 4q.. and 16+4q.. of the group.
  __device__ static void frag(const uint8_t* grp, int q, uint32_t& b0, uint32_t& b1) {
    b0 = *reinterpret_cast<const uint32_t*>(grp + 4 * q);
    b1 = *reinterpret_cast<const uint32_t*>(grp + 16 + 4 * q);
  }
  __device__ static float scale(const uint8_t* W, int rows, int cols, int o) {
    return f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)o));
  }
};

struct GQSQ4 {
  static constexpr int kWB = 16;
  static constexpr bool kRung = true;
  __device__ static const uint8_t* row(const uint8_t* W, int, int cols, int o) { return W + (size_t)o * (cols / 32) * 16; }
  __device__ static uint32_t nib(uint32_t x) { return ((x & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u; }
  __device__ static void frag(const uint8_t* grp, int q, uint32_t& b0, uint32_t& b1) {
    const int sh = 4 * (q & 1);
    b0 = nib(*reinterpret_cast<const uint32_t*>(grp + 4 * (q >> 1)) >> sh);
    b1 = nib(*reinterpret_cast<const uint32_t*>(grp + 8 + 4 * (q >> 1)) >> sh);
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};

template <class F, int BM, int BN, int WN, int WK, int KG, int NS>
__device__ __forceinline__ void gemmq_small(const uint8_t* __restrict__ W, int rows, int cols,
                                            const int8_t* __restrict__ XQ, const float* __restrict__ D,
                                            float* __restrict__ Y, int ldy, int T, const float* __restrict__ bias,
                                            int accumulate) {
  constexpr int FT = BM / 16, TN = BN / WN, FN = TN / 8;
  static_assert(WN * WK == 8 && TN % 8 == 0 && KG % WK == 0 && BM % 16 == 0, "warp tile");
  static_assert(!F::kRung || KG <= 6 || KG == 8, "q4tp's code window: 5·KG bits from a byte offset < 8 in 64 bits");
  static_assert(NS >= 3, "ring");
  constexpr int LDA = KG * 32 + 16, LDB = KG * F::kWB + 16;  // shared row bytes (ldmatrix / LDS conflict-free)
  constexpr int OFF_B = BM * LDA, OFF_D = OFF_B + BN * LDB, OFF_R = OFF_D + BM * KG * 4;
  constexpr int OFF_C = OFF_R + (F::kRung ? BN * KG * 4 : 0);  // q4tp: 8 code bytes a row
  constexpr int STAGE = OFF_C + (F::kRung ? BN * 8 : 0);
  constexpr int LDR = BN + 4;  // reduction row floats
  static_assert(STAGE % 16 == 0 && WK * BM * LDR * 4 <= NS * STAGE, "stage layout");
  extern __shared__ __align__(16) uint8_t gq_dsm[];
  uint8_t* const sm = gq_dsm;
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int o0 = blockIdx.x * BN, t0 = blockIdx.y * BM;
  const int wn = (warp % WN) * TN, wk = warp / WN;
  const int nb = cols / 32, nk = (nb + KG - 1) / KG;
  const int gpr = nb, cbytes = (5 * gpr + 7) / 8;
  const size_t coff = (size_t)rows * gpr * 16 + (size_t)rows * 4, wend = coff + (size_t)rows * cbytes;

  // Producers: 16-byte chunks of weights and activations, 4-byte scales
  // and (q4tp) the two aligned code words around a stage's first code.
  auto issueW = [&](int s) {
    uint8_t* st = sm + (s % NS) * STAGE;
    constexpr int CW = KG * F::kWB / 16;  // chunks a row
#pragma unroll
    for (int u = tid; u < BN * CW; u += GQ_THREADS) {
      const int r = u / CW, c = u % CW, g = s * KG + c * 16 / F::kWB;
      const uint8_t* src = F::row(W, rows, cols, min(o0 + r, rows - 1)) + (size_t)s * KG * F::kWB + c * 16;
      gq_cp16(st + OFF_B + r * LDB + c * 16, g < nb ? src : W, g < nb);
    }
    if (F::kRung) {
      for (int u = tid; u < BN * 2; u += GQ_THREADS) {
        const int r = u >> 1;
        const size_t p = coff + (size_t)min(o0 + r, rows - 1) * cbytes + (size_t)(5 * KG * s) / 8;
        const size_t a = (p & ~(size_t)3) + 4 * (u & 1);
        uint8_t* dst = st + OFF_C + r * 8 + 4 * (u & 1);
        if (a + 4 <= wend) {
          gq_cp4(dst, W + a, true);
        } else {  // the tensor's last, partial word (or none): its bytes, zeros past the end, never read past it
          uint32_t v = 0;
          for (int e = 0; e < 4; e++)
            if (a + e < wend) v |= (uint32_t)W[a + e] << (8 * e);
          *reinterpret_cast<uint32_t*>(dst) = v;
        }
      }
    }
  };
  auto issueX = [&](int s) {
    uint8_t* st = sm + (s % NS) * STAGE;
#pragma unroll
    for (int u = tid; u < BM * KG * 2; u += GQ_THREADS) {
      const int r = u / (2 * KG), c = u % (2 * KG), g = s * KG + c / 2;
      const int8_t* src = XQ + (size_t)min(t0 + r, T - 1) * cols + (size_t)s * KG * 32 + c * 16;
      gq_cp16(st + r * LDA + c * 16, g < nb ? src : XQ, g < nb);
    }
#pragma unroll
    for (int u = tid; u < BM * KG; u += GQ_THREADS) {
      const int r = u / KG, kg = u % KG, g = s * KG + kg;
      const float* src = D + (size_t)min(t0 + r, T - 1) * nb + g;
      gq_cp4(st + OFF_D + (kg * BM + r) * 4, g < nb ? src : D, g < nb);
    }
  };
  // q4tp: the rows' ladders (a | b << 16), read once (visible to rungs(0)
  // after the prologue's barrier).
  __shared__ uint32_t ladder[F::kRung ? BN : 1];
  if (F::kRung && tid < BN) {
    const size_t po = (size_t)rows * gpr * 16 + 4 * (size_t)min(o0 + tid, rows - 1);
    ladder[tid] = (uint32_t)ld_u16(W + po) | ((uint32_t)ld_u16(W + po + 2) << 16);
  }
  // q4tp: the rungs of stage s from its codes (landed and visible).
  auto rungs = [&](int s) {
    uint8_t* st = sm + (s % NS) * STAGE;
#pragma unroll 1
    for (int u = tid; u < BN * KG; u += GQ_THREADS) {
      const int r = u / KG, kg = u % KG, g = s * KG + kg, o = min(o0 + r, rows - 1);
      const size_t p = coff + (size_t)o * cbytes + (size_t)(5 * KG * s) / 8;
      const uint2 cw = *reinterpret_cast<const uint2*>(st + OFF_C + r * 8);
      const uint64_t win = (uint64_t)cw.x | ((uint64_t)cw.y << 32);
      const int code = (int)((win >> ((p & 3) * 8 + (5 * KG * s) % 8 + 5 * kg)) & 31u);
      const uint32_t ab = ladder[r];
      reinterpret_cast<float*>(st + OFF_R)[kg * BN + r] =
          g < nb ? q4tp_rung((uint16_t)ab, (uint16_t)(ab >> 16), code) : 0.0f;
    }
  };

  float acc[FT][FN][4];
#pragma unroll
  for (int i = 0; i < FT; i++)
#pragma unroll
    for (int n = 0; n < FN; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][n][e] = 0.0f;
  const int arow = (lane & 15) * LDA + (lane >> 4) * 16;
  const int g4 = lane >> 2, q4 = lane & 3;
  const int brow = (wn + g4) * LDB;

  // Prologue: stages 0..NS−2 in flight (group 0 also holds every weight
  // copy issued before the previous kernel finished).
#pragma unroll 1
  for (int s = 0; s < NS - 1; s++)
    if (s < nk) issueW(s);
  pdl_wait();
#pragma unroll 1
  for (int s = 0; s < NS - 1; s++) {
    if (s < nk) issueX(s);
    gq_commit();
  }
  if (F::kRung) {
    gq_wait<NS - 2>();
    __syncthreads();
    rungs(0);
  }
#pragma unroll 1
  for (int s = 0; s < nk; s++) {
    if (F::kRung)
      gq_wait<NS - 3>();  // stages s and s+1 landed
    else
      gq_wait<NS - 2>();  // stage s landed
    __syncthreads();      // ... for every thread; iteration s−1 done with its slots
    if (F::kRung && s + 1 < nk) rungs(s + 1);
    if (s + NS - 1 < nk) {
      issueW(s + NS - 1);
      issueX(s + NS - 1);
    }
    gq_commit();
    const uint8_t* st = sm + (s % NS) * STAGE;
#pragma unroll 1  // (unrolled, gemmq_q4tp_s64 spilled at 128 registers)
    for (int kk = 0; kk < KG / WK; kk++) {
      const int kg = kk * WK + wk;
      uint32_t fb[FN][2];
#pragma unroll
      for (int n = 0; n < FN; n++) F::frag(st + OFF_B + brow + 8 * n * LDB + kg * F::kWB, q4, fb[n][0], fb[n][1]);
      const float* sd = reinterpret_cast<const float*>(st + OFF_D) + kg * BM + g4;
      const float* sr = reinterpret_cast<const float*>(st + OFF_R) + kg * BN + wn + 2 * q4;
      float rs[FN][2];
#pragma unroll
      for (int n = 0; n < FN; n++) {
        rs[n][0] = F::kRung ? sr[8 * n] : 1.0f;
        rs[n][1] = F::kRung ? sr[8 * n + 1] : 1.0f;
      }
#pragma unroll
      for (int i = 0; i < FT; i++) {
        uint32_t fa[4];  // one m16 tile's A at a time: fewer live registers
        gq_ldsm4(fa, st + arow + 16 * i * LDA + kg * 32);
        const float d0 = sd[16 * i], d1 = sd[16 * i + 8];
#pragma unroll
        for (int n = 0; n < FN; n++) {
          int c[4];
          gq_mma(c, fa, fb[n][0], fb[n][1]);
          acc[i][n][0] += gq_f(c[0]) * (d0 * rs[n][0]);
          acc[i][n][1] += gq_f(c[1]) * (d0 * rs[n][1]);
          acc[i][n][2] += gq_f(c[2]) * (d1 * rs[n][0]);
          acc[i][n][3] += gq_f(c[3]) * (d1 * rs[n][1]);
        }
      }
    }
  }
  gq_wait<0>();
  __syncthreads();  // the ring is free: it holds the WK partial sums now

  // red[wk][t][o]: this warp's partials of tokens 16i+g4 (+8), rows
  // wn+8n+2q4 (+1).
  float* red = reinterpret_cast<float*>(sm) + wk * BM * LDR;
#pragma unroll
  for (int i = 0; i < FT; i++)
#pragma unroll
    for (int n = 0; n < FN; n++)
#pragma unroll
      for (int u = 0; u < 2; u++)
        *reinterpret_cast<float2*>(red + (16 * i + g4 + 8 * u) * LDR + wn + 8 * n + 2 * q4) =
            make_float2(acc[i][n][2 * u], acc[i][n][2 * u + 1]);
  __syncthreads();
  const float* rd = reinterpret_cast<const float*>(sm);
#pragma unroll 1
  for (int idx = tid; idx < BM * BN; idx += GQ_THREADS) {
    const int tl = idx / BN, ol = idx % BN, t = t0 + tl, o = o0 + ol;
    if (t >= T || o >= rows) continue;
    float v = rd[tl * LDR + ol];
#pragma unroll
    for (int k = 1; k < WK; k++) v += rd[(k * BM + tl) * LDR + ol];
    v = v * F::scale(W, rows, cols, o) + (bias ? bias[o] : 0.0f);
    float* y = Y + (size_t)t * ldy + o;
    if (accumulate) v += *y;
    *y = v;
  }
}

// name, format, BM, BN, WN, WK, KG, NS (kern.GemmQSmallTiles mirrors these).
#define GEMMQ_SMALL(name, F, BM, BN, WN, WK, KG, NS)                                         \
  extern "C" __global__ void __launch_bounds__(GQ_THREADS, 2) gemmq_##name(GEMMQ_PARAMS) { \
    gemmq_small<F, BM, BN, WN, WK, KG, NS>(GEMMQ_ARGS);                                      \
  }
GEMMQ_SMALL(q4tp_s16, GQSQ4, 16, 64, 1, 8, 8, 6)
GEMMQ_SMALL(q4tp_s16h, GQSQ4, 16, 32, 1, 8, 8, 16)
GEMMQ_SMALL(q4tp_s32, GQSQ4, 32, 64, 2, 4, 4, 9)
GEMMQ_SMALL(q4tp_s32h, GQSQ4, 32, 32, 1, 8, 8, 12)
GEMMQ_SMALL(q4tp_s64, GQSQ4, 64, 64, 4, 2, 4, 6)
GEMMQ_SMALL(q4tp_s64h, GQSQ4, 64, 32, 2, 4, 8, 8)
GEMMQ_SMALL(q8row_s16, GQSQ8, 16, 64, 1, 8, 8, 5)
GEMMQ_SMALL(q8row_s16h, GQSQ8, 16, 32, 1, 8, 8, 12)
GEMMQ_SMALL(q8row_s32, GQSQ8, 32, 64, 2, 4, 8, 4)
GEMMQ_SMALL(q8row_s32h, GQSQ8, 32, 32, 1, 8, 8, 10)
GEMMQ_SMALL(q8row_s64, GQSQ8, 64, 64, 4, 2, 4, 5)
GEMMQ_SMALL(q8row_s64h, GQSQ8, 64, 32, 2, 4, 8, 7)

// ---------------------------------------------------------------------------
// Wide tiles gemmq_<fmt>_w<BM>k<KS> (batched decode, T ≤ 64; the default
// there): 128 weight rows a block, 16 a warp (two n8 tiles: every warp has
// its own rows, so each weight byte is read from shared memory once), all
// BM = 16·FT tokens, and the K range split over the KS blocks of a thread
// block cluster (1, KS, 1) (grid (⌈rows/128⌉, KS, ⌈T/BM⌉)): each block sums
// its slice's chunks of CG = 8 groups, then the cluster adds the KS partial
// tiles from one another's shared memory (distributed shared memory) in
// the fixed order rank 0, 1, ..., each block finishing 1/KS of the tile:
// bit-reproducible, no global scratch. Why: the _s tiles spend ~37
// instructions an mma (ncu, stop 19) on per-stage address arithmetic,
// copies of activations for every 32-64 rows, and rungs; here the
// activations of a chunk serve 128 rows, a thread's copies keep fixed
// slots (pointers advance by a constant), and the B fragments cost one
// shared load and 1-3 logic operations:
//   - the activations come in a per-format order (gemmq_actq perm 2 for
//     q4tp, 3 for q8_row; kern.GemmQPerm) such that lane (g, q) of the
//     m16n8k32 B fragment reads exactly word q of row g's group (q4tp:
//     its low nibbles are k slots 4q.., its high ones 16+4q..) or bytes
//     8q..8q+7 (q8_row: one 8-byte load);
//   - q4tp's nibbles become 16·(n − 8) with one or two operations
//     (n·16 ^ 0x80 is 16n − 128 as a signed byte): the int32 sum is 16×
//     the true one (|Σ| ≤ 32·128·127 < 2^22, still exact through GQ_BIAS)
//     and the rung carries the 1/16 (exact), so acc += f(c)·(d·rung) is
//     the same float arithmetic as the other tiles'.
// Stage s of a block's slice (a cp.async ring of NS stages): BM activation
// rows of CG·32 bytes (+16), their CG·BM scales ([kg][t]), 128 weight rows
// of CG·WB bytes (+16 for q4tp, +32 for q8_row: conflict-free fragment
// loads) and, for q4tp, each row's two aligned code words around the
// chunk's first code (CG = 8: 40 bits from a byte boundary). Each warp
// turns its 16 rows' codes into rungs (a lane per row and 4 groups) in a
// buffer of its own after the stage lands. Up to three tensors of one
// width (q|k|v, gate|up) share a launch: blocks take 128-row tiles of W0,
// then W1, then W2, writing Y's columns in that order. Scales sit [kg][g][i][u] for
// token 16i + 8u + g, so that a lane loads its 2·FT with one or two vector
// loads. Launch: block 256, dynamic
// shared memory kern.GemmQTile.Shared, parameters GEMMQW_PARAMS.

__device__ __forceinline__ void gq_cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
// The float4 at p in the shared memory of cluster block rank.
__device__ __forceinline__ float4 gq_ld_cluster4(const float* p, uint32_t rank) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(r)
               : "memory");
  return v;
}

struct GQWQ4 {
  static constexpr int kWB = 16, kPad = 16;
  static constexpr bool kRung = true;
  __device__ static const uint8_t* row(const uint8_t* W, int cols, int o) { return W + (size_t)o * (cols / 32) * 16; }
  __device__ static void frag(const uint8_t* grp, int q, uint32_t& b0, uint32_t& b1) {
    const uint32_t x = *reinterpret_cast<const uint32_t*>(grp + 4 * q);
    b0 = ((x << 4) & 0xF0F0F0F0u) ^ 0x80808080u;  // low nibbles: 16·(n − 8)
    b1 = (x & 0xF0F0F0F0u) ^ 0x80808080u;         // high nibbles
  }
  __device__ static float scale(const uint8_t*, int, int, int) { return 1.0f; }
};

struct GQWQ8 {
  static constexpr int kWB = 32, kPad = 32;
  static constexpr bool kRung = false;
  __device__ static const uint8_t* row(const uint8_t* W, int cols, int o) { return W + (size_t)o * cols; }
  __device__ static void frag(const uint8_t* grp, int q, uint32_t& b0, uint32_t& b1) {
    const uint2 v = *reinterpret_cast<const uint2*>(grp + 8 * q);
    b0 = v.x;
    b1 = v.y;
  }
  __device__ static float scale(const uint8_t* W, int rows, int cols, int o) {
    return f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)o));
  }
};

template <class F, int FT, int KS, int NS, bool DEEP = false>
__device__ __forceinline__ void gemmq_wide(const uint8_t* __restrict__ W0, const uint8_t* __restrict__ W1,
                                           const uint8_t* __restrict__ W2, int rows0, int rows1, int rows2, int cols,
                                           const int8_t* __restrict__ XQ, const float* __restrict__ D,
                                           float* __restrict__ Y, int ldy, int T, const float* __restrict__ b0,
                                           const float* __restrict__ b1, const float* __restrict__ b2, int accumulate) {
  constexpr int CG = 8, BM = 16 * FT, BN = 128;
  constexpr int LDA = CG * 32 + 16, LDB = CG * F::kWB + F::kPad, LDR = BN + 4;
  constexpr int OFF_D = BM * LDA, OFF_W = OFF_D + CG * BM * 4, OFF_C = OFF_W + BN * LDB;
  constexpr int STAGE = OFF_C + (F::kRung ? BN * 8 : 0);
  constexpr int CWU = CG * F::kWB / 16;       // 16-byte weight units a row and stage
  constexpr int UW = BN * CWU / GQ_THREADS;   // ... a thread
  constexpr int UA = (BM * CG * 2 + GQ_THREADS - 1) / GQ_THREADS;  // activation units a thread
  constexpr int UD = (BM * CG + GQ_THREADS - 1) / GQ_THREADS;      // scales a thread
  static_assert(STAGE % 16 == 0 && BM * LDR * 4 <= NS * STAGE && UW * GQ_THREADS == BN * CWU, "wide tile layout");
  static_assert(NS >= 2 && (KS == 1 || KS == 2 || KS == 4 || KS == 7 || KS == 8), "ring, cluster");
  extern __shared__ __align__(16) uint8_t gq_dsm[];
  uint8_t* const sm = gq_dsm;
  float* const rb = reinterpret_cast<float*>(sm + NS * STAGE);  // q4tp: [warp][kg][16] rungs
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g4 = lane >> 2, q4 = lane & 3;
  // The block's segment (uniform): tiles of W0, then W1, then W2; its
  // outputs are Y's columns rows0 + ... + o.
  const int n0 = (rows0 + BN - 1) / BN, n1 = (rows1 + BN - 1) / BN, bx = blockIdx.x;
  const int seg = bx < n0 ? 0 : bx < n0 + n1 ? 1 : 2;
  const uint8_t* __restrict__ W = seg == 0 ? W0 : seg == 1 ? W1 : W2;
  const int rows = seg == 0 ? rows0 : seg == 1 ? rows1 : rows2;
  const float* __restrict__ bias = seg == 0 ? b0 : seg == 1 ? b1 : b2;
  const int ycol = seg == 0 ? 0 : seg == 1 ? rows0 : rows0 + rows1;
  const int o0 = (bx - (seg == 0 ? 0 : seg == 1 ? n0 : n0 + n1)) * BN, ks = blockIdx.y, t0 = blockIdx.z * BM;
  const int wr = 16 * warp;
  const int nb = cols / 32, nc = (nb + CG - 1) / CG;
  const int c0 = ks * nc / KS, nk = (ks + 1) * nc / KS - c0;  // this slice's chunks
  const int gpr = nb, cbytes = (5 * gpr + 7) / 8;
  const size_t coff = (size_t)rows * gpr * 16 + (size_t)rows * 4, wend = coff + (size_t)rows * cbytes;

  // Fixed copy slots: weight units (row tid/CWU + j·256/CWU, unit tid %
  // CWU), code words (row tid/2, word tid%2), activation units (row
  // tid/16 + 16j, unit tid%16), scales (row tid/8 + 32j, group tid%8):
  // one base pointer each and 32-bit offsets from it (rows clamped to the
  // last valid one), shared destinations at fixed strides.
  const int cw = tid % CWU, gw = cw * 16 / F::kWB;
  const int rw0 = tid / CWU, ow0 = min(o0 + rw0, rows - 1);
  const uint8_t* const srcW = F::row(W, cols, ow0) + (size_t)c0 * CG * F::kWB + cw * 16;
  int offW[UW];
#pragma unroll
  for (int j = 0; j < UW; j++)
    offW[j] = (int)(F::row(W, cols, min(o0 + rw0 + j * (GQ_THREADS / CWU), rows - 1)) - F::row(W, cols, ow0));
  const int dstW = OFF_W + rw0 * LDB + cw * 16;
  const size_t cbase = coff + (size_t)min(o0 + (tid >> 1), rows - 1) * cbytes;
  const int ca = tid % 16, ra0 = tid / 16, ta0 = min(t0 + min(ra0, BM - 1), T - 1);
  const int8_t* const srcA = XQ + (size_t)ta0 * cols + (size_t)c0 * CG * 32 + ca * 16;
  int offA[UA];
#pragma unroll
  for (int j = 0; j < UA; j++) offA[j] = (min(t0 + min(ra0 + 16 * j, BM - 1), T - 1) - ta0) * cols;
  const int dstA = ra0 * LDA + ca * 16;
  const int kd = tid % CG, rd0 = tid / CG, td0 = min(t0 + min(rd0, BM - 1), T - 1);
  const float* const srcD = D + (size_t)td0 * nb + (size_t)c0 * CG + kd;
  int offD[UD];
#pragma unroll
  for (int j = 0; j < UD; j++) offD[j] = (min(t0 + min(rd0 + (GQ_THREADS / CG) * j, BM - 1), T - 1) - td0) * nb;
  // [kg][g][i][u] for token r = 16i + 8u + g; rows 32 apart are 16 bytes apart.
  const int dstD = OFF_D + (kd * BM + (rd0 & 7) * 2 * FT + 2 * (rd0 >> 4) + ((rd0 >> 3) & 1)) * 4;
  auto issueW = [&](int s) {  // stage s of the slice
    uint8_t* st = sm + (s % NS) * STAGE;
    const int gb = (c0 + s) * CG;
    const bool ok = gb + gw < nb;
    const uint8_t* sw = srcW + (size_t)s * CG * F::kWB;
#pragma unroll
    for (int j = 0; j < UW; j++) gq_cp16(st + dstW + j * (GQ_THREADS / CWU) * LDB, ok ? sw + offW[j] : W, ok);
    if (F::kRung) {
      const size_t a = ((cbase + 5 * (size_t)(c0 + s)) & ~(size_t)3) + 4 * (tid & 1);
      uint8_t* dst = st + OFF_C + (tid >> 1) * 8 + 4 * (tid & 1);
      if (a + 4 <= wend) {
        gq_cp4(dst, W + a, true);
      } else {  // the tensor's last, partial word (or none)
        uint32_t v = 0;
        for (int e = 0; e < 4; e++)
          if (a + e < wend) v |= (uint32_t)W[a + e] << (8 * e);
        *reinterpret_cast<uint32_t*>(dst) = v;
      }
    }
  };
  auto issueX = [&](int s) {
    uint8_t* st = sm + (s % NS) * STAGE;
    const int gb = (c0 + s) * CG;
    const bool oka = gb + ca / 2 < nb, okd = gb + kd < nb;
    const int8_t* sa = srcA + (size_t)s * CG * 32;
    const float* sd = srcD + (size_t)s * CG;
#pragma unroll
    for (int j = 0; j < UA; j++)
      if (BM * CG * 2 >= GQ_THREADS * (j + 1) || tid + GQ_THREADS * j < BM * CG * 2)
        gq_cp16(st + dstA + 16 * j * LDA, oka ? sa + offA[j] : XQ, oka);
#pragma unroll
    for (int j = 0; j < UD; j++)
      if (BM * CG >= GQ_THREADS * (j + 1) || tid + GQ_THREADS * j < BM * CG)
        gq_cp4(st + dstD + 16 * j, okd ? sd + offD[j] : D, okd);
  };
  // q4tp: lane l's rung row (wr + l%16) and its ladder and code bytes.
  const int rr = lane & 15, rh = lane >> 4;
  uint32_t ladder = 0;
  size_t rcode = 0;
  if (F::kRung) {
    const int o = min(o0 + wr + rr, rows - 1);
    const size_t po = (size_t)rows * gpr * 16 + 4 * (size_t)o;
    ladder = (uint32_t)ld_u16(W + po) | ((uint32_t)ld_u16(W + po + 2) << 16);
    rcode = coff + (size_t)o * cbytes;
  }

  float acc[FT][2][4];
#pragma unroll
  for (int i = 0; i < FT; i++)
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][n][e] = 0.0f;
  const int arow = (lane & 15) * LDA + (lane >> 4) * 16;

#pragma unroll 1
  for (int s = 0; s < NS - 1; s++)
    if (s < nk) issueW(s);
  pdl_wait();
#pragma unroll 1
  for (int s = 0; s < NS - 1; s++) {
    if (s < nk) issueX(s);
    gq_commit();
  }
#pragma unroll 1
  for (int s = 0; s < nk; s++) {
    gq_wait<NS - 2>();  // stage s landed (this thread's copies) ...
    __syncthreads();    // ... and every thread's; stage s−1's slot is free
    if (s + NS - 1 < nk) {
      issueW(s + NS - 1);
      issueX(s + NS - 1);
    }
    gq_commit();
    const uint8_t* st = sm + (s % NS) * STAGE;
    const int gv = min(CG, nb - (c0 + s) * CG);  // valid groups of the chunk (uniform)
    float* wrb = rb + warp * CG * 16;
    if (F::kRung) {
      const size_t p = rcode + 5 * (size_t)(c0 + s);
      const uint2 cwd = *reinterpret_cast<const uint2*>(st + OFF_C + (wr + rr) * 8);
      const uint64_t win = (uint64_t)cwd.x | ((uint64_t)cwd.y << 32);
      const int sh = (int)(p & 3) * 8;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int kg = 4 * rh + j, code = (int)((win >> (sh + 5 * kg)) & 31u);
        wrb[kg * 16 + rr] = kg < gv ? q4tp_rung((uint16_t)ladder, (uint16_t)(ladder >> 16), code) * 0.0625f : 0.0f;
      }
      __syncwarp();
    }
    // Every group of the chunk, also past the slice's last one (its weights,
    // quants, scales and rungs are zeros there, adding exact zeros): no
    // branch between groups, so the compiler interleaves them (the 64-token
    // tiles two (q4tp) or one (q8_row) at a time: more spill at 128
    // registers with nvcc 11.8).
    constexpr int KU = FT < 4 || DEEP ? CG : F::kRung ? 2 : 1;
#pragma unroll(KU)
    for (int kg = 0; kg < CG; kg++) {
      uint32_t fb[2][2];
      float2 rs[2];
#pragma unroll
      for (int n = 0; n < 2; n++) {
        F::frag(st + OFF_W + (wr + 8 * n + g4) * LDB + kg * F::kWB, q4, fb[n][0], fb[n][1]);
        rs[n] = F::kRung ? *reinterpret_cast<const float2*>(wrb + kg * 16 + 8 * n + 2 * q4) : make_float2(1.0f, 1.0f);
      }
      // The scales of tokens 16i + 8u + g4 as dv[2i + u]: one or two vector loads.
      const float* sd = reinterpret_cast<const float*>(st + OFF_D) + kg * BM + g4 * 2 * FT;
      float dv[2 * FT];
      if constexpr (FT == 1) {
        const float2 x = *reinterpret_cast<const float2*>(sd);
        dv[0] = x.x;
        dv[1] = x.y;
      } else {
#pragma unroll
        for (int h = 0; h < FT / 2; h++) {
          const float4 x = *reinterpret_cast<const float4*>(sd + 4 * h);
          dv[4 * h] = x.x;
          dv[4 * h + 1] = x.y;
          dv[4 * h + 2] = x.z;
          dv[4 * h + 3] = x.w;
        }
      }
#pragma unroll
      for (int i = 0; i < FT; i++) {
        uint32_t fa[4];
        gq_ldsm4(fa, st + arow + 16 * i * LDA + kg * 32);
        const float d0 = dv[2 * i], d1 = dv[2 * i + 1];
#pragma unroll
        for (int n = 0; n < 2; n++) {
          int c[4];
          gq_mma(c, fa, fb[n][0], fb[n][1]);
          acc[i][n][0] += gq_f(c[0]) * (d0 * rs[n].x);
          acc[i][n][1] += gq_f(c[1]) * (d0 * rs[n].y);
          acc[i][n][2] += gq_f(c[2]) * (d1 * rs[n].x);
          acc[i][n][3] += gq_f(c[3]) * (d1 * rs[n].y);
        }
      }
    }
  }
  gq_wait<0>();
  __syncthreads();  // the ring is free: it holds this block's partial tile now

  // red[t][o]: tokens 16i+g4 (+8), rows wr+8n+2q4 (+1).
  float* red = reinterpret_cast<float*>(sm);
#pragma unroll
  for (int i = 0; i < FT; i++)
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int u = 0; u < 2; u++)
        *reinterpret_cast<float2*>(red + (16 * i + g4 + 8 * u) * LDR + wr + 8 * n + 2 * q4) =
            make_float2(acc[i][n][2 * u], acc[i][n][2 * u + 1]);
  if (KS > 1)
    gq_cluster_sync();  // every block's partials written and visible to the cluster
  else
    __syncthreads();
  // Block ks finishes float4 units [ks·U/KS, (ks+1)·U/KS) of the BM × 128
  // tile's U, adding the KS partials in rank order.
  constexpr int U = BM * (BN / 4);
#pragma unroll 1
  for (int v = ks * U / KS + tid; v < (ks + 1) * U / KS; v += GQ_THREADS) {
    const int tl = v / (BN / 4), ol = (v % (BN / 4)) * 4, t = t0 + tl;
    const float* src = red + tl * LDR + ol;
    float4 sum = KS > 1 ? gq_ld_cluster4(src, 0) : *reinterpret_cast<const float4*>(src);
#pragma unroll
    for (int k = 1; k < KS; k++) {
      const float4 x = gq_ld_cluster4(src, k);
      sum.x += x.x;
      sum.y += x.y;
      sum.z += x.z;
      sum.w += x.w;
    }
    if (t >= T) continue;
    float sv[4] = {sum.x, sum.y, sum.z, sum.w};
    const int o = o0 + ol;
    float* y = Y + (size_t)t * ldy + ycol + o;
    if (o + 3 < rows && aligned16(y)) {  // one vector store (and load)
      float4 prev = accumulate ? *reinterpret_cast<const float4*>(y) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float pv[4] = {prev.x, prev.y, prev.z, prev.w};
#pragma unroll
      for (int e = 0; e < 4; e++) {
        sv[e] = sv[e] * F::scale(W, rows, cols, o + e) + (bias ? bias[o + e] : 0.0f);
        if (accumulate) sv[e] += pv[e];
      }
      *reinterpret_cast<float4*>(y) = make_float4(sv[0], sv[1], sv[2], sv[3]);
      continue;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
      if (o + e >= rows) continue;
      float val = sv[e] * F::scale(W, rows, cols, o + e) + (bias ? bias[o + e] : 0.0f);
      if (accumulate) val += y[e];
      y[e] = val;
    }
  }
  if (KS > 1) gq_cluster_sync();  // no block leaves while another reads its partials
}

// name, format, FT (BM = 16·FT tokens), KS (the cluster), NS (kern.GemmQWideTiles mirrors these).
// Parameters (W0, W1, W2, rows0, rows1, rows2, cols, XQ, D, Y, ldy, T, b0, b1, b2, accumulate): up to three
// tensors of one width over the same quants (q|k|v, gate|up), rows1 = rows2 = 0 for one.
#define GEMMQW_PARAMS                                                                                             \
  const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, const uint8_t *__restrict__ W2, int rows0, int rows1, \
      int rows2, int cols, const int8_t *__restrict__ XQ, const float *__restrict__ D, float *__restrict__ Y, int ldy,  \
      int T, const float *__restrict__ b0, const float *__restrict__ b1, const float *__restrict__ b2, int accumulate
#define GEMMQ_WIDE(name, F, FT, KS, NS)                                                                            \
  extern "C" __global__ void __cluster_dims__(1, KS, 1) __launch_bounds__(GQ_THREADS, 2) gemmq_##name(GEMMQW_PARAMS) { \
    gemmq_wide<F, FT, KS, NS>(W0, W1, W2, rows0, rows1, rows2, cols, XQ, D, Y, ldy, T, b0, b1, b2, accumulate);     \
  }
// gemmq_<fmt>_t64s: gemmq_<fmt>_t64 over up to three tensors of the same
// width and activations (a prefill chunk's q|k|v, gate|up), the wide
// tiles' parameters: grid z picks the tensor (its rows' outputs at Y's
// columns after the tensors before it), blocks past a tensor's rows exit
// at once. One launch where three left the GPU mostly idle (k and v of 512
// rows: 32 blocks each at T = 512). Launch: grid (⌈max rows/128⌉, ⌈T/64⌉,
// tensors), block 256 (kern.GemmQ.Launch); quants in _t64's order.
#define GEMMQ_T64S(name, F, MB)                                                                              \
  extern "C" __global__ void __launch_bounds__(GQ_THREADS, MB) gemmq_##name##_t64s(GEMMQW_PARAMS) {          \
    const int z = blockIdx.z;                                                                                \
    const int rows = z == 0 ? rows0 : z == 1 ? rows1 : rows2;                                                \
    if ((int)blockIdx.x * 128 >= rows) return;                                                               \
    gemmq_body<F, 64, 128, 2, 2>(z == 0 ? W0 : z == 1 ? W1 : W2, rows, cols, XQ, D,                          \
                                 Y + (z == 0 ? 0 : z == 1 ? rows0 : rows0 + rows1), ldy, T,                  \
                                 z == 0 ? b0 : z == 1 ? b1 : b2, accumulate);                                \
  }
GEMMQ_T64S(q8row, GemmQQ8, 2)
GEMMQ_T64S(q4tp, GemmQQ4TP, 1)

// The deep variants _w64k<KS>d: one block an SM (255 registers: every
// group of a chunk unrolled) and a 4-stage ring, for comparison
// (kern.GemmQTile.Deep; GemmQSuffix does not pick them).
#define GEMMQ_WIDE_DEEP(name, F, FT, KS, NS)                                                                        \
  extern "C" __global__ void __cluster_dims__(1, KS, 1) __launch_bounds__(GQ_THREADS, 1) gemmq_##name(GEMMQW_PARAMS) { \
    gemmq_wide<F, FT, KS, NS, true>(W0, W1, W2, rows0, rows1, rows2, cols, XQ, D, Y, ldy, T, b0, b1, b2, accumulate);  \
  }
GEMMQ_WIDE_DEEP(q4tp_w64k1d, GQWQ4, 4, 1, 4)
GEMMQ_WIDE_DEEP(q4tp_w64k2d, GQWQ4, 4, 2, 4)
GEMMQ_WIDE_DEEP(q4tp_w64k4d, GQWQ4, 4, 4, 4)
GEMMQ_WIDE_DEEP(q4tp_w64k8d, GQWQ4, 4, 8, 4)
#define GEMMQ_WIDE_KS(fam, F, BM, FT, NS)       \
  GEMMQ_WIDE(fam##_w##BM##k1, F, FT, 1, NS)   \
  GEMMQ_WIDE(fam##_w##BM##k2, F, FT, 2, NS)   \
  GEMMQ_WIDE(fam##_w##BM##k4, F, FT, 4, NS)   \
  GEMMQ_WIDE(fam##_w##BM##k7, F, FT, 7, NS)   \
  GEMMQ_WIDE(fam##_w##BM##k8, F, FT, 8, NS)
GEMMQ_WIDE_KS(q4tp, GQWQ4, 16, 1, 4)
GEMMQ_WIDE_KS(q4tp, GQWQ4, 32, 2, 3)
GEMMQ_WIDE_KS(q4tp, GQWQ4, 64, 4, 2)
GEMMQ_WIDE_KS(q8row, GQWQ8, 16, 1, 2)
GEMMQ_WIDE_KS(q8row, GQWQ8, 32, 2, 2)
GEMMQ_WIDE_KS(q8row, GQWQ8, 64, 4, 2)

// ---------------------------------------------------------------------------
// Half wide tiles gemmh_q4tp_w<BM>k<KS> (batched decode of q4tp, T ≤ 64;
// Options.F16Wide): the wide tiles' blocks, clusters, ring and epilogue
// on m16n8k16 f16 tensor cores, with no per-group arithmetic: each group's
// rung is folded into its weights, so the mma accumulates straight into the
// f32 tile over all of K (the int8 tiles convert and scale every mma's
// int32 partial: ~12 of their ~16 instructions an mma). Arithmetic:
//   - activations: gemmh_acth writes h(x) = f16(x) (round to nearest even;
//     |x| > 65504 saturates to ±65504, a NaN stays NaN) of x or of its
//     prologue (gq_pro_val: RMSNorm, SwiGLU, as gemmq_actq_pro), element
//     8q + m of each block of 32 at 2q + m/4 + 8·(m%4), so that the pair
//     (n_m, n_{m+4}) of a lane's q4tp word q is its B fragment's k pair
//     (2q, 2q+1) of k step m/2 (b0 for even m, b1 for odd);
//   - weights: row o's rungs scaled by 2^−E_o, E_o = ⌈max(a, a + 31·b)⌉ of
//     its ladder (gh_rowexp; so every scaled rung is ≤ 1 and the weights
//     stay in f16's normal range for 14 octaves below the largest rung),
//     r = f16(rung·2^−E_o); weight (n − 8)·r rounded to f16 (one HMUL2
//     after an exact HSUB2: (0x6400 | n) is f16 1024 + n);
//   - y = 2^E_o·Σ_k h(x_k)·w_k (f32 sums in the tensor cores) + bias.
// Rounding: relative 2^-11 on each activation and weight (the int8 quants'
// is ~2^-8 of the block's largest), f32 sums.
// Launch: gemmh_acth as gemmq_actq_pro (kern.ActProLaunch), parameters (X, ldx, cols, XH, pro, U,
// nw, eps, one_plus; pro 0 none, 1 RMSNorm, 3 SwiGLU); the tiles grid
// (Σ⌈rows_j/128⌉, KS, ⌈T/BM⌉), block 256, dynamic shared memory
// kern.GemmQTile.Shared, parameters (W0, W1, W2, rows0..2, cols, XH, Y,
// ldy, T, b0..2, accumulate, hout, ldh; hout null but in SwiGLU mode).

extern "C" __global__ void __launch_bounds__(GQ_THREADS)
    gemmh_acth(const float* __restrict__ X, int ldx, int cols, uint16_t* __restrict__ XH, int pro,
               const float* __restrict__ U, const float* __restrict__ nw, float eps, int one_plus) {
  __shared__ double sh[32];
  pdl_trigger();
  const int lane = threadIdx.x & 31, nb = cols / 32;
  const int b = blockIdx.x * (GQ_THREADS / 32) + (threadIdx.x >> 5), t = blockIdx.y;
  pdl_wait();
  const float* xr = X + (size_t)t * ldx;
  const float inv = gq_pro_inv(xr, cols, pro, eps, sh);
  for (int bb = b; bb < nb; bb += gridDim.x * (GQ_THREADS / 32)) {  // uniform over the warp
    const int i = bb * 32 + lane;
    gh_store(XH + (size_t)t * cols, i, gq_pro_val(xr[i], i, pro, inv, U + (size_t)t * ldx, nw, one_plus));
  }
}

// (a & mask) | c in one LOP3 (the compiler splits it when both are immediates).
__device__ __forceinline__ uint32_t gh_lop(uint32_t a, uint32_t mask, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(c));
  return r;
}
// The weights (n_m − 8, n_{m+4} − 8)·r, m = 0..3, of a q4tp word x as
// f16 pairs w[m], r2 = (r, r): nibbles m = 0, 2 as (0x6400 | n) = 1024 + n
// less 1032, m = 1, 3 as (0x6400 | 16n) = 1024 + 16n times 1/16 less 72 (both
// exact), then one HMUL2 by r (the only rounding); x >> 8 serves m = 2, 3.
__device__ __forceinline__ void gh_word(uint32_t x, uint32_t r2, uint32_t (&w)[4]) {
  const uint32_t y = x >> 8;
  uint32_t d[4];
  const uint32_t l0 = gh_lop(x, 0x000F000Fu, 0x64006400u), h1 = gh_lop(x, 0x00F000F0u, 0x64006400u);
  const uint32_t l2 = gh_lop(y, 0x000F000Fu, 0x64006400u), h3 = gh_lop(y, 0x00F000F0u, 0x64006400u);
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d[0]) : "r"(l0), "r"(0x64086408u));              // 1024 + n − 1032
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d[1]) : "r"(h1), "r"(0x2C002C00u), "r"(0xD480D480u));  // ·1/16 − 72
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d[2]) : "r"(l2), "r"(0x64086408u));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d[3]) : "r"(h3), "r"(0x2C002C00u), "r"(0xD480D480u));
#pragma unroll
  for (int m = 0; m < 4; m++) asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(w[m]) : "r"(d[m]), "r"(r2));
}
// E_o of row o's ladder (a, b): ⌈max(a, a + 31·b)⌉, within [−126, 126]
// (so that 2^E and 2^−E are both normal floats).
__device__ __forceinline__ int gh_rowexp(uint16_t ah, uint16_t bh) {
  const float a = f16_to_f32(ah), b = f16_to_f32(bh);
  const float e = ceilf(fmaxf(a, __fadd_rn(a, __fmul_rn(31.0f, b))));
  return e != e ? 0 : (int)fminf(fmaxf(e, -126.0f), 126.0f);
}
__device__ __forceinline__ float gh_pow2(int e) { return __int_as_float((127 + e) << 23); }  // 2^e, e in [−126, 127]

// WT: the warps split the tokens WT ways (1: a warp has all BM tokens and
// 16 rows; 2: half the tokens and 32 rows, so each activation fragment is
// loaded from shared memory by half as many warps and each weight is
// expanded by two). CG: groups of 32 a ring stage (8, or 4 for a deeper
// ring in the same shared memory: more stages in flight). WK: the warps
// split each stage's groups WK ways (2: a warp has 16·WT·2 rows and half the
// groups, so an activation fragment serves twice the rows: half the
// shared-memory reads an mma, each weight still expanded once; the two
// halves' f32 tiles are added, half 0 then half 1, before the cluster's).
// Only WK = 1 is instantiated: the WK = 2 tiles (suffix r) measured no
// faster on the H200 (stop 22: gate|up 76.6 against 76.9 µs, o/down 37.9
// against 34.5, q|k|v 27.8 against 26.4, eager 64-row steps), so shared
// memory bandwidth is not what limits these tiles.
// hout, when not null (SwiGLU mode; W0 gate and W1 up of rows0 = rows1
// rows, no W2, no accumulate): a block takes rows o0..o0+63 of both (its
// block rows 0-63 gate's, 64-127 up's; grid.x ⌈rows0/64⌉) and writes
// h = silu(gate)·up, rounded as gemmh_acth rounds, into hout (rows ldh
// apart, gemmh_acth's order) instead of Y: the down projection's half
// GEMM input, with the arithmetic of Y then gemmh_acth's SwiGLU prologue.
__device__ __forceinline__ float gh_out(float sum, float p2, const float* __restrict__ bias, int o) {
  return __fadd_rn(__fmul_rn(sum, p2), bias ? bias[o] : 0.0f);  // 2^E·Σ + bias, never contracted
}

template <int FT, int KS, int NS, int WT, int CG, int WK, bool CA = false>
__device__ __forceinline__ void gemmh_wide(const uint8_t* __restrict__ W0, const uint8_t* __restrict__ W1,
                                           const uint8_t* __restrict__ W2, int rows0, int rows1, int rows2, int cols,
                                           const uint16_t* __restrict__ XH, float* __restrict__ Y, int ldy, int T,
                                           const float* __restrict__ b0, const float* __restrict__ b1,
                                           const float* __restrict__ b2, int accumulate, uint16_t* __restrict__ hout,
                                           int ldh) {
  constexpr int BM = 16 * FT, BN = 128;
  constexpr int FW = FT / WT, NT = 2 * WT * WK, RW = 8 * NT;  // m tiles, n tiles, rows a warp
  constexpr int NR = 8 / (WT * WK), CW = CG / WK, GPL = CW * RW / 32;  // row groups of warps, groups a warp, rungs a lane
  constexpr int AU = CG * 4, AR = GQ_THREADS / AU;  // 16-byte activation units a row, rows a copy pass
  constexpr int LDA = CG * 64 + 16, LDB = CG * 16 + 16, LDR = BN + 4;
  // A row's 8 code bytes sit in its weight row's 16 bytes of padding (at CG·16).
  constexpr int OFF_W = BM * LDA, OFF_C = OFF_W + CG * 16, STAGE = OFF_W + BN * LDB;
  constexpr int CWU = CG, UW = BN * CWU / GQ_THREADS;             // 16-byte weight units
  constexpr int UA = (BM * CG * 4 + GQ_THREADS - 1) / GQ_THREADS;  // 16-byte activation units
  static_assert(STAGE % 16 == 0 && WK * BM * LDR * 4 <= NS * STAGE && UW * GQ_THREADS == BN * CWU, "half wide tile layout");
  static_assert(NS >= 2 && (KS == 1 || KS == 2 || KS == 4 || KS == 7 || KS == 8), "ring, cluster");
  static_assert((WT == 1 || WT == 2) && (WK == 1 || WK == 2) && WT * WK <= 2 && FT % WT == 0 && (CG == 4 || CG == 8) && GPL >= 1,
                "token split, group split, stage");
  extern __shared__ __align__(16) uint8_t gq_dsm[];
  uint8_t* const sm = gq_dsm;
  uint32_t* const rb = reinterpret_cast<uint32_t*>(sm + NS * STAGE);  // [warp][kg of the warp's CW][RW] rung pairs
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g4 = lane >> 2, q4 = lane & 3;
  const bool pair = hout != nullptr;
  const int n0 = pair ? 1 << 30 : (rows0 + BN - 1) / BN, n1 = (rows1 + BN - 1) / BN, bx = blockIdx.x;
  const int seg = bx < n0 ? 0 : bx < n0 + n1 ? 1 : 2;
  const uint8_t* __restrict__ W = seg == 0 ? W0 : seg == 1 ? W1 : W2;
  const int rows = seg == 0 ? rows0 : seg == 1 ? rows1 : rows2;
  const float* __restrict__ bias = seg == 0 ? b0 : seg == 1 ? b1 : b2;
  const int ycol = seg == 0 ? 0 : seg == 1 ? rows0 : rows0 + rows1;
  const int o0 = pair ? bx * (BN / 2) : (bx - (seg == 0 ? 0 : seg == 1 ? n0 : n0 + n1)) * BN, ks = blockIdx.y, t0 = blockIdx.z * BM;
  // Block row r: its tensor (SwiGLU mode: up's from 64) and row there.
  auto tens = [&](int r) { return pair && r >= BN / 2 ? W1 : W; };
  auto trow = [&](int r) { return min(o0 + (pair ? r & (BN / 2 - 1) : r), rows - 1); };
  // The warp's rows, tokens and first group of a stage.
  const int wr = RW * (warp % NR), tw = 16 * FW * (warp / NR % WT), wg = CW * (warp / (NR * WT));
  const int nb = cols / 32, nc = (nb + CG - 1) / CG;
  const int c0 = ks * nc / KS, nk = (ks + 1) * nc / KS - c0;
  const int gpr = nb, cbytes = (5 * gpr + 7) / 8;
  const size_t lad = (size_t)rows * gpr * 16, coff = lad + (size_t)rows * 4, wend = coff + (size_t)rows * cbytes;

  // Copy slots as the int8 wide tiles', activations AU units a row.
  const int cw = tid % CWU, rw0 = tid / CWU, ow0 = trow(rw0);
  const uint8_t* const srcW = W + (size_t)ow0 * gpr * 16 + (size_t)c0 * CG * 16 + cw * 16;
  const uint8_t* const srcW1 = pair ? W1 + (srcW - W) : srcW;  // SwiGLU mode: up's rows (the same offsets)
  int offW[UW];
#pragma unroll
  for (int j = 0; j < UW; j++) offW[j] = (trow(rw0 + j * (GQ_THREADS / CWU)) - ow0) * gpr * 16;
  const int dstW = OFF_W + rw0 * LDB + cw * 16;
  const uint8_t* __restrict__ const Wc = tens(tid >> 1);  // this thread's code row's tensor
  const size_t cbase = coff + (size_t)trow(tid >> 1) * cbytes;
  const int ca = tid % AU, ra0 = tid / AU, ta0 = min(t0 + min(ra0, BM - 1), T - 1);
  const uint8_t* const srcA = reinterpret_cast<const uint8_t*>(XH) + ((size_t)ta0 * cols + (size_t)c0 * CG * 32) * 2 + ca * 16;
  int offA[UA];
#pragma unroll
  for (int j = 0; j < UA; j++) offA[j] = (min(t0 + min(ra0 + AR * j, BM - 1), T - 1) - ta0) * cols * 2;
  const int dstA = ra0 * LDA + ca * 16;
  auto issueW = [&](int s) {
    uint8_t* st = sm + (s % NS) * STAGE;
    const bool ok = (c0 + s) * CG + cw < nb;
    const uint8_t* sw = srcW + (size_t)s * CG * 16;
#pragma unroll
    for (int j = 0; j < UW; j++) {
      const uint8_t* base = rw0 + j * (GQ_THREADS / CWU) >= BN / 2 ? srcW1 + (size_t)s * CG * 16 : sw;
      gq_cp16(st + dstW + j * (GQ_THREADS / CWU) * LDB, ok ? base + offW[j] : W, ok);
    }
    const size_t a = ((cbase + 5 * CG * (size_t)(c0 + s) / 8) & ~(size_t)3) + 4 * (tid & 1);
    uint8_t* dst = st + OFF_C + (tid >> 1) * LDB + 4 * (tid & 1);
    if (a + 4 <= wend) {
      gq_cp4(dst, Wc + a, true);
    } else {
      uint32_t v = 0;
      for (int e = 0; e < 4; e++)
        if (a + e < wend) v |= (uint32_t)Wc[a + e] << (8 * e);
      *reinterpret_cast<uint32_t*>(dst) = v;
    }
  };
  auto issueX = [&](int s) {
    uint8_t* st = sm + (s % NS) * STAGE;
    const bool ok = (c0 + s) * CG + ca / 4 < nb;
    const uint8_t* sa = srcA + (size_t)s * CG * 64;
#pragma unroll
    for (int j = 0; j < UA; j++)
      if (BM * CG * 4 >= GQ_THREADS * (j + 1) || tid + GQ_THREADS * j < BM * CG * 4) {
        if (CA)
          gq_cp16ca(st + dstA + AR * j * LDA, ok ? sa + offA[j] : reinterpret_cast<const uint8_t*>(XH), ok);
        else
          gq_cp16(st + dstA + AR * j * LDA, ok ? sa + offA[j] : reinterpret_cast<const uint8_t*>(XH), ok);
      }
  };
  // Lane l's rung row wr + l%RW (groups GPL·(l/RW) ...): its ladder, 2^−E and code bytes.
  const int rr = lane % RW, rh = lane / RW;
  const int orr = trow(wr + rr);
  const uint8_t* __restrict__ const Wl = tens(wr + rr);
  const uint16_t la = ld_u16(Wl + lad + 4 * (size_t)orr), lb = ld_u16(Wl + lad + 4 * (size_t)orr + 2);
  const float unexp = gh_pow2(-gh_rowexp(la, lb));
  const size_t rcode = coff + (size_t)orr * cbytes;

  float acc[FW][NT][4];
#pragma unroll
  for (int i = 0; i < FW; i++)
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][n][e] = 0.0f;
  const int arow = (tw + (lane & 15)) * LDA + (lane >> 4) * 16;

#pragma unroll 1
  for (int s = 0; s < NS - 1; s++)
    if (s < nk) issueW(s);
  pdl_wait();
#pragma unroll 1
  for (int s = 0; s < NS - 1; s++) {
    if (s < nk) issueX(s);
    gq_commit();
  }
#pragma unroll 1
  for (int s = 0; s < nk; s++) {
    gq_wait<NS - 2>();
    __syncthreads();
    if (s + NS - 1 < nk) {
      issueW(s + NS - 1);
      issueX(s + NS - 1);
    }
    gq_commit();
    const uint8_t* st = sm + (s % NS) * STAGE;
    const int gv = min(CG, nb - (c0 + s) * CG);
    uint32_t* wrb = rb + warp * CW * RW;
    {
      const size_t pb = 5 * CG * (size_t)(c0 + s), p = rcode + pb / 8;  // the chunk's first code: bit pb of the row's codes
      const uint2 cwd = *reinterpret_cast<const uint2*>(st + OFF_C + (wr + rr) * LDB);
      const uint64_t win = (uint64_t)cwd.x | ((uint64_t)cwd.y << 32);
      const int sh = (int)(p & 3) * 8 + (int)(pb % 8);
#pragma unroll
      for (int j = 0; j < GPL; j++) {
        const int kl = GPL * rh + j, kg = wg + kl, code = (int)((win >> (sh + 5 * kg)) & 31u);
        const uint32_t h = kg < gv ? __half_as_ushort(__float2half_rn(q4tp_rung(la, lb, code) * unexp)) : 0u;
        wrb[kl * RW + rr] = h | (h << 16);
      }
      __syncwarp();
    }
    // The warp's groups of the chunk (zeros past the slice: its activations
    // and rungs are zero).
    constexpr int KU = FW * NT >= 8 ? 2 : CW < 4 ? CW : 4;
#pragma unroll(KU)
    for (int kl = 0; kl < CW; kl++) {
      const int kg = wg + kl;
      uint32_t fb[NT][4];
#pragma unroll
      for (int n = 0; n < NT; n++) {
        const uint32_t x = *reinterpret_cast<const uint32_t*>(st + OFF_W + (wr + 8 * n + g4) * LDB + kg * 16 + 4 * q4);
        gh_word(x, wrb[kl * RW + 8 * n + g4], fb[n]);
      }
#pragma unroll
      for (int i = 0; i < FW; i++) {
        uint32_t fa0[4], fa1[4];
        gq_ldsm4(fa0, st + arow + 16 * i * LDA + kg * 64);
        gq_ldsm4(fa1, st + arow + 16 * i * LDA + kg * 64 + 32);
#pragma unroll
        for (int n = 0; n < NT; n++) {
          gh_mma(acc[i][n], fa0, fb[n][0], fb[n][1]);
          gh_mma(acc[i][n], fa1, fb[n][2], fb[n][3]);
        }
      }
    }
  }
  gq_wait<0>();
  __syncthreads();

  // red[WK][BM][LDR]: each group half's f32 tile.
  float* red = reinterpret_cast<float*>(sm) + (wg / CW) * BM * LDR;
#pragma unroll
  for (int i = 0; i < FW; i++)
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int u = 0; u < 2; u++)
        *reinterpret_cast<float2*>(red + (tw + 16 * i + g4 + 8 * u) * LDR + wr + 8 * n + 2 * q4) =
            make_float2(acc[i][n][2 * u], acc[i][n][2 * u + 1]);
  if (KS > 1)
    gq_cluster_sync();
  else
    __syncthreads();
  red = reinterpret_cast<float*>(sm);
  // The block's partial of the float4 at p in rank k's red (its group
  // halves added in order), and the cluster's, added in rank order.
  auto part = [&](const float* p, int k) {
    float4 x = KS > 1 ? gq_ld_cluster4(p, k) : *reinterpret_cast<const float4*>(p);
    if (WK == 2) {
      const float4 y = KS > 1 ? gq_ld_cluster4(p + BM * LDR, k) : *reinterpret_cast<const float4*>(p + BM * LDR);
      x.x += y.x;
      x.y += y.y;
      x.z += y.z;
      x.w += y.w;
    }
    return x;
  };
  auto csum = [&](const float* p) {
    float4 sum = part(p, 0);
#pragma unroll
    for (int k = 1; k < KS; k++) {
      const float4 x = part(p, k);
      sum.x += x.x;
      sum.y += x.y;
      sum.z += x.z;
      sum.w += x.w;
    }
    return sum;
  };
  auto pow2 = [&](const uint8_t* Wt, int o) {
    const int oe = min(o, rows - 1);
    return gh_pow2(gh_rowexp(ld_u16(Wt + lad + 4 * (size_t)oe), ld_u16(Wt + lad + 4 * (size_t)oe + 2)));
  };
  if (pair) {
    // Block ks finishes float4 units [ks·U/KS, (ks+1)·U/KS) of the BM × 64 outputs' U.
    constexpr int U = BM * (BN / 8);
#pragma unroll 1
    for (int v = ks * U / KS + tid; v < (ks + 1) * U / KS; v += GQ_THREADS) {
      const int tl = v / (BN / 8), ol = (v % (BN / 8)) * 4, t = t0 + tl;
      const float4 g4v = csum(red + tl * LDR + ol), u4v = csum(red + tl * LDR + BN / 2 + ol);
      if (t >= T) continue;
      const float gs[4] = {g4v.x, g4v.y, g4v.z, g4v.w}, us[4] = {u4v.x, u4v.y, u4v.z, u4v.w};
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int o = o0 + ol + e;
        if (o >= rows) continue;
        const float g = gh_out(gs[e], pow2(W0, o), b0, o), u = gh_out(us[e], pow2(W1, o), b1, o);
        gh_store(hout + (size_t)t * ldh, o, g / (1.0f + expf(-g)) * u);  // gq_pro_val's SwiGLU
      }
    }
    if (KS > 1) gq_cluster_sync();
    return;
  }
  // Block ks finishes float4 units [ks·U/KS, (ks+1)·U/KS) of the BM × 128
  // tile's U, adding the KS partials in rank order.
  constexpr int U = BM * (BN / 4);
#pragma unroll 1
  for (int v = ks * U / KS + tid; v < (ks + 1) * U / KS; v += GQ_THREADS) {
    const int tl = v / (BN / 4), ol = (v % (BN / 4)) * 4, t = t0 + tl;
    const float4 sum = csum(red + tl * LDR + ol);
    if (t >= T) continue;
    float sv[4] = {sum.x, sum.y, sum.z, sum.w};
    const int o = o0 + ol;
    float* y = Y + (size_t)t * ldy + ycol + o;
#pragma unroll
    for (int e = 0; e < 4; e++) sv[e] = gh_out(sv[e], pow2(W, o + e), o + e < rows ? bias : nullptr, o + e);
    if (o + 3 < rows && aligned16(y)) {
      if (accumulate) {
        const float4 prev = *reinterpret_cast<const float4*>(y);
        sv[0] += prev.x;
        sv[1] += prev.y;
        sv[2] += prev.z;
        sv[3] += prev.w;
      }
      *reinterpret_cast<float4*>(y) = make_float4(sv[0], sv[1], sv[2], sv[3]);
      continue;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
      if (o + e >= rows) continue;
      y[e] = accumulate ? sv[e] + y[e] : sv[e];
    }
  }
  if (KS > 1) gq_cluster_sync();
}

#define GEMMH_PARAMS                                                                                              \
  const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, const uint8_t *__restrict__ W2, int rows0, int rows1, \
      int rows2, int cols, const uint16_t *__restrict__ XH, float *__restrict__ Y, int ldy, int T,                  \
      const float *__restrict__ b0, const float *__restrict__ b1, const float *__restrict__ b2, int accumulate,       \
      uint16_t *__restrict__ hout, int ldh
#define GEMMH_WIDE(name, FT, KS, NS, WT, CG, WK, CA)                                                              \
  extern "C" __global__ void __cluster_dims__(1, KS, 1) __launch_bounds__(GQ_THREADS, 2) gemmh_##name(GEMMH_PARAMS) { \
    gemmh_wide<FT, KS, NS, WT, CG, WK, CA>(W0, W1, W2, rows0, rows1, rows2, cols, XH, Y, ldy, T, b0, b1, b2, accumulate, hout, ldh); \
  }
// BM, FT (BM = 16·FT), NS, WT, CG, WK, CA; suffix t for WT = 2, c4 for CG = 4, r for WK = 2, ca for
// activations copied through L1 (kern.GemmHTiles mirrors these).
#define GEMMH_WIDE_KS(BM, FT, NS, WT, CG, WK, CA, SFX)             \
  GEMMH_WIDE(q4tp_w##BM##k1##SFX, FT, 1, NS, WT, CG, WK, CA) \
  GEMMH_WIDE(q4tp_w##BM##k2##SFX, FT, 2, NS, WT, CG, WK, CA) \
  GEMMH_WIDE(q4tp_w##BM##k4##SFX, FT, 4, NS, WT, CG, WK, CA) \
  GEMMH_WIDE(q4tp_w##BM##k7##SFX, FT, 7, NS, WT, CG, WK, CA) \
  GEMMH_WIDE(q4tp_w##BM##k8##SFX, FT, 8, NS, WT, CG, WK, CA)
GEMMH_WIDE_KS(16, 1, 3, 1, 8, 1, 0, )
GEMMH_WIDE_KS(32, 2, 2, 1, 8, 1, 0, )
GEMMH_WIDE_KS(64, 4, 2, 1, 8, 1, 0, )
GEMMH_WIDE_KS(64, 4, 2, 1, 8, 1, 1, ca)
