// Gated DeltaNet (the linear-attention layers of Qwen3-Next and Qwen3.5,
// architectures.md §6.4): the causal depthwise conv1d with its carried
// inputs, and the gated delta rule with the gates, the L2 norm of q and k
// and the per-head gated RMSNorm fused in. Float32 throughout, as the CPU
// (kernels/deltanet.go, kernels/gdn.go).
//
// The step's rows: a sequence's rows are consecutive and a sequence occurs
// once per step, so rows r and r+1 belong to one sequence exactly when
// slot[r] == slot[r+1] (slot: the staged inputs' per-row pool slot). No
// kernel takes a per-step value as a parameter: a decode step replays from
// a CUDA graph.
//
// Projections, per row (ldp apart, 2·kd+2·vd+2·nv floats):
//   split (Qwen3.5):   [q_all | k_all | v_all | z | b | a]
//   grouped (Qwen3-Next): [per key head g: q_g k_g v_g z_g] then [per key
//   head g: b_g a_g] (v_g, z_g: the g's r = nv/nk value heads of dv; b_g,
//   a_g: r each).
// The state of one sequence in a layer's pool (slot·stride floats in):
// [conv: K−1 rows of cd inputs, oldest first | S: nv × dk × dv], the CPU's
// byte layout (backend/cpu SaveState).
#include "common.cuh"

// dn_col is conv channel c's column in a projection row (c < cd = 2·kd+vd,
// channels q_all | k_all | v_all).
__device__ __forceinline__ int dn_col(int c, int grouped, int nk, int dk, int nv, int dv) {
  if (!grouped) return c;
  const int kd = nk * dk, rv = (nv / nk) * dv, per = 2 * dk + 2 * rv;
  if (c < kd) return (c / dk) * per + c % dk;
  if (c < 2 * kd) {
    c -= kd;
    return (c / dk) * per + dk + c % dk;
  }
  c -= 2 * kd;
  return (c / rv) * per + 2 * dk + c % rv;
}

// dn_conv: out[r][c] = silu(Σ_{j<K} w[c·K+j] · in(r−(K−1)+j, c)) over the
// conv channels, in(s, c) being row s's input when s is a row of r's
// sequence in this step, else the sequence's carried conv state (its K−1
// inputs before the step). The state is not changed (dn_conv_state, after).
// Launch: grid (⌈cd/256⌉, R), block 256.
extern "C" __global__ void dn_conv(const float* __restrict__ proj, int ldp, int grouped, int nk, int dk, int nv, int dv,
                                   const float* __restrict__ w, int K, const float* __restrict__ state, int stride,
                                   const int* __restrict__ slot, float* __restrict__ out, int ldo) {
  pdl_trigger();
  pdl_wait();
  const int cd = 2 * nk * dk + nv * dv, c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y, h = K - 1;
  if (c >= cd) return;
  const int s = slot[r];
  int m = 0;  // rows of r's sequence before r in this step (at most K−1 counted)
  while (m < h && r - m - 1 >= 0 && slot[r - m - 1] == s) m++;
  const int col = dn_col(c, grouped, nk, dk, nv, dv);
  const float* st = state + (size_t)s * stride;
  float acc = 0.0f;
  for (int j = 0; j < K; j++) {
    const int d = h - j;  // input d rows before r
    const float x = d <= m ? proj[(size_t)(r - d) * ldp + col] : st[(size_t)(h - (d - m)) * cd + c];
    acc += w[(size_t)c * K + j] * x;
  }
  out[(size_t)r * ldo + c] = acc / (1.0f + expf(-acc));
}

// dn_conv_state: for the last row r of each sequence in the step, the
// sequence's conv state becomes the last K−1 inputs of state ++ its rows.
// Each thread shifts one channel in order (row i is written after row
// n+i ≥ i is read). Launch: grid (⌈cd/256⌉, R), block 256.
extern "C" __global__ void dn_conv_state(const float* __restrict__ proj, int ldp, int grouped, int nk, int dk, int nv, int dv,
                                         int K, float* __restrict__ state, int stride, const int* __restrict__ slot) {
  pdl_trigger();
  pdl_wait();
  const int cd = 2 * nk * dk + nv * dv, c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y, R = gridDim.y, h = K - 1;
  if (c >= cd) return;
  const int s = slot[r];
  if (r + 1 < R && slot[r + 1] == s) return;  // not its sequence's last row
  int n = 1;                                  // the sequence's rows in the step (at most K−1 counted)
  while (n < h && r - n >= 0 && slot[r - n] == s) n++;
  const int col = dn_col(c, grouped, nk, dk, nv, dv);
  float* st = state + (size_t)s * stride;
  for (int i = 0; i < h; i++) {
    st[(size_t)i * cd + c] = n + i >= h ? proj[(size_t)(r - (h - 1 - i)) * ldp + col] : st[(size_t)(n + i) * cd + c];
  }
}

// dn_conv_step: dn_conv then dn_conv_state in one launch for steps whose
// rows are each a sequence of its own (decode): thread (c, r) alone reads
// and writes channel c of row r's carried inputs, so it convolves the K−1
// of them with the row's input and shifts them by one in place (the same
// sums, the same state). dn_conv's parameters and launch.
extern "C" __global__ void dn_conv_step(const float* __restrict__ proj, int ldp, int grouped, int nk, int dk, int nv, int dv,
                                        const float* __restrict__ w, int K, float* __restrict__ state, int stride,
                                        const int* __restrict__ slot, float* __restrict__ out, int ldo) {
  pdl_trigger();
  pdl_wait();
  const int cd = 2 * nk * dk + nv * dv, c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y, h = K - 1;
  if (c >= cd) return;
  const int col = dn_col(c, grouped, nk, dk, nv, dv);
  float* st = state + (size_t)slot[r] * stride;
  const float xr = proj[(size_t)r * ldp + col];
  float acc = 0.0f;
  for (int j = 0; j < K; j++) {
    const float x = j < h ? st[(size_t)j * cd + c] : xr;
    acc += w[(size_t)c * K + j] * x;
    if (j > 0) st[(size_t)(j - 1) * cd + c] = x;  // the window shifts by one: row j−1 takes input j
  }
  out[(size_t)r * ldo + c] = acc / (1.0f + expf(-acc));
}

// dn_zba gives the columns of z_h, b_h and a_h in a projection row.
__device__ __forceinline__ void dn_zba(int grouped, int nk, int dk, int nv, int dv, int h, int& zc, int& bc, int& ac) {
  const int ratio = nv / nk, kh = h / ratio, kd = nk * dk, vd = nv * dv;
  if (grouped) {
    const int per = 2 * dk + 2 * ratio * dv, hi = h % ratio, ba = nk * per + kh * 2 * ratio;
    zc = kh * per + 2 * dk + ratio * dv + hi * dv;
    bc = ba + hi;
    ac = ba + ratio + hi;
  } else {
    const int cd = 2 * kd + vd;
    zc = cd + h * dv;
    bc = cd + vd + h;
    ac = cd + vd + nv + h;
  }
}

__device__ __forceinline__ double dn_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

// dn_rule: the gated delta rule of value head h = blockIdx.x over the rows
// of the step's sequence blockIdx.y (of the R rows, the y-th run of one
// slot; a block past the last sequence returns), in order, on the
// sequence's S_h held in shared memory:
// per row, with q, k its key head's (h / (nv/nk)) channels of the conv
// output (q_all | k_all | v_all, ldc apart) and a, b, z from the
// projections,
//   q = q/√(Σq²+1e-6) · dk^−½,  k = k/√(Σk²+1e-6)
//   g = −e^{A_log[h]}·softplus(a + dt_bias[h]),  β = σ(b)
//   S = e^g·S;  δ = β·(v − Sᵀk);  S = S + k⊗δ;  o = Sᵀq
//   out[r][h·dv + j] = nw[j]·(o_j·rms⁻¹(o)) · silu(z_j)   (eps: RMSNorm's)
// The block is P groups of dvp = ⌈dv/32⌉·32 threads: thread (p, j) owns the
// rows i ≡ p (mod P) of column j of S (no synchronisation on S), held in
// its registers when they are at most DN_REG (dk ≤ DN_REG·P: all of its
// loads in flight at once, where a copy through shared memory waited on a
// round trip per few elements), else in shared memory; Sᵀk and
// Sᵀq are summed over the groups' partials in group order. A row's inputs
// (q, k, v, a, b, z) are loaded during the row before (same arithmetic:
// the chain of rows waits on no global load). Launch: grid
// (nv, the step's sequences), block DNRuleThreads(dv) (P·dvp, P =
// clamp(512/dvp, 1, 8); dv ≤ 512), dynamic shared DNRuleShared: 4·(dk·dv +
// 2·dk + P·dvp).
#define DN_REG 32
extern "C" __global__ void __launch_bounds__(512) dn_rule(const float* __restrict__ conv, int ldc, const float* __restrict__ proj, int ldp,
                                   int grouped, int nk, int dk, int nv, int dv, const float* __restrict__ alog,
                                   const float* __restrict__ dtb, const float* __restrict__ nw, float eps,
                                   float* __restrict__ state, int stride, int soff, const int* __restrict__ slot,
                                   int R, float* __restrict__ out, int ldo) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, tid = threadIdx.x, dvp = (dv + 31) & ~31, P = blockDim.x / dvp, j = tid % dvp, pg = tid / dvp;
  const bool on = j < dv;
  int r0 = 0;  // the first row of sequence blockIdx.y
  for (int n = 0; r0 < R; r0++) {
    if (r0 > 0 && slot[r0] == slot[r0 - 1]) continue;
    if (n++ == (int)blockIdx.y) break;
  }
  if (r0 >= R) return;
  const int s = slot[r0];
  extern __shared__ float sm[];
  __shared__ double red[32];
  float *S = sm, *q = sm + (size_t)dk * dv, *k = q + dk, *part = k + dk;  // part: P × dvp
  const int ratio = nv / nk, kh = h / ratio, kd = nk * dk;
  int zc, bc, ac;
  dn_zba(grouped, nk, dk, nv, dv, h, zc, bc, ac);
  float* gS = state + (size_t)s * stride + soff + (size_t)h * dk * dv;
  const bool reg = dk <= DN_REG * P;  // block-uniform
  float sr[DN_REG];                   // reg: rows pg + t·P of column j
  if (reg) {
#pragma unroll
    for (int t = 0; t < DN_REG; t++) {
      const int i = pg + t * P;
      sr[t] = on && i < dk ? gS[(size_t)i * dv + j] : 0.0f;
    }
  } else {
    for (int i = tid; i < dk * dv; i += blockDim.x) S[i] = gS[i];
  }
  const double ea = exp((double)alog[h]), bias = (double)dtb[h];
  const float qs = (float)(1.0 / sqrt((double)dk));
  // Each row's inputs from global memory (its q, k element, v_j, a, b,
  // z_j and whether the next row is this sequence's) are loaded while the
  // row before is computed: the recurrence's chain waits on no load. A
  // thread holds one key element, so a block of fewer threads than dk
  // loops as before (pre: 0).
  const bool pre = blockDim.x >= (unsigned)dk;
  const bool lead = on && pg == 0;  // one thread per column writes
  float nqa = 0.0f, nka = 0.0f, nvj = 0.0f, na = 0.0f, nb = 0.0f, nz = 0.0f;
  auto fetch = [&](int r) {
    const float* c = conv + (size_t)r * ldc;
    const float* p = proj + (size_t)r * ldp;
    if (pre && tid < dk) {
      nqa = c[kh * dk + tid];
      nka = c[kd + kh * dk + tid];
    }
    if (on) nvj = c[2 * kd + h * dv + j];
    na = p[ac];
    nb = p[bc];
    if (lead) nz = p[zc + j];
  };
  fetch(r0);
  bool more = true;
  for (int r = r0; more; r++) {
    const float* c = conv + (size_t)r * ldc;
    const float qa = nqa, ka = nka, vj = nvj, pa = na, pb = nb, zj = nz;
    more = r + 1 < R && slot[r + 1] == s;
    if (more) fetch(r + 1);
    __syncthreads();  // the previous row's reads of q and k are done
    double sq = 0.0, sk = 0.0;
    if (pre) {
      if (tid < dk) {
        q[tid] = qa;
        k[tid] = ka;
        sq = (double)qa * qa;
        sk = (double)ka * ka;
      }
    } else {
      for (int i = tid; i < dk; i += blockDim.x) {
        const float a = c[kh * dk + i], b = c[kd + kh * dk + i];
        q[i] = a;
        k[i] = b;
        sq += (double)a * a;
        sk += (double)b * b;
      }
    }
    sq = block_sum_d(sq, red);
    sk = block_sum_d(sk, red);
    const float iq = (float)(1.0 / sqrt((double)((float)sq + 1e-6f))), ik = (float)(1.0 / sqrt((double)((float)sk + 1e-6f)));
    for (int i = tid; i < dk; i += blockDim.x) {
      q[i] = (q[i] * iq) * qs;
      k[i] = k[i] * ik;
    }
    __syncthreads();
    const float g = (float)(-ea * dn_softplus((double)pa + bias));
    const float beta = (float)(1.0 / (1.0 + exp(-(double)pb)));
    const float eg = (float)exp((double)g);
    float u = 0.0f;
    if (on && reg) {
#pragma unroll
      for (int t = 0; t < DN_REG; t++) {
        const int i = pg + t * P;
        if (i < dk) {
          const float v = sr[t] * eg;
          sr[t] = v;
          u += k[i] * v;
        }
      }
    } else if (on) {
      for (int i = pg; i < dk; i += P) {
        const float v = S[i * dv + j] * eg;
        S[i * dv + j] = v;
        u += k[i] * v;
      }
    }
    part[pg * dvp + j] = u;
    __syncthreads();
    u = 0.0f;
    for (int g2 = 0; g2 < P; g2++) u += part[g2 * dvp + j];
    const float d = on ? beta * (vj - u) : 0.0f;
    __syncthreads();  // every partial of Sᵀk is read
    float o = 0.0f;
    if (on && reg) {
#pragma unroll
      for (int t = 0; t < DN_REG; t++) {
        const int i = pg + t * P;
        if (i < dk) {
          const float v = sr[t] + k[i] * d;
          sr[t] = v;
          o += q[i] * v;
        }
      }
    } else if (on) {
      for (int i = pg; i < dk; i += P) {
        const float v = S[i * dv + j] + k[i] * d;
        S[i * dv + j] = v;
        o += q[i] * v;
      }
    }
    part[pg * dvp + j] = o;
    __syncthreads();
    o = 0.0f;
    for (int g2 = 0; g2 < P; g2++) o += part[g2 * dvp + j];
    const double ss = block_sum_d(lead ? (double)o * o : 0.0, red);
    if (lead) {
      const float inv = rms_inv(ss, dv, eps);
      out[(size_t)r * ldo + h * dv + j] = rms_apply(o, inv, nw[j], 0) * (zj / (1.0f + expf(-zj)));
    }
  }
  if (reg) {
#pragma unroll
    for (int t = 0; t < DN_REG; t++) {
      const int i = pg + t * P;
      if (on && i < dk) gS[(size_t)i * dv + j] = sr[t];
    }
    return;
  }
  __syncthreads();
  for (int i = tid; i < dk * dv; i += blockDim.x) gS[i] = S[i];
}

// The chunked form of the rule for prefill (kernels/deltanet.go Chunked,
// the WY/UT form): a sequence's rows of the step in chunks of DN_C from its
// first row (the last one partial). Per chunk of n rows and value head h,
// with Γ the cumulative sum of g over the chunk (float32, in order), q̂ and
// k̂ the L2-normalised q (times dk^−½) and k:
//   L[t,s] = β_t (k̂_t·k̂_s) e^{Γt−Γs} (s < t);   (I+L)[U | W] = [β⊙v | β⊙e^Γ⊙k̂]
//   M[t,s] = (q̂_t·k̂_s) e^{Γt−Γs} (s ≤ t);  Qe_t = e^{Γt} q̂_t;  Kd_t = e^{Γn−Γt} k̂_t
// (dn_chunk_prep: everything that does not depend on S, every chunk of the
// step in parallel), then in order over the chunks (dn_chunk_state)
//   V' = U − W·S;  O = Qe·S + M·V';  S = e^{Γn} S + Kdᵀ·V'
// and dn_gnorm applies the gated RMSNorm to O (dn_rule's output arithmetic).
// The three launches share dn_rule's parameters and one more, the scratch
// X: per step row r and value head h, DNChunkFloats(dk, dv) = dv + 3·dk +
// DN_C + 4 floats at (r·nv + h)·F: [U dv | W dk | Qe dk | Kd dk | M row t
// of its chunk (DN_C; zero past t) | e^{Γn} (the chunk's first row) | pad].
// Needs dk and dv multiples of 4, dk ≤ 128 and dv ≤ 512 (kern.DeltaNet.ChunkFits).
#define DN_C 64
#define DN_J 32  // columns of S a dn_chunk_state block carries

// dn_cp16 copies 16 bytes from global to shared memory without a register
// stop (cp.async on sm_80+; a plain copy elsewhere, the host emulation);
// dn_cp_wait waits for this thread's copies (the block then synchronises).
__device__ __forceinline__ void dn_cp16(float* dst, const float* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
#else
  *(float4*)dst = *(const float4*)src;
#endif
}
__device__ __forceinline__ void dn_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// dn_chunk_find: the first row and rows of the step's chunk y (chunks in row
// order; each sequence's rows from its first in chunks of DN_C), or n = 0
// past the last chunk. Warp-wide (every lane of one warp calls it; 32 rows
// a round by ballots: a row starts a chunk when it is DN_C·m rows after
// its sequence's first, the last sequence start at or before it).
__device__ __forceinline__ void dn_chunk_find(const int* __restrict__ slot, int R, int y, int& r0, int& n) {
  const int lane = threadIdx.x & 31;
  int start = 0, c = 0;
  r0 = -1;
  for (int base = 0; base < R; base += 32) {
    const int r = base + lane;
    const bool in = r < R;
    const bool st = in && (r == 0 || slot[r] != slot[r - 1]);
    const unsigned sm = __ballot_sync(FULL_MASK, st);
    const unsigned le = sm & (0xffffffffu >> (31 - lane));  // starts at or before this row in the round
    const int rs = le ? base + 31 - __clz(le) : start;
    const bool cs = in && (r - rs) % DN_C == 0;
    const unsigned cm = __ballot_sync(FULL_MASK, cs);
    const int cnt = __popc(cm);
    if (y < c + cnt) {  // warp-uniform
      const bool mine = cs && __popc(cm & ((1u << lane) - 1u)) == y - c;
      r0 = base + __ffs(__ballot_sync(FULL_MASK, mine)) - 1;
      break;
    }
    c += cnt;
    if (sm) start = base + 31 - __clz(sm);
  }
  n = 0;
  if (r0 < 0) return;  // warp-uniform
  const int s = slot[r0];
  // A sequence's rows are consecutive and it occurs once: its rows among
  // the next DN_C are the chunk's.
  n = __popc(__ballot_sync(FULL_MASK, r0 + lane < R && slot[r0 + lane] == s)) +
      __popc(__ballot_sync(FULL_MASK, r0 + 32 + lane < R && slot[r0 + 32 + lane] == s));
}

// dn_nth_start: the first row of the step's k-th sequence (runs of one
// slot), or R past the last. Warp-wide, 32 rows a round.
__device__ __forceinline__ int dn_nth_start(const int* __restrict__ slot, int R, int k) {
  const int lane = threadIdx.x & 31;
  for (int base = 0, c = 0; base < R; base += 32) {
    const int r = base + lane;
    const bool st = r < R && (r == 0 || slot[r] != slot[r - 1]);
    const unsigned sm = __ballot_sync(FULL_MASK, st);
    const int cnt = __popc(sm);
    if (k < c + cnt) {  // warp-uniform
      const bool mine = st && __popc(sm & ((1u << lane) - 1u)) == k - c;
      return base + __ffs(__ballot_sync(FULL_MASK, mine)) - 1;
    }
    c += cnt;
  }
  return R;
}

// dn_chunk_prep: chunk blockIdx.y of the step (a block past the last
// returns), value head blockIdx.x: U, W, M, Qe, Kd and e^{Γn} into X.
// Launch: grid (nv, DNChunkBound(R, seqs)), block 256, dynamic shared
// DNPrepShared(dk, dv) = 4·(2·DN_C·(dk+4) + DN_C·DN_C + 4·DN_C + DN_C·dv).
extern "C" __global__ void __launch_bounds__(256) dn_chunk_prep(const float* __restrict__ conv, int ldc, const float* __restrict__ proj, int ldp,
                                                  int grouped, int nk, int dk, int nv, int dv, const float* __restrict__ alog,
                                                  const float* __restrict__ dtb, const float* __restrict__ nw, float eps,
                                                  float* __restrict__ state, int stride, int soff, const int* __restrict__ slot,
                                                  int R, float* __restrict__ out, int ldo, float* __restrict__ X) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ float sm[];
  __shared__ int info[2];
  const int h = blockIdx.x, tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarp = nt >> 5;  // nt = 256
  if (warp == 0) {
    int r0, n;
    dn_chunk_find(slot, R, blockIdx.y, r0, n);
    if (lane == 0) info[0] = r0, info[1] = n;
  }
  __syncthreads();
  const int r0 = info[0], n = info[1];
  if (n == 0) return;  // block-uniform
  const int ld = dk + 4, kd = nk * dk, kh = h / (nv / nk), F = dv + 3 * dk + DN_C + 4;
  float *qn = sm, *kn = qn + DN_C * ld, *L = kn + DN_C * ld, *G = L + DN_C * DN_C, *beta = G + DN_C, *eg = beta + DN_C,
        *egn = eg + DN_C, *vs = egn + DN_C;  // vs: the chunk's v rows of head h (dv apart)
  int zc, bc, ac;
  dn_zba(grouped, nk, dk, nv, dv, h, zc, bc, ac);
  if (aligned16(conv) && ldc % 4 == 0) {  // block-uniform: 16-byte copies (dk % 4 == 0)
    const int d4 = dk / 4;
    for (int e = tid; e < DN_C * d4; e += nt) {
      const int t = e / d4, i = 4 * (e - t * d4);
      const float* c = conv + (size_t)(r0 + t) * ldc;
      if (t < n) {
        dn_cp16(qn + t * ld + i, c + kh * dk + i);
        dn_cp16(kn + t * ld + i, c + kd + kh * dk + i);
        if (i < dv) dn_cp16(vs + t * dv + i, c + 2 * kd + h * dv + i);
      } else {
        *(float4*)(qn + t * ld + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(float4*)(kn + t * ld + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    for (int e = tid; e < n * (dv / 4); e += nt) {  // v past the first dk columns (dv > dk)
      const int t = e / (dv / 4), i = 4 * (e - t * (dv / 4));
      if (i >= dk) dn_cp16(vs + t * dv + i, conv + (size_t)(r0 + t) * ldc + 2 * kd + h * dv + i);
    }
    dn_cp_wait();
  } else {
    for (int e = tid; e < DN_C * dk; e += nt) {
      const int t = e / dk, i = e - t * dk;
      const float* c = conv + (size_t)(r0 + t) * ldc;
      qn[t * ld + i] = t < n ? c[kh * dk + i] : 0.0f;
      kn[t * ld + i] = t < n ? c[kd + kh * dk + i] : 0.0f;
    }
    for (int e = tid; e < n * dv; e += nt) {
      const int t = e / dv, i = e - t * dv;
      vs[t * dv + i] = conv[(size_t)(r0 + t) * ldc + 2 * kd + h * dv + i];
    }
  }
  if (tid < DN_C) {
    float g = 0.0f, b = 0.0f;
    if (tid < n) {
      const float* p = proj + (size_t)(r0 + tid) * ldp;
      g = (float)(-exp((double)alog[h]) * dn_softplus((double)p[ac] + (double)dtb[h]));
      b = (float)(1.0 / (1.0 + exp(-(double)p[bc])));
    }
    G[tid] = g;
    beta[tid] = b;
  }
  __syncthreads();
  // L2 norms, a warp a row (Σ in double, as L2Norm), q also times dk^−½.
  const float qs = (float)(1.0 / sqrt((double)dk));
  for (int t = warp; t < n; t += nwarp) {
    double sq = 0.0, sk = 0.0;
    for (int i = lane; i < dk; i += 32) {
      sq += (double)qn[t * ld + i] * qn[t * ld + i];
      sk += (double)kn[t * ld + i] * kn[t * ld + i];
    }
    sq = warp_sum_d(sq);
    sk = warp_sum_d(sk);
    const float iq = (float)(1.0 / sqrt((double)((float)sq + 1e-6f))), ik = (float)(1.0 / sqrt((double)((float)sk + 1e-6f)));
    for (int i = lane; i < dk; i += 32) {
      qn[t * ld + i] = (qn[t * ld + i] * iq) * qs;
      kn[t * ld + i] = kn[t * ld + i] * ik;
    }
  }
  if (tid == 0) {
    float acc = 0.0f;  // Γ: the cumulative sum in order
    for (int t = 0; t < n; t++) G[t] = acc = acc + G[t];
  }
  __syncthreads();
  if (tid < DN_C) {
    eg[tid] = tid < n ? (float)exp((double)G[tid]) : 0.0f;
    egn[tid] = tid < n ? (float)exp((double)(G[n - 1] - G[tid])) : 0.0f;
  }
  // L and M over 4×4 entries a thread: rows ti + 16a, columns si + 16b
  // (a block of 256 threads covers DN_C × DN_C; kn and qn rows dk + 4
  // apart, so a quarter-warp's 16-byte reads of 8 rows hit distinct banks).
  {
    const int ti = tid / 16, si = tid % 16;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
      for (int b2 = 0; b2 < 4; b2++) kk[a][b2] = 0.0f, qk[a][b2] = 0.0f;
    for (int i = 0; i < dk; i += 4) {
      float4 kt[4], qt[4], ks[4];
#pragma unroll
      for (int a = 0; a < 4; a++) {
        kt[a] = *(const float4*)(kn + (ti + 16 * a) * ld + i);
        qt[a] = *(const float4*)(qn + (ti + 16 * a) * ld + i);
        ks[a] = *(const float4*)(kn + (si + 16 * a) * ld + i);
      }
#pragma unroll
      for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b2 = 0; b2 < 4; b2++) {
          kk[a][b2] += kt[a].x * ks[b2].x + kt[a].y * ks[b2].y + kt[a].z * ks[b2].z + kt[a].w * ks[b2].w;
          qk[a][b2] += qt[a].x * ks[b2].x + qt[a].y * ks[b2].y + qt[a].z * ks[b2].z + qt[a].w * ks[b2].w;
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
      for (int b2 = 0; b2 < 4; b2++) {
        const int t = ti + 16 * a, s = si + 16 * b2;
        const float e = t < n && s <= t ? (float)exp((double)(G[t] - G[s])) : 0.0f;
        L[t * DN_C + s] = s < t ? (beta[t] * kk[a][b2]) * e : 0.0f;
        if (t < n) X[((size_t)(r0 + t) * nv + h) * F + dv + 3 * dk + s] = qk[a][b2] * e;
      }
  }
  __syncthreads();
  // Forward substitution, a thread a column of [β⊙v | β⊙e^Γ⊙k̂] (all DN_C
  // rows in registers; rows past n are zero and stay zero).
  for (int col = tid; col < dv + dk; col += nt) {
    float x[DN_C];
#pragma unroll
    for (int t = 0; t < DN_C; t++) {
      float v = 0.0f;
      if (t < n) v = col < dv ? beta[t] * vs[t * dv + col] : (beta[t] * eg[t]) * kn[t * ld + col - dv];
      x[t] = v;
    }
#pragma unroll
    for (int t = 1; t < DN_C; t++) {
      float acc = x[t];
#pragma unroll
      for (int s = 0; s < t; s++) acc -= L[t * DN_C + s] * x[s];
      x[t] = acc;
    }
#pragma unroll
    for (int t = 0; t < DN_C; t++)
      if (t < n) X[((size_t)(r0 + t) * nv + h) * F + col] = x[t];
  }
  // Qe, Kd and e^{Γn}.
  for (int e = tid; e < n * dk; e += nt) {
    const int t = e / dk, i = e - t * dk;
    float* xr = X + ((size_t)(r0 + t) * nv + h) * F + dv + dk;
    xr[i] = eg[t] * qn[t * ld + i];
    xr[dk + i] = egn[t] * kn[t * ld + i];
  }
  if (tid == 0) X[((size_t)r0 * nv + h) * F + dv + 3 * dk + DN_C] = eg[n - 1];
}

// dn_chunk_state: value head h = blockIdx.x / ⌈dv/DN_J⌉, its columns
// [DN_J·(blockIdx.x mod ⌈dv/DN_J⌉), +DN_J) of S, over the chunks of the
// step's sequence blockIdx.y in order: O (before the gated norm) into out,
// S advanced in the pool. Thread (tr, j) = (tid / 32, tid % 32) takes rows
// t ≡ tr (mod DN_SW) of V' and O and rows i of S in quads 4·(tr + DN_SW·u)..+3.
// Launch: grid (nv·⌈dv/DN_J⌉, seqs), block 32·DN_SW, dynamic shared
// DNStateShared(dk) = 4·(dk·DN_J + 3·DN_C·dk + DN_C·DN_C + 2·DN_C·DN_J).
#define DN_SW 16              // dn_chunk_state's warps
#define DN_SR (DN_C / DN_SW)  // rows of V' and O a thread
extern "C" __global__ void __launch_bounds__(32 * DN_SW) dn_chunk_state(const float* __restrict__ conv, int ldc, const float* __restrict__ proj, int ldp,
                                                   int grouped, int nk, int dk, int nv, int dv, const float* __restrict__ alog,
                                                   const float* __restrict__ dtb, const float* __restrict__ nw, float eps,
                                                   float* __restrict__ state, int stride, int soff, const int* __restrict__ slot,
                                                   int R, float* __restrict__ out, int ldo, const float* __restrict__ X) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ float sm[];
  const int slices = (dv + DN_J - 1) / DN_J, h = blockIdx.x / slices, j0 = (blockIdx.x % slices) * DN_J;
  const int tid = threadIdx.x, j = tid % 32, tr = tid / 32, F = dv + 3 * dk + DN_C + 4;
  __shared__ int span[2];
  if (tr == 0) {  // sequence blockIdx.y's rows [r0, r1)
    const int a = dn_nth_start(slot, R, blockIdx.y), b = dn_nth_start(slot, R, blockIdx.y + 1);
    if (j == 0) span[0] = a, span[1] = b;
  }
  __syncthreads();
  const int r0 = span[0], r1 = span[1];
  if (r0 >= R) return;  // block-uniform
  const int s = slot[r0];
  float *S = sm, *W = S + dk * DN_J, *Qe = W + DN_C * dk, *Kd = Qe + DN_C * dk, *M = Kd + DN_C * dk, *U = M + DN_C * DN_C,
        *Vp = U + DN_C * DN_J;
  __shared__ float egn_s;
  const bool on = j0 + j < dv;
  float* gS = state + (size_t)s * stride + soff + (size_t)h * dk * dv + j0;
  for (int e = tid; e < dk * DN_J; e += blockDim.x) {
    const int i = e / DN_J, jj = e % DN_J;
    S[e] = j0 + jj < dv ? gS[(size_t)i * dv + jj] : 0.0f;
  }
  // Chunk c0's rows into shared memory by 16-byte copies, in two parts:
  // W, Qe and U (free once V' is written) are copied for the next chunk
  // while this one's O and S are computed, M and Kd after. Rows past a
  // chunk's n are not copied (nothing reads them: O and S take rows < n,
  // V' of rows ≥ n is never read).
  const int d4 = dk / 4;
  auto stage_a = [&](int c0, int n) {  // W, Qe, U
    for (int e = tid; e < n * d4; e += blockDim.x) {
      const int t = e / d4, i = 4 * (e - t * d4);
      const float* xr = X + ((size_t)(c0 + t) * nv + h) * F + dv;
      dn_cp16(W + t * dk + i, xr + i);
      dn_cp16(Qe + t * dk + i, xr + dk + i);
    }
    for (int e = tid; e < n * (DN_J / 4); e += blockDim.x) {
      const int t = e / (DN_J / 4), jj = 4 * (e % (DN_J / 4));
      if (j0 + jj < dv) dn_cp16(U + t * DN_J + jj, X + ((size_t)(c0 + t) * nv + h) * F + j0 + jj);
    }
  };
  auto stage_b = [&](int c0, int n) {  // Kd, M, e^{Γn}
    for (int e = tid; e < n * d4; e += blockDim.x) {
      const int t = e / d4, i = 4 * (e - t * d4);
      dn_cp16(Kd + t * dk + i, X + ((size_t)(c0 + t) * nv + h) * F + dv + 2 * dk + i);
    }
    for (int e = tid; e < n * (DN_C / 4); e += blockDim.x) {
      const int t = e / (DN_C / 4), c = 4 * (e % (DN_C / 4));
      dn_cp16(M + t * DN_C + c, X + ((size_t)(c0 + t) * nv + h) * F + dv + 3 * dk + c);
    }
    if (tid == 0) egn_s = X[((size_t)c0 * nv + h) * F + dv + 3 * dk + DN_C];
  };
  stage_a(r0, min(DN_C, r1 - r0));
  stage_b(r0, min(DN_C, r1 - r0));
  for (int c0 = r0; c0 < r1; c0 += DN_C) {
    const int n = min(DN_C, r1 - c0), c1 = c0 + DN_C, n1 = min(DN_C, r1 - c1);
    dn_cp_wait();
    __syncthreads();  // chunk c0's rows staged (and, the first time, S)
    // V' = U − W·S and Qe·S, rows tr + DN_SW·u.
    float aw[DN_SR], aq[DN_SR];
#pragma unroll
    for (int u = 0; u < DN_SR; u++) aw[u] = 0.0f, aq[u] = 0.0f;
    for (int i = 0; i < dk; i += 4) {
      const float s0 = S[i * DN_J + j], s1 = S[(i + 1) * DN_J + j], s2 = S[(i + 2) * DN_J + j], s3 = S[(i + 3) * DN_J + j];
#pragma unroll
      for (int u = 0; u < DN_SR; u++) {
        const float4 w = *(const float4*)(W + (tr + DN_SW * u) * dk + i), q = *(const float4*)(Qe + (tr + DN_SW * u) * dk + i);
        aw[u] += w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
        aq[u] += q.x * s0 + q.y * s1 + q.z * s2 + q.w * s3;
      }
    }
#pragma unroll
    for (int u = 0; u < DN_SR; u++) {
      const int t = tr + DN_SW * u;
      Vp[t * DN_J + j] = U[t * DN_J + j] - aw[u];
    }
    __syncthreads();  // V' written; W, Qe and U free
    if (c1 < r1) stage_a(c1, n1);
    // O = Qe·S + M·V' (out), and S = e^{Γn} S + Kdᵀ·V'.
#pragma unroll
    for (int u = 0; u < DN_SR; u++) {
      const int t = tr + DN_SW * u;
      if (t >= n) break;
      float o = aq[u];
      for (int s2 = 0; s2 <= t; s2++) o += M[t * DN_C + s2] * Vp[s2 * DN_J + j];
      if (on) out[(size_t)(c0 + t) * ldo + h * dv + j0 + j] = o;
    }
    const float en = egn_s;
    for (int i4 = tr; 4 * i4 < dk; i4 += DN_SW) {
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
      for (int t = 0; t < n; t++) {
        const float v = Vp[t * DN_J + j];
        const float4 kq = *(const float4*)(Kd + t * dk + 4 * i4);
        a0 += kq.x * v, a1 += kq.y * v, a2 += kq.z * v, a3 += kq.w * v;
      }
      float* sp = S + 4 * i4 * DN_J + j;
      sp[0] = en * sp[0] + a0;
      sp[DN_J] = en * sp[DN_J] + a1;
      sp[2 * DN_J] = en * sp[2 * DN_J] + a2;
      sp[3 * DN_J] = en * sp[3 * DN_J] + a3;
    }
    __syncthreads();  // M, Kd and e^{Γn} read
    if (c1 < r1) stage_b(c1, n1);
  }
  for (int e = tid; e < dk * DN_J; e += blockDim.x) {
    const int i = e / DN_J, jj = e % DN_J;
    if (j0 + jj < dv) gS[(size_t)i * dv + jj] = S[e];
  }
}

// dn_gnorm: the gated RMSNorm of row blockIdx.y's value head blockIdx.x of
// out in place (dn_rule's output arithmetic on dn_chunk_state's O).
// Launch: grid (nv, R), block ⌈dv/32⌉·32.
extern "C" __global__ void dn_gnorm(const float* __restrict__ conv, int ldc, const float* __restrict__ proj, int ldp,
                                    int grouped, int nk, int dk, int nv, int dv, const float* __restrict__ alog,
                                    const float* __restrict__ dtb, const float* __restrict__ nw, float eps,
                                    float* __restrict__ state, int stride, int soff, const int* __restrict__ slot,
                                    int R, float* __restrict__ out, int ldo, const float* __restrict__ X) {
  pdl_trigger();
  pdl_wait();
  __shared__ double red[32];
  const int h = blockIdx.x, r = blockIdx.y, j = threadIdx.x;
  const bool on = j < dv;
  int zc, bc, ac;
  dn_zba(grouped, nk, dk, nv, dv, h, zc, bc, ac);
  float* o = out + (size_t)r * ldo + h * dv;
  const float v = on ? o[j] : 0.0f;
  const double ss = block_sum_d(on ? (double)v * v : 0.0, red);
  if (!on) return;
  const float zj = proj[(size_t)r * ldp + zc + j];
  o[j] = rms_apply(v, rms_inv(ss, dv, eps), nw[j], 0) * (zj / (1.0f + expf(-zj)));
}
