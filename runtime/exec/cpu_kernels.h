// The CPU reference executor's kernels: forward and backward of every mt op,
// the optimizer's kernels, the dropout generator and reduced-precision rounding.
//
// Plain functions over row-major arrays, templated on the element type: the
// executor uses float, the finite-difference tests use double. Matrix products
// go through OpenBLAS (cblas_sgemm / cblas_dgemm). `n` is always the number of
// rows (the product of the leading dimensions: batch * seq for activations).
//
// Conventions for backward kernels: outputs named d<input> of an activation
// are overwritten; gradients of parameters (dtable, dweight, dbias) are
// accumulated (+=), because gradient accumulation over micro-batches and tied
// weights both sum into one buffer.
#ifndef MT_RUNTIME_CPU_KERNELS_H
#define MT_RUNTIME_CPU_KERNELS_H

#include <cstdint>
#include <string>

namespace mt::cpu {

// ---------------------------------------------------------------------------
// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011), so that a
// dropout mask is a pure function of (seed, stream, offset, element index):
// recomputation and the CUDA kernels reproduce it without storing it.
//   key     = { low 32 bits of seed, low 32 bits of stream }
//   counter = { low(i / 4), high(i / 4), low(offset), high(offset) }
// Element i takes word (i % 4) of the block for counter i / 4 and maps it to
// u = (word >> 8) * 2^-24 in [0, 1); it is kept when u >= rate. Attention's
// dropout (attention_fwd/bwd) draws eight elements a block instead: counter
// i / 8, the 16-bit half (i % 2) of word (i / 2) % 4, u = half * 2^-16.
// `offset` separates calls of one op: the runtime passes a number unique to
// (iteration, micro-batch, train/eval).
struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;
};
void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
float rng_uniform(const RngKey &key, uint64_t index);

// ---------------------------------------------------------------------------
// Embedding: out[i, :] = table[ids[i], :]. Ids outside [0, vocab) make the
// forward return false (the executor turns that into an error naming the op).
template <class T>
bool embedding_fwd(const T *table, int64_t vocab, int64_t h, const int32_t *ids,
                   int64_t n, T *out);
template <class T>
void embedding_bwd(const T *dout, const int32_t *ids, int64_t n, int64_t h,
                   T *dtable /* += */);

// Position ids 0..seq-1 for each of `batch` sequences.
void position_ids(int64_t batch, int64_t seq, int32_t *out);

// ---------------------------------------------------------------------------
// LayerNorm over the last dimension h: y = (x - mean) * rstd * w + b,
// rstd = 1 / sqrt(var + eps) with the biased variance. Backward recomputes
// the statistics from x (nothing but x is saved). `w_offset` is added to
// every weight before use (1 for --apply-layernorm-1p: the stored weight w
// is applied as 1 + w, in double); dw is the gradient of the stored w.
template <class T>
void layer_norm_fwd(const T *x, const T *w, const T *b, int64_t n, int64_t h,
                    double eps, T *y, double w_offset = 0.0);
template <class T>
void layer_norm_bwd(const T *dy, const T *x, const T *w, int64_t n, int64_t h,
                    double eps, T *dx, T *dw /* += */, T *db /* += */,
                    double w_offset = 0.0);

// RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (w + w_offset).
template <class T>
void rms_norm_fwd(const T *x, const T *w, int64_t n, int64_t h, double eps, T *y,
                  double w_offset = 0.0);
template <class T>
void rms_norm_bwd(const T *dy, const T *x, const T *w, int64_t n, int64_t h,
                  double eps, T *dx, T *dw /* += */, double w_offset = 0.0);

// ---------------------------------------------------------------------------
// Linear layer without bias, weights [out, in]: y[n, out] = x[n, in] * w^T.
template <class T>
void matmul_fwd(const T *x, const T *w, int64_t n, int64_t in, int64_t out, T *y);
// dx[n, in] = dy[n, out] * w (overwritten, or added when `accumulate`).
template <class T>
void matmul_bwd_input(const T *dy, const T *w, int64_t n, int64_t in,
                      int64_t out, T *dx, bool accumulate);
// dw[out, in] += dy^T * x.
template <class T>
void matmul_bwd_weight(const T *dy, const T *x, int64_t n, int64_t in,
                       int64_t out, T *dw /* += */);

// y = x + b (b broadcast over rows); db += column sums of dy.
template <class T>
void bias_add_fwd(const T *x, const T *b, int64_t n, int64_t h, T *y);
template <class T>
void bias_grad(const T *dy, int64_t n, int64_t h, T *db /* += */);

// Elementwise over `count` elements.
template <class T>
void add(const T *a, const T *b, int64_t count, T *y);
template <class T>
void accumulate(const T *src, int64_t count, T *dst /* += */);
template <class T>
void scale(T *x, int64_t count, double s);

// GeLU, exact (erf) or Megatron's tanh approximation
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
void gelu_fwd(const T *x, int64_t count, bool tanh_approx, T *y);
template <class T>
void gelu_bwd(const T *dy, const T *x, int64_t count, bool tanh_approx, T *dx);

// SwiGLU: x is [n, 2f], a = x[:, :f], b = x[:, f:], y[n, f] = silu(a) * b.
template <class T>
void swiglu_fwd(const T *x, int64_t n, int64_t f, T *y);
template <class T>
void swiglu_bwd(const T *dy, const T *x, int64_t n, int64_t f, T *dx /* [n, 2f] */);

// Dropout: y = keep ? x / (1 - rate) : 0, keep from rng_uniform(key, i).
// rate == 0 copies.
// Dropout of a shard: x is `outer` segments of `len` elements, segment o
// being elements [o * stride + first, ... + len) of the whole tensor whose
// mask applies (stride = len and first = 0 for an unsharded tensor).
template <class T>
void dropout_segments(const T *x, int64_t outer, int64_t len, uint64_t stride, uint64_t first,
                      double rate, const RngKey &key, T *y);
template <class T>
void dropout_fwd(const T *x, int64_t count, double rate, const RngKey &key, T *y);
template <class T>
void dropout_bwd(const T *dy, int64_t count, double rate, const RngKey &key, T *dx);

// ---------------------------------------------------------------------------
// Megatron's per-query-group QKV layout: each of the `groups` groups holds its
// heads/groups query heads, then one key head, then one value head, each d
// wide. qkv [n, groups * (heads/groups + 2) * d] -> q [n, heads, d],
// k [n, groups, d], v [n, groups, d]. Backward scatters back (overwrites dqkv).
template <class T>
void split_qkv_fwd(const T *qkv, int64_t n, int64_t heads, int64_t groups,
                   int64_t d, T *q, T *k, T *v);
template <class T>
void split_qkv_bwd(const T *dq, const T *dk, const T *dv, int64_t n,
                   int64_t heads, int64_t groups, int64_t d, T *dqkv);

// RoPE's frequency of pair j < d/2: base^(-2j/d), in double. With
// `scaling` > 0 (Megatron's --use-rope-scaling, Llama 3.1's rule with
// low/high frequency factors 1 and 4 and 8192 original positions) a
// frequency whose wavelength 2 pi / f exceeds 8192 is divided by `scaling`,
// one below 8192 / 4 is kept, and one between is interpolated:
// (1 - s) f / scaling + s f with s = (8192 / wavelength - 1) / 3.
double rope_inv_freq(int64_t j, int64_t d, double base, double scaling);

// Rotary embedding on x [batch, seq, heads, d], non-interleaved: pairs
// (x[j], x[j + d/2]) at position p rotate by p * rope_inv_freq(j), j < d/2
// (y[j] = x[j] cos - x[j + d/2] sin, y[j + d/2] = x[j + d/2] cos + x[j] sin).
// Backward rotates by the opposite angle.
template <class T>
void rope_fwd(const T *x, int64_t batch, int64_t seq, int64_t heads, int64_t d,
              double base, T *y, double scaling = 0.0);
template <class T>
void rope_bwd(const T *dy, int64_t batch, int64_t seq, int64_t heads, int64_t d,
              double base, T *dx, double scaling = 0.0);

// SPLIT_QKV then ROPE on q and k, as one pass (the unrotated q and k never
// exist): qkv [batch, seq, groups * (heads/groups + 2) * d] -> q [batch, seq,
// heads, d] and k [batch, seq, groups, d] rotated, v as split. Backward
// rotates dq and dk back by the opposite angle while merging them with dv
// into dqkv (overwritten). Bit-identical to the separate ops: the same
// double angles and rotation.
template <class T>
void split_qkv_rope_fwd(const T *qkv, int64_t batch, int64_t seq, int64_t heads,
                        int64_t groups, int64_t d, double base, T *q, T *k, T *v,
                        double scaling = 0.0);
template <class T>
void split_qkv_rope_bwd(const T *dq, const T *dk, const T *dv, int64_t batch,
                        int64_t seq, int64_t heads, int64_t groups, int64_t d,
                        double base, T *dqkv, double scaling = 0.0);

// ---------------------------------------------------------------------------
// Exact attention. q, out [batch, seq, heads, d]; k, v [batch, seq, groups, d];
// head h reads group h / (heads / groups). p = softmax(scale * q k^T, causal
// mask when `causal`), dropout of `dropout_rate` on p with element index
// ((b * heads + h) * seq + i) * seq + j (16-bit draws, eight a Philox
// block), out = p v; lse [batch, heads, seq]
// is each row's log-sum-exp of its masked scores (natural log). Backward
// takes out and lse from the forward: p = exp(scale * q k^T - lse) (no seq x
// seq matrix is saved) and the softmax's row sums are dout . out; it
// overwrites dq, dk, dv.
struct AttentionShape {
  int64_t batch, seq, heads, groups, d;
  bool causal;
  double scale;
  double dropout_rate;
  // Tensor parallelism: these heads are heads [head_offset, head_offset +
  // heads) of a model with total_heads (0: heads), and the dropout mask is
  // that part of the whole model's mask.
  int64_t head_offset = 0, total_heads = 0;
};
template <class T>
void attention_fwd(const T *q, const T *k, const T *v, const AttentionShape &s,
                   const RngKey &key, T *out, T *lse);
template <class T>
void attention_bwd(const T *dout, const T *q, const T *k, const T *v, const T *out,
                   const T *lse, const AttentionShape &s, const RngKey &key, T *dq,
                   T *dk, T *dv);

// ---------------------------------------------------------------------------
// Cross-entropy over logits [n, vocab] (vocab may be the padded size):
// loss = sum_i mask_i (logsumexp(logits_i) - logits_i[label_i]) / sum_i mask_i,
// mask = 1 everywhere when loss_mask is null; a mask summing to 0 gives loss 0
// and zero gradients. Computed in double. Returns false when a label is
// outside [0, vocab) (the executor reports it).
template <class T>
bool cross_entropy_fwd(const T *logits, const int32_t *labels,
                       const float *loss_mask, int64_t n, int64_t vocab,
                       double *loss);
// dlogits = dloss * mask_i * (softmax(logits_i) - onehot(label_i)) / sum(mask).
// dlogits may be logits itself: the plan overwrites the logits in place.
template <class T>
void cross_entropy_bwd(const T *logits, const int32_t *labels,
                       const float *loss_mask, int64_t n, int64_t vocab,
                       double dloss, T *dlogits);

// ---------------------------------------------------------------------------
// Optimizer. Megatron's AdamW (decoupled weight decay, bias correction):
//   p -= lr * weight_decay * p
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
// `step` counts optimizer steps from 1.
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};
template <class T>
void adamw_step(T *p, const T *g, T *m, T *v, int64_t count, const AdamWParams &a);

// Megatron's SGD (torch.optim.SGD with momentum, no dampening, no Nesterov):
//   d = g + weight_decay * p;  buf = momentum * buf + d;  p -= lr * buf
// buf starts at zero, so the first update's buffer is d, as torch's.
struct SgdParams {
  double lr, momentum, weight_decay;
};
template <class T>
void sgd_step(T *p, const T *g, T *buf, int64_t count, const SgdParams &s);

// Sum of squares in double (for the global gradient norm), and whether every
// element is finite (NaN/Inf detection skips the update).
template <class T>
double sum_squares(const T *x, int64_t count);
template <class T>
bool all_finite(const T *x, int64_t count);

// Round float storage to the nearest bf16 / fp16 value (round half to even),
// keeping it in float: the CPU path's model of reduced-precision tensors.
void round_to_bf16(float *x, int64_t count);
void round_to_fp16(float *x, int64_t count);

// Normal(0, std) initialisation, reproducible from (seed, stream): Box-Muller
// over rng_uniform with key {seed, stream, 0}. Elements 2k and 2k+1 come from
// u1 = uniform(2k), u2 = uniform(2k+1): r = std * sqrt(-2 ln(1 - u1)),
// x[2k] = r cos(2 pi u2), x[2k+1] = r sin(2 pi u2).
void init_normal(float *x, int64_t count, double std, uint64_t seed, uint64_t stream);

} // namespace mt::cpu

#endif // MT_RUNTIME_CPU_KERNELS_H
