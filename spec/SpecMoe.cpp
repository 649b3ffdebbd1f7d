// The mixture-of-experts keys: moe_layer_freq in each of Megatron's forms,
// Megatron-Core's rules between the MoE keys (megatron/training/arguments.py,
// megatron/core/transformer/transformer_config.py), and what mt refuses
// because it does not implement it yet.
#include <cctype>
#include <sstream>
#include <string>

#include "spec/Spec.h"
#include "spec/SpecParserImpl.h"

namespace mt::spec::detail {

//===----------------------------------------------------------------------===//
// --moe-layer-freq's list expressions
//===----------------------------------------------------------------------===//

namespace {

// Megatron evaluates the string with Python's eval() after allowing only
// digits, ',', '[', ']', '(', ')', '+' and '*' (arguments.py, _eval_pattern).
// What those characters can spell that yields a list of layer flags:
// integers, list displays, '+' (concatenation, or addition of integers), '*'
// (repetition, or multiplication of integers) and parentheses.
class PatternEval {
public:
  explicit PatternEval(const std::string &text) : s(text) {}

  bool run(LayerPattern *out, std::string *err) {
    Value v;
    if (!expr(v) || (skip(), pos != s.size() && !fail("unexpected '" + std::string(1, s[pos]) + "'"))) {
      *err = error;
      return false;
    }
    out->isInt = !v.isList;
    out->value = v.i;
    out->list = std::move(v.list);
    return true;
  }

private:
  struct Value {
    bool isList = false;
    int64_t i = 0;
    std::vector<int64_t> list;
  };
  // Bounds that keep a hostile expression from exhausting memory; a real
  // pattern has one entry per layer (at most 10000).
  static constexpr size_t kMaxList = 1000000;
  static constexpr int64_t kMaxInt = 1000000000;

  const std::string &s;
  size_t pos = 0;
  std::string error;

  bool fail(const std::string &what) {
    if (error.empty())
      error = "at character " + std::to_string(std::min(pos, s.size()) + 1) + ": " + what;
    return false;
  }
  void skip() {
    while (pos < s.size() && (s[pos] == ' ' || s[pos] == '\t'))
      ++pos;
  }
  bool peek(char c) {
    skip();
    return pos < s.size() && s[pos] == c;
  }

  bool expr(Value &v) {
    if (!term(v))
      return false;
    while (peek('+')) {
      ++pos;
      Value r;
      if (!term(r))
        return false;
      if (v.isList != r.isList)
        return fail("'+' joins two lists or adds two integers, not a list and an integer");
      if (v.isList) {
        if (v.list.size() + r.list.size() > kMaxList)
          return fail("the list grows past " + std::to_string(kMaxList) + " entries");
        v.list.insert(v.list.end(), r.list.begin(), r.list.end());
      } else {
        v.i += r.i;
        if (v.i > kMaxInt)
          return fail("an integer past " + std::to_string(kMaxInt));
      }
    }
    return true;
  }

  bool term(Value &v) {
    if (!atom(v))
      return false;
    while (peek('*')) {
      ++pos;
      Value r;
      if (!atom(r))
        return false;
      if (v.isList && r.isList)
        return fail("'*' repeats a list an integer number of times; it cannot multiply two lists");
      if (!v.isList && !r.isList) {
        v.i *= r.i;
        if (v.i > kMaxInt)
          return fail("an integer past " + std::to_string(kMaxInt));
        continue;
      }
      Value &list = v.isList ? v : r;
      const int64_t n = v.isList ? r.i : v.i;
      std::vector<int64_t> out;
      if (n > 0) {
        if (list.list.size() * size_t(n) > kMaxList)
          return fail("the list grows past " + std::to_string(kMaxList) + " entries");
        for (int64_t k = 0; k < n; ++k)
          out.insert(out.end(), list.list.begin(), list.list.end());
      }
      v.isList = true;
      v.list = std::move(out);
    }
    return true;
  }

  bool atom(Value &v) {
    skip();
    if (pos >= s.size())
      return fail("the expression ends where a number, '[' or '(' was expected");
    const char c = s[pos];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t start = pos;
      int64_t n = 0;
      while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) {
        n = n * 10 + (s[pos] - '0');
        if (n > kMaxInt)
          return fail("an integer past " + std::to_string(kMaxInt));
        ++pos;
      }
      if (s[start] == '0' && pos - start > 1 && n != 0) {
        pos = start;
        return fail("a number with a leading zero (Python refuses it)");
      }
      v.isList = false;
      v.i = n;
    } else if (c == '[') {
      ++pos;
      v.isList = true;
      v.list.clear();
      if (peek(']')) {
        ++pos;
      } else {
        for (;;) {
          Value item;
          if (!expr(item))
            return false;
          if (item.isList)
            return fail("a list inside the list; each entry is 0 or 1");
          v.list.push_back(item.i);
          if (v.list.size() > kMaxList)
            return fail("the list grows past " + std::to_string(kMaxList) + " entries");
          if (peek(',')) {
            ++pos;
            if (peek(']')) {
              ++pos;
              break;
            }
            continue;
          }
          if (peek(']')) {
            ++pos;
            break;
          }
          return fail(pos < s.size() ? "expected ',' or ']'"
                                     : "the expression ends inside a list (missing ']')");
        }
      }
    } else if (c == '(') {
      ++pos;
      if (!expr(v))
        return false;
      if (peek(','))
        return fail("a tuple, which is not a list; write [...]");
      if (!peek(')'))
        return fail(pos < s.size() ? "expected ')'" : "the expression ends before ')'");
      ++pos;
    } else {
      return fail("unexpected '" + std::string(1, c) + "' where a number, '[' or '(' was expected");
    }
    if (peek('['))
      return fail("indexing ('[' after a value) is not a layer pattern");
    return true;
  }
};

bool isDigits(const std::string &s) {
  if (s.empty())
    return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return false;
  return true;
}

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

const char *kPatternForms =
    "write an integer N (every Nth layer, from layer 0), a list expression such as "
    "\"([1]*3+[0]*1)*3\" or \"[0]+[1]*23\", or an array of 0/1 with one entry per layer";

} // namespace

bool evalLayerPattern(const std::string &text, LayerPattern *out, std::string *err) {
  return PatternEval(text).run(out, err);
}

// The value's form, as soon as it is read; its length against num_layers is
// resolveMoe's.
void Parser::checkLayerPattern(const Entry &e) {
  const toml::node &v = *e.value;
  const std::string name = std::string(e.info->section) + "." + e.info->name;
  if (v.is_integer()) {
    checkRange(e, name, static_cast<double>(*v.value_exact<int64_t>()));
    return;
  }
  if (const toml::array *a = v.as_array()) {
    if (a->empty())
      fail(e.valueLoc, name + " is an empty array", kPatternForms);
    for (const toml::node &item : *a) {
      auto i = item.value_exact<int64_t>();
      if (!i || (*i != 0 && *i != 1))
        fail(locOf(item.source(), e.valueLoc.file),
             name + " entries must be 0 (dense layer) or 1 (MoE layer), got " + got(item),
             kPatternForms);
    }
    return;
  }
  if (!v.is_string())
    fail(e.valueLoc, name + " must be an integer, a list expression string or an array, got " +
                         got(v),
         kPatternForms);
  const std::string text = trim(*v.value_exact<std::string>());
  if (text.find('[') == std::string::npos) {
    // Megatron's int(x): a number in a string.
    if (!isDigits(text) || text.size() > 9 || std::stoll(text) < 1)
      fail(e.valueLoc,
           name + " " + quote(text) + " is neither a positive integer nor a list expression",
           kPatternForms);
    return;
  }
  LayerPattern p;
  std::string err;
  if (!evalLayerPattern(text, &p, &err))
    fail(e.valueLoc, name + " " + quote(text) + " is not a layer pattern (" + err + ")",
         kPatternForms);
  for (size_t i = 0; i < p.list.size(); ++i)
    if (p.list[i] != 0 && p.list[i] != 1)
      fail(e.valueLoc,
           name + " " + quote(text) + " gives " + std::to_string(p.list[i]) + " for layer " +
               std::to_string(i) + "; each entry is 0 (dense) or 1 (MoE)",
           kPatternForms);
}

//===----------------------------------------------------------------------===//
// Megatron's rules
//===----------------------------------------------------------------------===//

namespace {

// [model] keys that only mean something with experts.
const char *const kMoeModelKeys[] = {
    "moe_ffn_hidden_size",      "moe_router_topk",
    "moe_router_load_balancing_type", "moe_aux_loss_coeff",
    "moe_z_loss_coeff",         "moe_router_score_function",
    "moe_router_pre_softmax",   "moe_router_topk_scaling_factor",
    "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
    "moe_token_drop_policy",    "moe_layer_freq",
    "moe_shared_expert_intermediate_size", "moe_grouped_gemm",
    "moe_router_dtype",
};

} // namespace

void Parser::resolveMoe(Spec &spec) {
  ModelConfig &m = spec.model;
  const std::string expertsRef = ref("model", "num_experts", m.num_experts);
  if (m.num_experts == 0) {
    // Megatron asserts this for moe_ffn_hidden_size and ignores the rest;
    // mt says so instead of accepting keys without effect.
    for (const char *k : kMoeModelKeys)
      if (given("model", k))
        fail(at("model", k),
             std::string(k) + " only applies to mixture-of-experts layers, but the model is "
                 "dense: " + expertsRef,
             "set num_experts (Megatron's --num-experts), or remove " + std::string(k));
    m.moe_layers.clear();
    return;
  }
  // Megatron allows biases with one expert-tensor-parallel rank; mt's
  // experts and router have none, as in every Megatron MoE example.
  if (m.add_bias_linear)
    fail(given("model", "add_bias_linear") ? at("model", "add_bias_linear")
                                           : at("model", "num_experts"),
         "num_experts = " + std::to_string(m.num_experts) +
             " needs add_bias_linear = false (mt's mixture-of-experts layers have no "
             "biases), but " +
             ref("model", "add_bias_linear", "true"),
         "set add_bias_linear = false (Megatron's --disable-bias-linear, as in Megatron's MoE "
         "examples)");
  if (!given("model", "moe_ffn_hidden_size"))
    m.moe_ffn_hidden_size = m.ffn_hidden_size;
  if (m.moe_router_topk > m.num_experts)
    fail(at("model", given("model", "moe_router_topk") ? "moe_router_topk" : "num_experts"),
         "moe_router_topk = " + std::to_string(m.moe_router_topk) +
             " routes each token to more experts than the layer has: " + expertsRef,
         "use moe_router_topk <= " + std::to_string(m.num_experts));
  const bool softmax = m.moe_router_score_function == MoeScoreFunction::Softmax;
  if (m.moe_router_topk == 1 && softmax && !m.moe_router_pre_softmax)
    fail(at("model", given("model", "moe_router_topk") ? "moe_router_topk" : "num_experts"),
         "moe_router_topk = 1 with the softmax score function needs moe_router_pre_softmax = "
         "true: a softmax over the one chosen logit is 1 and has no gradient (Megatron "
         "refuses it too)",
         "set moe_router_pre_softmax = true, or moe_router_topk >= 2");
  if (m.moe_router_pre_softmax && !softmax)
    fail(at("model", "moe_router_pre_softmax"),
         "moe_router_pre_softmax only applies with the softmax score function (Megatron "
         "ignores it otherwise), but " +
             ref("model", "moe_router_score_function",
                 quote(toString(m.moe_router_score_function))),
         "remove moe_router_pre_softmax, or use moe_router_score_function = \"softmax\"");
  const bool capacity = m.moe_expert_capacity_factor > 0;
  if (m.moe_pad_expert_input_to_capacity && !capacity)
    fail(at("model", "moe_pad_expert_input_to_capacity"),
         "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor, which is not "
         "set: without a capacity there is nothing to pad to (Megatron refuses it too)",
         "set moe_expert_capacity_factor (e.g. 1.0), or remove "
         "moe_pad_expert_input_to_capacity");
  if (given("model", "moe_token_drop_policy") && !capacity)
    fail(at("model", "moe_token_drop_policy"),
         "moe_token_drop_policy only applies with moe_expert_capacity_factor, which is not "
         "set: without a capacity no token is dropped",
         "set moe_expert_capacity_factor, or remove moe_token_drop_policy");

  // moe_layer_freq, as megatron/core/models/gpt/gpt_layer_specs.py reads it.
  m.moe_layers.assign(size_t(m.num_layers), false);
  const Entry *freq = given("model", "moe_layer_freq");
  std::vector<int64_t> list;
  int64_t every = 1;
  bool isList = false;
  std::string shown = "1 (default)";
  if (freq && freq->value->is_integer()) {
    every = *freq->value->value_exact<int64_t>();
    shown = std::to_string(every);
  } else if (freq && freq->value->is_array()) {
    isList = true;
    for (const toml::node &item : *freq->value->as_array())
      list.push_back(*item.value_exact<int64_t>());
    shown = "(an array)";
  } else if (freq) {
    const std::string text = trim(*freq->value->value_exact<std::string>());
    shown = quote(text);
    if (text.find('[') == std::string::npos) {
      every = std::stoll(text);
    } else {
      isList = true;
      LayerPattern p;
      std::string err;
      evalLayerPattern(text, &p, &err); // its form was checked when read
      list = p.list;
    }
  }
  if (isList) {
    if (int64_t(list.size()) != m.num_layers)
      fail(freq->valueLoc,
           "moe_layer_freq " + shown + " gives " + std::to_string(list.size()) +
               " layers, but " + ref("model", "num_layers", m.num_layers),
           "give one entry per layer (1: MoE, 0: dense), e.g. \"[1]*" +
               std::to_string(m.num_layers) + "\"");
    for (size_t i = 0; i < list.size(); ++i)
      m.moe_layers[i] = list[i] == 1;
  } else {
    for (int64_t i = 0; i < m.num_layers; ++i)
      m.moe_layers[size_t(i)] = i % every == 0;
  }
  if (m.numMoeLayers() == 0)
    fail(at("model", "moe_layer_freq"),
         "moe_layer_freq " + shown + " makes no layer a mixture-of-experts layer, but " +
             expertsRef,
         "mark at least one layer with 1, or remove num_experts and the moe_* keys for a "
         "dense model");
}

void Parser::checkMoeParallel(Spec &spec) {
  const ModelConfig &m = spec.model;
  ParallelConfig &p = spec.parallel;
  const int64_t tp = p.tensor_model_parallel_size, ep = p.expert_model_parallel_size;
  if (!given("parallel", "expert_tensor_parallel_size"))
    p.expert_tensor_parallel_size = tp;
  const std::string expertsRef = ref("model", "num_experts", m.num_experts);
  if (m.num_experts == 0) {
    if (ep > 1)
      fail(at("parallel", "expert_model_parallel_size"),
           "expert_model_parallel_size = " + std::to_string(ep) +
               " splits experts, but the model has none (Megatron refuses it too): " +
               expertsRef,
           "set num_experts, or remove expert_model_parallel_size");
    for (const char *k : {"expert_tensor_parallel_size", "moe_token_dispatcher_type",
                          "moe_dispatch_buffer_factor"})
      if (given("parallel", k))
        fail(at("parallel", k),
             std::string(k) + " only applies to mixture-of-experts layers, but the model is "
                 "dense: " + expertsRef,
             "set num_experts, or remove " + std::string(k));
    return;
  }
  const int64_t etp = p.expert_tensor_parallel_size;
  if (m.num_experts % ep != 0)
    fail(at("parallel", "expert_model_parallel_size"),
         expertsRef + " is not divisible by expert_model_parallel_size = " +
             std::to_string(ep),
         "each expert-parallel rank holds the same number of experts: use an "
         "expert_model_parallel_size dividing " +
             std::to_string(m.num_experts));
  // Megatron's initialize_model_parallel: the expert layout (etp x ep x
  // expert data parallel) covers each pipeline stage's tp x dp GPUs.
  const int64_t stageGpus = tp * p.data_parallel_size;
  if (stageGpus % (ep * etp) != 0)
    fail(at("parallel", ep == 1 && given("parallel", "expert_tensor_parallel_size")
                            ? "expert_tensor_parallel_size"
                            : "expert_model_parallel_size"),
         "expert_model_parallel_size * expert_tensor_parallel_size = " + std::to_string(ep) +
             " * " + std::to_string(etp) + " does not divide the " + std::to_string(stageGpus) +
             " GPUs of each pipeline stage (tensor_model_parallel_size * data_parallel_size = " +
             std::to_string(tp) + " * " + std::to_string(p.data_parallel_size) + ")",
         "use expert parallel sizes whose product divides " + std::to_string(stageGpus) +
             ", or more data parallelism");
  const bool etpGiven = given("parallel", "expert_tensor_parallel_size");
  if (m.moe_ffn_hidden_size % etp != 0)
    fail(at("parallel", etpGiven ? "expert_tensor_parallel_size" : "tensor_model_parallel_size"),
         ref("model", "moe_ffn_hidden_size", m.moe_ffn_hidden_size) +
             " is not divisible by expert_tensor_parallel_size = " + std::to_string(etp) +
             (etpGiven ? "" : " (its default, Megatron's: tensor_model_parallel_size)"),
         "each expert's MLP is split evenly over expert-tensor-parallel ranks: use an "
         "expert_tensor_parallel_size dividing " +
             std::to_string(m.moe_ffn_hidden_size));
  // Megatron's MoELayer refuses to train with tensor parallelism but no
  // sequence parallelism (moe_layer.py).
  if (tp > 1 && !p.sequence_parallel)
    fail(at("parallel", "tensor_model_parallel_size"),
         "tensor_model_parallel_size = " + std::to_string(tp) + " with " + expertsRef +
             " needs sequence_parallel = true (Megatron refuses to train mixture-of-experts "
             "layers tensor-parallel without sequence parallelism), but " +
             ref("parallel", "sequence_parallel", p.sequence_parallel ? "true" : "false"),
         "set sequence_parallel = true in [parallel], or tensor_model_parallel_size = 1");
  // mt's receive-row bound (no Megatron flag): only where there is an
  // exchange to bound and no capacity sizing it already.
  if (const Entry *f = given("parallel", "moe_dispatch_buffer_factor")) {
    if (ep * etp == 1)
      fail(f->valueLoc,
           "moe_dispatch_buffer_factor bounds the rows each rank receives from the token "
           "exchange between expert-parallel ranks, but " +
               ref("parallel", "expert_model_parallel_size", ep) +
               ": every rank computes its own tokens' experts and exchanges none",
           "remove moe_dispatch_buffer_factor, or set expert_model_parallel_size > 1");
    else if (m.moe_expert_capacity_factor > 0)
      fail(f->valueLoc,
           "moe_dispatch_buffer_factor bounds the receive rows of dropless routing, but " +
               ref("model", "moe_expert_capacity_factor",
                   (std::ostringstream() << m.moe_expert_capacity_factor).str()) +
               " sizes them already (by capacity, dropping what does not fit)",
           "remove moe_dispatch_buffer_factor, or moe_expert_capacity_factor for dropless "
           "routing");
  }
  if (m.moe_shared_expert_intermediate_size % tp != 0)
    fail(at("parallel", "tensor_model_parallel_size"),
         ref("model", "moe_shared_expert_intermediate_size",
             m.moe_shared_expert_intermediate_size) +
             " is not divisible by tensor_model_parallel_size = " + std::to_string(tp),
         "the shared expert is split evenly over tensor-parallel ranks: use a multiple of " +
             std::to_string(tp));
}

} // namespace mt::spec::detail
