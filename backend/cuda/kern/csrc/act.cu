// Elementwise ops (SwiGLU gate, residual add) and the embedding gather.
#include "common.cuh"

// silu_mul: h[r][i] = silu(g[r][i])·u[r][i], silu(v) = v/(1+e^-v). g and u
// may be the two halves of one gate|up row (u = g + n). Launch: grid
// (⌈n/256⌉, R), block 256.
extern "C" __global__ void silu_mul(const float* __restrict__ g, const float* __restrict__ u, int ldi,
                                    float* __restrict__ h, int ldh, int n) {
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (i >= n) return;
  const float v = g[(size_t)r * ldi + i];
  h[(size_t)r * ldh + i] = v / (1.0f + expf(-v)) * u[(size_t)r * ldi + i];
}

// add: y[r][i] += x[r][i]. Launch: grid (⌈n/256⌉, R), block 256.
extern "C" __global__ void add(float* y, int ldy, const float* __restrict__ x, int ldx, int n) {
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (i < n) y[(size_t)r * ldy + i] += x[(size_t)r * ldx + i];
}

// embed_<format>: out[r][:] = row ids[r] of the table (rows×cols, as
// stored), decoded to float32 exactly as quant's DecodeRow does; an id
// outside [0, rows) gives a row of zeros. Launch: grid R, block 256.
#define EMBED_HEAD                                                                                          \
  pdl_trigger();                                                                                            \
  pdl_wait();                                                                                               \
  const int id = ids[blockIdx.x];                                                                           \
  float* o = out + (size_t)blockIdx.x * ldo;                                                                \
  if (id < 0 || id >= rows) {                                                                               \
    for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = 0.0f;                                       \
    return;                                                                                                 \
  }
#define EMBED_PARAMS const uint8_t *__restrict__ W, int rows, int cols, const int *__restrict__ ids, float *out, int ldo

extern "C" __global__ void embed_f32(EMBED_PARAMS) {
  EMBED_HEAD
  const float* w = (const float*)W + (size_t)id * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = w[i];
}

extern "C" __global__ void embed_f16(EMBED_PARAMS) {
  EMBED_HEAD
  const uint16_t* w = (const uint16_t*)W + (size_t)id * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = f16_to_f32(w[i]);
}

extern "C" __global__ void embed_bf16(EMBED_PARAMS) {
  EMBED_HEAD
  const uint16_t* w = (const uint16_t*)W + (size_t)id * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = bf16_to_f32(w[i]);
}

extern "C" __global__ void embed_q8row(EMBED_PARAMS) {
  EMBED_HEAD
  const int8_t* q = (const int8_t*)W + (size_t)id * cols;
  const float s = f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)id));
  for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = s * (float)q[i];
}

// q8_2f: W = float(rs·q)·col, the column field at align4(rows·cols + 2·rows).
extern "C" __global__ void embed_q82f(EMBED_PARAMS) {
  EMBED_HEAD
  const int8_t* q = (const int8_t*)W + (size_t)id * cols;
  const float rs = f16_to_f32(ld_u16(W + (size_t)rows * cols + 2 * (size_t)id));
  const size_t coff = ((size_t)rows * cols + 2 * (size_t)rows + 3) & ~(size_t)3;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = __fmul_rn(rs, (float)q[i]) * ld_f32(W + coff + 4 * (size_t)i);
}

extern "C" __global__ void embed_q4tp(EMBED_PARAMS) {
  EMBED_HEAD
  const int gpr = cols / 32;
  const size_t poff = (size_t)rows * gpr * 16, coff = poff + (size_t)rows * 4;
  const int stride = (5 * gpr + 7) / 8;
  const uint16_t a = ld_u16(W + poff + 4 * (size_t)id), b = ld_u16(W + poff + 4 * (size_t)id + 2);
  const uint8_t* nib = W + (size_t)id * gpr * 16;
  const uint8_t* codes = W + coff + (size_t)id * stride;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const int g = i / 32, j = i % 32;
    const uint8_t byte = nib[g * 16 + j / 2];
    const int q = (j & 1) ? (byte >> 4) : (byte & 15);
    o[i] = (float)(q - 8) * q4tp_rung(a, b, q4tp_code(codes, g));
  }
}
