// `mtc import-megatron`: translates Megatron-LM flags into a spec.toml; the subcommand.
#include "spec/MegatronImport.h"
#include "spec/MegatronFlags.h"
#include "spec/MegatronImportImpl.h"

#include "runtime/base/atomic_file.h"
#include "runtime/data/tokenizers/tokenizer.h"

#include "spec/Spec.h"
#include "spec/SpecKeys.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace mt::spec {

using namespace megatron;

namespace {

//===----------------------------------------------------------------------===//
// Spec values
//===----------------------------------------------------------------------===//

std::string tomlString(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += c;
      }
    }
  }
  return out + "\"";
}

// Shortest text that reads back as the same double, in TOML float syntax.
std::string tomlFloat(double v) {
  char buf[40];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v)
      break;
  }
  // Small rates read better as 3e-4 than 0.0003.
  if (v != 0 && std::fabs(v) < 1e-3)
    std::snprintf(buf, sizeof buf, "%.*e", std::min(prec, 17) - 1, v);
  std::string s = buf;
  // "1e-05" -> "1e-5": TOML allows either; people write the short one.
  size_t e = s.find('e');
  if (e != std::string::npos) {
    std::string mant = s.substr(0, e);
    std::string sign = (s[e + 1] == '-' || s[e + 1] == '+') ? s.substr(e + 1, 1) : "";
    std::string digits = s.substr(e + 1 + sign.size());
    digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));
    s = mant + "e" + (sign == "-" ? "-" : "") + digits;
  } else if (s.find_first_of(".ni") == std::string::npos) {
    s += ".0";
  }
  return s;
}

std::optional<int64_t> parseInt(const std::string &s) {
  if (s.empty())
    return std::nullopt;
  errno = 0;
  char *end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0')
    return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> parseFloat(const std::string &s) {
  if (s.empty())
    return std::nullopt;
  errno = 0;
  char *end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v))
    return std::nullopt;
  return v;
}

//===----------------------------------------------------------------------===//
// The translation
//===----------------------------------------------------------------------===//

} // namespace

std::string mtrunCommandLine(const std::vector<std::string> &mtrunArgs) {
  std::string line = "mtrun PLAN";
  for (const std::string &w : mtrunArgs)
    line += " " + shellQuote(w);
  return line;
}

namespace {

// One spec key as the translation sets it.
struct Setting {
  std::string value;   // TOML text
  std::string source;  // the flag (and value) it came from, for messages
  std::string comment; // written on the line above, when not empty
};

class Translator {
public:
  Translator(const std::vector<std::string> &args, const MegatronImportOptions &options)
      : args_(args), options_(options) {}

  absl::StatusOr<MegatronImportResult> run();

private:
  absl::Status parseLauncher(size_t begin, size_t end);
  absl::Status parseFlags(size_t begin);
  absl::Status finish();
  absl::Status refusalError() const;
  std::string render() const;
  std::string flagAt(const std::string &msg, size_t &end) const;
  std::string inFlags(std::string msg) const;
  std::optional<std::string> rawFlag(const char *flag) const;
  absl::Status vocabulary();

  void set(const char *section, const char *name, std::string value, std::string source,
           std::string comment = "") {
    settings_[std::string(section) + "." + name] = {std::move(value), std::move(source),
                                                    std::move(comment)};
  }
  bool has(const std::string &key) const { return settings_.count(key) != 0; }
  std::optional<int64_t> intOf(const std::string &key) const {
    auto it = settings_.find(key);
    if (it == settings_.end())
      return std::nullopt;
    return parseInt(it->second.value);
  }
  void ignore(const std::string &flag, const std::string &reason) {
    result_.ignoredFlags.push_back({flag, reason});
  }

  const std::vector<std::string> &args_;
  const MegatronImportOptions options_;
  MegatronImportResult result_;
  std::map<std::string, Setting> settings_;

  // Facts gathered while reading flags, resolved in finish().
  std::optional<int64_t> nnodes_, nprocPerNode_, worldSize_;
  std::string worldSource_;
  std::optional<std::string> precisionFlag_;
  bool gqa_ = false;
  bool otherTokenizer_ = false; // --tokenizer-type mt does not have
  bool vocabFromSpec_ = false;  // the spec reads the tokenizer for model.vocab_size
  std::optional<std::pair<std::string, std::string>> tokenizerType_; // value, source
  bool noPositionEmbedding_ = false;
  std::optional<std::pair<int64_t, std::string>> queryGroups_;
  std::optional<std::pair<int64_t, std::string>> layersPerVirtualStage_;
  std::vector<std::pair<std::string, std::string>> lossScaleSettings_; // key, flag
  // Flags mt cannot honour, with their values, and why (what to do), in order.
  std::vector<std::pair<std::string, std::string>> refusals_;
  std::vector<std::string> fp8Flags_; // fp8 flags planned as bf16 (--fp8-as-bf16)
  std::set<std::string> seen_;        // every flag given, spelled with dashes
  size_t flagsBegin_ = 0;                          // first word after the launcher
  std::vector<std::string> settingsNote_;          // why data_parallel_size stays 1
  mutable std::map<int, std::string> lineSources_; // TOML line -> its flag
};

// torchrun / torch.distributed.launch / srun options that fix the world size.
absl::Status Translator::parseLauncher(size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    std::string w = args_[i];
    std::string name = w, value;
    bool inlineValue = false;
    if (size_t eq = w.find('='); startsWith(w, "-") && eq != std::string::npos) {
      name = w.substr(0, eq);
      value = w.substr(eq + 1);
      inlineValue = true;
    }
    std::optional<int64_t> *target = nullptr;
    if (name == "--nproc_per_node" || name == "--nproc-per-node" ||
        name == "--ntasks-per-node" || name == "--gpus-per-node")
      target = &nprocPerNode_;
    else if (name == "--nnodes" || name == "--nodes" || name == "-N")
      target = &nnodes_;
    else
      continue;
    if (!inlineValue) {
      if (i + 1 >= end)
        return absl::InvalidArgumentError(name + " needs a value");
      value = args_[++i];
    }
    // Elastic ranges (`--nnodes 2:4`): the job may run at its largest size.
    std::string count =
        value.substr(value.find(':') == std::string::npos ? 0 : value.find(':') + 1);
    std::optional<int64_t> v = parseInt(count);
    if (!v || *v < 1)
      return absl::InvalidArgumentError(
          absl::StrCat("launcher option ", name, " ", value,
                       " is not a positive number; write a literal count"));
    *target = *v;
    worldSource_ += (worldSource_.empty() ? "" : " ") + name + " " + value;
  }
  return absl::OkStatus();
}

absl::Status Translator::parseFlags(size_t begin) {
  const size_t n = args_.size();
  bool afterUnknown = false;
  for (size_t i = begin; i < n; ++i) {
    const std::string &w = args_[i];
    if (!startsWith(w, "-")) {
      // A further value of a flag we do not know belongs to it; anywhere
      // else argparse would refuse the word, and so do we.
      if (afterUnknown) {
        refusals_.back().first += " " + shellQuote(w);
        continue;
      }
      return absl::InvalidArgumentError(
          "'" + w + "'" + (i > begin ? " after " + args_[i - 1] : std::string()) +
          " is no flag's value; remove it or add the flag it belongs to");
    }
    afterUnknown = false;
    std::string flag = w, inlineValue;
    bool hasInline = false;
    if (size_t eq = w.find('='); eq != std::string::npos) {
      flag = w.substr(0, eq);
      inlineValue = w.substr(eq + 1);
      hasInline = true;
    }
    // torchrun takes both --nproc_per_node and --nproc-per-node; Megatron
    // spells its flags with dashes, and reading `_` the same way loses nothing.
    std::string dashed = flag;
    for (size_t k = 2; k < dashed.size(); ++k)
      if (dashed[k] == '_')
        dashed[k] = '-';
    seen_.insert(dashed);

    auto takeValue = [&](std::string &value) -> absl::Status {
      if (hasInline) {
        value = inlineValue;
        return absl::OkStatus();
      }
      if (i + 1 >= n || startsWith(args_[i + 1], "--"))
        return absl::InvalidArgumentError(flag + " needs a value; write " + flag +
                                          " VALUE");
      value = args_[++i];
      return absl::OkStatus();
    };
    auto noValue = [&]() -> absl::Status {
      if (hasInline)
        return absl::InvalidArgumentError(
            flag + " is a switch and takes no value; write " + flag + " alone");
      return absl::OkStatus();
    };
    auto takeInt = [&](int64_t &out, std::string &text) -> absl::Status {
      if (absl::Status st = takeValue(text); !st.ok())
        return st;
      std::optional<int64_t> v = parseInt(text);
      if (!v)
        return absl::InvalidArgumentError(flag + " expects an integer, got '" + text +
                                          "'");
      out = *v;
      return absl::OkStatus();
    };

    std::string value;
    int64_t iv = 0;

    // mtc's own options, and torchrun's when they come after the script.
    if (dashed == "--world-size" || dashed == "--nnodes" ||
        dashed == "--nproc-per-node") {
      if (absl::Status st = takeInt(iv, value); !st.ok())
        return st;
      if (iv < 1)
        return absl::InvalidArgumentError(flag + " must be at least 1, got " + value);
      (dashed == "--world-size" ? worldSize_
       : dashed == "--nnodes"   ? nnodes_
                                : nprocPerNode_) = iv;
      worldSource_ += (worldSource_.empty() ? "" : " ") + flag + " " + value;
      continue;
    }

    // Flags whose meaning is more than one key = one value.
    if (dashed == "--fp16" || dashed == "--bf16") {
      if (absl::Status st = noValue(); !st.ok())
        return st;
      if (precisionFlag_ && *precisionFlag_ != dashed)
        return absl::InvalidArgumentError(
            "both --fp16 and --bf16 are given; keep the one you mean");
      precisionFlag_ = dashed;
      set("training", "precision", tomlString(dashed.substr(2)), dashed);
      continue;
    }
    if (const Switch *sw = findSwitch(dashed)) {
      if (absl::Status st = noValue(); !st.ok())
        return st;
      set(sw->section, sw->key, sw->value, dashed);
      continue;
    }
    if (dashed == "--group-query-attention") {
      if (absl::Status st = noValue(); !st.ok())
        return st;
      gqa_ = true;
      continue;
    }
    if (dashed == "--num-query-groups") {
      if (absl::Status st = takeInt(iv, value); !st.ok())
        return st;
      queryGroups_ = {iv, flag + " " + value};
      continue;
    }
    if (dashed == "--num-layers-per-virtual-pipeline-stage") {
      if (absl::Status st = takeInt(iv, value); !st.ok())
        return st;
      if (iv < 1)
        return absl::InvalidArgumentError(flag + " must be at least 1, got " + value);
      layersPerVirtualStage_ = {iv, flag + " " + value};
      continue;
    }
    if (dashed == "--num-virtual-stages-per-pipeline-rank") {
      if (absl::Status st = takeInt(iv, value); !st.ok())
        return st;
      set("parallel", "virtual_pipeline_model_parallel_size", std::to_string(iv),
          flag + " " + value);
      continue;
    }
    if (dashed == "--data-path") {
      // A single prefix, or a blend: weight prefix weight prefix ...
      std::vector<std::string> words;
      if (hasInline)
        words.push_back(inlineValue);
      while (i + 1 < n && !startsWith(args_[i + 1], "--"))
        words.push_back(args_[++i]);
      if (words.empty())
        return absl::InvalidArgumentError(
            "--data-path needs a prefix, or weight-prefix pairs for a blend");
      std::vector<std::string> items;
      if (words.size() == 1) {
        set("data", "data_path", tomlString(words[0]), "--data-path " + words[0]);
        continue;
      } else {
        if (words.size() % 2 != 0)
          return absl::InvalidArgumentError(absl::StrCat(
              "--data-path has ", words.size(),
              " words; a blend is pairs of weight and prefix (--data-path 0.3 A 0.7 B)"));
        for (size_t k = 0; k < words.size(); k += 2) {
          std::optional<double> weight = parseFloat(words[k]);
          if (!weight || *weight <= 0)
            return absl::InvalidArgumentError(
                "--data-path blend weight '" + words[k] + "' (before '" + words[k + 1] +
                "') is not a positive number; a blend is pairs of weight and prefix");
          items.push_back(tomlFloat(*weight));
          items.push_back(tomlString(words[k + 1]));
        }
      }
      set("data", "data_path", "[" + absl::StrJoin(items, ", ") + "]",
          "--data-path " + absl::StrJoin(words, " "));
      continue;
    }
    if (dashed == "--encoder-seq-length" || dashed == "--encoder-num-layers" ||
        dashed == "--persistent-save-interval") {
      // Megatron's other names for --seq-length, --num-layers, --save-interval.
      const KeyInfo &k = dashed == "--encoder-seq-length"   ? key("model", "seq_length")
                         : dashed == "--encoder-num-layers" ? key("model", "num_layers")
                                                            : key("training", "save_interval");
      if (absl::Status st = takeInt(iv, value); !st.ok())
        return st;
      set(k.section, k.name, std::to_string(iv), flag + " " + value);
      continue;
    }
    if (dashed == "--ckpt-step") {
      // Megatron's loader tests the value for truth: 0 loads the tracker's
      // iteration, as no flag does.
      if (absl::Status st = takeInt(iv, value); !st.ok())
        return st;
      if (iv == 0)
        ignore(flag + " " + value,
               "Megatron's loader treats 0 as not given and loads the tracker's iteration, as "
               "mt does without training.ckpt_step");
      else
        set("training", "ckpt_step", std::to_string(iv), flag + " " + value);
      continue;
    }
    if (dashed == "--no-position-embedding") {
      // Megatron's Llama recipes pair it with rope; finish() checks that.
      if (absl::Status st = noValue(); !st.ok())
        return st;
      noPositionEmbedding_ = true;
      continue;
    }
    if (dashed == "--tokenizer-type") {
      // A tokenizer mt has goes to the spec (which reads its files); another
      // (BERT's, multimodal) does not stop the translation of tokenized
      // data: vocabulary() takes the size from --vocab-size.
      if (absl::Status st = takeValue(value); !st.ok())
        return st;
      const KeyInfo &k = key("data", "tokenizer_type");
      tokenizerType_ = {value, flag + " " + value};
      if (std::find(k.choices.begin(), k.choices.end(), value) != k.choices.end()) {
        set("data", "tokenizer_type", tomlString(value), flag + " " + value);
      } else {
        otherTokenizer_ = true;
        ignore(flag + " " + shellQuote(value),
               "mt has " + absl::StrJoin(k.choices, ", ") +
                   "; for data tokenized with another, the vocabulary size comes from "
                   "--vocab-size");
      }
      continue;
    }
    if (dashed == "--tokenizer-hf-no-include-special-tokens" ||
        dashed == "--tokenizer-hf-include-special-tokens") {
      if (absl::Status st = noValue(); !st.ok())
        return st;
      set("data", "tokenizer_hf_include_special_tokens",
          dashed == "--tokenizer-hf-include-special-tokens" ? "true" : "false", dashed);
      continue;
    }

    // One key, one value: the key table names the flag.
    if (const KeyInfo *k = keyForFlag(dashed)) {
      std::string src = flag;
      std::string toml;
      switch (k->type) {
      case KeyType::Bool: {
        if (absl::Status st = noValue(); !st.ok())
          return st;
        bool negative = startsWith(dashed, "--no-") || startsWith(dashed, "--disable-");
        toml = negative ? "false" : "true";
        break;
      }
      case KeyType::Int: {
        if (absl::Status st = takeInt(iv, value); !st.ok())
          return st;
        toml = std::to_string(iv);
        src += " " + value;
        break;
      }
      case KeyType::Float:
      case KeyType::DeviceMemory: {
        if (absl::Status st = takeValue(value); !st.ok())
          return st;
        std::optional<double> v = parseFloat(value);
        if (!v)
          return absl::InvalidArgumentError(flag + " expects a number, got '" + value +
                                            "'");
        toml = tomlFloat(*v);
        src += " " + value;
        break;
      }
      case KeyType::Enum: {
        if (absl::Status st = takeValue(value); !st.ok())
          return st;
        const std::string *match = nullptr;
        for (const std::string &c : k->choices)
          if (c == value)
            match = &c;
        if (!match)
          return absl::InvalidArgumentError(flag + " " + value +
                                            " is not supported by mt; use one of " +
                                            absl::StrJoin(k->choices, ", "));
        toml = tomlString(*match);
        src += " " + value;
        break;
      }
      case KeyType::IntList: {
        // argparse's nargs=N (--rampup-batch-size START INCREMENT SAMPLES).
        std::vector<std::string> words, ints;
        if (hasInline)
          words.push_back(inlineValue);
        while (words.size() < size_t(k->listLength) && i + 1 < n &&
               !startsWith(args_[i + 1], "--"))
          words.push_back(args_[++i]);
        for (const std::string &word : words)
          if (std::optional<int64_t> v = parseInt(word))
            ints.push_back(std::to_string(*v));
        if (words.size() != size_t(k->listLength) || ints.size() != words.size())
          return absl::InvalidArgumentError(absl::StrCat(
              flag, " expects ", k->listLength, " integers, got '",
              absl::StrJoin(words, " "), "'",
              dashed == "--rampup-batch-size"
                  ? " (start batch size, batch size increment, ramp-up samples)"
                  : ""));
        toml = "[" + absl::StrJoin(ints, ", ") + "]";
        src += " " + absl::StrJoin(words, " ");
        break;
      }
      case KeyType::StringList: {
        // argparse's nargs='+': the words up to the next flag.
        std::vector<std::string> words, quoted;
        if (hasInline)
          words.push_back(inlineValue);
        else
          while (i + 1 < n && !startsWith(args_[i + 1], "--"))
            words.push_back(args_[++i]);
        if (words.empty())
          return absl::InvalidArgumentError(flag + " needs at least one value; write " + flag +
                                            " VALUE...");
        for (const std::string &word : words) {
          quoted.push_back(tomlString(word));
          src += " " + shellQuote(word);
        }
        toml = "[" + absl::StrJoin(quoted, ", ") + "]";
        break;
      }
      case KeyType::LayerPattern: {
        // --moe-layer-freq: an integer, or a list expression the spec evaluates.
        if (absl::Status st = takeValue(value); !st.ok())
          return st;
        std::optional<int64_t> v = parseInt(value);
        toml = v ? std::to_string(*v) : tomlString(value);
        src += " " + shellQuote(value);
        break;
      }
      case KeyType::String:
      case KeyType::DataPath: {
        if (absl::Status st = takeValue(value); !st.ok())
          return st;
        toml = tomlString(value);
        src += " " + value;
        break;
      }
      }
      // Megatron's nargs='+' MoE flags: a list combines several load-balancing
      // losses, each with its coefficient, which mt does not implement.
      if (dashed == "--moe-router-load-balancing-type" || dashed == "--moe-aux-loss-coeff") {
        std::string more;
        while (i + 1 < n && !startsWith(args_[i + 1], "-"))
          more += " " + shellQuote(args_[++i]);
        if (!more.empty()) {
          refusals_.push_back(
              {src + more, "combining several load-balancing losses is not implemented in "
                           "mt; give one type (and one coefficient)"});
          continue;
        }
      }
      if (std::string(k->section) == "training" &&
          (std::string(k->name) == "initial_loss_scale" ||
           std::string(k->name) == "min_loss_scale" ||
           std::string(k->name) == "loss_scale_window" ||
           std::string(k->name) == "hysteresis"))
        lossScaleSettings_.push_back({std::string(k->section) + "." + k->name, flag});
      set(k->section, k->name, toml, src);
      continue;
    }

    // Every other flag: the table says what it is.
    const MegatronFlag *row = findMegatronFlag(dashed);
    std::vector<std::string> values;
    if (hasInline) {
      values.push_back(inlineValue);
    } else if (!row || row->arity == FlagArity::Value) {
      // An unknown flag takes a plain word after it as its value.
      if (i + 1 < n && !startsWith(args_[i + 1], "--") &&
          (row || !startsWith(args_[i + 1], "-")))
        values.push_back(args_[++i]);
    } else if (row->arity == FlagArity::Values) {
      while (i + 1 < n && (!startsWith(args_[i + 1], "-") || parseFloat(args_[i + 1])))
        values.push_back(args_[++i]);
    }
    std::string shown = flag;
    for (const std::string &v : values)
      shown += " " + shellQuote(v);

    if (!row) {
      std::vector<std::string> names;
      for (const MegatronFlag &f : megatronFlags())
        names.push_back(f.flag);
      std::string hint = didYouMean(dashed, names);
      refusals_.push_back(
          {shown, absl::StrCat("not a flag of Megatron-LM ", kMegatronRelease,
                               hint.empty() ? "" : " (did you mean " + hint + "?)",
                               "; correct it or remove it")});
      afterUnknown = true;
      continue;
    }
    if (row->arity == FlagArity::Switch && hasInline)
      return absl::InvalidArgumentError(flag + " is a switch and takes no value; write " +
                                        flag + " alone");
    if (row->arity != FlagArity::Switch && values.empty())
      return absl::InvalidArgumentError(flag + " needs a value; write " + flag + " VALUE");
    switch (row->status) {
    case FlagStatus::Implemented:
      // The table promises a translation rule above; none took the flag.
      return absl::InternalError("internal error: " + flag +
                                 " is marked implemented but no translation handles it");
    case FlagStatus::Mtrun:
      result_.mtrunArgs.push_back(row->text);
      result_.mtrunArgs.insert(result_.mtrunArgs.end(), values.begin(), values.end());
      break;
    case FlagStatus::NotApplicable:
      ignore(shown, row->text);
      break;
    case FlagStatus::Refused:
      if (values.size() == 1 && acceptsOnlyValue(*row, values[0]))
        ignore(shown, row->onlyWhy);
      else if (row->family == FlagFamily::Fp8 && options_.fp8AsBf16)
        fp8Flags_.push_back(shown);
      else
        refusals_.push_back({shown, row->text});
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status Translator::finish() {
  // Megatron refuses both spellings of one setting.
  for (const auto &[a, b] : {std::pair<const char *, const char *>{"--seq-length",
                                                                   "--encoder-seq-length"},
                             {"--num-layers", "--encoder-num-layers"}})
    if (seen_.count(a) && seen_.count(b))
      return absl::InvalidArgumentError(std::string("both ") + a + " and " + b +
                                        " are given (one setting, two names); keep " + a);

  // Without a learned table only rotary positions remain, which mt has;
  // Megatron refuses the flag with other positions.
  if (noPositionEmbedding_) {
    auto pos = settings_.find("model.position_embedding_type");
    if (pos != settings_.end() && pos->second.value == "\"rope\"")
      ignore("--no-position-embedding", "rope has no learned position table anyway");
    else
      refusals_.push_back({"--no-position-embedding",
                           "Megatron-LM refuses it without rotary positions too; add "
                           "--position-embedding-type rope, or remove it"});
  }
  // Megatron's MoE layers keep the linear layers' biases unless
  // --disable-bias-linear (gpt-oss has them); mt's have none. Refused with
  // the other flags, so that one error names everything to change.
  if (auto experts = settings_.find("model.num_experts");
      experts != settings_.end() && experts->second.value != "0") {
    auto bias = settings_.find("model.add_bias_linear");
    if (bias == settings_.end() || bias->second.value != "false")
      refusals_.push_back(
          {experts->second.source,
           "biases in mixture-of-experts layers (Megatron's default without "
           "--disable-bias-linear) are not implemented in mt; add --disable-bias-linear"});
  }
  if (!refusals_.empty())
    return refusalError();

  // Loss scaling is fp16's; Megatron ignores these flags otherwise, and the
  // spec refuses them, so they move to the ignored list.
  if (!precisionFlag_ || *precisionFlag_ != "--fp16") {
    for (const auto &[k, flag] : lossScaleSettings_) {
      if (settings_.erase(k))
        ignore(flag, "only used with --fp16 (dynamic loss scaling)");
    }
  }

  // Megatron reads --num-query-groups only under --group-query-attention.
  if (gqa_) {
    if (!queryGroups_)
      return absl::InvalidArgumentError(
          "--group-query-attention needs --num-query-groups N (the number of "
          "key/value heads); add it");
    set("model", "num_query_groups", std::to_string(queryGroups_->first),
        queryGroups_->second);
  } else if (queryGroups_) {
    ignore("--num-query-groups",
           "Megatron uses it only with --group-query-attention; add that flag for GQA");
  }

  // fp8 is planned as bf16 only when the user asks for it.
  if (options_.fp8AsBf16) {
    if (fp8Flags_.empty())
      return absl::InvalidArgumentError(
          "--fp8-as-bf16 is given but the command line has no fp8 flag (--fp8-format, "
          "--fp8-recipe, ...); remove --fp8-as-bf16");
    if (precisionFlag_ && *precisionFlag_ == "--fp16")
      return absl::InvalidArgumentError(
          "--fp8-as-bf16 plans the model in bf16, but --fp16 is given; remove one of them");
    std::string flags = absl::StrJoin(fp8Flags_, ", ");
    set("training", "precision", "\"bf16\"", "--fp8-as-bf16",
        "--fp8-as-bf16: the fp8 flags (" + flags + ") are planned as bf16; mt has no fp8");
    result_.notes.push_back("the fp8 flags (" + flags +
                            ") are planned as bf16, as --fp8-as-bf16 asks; mt has no fp8");
  }

  int64_t tp = intOf("parallel.tensor_model_parallel_size").value_or(1);
  int64_t pp = intOf("parallel.pipeline_model_parallel_size").value_or(1);

  // Megatron turns sequence parallelism off at tp 1, with a warning
  // (megatron/training/arguments.py, validate_args); so does the import.
  if (auto sp = settings_.find("parallel.sequence_parallel");
      tp == 1 && sp != settings_.end() && sp->second.value == "true") {
    result_.warnings.push_back(
        sp->second.source +
        " is turned off: tensor parallel size is 1, and Megatron disables sequence "
        "parallelism without tensor parallelism (\"Disabling sequence parallelism because "
        "tensor model parallelism is disabled\")");
    settings_.erase(sp);
  }

  // Megatron's --ddp-reduce-scatter-with-fp32-accumulation sums the
  // distributed optimizer's reduce-scatter in fp32, also when the gradients
  // are bf16 (--grad-reduce-in-bf16); mt sums bf16 gradients in bf16.
  auto isTrue = [&](const char *key) {
    auto it = settings_.find(key);
    return it != settings_.end() && it->second.value == "true";
  };
  if (isTrue("training.grad_reduce_in_bf16") && isTrue("parallel.use_distributed_optimizer") &&
      std::find(args_.begin() + flagsBegin_, args_.end(),
                "--ddp-reduce-scatter-with-fp32-accumulation") != args_.end())
    return absl::InvalidArgumentError(
        "--ddp-reduce-scatter-with-fp32-accumulation with --grad-reduce-in-bf16 and "
        "--use-distributed-optimizer: Megatron then adds the ranks' bf16 gradients in fp32 "
        "in its reduce-scatter, which mt does not (it adds them in bf16); remove "
        "--ddp-reduce-scatter-with-fp32-accumulation, or --grad-reduce-in-bf16 to reduce "
        "in fp32");

  // Megatron reads the numbers out of --split (re.findall("[.0-9]+")), so
  // quotes a script leaves in the value, as in --split "'99,1,0'", do not count.
  if (auto split = rawFlag("--split")) {
    std::vector<std::string> numbers;
    std::string cur;
    for (char c : *split + " ") {
      if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
        cur += c;
      } else if (!cur.empty()) {
        numbers.push_back(cur);
        cur.clear();
      }
    }
    std::string clean = absl::StrJoin(numbers, ",");
    if (!numbers.empty() && clean != *split)
      set("data", "split", tomlString(clean), "--split " + shellQuote(*split),
          "--split " + shellQuote(*split) + ": Megatron reads the numbers in it");
  }

  if (layersPerVirtualStage_) {
    std::optional<int64_t> layers = intOf("model.num_layers");
    if (!layers)
      return absl::InvalidArgumentError(
          layersPerVirtualStage_->second +
          " needs --num-layers to compute the number of virtual stages; add it");
    int64_t per = layersPerVirtualStage_->first;
    if (pp < 1 || tp < 1 || *layers % (pp * per) != 0)
      return absl::InvalidArgumentError(
          absl::StrCat(layersPerVirtualStage_->second, ": num_layers ", *layers,
                       " is not a multiple of pipeline size ", pp, " x ", per,
                       " layers per virtual stage; choose a divisor of ",
                       *layers / std::max<int64_t>(pp, 1)));
    set("parallel", "virtual_pipeline_model_parallel_size",
        std::to_string(*layers / (pp * per)), layersPerVirtualStage_->second,
        absl::StrCat(*layers, " layers / (pp ", pp, " x ", per,
                     " layers per virtual stage), from ",
                     layersPerVirtualStage_->second));
  }

  // The world size is the launcher's business in Megatron; it fixes dp.
  // mtc's --nnodes / --nproc-per-node say the job's size over the command's.
  if (options_.nnodes || options_.nprocPerNode) {
    std::string given;
    if (options_.nnodes) {
      nnodes_ = options_.nnodes;
      given += absl::StrCat("--nnodes ", *options_.nnodes);
    }
    if (options_.nprocPerNode) {
      nprocPerNode_ = options_.nprocPerNode;
      given += absl::StrCat(given.empty() ? "" : " ", "--nproc-per-node ",
                            *options_.nprocPerNode);
    }
    worldSource_ = "mtc import-megatron " + given +
                   (worldSource_.empty() ? "" : ", over the command's " + worldSource_);
    worldSize_.reset();
  }
  std::optional<int64_t> world = worldSize_;
  if (nnodes_ || nprocPerNode_) {
    int64_t nodes = nnodes_.value_or(1);
    int64_t perNode = nprocPerNode_.value_or(1);
    if (world && *world != nodes * perNode)
      return absl::InvalidArgumentError(
          absl::StrCat("--world-size ", *world, " disagrees with ", nodes, " nodes x ",
                       perNode, " processes per node; give one or make them agree"));
    world = nodes * perNode;
    set("cluster", "nodes", std::to_string(nodes), worldSource_);
    set("cluster", "gpus_per_node", std::to_string(perNode), worldSource_);
  }
  if (world) {
    if (tp < 1 || pp < 1 || *world % (tp * pp) != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "world size ", *world, " (", worldSource_,
          ") is not a multiple of tensor x pipeline parallel size ", tp, " x ", pp,
          "; fix the launcher's process count or the parallel sizes"));
    set("parallel", "data_parallel_size", std::to_string(*world / (tp * pp)),
        worldSource_,
        absl::StrCat("world size ", *world, " (", worldSource_, ") / (tp ", tp, " x pp ",
                     pp, ")"));
  } else {
    result_.notes.push_back(
        "the command line does not give the world size, so data_parallel_size "
        "stays 1; set parallel.data_parallel_size and [cluster] nodes / "
        "gpus_per_node to match your job (or pass the torchrun command, or "
        "--world-size N)");
    settingsNote_ = {
        "Megatron takes data_parallel_size from the launcher's world size, which",
        "the command line does not give: set it, and [cluster] nodes and",
        "gpus_per_node, to match your job."};
  }

  if (absl::Status st = vocabulary(); !st.ok())
    return st;
  // Mock data ends documents with the tokenizer's EOD; one mtc cannot read
  // (a hub name, a type it has no reader for) leaves vocab_size - 1.
  if (tokenizerType_ && !otherTokenizer_ && has("data.mock_data") &&
      settings_["data.mock_data"].value == "true" &&
      tokenizerType_->first != "GPT2BPETokenizer" && tokenizerType_->first != "NullTokenizer") {
    std::optional<std::string> model = rawFlag("--tokenizer-model");
    struct stat st {};
    rt::TokenizerOptions o;
    o.type = tokenizerType_->first;
    o.model = model.value_or("");
    bool reads = rt::check_tokenizer_options(o).rfind(
                     "--tokenizer-type " + o.type + " is not supported", 0) != 0;
    std::optional<int64_t> v = intOf("model.vocab_size");
    if ((!model || ::stat(model->c_str(), &st) != 0 || !reads) && v)
      result_.warnings.push_back(absl::StrCat(
          "mock data will end documents with ", *v - 1,
          " (vocab_size - 1): mtc cannot read ",
          model ? "--tokenizer-model " + *model : std::string("the tokenizer"),
          " here, whose end-of-document id Megatron's mock data uses"));
  }

  // Required keys: name the flag that provides each one.
  std::vector<std::string> missing;
  for (const KeyInfo &k : specKeys()) {
    std::string full = std::string(k.section) + "." + k.name;
    if (full == "training.train_iters" && !has(full) && !has("training.train_samples"))
      missing.push_back("training.train_iters or train_samples (--train-iters N or "
                        "--train-samples N)");
    if (full == "model.vocab_size" && !has(full) && !vocabFromSpec_)
      missing.push_back("model.vocab_size (--vocab-size N, or the tokenizer's files: "
                        "--vocab-file with GPT2BPETokenizer, a local --tokenizer-model "
                        "with the other types)");
    if (!k.required || has(full))
      continue;
    std::string how;
    if (!flagOf(k).empty())
      how = flagOf(k) + " N";
    else
      how = "set " + full + " in the spec";
    missing.push_back(full + " (" + how + ")");
  }
  if (!missing.empty())
    return absl::InvalidArgumentError("the command line lacks what a spec requires: " +
                                      absl::StrJoin(missing, ", ") + "; add these flags");
  return absl::OkStatus();
}

absl::Status Translator::refusalError() const {
  if (refusals_.size() == 1)
    return absl::InvalidArgumentError(refusals_[0].first + ": " + refusals_[0].second);
  std::string msg = absl::StrCat(refusals_.size(), " flags mt cannot honour:");
  for (const auto &[flag, why] : refusals_)
    msg += "\n  " + flag + ": " + why;
  return absl::InvalidArgumentError(msg);
}

// The value of the last `--flag VALUE` or `--flag=VALUE` of the script's
// flags, as written.
std::optional<std::string> Translator::rawFlag(const char *flag) const {
  std::optional<std::string> value;
  std::string eq = std::string(flag) + "=";
  for (size_t i = flagsBegin_; i < args_.size(); ++i) {
    if (args_[i] == flag && i + 1 < args_.size())
      value = args_[i + 1];
    else if (startsWith(args_[i], eq))
      value = args_[i].substr(eq.size());
  }
  return value;
}

// The model's vocabulary is the tokenizer's, as Megatron builds it
// (build_tokenizer): from the tokenizer's files when they are given and
// readable, else from --vocab-size. The tokenizer's keys go to [data], where
// mtc reads the files again (and checks the size against them).
absl::Status Translator::vocabulary() {
  std::string type = tokenizerType_ && !otherTokenizer_ ? tokenizerType_->first
                                                         : "GPT2BPETokenizer";
  const bool legacy = has("data.legacy_tokenizer") &&
                      settings_["data.legacy_tokenizer"].value == "true";
  std::optional<int64_t> given = intOf("model.vocab_size");
  std::string givenSource = given ? settings_["model.vocab_size"].source : "";
  auto fromFiles = [&](int64_t n, const std::string &source, const std::string &why) {
    if (given && *given != n)
      result_.warnings.push_back(absl::StrCat(
          givenSource, " is not used: Megatron takes ", type, "'s vocabulary from ", source,
          " (", n, " tokens)"));
    set("model", "vocab_size", std::to_string(n), source, why);
  };

  // Keys of the tokenizer's files that this tokenizer does not use: Megatron
  // ignores their flags, and so does the spec, which would refuse the keys.
  const bool gpt2 = type == "GPT2BPETokenizer", null = type == "NullTokenizer",
             hf = type == "HuggingFaceTokenizer", tik = type == "TikTokenizer",
             sp = type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" ||
                  type == "Llama2Tokenizer";
  const std::string by = otherTokenizer_ ? "by mt for --tokenizer-type " + tokenizerType_->first
                                         : "by --tokenizer-type " + type;
  for (const auto &[k, used] : std::vector<std::pair<std::string, bool>>{
           {"data.vocab_file", !otherTokenizer_ && gpt2},
           {"data.merge_file", !otherTokenizer_ && gpt2},
           {"data.tokenizer_model", !otherTokenizer_ && !gpt2 && !null},
           {"data.tokenizer_special_tokens", !otherTokenizer_ && (hf || sp || tik)},
           {"data.tiktoken_pattern", !otherTokenizer_ && tik},
           {"data.tiktoken_num_special_tokens", !otherTokenizer_ && tik},
           {"data.tiktoken_special_tokens", !otherTokenizer_ && tik},
           {"data.tokenizer_sentencepiece_legacy", !otherTokenizer_ && sp},
           {"data.tokenizer_hf_include_special_tokens", !otherTokenizer_ && hf},
           {"data.legacy_tokenizer", !otherTokenizer_}}) {
    auto it = settings_.find(k);
    if (it == settings_.end() || used)
      continue;
    ignore(it->second.source, "not used " + by);
    settings_.erase(it);
  }
  if (gpt2 && rawFlag("--tokenizer-special-tokens") && !otherTokenizer_)
    return absl::InvalidArgumentError(
        "--tokenizer-special-tokens with GPT2BPETokenizer: mt's GPT-2 tokenizer does not add "
        "special tokens to vocab.json's; remove the flag, or use a tokenizer.json that has "
        "them (HuggingFaceTokenizer)");

  if (null) {
    // --vocab-size N is N ids, the last one EOD, in current Megatron-Core
    // (megatron/core/tokenizers, 0.18 and later); the legacy class
    // (megatron/training/tokenizer) has N + 1, EOD the id after the last.
    if (!given)
      return absl::InvalidArgumentError(
          "--tokenizer-type NullTokenizer needs --vocab-size N (Megatron's NullTokenizer "
          "takes its vocabulary from it); add it");
    if (legacy) {
      set("model", "vocab_size", std::to_string(*given + 1), givenSource,
          absl::StrCat("NullTokenizer (--legacy-tokenizer): ", givenSource,
                       " + 1 for its end-of-document token, as megatron/training/tokenizer "
                       "counts it"));
    } else {
      set("model", "vocab_size", std::to_string(*given), givenSource,
          absl::StrCat("NullTokenizer: ", givenSource, " ids, the last (", *given - 1,
                       ") its end of document, as Megatron-Core 0.18 and later count them"));
      result_.warnings.push_back(absl::StrCat(
          "NullTokenizer: ", givenSource, " gives ", *given, " ids with end of document ",
          *given - 1, " (current Megatron-Core); Megatron-Core up to 0.17.1 gives ",
          *given + 1, " and ", *given, ": add --legacy-tokenizer to match a run of those"));
    }
    return absl::OkStatus();
  }
  if (type == "GPT2BPETokenizer") {
    std::optional<std::string> file = rawFlag("--vocab-file");
    if (!file)
      return absl::OkStatus(); // --vocab-size, or the missing-key error
    absl::StatusOr<int64_t> n = gpt2VocabSize(*file);
    if (n.ok()) {
      fromFiles(*n, "--vocab-file " + *file,
                absl::StrCat("GPT2BPETokenizer: ", *n, " entries in --vocab-file ", *file));
      return absl::OkStatus();
    }
    if (!absl::IsNotFound(n.status()))
      return absl::InvalidArgumentError(std::string(n.status().message()) +
                                        "; check --vocab-file");
    if (given) {
      result_.warnings.push_back(absl::StrCat(
          "cannot read --vocab-file ", *file, ", so the vocabulary comes from ", givenSource,
          "; Megatron takes it from the file: make sure they agree"));
      return absl::OkStatus();
    }
    // The file lives on the cluster: GPT-2's vocab.json has 50257 entries.
    result_.warnings.push_back(absl::StrCat(
        "cannot read --vocab-file ", *file,
        " here; the vocabulary is GPT-2's 50257 tokens, which is what GPT-2's vocab.json "
        "holds; give --vocab-size N (or a readable --vocab-file) if yours differs"));
    set("model", "vocab_size", "50257", "--vocab-file " + *file,
        "GPT-2 BPE vocabulary (--vocab-file with GPT2BPETokenizer): 50257 tokens");
    return absl::OkStatus();
  }
  if (type == "HuggingFaceTokenizer") {
    std::optional<std::string> model = rawFlag("--tokenizer-model");
    if (model) {
      absl::StatusOr<HfVocab> v = hfVocabSize(*model);
      if (v.ok()) {
        fromFiles(v->total, "--tokenizer-model " + *model,
                  absl::StrCat("HuggingFaceTokenizer: ", v->model, " tokens + ",
                               v->total - v->model, " added tokens in ", v->file));
        return absl::OkStatus();
      }
      if (!absl::IsNotFound(v.status()))
        return absl::InvalidArgumentError(std::string(v.status().message()) +
                                          "; check --tokenizer-model");
    }
    std::string why = model ? "--tokenizer-model " + *model +
                                  " is not a local tokenizer.json or a directory holding one"
                            : "--tokenizer-model is not given";
    if (!given)
      return absl::InvalidArgumentError(
          "the vocabulary size is unknown: " + why +
          "; give --vocab-size N, or --tokenizer-model with a local tokenizer.json");
    result_.warnings.push_back(absl::StrCat(
        why, ", so the vocabulary comes from ", givenSource,
        "; Megatron takes it from the tokenizer (len(tokenizer)): make sure they agree"));
    return absl::OkStatus();
  }
  if (sp || tik) {
    // A local file that mt reads: the spec takes the vocabulary from it
    // (Megatron's SentencePiece types ignore --vocab-size; TikTokenizer
    // takes it as a bound, which the spec passes on).
    std::optional<std::string> model = rawFlag("--tokenizer-model");
    struct stat st {};
    bool local = model && ::stat(model->c_str(), &st) == 0;
    rt::TokenizerOptions o;
    o.type = type;
    o.model = model.value_or("");
    std::string bad = rt::check_tokenizer_options(o);
    bool reads = bad.rfind("--tokenizer-type " + type + " is not supported", 0) != 0;
    if (local && reads) {
      vocabFromSpec_ = true;
      if (given && sp) {
        result_.warnings.push_back(absl::StrCat(
            givenSource, " is not used: Megatron takes ", type, "'s vocabulary from ",
            "--tokenizer-model ", *model));
        settings_.erase("model.vocab_size");
      }
      return absl::OkStatus();
    }
    std::string why = !model ? "--tokenizer-model is not given"
                      : !local ? "--tokenizer-model " + *model + " is not a local file"
                               : "mt cannot read " + type + " files yet";
    if (!given)
      return absl::InvalidArgumentError("the vocabulary size is unknown: " + why +
                                        "; give --vocab-size N");
    result_.warnings.push_back(absl::StrCat(
        why, ", so the vocabulary comes from ", givenSource,
        "; Megatron takes it from the tokenizer: make sure they agree"));
    return absl::OkStatus();
  }
  // Another tokenizer (BERT's, multimodal): --vocab-size, or the missing-key error.
  return absl::OkStatus();
}

std::string Translator::render() const {
  std::ostringstream os;
  // The source command, one flag per line so it reads like the script.
  os << "# Translated by `mtc import-megatron` from"
     << (options_.origin.empty() ? "" : " " + options_.origin) << ":\n#  ";
  for (size_t i = 0; i < args_.size(); ++i) {
    if (i > 0 && i >= flagsBegin_ && startsWith(args_[i], "--"))
      os << " \\\n#    ";
    else if (i > 0)
      os << ' ';
    os << shellQuote(args_[i]);
  }
  os << "\n";
  // mtrun's flags are not the spec's: say how to run the plan with them.
  if (!result_.mtrunArgs.empty())
    os << "#\n# Flags of mtrun, not of the spec; run the plan with them:\n#   "
       << mtrunCommandLine(result_.mtrunArgs) << "\n";

  std::string text = os.str();
  int line = 1 + static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  std::ostringstream body;
  auto emit = [&](const std::string &s) {
    body << s << "\n";
    ++line;
  };
  for (const std::string &section : specSections()) {
    bool opened = false;
    for (const KeyInfo &k : specKeys()) {
      if (section != k.section)
        continue;
      std::string full = section + "." + k.name;
      auto it = settings_.find(full);
      bool dpNote = full == "parallel.data_parallel_size" && !settingsNote_.empty();
      if (it == settings_.end() && !dpNote)
        continue;
      if (!opened) {
        emit("");
        emit("[" + section + "]");
        opened = true;
      }
      if (dpNote && it == settings_.end()) {
        for (const std::string &l : settingsNote_)
          emit("# " + l);
        emit("# " + std::string(k.name) + " = 1");
        continue;
      }
      if (!it->second.comment.empty())
        emit("# " + it->second.comment);
      lineSources_[line] = it->second.source;
      emit(std::string(k.name) + " = " + it->second.value);
    }
  }
  if (!result_.ignoredFlags.empty()) {
    emit("");
    emit("# Megatron flags with no meaning for mt:");
    for (const IgnoredFlag &f : result_.ignoredFlags)
      emit("#   " + f.flag + ": " + f.reason);
  }
  if (!result_.warnings.empty()) {
    emit("");
    emit("# Warnings:");
    for (const std::string &w : result_.warnings)
      emit("#   " + w);
  }
  return text + body.str();
}

// At msg[end..] is "LINE:COL" after the source name: returns the flag that
// line came from and moves `end` past the position.
std::string Translator::flagAt(const std::string &msg, size_t &end) const {
  auto digits = [&] {
    size_t start = end;
    while (end < msg.size() && std::isdigit(static_cast<unsigned char>(msg[end])))
      ++end;
    return msg.substr(start, end - start);
  };
  std::string line = digits();
  if (end + 1 < msg.size() && msg[end] == ':' &&
      std::isdigit(static_cast<unsigned char>(msg[end + 1]))) {
    ++end;
    digits();
  }
  auto src = lineSources_.find(std::atoi(line.c_str()));
  return src != lineSources_.end() ? src->second : "line " + line + " of the translation";
}

// A spec error in the flags' terms: the user wrote flags and never saw the
// translated lines the message cites.
std::string Translator::inFlags(std::string msg) const {
  const std::string prefix = "<import-megatron>:";
  std::string primary;
  if (startsWith(msg, prefix)) {
    size_t end = prefix.size();
    primary = flagAt(msg, end);
    size_t err = msg.find("error: ");
    msg = err == std::string::npos ? msg : msg.substr(err + 7);
  }
  for (size_t at = msg.find(prefix); at != std::string::npos; at = msg.find(prefix, at)) {
    size_t end = at + prefix.size();
    std::string src = flagAt(msg, end);
    msg.replace(at, end - at, src);
    at += src.size();
  }
  if (!primary.empty())
    msg += " (" + (startsWith(primary, "-") ? "from " + primary : primary) + ")";
  return msg;
}

absl::StatusOr<MegatronImportResult> Translator::run() {
  // Skip env assignments and `set -x` markers, then the launcher.
  size_t begin = leadingNoise(args_, [](const std::string &w) { return w; });
  size_t script = std::string::npos;
  for (size_t i = begin; i < args_.size(); ++i)
    if (endsWith(args_[i], kScript)) {
      script = i;
      break;
    }
  if (script == std::string::npos && begin < args_.size() &&
      !startsWith(args_[begin], "-")) {
    // Another training script (pretrain_llama.py, a wrapper): same launcher rule.
    for (size_t i = begin; i < args_.size(); ++i)
      if (endsWith(args_[i], ".py")) {
        script = i;
        break;
      }
    if (script == std::string::npos)
      return absl::InvalidArgumentError(
          "'" + args_[begin] +
          "' is not a Megatron flag and no pretrain_gpt.py follows it; pass the "
          "flags of pretrain_gpt.py, or the whole torchrun/python command");
  }
  size_t flagsBegin = begin;
  if (script != std::string::npos) {
    if (absl::Status st = parseLauncher(begin, script); !st.ok())
      return st;
    flagsBegin = script + 1;
  }
  flagsBegin_ = flagsBegin;
  if (absl::Status st = parseFlags(flagsBegin); !st.ok())
    return st;
  if (absl::Status st = finish(); !st.ok())
    return st;

  std::string toml = render();
  absl::StatusOr<Spec> spec = parseSpecString(toml, "<import-megatron>");
  if (!spec.ok())
    return absl::InvalidArgumentError("the translated spec is invalid: " +
                                      inFlags(std::string(spec.status().message())));
  result_.toml = toml;
  return result_;
}

} // namespace

absl::StatusOr<MegatronImportResult>
importMegatronArgs(const std::vector<std::string> &args,
                   const MegatronImportOptions &options) {
  Translator t(args, options);
  return t.run();
}

namespace {

void printImportHelp(std::ostream &os) {
  os << R"(usage: mtc import-megatron [options] --script FILE [SCRIPT_ARGS...]
       mtc import-megatron [options] --args-file FILE   (or @FILE)
       mtc import-megatron [options] ARGS...

Translates a Megatron-LM pretrain_gpt.py command line into a spec.

--script FILE reads a launch script as Megatron-LM's examples write it and
evaluates it the way bash would, without running anything: assignments and
`export`, arrays (`ARGS=( ... )`, `+=`, "${ARGS[@]}"), `${VAR:-default}` and
the other parameter forms, `$1`.. from SCRIPT_ARGS, `$((...))` arithmetic,
`if`/`case`/loops over known values. The process environment is the
script's environment. The one command that runs pretrain_gpt.py (or another
*.py script, through torchrun, python or srun) is translated. Commands mtc
does not run (mkdir, echo, `$(...)`, source) are skipped; when the training
command needs a value they would give, or a variable that is not set, the
error names the line and the variable: set it in the environment
(VAR=value mtc import-megatron ...) or pass the script's arguments after
FILE. Everything after FILE goes to the script.

--args-file FILE reads the command as shell text the same way (a line that
starts with a flag continues the command before it, so a file of flags works);
ARGS is the command as you would run it (torchrun ... pretrain_gpt.py
--num-layers 24 ...), or just its flags, or the whole command as one
quoted argument.

torchrun's --nnodes and --nproc_per_node (or --world-size N) give the world
size, from which data_parallel_size and [cluster] follow; without them
data_parallel_size stays 1.

options (before --script):
  -o FILE, --output FILE  write the spec to FILE (atomically) instead of
                          standard output
  --script FILE [ARGS..]  evaluate a launch script; ARGS are its $1, $2, ...
  --args-file FILE        read the command line from FILE
  --print-command         print the training command after expansion, one
                          flag a line, and stop (nothing is translated)
  --nnodes N, --nproc-per-node N
                          the job's size, over the launcher's in the command
                          (a script written for one node, run on N)
  --fp8-as-bf16           plan the model in bf16 although fp8 flags are given
                          (mt has no fp8); the spec says so in a comment
  --help, -h              this text

Every flag of Megatron-LM core_v0.16.1 has one status (docs/megatron-flags.md,
`mtc megatron-flags`): implemented (it sets spec keys), mtrun's (printed as
the mtrun command line to run the plan with, and written at the top of the
spec), not applicable (reported as ignored, with the reason), or refused. A
refused flag, or one Megatron does not have, stops the import with an error
naming it and what to do, and nothing is written.
)";
}

// The command one flag a line, as a shell would read it back: the launcher
// and the script on the first line, then a line for each of the script's flags.
std::string commandLines(const std::vector<std::string> &words) {
  size_t script = 0;
  for (size_t i = 0; i < words.size(); ++i)
    if (endsWith(words[i], ".py")) {
      script = i;
      break;
    }
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > script && startsWith(words[i], "-"))
      out += " \\\n    ";
    else if (i > 0)
      out += ' ';
    out += shellQuote(words[i]);
  }
  return out + "\n";
}

int importError(const std::string &msg) {
  std::cerr << "mtc import-megatron: error: " << msg << "\n";
  return 1;
}

} // namespace

int runImportMegatronCommand(const std::vector<std::string> &args) {
  std::string output, argsFile, script;
  MegatronImportOptions options;
  bool printCommand = false, haveScript = false;
  std::vector<std::string> words, scriptArgs;
  std::string &origin = options.origin;
  bool optionsDone = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    // mtc's options may come anywhere before --script: Megatron has none of
    // these names. After `--` everything is Megatron's; after --script FILE
    // everything is the script's.
    if (!optionsDone) {
      if (a == "--") {
        optionsDone = true;
        continue;
      }
      if (a == "--help" || a == "-h") {
        printImportHelp(std::cout);
        return 0;
      }
      if (a == "--strict")
        return importError("--strict is no longer an option: every flag mt cannot "
                           "honour is refused now; remove --strict");
      if (a == "--fp8-as-bf16") {
        options.fp8AsBf16 = true;
        continue;
      }
      if (a == "--print-command") {
        printCommand = true;
        continue;
      }
      // Before the command only: torchrun's own --nnodes inside it is the
      // command's (and may be an elastic range).
      if ((a == "--nnodes" || a == "--nproc-per-node") && words.empty()) {
        std::optional<int64_t> n;
        if (i + 1 < args.size())
          n = parseInt(args[i + 1]);
        if (!n || *n < 1)
          return importError(a + " needs a positive count (before --script: the job's " +
                             (a == "--nnodes" ? "nodes" : "processes per node") +
                             "); see 'mtc import-megatron --help'");
        (a == "--nnodes" ? options.nnodes : options.nprocPerNode) = *n;
        ++i;
        continue;
      }
      if (a == "-o" || a == "--output" || a == "--args-file" || a == "--script") {
        if (i + 1 >= args.size())
          return importError(a + " needs a file name; see 'mtc import-megatron --help'");
        (a == "--args-file" ? argsFile : a == "--script" ? script : output) = args[++i];
        if (a == "--script") {
          haveScript = true;
          scriptArgs.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
          break;
        }
        continue;
      }
      if (startsWith(a, "--output=")) {
        output = a.substr(9);
        continue;
      }
      if (startsWith(a, "--args-file=")) {
        argsFile = a.substr(12);
        continue;
      }
      if (startsWith(a, "--script=")) {
        script = a.substr(9);
        haveScript = true;
        scriptArgs.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
        break;
      }
      if (startsWith(a, "@") && a.size() > 1 && words.empty() && argsFile.empty()) {
        argsFile = a.substr(1);
        continue;
      }
    }
    words.push_back(a);
  }
  if (haveScript && (!argsFile.empty() || !words.empty()))
    return importError("both --script and " +
                       (argsFile.empty() ? "a command line ('" + words[0] + "')"
                                         : std::string("--args-file")) +
                       " are given; give one (the script's own arguments go after its name)");
  if (!argsFile.empty() && !words.empty())
    return importError("both --args-file and a command line are given ('" + words[0] +
                       "'); give one");

  // The file's text, evaluated as bash would.
  auto evaluate = [&](const std::string &text, ShellOptions opts) -> std::optional<int> {
    absl::StatusOr<TrainingCommand> cmd = evaluateLaunchScript(text, opts);
    if (!cmd.ok())
      return importError(std::string(cmd.status().message()));
    words = std::move(cmd->words);
    origin = absl::StrCat(opts.source, " line ", cmd->line, ", expanded");
    return std::nullopt;
  };
  std::string file = haveScript ? script : argsFile;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in)
      return importError("cannot read '" + file + "': " + std::strerror(errno) +
                         "; check the path");
    std::stringstream buf;
    buf << in.rdbuf();
    ShellOptions opts;
    opts.source = file;
    opts.args = scriptArgs;
    opts.scriptArgs = haveScript;
    opts.flagLines = !haveScript;
    if (std::optional<int> rc = evaluate(buf.str(), opts))
      return *rc;
  } else if (words.size() == 1 && words[0].find_first_of(" \t\n") != std::string::npos) {
    // The whole command passed as one quoted argument.
    ShellOptions opts;
    opts.flagLines = true;
    if (std::optional<int> rc = evaluate(words[0], opts))
      return *rc;
  }
  if (words.empty())
    return importError("no command line given: mtc import-megatron --script FILE, "
                       "--args-file FILE or ARGS...; see 'mtc import-megatron --help'");
  if (printCommand) {
    std::cout << commandLines(words);
    std::cout.flush();
    return std::cout ? 0 : 1;
  }

  absl::StatusOr<MegatronImportResult> result = importMegatronArgs(words, options);
  if (!result.ok())
    return importError(std::string(result.status().message()));

  for (const IgnoredFlag &f : result->ignoredFlags)
    std::cerr << "mtc import-megatron: ignored " << f.flag << ": " << f.reason << "\n";
  for (const std::string &w : result->warnings)
    std::cerr << "mtc import-megatron: warning: " << w << "\n";
  for (const std::string &n : result->notes)
    std::cerr << "mtc import-megatron: note: " << n << "\n";
  if (!result->mtrunArgs.empty())
    std::cerr << "mtc import-megatron: note: flags of mtrun, not of the spec; run the "
                 "plan with: "
              << mtrunCommandLine(result->mtrunArgs) << "\n";

  if (output.empty()) {
    std::cout << result->toml;
    std::cout.flush();
    return std::cout ? 0 : 1;
  }
  std::string err = rt::write_file_atomically(output, result->toml);
  if (!err.empty())
    return importError(err + "; check the directory exists and is writable");
  return 0;
}

} // namespace mt::spec
