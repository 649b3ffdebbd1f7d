// mt-moe-bench: the speed of an MoE layer's generated kernels on GPU 0
// against a dense SwiGLU MLP of equal active FLOPs, forward and backward,
// one JSON object on stdout.
//
// The MoE layer is what mtc lowers a Mixtral-style block's MLP to: the
// router's logits (a one-group GROUPED_MATMUL), MOE_ROUTER (softmax top-k,
// aux loss), MOE_PERMUTE, the experts' GROUPED_MATMUL fc1 [E, 2F, H],
// SWIGLU, GROUPED_MATMUL fc2 [E, H, F], MOE_UNPERMUTE; the backward runs
// the gradients of each in reverse, the weight gradients into f32. The
// dense layer has FFN width topk x F (the active FLOPs of one token) and
// runs fc1, SWIGLU and fc2 and their gradients through the same generated
// GEMM kernel as one group, so the ratio is the price of routing, permuting
// and uneven expert loads over the same GEMM core.
//
// FLOPs counted: GEMMs only, 6 H F per token and expert chosen forward
// (the router's 2 H E added for MoE), twice that backward.
//
// --emulate runs the same kernels on the host CUDA emulation (tiny shapes
// only: it checks this program, not the speed).
#include "KernelDevice.h"
#include "compiler/cuda/CudaOpKernels.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using mt::OpArg;
using mt::OpInstruction;
using mt::OpKernels;
using mt::OpParam;
using mt::OpStep;
using mt::OpTensor;
using mt::plan::DType;
using mt::plan::Opcode;
using Launch = mt::test::KernelDevice::Launch;

const char *kUsage =
    "usage: mt-moe-bench [--tokens 8192] [--seq-length 4096] [--hidden 4096] [--ffn 14336]\n"
    "                    [--experts 8] [--topk 2] [--capacity-factor 0] [--repeats 20]\n"
    "                    [--emulate]\n";

[[noreturn]] void fail(const std::string &message) {
  std::fprintf(stderr, "mt-moe-bench: error: %s\n", message.c_str());
  std::exit(1);
}

long long parseInt(const std::string &flag, const std::string &text, long long lo, long long hi) {
  char *end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || errno || v < lo || v > hi)
    fail(flag + " '" + text + "' is not an integer in [" + std::to_string(lo) + ", " +
         std::to_string(hi) + "]");
  return v;
}

OpTensor tensor(DType d, std::vector<int64_t> shape) {
  OpTensor t;
  t.dtype = d;
  t.shape = std::move(shape);
  return t;
}

size_t bytesOf(const OpTensor &t) {
  const int b = t.dtype == DType::BF16 || t.dtype == DType::F16 ? 2 : t.dtype == DType::I64 ? 8 : 4;
  return size_t(t.elements()) * size_t(b);
}

// Device buffers and the launches of a sequence of instructions.
class Program {
public:
  explicit Program(mt::test::KernelDevice &d) : device(d) {}
  ~Program() {
    for (uint64_t a : owned)
      device.release(a);
  }

  // A value: random bf16 (scale), f32 zeros, or given ints.
  uint64_t value(const OpTensor &t, float scale = 0.0f, const std::vector<int> *ints = nullptr) {
    const size_t n = size_t(t.elements());
    std::vector<uint8_t> bytes(std::max<size_t>(bytesOf(t), 16), 0);
    if (ints) {
      std::memcpy(bytes.data(), ints->data(), ints->size() * 4);
    } else if (scale != 0.0f && t.dtype == DType::BF16) {
      std::normal_distribution<float> normal(0.0f, scale);
      for (size_t i = 0; i < n; ++i) {
        const float x = normal(rng);
        uint32_t u;
        std::memcpy(&u, &x, 4);
        const uint16_t h = uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    uint64_t a = 0;
    if (std::string e = device.allocate(bytes.size(), &a); !e.empty())
      fail(e);
    owned.push_back(a);
    if (std::string e = device.to_device(a, bytes.data(), bytes.size()); !e.empty())
      fail(e);
    return a;
  }

  // The instruction's kernels, with its values' addresses; the workspace
  // is shared by every instruction (sized when the launches are built).
  void add(std::vector<Launch> &seq, const OpInstruction &ins, std::vector<uint64_t> in,
           std::vector<uint64_t> out, std::vector<uint64_t> grads = {}) {
    std::string error;
    std::optional<OpKernels> k = mt::generateOpKernels(ins, &error);
    if (!k)
      fail(error);
    pending.push_back({&seq, seq.size(), *k, std::move(in), std::move(out), std::move(grads)});
    wsBytes = std::max<uint64_t>(wsBytes, k->workspaceBytes);
    for (const OpStep &s : k->steps)
      if (s.kind == OpStep::Launch)
        seq.emplace_back(); // filled by finish()
  }

  void finish() {
    const uint64_t ws = value(tensor(DType::F32, {int64_t(std::max<uint64_t>(wsBytes, 16) / 4)}));
    for (const Pending &p : pending) {
      size_t at = p.first;
      for (const OpStep &s : p.kernels.steps) {
        if (s.kind != OpStep::Launch)
          fail("an MoE instruction with a collective");
        const mt::OpLaunch &l = p.kernels.launches[s.launch];
        Launch &out = (*p.seq)[at++];
        out.source = l.kernel.source;
        out.entry = l.kernel.entry;
        out.sharedBytes = l.kernel.sharedBytes;
        for (int i = 0; i < 3; ++i)
          out.grid[i] = l.kernel.grid[i], out.block[i] = l.kernel.block[i];
        for (const OpArg &a : l.args) {
          switch (a.kind) {
          case OpArg::In: out.args.push_back(p.in.at(a.index)); break;
          case OpArg::Out: out.args.push_back(p.out.at(a.index)); break;
          case OpArg::ParamGrad: out.args.push_back(p.grads.at(a.index)); break;
          case OpArg::Workspace: out.args.push_back(ws + a.index); break;
          default: fail("an MoE kernel reads the optimizer state");
          }
        }
        if (!l.kernel.scalarArgs.empty())
          fail("an MoE kernel with scalar arguments");
      }
    }
  }

  mt::test::KernelDevice &device;
  std::mt19937 rng{7};

private:
  struct Pending {
    std::vector<Launch> *seq;
    size_t first;
    OpKernels kernels;
    std::vector<uint64_t> in, out, grads;
  };
  std::vector<uint64_t> owned;
  std::vector<Pending> pending;
  uint64_t wsBytes = 0;
};

OpInstruction ins(Opcode op, std::vector<OpTensor> in, std::vector<OpTensor> out,
                  std::vector<int64_t> ints = {}, std::vector<double> floats = {},
                  std::vector<OpParam> params = {}) {
  OpInstruction i;
  i.op = op;
  i.in = std::move(in);
  i.out = std::move(out);
  i.ints = std::move(ints);
  i.floats = std::move(floats);
  i.params = std::move(params);
  return i;
}

OpParam param(std::vector<int64_t> shape) {
  OpParam p;
  p.shape = std::move(shape);
  p.dtype = DType::BF16;
  p.gradDtype = DType::F32;
  return p;
}

// fc1, SwiGLU, fc2 over `groups` segments given by `counts`, forward into
// `fwd` and backward into `bwd`: x [n, h] -> y [n, h], w1 [groups, 2f, h],
// w2 [groups, h, f]; the backward from dy to dx.
void mlp(Program &p, std::vector<Launch> &fwd, std::vector<Launch> &bwd, int64_t n, int64_t h,
         int64_t f, int64_t groups, uint64_t x, uint64_t counts, uint64_t y, uint64_t dy,
         uint64_t dx) {
  const DType b = DType::BF16;
  const OpTensor tx = tensor(b, {n, h}), tw1 = tensor(b, {groups, 2 * f, h}),
                 tw2 = tensor(b, {groups, h, f}), th = tensor(b, {n, 2 * f}), ta = tensor(b, {n, f}),
                 tc = tensor(DType::I32, {groups});
  const float ws1 = 1.0f / std::sqrt(float(h)), ws2 = 1.0f / std::sqrt(float(f));
  const uint64_t w1 = p.value(tw1, ws1), w2 = p.value(tw2, ws2);
  const uint64_t g1 = p.value(tensor(DType::F32, tw1.shape)), g2 = p.value(tensor(DType::F32, tw2.shape));
  const uint64_t hh = p.value(th), a = p.value(ta);
  p.add(fwd, ins(Opcode::GROUPED_MATMUL, {tx, tw1, tc}, {th}), {x, w1, counts}, {hh});
  p.add(fwd, ins(Opcode::SWIGLU, {th}, {ta}), {hh}, {a});
  p.add(fwd, ins(Opcode::GROUPED_MATMUL, {ta, tw2, tc}, {tx}), {a, w2, counts}, {y});
  const uint64_t da = p.value(ta), dh = p.value(th);
  p.add(bwd, ins(Opcode::GROUPED_MATMUL_WEIGHT_GRAD, {tx, ta, tc}, {}, {}, {}, {param(tw2.shape)}),
        {dy, a, counts}, {}, {g2});
  p.add(bwd, ins(Opcode::GROUPED_MATMUL_INPUT_GRAD, {tx, tw2, tc}, {ta}), {dy, w2, counts}, {da});
  p.add(bwd, ins(Opcode::SWIGLU_GRAD, {ta, th}, {th}), {da, hh}, {dh});
  p.add(bwd, ins(Opcode::GROUPED_MATMUL_WEIGHT_GRAD, {th, tx, tc}, {}, {}, {}, {param(tw1.shape)}),
        {dh, x, counts}, {}, {g1});
  p.add(bwd, ins(Opcode::GROUPED_MATMUL_INPUT_GRAD, {th, tw1, tc}, {tx}), {dh, w1, counts}, {dx});
}

} // namespace

int main(int argc, char **argv) {
  long long tokens = 8192, seq = 4096, hidden = 4096, ffn = 14336, experts = 8, topk = 2,
            repeats = 20;
  double capacityFactor = 0;
  bool emulate = false;
  bool shaped = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        fail(a + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (a == "--tokens") tokens = parseInt(a, value(), 1, 1 << 24), shaped = true;
    else if (a == "--seq-length") seq = parseInt(a, value(), 1, 1 << 24), shaped = true;
    else if (a == "--hidden") hidden = parseInt(a, value(), 8, 65536), shaped = true;
    else if (a == "--ffn") ffn = parseInt(a, value(), 8, 1 << 20), shaped = true;
    else if (a == "--experts") experts = parseInt(a, value(), 1, 1024), shaped = true;
    else if (a == "--topk") topk = parseInt(a, value(), 1, 1024), shaped = true;
    else if (a == "--repeats") repeats = parseInt(a, value(), 1, 100000);
    else if (a == "--capacity-factor") {
      const std::string t = value();
      char *end = nullptr;
      capacityFactor = std::strtod(t.c_str(), &end);
      if (t.empty() || *end || !(capacityFactor >= 0))
        fail("--capacity-factor '" + t + "' is not a number >= 0");
    } else if (a == "--emulate") emulate = true;
    else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else
      fail("unknown argument '" + a + "'\n" + kUsage);
  }
  if (emulate && !shaped) // the host runs every thread: tiny shapes
    tokens = 64, seq = 32, hidden = 64, ffn = 48, experts = 4, topk = 2, repeats = 1;
  if (topk > experts)
    fail("--topk " + std::to_string(topk) + " is more than --experts " + std::to_string(experts));
  if (tokens % seq != 0)
    fail("--tokens " + std::to_string(tokens) + " is not a multiple of --seq-length " +
         std::to_string(seq));
  std::string why;
  mt::test::KernelDevice *device =
      emulate ? &mt::test::emulatedKernelDevice() : mt::test::gpuKernelDevice(&why);
  if (!device)
    fail("no GPU: " + why + " (--emulate runs the kernels on the host)");

  const DType b = DType::BF16;
  const int64_t T = tokens, H = hidden, F = ffn, E = experts, K = topk;
  // Megatron's get_capacity: ceil(T k / E x factor); rows min(T k, E C).
  const int64_t C = capacityFactor > 0 ? int64_t(std::ceil(double(T * K) / double(E) * capacityFactor)) : 0;
  const int64_t N = C > 0 && C < T ? std::min(T * K, E * C) : T * K;
  Program p(*device);
  std::vector<Launch> moeFwd, moeBwd, denseFwd, denseBwd;

  const OpTensor tx = tensor(b, {T, H}), tl = tensor(b, {T, E}), tp = tensor(DType::F32, {T, E}),
                 tm = tensor(DType::I32, {T, E}), ts = tensor(DType::F32, {}),
                 twr = tensor(b, {1, E, H}), tone = tensor(DType::I32, {1}),
                 txp = tensor(b, {N, H}), trows = tensor(DType::I32, {N}),
                 tcounts = tensor(DType::I32, {E});
  const std::vector<int> all = {int(T)};
  const uint64_t x = p.value(tx, 1.0f), dout = p.value(tx, 1.0f), one = p.value(tone, 0, &all);
  // The router: logits through a one-group GEMM, then the fused router.
  const uint64_t wr = p.value(twr, 0.02f), gwr = p.value(tensor(DType::F32, twr.shape));
  const uint64_t logits = p.value(tl), probs = p.value(tp), map = p.value(tm);
  const uint64_t aux = p.value(ts), z = p.value(ts);
  const float scaleValue = 1.0f;
  const std::vector<int> scaleBits = {[&] {
    int v;
    std::memcpy(&v, &scaleValue, 4);
    return v;
  }()};
  const uint64_t scale = p.value(ts, 0, &scaleBits);
  const std::vector<int64_t> routerInts = {K, 0, 0, 1, C, 0, 0, seq, 0};
  const std::vector<double> routerFloats = {0.0, 0.01, 0.0};
  p.add(moeFwd, ins(Opcode::GROUPED_MATMUL, {tx, twr, tone}, {tl}), {x, wr, one}, {logits});
  p.add(moeFwd, ins(Opcode::MOE_ROUTER, {tl}, {tp, tm, ts, ts}, routerInts, routerFloats), {logits},
        {probs, map, aux, z});
  const uint64_t xp = p.value(txp), rows = p.value(trows), counts = p.value(tcounts);
  p.add(moeFwd, ins(Opcode::MOE_PERMUTE, {tx, tm}, {txp, trows, tcounts}, {C, 0}), {x, map},
        {xp, rows, counts});
  // The experts: their output's gradient comes from the unpermute's.
  const uint64_t yp = p.value(txp), dyp = p.value(txp), dxp = p.value(txp), dprobs = p.value(tp);
  p.add(moeBwd, ins(Opcode::MOE_UNPERMUTE_GRAD, {tx, txp, tp, trows, tcounts}, {txp, tp}),
        {dout, yp, probs, rows, counts}, {dyp, dprobs});
  mlp(p, moeFwd, moeBwd, N, H, F, E, xp, counts, yp, dyp, dxp);
  const uint64_t out = p.value(tx);
  p.add(moeFwd, ins(Opcode::MOE_UNPERMUTE, {txp, tp, trows, tcounts}, {tx}), {yp, probs, rows, counts},
        {out});
  const uint64_t dx = p.value(tx), dlogits = p.value(tl), dxr = p.value(tx);
  p.add(moeBwd, ins(Opcode::MOE_PERMUTE_GRAD, {txp, trows}, {tx}), {dxp, rows}, {dx});
  p.add(moeBwd, ins(Opcode::MOE_ROUTER_GRAD, {tp, tl, tp, tm, ts}, {tl}, routerInts, routerFloats),
        {dprobs, logits, probs, map, scale}, {dlogits});
  p.add(moeBwd, ins(Opcode::GROUPED_MATMUL_INPUT_GRAD, {tl, twr, tone}, {tx}), {dlogits, wr, one},
        {dxr});
  p.add(moeBwd, ins(Opcode::GROUPED_MATMUL_WEIGHT_GRAD, {tl, tx, tone}, {}, {}, {}, {param(twr.shape)}),
        {dlogits, x, one}, {}, {gwr});
  // The dense MLP of the same active FLOPs: FFN width k F, one group.
  const uint64_t yd = p.value(tx), dxd = p.value(tx);
  mlp(p, denseFwd, denseBwd, T, H, K * F, 1, x, one, yd, dout, dxd);
  p.finish();

  double ms[4] = {0, 0, 0, 0};
  const std::vector<Launch> *seqs[4] = {&moeFwd, &moeBwd, &denseFwd, &denseBwd};
  const char *names[4] = {"MoE forward", "MoE backward", "dense forward", "dense backward"};
  for (int i = 0; i < 4; ++i)
    if (std::string e = device->time(*seqs[i], int(repeats), &ms[i]); !e.empty())
      fail(std::string(names[i]) + ": " + e);
  // The routing the timed runs had (its balance decides the tile waste).
  std::vector<int> perExpert(static_cast<size_t>(E));
  if (std::string e = device->to_host(perExpert.data(), counts, size_t(E) * 4); !e.empty())
    fail(e);
  long long routed = 0, most = 0;
  for (int c : perExpert)
    routed += c, most = std::max<long long>(most, c);

  const double gemm = 6.0 * double(T) * double(K) * double(H) * double(F);
  const double moeFlops = gemm * double(routed) / double(T * K) + 2.0 * double(T * H * E);
  const double denseFlops = gemm;
  const double moeMs = ms[0] + ms[1], denseMs = ms[2] + ms[3];
  std::printf("{\"tokens\": %lld, \"hidden\": %lld, \"ffn\": %lld, \"experts\": %lld, \"topk\": %lld, "
              "\"capacity\": %lld, \"rows\": %lld, \"routed\": %lld, \"most_per_expert\": %lld, "
              "\"mean_per_expert\": %.1f, \"dtype\": \"bf16\", "
              "\"moe_fwd_ms\": %.4f, \"moe_bwd_ms\": %.4f, \"dense_fwd_ms\": %.4f, \"dense_bwd_ms\": %.4f, "
              "\"moe_tokens_per_s\": %.0f, \"dense_tokens_per_s\": %.0f, \"moe_over_dense_time\": %.3f, "
              "\"moe_tflops\": %.2f, \"dense_tflops\": %.2f, \"device\": \"%s\"}\n",
              tokens, hidden, ffn, experts, topk, (long long)C, (long long)N, routed, most,
              double(routed) / double(E), ms[0], ms[1], ms[2], ms[3], double(T) / (moeMs * 1e-3),
              double(T) / (denseMs * 1e-3), moeMs / denseMs, 3.0 * moeFlops / (moeMs * 1e9),
              3.0 * denseFlops / (denseMs * 1e9), emulate ? "emulation" : "gpu");
  return 0;
}
