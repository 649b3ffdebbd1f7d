// The Megatron flags `mtc import-megatron` knows: key-table flags, switches, ignored ones.
#include "spec/MegatronImportImpl.h"

#include "spec/SpecKeys.h"

#include <cctype>
#include <cstdlib>
#include <iostream>

namespace mt::spec::megatron {

//===----------------------------------------------------------------------===//
// Flags with no meaning for mt
//===----------------------------------------------------------------------===//

namespace {

const IgnoredFlag kIgnored[] = {
    {"--use-mcore-models", false, "mt has one model implementation"},
    {"--use-legacy-models", false, "mt has one model implementation"},
    {"--transformer-impl", true, "not applicable: mt generates its own kernels"},
    {"--use-flash-attn", false, "not applicable: mt generates its own attention kernels"},
    {"--attention-backend", true,
     "not applicable: mt generates its own attention kernels"},
    {"--distributed-backend", true, "not applicable: mt picks NCCL or Gloo itself"},
    {"--attention-softmax-in-fp32", false,
     "not applicable: mt chooses the precision inside its attention kernels"},
    {"--accumulate-allreduce-grads-in-fp32", false,
     "not applicable: mt chooses the gradient accumulation precision"},
    {"--no-persist-layer-norm", false, "mt always fuses"},
    {"--no-async-tensor-model-parallel-allreduce", false,
     "not applicable: mt schedules communication itself"},
    {"--tp-comm-overlap", false, "not applicable: mt schedules communication itself"},
    {"--num-workers", true, "not applicable: mt's data loader has no worker processes"},
    {"--dataloader-type", true,
     "not applicable: mt has one data loader (Megatron's single)"},
    {"--data-impl", true, "not applicable: mt reads Megatron's mmap format"},
    {"--exit-duration-in-mins", true, "not part of the spec: an mtrun flag of the same name"},
    {"--exit-interval", true, "not part of the spec: an mtrun flag of the same name"},
    {"--skip-train", false, "not part of the spec: an mtrun flag of the same name"},
    {"--exit-signal-handler", false,
     "not part of the spec: mtrun always saves and exits cleanly on SIGTERM"},
    {"--tensorboard-dir", true, "not part of the spec: an mtrun flag of the same name"},
    {"--tensorboard-log-interval", true, "not part of the spec: an mtrun flag of the same name"},
    {"--log-batch-size-to-tensorboard", false,
     "not part of the spec: an mtrun flag of the same name"},
    {"--log-world-size-to-tensorboard", false,
     "not part of the spec: an mtrun flag of the same name"},
    {"--log-validation-ppl-to-tensorboard", false,
     "not part of the spec: an mtrun flag of the same name"},
    {"--log-timers-to-tensorboard", false,
     "not part of the spec: an mtrun flag of the same name"},
    {"--no-log-learning-rate-to-tensorboard", false,
     "not part of the spec: an mtrun flag of the same name"},
    {"--no-log-loss-scale-to-tensorboard", false,
     "not part of the spec: an mtrun flag of the same name"},
    {"--tensorboard-queue-size", true, "not part of the spec: logging"},
    {"--timing-log-level", true, "not part of the spec: logging"},
    {"--timing-log-option", true, "not part of the spec: logging"},
    {"--wandb-project", true, "not part of the spec: logging"},
    {"--wandb-exp-name", true, "not part of the spec: logging"},
    {"--wandb-save-dir", true, "not part of the spec: logging"},
    {"--ckpt-format", true, "not applicable: mt has one checkpoint format"},
    {"--use-dist-ckpt", false, "not applicable: mt has one checkpoint format"},
    {"--async-save", false, "not applicable: mt has one checkpoint format"},
    {"--empty-unused-memory-level", true,
     "not applicable: mt plans memory at compile time"},
    {"--manual-gc", false, "not applicable: mt plans memory at compile time"},
    {"--manual-gc-interval", true, "not applicable: mt plans memory at compile time"},
};

} // namespace

const IgnoredFlag *findIgnored(const std::string &flag) {
  for (const IgnoredFlag &f : kIgnored)
    if (flag == f.flag)
      return &f;
  return nullptr;
}

// Families of ignored flags matched by shape rather than listed one by one.
const char *ignoredFamily(const std::string &flag) {
  if (flag.find("fusion") != std::string::npos)
    return "mt always fuses";
  if (startsWith(flag, "--log-") || startsWith(flag, "--tensorboard-") ||
      startsWith(flag, "--wandb-"))
    return "not part of the spec: logging";
  return nullptr;
}

//===----------------------------------------------------------------------===//
// Flags the key table names
//===----------------------------------------------------------------------===//

namespace {

// Keys that need more than the key table to translate.
bool isSpecialKey(const KeyInfo &k) {
  std::string key = std::string(k.section) + "." + k.name;
  return key == "model.add_bias_linear" || key == "training.precision" ||
         key == "parallel.virtual_pipeline_model_parallel_size" ||
         key == "parallel.data_parallel_size" || key == "data.data_path" ||
         key == "model.num_query_groups";
}

// The table's flag for a key when it is a plain `--name`.
bool plainFlag(const char *flag) {
  if (!flag || flag[0] != '-' || flag[1] != '-')
    return false;
  for (const char *p = flag + 2; *p; ++p)
    if (!std::islower(static_cast<unsigned char>(*p)) &&
        !std::isdigit(static_cast<unsigned char>(*p)) && *p != '-')
      return false;
  return true;
}

} // namespace

const KeyInfo *keyForFlag(const std::string &flag) {
  for (const KeyInfo &k : specKeys())
    if (plainFlag(k.megatronFlag) && flag == k.megatronFlag && !isSpecialKey(k))
      return &k;
  return nullptr;
}

const KeyInfo &key(const char *section, const char *name) {
  const KeyInfo *k = findKey(section, name);
  if (!k) {
    std::cerr << "mtc: internal error: spec key " << section << "." << name
              << " is missing from the key table\n";
    std::abort();
  }
  return *k;
}

std::string flagOf(const KeyInfo &k) {
  return plainFlag(k.megatronFlag) ? k.megatronFlag : "";
}

//===----------------------------------------------------------------------===//
// Switches
//===----------------------------------------------------------------------===//

const Switch *findSwitch(const std::string &flag) {
  static const Switch switches[] = {
      {"--disable-bias-linear", "model", "add_bias_linear", "false"},
      {"--add-bias-linear", "model", "add_bias_linear", "true"},
      {"--use-rotary-position-embeddings", "model", "position_embedding_type", "\"rope\""},
      {"--recompute-activations", "parallel", "recompute_granularity", "\"selective\""},
  };
  for (const Switch &sw : switches)
    if (flag == sw.flag)
      return &sw;
  return nullptr;
}

} // namespace mt::spec::megatron
