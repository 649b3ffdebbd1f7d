// The CPU kernels of a mixture-of-experts layer: Megatron-Core 0.16's
// top-k router (megatron/core/transformer/moe/router.py, moe_utils.py:
// topk_routing_with_score_function, apply_router_token_dropping,
// compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func,
// z_loss_func), permute/unpermute by routing map, and the grouped experts.
#include "runtime/exec/cpu_kernels_moe.h"
#include "runtime/exec/cpu_kernels_internal.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

namespace mt::cpu {

using detail::gemm;

namespace {

// Megatron's `type_as(logits)`: a value rounded to the logits' storage type.
template <class C> C rounded(C v, RouterRounding r) {
  if (r == RouterRounding::None)
    return v;
  float f = static_cast<float>(v);
  if (r == RouterRounding::BF16)
    round_to_bf16(&f, 1);
  else
    round_to_fp16(&f, 1);
  return static_cast<C>(f);
}

// Indices of the k largest of key[0, n), largest first; ties: the lower
// index first (torch.topk's order on distinct values, made total).
template <class C> void top_k(const C *key, int64_t n, int64_t k, std::vector<int64_t> &out) {
  out.resize(size_t(n));
  std::iota(out.begin(), out.end(), 0);
  std::partial_sort(out.begin(), out.begin() + k, out.end(), [&](int64_t a, int64_t b) {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
  });
  out.resize(size_t(k));
}

template <class C> void softmax(const C *x, int64_t n, C *y) {
  C m = x[0];
  for (int64_t i = 1; i < n; ++i)
    m = std::max(m, x[i]);
  C sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += (y[i] = std::exp(x[i] - m));
  for (int64_t i = 0; i < n; ++i)
    y[i] /= sum;
}

template <class C> C sigmoid(C x) { return C(1) / (C(1) + std::exp(-x)); }

template <class C> C logsumexp(const C *x, int64_t n) {
  C m = x[0];
  for (int64_t i = 1; i < n; ++i)
    m = std::max(m, x[i]);
  C sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += std::exp(x[i] - m);
  return m + std::log(sum);
}

// One token's routing before the capacity: the chosen experts (sel, in
// top-k order), their weights before and after the scaling factor, and
// what the backward needs of the score function (the softmax over the
// chosen logits, the full softmax, or the sigmoids).
template <class C> struct TokenRoute {
  std::vector<C> row, scores, weights, key;
  std::vector<int64_t> sel;
};

template <class T, class C>
void route_token(const T *logits_row, const MoeRouterConfig &c, TokenRoute<C> &r) {
  const int64_t e = c.experts, k = c.topk;
  r.row.assign(logits_row, logits_row + e);
  r.scores.assign(size_t(e), C(0));
  r.weights.assign(size_t(k), C(0));
  if (!c.sigmoid && !c.pre_softmax) {
    top_k(r.row.data(), e, k, r.sel);
    std::vector<C> chosen(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j)
      chosen[size_t(j)] = r.row[size_t(r.sel[size_t(j)])];
    softmax(chosen.data(), k, r.weights.data()); // kept unrounded for the backward
    for (int64_t j = 0; j < k; ++j)
      r.scores[size_t(r.sel[size_t(j)])] = r.weights[size_t(j)];
  } else if (!c.sigmoid) {
    softmax(r.row.data(), e, r.scores.data());
    r.key.resize(size_t(e));
    for (int64_t i = 0; i < e; ++i)
      r.key[size_t(i)] = rounded(r.scores[size_t(i)], c.rounding);
    top_k(r.key.data(), e, k, r.sel);
    for (int64_t j = 0; j < k; ++j)
      r.weights[size_t(j)] = r.key[size_t(r.sel[size_t(j)])];
  } else {
    r.key.resize(size_t(e));
    for (int64_t i = 0; i < e; ++i) {
      r.scores[size_t(i)] = sigmoid(r.row[size_t(i)]);
      r.key[size_t(i)] = rounded(r.scores[size_t(i)], c.rounding);
    }
    top_k(r.key.data(), e, k, r.sel);
    C sum = 0;
    for (int64_t j = 0; j < k; ++j)
      sum += r.key[size_t(r.sel[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const C s = r.key[size_t(r.sel[size_t(j)])];
      r.weights[size_t(j)] = k > 1 ? s / (sum + C(1e-20)) : s;
    }
  }
}

// The final weight of chosen expert j: rounded as Megatron's type_as, then
// scaled (and rounded again).
template <class C> C final_weight(const TokenRoute<C> &r, int64_t j, const MoeRouterConfig &c) {
  C w = rounded(r.weights[size_t(j)], c.rounding);
  if (c.scaling_factor != 0)
    w = rounded(w * C(c.scaling_factor), c.rounding);
  return w;
}

// The scores of the aux loss (compute_routing_scores_for_aux_loss): the
// full softmax in f32 (double with fp64), or the sigmoids normalised over
// every expert; and their top-k.
template <class T, class C>
void aux_scores(const T *logits_row, const MoeRouterConfig &c, std::vector<C> &row,
                std::vector<C> &q, std::vector<C> &sig, std::vector<int64_t> &sel) {
  const int64_t e = c.experts;
  row.assign(logits_row, logits_row + e);
  q.assign(size_t(e), C(0));
  if (!c.sigmoid) {
    softmax(row.data(), e, q.data());
  } else {
    sig.assign(size_t(e), C(0));
    C sum = 0;
    for (int64_t i = 0; i < e; ++i)
      sum += (sig[size_t(i)] = rounded(sigmoid(row[size_t(i)]), c.rounding));
    for (int64_t i = 0; i < e; ++i)
      q[size_t(i)] = rounded(sig[size_t(i)] / (sum + C(1e-20)), c.rounding);
  }
  top_k(q.data(), e, c.topk, sel);
}

bool aux_on(const MoeRouterConfig &c) { return c.load_balancing != 0 && c.aux_loss_coeff > 0; }

// Tokens per expert of the aux loss's routing: [E] for aux_loss, [b, E]
// (per sequence) for seq_aux_loss.
template <class T, class C>
std::vector<double> aux_token_counts(const T *logits, const MoeRouterConfig &c,
                                     bool local = false) {
  const int64_t e = c.experts, s = c.seq_length;
  if (c.global_counts && !local) {
    const size_t n = size_t(c.load_balancing == 2 ? c.tokens / s * e : e);
    return std::vector<double>(c.global_counts, c.global_counts + n);
  }
  const bool per_seq = c.load_balancing == 2;
  std::vector<double> counts(static_cast<size_t>(per_seq ? c.tokens / s * e : e), 0.0);
  std::vector<C> row, q, sig;
  std::vector<int64_t> sel;
  for (int64_t t = 0; t < c.tokens; ++t) {
    aux_scores<T, C>(logits + t * e, c, row, q, sig, sel);
    const int64_t base = per_seq ? t / s * e : 0;
    for (int64_t i : sel)
      counts[size_t(base + i)] += 1;
  }
  return counts;
}

// The aux loss's d(loss)/d(score[t, e]) per unit count, without the
// coefficient: E / (k T^2), or E / (k s^2 b) per sequence; T and s the
// totals over the count group's ranks.
double aux_unit(const MoeRouterConfig &c) {
  const double e = double(c.experts), k = double(c.topk), ranks = double(c.count_ranks);
  if (c.load_balancing == 2) {
    const double s = double(c.seq_length) * ranks, b = double(c.tokens / c.seq_length);
    return e / (k * s * s * b);
  }
  const double t = double(c.tokens) * ranks;
  return e / (k * t * t);
}

template <class T, class C>
void router_fwd(const T *logits, const MoeRouterConfig &c, T *probs, int32_t *routing_map,
                double *aux_loss, double *z_loss) {
  const int64_t tn = c.tokens, e = c.experts, k = c.topk;
  std::fill(probs, probs + tn * e, T(0));
  std::fill(routing_map, routing_map + tn * e, 0);
  std::vector<C> weight(static_cast<size_t>(tn * e), C(0)); // the routing weights before the capacity
  TokenRoute<C> r;
  for (int64_t t = 0; t < tn; ++t) {
    route_token<T, C>(logits + t * e, c, r);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = r.sel[size_t(j)];
      weight[size_t(t * e + i)] = final_weight(r, j, c);
      routing_map[t * e + i] = 1;
    }
  }
  // The capacity: per expert, the C tokens of highest weight (probs) or
  // the routed ones first (position), ties and order by Megatron's token
  // index (sequence-major). C >= T keeps every token.
  if (c.capacity > 0 && c.capacity < tn) {
    const int64_t s = c.seq_length, b = tn / s;
    auto megatron_index = [&](int64_t t) { return (t % s) * b + t / s; };
    std::vector<int64_t> order(static_cast<size_t>(tn));
    std::vector<char> keep(static_cast<size_t>(tn));
    for (int64_t i = 0; i < e; ++i) {
      std::iota(order.begin(), order.end(), 0);
      auto key = [&](int64_t t) -> C {
        return c.drop_by_position ? C(routing_map[t * e + i]) : weight[size_t(t * e + i)];
      };
      std::partial_sort(order.begin(), order.begin() + c.capacity, order.end(),
                        [&](int64_t a, int64_t bb) {
                          const C ka = key(a), kb = key(bb);
                          return ka > kb || (ka == kb && megatron_index(a) < megatron_index(bb));
                        });
      std::fill(keep.begin(), keep.end(), 0);
      for (int64_t j = 0; j < c.capacity; ++j)
        keep[size_t(order[size_t(j)])] = 1;
      for (int64_t t = 0; t < tn; ++t) {
        int32_t &m = routing_map[t * e + i];
        // Padding: the kept set is the map (unrouted tokens with weight 0).
        m = c.pad_to_capacity ? keep[size_t(t)] : (m && keep[size_t(t)]);
      }
    }
  } else if (c.capacity > 0 && c.pad_to_capacity) {
    std::fill(routing_map, routing_map + tn * e, 1); // C = T: every token fills every expert
  }
  for (int64_t x = 0; x < tn * e; ++x)
    probs[x] = routing_map[x] ? static_cast<T>(weight[size_t(x)]) : T(0);

  *aux_loss = 0;
  if (aux_on(c)) {
    const std::vector<double> counts = aux_token_counts<T, C>(logits, c);
    const bool per_seq = c.load_balancing == 2;
    std::vector<C> row, q, sig;
    std::vector<int64_t> sel;
    double sum = 0;
    for (int64_t t = 0; t < tn; ++t) {
      aux_scores<T, C>(logits + t * e, c, row, q, sig, sel);
      const int64_t base = per_seq ? t / c.seq_length * e : 0;
      for (int64_t i = 0; i < e; ++i)
        sum += double(q[size_t(i)]) * counts[size_t(base + i)];
    }
    *aux_loss = sum * aux_unit(c);
  }
  *z_loss = 0;
  if (c.z_loss_coeff > 0) {
    std::vector<C> row(static_cast<size_t>(e));
    double sum = 0;
    for (int64_t t = 0; t < tn; ++t) {
      row.assign(logits + t * e, logits + t * e + e);
      const double l = double(logsumexp(row.data(), e));
      sum += l * l;
    }
    *z_loss = sum / double(tn);
  }
}

template <class T, class C>
void router_bwd(const T *dprobs, const T *logits, const int32_t *routing_map,
                const MoeRouterConfig &c, double scale, T *dlogits) {
  const int64_t tn = c.tokens, e = c.experts, k = c.topk;
  std::vector<C> dl(static_cast<size_t>(e)), g(static_cast<size_t>(k));
  TokenRoute<C> r;
  std::vector<double> counts;
  if (aux_on(c))
    counts = aux_token_counts<T, C>(logits, c);
  std::vector<C> row, q, sig;
  std::vector<int64_t> sel;
  for (int64_t t = 0; t < tn; ++t) {
    std::fill(dl.begin(), dl.end(), C(0));
    route_token<T, C>(logits + t * e, c, r);
    // The gradient reaches a chosen expert's weight when the capacity kept
    // it (a padding entry's weight is the constant 0).
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = r.sel[size_t(j)];
      g[size_t(j)] = routing_map[t * e + i] ? C(dprobs[t * e + i]) : C(0);
      if (c.scaling_factor != 0)
        g[size_t(j)] *= C(c.scaling_factor);
    }
    if (!c.sigmoid && !c.pre_softmax) { // softmax over the chosen logits
      C dot = 0;
      for (int64_t j = 0; j < k; ++j)
        dot += g[size_t(j)] * r.weights[size_t(j)];
      for (int64_t j = 0; j < k; ++j)
        dl[size_t(r.sel[size_t(j)])] = r.weights[size_t(j)] * (g[size_t(j)] - dot);
    } else if (!c.sigmoid) { // softmax over every logit, then the chosen
      std::vector<C> gs(static_cast<size_t>(e), C(0));
      for (int64_t j = 0; j < k; ++j)
        gs[size_t(r.sel[size_t(j)])] = g[size_t(j)];
      C dot = 0;
      for (int64_t i = 0; i < e; ++i)
        dot += gs[size_t(i)] * r.scores[size_t(i)];
      for (int64_t i = 0; i < e; ++i)
        dl[size_t(i)] = r.scores[size_t(i)] * (gs[size_t(i)] - dot);
    } else { // sigmoids of the chosen, normalised by their sum when k > 1
      C sum = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        const C s = r.scores[size_t(r.sel[size_t(j)])];
        sum += s;
        dot += g[size_t(j)] * s;
      }
      const C den = sum + C(1e-20);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t i = r.sel[size_t(j)];
        const C s = r.scores[size_t(i)];
        const C ds = k > 1 ? g[size_t(j)] / den - dot / (den * den) : g[size_t(j)];
        dl[size_t(i)] = ds * s * (C(1) - s);
      }
    }
    if (aux_on(c)) {
      // d(coeff x aux)/d(q[t, i]) = coeff x unit x count_i, through the
      // aux loss's scores q.
      aux_scores<T, C>(logits + t * e, c, row, q, sig, sel);
      const int64_t base = c.load_balancing == 2 ? t / c.seq_length * e : 0;
      const double unit = scale * c.aux_loss_coeff * aux_unit(c);
      std::vector<C> gq(static_cast<size_t>(e));
      for (int64_t i = 0; i < e; ++i)
        gq[size_t(i)] = C(unit * counts[size_t(base + i)]);
      if (!c.sigmoid) {
        C dot = 0;
        for (int64_t i = 0; i < e; ++i)
          dot += gq[size_t(i)] * q[size_t(i)];
        for (int64_t i = 0; i < e; ++i)
          dl[size_t(i)] += q[size_t(i)] * (gq[size_t(i)] - dot);
      } else {
        C sum = 0, dot = 0;
        for (int64_t i = 0; i < e; ++i) {
          sum += sig[size_t(i)];
          dot += gq[size_t(i)] * sig[size_t(i)];
        }
        const C den = sum + C(1e-20);
        for (int64_t i = 0; i < e; ++i) {
          const C s = sig[size_t(i)];
          dl[size_t(i)] += (gq[size_t(i)] / den - dot / (den * den)) * s * (C(1) - s);
        }
      }
    }
    if (c.z_loss_coeff > 0) {
      // d(coeff x mean_t lse_t^2)/d(logit) = coeff x 2 lse_t softmax_t / T.
      std::vector<C> p(static_cast<size_t>(e));
      softmax(r.row.data(), e, p.data());
      const C lse = logsumexp(r.row.data(), e);
      const C f = C(scale * c.z_loss_coeff * 2.0 / double(tn)) * lse;
      for (int64_t i = 0; i < e; ++i)
        dl[size_t(i)] += f * p[size_t(i)];
    }
    for (int64_t i = 0; i < e; ++i)
      dlogits[t * e + i] = static_cast<T>(dl[size_t(i)]);
  }
}

// Segment starts of tokens_per_expert (experts + 1 entries), or an error.
std::string segments(const int32_t *tokens_per_expert, int64_t experts, int64_t rows,
                     std::vector<int64_t> &start) {
  start.assign(size_t(experts + 1), 0);
  for (int64_t i = 0; i < experts; ++i) {
    const int64_t n = tokens_per_expert[i];
    if (n < 0 || start[size_t(i)] + n > rows)
      return "tokens_per_expert[" + std::to_string(i) + "] is " + std::to_string(n) +
             ", which does not fit the " + std::to_string(rows) + " rows after the " +
             std::to_string(start[size_t(i)]) + " of the experts before it";
    start[size_t(i + 1)] = start[size_t(i)] + n;
  }
  return "";
}

// The expert of each row (-1 past the segments).
std::vector<int64_t> row_experts(const std::vector<int64_t> &start, int64_t rows) {
  std::vector<int64_t> expert(static_cast<size_t>(rows), -1);
  for (size_t i = 0; i + 1 < start.size(); ++i)
    for (int64_t r = start[i]; r < start[i + 1]; ++r)
      expert[size_t(r)] = int64_t(i);
  return expert;
}

// Row ids in [-1, tokens), a used row inside a segment.
std::string check_rows(const int32_t *row_ids, const std::vector<int64_t> &expert, int64_t rows,
                       int64_t tokens) {
  for (int64_t r = 0; r < rows; ++r) {
    if (row_ids[r] < -1 || row_ids[r] >= tokens)
      return "row_ids[" + std::to_string(r) + "] is " + std::to_string(row_ids[r]) +
             ", not a token of [0, " + std::to_string(tokens) + ") or -1";
    if (row_ids[r] >= 0 && expert[size_t(r)] < 0)
      return "row " + std::to_string(r) + " holds token " + std::to_string(row_ids[r]) +
             " but lies past every expert's segment";
  }
  return "";
}

} // namespace

// ---------------------------------------------------------------------------
// Router

template <class T>
std::vector<double> moe_router_aux_counts(const T *logits, const MoeRouterConfig &c) {
  if (!aux_on(c))
    return {};
  if (std::is_same_v<T, double> || c.fp64)
    return aux_token_counts<T, double>(logits, c, true);
  return aux_token_counts<T, float>(logits, c, true);
}

template <class T>
void moe_router_fwd(const T *logits, const MoeRouterConfig &c, T *probs, int32_t *routing_map,
                    double *aux_loss, double *z_loss) {
  if (std::is_same_v<T, double> || c.fp64)
    router_fwd<T, double>(logits, c, probs, routing_map, aux_loss, z_loss);
  else
    router_fwd<T, float>(logits, c, probs, routing_map, aux_loss, z_loss);
}

template <class T>
void moe_router_bwd(const T *dprobs, const T *logits, const int32_t *routing_map,
                    const MoeRouterConfig &c, double scale, T *dlogits) {
  if (std::is_same_v<T, double> || c.fp64)
    router_bwd<T, double>(dprobs, logits, routing_map, c, scale, dlogits);
  else
    router_bwd<T, float>(dprobs, logits, routing_map, c, scale, dlogits);
}

// ---------------------------------------------------------------------------
// Permute and unpermute

template <class T>
std::string moe_permute_fwd(const T *x, const int32_t *routing_map, int64_t tokens,
                            int64_t experts, int64_t hidden, int64_t rows, int64_t capacity,
                            bool pad_to_capacity, T *y, int32_t *row_ids,
                            int32_t *tokens_per_expert) {
  std::vector<int64_t> count(static_cast<size_t>(experts), 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < experts; ++i)
      count[size_t(i)] += routing_map[t * experts + i] != 0;
  int64_t total = 0;
  for (int64_t i = 0; i < experts; ++i) {
    if (pad_to_capacity && count[size_t(i)] != capacity)
      return "the routing map sends " + std::to_string(count[size_t(i)]) + " tokens to expert " +
             std::to_string(i) + ", not the capacity " + std::to_string(capacity) +
             " that padding fills exactly";
    total += count[size_t(i)];
  }
  if (total > rows)
    return "the routing map sends " + std::to_string(total) + " tokens to experts, more than " +
           "the " + std::to_string(rows) + " rows of the permuted tokens";
  std::fill(y, y + rows * hidden, T(0));
  std::fill(row_ids, row_ids + rows, -1);
  int64_t r = 0;
  for (int64_t i = 0; i < experts; ++i) {
    tokens_per_expert[i] = int32_t(count[size_t(i)]);
    for (int64_t t = 0; t < tokens; ++t)
      if (routing_map[t * experts + i]) {
        row_ids[r] = int32_t(t);
        std::copy(x + t * hidden, x + (t + 1) * hidden, y + r * hidden);
        ++r;
      }
  }
  return "";
}

template <class T>
std::string moe_permute_bwd(const T *dy, const int32_t *row_ids, int64_t rows, int64_t tokens,
                            int64_t hidden, T *dx) {
  std::vector<double> acc(static_cast<size_t>(tokens * hidden), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = row_ids[r];
    if (t < -1 || t >= tokens)
      return "row_ids[" + std::to_string(r) + "] is " + std::to_string(t) +
             ", not a token of [0, " + std::to_string(tokens) + ") or -1";
    if (t < 0)
      continue;
    for (int64_t h = 0; h < hidden; ++h)
      acc[size_t(t * hidden + h)] += double(dy[r * hidden + h]);
  }
  for (int64_t x = 0; x < tokens * hidden; ++x)
    dx[x] = static_cast<T>(acc[size_t(x)]);
  return "";
}

template <class T>
std::string moe_unpermute_fwd(const T *y, const T *probs, const int32_t *row_ids,
                              const int32_t *tokens_per_expert, int64_t tokens, int64_t experts,
                              int64_t rows, int64_t hidden, T *out) {
  std::vector<int64_t> start;
  if (std::string e = segments(tokens_per_expert, experts, rows, start); !e.empty())
    return e;
  const std::vector<int64_t> expert = row_experts(start, rows);
  if (std::string e = check_rows(row_ids, expert, rows, tokens); !e.empty())
    return e;
  std::vector<double> acc(static_cast<size_t>(tokens * hidden), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = row_ids[r];
    if (t < 0)
      continue;
    const double p = double(probs[t * experts + expert[size_t(r)]]);
    for (int64_t h = 0; h < hidden; ++h)
      acc[size_t(t * hidden + h)] += p * double(y[r * hidden + h]);
  }
  for (int64_t x = 0; x < tokens * hidden; ++x)
    out[x] = static_cast<T>(acc[size_t(x)]);
  return "";
}

template <class T>
std::string moe_unpermute_bwd(const T *dout, const T *y, const T *probs, const int32_t *row_ids,
                              const int32_t *tokens_per_expert, int64_t tokens, int64_t experts,
                              int64_t rows, int64_t hidden, T *dy, T *dprobs) {
  std::vector<int64_t> start;
  if (std::string e = segments(tokens_per_expert, experts, rows, start); !e.empty())
    return e;
  const std::vector<int64_t> expert = row_experts(start, rows);
  if (std::string e = check_rows(row_ids, expert, rows, tokens); !e.empty())
    return e;
  std::fill(dprobs, dprobs + tokens * experts, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = row_ids[r];
    if (t < 0) {
      std::fill(dy + r * hidden, dy + (r + 1) * hidden, T(0));
      continue;
    }
    const int64_t at = t * experts + expert[size_t(r)];
    const double p = double(probs[at]);
    double dot = 0;
    for (int64_t h = 0; h < hidden; ++h) {
      dy[r * hidden + h] = static_cast<T>(p * double(dout[t * hidden + h]));
      dot += double(y[r * hidden + h]) * double(dout[t * hidden + h]);
    }
    dprobs[at] = static_cast<T>(dot);
  }
  return "";
}

// ---------------------------------------------------------------------------
// Grouped experts: one GEMM per non-empty segment.

template <class T>
std::string grouped_matmul_fwd(const T *x, const T *w, const int32_t *tokens_per_expert,
                               int64_t experts, int64_t rows, int64_t k, int64_t m, T *y) {
  std::vector<int64_t> start;
  if (std::string e = segments(tokens_per_expert, experts, rows, start); !e.empty())
    return e;
  for (int64_t i = 0; i < experts; ++i) {
    const int64_t at = start[size_t(i)], n = start[size_t(i + 1)] - at;
    gemm(false, true, n, m, k, 1.0, x + at * k, k, w + i * m * k, k, 0.0, y + at * m, m);
  }
  std::fill(y + start[size_t(experts)] * m, y + rows * m, T(0));
  return "";
}

template <class T>
std::string grouped_matmul_bwd_input(const T *dy, const T *w, const int32_t *tokens_per_expert,
                                     int64_t experts, int64_t rows, int64_t k, int64_t m,
                                     T *dx) {
  std::vector<int64_t> start;
  if (std::string e = segments(tokens_per_expert, experts, rows, start); !e.empty())
    return e;
  for (int64_t i = 0; i < experts; ++i) {
    const int64_t at = start[size_t(i)], n = start[size_t(i + 1)] - at;
    gemm(false, false, n, k, m, 1.0, dy + at * m, m, w + i * m * k, k, 0.0, dx + at * k, k);
  }
  std::fill(dx + start[size_t(experts)] * k, dx + rows * k, T(0));
  return "";
}

template <class T>
std::string grouped_matmul_bwd_weight(const T *dy, const T *x, const int32_t *tokens_per_expert,
                                      int64_t experts, int64_t rows, int64_t k, int64_t m,
                                      T *dw) {
  std::vector<int64_t> start;
  if (std::string e = segments(tokens_per_expert, experts, rows, start); !e.empty())
    return e;
  for (int64_t i = 0; i < experts; ++i) {
    const int64_t at = start[size_t(i)], n = start[size_t(i + 1)] - at;
    if (n > 0)
      gemm(true, false, m, k, n, 1.0, dy + at * m, m, x + at * k, k, 1.0, dw + i * m * k, k);
  }
  return "";
}

// ---------------------------------------------------------------------------
// The executor uses float, the gradient tests double.

std::string moe_receive_overflow(const int32_t *counts, int64_t sources, int64_t experts,
                                 int64_t local_experts, int64_t receive_rows) {
  if (local_experts < 1 || experts % local_experts != 0)
    return "the expert exchange has " + std::to_string(experts) + " experts, not a multiple of "
           "its " + std::to_string(local_experts) + " a rank; recompile the spec with this mtc";
  int64_t most = -1, at = 0;
  for (int64_t p = 0; p < experts / local_experts; ++p) {
    int64_t need = 0;
    for (int64_t s = 0; s < sources; ++s)
      for (int64_t j = 0; j < local_experts; ++j)
        need += std::max<int32_t>(counts[s * experts + p * local_experts + j], 0);
    if (need > most) {
      most = need;
      at = p;
    }
  }
  if (most <= receive_rows)
    return "";
  return "this step's routing sends " + std::to_string(most) + " rows to the " +
         std::to_string(local_experts) + " expert" + (local_experts > 1 ? "s" : "") +
         " of expert-parallel rank " + std::to_string(at) + ", more than the " +
         std::to_string(receive_rows) +
         " receive rows the plan sized (no token is dropped): raise [parallel] "
         "moe_dispatch_buffer_factor, or remove it to size the worst case, and recompile";
}

#define MT_INSTANTIATE(T)                                                                          \
  template std::vector<double> moe_router_aux_counts<T>(const T *, const MoeRouterConfig &);     \
  template void moe_router_fwd<T>(const T *, const MoeRouterConfig &, T *, int32_t *, double *,   \
                                  double *);                                                       \
  template void moe_router_bwd<T>(const T *, const T *, const int32_t *, const MoeRouterConfig &, \
                                  double, T *);                                                    \
  template std::string moe_permute_fwd<T>(const T *, const int32_t *, int64_t, int64_t, int64_t,  \
                                          int64_t, int64_t, bool, T *, int32_t *, int32_t *);      \
  template std::string moe_permute_bwd<T>(const T *, const int32_t *, int64_t, int64_t, int64_t,  \
                                          T *);                                                    \
  template std::string moe_unpermute_fwd<T>(const T *, const T *, const int32_t *,                \
                                            const int32_t *, int64_t, int64_t, int64_t, int64_t,  \
                                            T *);                                                  \
  template std::string moe_unpermute_bwd<T>(const T *, const T *, const T *, const int32_t *,     \
                                            const int32_t *, int64_t, int64_t, int64_t, int64_t,  \
                                            T *, T *);                                             \
  template std::string grouped_matmul_fwd<T>(const T *, const T *, const int32_t *, int64_t,      \
                                             int64_t, int64_t, int64_t, T *);                      \
  template std::string grouped_matmul_bwd_input<T>(const T *, const T *, const int32_t *,         \
                                                   int64_t, int64_t, int64_t, int64_t, T *);       \
  template std::string grouped_matmul_bwd_weight<T>(const T *, const T *, const int32_t *,        \
                                                    int64_t, int64_t, int64_t, int64_t, T *);

MT_INSTANTIATE(float)
MT_INSTANTIATE(double)

#undef MT_INSTANTIATE

} // namespace mt::cpu
