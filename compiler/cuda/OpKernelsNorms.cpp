// Op kernels of the row kernels: LAYER_NORM, RMS_NORM, their gradients,
// BIAS_GRAD and the column sums that finish the parameter gradients.
#include "compiler/cuda/OpKernelBuilder.h"

#include <algorithm>
#include <map>

namespace mt::opk {

namespace {

// Blocks of the partial column sums: enough to fill an H100 (132 SMs) a few
// times over, few enough that the second pass reads little.
int64_t partialBlocks(int64_t rows) { return std::max<int64_t>(1, std::min<int64_t>(rows, 528)); }

std::map<std::string, std::string> rowSubs(const RowShape &r, int64_t h, double eps) {
  return {{"V", std::to_string(r.v)}, {"K", std::to_string(r.k)}, {"B", std::to_string(r.block)},
          {"H", num(h)}, {"HF", flt(double(h))}, {"EPS", flt(eps)}};
}

// The norms' floats[1]: 1 when the stored weight w is applied as 1 + w
// (--apply-layernorm-1p); the kernels add it to the loaded weights, in fp32.
std::string weightOffset(const OpInstruction &ins, const char *wv) {
  const double offset = ins.floats.size() > 1 ? ins.floats[1] : 0.0;
  if (offset == 0.0)
    return "";
  return std::string("for (int l = 0; l < ${V}; ++l) ") + wv + " += " + flt(offset) + ";";
}

} // namespace

// LAYER_NORM and RMS_NORM: one block per row, the row in registers; fp32
// statistics (the variance in a second pass over the registers).
void genNorm(const OpInstruction &ins, Builder &b, bool layer) {
  const OpTensor &x = ins.in[0], &w = ins.in[1], &y = ins.out[0];
  const int64_t h = x.shape.back(), rows = h ? x.elements() / h : 0;
  const RowShape r = rowShape(h, lanesFor({x.dtype, w.dtype, y.dtype}, {h}), 4, 1024);
  auto s = rowSubs(r, h, ins.floats.at(0));
  s["TX"] = storage(x.dtype);
  s["TW"] = storage(w.dtype);
  s["TY"] = storage(y.dtype);
  s["TB"] = layer ? storage(ins.in[2].dtype) : "float";
  s["BIAS"] = layer ? ", const ${TB} *bias" : "";
  s["STATS"] = layer ? R"(  const float mean = mt_block_sum(s, mt_shared) / ${HF};
  float q = 0.0f;
#pragma unroll
  for (int k = 0; k < ${K}; ++k)
    if (((mt_u64)k * blockDim.x + threadIdx.x) * ${V} < ${H})
      for (int l = 0; l < ${V}; ++l) { const float e = a[k][l] - mean; q += e * e; }
  const float rstd = 1.0f / sqrtf(mt_block_sum(q, mt_shared) / ${HF} + ${EPS});
)"
                     : R"(  const float mean = 0.0f;
  const float rstd = 1.0f / sqrtf(mt_block_sum(s, mt_shared) / ${HF} + ${EPS});
)";
  s["ACC"] = layer ? "s += a[k][l]" : "s += a[k][l] * a[k][l]";
  s["BLOAD"] = layer ? "mt_load<${V}>(bias, c, bv);" : "";
  s["WOFF"] = weightOffset(ins, "wv[l]");
  s["EXPR"] = layer ? "(a[k][l] - mean) * rstd * wv[l] + bv[l]" : "a[k][l] * rstd * wv[l]";
  std::string t = R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TX} *x, const ${TW} *w${BIAS}, ${TY} *y) {
  extern __shared__ float mt_shared[];
  const mt_u64 at = (mt_u64)blockIdx.x * ${H};
  float a[${K}][${V}];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
    if (c < ${H}) { mt_load<${V}>(x, at + c, a[k]); for (int l = 0; l < ${V}; ++l) ${ACC}; }
    else for (int l = 0; l < ${V}; ++l) a[k][l] = 0.0f;
  }
${STATS}#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
    if (c >= ${H}) continue;
    float wv[${V}], bv[${V}], o[${V}];
    mt_load<${V}>(w, c, wv);
    ${WOFF}
    ${BLOAD}
    for (int l = 0; l < ${V}; ++l) o[l] = ${EXPR};
    mt_store<${V}>(y, at + c, o);
  }
}
)";
  // Two rounds: the substitutions themselves hold ${...}.
  std::string src = fill(fill(t, s), s);
  std::vector<OpArg> args = {in(0), in(1)};
  if (layer)
    args.push_back(in(2));
  args.push_back(outp(0));
  b.launch(layer ? "layer_norm" : "rms_norm", src, uint64_t(rows), r.block, 256, args);
}

// Adds the columns of `arrays` arrays of blocks x h partial sums (the
// first stage, one row per block of the kernel before) into the f32
// gradients, grad[j] = float(grad[j] + sum), in double: the second stage of
// the reduction. A CTA takes 32 columns (one per lane) and R row slices (one
// per warp): slice r sums partial rows r, r + R, ... in order, then the R
// slice sums are added pairwise in a fixed tree, so every run adds in the
// same order. One partial row (GRAD_ACCUMULATE) is an elementwise add.
void genColSums(Builder &b, uint64_t wsAt_, int64_t blocks, int64_t h, int arrays, DType grad) {
  std::vector<OpArg> args = {wsAt(wsAt_), opk::grad(0)};
  if (arrays == 2)
    args.push_back(opk::grad(1));
  const std::string tg = storage(grad);
  if (blocks == 1 && arrays == 1) {
    const int v = lanesFor({DType::F32}, {h});
    elementwise(b, "grad_add", "const float *ws, " + tg + " *g0", "ws, g0",
                "  float p[V], a[V];\n  mt_load<V>(ws, i, p);\n  mt_load<V>(g0, i, a);\n"
                "  for (int l = 0; l < V; ++l) a[l] = (float)((double)a[l] + (double)p[l]);\n"
                "  mt_store<V>(g0, i, a);\n",
                h, v, args);
    return;
  }
  // About four partial rows per slice, at most 32 slices (1024 threads).
  int64_t slices = 1;
  while (slices < 32 && slices * 2 * 4 <= blocks)
    slices *= 2;
  std::map<std::string, std::string> s = {{"G", num(blocks)}, {"H", num(h)},
                                          {"R", std::to_string(slices)},
                                          {"T", std::to_string(32 * slices)}};
  s["TG"] = tg;
  std::string src = fill(R"(extern "C" __global__ void __launch_bounds__(${T}) @ENTRY@(const float *ws, ${TG} *g0)", s);
  if (arrays == 2)
    src += ", " + tg + " *g1";
  src += fill(R"() {
  __shared__ double mt_part[${R}][32];
  const unsigned c = threadIdx.x & 31u, r = threadIdx.x >> 5;
  const mt_u64 j = (mt_u64)blockIdx.x * 32 + c;
  const float *p = ws + (mt_u64)blockIdx.y * ${G} * ${H};
  double s = 0.0;
  if (j < ${H})
    for (mt_u64 b = r; b < ${G}; b += ${R}) s += p[b * ${H} + j];
  mt_part[r][c] = s;
#pragma unroll
  for (unsigned half = ${R} / 2; half > 0; half >>= 1) {
    __syncthreads();
    if (r < half) mt_part[r][c] += mt_part[r + half][c];
  }
  if (r != 0 || j >= ${H}) return;
  ${TG} *g = )", s);
  src += arrays == 2 ? "blockIdx.y ? g1 : g0;\n" : "g0;\n";
  src += grad == DType::F32 ? "  g[j] = (float)((double)g[j] + mt_part[0][c]);\n}\n"
                            : "  const float sum[1] = {(float)((double)mt_get(g, j) + mt_part[0][c])};\n"
                              "  mt_store<1>(g, j, sum);\n}\n";
  b.launch("col_sums", src, uint64_t((h + 31) / 32), uint32_t(32 * slices), 0, args);
  if (arrays == 2)
    b.out.launches.back().kernel.grid[1] = 2;
}

// LAYER_NORM_GRAD and RMS_NORM_GRAD. Each row's reductions run over a
// "row group" of threads: a warp per row where a row fits 32 lanes with at
// most four vectors each (hidden <= 1024 in 16 bits), so a row needs no
// barrier and a block holds kRowWarps rows at once; else the whole block.
// Blocks take rows blockIdx, blockIdx + gridDim, ... (times kRowWarps for
// warps); each thread keeps its dw (and db) column partials in registers,
// and the block stores their sum per column to its workspace row at the
// end; col_sums adds the blocks' rows into the gradients.
constexpr int kRowWarps = 8;

void genNormGrad(const OpInstruction &ins, Builder &b, bool layer) {
  const OpTensor &dy = ins.in[0], &x = ins.in[1], &w = ins.in[2], &dx = ins.out[0];
  const int64_t h = x.shape.back(), rows = h ? x.elements() / h : 0;
  const int v = lanesFor({dy.dtype, x.dtype, w.dtype, dx.dtype}, {h});
  const bool warpRows = h <= int64_t(32) * v * 4;
  RowShape r = rowShape(h, v, 2, 512);
  if (warpRows)
    r = RowShape{v, uint32_t(32 * kRowWarps), int((h + 32 * v - 1) / (32 * v))};
  // The workspace is sized for partialBlocks() rows either way (the plan's
  // memory does not depend on the mode); a warp per row needs only enough
  // blocks for kRowWarps rows each.
  const int64_t wsBlocks = partialBlocks(rows);
  const int64_t blocks = warpRows ? std::max<int64_t>(1, std::min<int64_t>(wsBlocks, (rows + kRowWarps - 1) / kRowWarps))
                                  : wsBlocks;
  const int arrays = layer ? 2 : 1;
  const uint64_t ws = b.alloc(uint64_t(arrays * wsBlocks * h) * 4);
  auto s = rowSubs(r, h, ins.floats.at(0));
  s["TDY"] = storage(dy.dtype);
  s["TX"] = storage(x.dtype);
  s["TW"] = storage(w.dtype);
  s["TDX"] = storage(dx.dtype);
  s["N"] = num(rows);
  s["G"] = num(blocks);
  s["RW"] = std::to_string(kRowWarps);
  // The row group: its size, this thread's place in it, the first row and
  // the step between a group's rows, and its sums.
  if (warpRows) {
    s["NT"] = "32u";
    s["TID"] = "(threadIdx.x & 31u)";
    s["ROW0"] = "(mt_u64)blockIdx.x * ${RW} + (threadIdx.x >> 5)";
    s["STEP"] = "(mt_u64)gridDim.x * ${RW}";
    s["SUM"] = "mt_warp_sum";
    s["SUM2"] = "mt_warp_sum2";
  } else {
    s["NT"] = "blockDim.x";
    s["TID"] = "threadIdx.x";
    s["ROW0"] = "(mt_u64)blockIdx.x";
    s["STEP"] = "(mt_u64)gridDim.x";
    s["SUM"] = "mt_block_sum";
    s["SUM2"] = "mt_block_sum2";
  }
  s["ROW"] = layer ? R"(    const float mean = ${SUM}(s, mt_shared) / ${HF};
    float q = 0.0f;
    for (int k = 0; k < ${K}; ++k)
      if (((mt_u64)k * nt + tid) * ${V} < ${H})
        for (int l = 0; l < ${V}; ++l) { const float e = a[k][l] - mean; q += e * e; }
    const float rstd = 1.0f / sqrtf(${SUM}(q, mt_shared) / ${HF} + ${EPS});
    // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w.
    float sg = 0.0f, sgx = 0.0f;
    for (int k = 0; k < ${K}; ++k)
      for (int l = 0; l < ${V}; ++l) {
        a[k][l] = (a[k][l] - mean) * rstd;
        const float gw = g[k][l] * wv[k][l];
        sg += gw;
        sgx += gw * a[k][l];
      }
    ${SUM2}(sg, sgx, mt_shared);
    const float mg = sg / ${HF}, mgx = sgx / ${HF};
    for (int k = 0; k < ${K}; ++k)
      for (int l = 0; l < ${V}; ++l) {
        pw[k][l] += g[k][l] * a[k][l];
        pb[k][l] += g[k][l];
        a[k][l] = rstd * (g[k][l] * wv[k][l] - mg - a[k][l] * mgx);
      }
)"
                    : R"(    const float rstd = 1.0f / sqrtf(${SUM}(s, mt_shared) / ${HF} + ${EPS});
    // dx = rstd (g - x rstd^2 mean(g x)), g = dy w.
    float sgx = 0.0f;
    for (int k = 0; k < ${K}; ++k)
      for (int l = 0; l < ${V}; ++l) sgx += g[k][l] * wv[k][l] * a[k][l];
    const float mgx = ${SUM}(sgx, mt_shared) / ${HF};
    for (int k = 0; k < ${K}; ++k)
      for (int l = 0; l < ${V}; ++l) {
        pw[k][l] += g[k][l] * a[k][l] * rstd;
        a[k][l] = rstd * (g[k][l] * wv[k][l] - a[k][l] * rstd * rstd * mgx);
      }
)";
  s["ACC"] = layer ? "s += a[k][l]" : "s += a[k][l] * a[k][l]";
  // The block's partials to its workspace rows: each thread's own where
  // the block is one row group; summed over the warps through shared
  // memory where each warp is one.
  if (warpRows) {
    std::string store = R"(  __shared__ float mt_part[${RW} * ${H}];
  const unsigned warp = threadIdx.x >> 5;
)";
    for (int i = 0; i < arrays; ++i) {
      const std::string arr = i == 0 ? "pw" : "pb", row = i == 0 ? "blockIdx.x" : "(${G} + blockIdx.x)";
      store += "  __syncthreads();\n#pragma unroll\n  for (int k = 0; k < ${K}; ++k) {\n"
               "    const mt_u64 c = ((mt_u64)k * nt + tid) * ${V};\n"
               "    if (c < ${H}) for (int l = 0; l < ${V}; ++l) mt_part[warp * ${H} + c + l] = " + arr + "[k][l];\n  }\n"
               "  __syncthreads();\n"
               "  for (unsigned c = threadIdx.x; c < ${H}; c += blockDim.x) {\n"
               "    float t = 0.0f;\n    for (int u = 0; u < ${RW}; ++u) t += mt_part[u * ${H} + c];\n"
               "    ws[(mt_u64)" + row + " * ${H} + c] = t;\n  }\n";
    }
    s["STORE"] = store;
  } else {
    s["STORE"] = std::string(R"(#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * nt + tid) * ${V};
    if (c >= ${H}) continue;
    mt_store<${V}>(ws + (mt_u64)blockIdx.x * ${H}, c, pw[k]);
)") + (layer ? "    mt_store<${V}>(ws + (${G} + blockIdx.x) * ${H}, c, pb[k]);\n" : "") + "  }\n";
  }
  s["WOFF"] = weightOffset(ins, "wv[k][l]");
  // A warp's sums (the block sums' signature; no shared memory, no barrier).
  std::string t = warpRows ? R"(__device__ __forceinline__ float mt_warp_sum(float v, float *) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ void mt_warp_sum2(float &a, float &b, float *) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { a += __shfl_xor_sync(0xFFFFFFFFu, a, o); b += __shfl_xor_sync(0xFFFFFFFFu, b, o); }
}
)" : "";
  t += R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TDY} *dy, const ${TX} *x, const ${TW} *w, ${TDX} *dx, float *ws) {
  extern __shared__ float mt_shared[];
  const unsigned nt = ${NT}, tid = ${TID};
  float wv[${K}][${V}], pw[${K}][${V}], pb[${K}][${V}];
#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * nt + tid) * ${V};
    for (int l = 0; l < ${V}; ++l) { pw[k][l] = 0.0f; pb[k][l] = 0.0f; wv[k][l] = 0.0f; }
    if (c < ${H}) { mt_load<${V}>(w, c, wv[k]); ${WOFF} }
  }
  for (mt_u64 row = ${ROW0}; row < ${N}; row += ${STEP}) {
    const mt_u64 at = row * ${H};
    float a[${K}][${V}], g[${K}][${V}];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < ${K}; ++k) {
      const mt_u64 c = ((mt_u64)k * nt + tid) * ${V};
      if (c < ${H}) {
        mt_load<${V}>(x, at + c, a[k]);
        mt_load<${V}>(dy, at + c, g[k]);
        for (int l = 0; l < ${V}; ++l) ${ACC};
      } else {
        for (int l = 0; l < ${V}; ++l) { a[k][l] = 0.0f; g[k][l] = 0.0f; }
      }
    }
${ROW}#pragma unroll
    for (int k = 0; k < ${K}; ++k) {
      const mt_u64 c = ((mt_u64)k * nt + tid) * ${V};
      if (c < ${H}) mt_store<${V}>(dx, at + c, a[k]);
    }
  }
${STORE}}
)";
  std::string src = fill(fill(fill(t, s), s), s);
  b.launch(layer ? "layer_norm_grad" : "rms_norm_grad", src, uint64_t(blocks), r.block, 256,
           {in(0), in(1), in(2), outp(0), wsAt(ws)});
  genColSums(b, ws, blocks, h, arrays, gradType(ins));
}

// BIAS_GRAD: column partials of dy per block of rows, then col_sums.
void genBiasGrad(const OpInstruction &ins, Builder &b) {
  const OpTensor &dy = ins.in[0];
  const int64_t h = dy.shape.back(), rows = h ? dy.elements() / h : 0;
  const RowShape r = rowShape(h, lanesFor({dy.dtype, DType::F32}, {h}), 4, 256);
  const int64_t blocks = partialBlocks(rows);
  const uint64_t ws = b.alloc(uint64_t(blocks * h) * 4);
  auto s = rowSubs(r, h, 0);
  s["TDY"] = storage(dy.dtype);
  s["N"] = num(rows);
  std::string src = fill(R"(extern "C" __global__ void __launch_bounds__(${B}) @ENTRY@(const ${TDY} *dy, float *ws) {
  float acc[${K}][${V}];
  for (int k = 0; k < ${K}; ++k) for (int l = 0; l < ${V}; ++l) acc[k][l] = 0.0f;
  for (mt_u64 row = blockIdx.x; row < ${N}; row += gridDim.x)
#pragma unroll
    for (int k = 0; k < ${K}; ++k) {
      const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
      if (c >= ${H}) continue;
      float g[${V}];
      mt_load<${V}>(dy, row * ${H} + c, g);
      for (int l = 0; l < ${V}; ++l) acc[k][l] += g[l];
    }
#pragma unroll
  for (int k = 0; k < ${K}; ++k) {
    const mt_u64 c = ((mt_u64)k * blockDim.x + threadIdx.x) * ${V};
    if (c < ${H}) mt_store<${V}>(ws + (mt_u64)blockIdx.x * ${H}, c, acc[k]);
  }
}
)",
                         s);
  b.launch("bias_partials", src, uint64_t(blocks), r.block, 0, {in(0), wsAt(ws)});
  genColSums(b, ws, blocks, h, 1, gradType(ins));
}

} // namespace mt::opk
