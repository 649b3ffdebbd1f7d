// The CPU kernels of a mixture-of-experts layer (Megatron-Core 0.16's
// TopKRouter, permute/unpermute by routing map and the grouped experts),
// forward and backward: plain functions over row-major arrays, templated on
// the element type (the executor uses float, the gradient tests double), as
// the rest of cpu_kernels.h. The GPU emulation tests use them as the
// reference.
//
// Tokens: T = b * s rows in mt's order (token t = batch i * s + position j).
// Megatron orders them [s, b] (t' = j * b + i); where the order decides
// (which tokens a capacity keeps, ties), these kernels use Megatron's.
#ifndef MT_RUNTIME_CPU_KERNELS_MOE_H
#define MT_RUNTIME_CPU_KERNELS_MOE_H

#include <cstdint>
#include <string>
#include <vector>

namespace mt::cpu {

// Rounding of the router's intermediate scores and probabilities to the
// logits' storage type (Megatron's `type_as(logits)` with
// --moe-router-dtype unset), or none.
enum class RouterRounding { None, BF16, F16 };

// The router's attributes (plan.fbs MOE_ROUTER).
struct MoeRouterConfig {
  int64_t tokens = 0, experts = 0, topk = 1;
  bool sigmoid = false;       // score function: sigmoid, else softmax
  bool pre_softmax = false;   // softmax before the top-k (softmax only)
  int load_balancing = 0;     // 0 none, 1 aux_loss, 2 seq_aux_loss
  int64_t capacity = 0;       // tokens per expert; 0: no capacity
  bool drop_by_position = false; // drop policy: position, else probs
  bool pad_to_capacity = false;
  int64_t seq_length = 1;     // s: tokens = b * s
  bool fp64 = false;          // --moe-router-dtype fp64: computed in double
  RouterRounding rounding = RouterRounding::None;
  double scaling_factor = 0;  // 0: none
  double aux_loss_coeff = 0, z_loss_coeff = 0;
  // Sequence parallelism (MOE_ROUTER's count_group): the aux loss's token
  // counts summed over `count_ranks` ranks holding `tokens` tokens each
  // (Megatron's get_tokens_per_expert_and_token_count over tp_cp).
  // global_counts (moe_router_aux_counts' layout, summed over the ranks)
  // then replaces this rank's counts and the token total is tokens x
  // count_ranks (seq_aux_loss: seq_length x count_ranks per sequence);
  // the scores stay this rank's, so the ranks' losses add up to the loss.
  const double *global_counts = nullptr;
  int64_t count_ranks = 1;
};

// The aux loss's token counts on this rank's tokens: [E] for aux_loss,
// [b, E] per sequence for seq_aux_loss (empty when the aux loss is off):
// the tokens whose top-k of the aux scores holds each expert, before any
// capacity.
template <class T>
std::vector<double> moe_router_aux_counts(const T *logits, const MoeRouterConfig &c);

// Forward. logits [T, E] -> probs [T, E] (the kept experts' routing weights,
// 0 elsewhere), routing_map [T, E] (1: the token goes to the expert, after
// the capacity; with pad_to_capacity every expert holds exactly `capacity`
// tokens, padding ones with weight 0), and the losses Megatron's tracker
// records for the layer, without their coefficients: *aux_loss (the
// switch load-balancing loss, or seq_aux_loss's mean over sequences; 0 when
// load_balancing is 0 or its coefficient is 0) and *z_loss (mean over tokens
// of logsumexp(logits)^2; 0 when its coefficient is 0).
//
//   scores, top-k: softmax: the top-k of the logits, softmax over those k
//     (pre_softmax: the top-k of softmax(logits)); sigmoid: the top-k of
//     sigmoid(logits), divided by their sum + 1e-20 when k > 1; then times
//     scaling_factor. Ties: the lower expert index first.
//   capacity C (Megatron's apply_router_token_dropping): when C < T, each
//     expert keeps the C tokens of highest routing weight (probs policy) or
//     the first C tokens routed to it (position policy), ties and order in
//     Megatron's token order; with pad_to_capacity the kept set is always C
//     tokens, unrouted ones (weight 0) completing it. C >= T drops nothing.
//   aux_loss: E / (k T^2) sum_e tokens_e * sum_t scores[t, e], scores the
//     full softmax (or sigmoid normalised over all experts), tokens_e the
//     count of tokens whose top-k of those scores holds e (before any
//     capacity). seq_aux_loss: the same per sequence (T -> s), averaged over
//     the b sequences.
template <class T>
void moe_router_fwd(const T *logits, const MoeRouterConfig &c, T *probs,
                    int32_t *routing_map, double *aux_loss, double *z_loss);

// Backward: dlogits [T, E] (overwritten) from dprobs [T, E], the gradient
// of the forward's probs, through the kept top-k weights and the score
// function, plus `scale` times the aux and z losses' gradients times their
// coefficients (Megatron's MoEAuxLossAutoScaler: `scale` is the main loss's
// backward scale, the grad seed). routing_map is the forward's.
template <class T>
void moe_router_bwd(const T *dprobs, const T *logits, const int32_t *routing_map,
                    const MoeRouterConfig &c, double scale, T *dlogits);

// Permute by routing map: x [T, H] -> y [N, H], row_ids [N] (the source
// token of each row, -1 for an unused row: zero in y), tokens_per_expert [E].
// Rows are expert-major, tokens ascending within an expert; with
// pad_to_capacity (capacity C > 0) expert e owns rows [e C, e C + C) and
// counts C. Returns "" or why the routing does not fit N rows.
template <class T>
std::string moe_permute_fwd(const T *x, const int32_t *routing_map, int64_t tokens,
                            int64_t experts, int64_t hidden, int64_t rows, int64_t capacity,
                            bool pad_to_capacity, T *y, int32_t *row_ids,
                            int32_t *tokens_per_expert);
// dx [T, H] (overwritten) = the sum over rows r of token t of dy[r], in
// double, rounded once. A row id outside [-1, T) returns an error.
template <class T>
std::string moe_permute_bwd(const T *dy, const int32_t *row_ids, int64_t rows, int64_t tokens,
                            int64_t hidden, T *dx);

// Grouped linear layers, w [E, M, K]: rows of expert e's segment (segments
// consecutive in expert order, of tokens_per_expert[e] rows) times w[e]^T;
// y's rows past the segments are zero. Through the BLAS of cpu_kernels,
// one product per non-empty segment. A count that is negative or runs past
// `rows` returns an error.
template <class T>
std::string grouped_matmul_fwd(const T *x, const T *w, const int32_t *tokens_per_expert,
                               int64_t experts, int64_t rows, int64_t k, int64_t m, T *y);
// dx [N, K] = dy [N, M] times w[e] per segment (overwritten; rows past the
// segments zero).
template <class T>
std::string grouped_matmul_bwd_input(const T *dy, const T *w, const int32_t *tokens_per_expert,
                                     int64_t experts, int64_t rows, int64_t k, int64_t m, T *dx);
// dw[e] += dy[segment e]^T x[segment e].
template <class T>
std::string grouped_matmul_bwd_weight(const T *dy, const T *x, const int32_t *tokens_per_expert,
                                      int64_t experts, int64_t rows, int64_t k, int64_t m,
                                      T *dw /* += */);

// Unpermute with the routing weights: out [T, H] (overwritten) = sum over
// rows r of token t of probs[t, expert(r)] * y[r], accumulated in double
// and rounded once. expert(r) is the segment holding r; a row id outside
// [-1, T), or a used row past the segments, returns an error.
template <class T>
std::string moe_unpermute_fwd(const T *y, const T *probs, const int32_t *row_ids,
                              const int32_t *tokens_per_expert, int64_t tokens, int64_t experts,
                              int64_t rows, int64_t hidden, T *out);
// dy [N, H] = probs[t, expert(r)] * dout[t] (0 for unused rows); dprobs
// [T, E] = dot(y[r], dout[t]) at (t, expert(r)), 0 elsewhere.
template <class T>
std::string moe_unpermute_bwd(const T *dout, const T *y, const T *probs,
                              const int32_t *row_ids, const int32_t *tokens_per_expert,
                              int64_t tokens, int64_t experts, int64_t rows, int64_t hidden,
                              T *dy, T *dprobs);

// The expert exchange's receive rows (MOE_DISPATCH), checked before any row
// moves. counts [sources][experts]: every source's tokens_per_expert, which
// every rank of the exchange has gathered; expert-parallel rank p receives
// from every source the rows of its experts [p L, p L + L). Returns "" when
// every rank's rows fit in the plan's `receive_rows`, else one error line,
// the same on every rank (it names the rank needing the most, the first of
// ties), so that all of them stop instead of some waiting in the row
// exchange. No row is ever dropped to make them fit.
std::string moe_receive_overflow(const int32_t *counts, int64_t sources, int64_t experts,
                                 int64_t local_experts, int64_t receive_rows);

} // namespace mt::cpu

#endif // MT_RUNTIME_CPU_KERNELS_MOE_H
