// Spec parsing: defaults, enums, overrides, data_path forms, padding,
// did-you-mean, the key table, errors and the toToml round trip.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "spec/Spec.h"
#include "spec/SpecKeys.h"

namespace mt::spec {
namespace {

const char *kBase = R"([model]
num_layers = 12
hidden_size = 768
num_attention_heads = 12
seq_length = 1024
vocab_size = 50257

[training]
micro_batch_size = 4
train_iters = 1000
lr = 6e-4
)";

absl::StatusOr<Spec> parse(const std::string &text, std::vector<Override> overrides = {}) {
  return parseSpecString(text, "spec.toml", overrides);
}

Spec parseOk(const std::string &text, std::vector<Override> overrides = {}) {
  auto s = parse(text, std::move(overrides));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Spec{};
}

std::string parseError(const std::string &text, std::vector<Override> overrides = {}) {
  auto s = parse(text, std::move(overrides));
  EXPECT_FALSE(s.ok());
  if (s.ok())
    return "";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  std::string msg(s.status().message());
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  return msg;
}

void expectSameSpec(const Spec &a, const Spec &b) {
#define SAME(field) EXPECT_EQ(a.field, b.field) << #field
  SAME(model.num_layers);
  SAME(model.hidden_size);
  SAME(model.ffn_hidden_size);
  SAME(model.num_attention_heads);
  SAME(model.num_query_groups);
  SAME(model.kv_channels);
  SAME(model.seq_length);
  SAME(model.max_position_embeddings);
  SAME(model.vocab_size);
  SAME(model.make_vocab_size_divisible_by);
  SAME(model.position_embedding_type);
  SAME(model.rotary_base);
  SAME(model.normalization);
  SAME(model.norm_epsilon);
  SAME(model.swiglu);
  SAME(model.untie_embeddings_and_output_weights);
  SAME(model.add_bias_linear);
  SAME(model.hidden_dropout);
  SAME(model.attention_dropout);
  SAME(model.init_method_std);
  SAME(parallel.tensor_model_parallel_size);
  SAME(parallel.pipeline_model_parallel_size);
  SAME(parallel.data_parallel_size);
  SAME(parallel.virtual_pipeline_model_parallel_size);
  SAME(parallel.sequence_parallel);
  SAME(parallel.use_distributed_optimizer);
  SAME(parallel.overlap_grad_reduce);
  SAME(parallel.overlap_param_gather);
  SAME(parallel.ddp_bucket_size);
  SAME(parallel.recompute_granularity);
  SAME(parallel.recompute_method);
  SAME(parallel.recompute_num_layers);
  SAME(training.micro_batch_size);
  SAME(training.global_batch_size);
  SAME(training.train_iters);
  SAME(training.lr);
  SAME(training.min_lr);
  SAME(training.lr_decay_style);
  SAME(training.lr_decay_iters);
  SAME(training.lr_warmup_iters);
  SAME(training.lr_wsd_decay_style);
  SAME(training.lr_wsd_decay_iters);
  SAME(training.train_samples);
  SAME(training.lr_decay_samples);
  SAME(training.lr_warmup_samples);
  SAME(training.lr_wsd_decay_samples);
  SAME(training.rampup_batch_size);
  SAME(training.weight_decay);
  SAME(training.adam_beta1);
  SAME(training.adam_beta2);
  SAME(training.adam_eps);
  SAME(training.clip_grad);
  SAME(training.precision);
  SAME(training.initial_loss_scale);
  SAME(training.min_loss_scale);
  SAME(training.loss_scale_window);
  SAME(training.hysteresis);
  SAME(training.seed);
  SAME(training.log_interval);
  SAME(training.eval_interval);
  SAME(training.eval_iters);
  SAME(training.save_interval);
  SAME(training.save);
  SAME(training.load);
  SAME(training.ckpt_step);
  SAME(training.finetune);
  SAME(training.load_optim);
  SAME(training.load_rng);
  SAME(training.save_optim);
  SAME(training.save_rng);
  SAME(data.data_path);
  SAME(data.split);
  SAME(data.tokenizer_type);
  SAME(data.vocab_file);
  SAME(data.merge_file);
  SAME(data.tokenizer_model);
  SAME(data.tokenizer_special_tokens);
  SAME(data.tiktoken_pattern);
  SAME(data.tiktoken_num_special_tokens);
  SAME(data.tiktoken_special_tokens);
  SAME(data.tokenizer_sentencepiece_legacy);
  SAME(data.tokenizer_hf_include_special_tokens);
  SAME(data.legacy_tokenizer);
  SAME(data.mock_data);
  SAME(data.eod_id);
  SAME(data.tokenizer);
  SAME(data.tokenizer_unread);
  SAME(cluster.device);
  SAME(cluster.device_memory_bytes);
  SAME(cluster.gpus_per_node);
  SAME(cluster.nodes);
#undef SAME
}

void expectRoundTrip(const std::string &text, std::vector<Override> overrides = {}) {
  Spec a = parseOk(text, std::move(overrides));
  std::string echo = toToml(a);
  auto b = parseSpecString(echo, "echo.toml");
  ASSERT_TRUE(b.ok()) << b.status() << "\n" << echo;
  expectSameSpec(a, *b);
  EXPECT_EQ(toToml(*b), toToml(Spec(*b))) << "toToml is deterministic";
}

// ----- enums -----

TEST(Spec, EnumSpellings) {
  EXPECT_STREQ(toString(PositionEmbedding::LearnedAbsolute), "learned_absolute");
  EXPECT_STREQ(toString(PositionEmbedding::Rope), "rope");
  EXPECT_STREQ(toString(Normalization::LayerNorm), "LayerNorm");
  EXPECT_STREQ(toString(Normalization::RMSNorm), "RMSNorm");
  EXPECT_STREQ(toString(Precision::FP32), "fp32");
  EXPECT_STREQ(toString(Precision::FP16), "fp16");
  EXPECT_STREQ(toString(Precision::BF16), "bf16");
  EXPECT_STREQ(toString(LrDecayStyle::Constant), "constant");
  EXPECT_STREQ(toString(LrDecayStyle::Linear), "linear");
  EXPECT_STREQ(toString(LrDecayStyle::Cosine), "cosine");
  EXPECT_STREQ(toString(LrDecayStyle::InverseSquareRoot), "inverse-square-root");
  EXPECT_STREQ(toString(LrDecayStyle::WSD), "WSD");
  EXPECT_STREQ(toString(WsdDecayStyle::Exponential), "exponential");
  EXPECT_STREQ(toString(WsdDecayStyle::Linear), "linear");
  EXPECT_STREQ(toString(WsdDecayStyle::Cosine), "cosine");
  EXPECT_STREQ(toString(WsdDecayStyle::MinusSqrt), "minus_sqrt");
  EXPECT_STREQ(toString(RecomputeGranularity::None), "none");
  EXPECT_STREQ(toString(RecomputeGranularity::Selective), "selective");
  EXPECT_STREQ(toString(RecomputeGranularity::Full), "full");
  EXPECT_STREQ(toString(RecomputeMethod::None), "none");
  EXPECT_STREQ(toString(RecomputeMethod::Uniform), "uniform");
  EXPECT_STREQ(toString(RecomputeMethod::Block), "block");
}

TEST(Spec, ParsesEveryEnumValue) {
  for (auto v : {PositionEmbedding::LearnedAbsolute, PositionEmbedding::Rope})
    EXPECT_EQ(parseOk(kBase, {{std::string("model.position_embedding_type=") + toString(v)}})
                  .model.position_embedding_type,
              v);
  for (auto v : {Normalization::LayerNorm, Normalization::RMSNorm})
    EXPECT_EQ(
        parseOk(kBase, {{std::string("model.normalization=") + toString(v)}}).model.normalization,
        v);
  for (auto v : {Precision::FP32, Precision::FP16, Precision::BF16})
    EXPECT_EQ(parseOk(kBase, {{std::string("training.precision=\"") + toString(v) + "\""}})
                  .training.precision,
              v);
  for (auto v : {LrDecayStyle::Constant, LrDecayStyle::Linear, LrDecayStyle::Cosine})
    EXPECT_EQ(parseOk(kBase, {{std::string("training.lr_decay_style=") + toString(v)}})
                  .training.lr_decay_style,
              v);
  EXPECT_EQ(parseOk(kBase, {{"training.lr_decay_style=\"inverse-square-root\""}})
                .training.lr_decay_style,
            LrDecayStyle::InverseSquareRoot);
  for (auto v : {WsdDecayStyle::Exponential, WsdDecayStyle::Linear, WsdDecayStyle::Cosine,
                 WsdDecayStyle::MinusSqrt}) {
    Spec s = parseOk(kBase, {{"training.lr_decay_style=\"WSD\""},
                             {"training.lr_wsd_decay_iters=5"},
                             {std::string("training.lr_wsd_decay_style=\"") + toString(v) + "\""}});
    EXPECT_EQ(s.training.lr_decay_style, LrDecayStyle::WSD);
    EXPECT_EQ(s.training.lr_wsd_decay_style, v);
    EXPECT_EQ(s.training.lr_wsd_decay_iters, 5);
  }
  Spec sel = parseOk(kBase, {{"parallel.recompute_granularity=selective"}});
  EXPECT_EQ(sel.parallel.recompute_granularity, RecomputeGranularity::Selective);
  EXPECT_EQ(sel.parallel.recompute_method, RecomputeMethod::None);
  for (auto v : {RecomputeMethod::Uniform, RecomputeMethod::Block}) {
    Spec s = parseOk(kBase, {{"parallel.recompute_granularity=full"},
                             {std::string("parallel.recompute_method=") + toString(v)},
                             {"parallel.recompute_num_layers=1"}});
    EXPECT_EQ(s.parallel.recompute_granularity, RecomputeGranularity::Full);
    EXPECT_EQ(s.parallel.recompute_method, v);
    EXPECT_EQ(s.parallel.recompute_num_layers, 1);
  }
}

TEST(Spec, BadEnumListsChoicesAndSuggests) {
  std::string msg = parseError(kBase, {{"model.normalization=\"rmsnorm\""}});
  EXPECT_NE(msg.find("must be one of \"LayerNorm\", \"RMSNorm\", got \"rmsnorm\""),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("did you mean \"RMSNorm\"?"), std::string::npos) << msg;
}

// ----- padding -----

TEST(Spec, PaddedVocabSize) {
  Spec s = parseOk(kBase);
  EXPECT_EQ(s.paddedVocabSize(), 50304);
  s.parallel.tensor_model_parallel_size = 8;
  EXPECT_EQ(s.paddedVocabSize(), 51200);
  s.parallel.tensor_model_parallel_size = 1;
  s.model.make_vocab_size_divisible_by = 1;
  EXPECT_EQ(s.paddedVocabSize(), 50257);
  s.model.vocab_size = 50304;
  s.model.make_vocab_size_divisible_by = 128;
  EXPECT_EQ(s.paddedVocabSize(), 50304) << "already a multiple";
}

// ----- defaults -----

TEST(Spec, DefaultsFollowMegatron) {
  Spec s = parseOk(kBase);
  EXPECT_EQ(s.source, "spec.toml");
  EXPECT_EQ(s.model.ffn_hidden_size, 4 * 768);
  EXPECT_EQ(s.model.kv_channels, 64);
  EXPECT_EQ(s.model.num_query_groups, 12);
  EXPECT_EQ(s.model.max_position_embeddings, 1024);
  EXPECT_EQ(s.model.make_vocab_size_divisible_by, 128);
  EXPECT_EQ(s.model.position_embedding_type, PositionEmbedding::LearnedAbsolute);
  EXPECT_EQ(s.model.normalization, Normalization::LayerNorm);
  EXPECT_DOUBLE_EQ(s.model.norm_epsilon, 1e-5);
  EXPECT_TRUE(s.model.add_bias_linear);
  EXPECT_DOUBLE_EQ(s.model.hidden_dropout, 0.1);
  EXPECT_EQ(s.parallel.tensor_model_parallel_size, 1);
  EXPECT_EQ(s.parallel.recompute_granularity, RecomputeGranularity::None);
  EXPECT_EQ(s.training.global_batch_size, 4);
  EXPECT_EQ(s.training.lr_decay_iters, 1000);
  EXPECT_EQ(s.training.lr_warmup_iters, 0);
  EXPECT_EQ(s.training.lr_decay_style, LrDecayStyle::Linear);
  EXPECT_EQ(s.training.precision, Precision::FP32);
  EXPECT_DOUBLE_EQ(s.training.initial_loss_scale, 4294967296.0);
  EXPECT_EQ(s.training.seed, 1234);
  EXPECT_EQ(s.data.split, "969,30,1");
  EXPECT_EQ(s.data.tokenizer_type, "GPT2BPETokenizer");
  EXPECT_TRUE(s.data.data_path.empty());
  EXPECT_EQ(s.cluster.device, "H100-80GB");
  EXPECT_EQ(s.cluster.device_memory_bytes, 85520809984LL);
  EXPECT_EQ(s.cluster.nodes, 1);
  EXPECT_EQ(s.cluster.gpus_per_node, 1);
  EXPECT_EQ(s.numMicroBatches(), 1);
}

TEST(Spec, SwigluFfnRule) {
  // int((4 * 4096 * 2 / 3) / 64) * 64 = int(170.67) * 64 = 10880.
  std::string text = R"([model]
num_layers = 2
hidden_size = 4096
num_attention_heads = 32
seq_length = 128
vocab_size = 1000
swiglu = true
[training]
micro_batch_size = 1
train_iters = 1
lr = 1e-4
)";
  EXPECT_EQ(parseOk(text).model.ffn_hidden_size, 10880);
  EXPECT_EQ(parseOk(text, {{"model.hidden_size=768"}, {"model.num_attention_heads=12"}})
                .model.ffn_hidden_size,
            2048);
  EXPECT_EQ(parseOk(text, {{"model.ffn_hidden_size=14336"}}).model.ffn_hidden_size, 14336);
}

TEST(Spec, DerivedValues) {
  Spec s = parseOk(kBase, {{"parallel.data_parallel_size=8"},
                           {"parallel.tensor_model_parallel_size=2"},
                           {"cluster.nodes=2"},
                           {"training.global_batch_size=64"},
                           {"training.lr_warmup_fraction=0.015"},
                           {"training.lr_decay_iters=999"}});
  EXPECT_EQ(s.cluster.gpus_per_node, 8);
  EXPECT_EQ(s.worldSize(), 16);
  EXPECT_EQ(s.numMicroBatches(), 2);
  EXPECT_EQ(s.training.lr_warmup_iters, 14) << "floor(0.015 * 999)";
  Spec kv = parseOk(kBase, {{"model.num_attention_heads=10"}, {"model.kv_channels=80"}});
  EXPECT_EQ(kv.model.kv_channels, 80) << "no divisibility rule with explicit kv_channels";
  Spec gib = parseOk(kBase, {{"cluster.device_memory=24"}});
  EXPECT_EQ(gib.cluster.device, "custom");
  EXPECT_EQ(gib.cluster.device_memory_bytes, 24LL << 30);
  Spec a100 = parseOk(kBase, {{"cluster.device_memory=\"A100-40GB\""}});
  EXPECT_EQ(a100.cluster.device, "A100-40GB");
  EXPECT_EQ(a100.cluster.device_memory_bytes, 42949672960LL);
}

TEST(Spec, DevicePresets) {
  std::set<std::string> names;
  for (const DevicePreset &p : devicePresets())
    names.insert(p.name);
  EXPECT_EQ(names, (std::set<std::string>{"H100-80GB", "H200-141GB", "A100-80GB", "A100-40GB",
                                          "RTX5080-16GB"}));
  EXPECT_EQ(devicePresets()[0].bytes, 81559LL << 20);
}

TEST(Spec, DistributedOptimizerWithOneDataParallelRankIsFine) {
  EXPECT_TRUE(parseOk(kBase, {{"parallel.use_distributed_optimizer=true"}})
                  .parallel.use_distributed_optimizer);
}

// ----- data_path -----

TEST(Spec, DataPathForms) {
  using Blend = std::vector<std::pair<double, std::string>>;
  EXPECT_EQ(parseOk(kBase, {{"data.data_path=\"corpus_text_document\""}}).data.data_path,
            (Blend{{1.0, "corpus_text_document"}}));
  EXPECT_EQ(parseOk(kBase, {{"data.data_path=corpus_text_document"}}).data.data_path,
            (Blend{{1.0, "corpus_text_document"}}))
      << "bare word";
  EXPECT_EQ(parseOk(kBase, {{"data.data_path=[\"a\"]"}}).data.data_path, (Blend{{1.0, "a"}}));
  EXPECT_EQ(parseOk(kBase, {{"data.data_path=[0.3, \"a\", 7, \"b\"]"}}).data.data_path,
            (Blend{{0.3, "a"}, {7.0, "b"}}));
  EXPECT_EQ(parseOk(kBase, {{"data.data_path=[\"0.25\", \"a\", \"0.75\", \"b\"]"}}).data.data_path,
            (Blend{{0.25, "a"}, {0.75, "b"}}))
      << "numeric strings, as Megatron's --data-path 0.25 a 0.75 b";
}

TEST(Spec, DataPathErrors) {
  EXPECT_NE(parseError(kBase, {{"data.data_path=[0.3, \"a\", 0, \"b\"]"}})
                .find("weight must be > 0, got integer 0"),
            std::string::npos);
  EXPECT_NE(
      parseError(kBase, {{"data.data_path=[0.3, \"a\", \"b\"]"}}).find("blend has 3 elements"),
      std::string::npos);
  EXPECT_NE(
      parseError(kBase, {{"data.data_path=[\"x\", \"a\"]"}}).find("element 1 must be a weight"),
      std::string::npos);
  EXPECT_NE(
      parseError(kBase, {{"data.data_path=[1, 2]"}}).find("element 2 must be a dataset prefix"),
      std::string::npos);
  EXPECT_NE(parseError(kBase, {{"data.data_path=[]"}}).find("empty array"), std::string::npos);
  EXPECT_NE(
      parseError(kBase, {{"data.data_path=3"}}).find("must be a string or an array, got integer 3"),
      std::string::npos);
  EXPECT_NE(parseError(kBase, {{"data.data_path=\"a\""}, {"data.mock_data=true"}})
                .find("mutually exclusive"),
            std::string::npos);
}

TEST(Spec, Split) {
  EXPECT_EQ(parseOk(kBase, {{"data.split=\"98/2\""}}).data.split, "98/2");
  EXPECT_EQ(parseOk(kBase, {{"data.split=\"100\""}}).data.split, "100");
  EXPECT_EQ(parseOk(kBase, {{"data.split=\"0.9, 0.1, 0\""}}).data.split, "0.9, 0.1, 0");
  for (const char *bad : {"\"a,b\"", "\"1,2,3,4\"", "\"1,-2\"", "\"\"", "\"1,\"", "\"0,0\""})
    EXPECT_FALSE(parse(kBase, {{std::string("data.split=") + bad}}).ok()) << bad;
}

// ----- overrides -----

TEST(Spec, OverridesReplaceAddAndApplyInOrder) {
  Spec s = parseOk(kBase, {{"model.num_layers=24"}});
  EXPECT_EQ(s.model.num_layers, 24);
  s = parseOk(kBase, {{"model.ffn_hidden_size=1000"}});
  EXPECT_EQ(s.model.ffn_hidden_size, 1000);
  s = parseOk(kBase, {{"parallel.pipeline_model_parallel_size=2"}, {"cluster.gpus_per_node=2"}});
  EXPECT_EQ(s.parallel.pipeline_model_parallel_size, 2) << "section absent from the file";
  s = parseOk(kBase, {{"model.num_layers=24"}, {"model.num_layers=36"}});
  EXPECT_EQ(s.model.num_layers, 36) << "later wins";
  s = parseOk(kBase, {{"training.precision=bf16"}, {"model.hidden_dropout = 0.0"}});
  EXPECT_EQ(s.training.precision, Precision::BF16);
  EXPECT_EQ(s.model.hidden_dropout, 0.0);
  s = parseOk(kBase, {{"training.save=/ckpt/run 1"}});
  EXPECT_EQ(s.training.save, "/ckpt/run 1");
}

TEST(Spec, OverrideErrorsNameTheOverride) {
  EXPECT_EQ(parseError(kBase, {{"model.num_layerz=4"}}),
            "--set model.num_layerz=4:1:7: error: unknown key 'num_layerz' in [model]; "
            "did you mean 'num_layers'?");
  EXPECT_EQ(parseError(kBase, {{"model.num_layers=abc"}}),
            "--set model.num_layers=abc:1:18: error: model.num_layers must be an integer, "
            "got string \"abc\"; write a whole number without quotes");
  EXPECT_EQ(parseError(kBase, {{"modle.num_layers=4"}}),
            "--set modle.num_layers=4:1:1: error: unknown section [modle]; did you mean "
            "[model]?");
  EXPECT_EQ(parseError(kBase, {{"num_layers=4"}}),
            "--set num_layers=4: error: malformed override 'num_layers=4': no section "
            "before 'num_layers'; write --set model.num_layers=4");
  EXPECT_NE(
      parseError(kBase, {{"model.num_layers"}}).find("no '='; write it as --set SECTION.KEY=VALUE"),
      std::string::npos);
  EXPECT_NE(parseError(kBase, {{"a.b.c=1"}}).find("--set SECTION.KEY=VALUE"), std::string::npos);
  EXPECT_NE(parseError(kBase, {{"model.num_layers="}}).find("no value after '='"),
            std::string::npos);
  EXPECT_NE(parseError(kBase, {{"data.data_path=[\"a\""}}).find("--set data.data_path=[\"a\":1:"),
            std::string::npos);
  // Cross-key errors point at the override that broke the rule.
  std::string msg = parseError(kBase, {{"parallel.pipeline_model_parallel_size=5"}});
  EXPECT_EQ(msg.rfind("spec.toml:2:14: error: num_layers = 12 is not divisible by "
                      "pipeline_model_parallel_size = 5 (--set "
                      "parallel.pipeline_model_parallel_size=5:1:39)",
                      0),
            0u)
      << msg;
}

// ----- errors and locations -----

TEST(Spec, ErrorLocations) {
  EXPECT_EQ(parseError("[model]\nnum_layers = 12.0\n"),
            "spec.toml:2:14: error: model.num_layers must be an integer, got float 12.0; "
            "write 12 without the decimal point");
  EXPECT_EQ(parseError("[model]\nnum_layers = \n"),
            "spec.toml:2:14: error: TOML syntax error while parsing key-value pair: expected "
            "value, saw '\\n'; fix the TOML syntax");
  EXPECT_EQ(parseError("[modle]\n"),
            "spec.toml:1:1: error: unknown section [modle]; did you mean [model]?");
  EXPECT_EQ(parseError("lr = 1\n"),
            "spec.toml:1:1: error: key 'lr' is outside any section; move it under [training]");
  EXPECT_EQ(parseError("num_layerz = 1\n"),
            "spec.toml:1:1: error: unknown key 'num_layerz' outside any section; did you mean "
            "'num_layers' in [model]?");
  EXPECT_EQ(parseError("[model]\nlr = 1\n"),
            "spec.toml:2:1: error: unknown key 'lr' in [model]; 'lr' belongs in [training]");
  std::string missing = parseError("[model]\nnum_layers = 2\n");
  EXPECT_EQ(missing.rfind("spec.toml:1:1: error: [model] is missing the required key "
                          "'hidden_size'",
                          0),
            0u)
      << missing;
  std::string noSection = parseError(R"([model]
num_layers = 2
hidden_size = 8
num_attention_heads = 2
seq_length = 4
vocab_size = 10
)");
  EXPECT_EQ(noSection.rfind("spec.toml:1:1: error: missing required key 'micro_batch_size'", 0),
            0u);
  EXPECT_NE(noSection.find("add a [training] section"), std::string::npos);
  std::string heads = parseError(kBase, {{"model.num_attention_heads=10"}});
  EXPECT_EQ(heads.rfind("--set model.num_attention_heads=10:1:27: error: hidden_size = 768 "
                        "(spec.toml:3:15) is not divisible by num_attention_heads = 10",
                        0),
            0u)
      << heads;
}

TEST(Spec, RangeChecks) {
  EXPECT_NE(parseError(kBase, {{"model.hidden_dropout=1.5"}}).find("must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(parseError(kBase, {{"model.hidden_dropout=1"}}).find("must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(parseError(kBase, {{"model.num_layers=0"}}).find("must be in [1, 10000]"),
            std::string::npos);
  EXPECT_NE(parseError(kBase, {{"training.lr=-1e-3"}}).find("must be > 0"), std::string::npos);
  EXPECT_NE(parseError(kBase, {{"training.lr=0"}}).find("must be > 0"), std::string::npos);
  EXPECT_NE(parseError(kBase, {{"training.lr=inf"}}).find("finite"), std::string::npos);
  EXPECT_TRUE(parse(kBase, {{"training.lr=1"}}).ok()) << "integers are fine for floats";
  EXPECT_NE(parseError(kBase, {{"model.swiglu=\"true\""}}).find("must be true or false"),
            std::string::npos);
  EXPECT_NE(parseError(kBase, {{"cluster.device_memory=\"H100-80G\""}})
                .find("did you mean \"H100-80GB\"?"),
            std::string::npos);
  EXPECT_NE(parseError(kBase, {{"cluster.device_memory=0"}}).find("must be in (0, 1048576] GiB"),
            std::string::npos);
}

// Each cross-key rule, with the key the message points at.
TEST(Spec, CrossKeyRules) {
  struct Case {
    std::vector<Override> overrides;
    const char *expect;
  };
  std::vector<Case> cases = {
      {{{"model.num_query_groups=24"}}, "num_query_groups = 24 exceeds"},
      {{{"model.num_query_groups=5"}}, "is not divisible by num_query_groups = 5"},
      {{{"parallel.tensor_model_parallel_size=8"}, {"cluster.gpus_per_node=8"}},
       "num_attention_heads = 12 (spec.toml:4:23) is not divisible by "
       "tensor_model_parallel_size = 8"},
      {{{"model.num_query_groups=3"}, {"parallel.tensor_model_parallel_size=4"}},
       "num_query_groups = 3"},
      {{{"model.ffn_hidden_size=3001"}, {"parallel.tensor_model_parallel_size=2"}},
       "ffn_hidden_size = 3001"},
      {{{"parallel.virtual_pipeline_model_parallel_size=2"}}, "needs pipeline parallelism"},
      {{{"parallel.pipeline_model_parallel_size=5"}}, "Megatron would silently drop layers"},
      {{{"training.global_batch_size=20"},
        {"parallel.data_parallel_size=2"},
        {"cluster.gpus_per_node=2"}},
       "use global_batch_size = 16 or 24"},
      {{{"parallel.data_parallel_size=2"}, {"cluster.gpus_per_node=4"}},
       "does not match nodes * gpus_per_node = 1 * 4 = 4"},
      {{{"parallel.data_parallel_size=3"}, {"cluster.nodes=2"}}, "does not split evenly"},
      {{{"model.max_position_embeddings=512"}}, "seq_length = 1024 exceeds"},
      {{{"parallel.sequence_parallel=true"}}, "sequence_parallel requires tensor parallelism"},
      {{{"parallel.recompute_method=block"}}, "recompute_method needs recompute_granularity"},
      {{{"parallel.recompute_granularity=full"}, {"parallel.recompute_num_layers=1"}},
       "needs recompute_method"},
      {{{"parallel.recompute_granularity=full"}, {"parallel.recompute_method=block"}},
       "needs recompute_num_layers"},
      {{{"parallel.recompute_num_layers=1"}}, "recompute_num_layers needs"},
      {{{"parallel.recompute_granularity=full"},
        {"parallel.recompute_method=block"},
        {"parallel.recompute_num_layers=13"}},
       "exceeds the 12 layers of each model chunk"},
      {{{"parallel.recompute_granularity=full"},
        {"parallel.recompute_method=uniform"},
        {"parallel.recompute_num_layers=5"}},
       "use a divisor of 12: 1, 2, 3, 4, 6, 12"},
      {{{"training.lr_warmup_iters=10"}, {"training.lr_warmup_fraction=0.1"}},
       "mutually exclusive"},
      {{{"training.lr_warmup_iters=1001"}}, "lr_warmup_iters = 1001 exceeds lr_decay_iters"},
      {{{"training.min_lr=1e-3"}}, "min_lr = 0.001 exceeds lr = 0.0006"},
      {{{"training.precision=bf16"}, {"training.loss_scale_window=10"}},
       "loss_scale_window only applies with precision = \"fp16\""},
      {{{"model.rotary_base=500000"}}, "rotary_base only applies to rope positions"},
  };
  for (const Case &c : cases) {
    std::string msg = parseError(kBase, c.overrides);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
  // The fp16 loss-scale keys and rope's base are fine where they apply.
  EXPECT_TRUE(parse(kBase, {{"training.precision=fp16"}, {"training.hysteresis=4"}}).ok());
  EXPECT_TRUE(
      parse(kBase, {{"model.position_embedding_type=rope"}, {"model.rotary_base=500000"}}).ok());
}

TEST(Spec, MissingFile) {
  auto s = parseSpecFile("/nonexistent/spec.toml");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.status().message(), "/nonexistent/spec.toml: error: cannot read spec file: No "
                                  "such file or directory; check the path");
}

TEST(Spec, ParseFile) {
  std::string path = ::testing::TempDir() + "/mt-spec-test.toml";
  std::FILE *f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(kBase, f);
  std::fclose(f);
  auto s = parseSpecFile(path, {{"model.num_layers=6"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->source, path);
  EXPECT_EQ(s->model.num_layers, 6);
  std::remove(path.c_str());
}

// ----- did-you-mean and the key table -----

TEST(SpecKeys, DidYouMean) {
  std::vector<std::string> keys = {"num_layers", "hidden_size", "seq_length"};
  EXPECT_EQ(didYouMean("num_layerz", keys), "num_layers");
  EXPECT_EQ(didYouMean("hiden_size", keys), "hidden_size");
  EXPECT_EQ(didYouMean("NUM_LAYERS", keys), "num_layers");
  EXPECT_EQ(didYouMean("vocabulary", keys), "");
  EXPECT_EQ(didYouMean("x", {"lr"}), "") << "nothing in common";
  EXPECT_EQ(didYouMean("anything", {}), "");
  EXPECT_EQ(didYouMean("rmsnorm", {"LayerNorm", "RMSNorm"}), "RMSNorm");
  // Long words tolerate len/3 edits: 20 letters, 6 inserted.
  EXPECT_EQ(didYouMean("tensor_parallel_size", {"tensor_model_parallel_size"}),
            "tensor_model_parallel_size");
  EXPECT_EQ(didYouMean("tensor_size", {"tensor_model_parallel_size"}), "");
}

TEST(SpecKeys, TableIsConsistent) {
  std::set<std::string> seen;
  for (const KeyInfo &k : specKeys()) {
    std::string full = std::string(k.section) + "." + k.name;
    EXPECT_TRUE(seen.insert(full).second) << "duplicate " << full;
    EXPECT_NE(std::find(specSections().begin(), specSections().end(), k.section),
              specSections().end())
        << full;
    EXPECT_EQ(findKey(k.section, k.name), &k);
    EXPECT_NE(std::string(k.doc), "") << full;
    EXPECT_EQ(k.type == KeyType::Enum, !k.choices.empty()) << full;
    if (!k.required) {
      EXPECT_NE(std::string(k.defaultText), "") << full;
    }
    // Every key appears in the echo, as a value or as a comment.
    std::string echo = toToml(Spec{});
    EXPECT_TRUE(echo.find(std::string("\n") + k.name + " = ") != std::string::npos ||
                echo.find(std::string("\n# ") + k.name + ": ") != std::string::npos)
        << full;
  }
  EXPECT_EQ(findKey("model", "lr"), nullptr);
  EXPECT_EQ(findKey("training", "lr")->megatronFlag, std::string("--lr"));
  EXPECT_EQ(findKey("model", "add_bias_linear")->megatronFlag,
            std::string("--disable-bias-linear"));
}

TEST(SpecKeys, MarkdownReference) {
  std::string md = renderKeyReferenceMarkdown();
  for (const std::string &s : specSections())
    EXPECT_NE(md.find("### [" + s + "]"), std::string::npos) << s;
  for (const KeyInfo &k : specKeys())
    EXPECT_NE(md.find(std::string("| `") + k.name + "` |"), std::string::npos) << k.name;
  EXPECT_NE(md.find("| key | type | default | unit | Megatron flag | meaning |"),
            std::string::npos);
  EXPECT_NE(md.find("`\"learned_absolute\"`, `\"rope\"`"), std::string::npos);
  EXPECT_NE(md.find("Range: in [0, 1)."), std::string::npos);
  EXPECT_EQ(md.back(), '\n');
}

// ----- toToml round trip -----

TEST(Spec, RoundTripDefaults) { expectRoundTrip(kBase); }

TEST(Spec, SampleBasedDerivesIterations) {
  const std::string model = "[model]\nnum_layers = 2\nhidden_size = 64\n"
                            "num_attention_heads = 4\nseq_length = 128\nvocab_size = 1000\n\n";
  // 1000 samples of 16: 62 iterations, the partial last batch dropped; the
  // warmup fraction counts samples of lr_decay_samples (train_samples).
  Spec s = parseOk(model + "[training]\nmicro_batch_size = 2\nglobal_batch_size = 16\n"
                           "train_samples = 1000\nlr = 1e-3\nlr_warmup_fraction = 0.05\n");
  EXPECT_TRUE(s.training.sampleBased());
  EXPECT_EQ(s.training.train_iters, 62);
  EXPECT_EQ(s.training.lr_decay_samples, 1000);
  EXPECT_EQ(s.training.lr_warmup_samples, 50);
  // Megatron asserts only that the other unit's warmup is 0: an explicit 0 passes.
  Spec z = parseOk(model + "[training]\nmicro_batch_size = 2\ntrain_iters = 10\nlr = 1e-3\n"
                           "lr_warmup_samples = 0\n");
  EXPECT_FALSE(z.training.sampleBased());
  EXPECT_NE(parseError(model + "[training]\nmicro_batch_size = 2\ntrain_iters = 10\n"
                               "lr = 1e-3\nlr_warmup_samples = 1\n")
                .find("lr_warmup_samples needs sample-based training"),
            std::string::npos);
}

TEST(Spec, RoundTripSampleBased) {
  expectRoundTrip(R"([model]
num_layers = 2
hidden_size = 64
num_attention_heads = 4
seq_length = 128
vocab_size = 1000

[training]
micro_batch_size = 2
global_batch_size = 16
train_samples = 3000000000
rampup_batch_size = [4, 4, 300]
lr = 1e-3
lr_decay_style = "WSD"
lr_warmup_fraction = 0.01
lr_wsd_decay_samples = 1000
)");
}

TEST(Spec, RoundTripEverythingSet) {
  expectRoundTrip(R"([model]
num_layers = 32
hidden_size = 4096
ffn_hidden_size = 14336
num_attention_heads = 32
num_query_groups = 8
seq_length = 8192
vocab_size = 128256
position_embedding_type = "rope"
rotary_base = 500000
normalization = "RMSNorm"
norm_epsilon = 1e-6
swiglu = true
untie_embeddings_and_output_weights = true
add_bias_linear = false
hidden_dropout = 0.0
attention_dropout = 0.0
init_method_std = 0.008

[parallel]
tensor_model_parallel_size = 4
pipeline_model_parallel_size = 2
data_parallel_size = 16
virtual_pipeline_model_parallel_size = 4
sequence_parallel = true
use_distributed_optimizer = true
recompute_granularity = "full"
recompute_method = "uniform"
recompute_num_layers = 2

[training]
micro_batch_size = 1
global_batch_size = 1024
train_iters = 500000
lr = 3e-4
min_lr = 3e-5
lr_decay_style = "cosine"
lr_warmup_fraction = 0.0033
weight_decay = 0.1
adam_beta1 = 0.9
adam_beta2 = 0.95
adam_eps = 1e-5
clip_grad = 1.0
precision = "fp16"
initial_loss_scale = 65536
min_loss_scale = 0.5
loss_scale_window = 500
hysteresis = 3
seed = 42
log_interval = 10
eval_interval = 2000
eval_iters = 10
save_interval = 5000
save = "/ckpt/llama \"8b\""
load = "/ckpt/llama"

[data]
data_path = [0.3, "/data/a_text_document", "0.7", "/data/b_text_document"]
split = "99,1,0"
vocab_file = "gpt2/vocab.json"
merge_file = "gpt2/merges.txt"

[cluster]
device_memory = "H200-141GB"
nodes = 16
)");
}

TEST(Spec, RoundTripCustomDeviceAndSelectiveRecompute) {
  expectRoundTrip(kBase, {{"cluster.device_memory=0.1"},
                          {"parallel.recompute_granularity=selective"},
                          {"data.data_path=[\"only\"]"},
                          {"data.mock_data=false"},
                          {"training.lr=0.1"},
                          {"model.norm_epsilon=1e-5"}});
  expectRoundTrip(kBase, {{"data.mock_data=true"}, {"cluster.device_memory=80.5"}});
  expectRoundTrip(kBase, {{"data.data_path=[2, \"weighted\"]"}});
}

// The tokenizer's keys, lists included; a tokenizer mtc reads (NullTokenizer)
// and one it cannot (a hub name), whose vocab_size then stays the spec's.
TEST(Spec, RoundTripTokenizers) {
  expectRoundTrip(kBase, {{"data.tokenizer_type=\"TikTokenizer\""},
                          {"data.tokenizer_model=\"org/tiktoken-hub-name\""},
                          {"data.tiktoken_pattern=\"v1\""},
                          {"data.tiktoken_num_special_tokens=500"},
                          {"data.tiktoken_special_tokens=[\"<unk>\", \"<s>\", \"</s>\"]"},
                          {"data.tokenizer_special_tokens=[\"<pad>\"]"},
                          {"data.legacy_tokenizer=true"}});
  expectRoundTrip(kBase, {{"data.tokenizer_type=\"HuggingFaceTokenizer\""},
                          {"data.tokenizer_model=\"meta-llama/Meta-Llama-3-8B\""},
                          {"data.tokenizer_hf_include_special_tokens=false"}});
  expectRoundTrip(kBase, {{"data.tokenizer_type=\"NullTokenizer\""}, {"model.vocab_size=70000"}});
  Spec s = parseOk(kBase, {{"data.tokenizer_type=\"NullTokenizer\""},
                           {"data.legacy_tokenizer=true"},
                           {"model.vocab_size=70001"}});
  EXPECT_EQ(s.model.vocab_size, 70001);
  EXPECT_EQ(s.data.eod_id, 70000);
  EXPECT_EQ(s.data.tokenizer, "NullTokenizer (--vocab-size 70000, --legacy-tokenizer), end of document 70000");
}

TEST(Spec, RoundTripWarmupStableDecayAndOverlaps) {
  expectRoundTrip(kBase, {{"training.lr_decay_style=\"WSD\""},
                          {"training.lr_wsd_decay_style=\"cosine\""},
                          {"training.lr_wsd_decay_iters=7"},
                          {"parallel.data_parallel_size=2"},
                          {"parallel.use_distributed_optimizer=true"},
                          {"parallel.overlap_grad_reduce=true"},
                          {"parallel.overlap_param_gather=true"}});
}

} // namespace
} // namespace mt::spec
