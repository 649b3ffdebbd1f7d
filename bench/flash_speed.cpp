// mt-flash-bench: the speed of mt's generated flash attention
// (compiler/cuda/FlashAttentionGen) on GPU 0, forward and backward, one
// JSON object per configuration on stdout. bench/flash_compare.py runs it
// beside PyTorch's FlashAttention-2 on the same GPU.
//
// The shapes are FlashAttention-2's benchmark's: batch * seq = --tokens
// (16384), heads * head dim = --hidden (2048). FLOPs are counted as there:
// forward 4 * batch * heads * seq^2 * head dim, halved when causal;
// backward 2.5 times the forward.
//
// Each backward variant of --backward (default both: kv64, the default
// kernel, and kv128; FlashAttentionGen.h) is timed on the same inputs in the
// same run: "bwd_kv64_ms", "bwd_kv128_ms" and their TFLOP/s, and
// "bwd_ms" / "bwd_tflops" / "bwd_best" for the fastest of them.
//
// --emulate runs the same kernels on the host CUDA emulation (tiny shapes
// only: it checks this program, not the speed).
#include "KernelDevice.h"
#include "compiler/cuda/FlashAttentionGen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using mt::FlashAttentionConfig;
using DType = FlashAttentionConfig::DType;

const char *kUsage =
    "usage: mt-flash-bench [--seq 1024,2048,4096,8192] [--head-dim 64,128] [--dropout 0,0.1]\n"
    "                      [--causal 1|0|both] [--tokens 16384] [--hidden 2048]\n"
    "                      [--backward kv64,kv128] [--repeats 20] [--emulate]\n";

[[noreturn]] void fail(const std::string &message) {
  std::fprintf(stderr, "mt-flash-bench: error: %s\n", message.c_str());
  std::exit(1);
}

long long parseInt(const std::string &flag, const std::string &text, long long lo, long long hi) {
  char *end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || errno || v < lo || v > hi)
    fail(flag + " '" + text + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

double parseRate(const std::string &flag, const std::string &text) {
  char *end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end || !(v >= 0 && v < 1))
    fail(flag + " '" + text + "' is not a dropout rate in [0, 1)");
  return v;
}

std::vector<std::string> split(const std::string &text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string p; std::getline(in, p, ',');)
    parts.push_back(p);
  return parts;
}

// Device memory filled with normal(0, 1) values in 16-bit storage (or
// zeros), and the seed / RNG-offset device scalars.
struct Buffers {
  mt::test::KernelDevice &device;
  std::vector<uint64_t> owned;
  explicit Buffers(mt::test::KernelDevice &d) : device(d) {}
  ~Buffers() {
    for (uint64_t a : owned)
      device.release(a);
  }
  uint64_t take(size_t bytes, const void *data) {
    uint64_t a = 0;
    if (std::string e = device.allocate(bytes, &a); !e.empty())
      fail(e);
    owned.push_back(a);
    if (data)
      if (std::string e = device.to_device(a, data, bytes); !e.empty())
        fail(e);
    return a;
  }
  // bf16 storage of normal(0, 1) values (truncated: any values do for timing).
  uint64_t randomBf16(size_t n, std::mt19937 &rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> bits(n);
    for (uint16_t &b : bits) {
      const float x = normal(rng);
      uint32_t u;
      std::memcpy(&u, &x, 4);
      b = uint16_t(u >> 16);
    }
    return take(n * 2, bits.data());
  }
  uint64_t zeros(size_t bytes) {
    std::vector<uint8_t> z(bytes, 0);
    return take(bytes, z.data());
  }
};

std::vector<uint64_t> withScalars(std::vector<uint64_t> args, const mt::CudaKernel &k, uint64_t seed,
                                  uint64_t offset) {
  for (const std::string &name : k.scalarArgs)
    args.push_back(name == "seed" ? seed : name == "rng_offset" ? offset : name == "tp_rank" ? 0 : k.streams.at(0));
  return args;
}

mt::test::KernelDevice::Launch launchOf(const mt::CudaKernel &k, std::vector<uint64_t> args) {
  mt::test::KernelDevice::Launch l;
  l.source = k.source, l.entry = k.entry, l.sharedBytes = k.sharedBytes, l.args = std::move(args);
  for (int i = 0; i < 3; ++i)
    l.grid[i] = k.grid[i], l.block[i] = k.block[i];
  return l;
}

} // namespace

int main(int argc, char **argv) {
  std::vector<std::string> seqs = {"1024", "2048", "4096", "8192"}, dims = {"64", "128"}, rates = {"0", "0.1"};
  std::string causalArg = "1";
  std::vector<mt::FlashBackward> variants = {mt::FlashBackward::Kv64, mt::FlashBackward::Kv128};
  long long tokens = 16384, hidden = 2048, repeats = 20;
  bool emulate = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        fail(a + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (a == "--seq") seqs = split(value());
    else if (a == "--head-dim") dims = split(value());
    else if (a == "--dropout") rates = split(value());
    else if (a == "--causal") causalArg = value();
    else if (a == "--backward") {
      variants.clear();
      for (const std::string &name : split(value())) {
        const std::optional<mt::FlashBackward> b = mt::parseFlashBackward(name);
        if (!b)
          fail("--backward '" + name + "' is not kv64 or kv128");
        if (std::find(variants.begin(), variants.end(), *b) == variants.end())
          variants.push_back(*b);
      }
      if (variants.empty())
        fail("--backward needs kv64, kv128 or both");
    }
    else if (a == "--tokens") tokens = parseInt(a, value(), 1, 1ll << 30);
    else if (a == "--hidden") hidden = parseInt(a, value(), 64, 65536);
    else if (a == "--repeats") repeats = parseInt(a, value(), 1, 100000);
    else if (a == "--emulate") emulate = true;
    else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else
      fail("unknown argument '" + a + "'\n" + kUsage);
  }
  if (causalArg != "1" && causalArg != "0" && causalArg != "both")
    fail("--causal '" + causalArg + "' must be 1, 0 or both");
  const DType dtype = DType::BF16; // the training precision; PyTorch's flash attention compares in it

  std::string why;
  mt::test::KernelDevice *device = emulate ? &mt::test::emulatedKernelDevice() : mt::test::gpuKernelDevice(&why);
  if (!device)
    fail("no GPU: " + why + " (--emulate runs the kernels on the host)");

  std::vector<bool> causals;
  if (causalArg != "0")
    causals.push_back(true);
  if (causalArg != "1")
    causals.push_back(false);
  std::mt19937 rng(7);
  for (const std::string &seqText : seqs)
    for (const std::string &dimText : dims)
      for (const std::string &rateText : rates)
        for (bool causal : causals) {
          FlashAttentionConfig c;
          c.seq = parseInt("--seq", seqText, 1, 1 << 20);
          c.headDim = parseInt("--head-dim", dimText, 64, 128);
          c.dropoutRate = parseRate("--dropout", rateText);
          if (hidden % c.headDim != 0)
            fail("--hidden " + std::to_string(hidden) + " is not a multiple of head dim " + dimText);
          c.batch = std::max<long long>(1, tokens / c.seq);
          c.heads = c.groups = hidden / c.headDim;
          c.causal = causal, c.scale = 1.0 / std::sqrt(double(c.headDim)), c.dtype = dtype, c.stream = 1;
          std::string error;
          auto fwd = mt::generateFlashAttentionForward(c, &error);
          if (!fwd)
            fail(error);
          std::vector<mt::FlashAttentionBackward> bwds;
          for (mt::FlashBackward variant : variants) {
            FlashAttentionConfig cv = c;
            cv.backward = variant;
            auto bwd = mt::generateFlashAttentionBackward(cv, &error);
            if (!bwd)
              fail(error);
            bwds.push_back(*bwd);
          }
          const mt::FlashAttentionBackward *bwd = &bwds[0]; // the workspace is the same for every variant

          Buffers buf(*device);
          const size_t n = size_t(c.batch * c.seq * c.heads * c.headDim);
          const uint64_t q = buf.randomBf16(n, rng), k = buf.randomBf16(n, rng);
          const uint64_t v = buf.randomBf16(n, rng), dout = buf.randomBf16(n, rng);
          const uint64_t out = buf.zeros(n * 2), lse = buf.zeros(fwd->lseBytes);
          const uint64_t dq = buf.zeros(n * 2), dk = buf.zeros(n * 2), dv = buf.zeros(n * 2);
          const uint64_t dqAccum = buf.zeros(bwd->dqAccumBytes), delta = buf.zeros(bwd->deltaBytes);
          const uint64_t seedValue = 1234, offsetValue = 0;
          const uint64_t seed = buf.take(8, &seedValue), offset = buf.take(8, &offsetValue);

          const std::vector<uint64_t> fwdArgs = {q, k, v, out, lse};
          const std::vector<uint64_t> bwdArgs = {dout, q, k, v, out, lse, dq, dk, dv, dqAccum, delta};
          double fwdMs = 0;
          if (std::string e = device->time({launchOf(fwd->kernel, withScalars(fwdArgs, fwd->kernel, seed, offset))},
                                           int(repeats), &fwdMs);
              !e.empty())
            fail(e);
          // Each variant's three kernels, timed together as a training step
          // runs them.
          std::vector<double> bwdMs(bwds.size());
          for (size_t vi = 0; vi < bwds.size(); ++vi) {
            std::vector<mt::test::KernelDevice::Launch> back;
            for (const mt::CudaKernel *kk : {&bwds[vi].dot, &bwds[vi].main, &bwds[vi].dq})
              back.push_back(launchOf(*kk, withScalars(bwdArgs, *kk, seed, offset)));
            if (std::string e = device->time(back, int(repeats), &bwdMs[vi]); !e.empty())
              fail(std::string(mt::flashBackwardName(variants[vi])) + ": " + e);
          }
          const size_t best = size_t(std::min_element(bwdMs.begin(), bwdMs.end()) - bwdMs.begin());

          const double flops = 4.0 * double(c.batch) * double(c.heads) * double(c.seq) * double(c.seq) *
                               double(c.headDim) / (causal ? 2.0 : 1.0);
          std::string perVariant;
          for (size_t vi = 0; vi < bwds.size(); ++vi) {
            char field[160];
            const char *name = mt::flashBackwardName(variants[vi]);
            std::snprintf(field, sizeof field, "\"bwd_%s_ms\": %.5f, \"bwd_%s_tflops\": %.2f, ", name, bwdMs[vi], name,
                          2.5 * flops / (bwdMs[vi] * 1e9));
            perVariant += field;
          }
          std::printf("{\"seq\": %lld, \"head_dim\": %lld, \"batch\": %lld, \"heads\": %lld, \"causal\": %s, "
                      "\"dropout\": %s, \"dtype\": \"bf16\", \"fwd_ms\": %.5f, \"bwd_ms\": %.5f, "
                      "\"fwd_tflops\": %.2f, \"bwd_tflops\": %.2f, \"bwd_best\": \"%s\", %s\"device\": \"%s\"}\n",
                      (long long)c.seq, (long long)c.headDim, (long long)c.batch, (long long)c.heads,
                      causal ? "true" : "false", rateText.c_str(), fwdMs, bwdMs[best],
                      flops / (fwdMs * 1e9), 2.5 * flops / (bwdMs[best] * 1e9),
                      mt::flashBackwardName(variants[best]), perVariant.c_str(), emulate ? "emulation" : "gpu");
          std::fflush(stdout);
        }
  return 0;
}
