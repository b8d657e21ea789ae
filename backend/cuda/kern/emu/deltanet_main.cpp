// Runs one step of deltanet.cu's kernels (dn_conv, dn_conv_state, dn_rule)
// on the host under common.cuh's emulation: argv[1] is the input (12 int32
// header fields: nk nv dk dv K grouped R poolSeqs stepSeqs threads smem
// eps-bits, then proj, slots, conv weight, A_log, dt_bias, norm weight,
// pool), argv[2] receives conv output, block output and the pool; argv[3]
// "chunk" runs the chunked rule (dn_chunk_prep, dn_chunk_state, dn_gnorm)
// in place of dn_rule. Built
// and driven by scripts/emu-deltanet (TestEmuDeltaNet compares it with the
// CPU's kernels).
#include "common.cuh"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <algorithm>
thread_local dim3 threadIdx;
dim3 blockIdx, blockDim, gridDim;
std::barrier<>* g_bar;
std::vector<std::unique_ptr<std::barrier<>>> g_wbar;
double g_wbuf[32][32];
float* g_dyn_smem;
#include "deltanet_emu.cpp" // csrc/deltanet.cu with its dynamic shared memory mapped (the script)

template <class F>
void launch(dim3 grid, dim3 block, int smem, F f) {
  gridDim = grid;
  blockDim = block;
  std::vector<float> dyn(smem / 4 + 1);
  for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
      blockIdx.x = bx, blockIdx.y = by;
      g_dyn_smem = dyn.data();
      for (auto& v : dyn) v = NAN;  // garbage in shared memory
      std::barrier<> bar(block.x);
      g_bar = &bar;
      g_wbar.clear();
      for (unsigned w = 0; w < (block.x + 31) / 32; w++) g_wbar.emplace_back(new std::barrier<>(std::min(32u, block.x - 32 * w)));
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < block.x; t++) ts.emplace_back([t, &f] { threadIdx.x = t; f(); });
      for (auto& t : ts) t.join();
    }
}

static std::vector<char> readAll(const char* p) {
  FILE* f = fopen(p, "rb");
  std::vector<char> b;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) b.insert(b.end(), buf, buf + n);
  fclose(f);
  return b;
}

int main(int argc, char** argv) {
  std::vector<char> in = readAll(argv[1]);
  const int* hd = (const int*)in.data();
  int nk = hd[0], nv = hd[1], dk = hd[2], dv = hd[3], K = hd[4], grouped = hd[5], R = hd[6], poolSeqs = hd[7], nseq = hd[8],
      threads = hd[9], smem = hd[10];
  float eps = ((const float*)hd)[11];
  int kd = nk * dk, vd = nv * dv, cd = 2 * kd + vd, pw = cd + vd + 2 * nv, stride = (K - 1) * cd + nv * dk * dv;
  const char* p = in.data() + 12 * 4;
  auto takef = [&](size_t n) { std::vector<float> v((const float*)p, (const float*)p + n); p += 4 * n; return v; };
  auto takei = [&](size_t n) { std::vector<int> v((const int*)p, (const int*)p + n); p += 4 * n; return v; };
  std::vector<float> proj = takef((size_t)R * pw);
  std::vector<int> slot = takei(R);
  std::vector<float> w = takef((size_t)cd * K);
  std::vector<float> alog = takef(nv);
  std::vector<float> dtb = takef(nv);
  std::vector<float> nw = takef(dv);
  std::vector<float> pool = takef((size_t)poolSeqs * stride);
  if (p != in.data() + in.size()) { fprintf(stderr, "input size mismatch\n"); return 1; }
  std::vector<float> conv(R * cd, NAN), out(R * vd, NAN);
  dim3 cg{(unsigned)((cd + 255) / 256), (unsigned)R}, cb{256};
  launch(cg, cb, 0, [&] { dn_conv(proj.data(), pw, grouped, nk, dk, nv, dv, w.data(), K, pool.data(), stride, slot.data(), conv.data(), cd); });
  launch(cg, cb, 0, [&] { dn_conv_state(proj.data(), pw, grouped, nk, dk, nv, dv, K, pool.data(), stride, slot.data()); });
  if (argc > 3 && std::string(argv[3]) == "chunk") {
    // The chunked rule: kern.DeltaNet.ChunkCalls' launch shapes.
    const int F = dv + 3 * dk + DN_C + 4, bound = std::min(R, R / DN_C + nseq), slices = (dv + DN_J - 1) / DN_J;
    std::vector<float> X((size_t)R * nv * F, NAN);
    auto args = [&](auto kfn) {
      kfn(conv.data(), cd, proj.data(), pw, grouped, nk, dk, nv, dv, alog.data(), dtb.data(), nw.data(), eps, pool.data(), stride,
          (K - 1) * cd, slot.data(), R, out.data(), vd, X.data());
    };
    launch(dim3{(unsigned)nv, (unsigned)bound}, dim3{256}, 4 * (2 * DN_C * (dk + 4) + DN_C * DN_C + 4 * DN_C + DN_C * dv), [&] { args(dn_chunk_prep); });
    launch(dim3{(unsigned)(nv * slices), (unsigned)nseq}, dim3{32 * DN_SW}, 4 * (dk * DN_J + 3 * DN_C * dk + DN_C * DN_C + 2 * DN_C * DN_J),
           [&] { args(dn_chunk_state); });
    launch(dim3{(unsigned)nv, (unsigned)R}, dim3{(unsigned)((dv + 31) / 32 * 32)}, 0, [&] { args(dn_gnorm); });
  } else {
    launch(dim3{(unsigned)nv, (unsigned)nseq}, dim3{(unsigned)threads}, smem, [&] {
      dn_rule(conv.data(), cd, proj.data(), pw, grouped, nk, dk, nv, dv, alog.data(), dtb.data(), nw.data(), eps, pool.data(), stride,
              (K - 1) * cd, slot.data(), R, out.data(), vd);
    });
  }
  FILE* f = fopen(argv[2], "wb");
  fwrite(conv.data(), 4, conv.size(), f);
  fwrite(out.data(), 4, out.size(), f);
  fwrite(pool.data(), 4, pool.size(), f);
  fclose(f);
  return 0;
}
