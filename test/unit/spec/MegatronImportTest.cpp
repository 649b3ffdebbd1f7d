// Tests of `mtc import-megatron`: shell splitting, flag mapping, refusals.
#include "spec/MegatronImport.h"
#include "spec/Spec.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <unistd.h>

namespace mt::spec {
namespace {

using Words = std::vector<std::string>;

// The checkout, found above the test binary or the working directory (build
// trees live inside it) or from this file's path; MT_SOURCE_DIR wins when the
// build defines it.
std::string sourceRoot() {
  std::vector<std::string> starts;
#ifdef MT_SOURCE_DIR
  starts.push_back(MT_SOURCE_DIR);
#endif
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0)
    starts.push_back(std::string(buf, static_cast<size_t>(n)));
  if (getcwd(buf, sizeof buf))
    starts.push_back(buf);
  std::string self = __FILE__;
  starts.push_back(
      self.substr(0, self.rfind('/') == std::string::npos ? 0 : self.rfind('/')));
  for (std::string dir : starts) {
    for (int up = 0; up < 8 && !dir.empty(); ++up) {
      if (std::ifstream(dir + "/models/gpt-350m-4node.toml") &&
          std::ifstream(dir + "/spec/MegatronImport.h"))
        return dir;
      size_t slash = dir.rfind('/');
      dir = slash == std::string::npos || slash == 0 ? "" : dir.substr(0, slash);
    }
  }
  return "";
}

std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Splits, translates and parses; fails the test on any error.
Spec importOk(const std::string &commandLine, MegatronImportResult *out = nullptr) {
  absl::StatusOr<Words> words = splitCommandLine(commandLine);
  EXPECT_TRUE(words.ok()) << words.status();
  if (!words.ok())
    return Spec();
  absl::StatusOr<MegatronImportResult> r = importMegatronArgs(*words);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok())
    return Spec();
  absl::StatusOr<Spec> spec = parseSpecString(r->toml, "<test>");
  EXPECT_TRUE(spec.ok()) << spec.status() << "\n" << r->toml;
  if (out)
    *out = *r;
  return spec.ok() ? *spec : Spec();
}

std::string importError(const std::string &commandLine) {
  absl::StatusOr<Words> words = splitCommandLine(commandLine);
  if (!words.ok())
    return std::string(words.status().message());
  absl::StatusOr<MegatronImportResult> r = importMegatronArgs(*words);
  EXPECT_FALSE(r.ok()) << r->toml;
  return r.ok() ? "" : std::string(r.status().message());
}

// The smallest complete command line; tests add what they look at.
const char kBase[] = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                     "--seq-length 128 --vocab-size 1000 --micro-batch-size 2 "
                     "--train-iters 10 --lr 1e-3 ";

//===----------------------------------------------------------------------===//
// splitCommandLine
//===----------------------------------------------------------------------===//

TEST(SplitCommandLine, QuotesEscapesAndContinuations) {
  absl::StatusOr<Words> w = splitCommandLine(
      "python pretrain_gpt.py --a 'single $X \"q\"' --b \"dq \\\"x\\\" \\$Y\" \\\n"
      "  --c a\\ b --d=\"\" --e 'it'\\''s'\n");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (Words{"python", "pretrain_gpt.py", "--a", "single $X \"q\"", "--b",
                       "dq \"x\" $Y", "--c", "a b", "--d=", "--e", "it's"}));
}

TEST(SplitCommandLine, CommentsAssignmentsAndTraceMarkers) {
  absl::StatusOr<Words> w = splitCommandLine(
      "#!/bin/bash\n"
      "# a comment with $VARS that do not matter\n"
      "+ CUDA_DEVICE_MAX_CONNECTIONS=1 OMP_NUM_THREADS=4 torchrun pretrain_gpt.py \\\n"
      "  --num-layers 2 # trailing comment\n");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (Words{"torchrun", "pretrain_gpt.py", "--num-layers", "2"}));
}

TEST(SplitCommandLine, HashInsideAWordIsNotAComment) {
  absl::StatusOr<Words> w = splitCommandLine("--save /ckpt/run#3 --x '#y'");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (Words{"--save", "/ckpt/run#3", "--x", "#y"}));
}

TEST(SplitCommandLine, PicksTheTrainingCommandOfAScript) {
  absl::StatusOr<Words> w = splitCommandLine(
      "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
      "mkdir -p /ckpt; cd /work\n"
      "torchrun --nnodes 1 pretrain_gpt.py --num-layers 2 2>&1 | tee log.txt\n"
      "echo done > status\n");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w,
            (Words{"torchrun", "--nnodes", "1", "pretrain_gpt.py", "--num-layers", "2"}));
}

TEST(SplitCommandLine, OneFlagPerLineContinuesTheCommand) {
  absl::StatusOr<Words> w =
      splitCommandLine("--num-layers 2\n--hidden-size 64\n\n--bf16\n");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (Words{"--num-layers", "2", "--hidden-size", "64", "--bf16"}));
}

TEST(SplitCommandLine, RefusesUnknowableValuesNamingThem) {
  absl::StatusOr<Words> w = splitCommandLine(
      "torchrun pretrain_gpt.py --data-path \"${DATA}\" --save $(pwd)/ckpt");
  ASSERT_FALSE(w.ok());
  std::string msg(w.status().message());
  EXPECT_NE(msg.find("the command line:1: mtc cannot follow the command substitution $(pwd)"),
            std::string::npos)
      << msg;
}

TEST(SplitCommandLine, QuotedOrEscapedDollarIsLiteral) {
  absl::StatusOr<Words> w = splitCommandLine("--a '$HOME' --b \\$X --c cost$ --d $");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (Words{"--a", "$HOME", "--b", "$X", "--c", "cost$", "--d", "$"}));
}

TEST(SplitCommandLine, Errors) {
  EXPECT_FALSE(splitCommandLine("--a 'open").ok());
  EXPECT_FALSE(splitCommandLine("--a \"open").ok());
  EXPECT_FALSE(splitCommandLine("# only a comment\n").ok());
  absl::StatusOr<Words> two =
      splitCommandLine("python pretrain_gpt.py --a 1\npython pretrain_gpt.py --a 2\n");
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("2 times"), std::string::npos);
  absl::StatusOr<Words> none = splitCommandLine("echo a\necho b\n");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("runs no pretrain_gpt.py"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// evaluateLaunchScript
//===----------------------------------------------------------------------===//

// Evaluates a script with the given arguments and environment (nothing else).
absl::StatusOr<TrainingCommand> evalScript(const std::string &text, Words args = {},
                                           Words env = {}) {
  ShellOptions opts;
  opts.source = "t.sh";
  opts.args = std::move(args);
  opts.scriptArgs = true;
  opts.environment = std::move(env);
  return evaluateLaunchScript(text, opts);
}

Words evalOk(const std::string &text, Words args = {}, Words env = {}) {
  absl::StatusOr<TrainingCommand> c = evalScript(text, std::move(args), std::move(env));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->words : Words{};
}

std::string evalError(const std::string &text, Words args = {}, Words env = {}) {
  absl::StatusOr<TrainingCommand> c = evalScript(text, std::move(args), std::move(env));
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(LaunchScript, ArraysExpandAsBashDoes) {
  // Quoted "${A[@]}" keeps elements; unquoted ${A[@]} splits them again and
  // keeps quote characters that were inside an element.
  EXPECT_EQ(evalOk("A=(--a 1 \"--b 2\")\n"
                   "B=(\"--c '3,4'\")\n"
                   "B+=(--d)\n"
                   "python pretrain_gpt.py \"${A[@]}\" ${B[@]} --n ${#B[@]} --s \"${A[*]}\"\n"),
            (Words{"python", "pretrain_gpt.py", "--a", "1", "--b 2", "--c", "'3,4'", "--d",
                   "--n", "2", "--s", "--a 1 --b 2"}));
  EXPECT_EQ(evalOk("E=()\npython pretrain_gpt.py \"${E[@]}\" ${E[@]} --x\n"),
            (Words{"python", "pretrain_gpt.py", "--x"}));
}

TEST(LaunchScript, ParametersDefaultsAndArithmetic) {
  const char *script = "A=${A:-one}\n"
                       "B=${B-two}\n"
                       ": ${C:=three}\n"
                       "P=${1:-\"first default\"}\n"
                       "N=$(( (${GPUS:-8} * 2 + 1) / 3 ))\n"
                       "M=$((N ** 2 % 7))\n"
                       "F=/a/b/c.txt\n"
                       "python pretrain_gpt.py --a $A --b \"$B\" --c $C --p \"$P\" --n $N "
                       "--m $M --dir ${F%/*} --base ${F##*/} --plus ${A:+set}\n";
  EXPECT_EQ(evalOk(script),
            (Words{"python", "pretrain_gpt.py", "--a", "one", "--b", "two", "--c", "three",
                   "--p", "first default", "--n", "5", "--m", "4", "--dir", "/a/b", "--base",
                   "c.txt", "--plus", "set"}));
  // The environment and the arguments win over the defaults; B set but
  // empty keeps its empty value under ${B-two}.
  EXPECT_EQ(evalOk(script, {"given"}, {"A=env", "B=", "GPUS=4"}),
            (Words{"python", "pretrain_gpt.py", "--a", "env", "--b", "", "--c", "three", "--p",
                   "given", "--n", "3", "--m", "2", "--dir", "/a/b", "--base", "c.txt",
                   "--plus", "set"}));
}

TEST(LaunchScript, ConditionsLoopsAndCase) {
  const char *script = "MODE=${MODE:-mock}\n"
                       "if [[ \"$MODE\" == mo* ]] && [ -z \"$NOPE\" ]; then\n"
                       "  D=(--mock-data)\n"
                       "elif [ \"$MODE\" = real ]; then\n"
                       "  D=(--data-path /d)\n"
                       "else\n"
                       "  D=()\n"
                       "fi\n"
                       "while [[ $# -gt 0 ]]; do\n"
                       "  case $1 in\n"
                       "    --layers) L=\"$2\"; shift 2 ;;\n"
                       "    -h|--help) exit 0 ;;\n"
                       "    *) echo \"unknown $1\"; exit 1 ;;\n"
                       "  esac\n"
                       "done\n"
                       "S=\"\"\n"
                       "for k in 1 2 3; do S=\"$S$k\"; done\n"
                       "[ -n \"$L\" ] || L=2\n"
                       "python pretrain_gpt.py ${D[@]} --num-layers $L --s $S\n";
  EXPECT_EQ(evalOk(script),
            (Words{"python", "pretrain_gpt.py", "--mock-data", "--num-layers", "2", "--s",
                   "123"}));
  EXPECT_EQ(evalOk(script, {"--layers", "8"}, {"MODE=real"}),
            (Words{"python", "pretrain_gpt.py", "--data-path", "/d", "--num-layers", "8", "--s",
                   "123"}));
  EXPECT_NE(evalError(script, {"--bogus"}).find("before it exits on line 13"),
            std::string::npos);
}

TEST(LaunchScript, SkipsWhatTheCommandDoesNotUse) {
  // Command substitutions, file tests, source and unknown commands are fine
  // as long as the training command does not need what they give.
  EXPECT_EQ(evalOk("export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
                   "STAMP=$(date +%s)\n"
                   "mkdir -p \"$(dirname \"$OUT\")\" && cd /tmp\n"
                   "if [ ! -f pretrain_gpt.py ]; then echo missing; exit 1; fi\n"
                   "cat > /tmp/x.yaml <<EOF\n"
                   "key: $(whoami) ) ( '\n"
                   "EOF\n"
                   "X=1 torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 2>&1 | tee "
                   "log.$STAMP\n"),
            (Words{"torchrun", "--nproc_per_node", "2", "pretrain_gpt.py", "--num-layers", "2"}));
}

TEST(LaunchScript, UnsetValuesAreNamedWithTheirLine) {
  std::string msg = evalError("CKPT=$1\nDATA=$2\n\npython pretrain_gpt.py --save $CKPT "
                              "--data-path $DATA --x ${MY_OPT}\n");
  EXPECT_NE(msg.find("t.sh:1: the training command (line 4) needs $1 (line 1, through $CKPT), "
                     "$2 (line 2, through $DATA), $MY_OPT (line 4), which are not set"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("pass the script's arguments after it"), std::string::npos) << msg;
  EXPECT_NE(msg.find("set MY_OPT in the environment"), std::string::npos) << msg;
  // Unset is fine where bash's empty value decides a condition.
  EXPECT_EQ(evalOk("A=()\nif [ -n \"${WANDB_KEY}\" ]; then A=(--wandb-project x); fi\n"
                   "python pretrain_gpt.py ${A[@]} --y\n"),
            (Words{"python", "pretrain_gpt.py", "--y"}));
}

TEST(LaunchScript, UnknowableValuesNameTheLineAndConstruct) {
  EXPECT_NE(evalError("V=$(cat f)\nW=\"$V/x\"\npython pretrain_gpt.py --save $W\n")
                .find("t.sh:1: mtc cannot follow the command substitution $(cat f), and the "
                      "training command (line 3) uses its value (through $V)"),
            std::string::npos);
  EXPECT_NE(evalError("if [ -d /data ]; then TP=2; fi\npython pretrain_gpt.py --tp $TP\n")
                .find("t.sh:1: mtc cannot follow the if on line 1"),
            std::string::npos);
  EXPECT_NE(evalError("source env.sh\npython pretrain_gpt.py --n $NODES\n")
                .find("t.sh:1: mtc cannot follow `source env.sh` (mtc reads no other files)"),
            std::string::npos);
  EXPECT_NE(evalError("set_tp() { TP=4; }\nset_tp\npython pretrain_gpt.py --tp $TP\n")
                .find("the function set_tp called on line 2"),
            std::string::npos);
  EXPECT_NE(evalError("if [ -f x ]; then\n  python pretrain_gpt.py --a\nfi\n")
                .find("t.sh:2: mtc cannot tell whether the training command runs: the if on "
                      "line 1 decides whether it runs"),
            std::string::npos);
  EXPECT_NE(evalError("python pretrain_gpt.py --x $((2 +))\n").find("the arithmetic $((2 +))"),
            std::string::npos);
}

TEST(LaunchScript, SyntaxErrorsNameTheLine) {
  EXPECT_NE(evalError("A=(--a\n--b\n").find("t.sh:3: expected ')' to close the array A opened "
                                           "at line 1"),
            std::string::npos);
  EXPECT_NE(evalError("if true; then\n  X=1\n").find("expected 'fi' to close the if (opened "
                                                     "at line 1)"),
            std::string::npos);
  EXPECT_NE(evalError("X='open\n\n").find("t.sh:1: unterminated single quote"),
            std::string::npos);
}

//===----------------------------------------------------------------------===//
// importMegatronArgs
//===----------------------------------------------------------------------===//

TEST(ImportMegatron, GptFlags) {
  Spec s = importOk(
      "torchrun --nproc_per_node=8 pretrain_gpt.py --num-layers 24 --hidden-size 1024 "
      "--num-attention-heads 16 --seq-length 2048 --max-position-embeddings 4096 "
      "--vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --micro-batch-size 2 "
      "--global-batch-size 64 --train-iters 100 --lr 3.0e-4 --min-lr 3e-5 "
      "--lr-decay-style cosine --lr-warmup-iters 10 --weight-decay 0.1 "
      "--adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --clip-grad 1.0 "
      "--hidden-dropout 0.0 --attention-dropout 0 --init-method-std 0.006 --seed 7 "
      "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
      "--sequence-parallel --use-distributed-optimizer --recompute-activations "
      "--log-interval 5 --eval-interval 50 --eval-iters 2 --save-interval 20 "
      "--save /ckpt --load /ckpt --split 98,2,0 --bf16");
  EXPECT_EQ(s.model.num_layers, 24);
  EXPECT_EQ(s.model.hidden_size, 1024);
  EXPECT_EQ(s.model.num_attention_heads, 16);
  EXPECT_EQ(s.model.seq_length, 2048);
  EXPECT_EQ(s.model.max_position_embeddings, 4096);
  EXPECT_EQ(s.model.vocab_size, 50257); // GPT-2 BPE from --vocab-file
  EXPECT_EQ(s.model.make_vocab_size_divisible_by, 64);
  EXPECT_DOUBLE_EQ(s.model.hidden_dropout, 0.0);
  EXPECT_DOUBLE_EQ(s.model.attention_dropout, 0.0);
  EXPECT_DOUBLE_EQ(s.model.init_method_std, 0.006);
  EXPECT_EQ(s.parallel.tensor_model_parallel_size, 2);
  EXPECT_EQ(s.parallel.data_parallel_size, 4); // 8 / tp 2
  EXPECT_TRUE(s.parallel.sequence_parallel);
  EXPECT_TRUE(s.parallel.use_distributed_optimizer);
  EXPECT_EQ(s.parallel.recompute_granularity, RecomputeGranularity::Selective);
  EXPECT_EQ(s.training.micro_batch_size, 2);
  EXPECT_EQ(s.training.global_batch_size, 64);
  EXPECT_EQ(s.training.train_iters, 100);
  EXPECT_DOUBLE_EQ(s.training.lr, 3e-4);
  EXPECT_DOUBLE_EQ(s.training.min_lr, 3e-5);
  EXPECT_EQ(s.training.lr_decay_style, LrDecayStyle::Cosine);
  EXPECT_EQ(s.training.lr_warmup_iters, 10);
  EXPECT_DOUBLE_EQ(s.training.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(s.training.adam_beta2, 0.95);
  EXPECT_EQ(s.training.precision, Precision::BF16);
  EXPECT_EQ(s.training.seed, 7);
  EXPECT_EQ(s.training.log_interval, 5);
  EXPECT_EQ(s.training.eval_interval, 50);
  EXPECT_EQ(s.training.eval_iters, 2);
  EXPECT_EQ(s.training.save_interval, 20);
  EXPECT_EQ(s.training.save, "/ckpt");
  EXPECT_EQ(s.training.load, "/ckpt");
  EXPECT_EQ(s.data.split, "98,2,0");
  EXPECT_EQ(s.data.vocab_file, "gpt2-vocab.json");
  EXPECT_EQ(s.data.merge_file, "gpt2-merges.txt");
  EXPECT_EQ(s.cluster.nodes, 1);
  EXPECT_EQ(s.cluster.gpus_per_node, 8);
}

TEST(ImportMegatron, LlamaFlags) {
  Spec s = importOk(
      std::string(kBase) +
      "--hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 "
      "--group-query-attention --num-query-groups 8 --use-rotary-position-embeddings "
      "--rotary-base 500000 --normalization RMSNorm --norm-epsilon 1e-5 --swiglu "
      "--untie-embeddings-and-output-weights --disable-bias-linear "
      "--vocab-size 128256 --world-size 8 --tensor-model-parallel-size 4");
  EXPECT_EQ(s.model.hidden_size, 4096); // the later flag wins, as in argparse
  EXPECT_EQ(s.model.ffn_hidden_size, 14336);
  EXPECT_EQ(s.model.num_query_groups, 8);
  EXPECT_EQ(s.model.position_embedding_type, PositionEmbedding::Rope);
  EXPECT_EQ(s.model.rotary_base, 500000);
  EXPECT_EQ(s.model.normalization, Normalization::RMSNorm);
  EXPECT_TRUE(s.model.swiglu);
  EXPECT_TRUE(s.model.untie_embeddings_and_output_weights);
  EXPECT_FALSE(s.model.add_bias_linear);
  EXPECT_EQ(s.model.vocab_size, 128256);
  EXPECT_EQ(s.parallel.data_parallel_size, 2);
}

TEST(ImportMegatron, FlagEqualsValueAndUnderscores) {
  Spec s = importOk("--num-layers=4 --hidden-size=64 --num-attention-heads=4 "
                    "--seq-length=32 --vocab-size=100 --micro-batch-size=1 "
                    "--train-iters=5 --lr=0.1 --position-embedding-type=rope");
  EXPECT_EQ(s.model.num_layers, 4);
  EXPECT_EQ(s.model.position_embedding_type, PositionEmbedding::Rope);
}

TEST(ImportMegatron, GqaNeedsGroupsAndGroupsNeedGqa) {
  std::string err = importError(std::string(kBase) + "--group-query-attention");
  EXPECT_NE(err.find("--num-query-groups"), std::string::npos) << err;

  MegatronImportResult r;
  Spec s = importOk(std::string(kBase) + "--num-query-groups 2", &r);
  EXPECT_EQ(s.model.num_query_groups, s.model.num_attention_heads);
  ASSERT_EQ(r.ignoredFlags.size(), 1u);
  EXPECT_EQ(r.ignoredFlags[0].flag, "--num-query-groups");
  EXPECT_NE(r.ignoredFlags[0].reason.find("--group-query-attention"), std::string::npos);
}

TEST(ImportMegatron, VirtualPipelineFromLayersPerStage) {
  Spec s = importOk("--num-layers 24 --hidden-size 64 --num-attention-heads 4 "
                    "--seq-length 32 --vocab-size 100 --micro-batch-size 1 "
                    "--global-batch-size 8 --train-iters 5 --lr 0.1 "
                    "--pipeline-model-parallel-size 4 "
                    "--num-layers-per-virtual-pipeline-stage 3");
  EXPECT_EQ(s.parallel.virtual_pipeline_model_parallel_size, 2); // 24 / (4 * 3)

  std::string err =
      importError(std::string(kBase) + "--num-layers 24 --pipeline-model-parallel-size 4 "
                                       "--num-layers-per-virtual-pipeline-stage 5");
  EXPECT_NE(err.find("not a multiple"), std::string::npos) << err;
}

TEST(ImportMegatron, SampleBasedTraining) {
  // The *-samples flags and the ramp-up become the sample keys; the
  // iterations are derived as Megatron's update_train_iters derives them.
  MegatronImportResult r;
  Spec s = importOk("--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                    "--seq-length 32 --vocab-size 100 --micro-batch-size 1 --lr 0.1 "
                    "--global-batch-size 16 --train-samples 1601 "
                    "--lr-decay-samples 801 --lr-warmup-samples 161 "
                    "--lr-decay-style WSD --lr-wsd-decay-samples 99 "
                    "--rampup-batch-size 4 4 300",
                    &r);
  EXPECT_EQ(s.training.train_samples, 1601);
  EXPECT_EQ(s.training.lr_decay_samples, 801);
  EXPECT_EQ(s.training.lr_warmup_samples, 161);
  EXPECT_EQ(s.training.lr_wsd_decay_samples, 99);
  EXPECT_EQ(s.training.rampup_batch_size, (std::vector<int64_t>{4, 4, 300}));
  // Ramp-up: 3 increments of 100 samples: 25 iterations of 4 (to 100), 13
  // of 8 (to 204), 9 of 12 (to 312 > 300), then (1601 - 312) / 16 = 80 at 16.
  EXPECT_EQ(s.training.train_iters, 25 + 13 + 9 + 80);
  EXPECT_NE(r.toml.find("rampup_batch_size = [4, 4, 300]"), std::string::npos) << r.toml;
  EXPECT_NE(r.toml.find("train_samples = 1601"), std::string::npos) << r.toml;

  std::string err = importError(std::string(kBase) + "--rampup-batch-size 4 4");
  EXPECT_NE(err.find("--rampup-batch-size expects 3 integers, got '4 4' (start batch size"),
            std::string::npos)
      << err;
}

TEST(ImportMegatron, LossScaleFlagsOnlyWithFp16) {
  MegatronImportResult r;
  Spec fp16 = importOk(std::string(kBase) + "--fp16 --initial-loss-scale 65536 "
                                            "--loss-scale-window 500 --hysteresis 4");
  EXPECT_DOUBLE_EQ(fp16.training.initial_loss_scale, 65536);
  EXPECT_EQ(fp16.training.loss_scale_window, 500);
  EXPECT_EQ(fp16.training.hysteresis, 4);
  importOk(std::string(kBase) + "--bf16 --initial-loss-scale 65536", &r);
  ASSERT_EQ(r.ignoredFlags.size(), 1u);
  EXPECT_EQ(r.ignoredFlags[0].flag, "--initial-loss-scale");

  std::string err = importError(std::string(kBase) + "--fp16 --bf16");
  EXPECT_NE(err.find("both --fp16 and --bf16"), std::string::npos) << err;
}

TEST(ImportMegatron, DataBlends) {
  Spec one = importOk(std::string(kBase) + "--data-path /data/web_text_document");
  ASSERT_EQ(one.data.data_path.size(), 1u);
  EXPECT_EQ(one.data.data_path[0].second, "/data/web_text_document");
  EXPECT_DOUBLE_EQ(one.data.data_path[0].first, 1.0);

  Spec blend = importOk(std::string(kBase) +
                        "--data-path 0.3 /data/web 0.7 '/data/my books' --split 99,1,0");
  ASSERT_EQ(blend.data.data_path.size(), 2u);
  EXPECT_DOUBLE_EQ(blend.data.data_path[0].first, 0.3);
  EXPECT_EQ(blend.data.data_path[0].second, "/data/web");
  EXPECT_DOUBLE_EQ(blend.data.data_path[1].first, 0.7);
  EXPECT_EQ(blend.data.data_path[1].second, "/data/my books");
  EXPECT_EQ(blend.data.split, "99,1,0");

  std::string odd = importError(std::string(kBase) + "--data-path 0.3 /a /b");
  EXPECT_NE(odd.find("pairs of weight and prefix"), std::string::npos) << odd;
  std::string weight = importError(std::string(kBase) + "--data-path /a 0.3 /b 0.7");
  EXPECT_NE(weight.find("blend weight '/a'"), std::string::npos) << weight;
  std::string empty = importError(std::string(kBase) + "--data-path --bf16");
  EXPECT_NE(empty.find("--data-path needs"), std::string::npos) << empty;
}

TEST(ImportMegatron, NotApplicableFlagsAreListedWithTheirValues) {
  MegatronImportResult r;
  importOk(std::string(kBase) +
               "--use-mcore-models --transformer-impl transformer_engine "
               "--no-masked-softmax-fusion --distributed-backend nccl --num-workers 2 "
               "--dataloader-type single --context-parallel-size 1 --cp-comm-type p2p a2a",
           &r);
  std::vector<std::string> ignored;
  for (const IgnoredFlag &f : r.ignoredFlags) {
    ignored.push_back(f.flag);
    EXPECT_GT(f.reason.size(), 10u) << "no reason given: " << f.flag;
  }
  EXPECT_EQ(ignored,
            (Words{"--use-mcore-models", "--transformer-impl transformer_engine",
                   "--no-masked-softmax-fusion", "--distributed-backend nccl",
                   "--num-workers 2", "--dataloader-type single",
                   "--context-parallel-size 1", "--cp-comm-type p2p a2a"}));
  // They reach the spec as comments.
  EXPECT_NE(r.toml.find("#   --use-mcore-models: "), std::string::npos) << r.toml;
  EXPECT_NE(r.toml.find("#   --num-workers 2: "), std::string::npos) << r.toml;
}

TEST(ImportMegatron, RefusedAndUnknownFlagsAreNamedTogether) {
  std::string err = importError(std::string(kBase) +
                                "--frobnicate 3 --moe-router-num-groups 2 --use-mcore-models "
                                "--fp8-format hybrid --context-parallel-size 2 --num-layer 4");
  EXPECT_EQ(err.rfind("5 flags mt cannot honour:\n", 0), 0u) << err;
  EXPECT_NE(err.find("\n  --frobnicate 3: not a flag of Megatron-LM core_v0.16.1; "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("\n  --moe-router-num-groups 2: group-limited routing"), std::string::npos)
      << err;
  EXPECT_NE(err.find("\n  --fp8-format hybrid: fp8 training"), std::string::npos) << err;
  EXPECT_NE(err.find("\n  --context-parallel-size 2: context parallelism"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("\n  --num-layer 4: not a flag of Megatron-LM core_v0.16.1 (did you "
                     "mean --num-layers?)"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("--use-mcore-models"), std::string::npos) << err;
}

TEST(ImportMegatron, MtrunFlagsAreCarriedToTheUser) {
  MegatronImportResult r;
  importOk(std::string(kBase) + "--exit-interval 100 --tensorboard-dir '/runs/my tb' "
                                "--disable-log-loss-scale-to-tensorboard --skip-train",
           &r);
  EXPECT_EQ(r.mtrunArgs, (Words{"--exit-interval", "100", "--tensorboard-dir", "/runs/my tb",
                                "--no-log-loss-scale-to-tensorboard", "--skip-train"}));
  EXPECT_NE(r.toml.find("#   mtrun PLAN --exit-interval 100 --tensorboard-dir '/runs/my tb' "
                        "--no-log-loss-scale-to-tensorboard --skip-train\n"),
            std::string::npos)
      << r.toml;
}

TEST(ImportMegatron, Fp8IsRefusedUnlessPlannedAsBf16) {
  std::string fp8 = std::string(kBase) + "--bf16 --fp8-format hybrid --fp8-amax-history-len "
                                         "1024 --fp8-amax-compute-algo max --fp8-param-gather";
  std::string err = importError(fp8);
  EXPECT_EQ(err.rfind("4 flags mt cannot honour:", 0), 0u) << err;
  EXPECT_NE(err.find("--fp8-as-bf16"), std::string::npos) << err;

  absl::StatusOr<Words> w = splitCommandLine(fp8);
  ASSERT_TRUE(w.ok());
  MegatronImportOptions bf16;
  bf16.fp8AsBf16 = true;
  absl::StatusOr<MegatronImportResult> r = importMegatronArgs(*w, bf16);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<Spec> spec = parseSpecString(r->toml, "<test>");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training.precision, Precision::BF16);
  EXPECT_NE(r->toml.find("# --fp8-as-bf16: the fp8 flags (--fp8-format hybrid, "
                         "--fp8-amax-history-len 1024, --fp8-amax-compute-algo max, "
                         "--fp8-param-gather) are planned as bf16; mt has no fp8\n"
                         "precision = \"bf16\""),
            std::string::npos)
      << r->toml;

  // Without fp8 flags, or with --fp16, the option is refused.
  absl::StatusOr<Words> plain = splitCommandLine(kBase);
  ASSERT_TRUE(plain.ok());
  absl::StatusOr<MegatronImportResult> none = importMegatronArgs(*plain, bf16);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no fp8 flag"), std::string::npos);
  absl::StatusOr<Words> fp16 =
      splitCommandLine(std::string(kBase) + "--fp16 --fp8-format e4m3");
  ASSERT_TRUE(fp16.ok());
  absl::StatusOr<MegatronImportResult> both = importMegatronArgs(*fp16, bf16);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("--fp16 is given"), std::string::npos);
}

TEST(ImportMegatron, OtherNamesOfOneSetting) {
  Spec s = importOk("--encoder-num-layers 3 --hidden-size 64 --num-attention-heads 4 "
                    "--encoder-seq-length 32 --vocab-size 100 --micro-batch-size 1 "
                    "--train-iters 5 --lr 0.1 --persistent-save-interval 7");
  EXPECT_EQ(s.model.num_layers, 3);
  EXPECT_EQ(s.model.seq_length, 32);
  EXPECT_EQ(s.training.save_interval, 7);
  std::string err = importError(std::string(kBase) + "--encoder-seq-length 64");
  EXPECT_NE(err.find("both --seq-length and --encoder-seq-length"), std::string::npos) << err;
}

TEST(ImportMegatron, NoPositionEmbeddingNeedsRope) {
  MegatronImportResult r;
  Spec s = importOk(std::string(kBase) + "--position-embedding-type rope --no-position-embedding",
                    &r);
  EXPECT_EQ(s.model.position_embedding_type, PositionEmbedding::Rope);
  std::string err = importError(std::string(kBase) + "--no-position-embedding");
  EXPECT_EQ(err.rfind("--no-position-embedding: ", 0), 0u) << err;
}

TEST(ImportMegatron, MissingRequiredKeysNameTheirFlags) {
  std::string err = importError("--num-layers 2 --hidden-size 64 --lr 0.1");
  EXPECT_NE(err.find("--num-attention-heads"), std::string::npos) << err;
  EXPECT_NE(err.find("--seq-length"), std::string::npos) << err;
  EXPECT_NE(err.find("--micro-batch-size"), std::string::npos) << err;
  EXPECT_NE(err.find("--train-iters"), std::string::npos) << err;
  EXPECT_NE(err.find("model.vocab_size"), std::string::npos) << err;
  EXPECT_NE(err.find("--vocab-file"), std::string::npos) << err;
  EXPECT_EQ(err.find("--num-layers N"), std::string::npos) << err;
}

TEST(ImportMegatron, WarmupStableDecay) {
  Spec s = importOk(std::string(kBase) + "--lr-decay-style WSD --lr-wsd-decay-style minus_sqrt "
                                         "--lr-wsd-decay-iters 2");
  EXPECT_EQ(s.training.lr_decay_style, LrDecayStyle::WSD);
  EXPECT_EQ(s.training.lr_wsd_decay_style, WsdDecayStyle::MinusSqrt);
  EXPECT_EQ(s.training.lr_wsd_decay_iters, 2);
  EXPECT_EQ(importOk(std::string(kBase) + "--lr-decay-style inverse-square-root")
                .training.lr_decay_style,
            LrDecayStyle::InverseSquareRoot);
}

TEST(ImportMegatron, BadValues) {
  EXPECT_NE(importError(std::string(kBase) + "--num-layers two").find("integer"),
            std::string::npos);
  EXPECT_NE(importError(std::string(kBase) + "--lr fast").find("number"),
            std::string::npos);
  EXPECT_NE(importError(std::string(kBase) + "--lr-decay-style step")
                .find("use one of constant, linear, cosine, inverse-square-root, WSD"),
            std::string::npos);
  EXPECT_NE(importError(std::string(kBase) + "--swiglu=true").find("takes no value"),
            std::string::npos);
  EXPECT_NE(importError(std::string(kBase) + "--swiglu yes").find("'yes' after --swiglu"),
            std::string::npos);
  EXPECT_NE(importError(std::string(kBase) + "--seq-length").find("needs a value"),
            std::string::npos);
  EXPECT_NE(importError("train.sh --num-layers 2").find("not a Megatron flag"),
            std::string::npos);
}

TEST(ImportMegatron, WorldSizeMustSplitOverTpAndPp) {
  std::string err =
      importError("torchrun --nnodes 1 --nproc-per-node 6 pretrain_gpt.py " +
                  std::string(kBase) + "--tensor-model-parallel-size 4");
  EXPECT_NE(err.find("world size 6"), std::string::npos) << err;
}

TEST(ImportMegatron, WithoutWorldSizeDataParallelStaysOneWithANote) {
  MegatronImportResult r;
  Spec s = importOk(kBase, &r);
  EXPECT_EQ(s.parallel.data_parallel_size, 1);
  EXPECT_NE(r.toml.find("# data_parallel_size = 1"), std::string::npos) << r.toml;
}

TEST(ImportMegatron, ValidationErrorsNameTheFlag) {
  std::string err = importError(std::string(kBase) + "--num-attention-heads 5");
  EXPECT_NE(err.find("(from --num-attention-heads 5)"), std::string::npos) << err;
}

TEST(ImportMegatron, LaunchersGiveTheWorldSize) {
  Spec launch = importOk("python -m torch.distributed.launch --nproc_per_node 4 "
                         "--nnodes=2 --node_rank 1 /opt/megatron/pretrain_gpt.py " +
                         std::string(kBase) + "--tensor-model-parallel-size 2");
  EXPECT_EQ(launch.parallel.data_parallel_size, 4);
  EXPECT_EQ(launch.cluster.nodes, 2);
  EXPECT_EQ(launch.cluster.gpus_per_node, 4);

  Spec srun = importOk("srun -N 2 --ntasks-per-node=8 python pretrain_gpt.py " +
                       std::string(kBase) + "--pipeline-model-parallel-size 2");
  EXPECT_EQ(srun.parallel.data_parallel_size, 8);
  EXPECT_EQ(srun.cluster.nodes, 2);

  // mtc's own --world-size, for flag lists without their launcher.
  Spec world = importOk(std::string(kBase) + "--world-size 16");
  EXPECT_EQ(world.parallel.data_parallel_size, 16);

  // The flags of another training script are read the same way.
  Spec other = importOk("python pretrain_llama.py " + std::string(kBase));
  EXPECT_EQ(other.model.num_layers, 2);
}

// Megatron's 4-node example script becomes models/gpt-350m-4node.toml.
TEST(ImportMegatron, FourNodeGuideScriptMatchesThePreset) {
  std::string root = sourceRoot();
  ASSERT_FALSE(root.empty()) << "cannot find the checkout (models/, spec/)";
  MegatronImportResult r;
  Spec got = importOk(readFile(root + "/test/mtc/Inputs/megatron-gpt-350m-4node.sh"), &r);
  absl::StatusOr<Spec> want = parseSpecFile(root + "/models/gpt-350m-4node.toml");
  ASSERT_TRUE(want.ok()) << want.status();

  // The preset trains on mock data without checkpoints; the script names files.
  EXPECT_EQ(got.data.data_path.size(), 1u);
  EXPECT_EQ(got.data.vocab_file, "/data/gpt2-vocab.json");
  EXPECT_EQ(got.training.save, "/checkpoints/gpt-350m");
  got.data.data_path.clear();
  got.data.vocab_file.clear();
  got.data.merge_file.clear();
  got.data.mock_data = true;
  got.training.save.clear();
  got.training.load.clear();
  got.source = want->source;
  EXPECT_EQ(toToml(got), toToml(*want));

  EXPECT_EQ(got.model.num_layers, 24);
  EXPECT_EQ(got.parallel.tensor_model_parallel_size, 4);
  EXPECT_EQ(got.parallel.pipeline_model_parallel_size, 2);
  EXPECT_EQ(got.parallel.data_parallel_size, 4);
  EXPECT_EQ(got.cluster.nodes, 4);
  EXPECT_EQ(got.cluster.gpus_per_node, 8);
  EXPECT_EQ(got.training.precision, Precision::FP16);
  EXPECT_EQ(got.training.lr_warmup_iters, 3200); // .01 * 320000
  ASSERT_EQ(r.ignoredFlags.size(), 1u);
  EXPECT_EQ(r.ignoredFlags[0].flag, "--distributed-backend nccl");
}

} // namespace
} // namespace mt::spec
