// The mixture-of-experts CPU kernels (runtime/exec/cpu_kernels_moe.h): the
// router against a transcription of Megatron-Core 0.16's formulas written
// here (on tokens reordered to Megatron's [s, b] layout), hand-checked
// capacity drops for both policies, permute/unpermute round trips, and
// every backward against central finite differences of its forward in
// double precision.
#include "runtime/exec/cpu_kernels_moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace cpu = mt::cpu;

namespace {

using Vec = std::vector<double>;
using IVec = std::vector<int32_t>;

Vec randomVec(std::mt19937_64 &rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double &x : v)
    x = dist(rng);
  return v;
}

double dot(const Vec &a, const Vec &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

// analytic[i] against (f(x + h e_i) - f(x - h e_i)) / 2h for every i.
void expectGradient(const std::string &what, Vec &x, const Vec &analytic,
                    const std::function<double()> &f, double step = 1e-6, double rel = 1e-6,
                    double abs = 1e-8) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double plus = f();
    x[i] = saved - step;
    const double minus = f();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * step);
    const double tol = rel * std::max(std::fabs(analytic[i]), std::fabs(numeric)) + abs;
    if (std::fabs(analytic[i] - numeric) > tol && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << ", numeric "
                    << numeric;
  }
  EXPECT_EQ(failures, 0) << what;
}

// ---------------------------------------------------------------------------
// Megatron-Core's router, transcribed from router.py / moe_utils.py with
// torch's operations spelled out, on tensors in Megatron's token layout
// ([s, b] flattened: row j * b + i is sequence i's position j).

struct RefOut {
  Vec probs;
  IVec map;
  double aux = 0, z = 0;
};

Vec refSoftmaxRow(const double *x, int n) {
  double m = *std::max_element(x, x + n), z = 0;
  Vec y(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    z += (y[size_t(i)] = std::exp(x[i] - m));
  for (double &v : y)
    v /= z;
  return y;
}

// torch.topk(v, k) indices: descending, equal values in index order.
std::vector<int> refTopk(const Vec &v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[size_t(a)] > v[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}

struct RefConfig {
  int T, E, k, s;
  bool sigmoid = false, pre = false;
  double scaling = 0;
  int lb = 0; // 0 none, 1 aux_loss, 2 seq_aux_loss
  double aux_coeff = 0, z_coeff = 0;
  int capacity = 0;
  bool position = false, pad = false;
};

RefOut refRouterMegatronLayout(const Vec &logits, const RefConfig &c) {
  const int T = c.T, E = c.E, k = c.k;
  RefOut o;
  o.probs.assign(size_t(T * E), 0.0);
  o.map.assign(size_t(T * E), 0);
  // z-loss: mean(square(logsumexp(logits))).
  if (c.z_coeff > 0) {
    double sum = 0;
    for (int t = 0; t < T; ++t) {
      const double *row = &logits[size_t(t * E)];
      double m = *std::max_element(row, row + E), z = 0;
      for (int e = 0; e < E; ++e)
        z += std::exp(row[e] - m);
      sum += (m + std::log(z)) * (m + std::log(z));
    }
    o.z = sum / T;
  }
  // topk_routing_with_score_function.
  for (int t = 0; t < T; ++t) {
    const double *row = &logits[size_t(t * E)];
    Vec vals(row, row + E), probs;
    std::vector<int> top;
    if (!c.sigmoid && c.pre) {
      Vec scores = refSoftmaxRow(row, E);
      top = refTopk(scores, k);
      for (int i : top)
        probs.push_back(scores[size_t(i)]);
    } else if (!c.sigmoid) {
      top = refTopk(vals, k);
      Vec chosen;
      for (int i : top)
        chosen.push_back(vals[size_t(i)]);
      probs = refSoftmaxRow(chosen.data(), k);
    } else {
      Vec scores(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e)
        scores[size_t(e)] = 1 / (1 + std::exp(-row[e]));
      top = refTopk(scores, k);
      double sum = 0;
      for (int i : top)
        sum += scores[size_t(i)];
      for (int i : top)
        probs.push_back(k > 1 ? scores[size_t(i)] / (sum + 1e-20) : scores[size_t(i)]);
    }
    if (c.scaling)
      for (double &p : probs)
        p *= c.scaling;
    for (int j = 0; j < k; ++j) {
      o.probs[size_t(t * E + top[size_t(j)])] = probs[size_t(j)];
      o.map[size_t(t * E + top[size_t(j)])] = 1;
    }
  }
  // apply_router_token_dropping: a top-`capacity` mask per expert column.
  if (c.capacity > 0) {
    std::vector<int> mask(size_t(T * E), 1);
    if (c.capacity <= T)
      for (int e = 0; e < E; ++e) {
        Vec col(static_cast<size_t>(T));
        for (int t = 0; t < T; ++t)
          col[size_t(t)] = c.position ? o.map[size_t(t * E + e)] : o.probs[size_t(t * E + e)];
        std::vector<int> keep = refTopk(col, c.capacity);
        for (int t = 0; t < T; ++t)
          mask[size_t(t * E + e)] = std::find(keep.begin(), keep.end(), t) != keep.end();
      }
    for (int x = 0; x < T * E; ++x) {
      o.map[size_t(x)] = c.pad ? mask[size_t(x)] : (o.map[size_t(x)] && mask[size_t(x)]);
      o.probs[size_t(x)] *= o.map[size_t(x)];
    }
  }
  // compute_routing_scores_for_aux_loss, then switch_load_balancing_loss_func
  // (divided by its coefficient, as the tracker records it). seq_aux_loss
  // views the scores [s, b * E]: sequence i's expert e is column i * E + e.
  if (c.lb != 0 && c.aux_coeff > 0) {
    Vec scores(static_cast<size_t>(T * E));
    IVec amap(size_t(T * E), 0);
    for (int t = 0; t < T; ++t) {
      const double *row = &logits[size_t(t * E)];
      Vec q;
      if (!c.sigmoid) {
        q = refSoftmaxRow(row, E);
      } else {
        double sum = 0;
        for (int e = 0; e < E; ++e)
          sum += 1 / (1 + std::exp(-row[e]));
        for (int e = 0; e < E; ++e)
          q.push_back(1 / (1 + std::exp(-row[e])) / (sum + 1e-20));
      }
      for (int i : refTopk(q, k))
        amap[size_t(t * E + i)] = 1;
      std::copy(q.begin(), q.end(), scores.begin() + t * E);
    }
    const int rows = c.lb == 2 ? c.s : T, cols = c.lb == 2 ? T / c.s * E : E;
    const double bsz = c.lb == 2 ? double(T / c.s) : 1.0;
    double sum = 0;
    for (int col = 0; col < cols; ++col) {
      double p = 0, n = 0;
      for (int r = 0; r < rows; ++r) {
        p += scores[size_t(r * cols + col)];
        n += amap[size_t(r * cols + col)];
      }
      sum += p * n;
    }
    o.aux = sum * (E * c.aux_coeff / (double(k) * rows * rows)) / bsz / c.aux_coeff;
  }
  return o;
}

// mt's [b, s] token t = i * s + j is Megatron's row j * b + i.
int megatronRow(int t, int s, int b) { return (t % s) * b + t / s; }

RefOut refRouter(const Vec &logits, const RefConfig &c) {
  const int b = c.T / c.s;
  Vec m(logits.size());
  for (int t = 0; t < c.T; ++t)
    std::copy_n(&logits[size_t(t * c.E)], c.E, &m[size_t(megatronRow(t, c.s, b) * c.E)]);
  RefOut r = refRouterMegatronLayout(m, c), o = r;
  for (int t = 0; t < c.T; ++t)
    for (int e = 0; e < c.E; ++e) {
      o.probs[size_t(t * c.E + e)] = r.probs[size_t(megatronRow(t, c.s, b) * c.E + e)];
      o.map[size_t(t * c.E + e)] = r.map[size_t(megatronRow(t, c.s, b) * c.E + e)];
    }
  return o;
}

cpu::MoeRouterConfig kernelConfig(const RefConfig &r) {
  cpu::MoeRouterConfig c;
  c.tokens = r.T;
  c.experts = r.E;
  c.topk = r.k;
  c.sigmoid = r.sigmoid;
  c.pre_softmax = r.pre;
  c.load_balancing = r.lb;
  c.capacity = r.capacity;
  c.drop_by_position = r.position;
  c.pad_to_capacity = r.pad;
  c.seq_length = r.s;
  c.scaling_factor = r.scaling;
  c.aux_loss_coeff = r.aux_coeff;
  c.z_loss_coeff = r.z_coeff;
  return c;
}

struct Routed {
  Vec probs;
  IVec map;
  double aux = 0, z = 0;
};

Routed runRouter(const Vec &logits, const cpu::MoeRouterConfig &c) {
  Routed r;
  r.probs.resize(logits.size());
  r.map.resize(logits.size());
  cpu::moe_router_fwd(logits.data(), c, r.probs.data(), r.map.data(), &r.aux, &r.z);
  return r;
}

// Configurations: every score function, k 1 and 2, scaling, both aux
// losses, both drop policies with and without padding.
std::vector<RefConfig> routerConfigs() {
  std::vector<RefConfig> out;
  for (int score = 0; score < 3; ++score)
    for (int k : {1, 2})
      for (int variant = 0; variant < 6; ++variant) {
        RefConfig c{12, 4, k, 3};
        c.sigmoid = score == 2;
        c.pre = score == 1;
        c.aux_coeff = 0.01;
        c.z_coeff = 0.001;
        c.lb = variant % 3; // none, aux_loss, seq_aux_loss
        c.scaling = variant == 2 ? 2.5 : 0;
        if (variant >= 3) {
          c.capacity = k == 1 ? 2 : 4;
          c.position = variant == 4;
          c.pad = variant == 5;
        }
        out.push_back(c);
      }
  return out;
}

std::string describe(const RefConfig &c) {
  return std::string(c.sigmoid ? "sigmoid" : c.pre ? "pre-softmax" : "softmax") +
         " k=" + std::to_string(c.k) + " lb=" + std::to_string(c.lb) +
         " scaling=" + std::to_string(c.scaling) + " capacity=" + std::to_string(c.capacity) +
         (c.position ? " position" : " probs") + (c.pad ? " pad" : "");
}

TEST(MoeKernels, RouterMatchesMegatronFormulas) {
  std::mt19937_64 rng(26);
  for (const RefConfig &rc : routerConfigs()) {
    const Vec logits = randomVec(rng, size_t(rc.T * rc.E), -2.0, 2.0);
    const RefOut want = refRouter(logits, rc);
    const Routed got = runRouter(logits, kernelConfig(rc));
    SCOPED_TRACE(describe(rc));
    EXPECT_EQ(got.map, want.map);
    for (size_t i = 0; i < want.probs.size(); ++i)
      EXPECT_NEAR(got.probs[i], want.probs[i], 1e-12) << "probs[" << i << "]";
    EXPECT_NEAR(got.aux, want.aux, 1e-12);
    EXPECT_NEAR(got.z, want.z, 1e-12);
    if (rc.lb == 0)
      EXPECT_EQ(got.aux, 0.0);
    else
      EXPECT_GT(got.aux, 0.0);
    EXPECT_GT(got.z, 0.0);
  }
}

TEST(MoeKernels, RouterInFloatAndFp64) {
  // The executor's float path computes in f32; with fp64 in double.
  std::mt19937_64 rng(7);
  RefConfig rc{12, 4, 2, 3};
  rc.lb = 1;
  rc.aux_coeff = 0.01;
  rc.z_coeff = 0.001;
  const Vec logits = randomVec(rng, size_t(rc.T * rc.E), -2.0, 2.0);
  const RefOut want = refRouter(logits, rc);
  std::vector<float> lf(logits.begin(), logits.end()), pf(logits.size());
  IVec map(logits.size());
  for (bool fp64 : {false, true}) {
    cpu::MoeRouterConfig c = kernelConfig(rc);
    c.fp64 = fp64;
    double aux = 0, z = 0;
    cpu::moe_router_fwd(lf.data(), c, pf.data(), map.data(), &aux, &z);
    EXPECT_EQ(map, want.map);
    for (size_t i = 0; i < pf.size(); ++i)
      EXPECT_NEAR(pf[i], want.probs[i], 2e-7) << "fp64 " << fp64;
    EXPECT_NEAR(aux, want.aux, fp64 ? 1e-7 : 1e-6);
    EXPECT_NEAR(z, want.z, fp64 ? 1e-7 : 1e-6);
  }
}

TEST(MoeKernels, RouterTiesGoToTheLowerExpert) {
  // Equal logits: top-2 of [1, 3, 3, 3] is experts 1 and 2.
  cpu::MoeRouterConfig c = kernelConfig(RefConfig{1, 4, 2, 1});
  const Routed r = runRouter({1, 3, 3, 3}, c);
  EXPECT_EQ(r.map, (IVec{0, 1, 1, 0}));
  EXPECT_DOUBLE_EQ(r.probs[1], 0.5);
  EXPECT_DOUBLE_EQ(r.probs[2], 0.5);
}

// Four tokens, two sequences of two (mt's tokens 0, 1 are sequence 0's;
// Megatron orders them t0, t2, t1, t3), two experts, top-1 with softmax
// before the top-k:
//   t0 [0, 1] -> e1 (0.731)   t1 [3, 0] -> e0 (0.953)
//   t2 [1, 0] -> e0 (0.731)   t3 [0, 2] -> e1 (0.881)
struct DropCase {
  Vec logits = {0, 1, 3, 0, 1, 0, 0, 2};
  cpu::MoeRouterConfig config(int64_t capacity, bool position, bool pad) const {
    RefConfig rc{4, 2, 1, 2};
    rc.pre = true;
    rc.capacity = int(capacity);
    rc.position = position;
    rc.pad = pad;
    return kernelConfig(rc);
  }
};

TEST(MoeKernels, CapacityDropsByProbs) {
  // Capacity 1: each expert keeps its most probable token: e0 t1 (0.953
  // over t2's 0.731), e1 t3 (0.881 over t0's 0.731).
  DropCase d;
  const Routed r = runRouter(d.logits, d.config(1, false, false));
  EXPECT_EQ(r.map, (IVec{0, 0, 1, 0, 0, 0, 0, 1}));
  EXPECT_NEAR(r.probs[2], 1 / (1 + std::exp(-3.0)), 1e-15);
  EXPECT_NEAR(r.probs[7], 1 / (1 + std::exp(-2.0)), 1e-15);
  EXPECT_EQ(r.probs[1], 0.0); // t0's dropped weight
  EXPECT_EQ(r.probs[4], 0.0); // t2's
}

TEST(MoeKernels, CapacityDropsByPositionInMegatronOrder) {
  // Capacity 1: the first routed token in Megatron's [s, b] order: e0 has
  // t1 (row 2) and t2 (row 1): t2 stays; e1 has t0 (row 0) and t3 (row 3):
  // t0 stays. (mt's own order would have kept t1.)
  DropCase d;
  const Routed r = runRouter(d.logits, d.config(1, true, false));
  EXPECT_EQ(r.map, (IVec{0, 1, 0, 0, 1, 0, 0, 0}));
  EXPECT_NEAR(r.probs[1], 1 / (1 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(r.probs[4], 1 / (1 + std::exp(-1.0)), 1e-15);
}

TEST(MoeKernels, CapacityPadsWithUnroutedTokens) {
  // Capacity 3, padded: e0 keeps t1, t2 and, among the zeros, t0 (row 0
  // before t3's row 3); e1 keeps t3, t0 and t2 (row 1 before t1's row 2).
  // Padding entries carry weight 0. Both policies agree here.
  DropCase d;
  for (bool position : {false, true}) {
    const Routed r = runRouter(d.logits, d.config(3, position, true));
    EXPECT_EQ(r.map, (IVec{1, 1, 1, 0, 1, 1, 0, 1})) << "position " << position;
    EXPECT_EQ(r.probs[0], 0.0);
    EXPECT_EQ(r.probs[5], 0.0);
    EXPECT_GT(r.probs[1], 0.7);
    for (int e = 0; e < 2; ++e)
      EXPECT_EQ(r.map[size_t(e)] + r.map[size_t(2 + e)] + r.map[size_t(4 + e)] +
                    r.map[size_t(6 + e)],
                3);
  }
  // Capacity T, padded: every token fills every expert.
  const Routed all = runRouter(d.logits, d.config(4, false, true));
  EXPECT_EQ(all.map, IVec(8, 1));
  // A capacity of T or more without padding drops nothing.
  const Routed none = runRouter(d.logits, d.config(4, false, false));
  EXPECT_EQ(none.map, (IVec{0, 1, 1, 0, 1, 0, 0, 1}));
}

TEST(MoeKernels, AuxAndZLossByHand) {
  // Two tokens of one sequence, two experts, top-1, softmax: logits [0, 0]
  // and [ln 3, 0]. Scores [.5, .5] (top-1: e0, the lower on a tie) and
  // [.75, .25] (e0): counts [2, 0], P = [1.25, .75]: aux = E / (k T^2) *
  // (1.25 * 2) = 2 / 4 * 2.5 = 1.25. z = mean(lse^2) = (ln 2)^2 / 2 +
  // (ln 4)^2 / 2.
  RefConfig rc{2, 2, 1, 2};
  rc.lb = 1;
  rc.aux_coeff = 0.1;
  rc.z_coeff = 0.1;
  const Routed r = runRouter({0, 0, std::log(3.0), 0}, kernelConfig(rc));
  EXPECT_NEAR(r.aux, 1.25, 1e-15);
  EXPECT_NEAR(r.z, (std::log(2.0) * std::log(2.0) + std::log(4.0) * std::log(4.0)) / 2, 1e-15);
  // Coefficients 0: nothing computed (Megatron skips them).
  rc.aux_coeff = 0;
  rc.z_coeff = 0;
  const Routed off = runRouter({0, 0, std::log(3.0), 0}, kernelConfig(rc));
  EXPECT_EQ(off.aux, 0.0);
  EXPECT_EQ(off.z, 0.0);
}

// ---------------------------------------------------------------------------
// Backward against finite differences: L(logits) = <r, probs> + scale x
// (aux_coeff x aux + z_coeff x z), with the routing decisions fixed by the
// point (no ties near it).

TEST(MoeKernels, RouterBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(11);
  const double scale = 0.75;
  for (const RefConfig &rc : routerConfigs()) {
    SCOPED_TRACE(describe(rc));
    cpu::MoeRouterConfig c = kernelConfig(rc);
    Vec logits = randomVec(rng, size_t(rc.T * rc.E), -2.0, 2.0);
    const Vec r = randomVec(rng, logits.size());
    auto loss = [&]() {
      const Routed o = runRouter(logits, c);
      return dot(r, o.probs) + scale * (c.aux_loss_coeff * o.aux + c.z_loss_coeff * o.z);
    };
    const Routed at = runRouter(logits, c);
    Vec dlogits(logits.size());
    cpu::moe_router_bwd(r.data(), logits.data(), at.map.data(), c, scale, dlogits.data());
    expectGradient("dlogits", logits, dlogits, loss);
  }
}

TEST(MoeKernels, AuxAndZLossGradientsAloneMatchFiniteDifferences) {
  // dprobs = 0: what remains is the aux and z losses' gradient.
  std::mt19937_64 rng(12);
  for (int lb : {1, 2})
    for (bool sigmoid : {false, true}) {
      RefConfig rc{12, 4, 2, 4};
      rc.lb = lb;
      rc.sigmoid = sigmoid;
      rc.aux_coeff = 0.3;
      rc.z_coeff = 0.02;
      cpu::MoeRouterConfig c = kernelConfig(rc);
      Vec logits = randomVec(rng, size_t(rc.T * rc.E), -2.0, 2.0);
      const Vec zero(logits.size(), 0.0);
      auto loss = [&]() {
        const Routed o = runRouter(logits, c);
        return 4.0 * (c.aux_loss_coeff * o.aux + c.z_loss_coeff * o.z);
      };
      const Routed at = runRouter(logits, c);
      Vec dlogits(logits.size());
      cpu::moe_router_bwd(zero.data(), logits.data(), at.map.data(), c, 4.0, dlogits.data());
      double norm = 0;
      for (double g : dlogits)
        norm += g * g;
      EXPECT_GT(norm, 0.0);
      expectGradient("aux/z dlogits lb=" + std::to_string(lb), logits, dlogits, loss);
    }
}

// ---------------------------------------------------------------------------
// Permute, grouped matmul, unpermute.

struct Dispatch {
  int64_t T, E, H, rows;
  IVec map;
  Vec probs;
};

// Six tokens, four experts, top-2 (rows 12), with random weights.
Dispatch topTwo(std::mt19937_64 &rng) {
  RefConfig rc{6, 4, 2, 3};
  const Routed r = runRouter(randomVec(rng, 24, -2.0, 2.0), kernelConfig(rc));
  return Dispatch{6, 4, 5, 12, r.map, r.probs};
}

TEST(MoeKernels, PermuteLaysRowsOutExpertMajor) {
  // Token t to experts: t0 {0, 2}, t1 {1, 2}, t2 {0, 3}: rows t0, t2 | t1 |
  // t0, t1 | t2.
  const IVec map = {1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1};
  const Vec x = {10, 11, 20, 21, 30, 31};
  Vec y(12);
  IVec rows(6), tpe(4);
  ASSERT_EQ(cpu::moe_permute_fwd(x.data(), map.data(), 3, 4, 2, 6, 0, false, y.data(),
                                 rows.data(), tpe.data()),
            "");
  EXPECT_EQ(rows, (IVec{0, 2, 1, 0, 1, 2}));
  EXPECT_EQ(tpe, (IVec{2, 1, 2, 1}));
  EXPECT_EQ(y, (Vec{10, 11, 30, 31, 20, 21, 10, 11, 20, 21, 30, 31}));
  // More rows than routed: unused rows are -1 and zero.
  Vec y8(16, 7.0);
  IVec rows8(8);
  ASSERT_EQ(cpu::moe_permute_fwd(x.data(), map.data(), 3, 4, 2, 8, 2, false, y8.data(),
                                 rows8.data(), tpe.data()),
            "");
  EXPECT_EQ(rows8[6], -1);
  EXPECT_EQ(rows8[7], -1);
  EXPECT_EQ(y8[15], 0.0);
  // Fewer rows than routed, or padding that is not exactly C per expert.
  EXPECT_EQ(cpu::moe_permute_fwd(x.data(), map.data(), 3, 4, 2, 5, 0, false, y.data(),
                                 rows.data(), tpe.data()),
            "the routing map sends 6 tokens to experts, more than the 5 rows of the permuted "
            "tokens");
  EXPECT_EQ(cpu::moe_permute_fwd(x.data(), map.data(), 3, 4, 2, 8, 2, true, y8.data(),
                                 rows8.data(), tpe.data()),
            "the routing map sends 1 tokens to expert 1, not the capacity 2 that padding fills "
            "exactly");
}

TEST(MoeKernels, PermuteUnpermuteRoundTrip) {
  std::mt19937_64 rng(3);
  const Dispatch d = topTwo(rng);
  const Vec x = randomVec(rng, size_t(d.T * d.H));
  Vec y(static_cast<size_t>(d.rows * d.H)), out(x.size());
  IVec rows(static_cast<size_t>(d.rows)), tpe(size_t(d.E));
  ASSERT_EQ(cpu::moe_permute_fwd(x.data(), d.map.data(), d.T, d.E, d.H, d.rows, 0, false,
                                 y.data(), rows.data(), tpe.data()),
            "");
  // Weights 1 / k on the routed experts give x back.
  Vec half(d.map.size());
  for (size_t i = 0; i < half.size(); ++i)
    half[i] = d.map[i] ? 0.5 : 0.0;
  ASSERT_EQ(cpu::moe_unpermute_fwd(y.data(), half.data(), rows.data(), tpe.data(), d.T, d.E,
                                   d.rows, d.H, out.data()),
            "");
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(out[i], x[i], 1e-15);
  // The permute's backward of y sums each token's k copies: k x.
  Vec dx(x.size());
  ASSERT_EQ(cpu::moe_permute_bwd(y.data(), rows.data(), d.rows, d.T, d.H, dx.data()), "");
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(dx[i], 2 * x[i], 1e-15);
  // Padded to capacity 3: expert e's rows are [3e, 3e + 3).
  RefConfig rc{6, 4, 2, 3};
  rc.pre = true;
  rc.capacity = 3;
  rc.pad = true;
  const Routed padded = runRouter(randomVec(rng, 24, -2.0, 2.0), kernelConfig(rc));
  Vec yp(static_cast<size_t>(12 * d.H));
  ASSERT_EQ(cpu::moe_permute_fwd(x.data(), padded.map.data(), d.T, d.E, d.H, 12, 3, true,
                                 yp.data(), rows.data(), tpe.data()),
            "");
  EXPECT_EQ(tpe, (IVec{3, 3, 3, 3}));
  for (int64_t r = 0; r < 12; ++r) {
    ASSERT_GE(rows[size_t(r)], 0);
    EXPECT_EQ(padded.map[size_t(rows[size_t(r)] * 4 + r / 3)], 1) << "row " << r;
    EXPECT_EQ(yp[size_t(r * d.H)], x[size_t(rows[size_t(r)] * d.H)]);
  }
}

TEST(MoeKernels, GroupedMatmulMatchesPerExpertProducts) {
  std::mt19937_64 rng(5);
  const int64_t E = 3, N = 7, K = 4, M = 5;
  const IVec tpe = {3, 0, 2}; // rows 5 and 6 past the segments
  const Vec x = randomVec(rng, size_t(N * K)), w = randomVec(rng, size_t(E * M * K));
  Vec y(size_t(N * M), 9.0);
  ASSERT_EQ(cpu::grouped_matmul_fwd(x.data(), w.data(), tpe.data(), E, N, K, M, y.data()), "");
  const int64_t expert[N] = {0, 0, 0, 2, 2, -1, -1};
  for (int64_t r = 0; r < N; ++r)
    for (int64_t o = 0; o < M; ++o) {
      double want = 0;
      if (expert[r] >= 0)
        for (int64_t i = 0; i < K; ++i)
          want += x[size_t(r * K + i)] * w[size_t((expert[r] * M + o) * K + i)];
      EXPECT_NEAR(y[size_t(r * M + o)], want, 1e-14) << r << "," << o;
    }
  const IVec bad = {3, 0, 5};
  EXPECT_EQ(cpu::grouped_matmul_fwd(x.data(), w.data(), bad.data(), E, N, K, M, y.data()),
            "tokens_per_expert[2] is 5, which does not fit the 7 rows after the 3 of the "
            "experts before it");
}

TEST(MoeKernels, GroupedMatmulGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(6);
  const int64_t E = 3, N = 7, K = 4, M = 5;
  const IVec tpe = {3, 0, 2};
  Vec x = randomVec(rng, size_t(N * K)), w = randomVec(rng, size_t(E * M * K));
  const Vec r = randomVec(rng, size_t(N * M));
  auto loss = [&]() {
    Vec y(static_cast<size_t>(N * M));
    cpu::grouped_matmul_fwd(x.data(), w.data(), tpe.data(), E, N, K, M, y.data());
    return dot(r, y);
  };
  Vec dx(x.size()), dw(w.size(), 0.0);
  ASSERT_EQ(cpu::grouped_matmul_bwd_input(r.data(), w.data(), tpe.data(), E, N, K, M, dx.data()),
            "");
  ASSERT_EQ(cpu::grouped_matmul_bwd_weight(r.data(), x.data(), tpe.data(), E, N, K, M,
                                           dw.data()),
            "");
  expectGradient("dx", x, dx, loss);
  expectGradient("dw", w, dw, loss);
  // The weight gradient accumulates.
  Vec twice = dw;
  cpu::grouped_matmul_bwd_weight(r.data(), x.data(), tpe.data(), E, N, K, M, twice.data());
  for (size_t i = 0; i < dw.size(); ++i)
    EXPECT_NEAR(twice[i], 2 * dw[i], 1e-14);
}

TEST(MoeKernels, UnpermuteAndPermuteGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(8);
  const Dispatch d = topTwo(rng);
  Vec x = randomVec(rng, size_t(d.T * d.H));
  Vec y(static_cast<size_t>(d.rows * d.H));
  IVec rows(static_cast<size_t>(d.rows)), tpe(size_t(d.E));
  ASSERT_EQ(cpu::moe_permute_fwd(x.data(), d.map.data(), d.T, d.E, d.H, d.rows, 0, false,
                                 y.data(), rows.data(), tpe.data()),
            "");
  Vec probs = d.probs;
  const Vec r = randomVec(rng, size_t(d.T * d.H));
  auto unpermuted = [&]() {
    Vec out(static_cast<size_t>(d.T * d.H));
    cpu::moe_unpermute_fwd(y.data(), probs.data(), rows.data(), tpe.data(), d.T, d.E, d.rows,
                           d.H, out.data());
    return dot(r, out);
  };
  Vec dy(y.size()), dprobs(probs.size());
  ASSERT_EQ(cpu::moe_unpermute_bwd(r.data(), y.data(), probs.data(), rows.data(), tpe.data(),
                                   d.T, d.E, d.rows, d.H, dy.data(), dprobs.data()),
            "");
  expectGradient("unpermute dy", y, dy, unpermuted);
  // The weights of unrouted experts do not reach the output: their
  // gradient is 0, as finite differences find.
  expectGradient("unpermute dprobs", probs, dprobs, unpermuted);
  // Permute: L(x) = <ry, permute(x)>.
  const Vec ry = randomVec(rng, y.size());
  auto permuted = [&]() {
    Vec yy(y.size());
    IVec rr(rows.size()), tt(tpe.size());
    cpu::moe_permute_fwd(x.data(), d.map.data(), d.T, d.E, d.H, d.rows, 0, false, yy.data(),
                         rr.data(), tt.data());
    return dot(ry, yy);
  };
  Vec dx(x.size());
  ASSERT_EQ(cpu::moe_permute_bwd(ry.data(), rows.data(), d.rows, d.T, d.H, dx.data()), "");
  expectGradient("permute dx", x, dx, permuted);
}

TEST(MoeKernels, BadRowIdsAreErrors) {
  const IVec tpe = {1, 1};
  const IVec rows = {0, 5};
  Vec y(4, 1.0), probs(4, 1.0), out(4), dy(4), dprobs(4);
  EXPECT_EQ(cpu::moe_unpermute_fwd(y.data(), probs.data(), rows.data(), tpe.data(), 2, 2, 2, 2,
                                   out.data()),
            "row_ids[1] is 5, not a token of [0, 2) or -1");
  EXPECT_EQ(cpu::moe_permute_bwd(y.data(), rows.data(), 2, 2, 2, out.data()),
            "row_ids[1] is 5, not a token of [0, 2) or -1");
  const IVec past = {1, 0};
  const IVec tpe1 = {1, 0};
  EXPECT_EQ(cpu::moe_unpermute_bwd(y.data(), y.data(), probs.data(), past.data(), tpe1.data(), 2,
                                   2, 2, 2, dy.data(), dprobs.data()),
            "row 1 holds token 0 but lies past every expert's segment");
}

} // namespace
