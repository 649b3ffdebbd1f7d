// Megatron's derived defaults and the cross-key rules (divisibility, parallel
// layout, schedules, world size), once SpecParser.cpp has read every key.
#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/base/batch_rampup.h"
#include "spec/Spec.h"
#include "spec/SpecParserImpl.h"

namespace mt::spec::detail {

namespace {

std::string divisorList(int64_t n) {
  std::string r;
  int count = 0;
  for (int64_t d = 1; d <= n && count < 12; ++d)
    if (n % d == 0)
      r += (count++ ? ", " : "") + std::to_string(d);
  return r;
}

// "use X = 24 or 32": the multiples of `step` around `v`, nearest first.
std::string nearestMultiples(const char *name, int64_t v, int64_t step) {
  int64_t lo = v / step * step, hi = lo + step;
  std::string n = std::string(name) + " = ";
  if (lo == 0 || hi - v < v - lo)
    return n + std::to_string(hi);
  if (v - lo < hi - v)
    return n + std::to_string(lo);
  return n + std::to_string(lo) + " or " + std::to_string(hi);
}

} // namespace

// Where to point for a key: its value, else its section header, else 1:1.
Loc Parser::at(const std::string &section, const std::string &name) const {
  if (const Entry *e = given(section, name))
    return e->valueLoc;
  auto it = sections.find(section);
  if (it != sections.end() && it->second.inFile)
    return it->second.header;
  return Loc{source, 1, 1};
}

// "name = value (FILE:L:C)" or "name = value (default)", for the other keys
// a cross-key message mentions.
std::string Parser::ref(const std::string &section, const std::string &name,
                        const std::string &value) const {
  std::string s = name + " = " + value;
  if (const Entry *e = given(section, name))
    return s + " (" + e->valueLoc.str() + ")";
  return s + " (default)";
}
std::string Parser::ref(const std::string &section, const std::string &name, int64_t v) const {
  return ref(section, name, std::to_string(v));
}

void Parser::resolveModel(Spec &spec) {
  ModelConfig &m = spec.model;
  if (!given("model", "kv_channels")) {
    if (m.hidden_size % m.num_attention_heads != 0)
      fail(at("model", "num_attention_heads"),
           ref("model", "hidden_size", m.hidden_size) +
               " is not divisible by num_attention_heads = " +
               std::to_string(m.num_attention_heads),
           "each head gets hidden_size / num_attention_heads channels: choose "
           "num_attention_heads dividing " +
               std::to_string(m.hidden_size) + " (" + divisorList(m.hidden_size) +
               ", ...), or set kv_channels");
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  if (m.position_embedding_type == PositionEmbedding::Rope && m.kv_channels % 2 != 0)
    fail(given("model", "kv_channels") ? at("model", "kv_channels")
                                       : at("model", "num_attention_heads"),
         "rope rotates each head's channels in pairs, but the head dim " +
             (given("model", "kv_channels")
                  ? ref("model", "kv_channels", m.kv_channels)
                  : "hidden_size / num_attention_heads = " + std::to_string(m.hidden_size) +
                        " / " + std::to_string(m.num_attention_heads) + " = " +
                        std::to_string(m.kv_channels)) +
             " is odd",
         given("model", "kv_channels") ? std::string("set an even kv_channels")
                                       : "choose num_attention_heads so that each head gets an "
                                         "even number of channels, or set an even kv_channels");
  if (!given("model", "num_query_groups"))
    m.num_query_groups = m.num_attention_heads;
  if (m.num_query_groups > m.num_attention_heads)
    fail(at("model", "num_query_groups"),
         "num_query_groups = " + std::to_string(m.num_query_groups) + " exceeds " +
             ref("model", "num_attention_heads", m.num_attention_heads),
         "each key/value group serves one or more query heads: use num_query_groups <= " +
             std::to_string(m.num_attention_heads));
  if (m.num_attention_heads % m.num_query_groups != 0)
    fail(at("model", "num_query_groups"),
         ref("model", "num_attention_heads", m.num_attention_heads) +
             " is not divisible by num_query_groups = " + std::to_string(m.num_query_groups),
         "every group must serve the same number of query heads: use a divisor of " +
             std::to_string(m.num_attention_heads) + " (" + divisorList(m.num_attention_heads) +
             ")");
  if (!given("model", "ffn_hidden_size")) {
    // Megatron: int((4 * h * 2 / 3) / 64) * 64 with SwiGLU, keeping the
    // parameter count close to the 4h GELU MLP.
    m.ffn_hidden_size = m.swiglu ? m.hidden_size / 24 * 64 : 4 * m.hidden_size;
    if (m.ffn_hidden_size == 0)
      fail(at("model", "swiglu"),
           "with swiglu the default ffn_hidden_size, int((4 * hidden_size * 2 / 3) / 64) "
           "* 64, is 0 for hidden_size = " +
               std::to_string(m.hidden_size),
           "set ffn_hidden_size");
  }
  if (!given("model", "max_position_embeddings"))
    m.max_position_embeddings = m.seq_length;
  if (m.position_embedding_type == PositionEmbedding::LearnedAbsolute &&
      m.seq_length > m.max_position_embeddings)
    fail(at("model", "seq_length"),
         "seq_length = " + std::to_string(m.seq_length) + " exceeds " +
             ref("model", "max_position_embeddings", m.max_position_embeddings) +
             " with learned_absolute position embeddings",
         "raise max_position_embeddings to at least " + std::to_string(m.seq_length) +
             ", lower seq_length, or use position_embedding_type = \"rope\"");
  if (given("model", "rotary_base") && m.position_embedding_type != PositionEmbedding::Rope)
    fail(at("model", "rotary_base"),
         "rotary_base only applies to rope positions, but " +
             ref("model", "position_embedding_type", quote(toString(m.position_embedding_type))),
         "remove rotary_base or set position_embedding_type = \"rope\"");
  if (m.use_rope_scaling && m.position_embedding_type != PositionEmbedding::Rope)
    fail(at("model", "use_rope_scaling"),
         "use_rope_scaling scales rotary frequencies, but " +
             ref("model", "position_embedding_type", quote(toString(m.position_embedding_type))),
         "remove use_rope_scaling or set position_embedding_type = \"rope\"");
  if (given("model", "rope_scaling_factor") && !m.use_rope_scaling)
    fail(at("model", "rope_scaling_factor"),
         "rope_scaling_factor only applies with use_rope_scaling = true",
         "set use_rope_scaling = true (Megatron's --use-rope-scaling) or remove "
         "rope_scaling_factor");
}

void Parser::checkParallel(Spec &spec) {
  const ModelConfig &m = spec.model;
  ParallelConfig &p = spec.parallel;
  const int64_t tp = p.tensor_model_parallel_size, pp = p.pipeline_model_parallel_size,
                vp = p.virtual_pipeline_model_parallel_size;
  const Loc tpAt = at("parallel", "tensor_model_parallel_size");
  const std::string tpText = "tensor_model_parallel_size = " + std::to_string(tp);
  if (m.num_attention_heads % tp != 0)
    fail(tpAt,
         ref("model", "num_attention_heads", m.num_attention_heads) + " is not divisible by " +
             tpText,
         "each tensor-parallel rank holds whole attention heads: use a "
         "tensor_model_parallel_size dividing " +
             std::to_string(m.num_attention_heads));
  if (m.num_query_groups % tp != 0)
    fail(tpAt,
         ref("model", "num_query_groups", m.num_query_groups) + " is not divisible by " + tpText,
         "each tensor-parallel rank holds whole key/value groups: use a "
         "tensor_model_parallel_size dividing " +
             std::to_string(m.num_query_groups) + ", or more query groups");
  if (m.ffn_hidden_size % tp != 0)
    fail(tpAt,
         ref("model", "ffn_hidden_size", m.ffn_hidden_size) + " is not divisible by " + tpText,
         "the MLP is split evenly over tensor-parallel ranks: use a "
         "tensor_model_parallel_size dividing " +
             std::to_string(m.ffn_hidden_size) + ", or set ffn_hidden_size to a multiple of " +
             std::to_string(tp));
  if (vp > 1 && pp == 1)
    fail(at("parallel", "virtual_pipeline_model_parallel_size"),
         "virtual_pipeline_model_parallel_size = " + std::to_string(vp) +
             " needs pipeline parallelism, but " +
             ref("parallel", "pipeline_model_parallel_size", pp),
         "set pipeline_model_parallel_size >= 2, or "
         "virtual_pipeline_model_parallel_size = 1");
  const int64_t chunks = pp * vp;
  const int64_t first = p.decoder_first_pipeline_num_layers,
                last = p.decoder_last_pipeline_num_layers;
  for (const char *k : {"decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"}) {
    if (!given("parallel", k))
      continue;
    if (pp == 1)
      fail(at("parallel", k),
           std::string(k) + " needs pipeline parallelism, but " +
               ref("parallel", "pipeline_model_parallel_size", pp),
           "set pipeline_model_parallel_size >= 2, or remove " + std::string(k));
    if (vp > 1)
      fail(at("parallel", k),
           std::string(k) + " cannot be combined with the interleaved schedule (" +
               ref("parallel", "virtual_pipeline_model_parallel_size", vp) + ")",
           "remove " + std::string(k) + ", or set virtual_pipeline_model_parallel_size = 1");
  }
  if (first || last) {
    // Megatron: the stages without a count share the rest evenly.
    const int64_t rest = m.num_layers - first - last;
    const int64_t even = pp - (first ? 1 : 0) - (last ? 1 : 0);
    const std::string counts =
        (first ? ref("parallel", "decoder_first_pipeline_num_layers", first) : std::string()) +
        (first && last ? ", " : "") +
        (last ? ref("parallel", "decoder_last_pipeline_num_layers", last) : std::string());
    const char *k = first ? "decoder_first_pipeline_num_layers"
                          : "decoder_last_pipeline_num_layers";
    if (rest < (even > 0 ? even : 0) || (even == 0 && rest != 0))
      fail(at("parallel", k),
           "num_layers = " + std::to_string(m.num_layers) + " does not match " + counts +
               (even > 0 ? " with at least one layer on each of the other " +
                               std::to_string(even) + " stages"
                         : " (the two stages must hold every layer)"),
           "make the first and last counts add up to num_layers, or leave room for the "
           "other stages");
    else if (even > 0 && rest % even != 0)
      fail(at("parallel", k),
           "the " + std::to_string(rest) + " layers left after " + counts +
               " do not divide over the other " + std::to_string(even) + " pipeline stages",
           "Megatron would stop with an assertion, mt refuses: choose counts that leave a "
           "multiple of " + std::to_string(even) + " layers");
  } else if (m.num_layers % chunks != 0) {
    std::string by = vp > 1
                         ? "pipeline_model_parallel_size * "
                           "virtual_pipeline_model_parallel_size = " +
                               std::to_string(pp) + " * " + std::to_string(vp) + " = " +
                               std::to_string(chunks) + " (" +
                               ref("parallel", "pipeline_model_parallel_size", pp) + ", " +
                               ref("parallel", "virtual_pipeline_model_parallel_size", vp) + ")"
                         : ref("parallel", "pipeline_model_parallel_size", pp);
    fail(at("model", "num_layers"),
         "num_layers = " + std::to_string(m.num_layers) + " is not divisible by " + by,
         "Megatron would silently drop layers, mt refuses: use " +
             nearestMultiples("num_layers", m.num_layers, chunks));
  }
  if (p.sequence_parallel && tp == 1)
    fail(at("parallel", "sequence_parallel"),
         "sequence_parallel requires tensor parallelism, but " +
             ref("parallel", "tensor_model_parallel_size", tp),
         "set tensor_model_parallel_size >= 2, or remove sequence_parallel");

  // Megatron ignores --ddp-bucket-size without --overlap-grad-reduce (one
  // bucket then holds every gradient); mt says so instead.
  if (given("parallel", "ddp_bucket_size") && !p.overlap_grad_reduce)
    fail(at("parallel", "ddp_bucket_size"),
         "ddp_bucket_size only applies with overlap_grad_reduce = true (without it every "
         "gradient is reduced in one bucket after the backward)",
         "set overlap_grad_reduce = true, or remove ddp_bucket_size");
  // Megatron asserts both; the gathers only exist with the distributed
  // optimizer, and they go into the program overlap_grad_reduce makes.
  if (p.overlap_param_gather && !p.use_distributed_optimizer)
    fail(at("parallel", "overlap_param_gather"),
         "overlap_param_gather needs use_distributed_optimizer = true (without it every "
         "rank updates all its weights and nothing is gathered)",
         "set use_distributed_optimizer = true, or remove overlap_param_gather");
  else if (p.overlap_param_gather && !p.overlap_grad_reduce)
    fail(at("parallel", "overlap_param_gather"),
         "overlap_param_gather needs overlap_grad_reduce = true, as Megatron-LM's "
         "--overlap-param-gather needs --overlap-grad-reduce",
         "set overlap_grad_reduce = true, or remove overlap_param_gather");
  const std::string gran =
      given("parallel", "recompute_granularity")
          ? ref("parallel", "recompute_granularity", quote(toString(p.recompute_granularity)))
          : "recompute_granularity is not set";
  if (p.recompute_method != RecomputeMethod::None &&
      p.recompute_granularity != RecomputeGranularity::Full)
    fail(at("parallel", "recompute_method"),
         "recompute_method needs recompute_granularity = \"full\" (Megatron asserts "
         "this), but " +
             gran,
         "set recompute_granularity = \"full\", or remove recompute_method");
  if (given("parallel", "recompute_num_layers") &&
      p.recompute_granularity != RecomputeGranularity::Full)
    fail(at("parallel", "recompute_num_layers"),
         "recompute_num_layers needs recompute_granularity = \"full\", but " + gran,
         "set recompute_granularity = \"full\", or remove recompute_num_layers");
  // Megatron counts recompute_num_layers per model chunk: the layers one
  // TransformerBlock holds, num_layers / (pp * vp).
  const int64_t perChunk = m.num_layers / chunks;
  const std::string chunkText =
      "the " + std::to_string(perChunk) +
      " layers of each model chunk (num_layers / (pipeline_model_parallel_size * "
      "virtual_pipeline_model_parallel_size) = " +
      std::to_string(m.num_layers) + " / (" + std::to_string(pp) + " * " + std::to_string(vp) +
      "))";
  if (p.recompute_granularity == RecomputeGranularity::Full) {
    if (p.recompute_method == RecomputeMethod::None)
      fail(at("parallel", "recompute_granularity"),
           "recompute_granularity = \"full\" needs recompute_method",
           "add recompute_method = \"uniform\" or \"block\" to [parallel]");
    if (p.recompute_num_layers == 0)
      fail(at("parallel", "recompute_granularity"),
           "recompute_granularity = \"full\" needs recompute_num_layers",
           "add recompute_num_layers to [parallel] (1 to " + std::to_string(perChunk) +
               ", counted per model chunk)");
    const int64_t n = p.recompute_num_layers;
    if (p.recompute_method == RecomputeMethod::Block && n > perChunk)
      fail(at("parallel", "recompute_num_layers"),
           "recompute_num_layers = " + std::to_string(n) + " exceeds " + chunkText +
               " with recompute_method = \"block\"",
           "use 1 to " + std::to_string(perChunk) + " (" + std::to_string(perChunk) +
               " recomputes every layer)");
    if (p.recompute_method == RecomputeMethod::Uniform && perChunk % n != 0)
      fail(at("parallel", "recompute_num_layers"),
           "recompute_num_layers = " + std::to_string(n) + " does not divide " + chunkText +
               " with recompute_method = \"uniform\"",
           "use a divisor of " + std::to_string(perChunk) + ": " + divisorList(perChunk));
  }
}

// How long training runs: train_iters, or train_samples with the
// iterations derived as Megatron's update_train_iters derives them, the
// batch-size ramp-up included. Each mode refuses the other's keys, where
// Megatron asserts or silently ignores them.
void Parser::resolveLength(Spec &spec) {
  TrainingConfig &t = spec.training;
  const Entry *iters = given("training", "train_iters");
  const Entry *samples = given("training", "train_samples");
  if (iters && samples)
    fail(samples->valueLoc,
         "train_samples and train_iters (" + iters->valueLoc.str() +
             ") are mutually exclusive: training counts samples or iterations",
         "keep one of them");
  if (!iters && !samples) {
    auto it = sections.find("training");
    fail(it != sections.end() && it->second.inFile ? it->second.header : Loc{source, 1, 1},
         "[training] needs train_iters or train_samples (how long to train)",
         "add train_iters = N (iterations) or train_samples = N (samples) to [training]");
  }
  // Megatron asserts the other unit's warmup is 0, its default: an explicit
  // 0 passes.
  auto zero = [&](const char *k) {
    const Entry *e = given("training", k);
    return e && e->value->is_integer() && *e->value->value_exact<int64_t>() == 0;
  };
  if (!samples) {
    for (const char *k :
         {"lr_decay_samples", "lr_warmup_samples", "lr_wsd_decay_samples", "rampup_batch_size"})
      if (given("training", k) && !zero(k))
        fail(at("training", k),
             std::string(k) + " needs sample-based training (train_samples), but " +
                 ref("training", "train_iters", t.train_iters) + " counts iterations",
             std::string(k) == "rampup_batch_size"
                 ? std::string("replace train_iters with train_samples, or remove "
                               "rampup_batch_size")
                 : "use " + std::string(k).substr(0, std::string(k).size() - 8) +
                       "_iters, or replace train_iters with train_samples");
    return;
  }
  for (const char *k : {"lr_decay_iters", "lr_warmup_iters", "lr_wsd_decay_iters"})
    if (given("training", k) && !zero(k)) {
      const std::string base = std::string(k).substr(0, std::string(k).size() - 6);
      fail(at("training", k),
           std::string(k) + " counts iterations, but training is sample-based (" +
               ref("training", "train_samples", t.train_samples) + ")",
           "use " + base + "_samples = N (samples) instead");
    }

  const int64_t gbs = t.global_batch_size;
  rt::BatchRampup r;
  r.global = gbs;
  const std::string gbsRef = ref("training", "global_batch_size", gbs);
  if (!t.rampup_batch_size.empty()) {
    const int64_t start = t.rampup_batch_size[0], incr = t.rampup_batch_size[1];
    const Loc rampAt = at("training", "rampup_batch_size");
    if (start >= gbs)
      fail(rampAt,
           "rampup_batch_size starts at " + std::to_string(start) +
               (start == gbs ? ", already " : ", beyond ") + gbsRef +
               ": there is nothing to ramp up",
           "start below " + std::to_string(gbs) + ", or remove rampup_batch_size");
    if ((gbs - start) % incr != 0)
      fail(rampAt,
           "rampup_batch_size's increment " + std::to_string(incr) +
               " does not divide global_batch_size - start = " + std::to_string(gbs) + " - " +
               std::to_string(start) + " = " + std::to_string(gbs - start) + " (" + gbsRef +
               ")",
           "use an increment dividing " + std::to_string(gbs - start) + " (" +
               divisorList(gbs - start) + ", ...)");
    r.start = start;
    r.increment = incr;
    r.samples = t.rampup_batch_size[2];
  }
  std::vector<rt::BatchChange> changes;
  t.train_iters = rt::rampup_train_iters(r, t.train_samples, &changes);
  if (t.train_iters < 1)
    fail(samples->valueLoc,
         "train_samples = " + std::to_string(t.train_samples) +
             " is less than one global batch (" + gbsRef + "): no iteration to train",
         "use train_samples >= " + std::to_string(gbs));
  // Megatron checks each iteration's batch as it reaches it.
  const int64_t step = t.micro_batch_size * spec.parallel.data_parallel_size;
  for (const rt::BatchChange &c : changes)
    if (c.batch % step != 0)
      fail(at("training", "rampup_batch_size"),
           "the batch-size ramp-up reaches a global batch of " + std::to_string(c.batch) +
               " at iteration " + std::to_string(c.iteration + 1) +
               ", not a multiple of micro_batch_size * data_parallel_size = " +
               std::to_string(t.micro_batch_size) + " * " +
               std::to_string(spec.parallel.data_parallel_size) + " = " +
               std::to_string(step),
           "use a start and an increment that are multiples of " + std::to_string(step));
  // The interleaved schedule runs micro-batch counts in groups of
  // pipeline_model_parallel_size (Megatron-Core raises at the first
  // iteration whose count is not a multiple); each smaller step runs inside
  // the full batch's memory plan (mt-plan-memory checks it).
  const int64_t pp = spec.parallel.pipeline_model_parallel_size,
                vp = spec.parallel.virtual_pipeline_model_parallel_size;
  if (r.on() && pp > 1 && vp > 1)
    for (const rt::BatchChange &c : changes)
      if (c.batch < gbs && (c.batch / step) % pp != 0)
        fail(at("training", "rampup_batch_size"),
             "the batch-size ramp-up reaches a global batch of " + std::to_string(c.batch) +
                 " at iteration " + std::to_string(c.iteration + 1) + ", " +
                 std::to_string(c.batch / step) +
                 " micro-batches, which the interleaved schedule (" +
                 ref("parallel", "virtual_pipeline_model_parallel_size", vp) +
                 ") cannot run: it takes multiples of " +
                 ref("parallel", "pipeline_model_parallel_size", pp) + " micro-batches",
             "use a start and an increment that are multiples of micro_batch_size * "
             "data_parallel_size * pipeline_model_parallel_size = " +
                 std::to_string(step * pp));
}

void Parser::resolveTraining(Spec &spec) {
  TrainingConfig &t = spec.training;
  const int64_t dp = spec.parallel.data_parallel_size;
  const int64_t step = t.micro_batch_size * dp;
  // A micro-batch's tokens are indexed with 32-bit integers in the kernels
  // (and a CUDA grid's rows): both keys are below 2^31, so the product fits.
  if (t.micro_batch_size * spec.model.seq_length > kMaxInt)
    fail(at("training", "micro_batch_size"),
         "a micro-batch of " + ref("training", "micro_batch_size", t.micro_batch_size) +
             " samples of " + ref("model", "seq_length", spec.model.seq_length) + " tokens is " +
             std::to_string(t.micro_batch_size * spec.model.seq_length) +
             " tokens, more than the " + std::to_string(kMaxInt) +
             " that mt's kernels index",
         "lower micro_batch_size or seq_length so that their product is at most " +
             std::to_string(kMaxInt));
  if (!given("training", "global_batch_size"))
    t.global_batch_size = step;
  if (t.global_batch_size % step != 0)
    fail(at("training", "global_batch_size"),
         "global_batch_size = " + std::to_string(t.global_batch_size) +
             " is not a multiple of micro_batch_size * data_parallel_size = " +
             std::to_string(t.micro_batch_size) + " * " + std::to_string(dp) + " = " +
             std::to_string(step) + " (" +
             ref("training", "micro_batch_size", t.micro_batch_size) + ", " +
             ref("parallel", "data_parallel_size", dp) + ")",
         "use " + nearestMultiples("global_batch_size", t.global_batch_size, step));
  resolveLength(spec);
  // The schedule's keys in the unit training counts in: iterations, or
  // samples with train_samples (Megatron's scheduler counts samples either
  // way; mt's LR op takes the iteration form in iterations).
  const bool bySamples = t.sampleBased();
  const char *decayKey = bySamples ? "lr_decay_samples" : "lr_decay_iters";
  const char *warmupKey = bySamples ? "lr_warmup_samples" : "lr_warmup_iters";
  const char *wsdKey = bySamples ? "lr_wsd_decay_samples" : "lr_wsd_decay_iters";
  int64_t &decay = bySamples ? t.lr_decay_samples : t.lr_decay_iters;
  int64_t &warmup = bySamples ? t.lr_warmup_samples : t.lr_warmup_iters;
  int64_t &wsdDecay = bySamples ? t.lr_wsd_decay_samples : t.lr_wsd_decay_iters;
  const std::string w = warmupKey, d = decayKey, wk = wsdKey;
  if (!given("training", decayKey))
    decay = bySamples ? t.train_samples : t.train_iters;
  if (const Entry *f = given("training", "lr_warmup_fraction")) {
    if (const Entry *we = given("training", warmupKey))
      fail(f->valueLoc,
           "lr_warmup_fraction and " + w + " (" + we->valueLoc.str() +
               ") are mutually exclusive",
           "keep one of them");
    double fraction = *f->value->value<double>();
    warmup = static_cast<int64_t>(std::floor(fraction * static_cast<double>(decay)));
  }
  // Megatron's OptimizerParamScheduler asserts warmup < decay.
  if (warmup >= decay) {
    const Entry *fraction = given("training", "lr_warmup_fraction");
    const std::string warm = w + " = " + std::to_string(warmup);
    fail(at("training", fraction ? "lr_warmup_fraction" : warmupKey),
         (fraction ? "lr_warmup_fraction resolves to " + warm + ", which" : warm) +
             (warmup > decay ? " exceeds " : " leaves no decay after ") +
             ref("training", decayKey, decay),
         fraction ? "use lr_warmup_fraction < 1, or raise " + d
                  : "use " + w + " < " + std::to_string(decay) + ", or raise " + d);
  }
  // WSD: Megatron's scheduler asserts the anneal's length; mt also keeps
  // the anneal after the warmup, where Megatron would jump to it.
  const bool wsd = t.lr_decay_style == LrDecayStyle::WSD;
  for (const char *k : {"lr_wsd_decay_style", "lr_wsd_decay_iters", "lr_wsd_decay_samples"})
    if (!wsd && given("training", k))
      fail(at("training", k),
           std::string(k) + " only applies with lr_decay_style = \"WSD\", but " +
               ref("training", "lr_decay_style", quote(toString(t.lr_decay_style))),
           "set lr_decay_style = \"WSD\", or remove " + std::string(k));
  if (wsd && !given("training", wsdKey))
    fail(at("training", "lr_decay_style"),
         "lr_decay_style = \"WSD\" needs " + wk + ", the length of its anneal to min_lr",
         "add " + wk + " = N (for example " +
             std::to_string(std::max<int64_t>(1, (decay - warmup) / 10)) +
             ", a tenth of the decay)");
  if (wsd && wsdDecay > decay - warmup)
    fail(at("training", wsdKey),
         wk + " = " + std::to_string(wsdDecay) + " starts the anneal before the warmup ends (" +
             ref("training", decayKey, decay) + ", " + w + " = " + std::to_string(warmup) + ")",
         "use " + wk + " <= " + std::to_string(decay - warmup));
  if (t.min_lr > t.lr)
    fail(at("training", "min_lr"),
         "min_lr = " + formatNumber(t.min_lr) + " exceeds " +
             ref("training", "lr", formatNumber(t.lr)),
         "the schedule decays from lr down to min_lr: use min_lr <= " + formatNumber(t.lr));
  // Megatron's decoupled learning rate: its own peak and floor on lr's schedule.
  if (given("training", "decoupled_min_lr") && !given("training", "decoupled_lr"))
    fail(at("training", "decoupled_min_lr"),
         "decoupled_min_lr only applies with decoupled_lr (Megatron ignores it alone)",
         "set decoupled_lr (--decoupled-lr), or remove decoupled_min_lr");
  if (given("training", "decoupled_lr")) {
    const bool ownFloor = given("training", "decoupled_min_lr");
    const double floor = ownFloor ? t.decoupled_min_lr : t.min_lr;
    if (floor > t.decoupled_lr)
      fail(at("training", ownFloor ? "decoupled_min_lr" : "decoupled_lr"),
           std::string(ownFloor ? "decoupled_min_lr = " : "the decoupled schedule's floor, min_lr = ") +
               formatNumber(floor) + " exceeds " +
               ref("training", "decoupled_lr", formatNumber(t.decoupled_lr)),
           ownFloor ? "use decoupled_min_lr <= " + formatNumber(t.decoupled_lr)
                    : "set decoupled_min_lr <= " + formatNumber(t.decoupled_lr) +
                          " (--decoupled-min-lr), or raise decoupled_lr");
    if (!ownFloor)
      t.decoupled_min_lr = t.min_lr;
  }
  // Each optimizer's own keys; Megatron ignores the other's, mt says so.
  if (t.optimizer == Optimizer::SGD) {
    for (const char *k : {"adam_beta1", "adam_beta2", "adam_eps"})
      if (given("training", k))
        fail(at("training", k),
             std::string(k) + " only applies with optimizer = \"adam\", but " +
                 ref("training", "optimizer", quote(toString(t.optimizer))),
             std::string("remove ") + k + ", or use optimizer = \"adam\"");
  } else if (given("training", "sgd_momentum")) {
    fail(at("training", "sgd_momentum"),
         "sgd_momentum only applies with optimizer = \"sgd\", but " +
             ref("training", "optimizer", quote(toString(t.optimizer))),
         "remove sgd_momentum, or set optimizer = \"sgd\" (Megatron's --optimizer sgd)");
  }
  if (t.precision != Precision::FP16)
    for (const char *k :
         {"initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"})
      if (given("training", k))
        fail(at("training", k),
             std::string(k) +
                 " only applies with precision = \"fp16\" (dynamic loss "
                 "scaling), but " +
                 ref("training", "precision", quote(toString(t.precision))),
             std::string("remove ") + k + ", or set precision = \"fp16\"");
  // Megatron reads --grad-reduce-in-bf16 only with --bf16 (the gradient
  // buffer takes the parameters' type); with fp32 or fp16 parameters it
  // would silently do nothing, so the key is refused there.
  if (t.grad_reduce_in_bf16 && t.precision != Precision::BF16)
    fail(at("training", "grad_reduce_in_bf16"),
         "grad_reduce_in_bf16 = true only applies with precision = \"bf16\" (bf16 gradient "
         "buffers for bf16 parameters), but " +
             ref("training", "precision", quote(toString(t.precision))),
         "remove grad_reduce_in_bf16, or set precision = \"bf16\"");
  // Megatron turns the NaN check off under dynamic loss scaling: there a
  // NaN or Inf is the scaler's signal to skip the step and lower the scale.
  if (t.precision == Precision::FP16) {
    if (const Entry *e = given("training", "check_for_nan_in_loss_and_grad");
        e && t.check_for_nan_in_loss_and_grad)
      fail(e->valueLoc,
           "check_for_nan_in_loss_and_grad = true cannot apply with precision = \"fp16\": "
           "its dynamic loss scaling skips a step whose gradients overflow (counted as a "
           "skipped iteration) instead of stopping",
           "remove check_for_nan_in_loss_and_grad, or use precision = \"bf16\" or \"fp32\"");
    t.check_for_nan_in_loss_and_grad = false;
  }
}

void Parser::checkData(Spec &spec) {
  const DataConfig &d = spec.data;
  if (d.mock_data && !d.data_path.empty())
    fail(at("data", "mock_data"),
         "mock_data = true and data_path (" + at("data", "data_path").str() +
             ") are mutually exclusive",
         "remove data_path to train on synthetic tokens, or mock_data to read the dataset");
}

void Parser::resolveCluster(Spec &spec) {
  ClusterConfig &c = spec.cluster;
  const ParallelConfig &p = spec.parallel;
  if (static_cast<double>(p.tensor_model_parallel_size) *
          static_cast<double>(p.pipeline_model_parallel_size) *
          static_cast<double>(p.data_parallel_size) >
      static_cast<double>(kMaxInt))
    fail(at("parallel", "data_parallel_size"),
         "the world size tensor_model_parallel_size * pipeline_model_parallel_size * "
         "data_parallel_size is larger than " +
             std::to_string(kMaxInt) + " GPUs",
         "use smaller parallel sizes");
  const int64_t world = spec.worldSize();
  const std::string worldText =
      "tensor_model_parallel_size * pipeline_model_parallel_size * data_parallel_size = " +
      std::to_string(p.tensor_model_parallel_size) + " * " +
      std::to_string(p.pipeline_model_parallel_size) + " * " +
      std::to_string(p.data_parallel_size) + " = " + std::to_string(world);
  if (!given("cluster", "gpus_per_node")) {
    if (world % c.nodes != 0)
      fail(at("cluster", "nodes"),
           "the world size " + worldText +
               " GPUs does not split evenly over nodes = " + std::to_string(c.nodes),
           "set gpus_per_node, or use a number of nodes dividing " + std::to_string(world));
    c.gpus_per_node = world / c.nodes;
  }
  if (c.nodes * c.gpus_per_node != world) {
    std::string fix;
    int64_t gpus = c.nodes * c.gpus_per_node;
    int64_t tpp = p.tensor_model_parallel_size * p.pipeline_model_parallel_size;
    if (gpus % tpp == 0)
      fix = "set data_parallel_size = " + std::to_string(gpus / tpp) + " to use all " +
            std::to_string(gpus) + " GPUs, or change nodes and gpus_per_node to give " +
            std::to_string(world) + " GPUs";
    else
      fix = "change nodes and gpus_per_node to give " + std::to_string(world) + " GPUs";
    fail(given("cluster", "gpus_per_node") ? at("cluster", "gpus_per_node")
                                           : at("cluster", "nodes"),
         "the world size " + worldText + " GPUs does not match nodes * gpus_per_node = " +
             std::to_string(c.nodes) + " * " + std::to_string(c.gpus_per_node) + " = " +
             std::to_string(gpus) + " (" + ref("cluster", "nodes", c.nodes) + ", " +
             ref("cluster", "gpus_per_node", c.gpus_per_node) + ")",
         fix);
  }
}

} // namespace mt::spec::detail
