// CPU reference kernels: every backward against central finite differences in
// double precision, forwards against direct formulas written out here, Philox
// against Random123's known answers, rounding against hand-checked values.
#include "runtime/exec/cpu_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace cpu = mt::cpu;

namespace {

// Central differences in double: truncation error ~h^2 f''' ~1e-12 and
// rounding error ~1e-16 |f| / h ~1e-9 for the |f| ~ 10 projections below.
constexpr double kStep = 1e-6;
constexpr double kRelTol = 1e-6;
constexpr double kAbsTol = 1e-8;
constexpr double kTwoPi = 6.283185307179586;

using Vec = std::vector<double>;

Vec randomVec(std::mt19937_64 &rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double &x : v)
    x = dist(rng);
  return v;
}

std::vector<float> toFloat(const Vec &v) { return std::vector<float>(v.begin(), v.end()); }

double dot(const Vec &a, const Vec &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

// Compares analytic[i] with (f(x + h e_i) - f(x - h e_i)) / 2h for every i in
// `indices` (every element when empty). f reads x, which is perturbed in place.
void expectGradient(const std::string &what, Vec &x, const Vec &analytic,
                    const std::function<double()> &f, std::vector<size_t> indices = {}) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  if (indices.empty())
    for (size_t i = 0; i < x.size(); ++i)
      indices.push_back(i);
  int failures = 0;
  for (size_t i : indices) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double plus = f();
    x[i] = saved - kStep;
    const double minus = f();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    const double tol = kRelTol * std::max(std::fabs(analytic[i]), std::fabs(numeric)) + kAbsTol;
    if (std::fabs(analytic[i] - numeric) > tol && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << ", numeric "
                    << numeric;
  }
  EXPECT_EQ(failures, 0) << what;
}

std::vector<size_t> sampleIndices(std::mt19937_64 &rng, size_t size, size_t count) {
  std::uniform_int_distribution<size_t> pick(0, size - 1);
  std::vector<size_t> out(count);
  for (size_t &i : out)
    i = pick(rng);
  return out;
}

uint32_t floatBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float bitsFloat(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// ---------------------------------------------------------------------------
// Random numbers

TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Case {
    uint32_t counter[4];
    uint32_t key[2];
    uint32_t expected[4];
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Case &c : cases) {
    uint32_t out[4];
    cpu::philox4x32_10(c.counter, c.key, out);
    for (int w = 0; w < 4; ++w)
      EXPECT_EQ(out[w], c.expected[w]) << "word " << w;
  }
}

TEST(Rng, UniformTakesTheDocumentedWord) {
  const cpu::RngKey key{0x1234567890abcdefull, 0xfedcba0987654321ull, 0x0000000500000007ull};
  for (uint64_t index : {0ull, 3ull, 6ull, (1ull << 34) + 9}) {
    const uint64_t block = index / 4;
    const uint32_t counter[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                 7u, 5u};
    const uint32_t k[2] = {0x90abcdefu, 0x87654321u};
    uint32_t words[4];
    cpu::philox4x32_10(counter, k, words);
    const float expected = static_cast<float>(words[index % 4] >> 8) / 16777216.0f;
    EXPECT_EQ(cpu::rng_uniform(key, index), expected) << index;
    EXPECT_GE(expected, 0.0f);
    EXPECT_LT(expected, 1.0f);
  }
}

// ---------------------------------------------------------------------------
// Embedding and positions

TEST(Embedding, ForwardGathersRowsAndRejectsBadIds) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};
  const std::vector<int32_t> ids = {2, 0, 2};
  std::vector<float> out(6, -1);
  ASSERT_TRUE(cpu::embedding_fwd(table.data(), 3, 2, ids.data(), 3, out.data()));
  EXPECT_EQ(out, (std::vector<float>{20, 21, 0, 1, 20, 21}));
  const std::vector<int32_t> tooLarge = {1, 3};
  const std::vector<int32_t> negative = {-1};
  EXPECT_FALSE(cpu::embedding_fwd(table.data(), 3, 2, tooLarge.data(), 2, out.data()));
  EXPECT_FALSE(cpu::embedding_fwd(table.data(), 3, 2, negative.data(), 1, out.data()));
}

TEST(Embedding, BackwardAccumulatesRepeatedIds) {
  std::mt19937_64 rng(1);
  const int64_t vocab = 5, h = 3, n = 6;
  const std::vector<int32_t> ids = {1, 4, 1, 0, 1, 4};
  Vec table = randomVec(rng, vocab * h), r = randomVec(rng, n * h);
  Vec out(n * h);
  auto f = [&] {
    EXPECT_TRUE(cpu::embedding_fwd(table.data(), vocab, h, ids.data(), n, out.data()));
    return dot(r, out);
  };
  Vec dtable = randomVec(rng, vocab * h);
  const Vec before = dtable;
  cpu::embedding_bwd(r.data(), ids.data(), n, h, dtable.data());
  Vec grad(vocab * h);
  for (size_t i = 0; i < grad.size(); ++i)
    grad[i] = dtable[i] - before[i];
  expectGradient("dtable", table, grad, f);
  // Row 1 is used three times: its gradient is the sum of three rows of r.
  for (int64_t j = 0; j < h; ++j)
    EXPECT_NEAR(grad[1 * h + j], r[0 * h + j] + r[2 * h + j] + r[4 * h + j], 1e-15);
}

TEST(PositionIds, CountsFromZeroPerSequence) {
  std::vector<int32_t> out(6);
  cpu::position_ids(2, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
}

// ---------------------------------------------------------------------------
// Normalisation

TEST(LayerNorm, ForwardMatchesFormula) {
  std::mt19937_64 rng(2);
  const int64_t n = 7, h = 33;
  const double eps = 1e-5;
  const Vec x = randomVec(rng, n * h, -3, 3), w = randomVec(rng, h), b = randomVec(rng, h);
  const std::vector<float> xf = toFloat(x), wf = toFloat(w), bf = toFloat(b);
  std::vector<float> y(n * h);
  cpu::layer_norm_fwd(xf.data(), wf.data(), bf.data(), n, h, eps, y.data());
  for (int64_t i = 0; i < n; ++i) {
    double mean = 0, sq = 0;
    for (int64_t j = 0; j < h; ++j)
      mean += xf[i * h + j];
    mean /= h;
    for (int64_t j = 0; j < h; ++j)
      sq += (xf[i * h + j] - mean) * (xf[i * h + j] - mean);
    const double sd = std::sqrt(sq / h + eps);
    for (int64_t j = 0; j < h; ++j)
      EXPECT_NEAR(y[i * h + j], (xf[i * h + j] - mean) / sd * wf[j] + bf[j], 1e-5);
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(3);
  const int64_t n = 4, h = 9;
  const double eps = 1e-5;
  Vec x = randomVec(rng, n * h, -2, 2), w = randomVec(rng, h), b = randomVec(rng, h);
  const Vec r = randomVec(rng, n * h);
  Vec y(n * h);
  auto f = [&] {
    cpu::layer_norm_fwd(x.data(), w.data(), b.data(), n, h, eps, y.data());
    return dot(r, y);
  };
  Vec dx(n * h, 123.0), dw = randomVec(rng, h), db = randomVec(rng, h);
  const Vec dw0 = dw, db0 = db;
  cpu::layer_norm_bwd(r.data(), x.data(), w.data(), n, h, eps, dx.data(), dw.data(), db.data());
  Vec gw(h), gb(h);
  for (int64_t j = 0; j < h; ++j) {
    gw[j] = dw[j] - dw0[j];
    gb[j] = db[j] - db0[j];
  }
  expectGradient("layer_norm dx", x, dx, f);
  expectGradient("layer_norm dw", w, gw, f);
  expectGradient("layer_norm db", b, gb, f);
}

TEST(RmsNorm, ForwardMatchesFormulaAndGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(4);
  const int64_t n = 5, h = 8;
  const double eps = 1e-6;
  Vec x = randomVec(rng, n * h, -2, 2), w = randomVec(rng, h);
  const Vec r = randomVec(rng, n * h);
  Vec y(n * h);
  cpu::rms_norm_fwd(x.data(), w.data(), n, h, eps, y.data());
  for (int64_t i = 0; i < n; ++i) {
    double ms = 0;
    for (int64_t j = 0; j < h; ++j)
      ms += x[i * h + j] * x[i * h + j] / h;
    for (int64_t j = 0; j < h; ++j)
      EXPECT_NEAR(y[i * h + j], x[i * h + j] / std::sqrt(ms + eps) * w[j], 1e-14);
  }
  auto f = [&] {
    cpu::rms_norm_fwd(x.data(), w.data(), n, h, eps, y.data());
    return dot(r, y);
  };
  Vec dx(n * h), dw = randomVec(rng, h);
  const Vec dw0 = dw;
  cpu::rms_norm_bwd(r.data(), x.data(), w.data(), n, h, eps, dx.data(), dw.data());
  Vec gw(h);
  for (int64_t j = 0; j < h; ++j)
    gw[j] = dw[j] - dw0[j];
  expectGradient("rms_norm dx", x, dx, f);
  expectGradient("rms_norm dw", w, gw, f);
}

// --apply-layernorm-1p: the stored weight w is applied as 1 + w. The forward
// equals the plain norm with weights 1 + w (computed here independently), and
// the gradients, of the stored w included, match finite differences.
TEST(LayerNorm1p, ForwardIsPlainNormOfOnePlusWAndGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(31);
  const int64_t n = 4, h = 9;
  const double eps = 1e-5;
  Vec x = randomVec(rng, n * h, -2, 2), w = randomVec(rng, h, -0.3, 0.3), b = randomVec(rng, h);
  const Vec r = randomVec(rng, n * h);
  Vec y(n * h), want(n * h), w1(h);
  for (int64_t j = 0; j < h; ++j)
    w1[j] = 1.0 + w[j];
  cpu::layer_norm_fwd(x.data(), w.data(), b.data(), n, h, eps, y.data(), 1.0);
  cpu::layer_norm_fwd(x.data(), w1.data(), b.data(), n, h, eps, want.data());
  for (int64_t i = 0; i < n * h; ++i)
    EXPECT_NEAR(y[i], want[i], 1e-14);
  auto f = [&] {
    cpu::layer_norm_fwd(x.data(), w.data(), b.data(), n, h, eps, y.data(), 1.0);
    return dot(r, y);
  };
  Vec dx(n * h), dw(h, 0.0), db(h, 0.0);
  cpu::layer_norm_bwd(r.data(), x.data(), w.data(), n, h, eps, dx.data(), dw.data(), db.data(),
                      1.0);
  expectGradient("layer_norm 1p dx", x, dx, f);
  expectGradient("layer_norm 1p dw", w, dw, f);
  expectGradient("layer_norm 1p db", b, db, f);
}

TEST(RmsNorm1p, ForwardIsPlainNormOfOnePlusWAndGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(32);
  const int64_t n = 5, h = 8;
  const double eps = 1e-6;
  Vec x = randomVec(rng, n * h, -2, 2), w = randomVec(rng, h, -0.3, 0.3);
  const Vec r = randomVec(rng, n * h);
  Vec y(n * h);
  cpu::rms_norm_fwd(x.data(), w.data(), n, h, eps, y.data(), 1.0);
  for (int64_t i = 0; i < n; ++i) {
    double ms = 0;
    for (int64_t j = 0; j < h; ++j)
      ms += x[i * h + j] * x[i * h + j] / h;
    for (int64_t j = 0; j < h; ++j)
      EXPECT_NEAR(y[i * h + j], x[i * h + j] / std::sqrt(ms + eps) * (1.0 + w[j]), 1e-14);
  }
  auto f = [&] {
    cpu::rms_norm_fwd(x.data(), w.data(), n, h, eps, y.data(), 1.0);
    return dot(r, y);
  };
  Vec dx(n * h), dw(h, 0.0);
  cpu::rms_norm_bwd(r.data(), x.data(), w.data(), n, h, eps, dx.data(), dw.data(), 1.0);
  expectGradient("rms_norm 1p dx", x, dx, f);
  expectGradient("rms_norm 1p dw", w, dw, f);
}

// ---------------------------------------------------------------------------
// Linear layers

TEST(Matmul, ForwardMatchesNaiveProduct) {
  std::mt19937_64 rng(5);
  const int64_t n = 13, in = 17, out = 11;
  const std::vector<float> x = toFloat(randomVec(rng, n * in));
  const std::vector<float> w = toFloat(randomVec(rng, out * in));
  std::vector<float> y(n * out);
  cpu::matmul_fwd(x.data(), w.data(), n, in, out, y.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t c = 0; c < in; ++c)
        s += static_cast<double>(x[i * in + c]) * w[o * in + c];
      EXPECT_NEAR(y[i * out + o], s, 1e-5);
    }
}

TEST(Matmul, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(6);
  const int64_t n = 4, in = 5, out = 3;
  Vec x = randomVec(rng, n * in), w = randomVec(rng, out * in);
  const Vec r = randomVec(rng, n * out);
  Vec y(n * out);
  auto f = [&] {
    cpu::matmul_fwd(x.data(), w.data(), n, in, out, y.data());
    return dot(r, y);
  };
  // Overwrite: whatever dx held is ignored (NaN included).
  Vec dx(n * in, std::numeric_limits<double>::quiet_NaN());
  cpu::matmul_bwd_input(r.data(), w.data(), n, in, out, dx.data(), false);
  expectGradient("matmul dx", x, dx, f);
  // Accumulate: adds onto what dx held.
  Vec acc = randomVec(rng, n * in);
  const Vec acc0 = acc;
  cpu::matmul_bwd_input(r.data(), w.data(), n, in, out, acc.data(), true);
  for (size_t i = 0; i < acc.size(); ++i)
    EXPECT_NEAR(acc[i], acc0[i] + dx[i], 1e-14);
  Vec dw = randomVec(rng, out * in);
  const Vec dw0 = dw;
  cpu::matmul_bwd_weight(r.data(), x.data(), n, in, out, dw.data());
  Vec gw(out * in);
  for (size_t i = 0; i < gw.size(); ++i)
    gw[i] = dw[i] - dw0[i];
  expectGradient("matmul dw", w, gw, f);
}

TEST(Bias, AddAndGradientMatchFiniteDifferences) {
  std::mt19937_64 rng(7);
  const int64_t n = 4, h = 6;
  Vec x = randomVec(rng, n * h), b = randomVec(rng, h);
  const Vec r = randomVec(rng, n * h);
  Vec y(n * h);
  cpu::bias_add_fwd(x.data(), b.data(), n, h, y.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h; ++j)
      EXPECT_EQ(y[i * h + j], x[i * h + j] + b[j]);
  auto f = [&] {
    cpu::bias_add_fwd(x.data(), b.data(), n, h, y.data());
    return dot(r, y);
  };
  Vec db = randomVec(rng, h);
  const Vec db0 = db;
  cpu::bias_grad(r.data(), n, h, db.data());
  Vec gb(h);
  for (int64_t j = 0; j < h; ++j)
    gb[j] = db[j] - db0[j];
  expectGradient("bias db", b, gb, f);
  expectGradient("bias dx", x, r, f); // dy/dx is the identity
}

TEST(Elementwise, AddAccumulateScale) {
  const std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  std::vector<float> y(3);
  cpu::add(a.data(), b.data(), 3, y.data());
  EXPECT_EQ(y, (std::vector<float>{11, 22, 33}));
  cpu::accumulate(a.data(), 3, y.data());
  EXPECT_EQ(y, (std::vector<float>{12, 24, 36}));
  cpu::scale(y.data(), 3, 0.5);
  EXPECT_EQ(y, (std::vector<float>{6, 12, 18}));
}

// ---------------------------------------------------------------------------
// Activations

TEST(Gelu, ForwardMatchesReferenceValues) {
  // 0.5 x (1 + erf(x / sqrt 2)) and Megatron's tanh form, evaluated offline.
  const Vec x = {1.0, -0.5, 3.0};
  const Vec erfForm = {0.8413447460685429, -0.15426876936299344, 2.99595030590511};
  const Vec tanhForm = {0.8411919906082768, -0.15428599017485606, 2.996362607918227};
  Vec y(3);
  cpu::gelu_fwd(x.data(), 3, false, y.data());
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(y[i], erfForm[i], 1e-15);
  cpu::gelu_fwd(x.data(), 3, true, y.data());
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(y[i], tanhForm[i], 1e-15);
}

TEST(Gelu, GradientsMatchFiniteDifferences) {
  for (bool tanhApprox : {false, true}) {
    std::mt19937_64 rng(8);
    const int64_t count = 40;
    Vec x = randomVec(rng, count, -4, 4);
    const Vec r = randomVec(rng, count);
    Vec y(count), dx(count);
    auto f = [&] {
      cpu::gelu_fwd(x.data(), count, tanhApprox, y.data());
      return dot(r, y);
    };
    cpu::gelu_bwd(r.data(), x.data(), count, tanhApprox, dx.data());
    expectGradient(tanhApprox ? "gelu tanh dx" : "gelu erf dx", x, dx, f);
  }
}

TEST(SwiGlu, ForwardMatchesFormulaAndGradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(9);
  const int64_t n = 3, ff = 5;
  Vec x = randomVec(rng, n * 2 * ff, -3, 3);
  const Vec r = randomVec(rng, n * ff);
  Vec y(n * ff);
  cpu::swiglu_fwd(x.data(), n, ff, y.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < ff; ++j) {
      const double a = x[i * 2 * ff + j], b = x[i * 2 * ff + ff + j];
      EXPECT_NEAR(y[i * ff + j], a / (1 + std::exp(-a)) * b, 1e-15);
    }
  auto f = [&] {
    cpu::swiglu_fwd(x.data(), n, ff, y.data());
    return dot(r, y);
  };
  Vec dx(n * 2 * ff);
  cpu::swiglu_bwd(r.data(), x.data(), n, ff, dx.data());
  expectGradient("swiglu dx", x, dx, f);
}

// ---------------------------------------------------------------------------
// Dropout

TEST(Dropout, RateZeroCopies) {
  const Vec x = {1, -2, 3, 4, 5};
  Vec y(5), dx(5);
  cpu::dropout_fwd(x.data(), 5, 0.0, cpu::RngKey{1, 2, 3}, y.data());
  EXPECT_EQ(y, x);
  cpu::dropout_bwd(x.data(), 5, 0.0, cpu::RngKey{1, 2, 3}, dx.data());
  EXPECT_EQ(dx, x);
}

TEST(Dropout, MaskFollowsRngAndBackwardUsesIt) {
  std::mt19937_64 rng(10);
  const int64_t count = 37;
  const double rate = 0.3;
  const cpu::RngKey key{42, 7, 1001};
  Vec x = randomVec(rng, count);
  const Vec r = randomVec(rng, count);
  Vec y(count);
  cpu::dropout_fwd(x.data(), count, rate, key, y.data());
  for (int64_t i = 0; i < count; ++i) {
    const bool keep = cpu::rng_uniform(key, i) >= rate;
    EXPECT_DOUBLE_EQ(y[i], keep ? x[i] / (1 - rate) : 0.0) << i;
  }
  auto f = [&] {
    cpu::dropout_fwd(x.data(), count, rate, key, y.data());
    return dot(r, y);
  };
  Vec dx(count);
  cpu::dropout_bwd(r.data(), count, rate, key, dx.data());
  expectGradient("dropout dx", x, dx, f);
}

TEST(Dropout, MaskIsReproducibleAndSeparatedByStreamAndOffset) {
  const int64_t count = 100000;
  const double rate = 0.3;
  const std::vector<float> ones(count, 1.0f);
  auto mask = [&](const cpu::RngKey &key) {
    std::vector<float> y(count);
    cpu::dropout_fwd(ones.data(), count, rate, key, y.data());
    return y;
  };
  const std::vector<float> a = mask({5, 1, 0});
  EXPECT_EQ(a, mask({5, 1, 0}));
  EXPECT_NE(a, mask({5, 2, 0}));
  EXPECT_NE(a, mask({5, 1, 1}));
  EXPECT_NE(a, mask({6, 1, 0}));
  int64_t kept = 0;
  for (float v : a) {
    if (v != 0) {
      ++kept;
      EXPECT_FLOAT_EQ(v, static_cast<float>(1 / (1 - rate)));
    }
  }
  // Binomial standard deviation of the fraction: sqrt(0.21 / 1e5) ~ 0.0015.
  EXPECT_NEAR(static_cast<double>(kept) / count, 1 - rate, 0.01);
}

TEST(Dropout, RateOneDropsEverything) {
  const std::vector<float> x(9, 2.0f);
  std::vector<float> y(9, 5.0f);
  cpu::dropout_fwd(x.data(), 9, 1.0, cpu::RngKey{1, 1, 1}, y.data());
  EXPECT_EQ(y, std::vector<float>(9, 0.0f));
}

// ---------------------------------------------------------------------------
// QKV split and rotary embedding

TEST(SplitQkv, LayoutIsPerQueryGroup) {
  // heads 4, groups 2, d 2: each group is [q q k v], two elements each.
  const int64_t n = 2, heads = 4, groups = 2, d = 2, width = 16;
  std::vector<float> qkv(n * width);
  for (size_t i = 0; i < qkv.size(); ++i)
    qkv[i] = static_cast<float>(i);
  std::vector<float> q(n * heads * d), k(n * groups * d), v(n * groups * d);
  cpu::split_qkv_fwd(qkv.data(), n, heads, groups, d, q.data(), k.data(), v.data());
  // Row 0: group 0 = [0 1 | 2 3 | 4 5 | 6 7], group 1 = [8 9 | 10 11 | 12 13 | 14 15].
  EXPECT_EQ(std::vector<float>(q.begin(), q.begin() + 8),
            (std::vector<float>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(std::vector<float>(k.begin(), k.begin() + 4), (std::vector<float>{4, 5, 12, 13}));
  EXPECT_EQ(std::vector<float>(v.begin(), v.begin() + 4), (std::vector<float>{6, 7, 14, 15}));
  EXPECT_EQ(q[8], 16.0f);
  EXPECT_EQ(k[4], 20.0f);
  EXPECT_EQ(v[7], 31.0f);
  std::vector<float> back(n * width, -1);
  cpu::split_qkv_bwd(q.data(), k.data(), v.data(), n, heads, groups, d, back.data());
  EXPECT_EQ(back, qkv);
}

TEST(SplitQkv, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(11);
  const int64_t n = 3, heads = 4, groups = 2, d = 3;
  const int64_t width = groups * (heads / groups + 2) * d;
  Vec qkv = randomVec(rng, n * width);
  const Vec rq = randomVec(rng, n * heads * d), rk = randomVec(rng, n * groups * d),
            rv = randomVec(rng, n * groups * d);
  Vec q(rq.size()), k(rk.size()), v(rv.size());
  auto f = [&] {
    cpu::split_qkv_fwd(qkv.data(), n, heads, groups, d, q.data(), k.data(), v.data());
    return dot(rq, q) + dot(rk, k) + dot(rv, v);
  };
  Vec dqkv(qkv.size(), 99.0);
  cpu::split_qkv_bwd(rq.data(), rk.data(), rv.data(), n, heads, groups, d, dqkv.data());
  expectGradient("split_qkv dqkv", qkv, dqkv, f);
}

TEST(Rope, ForwardMatchesDirectFormula) {
  // One sequence of 3 positions, 1 head, d 4, base 100: pair j rotates by
  // p * 100^(-j/2), i.e. angles p and p / 10.
  const int64_t seq = 3, d = 4;
  const Vec x = {1, 2, 3, 4, 5, 6, 7, 8, -1, 0.5, 2, -3};
  Vec y(x.size());
  cpu::rope_fwd(x.data(), 1, seq, 1, d, 100.0, y.data());
  for (int64_t p = 0; p < seq; ++p) {
    const double *xp = x.data() + p * d;
    const double *yp = y.data() + p * d;
    const double a0 = p, a1 = p / 10.0;
    EXPECT_NEAR(yp[0], xp[0] * std::cos(a0) - xp[2] * std::sin(a0), 1e-14);
    EXPECT_NEAR(yp[2], xp[2] * std::cos(a0) + xp[0] * std::sin(a0), 1e-14);
    EXPECT_NEAR(yp[1], xp[1] * std::cos(a1) - xp[3] * std::sin(a1), 1e-14);
    EXPECT_NEAR(yp[3], xp[3] * std::cos(a1) + xp[1] * std::sin(a1), 1e-14);
  }
  // Position 0 does not rotate.
  for (int j = 0; j < d; ++j)
    EXPECT_EQ(y[j], x[j]);
}

TEST(Rope, BackwardInvertsForwardAndMatchesFiniteDifferences) {
  std::mt19937_64 rng(12);
  const int64_t batch = 2, seq = 5, heads = 3, d = 6;
  const double base = 10000.0;
  Vec x = randomVec(rng, batch * seq * heads * d);
  const Vec r = randomVec(rng, x.size());
  Vec y(x.size()), back(x.size());
  cpu::rope_fwd(x.data(), batch, seq, heads, d, base, y.data());
  cpu::rope_bwd(y.data(), batch, seq, heads, d, base, back.data());
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(back[i], x[i], 1e-14);
  auto f = [&] {
    cpu::rope_fwd(x.data(), batch, seq, heads, d, base, y.data());
    return dot(r, y);
  };
  Vec dx(x.size());
  cpu::rope_bwd(r.data(), batch, seq, heads, d, base, dx.data());
  expectGradient("rope dx", x, dx, f);
}

// Llama 3.1's RoPE scaling: every frequency against the reference that
// test/unit/Inputs/llama31_rope_freqs.py computes in Python from the
// published rule (head dims 128, 64 and 8; bases 500000 and 10000; factors 8
// and 32), and without scaling the plain base^(-2j/d).
TEST(RopeScaling, FrequenciesMatchPythonLlama31Reference) {
  std::ifstream in(MT_SOURCE_DIR "/test/unit/Inputs/llama31_rope_freqs.txt");
  ASSERT_TRUE(in.good()) << "missing test/unit/Inputs/llama31_rope_freqs.txt";
  std::string line;
  int lines = 0, scaled = 0, kept = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    int64_t d = 0, j = 0;
    double base = 0, factor = 0, want = 0;
    ls >> d >> base >> factor >> j >> want;
    ASSERT_FALSE(ls.fail()) << line;
    const double got = cpu::rope_inv_freq(j, d, base, factor);
    EXPECT_NEAR(got, want, 1e-13 * want) << line;
    const double plain = cpu::rope_inv_freq(j, d, base, 0.0);
    EXPECT_NEAR(plain, std::pow(base, -2.0 * double(j) / double(d)), 1e-15);
    scaled += got < plain * (1 - 1e-12);
    kept += got == plain;
    ++lines;
  }
  EXPECT_EQ(lines, 64 + 32 + 4);
  // Each band of the rule is exercised: kept, divided and interpolated.
  EXPECT_GT(scaled, 10);
  EXPECT_GT(kept, 10);
}

// ROPE with scaling rotates pair j by p * rope_inv_freq(j) (scaled), and
// its backward is the inverse rotation; the fused split agrees bit for bit.
TEST(RopeScaling, RotationUsesScaledFrequenciesAndBackwardInverts) {
  std::mt19937_64 rng(33);
  const int64_t batch = 1, seq = 40, heads = 2, d = 8;
  const double base = 10000.0, factor = 8.0;
  Vec x = randomVec(rng, batch * seq * heads * d);
  Vec y(x.size()), back(x.size());
  cpu::rope_fwd(x.data(), batch, seq, heads, d, base, y.data(), factor);
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < d / 2; ++j) {
        const double a = double(p) * cpu::rope_inv_freq(j, d, base, factor);
        const int64_t at = (p * heads + h) * d;
        EXPECT_NEAR(y[at + j], x[at + j] * std::cos(a) - x[at + j + d / 2] * std::sin(a), 1e-14);
        EXPECT_NEAR(y[at + j + d / 2], x[at + j + d / 2] * std::cos(a) + x[at + j] * std::sin(a),
                    1e-14);
      }
  // Pair 3 (wavelength 6283 positions) is interpolated, so the rotation differs.
  Vec plain(x.size());
  cpu::rope_fwd(x.data(), batch, seq, heads, d, base, plain.data());
  EXPECT_GT(std::abs(plain[(39 * heads) * d + 3] - y[(39 * heads) * d + 3]), 1e-3);
  cpu::rope_bwd(y.data(), batch, seq, heads, d, base, back.data(), factor);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(back[i], x[i], 1e-14);

  // The split that rotates, against ROPE on the split's q and k.
  const int64_t groups = 1, hq = 2, width = groups * (hq / groups + 2) * d;
  std::vector<float> qkv(size_t(seq * width));
  for (float &v : qkv)
    v = float(randomVec(rng, 1)[0]);
  std::vector<float> q(size_t(seq * hq * d)), k(size_t(seq * d)), v(size_t(seq * d));
  std::vector<float> q2(q.size()), k2(k.size()), v2(v.size()), qr(q.size()), kr(k.size());
  cpu::split_qkv_rope_fwd(qkv.data(), 1, seq, hq, groups, d, base, q.data(), k.data(), v.data(),
                          factor);
  cpu::split_qkv_fwd(qkv.data(), seq, hq, groups, d, q2.data(), k2.data(), v2.data());
  cpu::rope_fwd(q2.data(), 1, seq, hq, d, base, qr.data(), factor);
  cpu::rope_fwd(k2.data(), 1, seq, groups, d, base, kr.data(), factor);
  EXPECT_EQ(q, qr);
  EXPECT_EQ(k, kr);
  EXPECT_EQ(v, v2);
}

// The fused split computes exactly what SPLIT_QKV then ROPE on q and k
// computes (and its gradient what ROPE_GRAD then SPLIT_QKV_GRAD computes):
// bit for bit, in float as the executor stores values, with GQA (3 query
// heads per group) and a base that makes every pair's angle differ.
TEST(SplitQkvRope, EqualsSplitThenRopeBitForBit) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  const int64_t batch = 2, seq = 7, heads = 6, groups = 2, d = 8;
  const int64_t n = batch * seq, width = groups * (heads / groups + 2) * d;
  const double base = 500000.0;
  std::vector<float> qkv(size_t(n * width));
  for (float &x : qkv)
    x = u(rng);
  std::vector<float> q(size_t(n * heads * d)), k(size_t(n * groups * d)), v(k.size());
  std::vector<float> qr(q.size()), kr(k.size());
  cpu::split_qkv_fwd(qkv.data(), n, heads, groups, d, q.data(), k.data(), v.data());
  cpu::rope_fwd(q.data(), batch, seq, heads, d, base, qr.data());
  cpu::rope_fwd(k.data(), batch, seq, groups, d, base, kr.data());
  std::vector<float> fq(q.size(), -7.0f), fk(k.size(), -7.0f), fv(v.size(), -7.0f);
  cpu::split_qkv_rope_fwd(qkv.data(), batch, seq, heads, groups, d, base, fq.data(), fk.data(),
                          fv.data());
  EXPECT_EQ(fq, qr);
  EXPECT_EQ(fk, kr);
  EXPECT_EQ(fv, v);
  EXPECT_NE(fq, q); // the rotation did happen

  std::vector<float> dq(q.size()), dk(k.size());
  cpu::rope_bwd(qr.data(), batch, seq, heads, d, base, dq.data());
  cpu::rope_bwd(kr.data(), batch, seq, groups, d, base, dk.data());
  std::vector<float> want(qkv.size()), got(qkv.size(), -7.0f);
  cpu::split_qkv_bwd(dq.data(), dk.data(), v.data(), n, heads, groups, d, want.data());
  cpu::split_qkv_rope_bwd(qr.data(), kr.data(), v.data(), batch, seq, heads, groups, d, base,
                          got.data());
  EXPECT_EQ(got, want);
}

// ---------------------------------------------------------------------------
// Attention

// Attention's dropout draw of element `index`, read off Philox as
// cpu_kernels.h documents it: eight elements a block (counter index / 8),
// the 16-bit half index % 2 (low first) of word (index / 2) % 4.
double attentionUniform(const cpu::RngKey &key, uint64_t index) {
  const uint64_t block = index / 8;
  const uint32_t counter[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                               static_cast<uint32_t>(key.offset), static_cast<uint32_t>(key.offset >> 32)};
  const uint32_t k[2] = {static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.stream)};
  uint32_t words[4];
  cpu::philox4x32_10(counter, k, words);
  const uint32_t half = (words[(index / 2) % 4] >> (16 * (index % 2))) & 0xFFFFu;
  return half / 65536.0;
}

// Softmax attention by the definition, one (b, h, i) row at a time; each
// row's log-sum-exp goes to `lse` ([batch, heads, seq]) when given.
template <class T>
Vec naiveAttention(const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                   const cpu::AttentionShape &s, const cpu::RngKey &key, Vec *lse = nullptr) {
  Vec out(s.batch * s.seq * s.heads * s.d, 0.0);
  if (lse)
    lse->assign(s.batch * s.heads * s.seq, 0.0);
  const int64_t perGroup = s.heads / s.groups;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.seq; ++i) {
        const int64_t g = h / perGroup;
        const int64_t valid = s.causal ? i + 1 : s.seq;
        Vec p(valid);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < valid; ++j) {
          double dotQK = 0;
          for (int64_t c = 0; c < s.d; ++c)
            dotQK += static_cast<double>(q[((b * s.seq + i) * s.heads + h) * s.d + c]) *
                     k[((b * s.seq + j) * s.groups + g) * s.d + c];
          p[j] = s.scale * dotQK;
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (double &pj : p) {
          pj = std::exp(pj - m);
          sum += pj;
        }
        if (lse)
          (*lse)[(b * s.heads + h) * s.seq + i] = m + std::log(sum);
        for (int64_t j = 0; j < valid; ++j) {
          p[j] /= sum;
          if (s.dropout_rate > 0) {
            const uint64_t index = ((b * s.heads + h) * s.seq + i) * s.seq + j;
            p[j] = attentionUniform(key, index) >= s.dropout_rate ? p[j] / (1 - s.dropout_rate) : 0.0;
          }
          for (int64_t c = 0; c < s.d; ++c)
            out[((b * s.seq + i) * s.heads + h) * s.d + c] +=
                p[j] * v[((b * s.seq + j) * s.groups + g) * s.d + c];
        }
      }
  return out;
}

struct AttentionCase {
  bool causal;
  double dropout;
};

void PrintTo(const AttentionCase &c, std::ostream *os) {
  *os << (c.causal ? "causal" : "full") << ", dropout " << c.dropout;
}

class AttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionTest, ForwardMatchesNaiveSoftmax) {
  // seq 150 spans two blocks of query rows; GQA with heads 4, groups 2.
  std::mt19937_64 rng(13);
  const cpu::AttentionShape s{2, 150, 4, 2, 8, GetParam().causal, 1 / std::sqrt(8.0),
                              GetParam().dropout};
  const cpu::RngKey key{3, 4, 5};
  const std::vector<float> q = toFloat(randomVec(rng, s.batch * s.seq * s.heads * s.d, -2, 2));
  const std::vector<float> k = toFloat(randomVec(rng, s.batch * s.seq * s.groups * s.d, -2, 2));
  const std::vector<float> v = toFloat(randomVec(rng, s.batch * s.seq * s.groups * s.d));
  std::vector<float> out(q.size()), lse(s.batch * s.heads * s.seq);
  cpu::attention_fwd(q.data(), k.data(), v.data(), s, key, out.data(), lse.data());
  Vec expectedLse;
  const Vec expected = naiveAttention(q, k, v, s, key, &expectedLse);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], expected[i], 2e-5) << i;
  for (size_t i = 0; i < lse.size(); ++i)
    ASSERT_NEAR(lse[i], expectedLse[i], 2e-5) << i;
}

TEST_P(AttentionTest, GradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(14);
  const cpu::AttentionShape s{2, 5, 4, 2, 3, GetParam().causal, 0.7, GetParam().dropout};
  const cpu::RngKey key{11, 12, 13};
  Vec q = randomVec(rng, s.batch * s.seq * s.heads * s.d);
  Vec k = randomVec(rng, s.batch * s.seq * s.groups * s.d);
  Vec v = randomVec(rng, s.batch * s.seq * s.groups * s.d);
  const Vec r = randomVec(rng, q.size());
  Vec out(q.size()), lse(s.batch * s.heads * s.seq);
  auto f = [&] {
    cpu::attention_fwd(q.data(), k.data(), v.data(), s, key, out.data(), lse.data());
    return dot(r, out);
  };
  EXPECT_NEAR(f(), dot(r, naiveAttention(q, k, v, s, key)), 1e-13);
  // The backward reads the unperturbed forward's out and lse.
  Vec dq(q.size()), dk(k.size(), 7.0), dv(v.size(), 7.0);
  cpu::attention_bwd(r.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), s, key,
                     dq.data(), dk.data(), dv.data());
  expectGradient("attention dq", q, dq, f);
  expectGradient("attention dk", k, dk, f);
  expectGradient("attention dv", v, dv, f);
}

TEST_P(AttentionTest, GradientsMatchFiniteDifferencesAcrossRowBlocks) {
  // Sampled coordinates of a sequence longer than one block of query rows.
  std::mt19937_64 rng(15);
  const cpu::AttentionShape s{1, 140, 2, 1, 4, GetParam().causal, 0.5, GetParam().dropout};
  const cpu::RngKey key{21, 22, 23};
  Vec q = randomVec(rng, s.batch * s.seq * s.heads * s.d);
  Vec k = randomVec(rng, s.batch * s.seq * s.groups * s.d);
  Vec v = randomVec(rng, s.batch * s.seq * s.groups * s.d);
  const Vec r = randomVec(rng, q.size());
  Vec out(q.size()), lse(s.batch * s.heads * s.seq);
  auto f = [&] {
    cpu::attention_fwd(q.data(), k.data(), v.data(), s, key, out.data(), lse.data());
    return dot(r, out);
  };
  f();
  Vec dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_bwd(r.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), s, key,
                     dq.data(), dk.data(), dv.data());
  expectGradient("attention dq", q, dq, f, sampleIndices(rng, q.size(), 40));
  expectGradient("attention dk", k, dk, f, sampleIndices(rng, k.size(), 40));
  expectGradient("attention dv", v, dv, f, sampleIndices(rng, v.size(), 40));
}

// The share of attention probabilities dropped is the rate: with q = 0 every
// probability of a row is 1 / seq and with v = I (seq == d) out[i][j] shows
// whether (i, j) was kept. 262,144 draws at 0.1 and 0.3 (standard deviations
// 5.9e-4 and 9.0e-4): the share is within 3e-3 of the rate, and each kept
// element is scaled by 1 / (1 - rate).
TEST(AttentionDropout, DropsTheRateOfProbabilities) {
  for (double rate : {0.1, 0.3}) {
    const int64_t seq = 64;
    const cpu::AttentionShape s{4, seq, 16, 16, seq, false, 1.0, rate};
    const size_t n = size_t(s.batch * s.seq * s.heads * s.d);
    std::vector<double> q(n, 0.0), k(n, 0.5), v(n, 0.0), out(n), lse(size_t(s.batch * s.heads * s.seq));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t j = 0; j < seq; ++j)
        for (int64_t h = 0; h < s.heads; ++h)
          v[size_t(((b * seq + j) * s.heads + h) * s.d + j)] = 1.0;
    cpu::attention_fwd(q.data(), k.data(), v.data(), s, cpu::RngKey{77, 3, 9}, out.data(), lse.data());
    size_t dropped = 0;
    for (double o : out) {
      if (o == 0)
        ++dropped;
      else
        ASSERT_NEAR(o, 1.0 / seq / (1 - rate), 1e-15);
    }
    EXPECT_NEAR(double(dropped) / double(n), rate, 3e-3) << "rate " << rate;
  }
}

INSTANTIATE_TEST_SUITE_P(CausalAndDropout, AttentionTest,
                         ::testing::Values(AttentionCase{false, 0.0}, AttentionCase{true, 0.0},
                                           AttentionCase{false, 0.2}, AttentionCase{true, 0.2}),
                         [](const ::testing::TestParamInfo<AttentionCase> &info) {
                           return std::string(info.param.causal ? "Causal" : "Full") +
                                  (info.param.dropout > 0 ? "Dropout" : "NoDropout");
                         });

// ---------------------------------------------------------------------------
// Cross-entropy

// Mean masked loss by the definition, with the row max taken out of exp.
template <class T>
double naiveCrossEntropy(const std::vector<T> &logits, const std::vector<int32_t> &labels,
                         const std::vector<float> &mask, int64_t n, int64_t vocab) {
  double total = 0, weights = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = mask.empty() ? 1.0 : mask[i];
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < vocab; ++j)
      m = std::max(m, static_cast<double>(logits[i * vocab + j]));
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j)
      sum += std::exp(static_cast<double>(logits[i * vocab + j]) - m);
    total += w * (m + std::log(sum) - logits[i * vocab + labels[i]]);
    weights += w;
  }
  return total / weights;
}

TEST(CrossEntropy, ForwardMatchesDefinitionOnPaddedVocabulary) {
  // 50304 columns of which the labels use the first 50257, logits spread
  // widely and shifted far from 0 to exercise the max subtraction.
  std::mt19937_64 rng(16);
  const int64_t n = 6, vocab = 50304, used = 50257;
  std::vector<float> logits = toFloat(randomVec(rng, n * vocab, -30, 30));
  for (int64_t j = 0; j < vocab; ++j)
    logits[2 * vocab + j] += 5000.0f;
  logits[3 * vocab + 17] = -1000.0f;
  std::uniform_int_distribution<int32_t> pick(0, used - 1);
  std::vector<int32_t> labels(n);
  for (int32_t &l : labels)
    l = pick(rng);
  labels[4] = used - 1;
  double loss = 0;
  ASSERT_TRUE(cpu::cross_entropy_fwd(logits.data(), labels.data(), nullptr, n, vocab, &loss));
  EXPECT_NEAR(loss, naiveCrossEntropy(logits, labels, {}, n, vocab), 1e-12 * std::fabs(loss));
  const std::vector<float> mask = {1, 0, 1, 1, 0, 1};
  ASSERT_TRUE(
      cpu::cross_entropy_fwd(logits.data(), labels.data(), mask.data(), n, vocab, &loss));
  EXPECT_NEAR(loss, naiveCrossEntropy(logits, labels, mask, n, vocab), 1e-12 * std::fabs(loss));
}

TEST(CrossEntropy, UniformLogitsGiveLogVocab) {
  const int64_t n = 2, vocab = 1000;
  const std::vector<float> logits(n * vocab, 1e4f);
  const std::vector<int32_t> labels = {3, 999};
  double loss = 0;
  ASSERT_TRUE(cpu::cross_entropy_fwd(logits.data(), labels.data(), nullptr, n, vocab, &loss));
  EXPECT_NEAR(loss, std::log(1000.0), 1e-13);
}

TEST(CrossEntropy, RejectsLabelsOutsideVocabulary) {
  const std::vector<double> logits(8, 0.0);
  double loss = 0;
  const std::vector<int32_t> tooLarge = {0, 4};
  const std::vector<int32_t> negative = {-1, 0};
  EXPECT_FALSE(cpu::cross_entropy_fwd(logits.data(), tooLarge.data(), nullptr, 2, 4, &loss));
  EXPECT_FALSE(cpu::cross_entropy_fwd(logits.data(), negative.data(), nullptr, 2, 4, &loss));
}

TEST(CrossEntropy, FullyMaskedBatchHasZeroLossAndGradient) {
  const std::vector<double> logits = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> labels = {0, 2};
  const std::vector<float> mask = {0, 0};
  double loss = -1;
  ASSERT_TRUE(cpu::cross_entropy_fwd(logits.data(), labels.data(), mask.data(), 2, 3, &loss));
  EXPECT_EQ(loss, 0.0);
  Vec d(6, 5.0);
  cpu::cross_entropy_bwd(logits.data(), labels.data(), mask.data(), 2, 3, 1.0, d.data());
  EXPECT_EQ(d, Vec(6, 0.0));
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  // vocab 11 padded from 8: labels stay below 8, the padding columns still
  // take part in the softmax and get gradient.
  for (bool masked : {false, true}) {
    std::mt19937_64 rng(17);
    const int64_t n = 6, vocab = 11;
    Vec logits = randomVec(rng, n * vocab, -3, 3);
    const std::vector<int32_t> labels = {0, 7, 3, 3, 5, 1};
    const std::vector<float> mask = masked ? std::vector<float>{1, 0, 1, 1, 0, 1}
                                           : std::vector<float>{};
    const float *maskPtr = masked ? mask.data() : nullptr;
    const double dloss = 1.7;
    auto f = [&] {
      double loss = 0;
      EXPECT_TRUE(
          cpu::cross_entropy_fwd(logits.data(), labels.data(), maskPtr, n, vocab, &loss));
      return dloss * loss;
    };
    Vec d(n * vocab, 3.0);
    cpu::cross_entropy_bwd(logits.data(), labels.data(), maskPtr, n, vocab, dloss, d.data());
    expectGradient(masked ? "cross_entropy masked" : "cross_entropy", logits, d, f);
    double padding = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 8; j < vocab; ++j)
        padding += std::fabs(d[i * vocab + j]);
    EXPECT_GT(padding, 0.0);
  }
}

TEST(CrossEntropy, FloatGradientMatchesDefinitionOnLargeVocabulary) {
  std::mt19937_64 rng(18);
  const int64_t n = 3, vocab = 50304;
  const std::vector<float> logits = toFloat(randomVec(rng, n * vocab, -10, 10));
  const std::vector<int32_t> labels = {5, 50000, 123};
  std::vector<float> d(n * vocab);
  cpu::cross_entropy_bwd(logits.data(), labels.data(), nullptr, n, vocab, 2.0, d.data());
  for (int64_t i = 0; i < n; ++i) {
    double m = -1e300, sum = 0;
    for (int64_t j = 0; j < vocab; ++j)
      m = std::max(m, static_cast<double>(logits[i * vocab + j]));
    for (int64_t j = 0; j < vocab; ++j)
      sum += std::exp(logits[i * vocab + j] - m);
    for (int64_t j = 0; j < vocab; ++j) {
      double expected = 2.0 / n * (std::exp(logits[i * vocab + j] - m) / sum - (j == labels[i]));
      ASSERT_NEAR(d[i * vocab + j], expected, 1e-6 * std::fabs(expected) + 1e-12) << i << "," << j;
    }
  }
}

// The plan writes the logits' gradient over the logits: in place, the result
// is bit for bit the out-of-place one (with a mask and a masked row too).
TEST(CrossEntropy, InPlaceGradientEqualsOutOfPlace) {
  std::mt19937_64 rng(19);
  const int64_t n = 4, vocab = 1000;
  const std::vector<float> logits = toFloat(randomVec(rng, n * vocab, -8, 8));
  const std::vector<int32_t> labels = {0, 999, 17, 500};
  const std::vector<float> mask = {1.0f, 0.0f, 1.0f, 1.0f};
  for (const float *m : {static_cast<const float *>(nullptr), mask.data()}) {
    std::vector<float> out(n * vocab), inplace = logits;
    cpu::cross_entropy_bwd(logits.data(), labels.data(), m, n, vocab, 0.5, out.data());
    cpu::cross_entropy_bwd(inplace.data(), labels.data(), m, n, vocab, 0.5, inplace.data());
    ASSERT_EQ(0, std::memcmp(out.data(), inplace.data(), out.size() * sizeof(float)));
  }
}

// ---------------------------------------------------------------------------
// Optimizer and reductions

TEST(AdamW, TwoStepsMatchHandComputation) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, p = 1.
  // Step 1, g = 0.5: p = 1 - 0.1 * 0.01 = 0.999; m = 0.05, v = 0.00025;
  //   m^ = 0.5, v^ = 0.25; p = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.899000002.
  // Step 2, g = -0.25: p = 0.899000002 * 0.999 = 0.898101001998;
  //   m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225;
  //   p -= 0.1 * (0.02 / 0.19) / (sqrt(0.00031225 / 0.001999) + 1e-8).
  const double step2 =
      0.898101001998 - 0.1 * (0.02 / 0.19) / (std::sqrt(0.00031225 / 0.001999) + 1e-8);
  cpu::AdamWParams a{0.1, 0.9, 0.999, 1e-8, 0.01, 1};
  double p = 1, m = 0, v = 0, g = 0.5;
  cpu::adamw_step(&p, &g, &m, &v, 1, a);
  EXPECT_NEAR(p, 0.899000002, 1e-15);
  EXPECT_NEAR(m, 0.05, 1e-15);
  EXPECT_NEAR(v, 0.00025, 1e-18);
  g = -0.25;
  a.step = 2;
  cpu::adamw_step(&p, &g, &m, &v, 1, a);
  EXPECT_NEAR(m, 0.02, 1e-15);
  EXPECT_NEAR(v, 0.00031225, 1e-18);
  EXPECT_NEAR(p, step2, 1e-14);
  EXPECT_NEAR(p, 0.8714672987058463, 1e-14);

  float pf = 1, mf = 0, vf = 0, gf = 0.5f;
  a.step = 1;
  cpu::adamw_step(&pf, &gf, &mf, &vf, 1, a);
  gf = -0.25f;
  a.step = 2;
  cpu::adamw_step(&pf, &gf, &mf, &vf, 1, a);
  EXPECT_NEAR(pf, step2, 1e-6);
}

TEST(Reductions, SumSquaresAndAllFinite) {
  const std::vector<float> x = {1, -2, 3, 0.5f, -0.25f};
  EXPECT_DOUBLE_EQ(cpu::sum_squares(x.data(), 5), 1 + 4 + 9 + 0.25 + 0.0625);
  const Vec big(1001, 3.0);
  EXPECT_DOUBLE_EQ(cpu::sum_squares(big.data(), 1001), 9.0 * 1001);
  EXPECT_TRUE(cpu::all_finite(x.data(), 5));
  EXPECT_TRUE(cpu::all_finite(x.data(), 0));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t at : {size_t(0), size_t(4)}) {
      std::vector<float> y = x;
      y[at] = bad;
      EXPECT_FALSE(cpu::all_finite(y.data(), 5)) << bad << " at " << at;
    }
  }
  Vec d(17, 1e308);
  EXPECT_TRUE(cpu::all_finite(d.data(), 17));
  d[16] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(cpu::all_finite(d.data(), 17));
}

// ---------------------------------------------------------------------------
// Reduced precision

TEST(Rounding, Bf16RoundsHalfToEven) {
  // bf16 keeps 7 mantissa bits: around 1 the step is 2^-7.
  const float in[] = {1.0f,
                      1.0f + 0x1p-8f,                 // tie: down to even 1
                      1.0f + 3 * 0x1p-8f,             // tie: up to even 1 + 2^-6
                      1.0f + 0x1p-8f + 0x1p-20f,      // above the tie: 1 + 2^-7
                      -(1.0f + 0x1p-8f + 0x1p-20f),
                      0.1f,                           // 0x3DCCCCCD -> 0x3DCD
                      std::numeric_limits<float>::max(),
                      std::numeric_limits<float>::infinity(),
                      -0.0f};
  const float out[] = {1.0f,
                       1.0f,
                       1.0f + 0x1p-6f,
                       1.0f + 0x1p-7f,
                       -(1.0f + 0x1p-7f),
                       bitsFloat(0x3DCD0000u),
                       std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::infinity(),
                       -0.0f};
  std::vector<float> x(std::begin(in), std::end(in));
  cpu::round_to_bf16(x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(floatBits(x[i]), floatBits(out[i])) << i << ": " << in[i];
  EXPECT_FLOAT_EQ(bitsFloat(0x3DCD0000u), 0.10009765625f);
  // A NaN whose payload sits in the dropped bits stays NaN.
  float nan = bitsFloat(0x7F800001u);
  cpu::round_to_bf16(&nan, 1);
  EXPECT_TRUE(std::isnan(nan));
  EXPECT_EQ(floatBits(nan) & 0xFFFFu, 0u);
}

TEST(Rounding, Fp16RoundsHalfToEvenWithSubnormalsAndOverflow) {
  // fp16 keeps 10 mantissa bits, min normal 2^-14, subnormal step 2^-24, max 65504.
  const float in[] = {1.0f,
                      1.0f + 0x1p-11f,       // tie: down to even 1
                      1.0f + 3 * 0x1p-11f,   // tie: up to even 1 + 2^-9
                      0.1f,                  // 0x2E66 = 0.0999755859375
                      65504.0f,
                      65519.0f,              // below the tie with 65536: 65504
                      65520.0f,              // the tie: even is 2^16, which overflows
                      -1e6f,
                      0x1p-24f,              // smallest subnormal
                      0x1p-25f,              // tie between 0 and 2^-24: 0
                      3 * 0x1p-25f,          // tie between 2^-24 and 2^-23: 2^-23
                      0.75f * 0x1p-24f,      // nearest is 2^-24
                      0x1p-14f - 0x1p-25f,   // tie between 1023 and 1024 steps: 2^-14
                      1e-8f,
                      -0.0f};
  const float out[] = {1.0f,
                       1.0f,
                       1.0f + 0x1p-9f,
                       0.0999755859375f,
                       65504.0f,
                       65504.0f,
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(),
                       0x1p-24f,
                       0.0f,
                       0x1p-23f,
                       0x1p-24f,
                       0x1p-14f,
                       0.0f,
                       -0.0f};
  std::vector<float> x(std::begin(in), std::end(in));
  cpu::round_to_fp16(x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(floatBits(x[i]), floatBits(out[i])) << i << ": " << in[i];
  float nan = std::numeric_limits<float>::quiet_NaN();
  cpu::round_to_fp16(&nan, 1);
  EXPECT_TRUE(std::isnan(nan));
}

#ifdef __FLT16_MANT_DIG__
TEST(Rounding, Fp16AgreesWithCompilerHalfConversion) {
  // _Float16 conversion is IEEE round-to-nearest-even: an independent oracle.
  std::mt19937_64 rng(19);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) {
    // Exponents around fp16's range, random mantissas and signs.
    uint32_t u = bits(rng);
    uint32_t exponent = 127 - 30 + (u % 50);
    x.push_back(bitsFloat((u & 0x807FFFFFu) | (exponent << 23)));
  }
  std::vector<float> rounded = x;
  cpu::round_to_fp16(rounded.data(), static_cast<int64_t>(rounded.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float expected = static_cast<float>(static_cast<_Float16>(x[i]));
    ASSERT_EQ(floatBits(rounded[i]), floatBits(expected)) << x[i];
  }
}
#endif

// ---------------------------------------------------------------------------
// Initialisation

TEST(InitNormal, MomentsReproducibilityAndBoxMullerMapping) {
  const int64_t count = 100000;
  const double stddev = 0.02;
  std::vector<float> a(count), b(count), c(count);
  cpu::init_normal(a.data(), count, stddev, 1234, 5);
  cpu::init_normal(b.data(), count, stddev, 1234, 5);
  cpu::init_normal(c.data(), count, stddev, 1234, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double sum = 0, sq = 0;
  for (float v : a) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / count;
  const double sd = std::sqrt(sq / count - mean * mean);
  // Standard error of the mean: 0.02 / sqrt(1e5) ~ 6e-5; of the std ~ 0.2%.
  EXPECT_NEAR(mean, 0.0, 4e-4);
  EXPECT_NEAR(sd, stddev, 0.02 * stddev);
  const cpu::RngKey key{1234, 5, 0};
  for (int64_t k : {0, 1, 7, 49999}) {
    const double u1 = cpu::rng_uniform(key, 2 * k), u2 = cpu::rng_uniform(key, 2 * k + 1);
    const double r = stddev * std::sqrt(-2 * std::log(1 - u1));
    EXPECT_NEAR(a[2 * k], r * std::cos(kTwoPi * u2), 1e-7) << k;
    EXPECT_NEAR(a[2 * k + 1], r * std::sin(kTwoPi * u2), 1e-7) << k;
  }
  // An odd count is a prefix of the even one.
  std::vector<float> odd(7);
  cpu::init_normal(odd.data(), 7, stddev, 1234, 5);
  EXPECT_EQ(odd, std::vector<float>(a.begin(), a.begin() + 7));
}

} // namespace
