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
  const int ratio = nv / nk, kh = h / ratio, kd = nk * dk, vd = nv * dv;
  // Columns of z_h, b_h, a_h in a projection row.
  int zc, bc, ac;
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
