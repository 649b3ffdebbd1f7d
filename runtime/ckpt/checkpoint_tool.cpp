// mt-checkpoint (see checkpoint_tool.h).
#include "runtime/ckpt/checkpoint_tool.h"

#include "runtime/ckpt/checkpoint_format.h"

#include <cstdio>
#include <memory>
#include <sys/stat.h>

namespace mt::rt {

namespace {

const char *kMainHelp = R"(usage: mt-checkpoint COMMAND [options]

Looks into mt training checkpoints and exports them (docs/checkpoints.md).

commands:
  info CKPT [--iteration N]
      the iteration, the data position, the parallel layout, every rank
      file's tensors with dtype, shape and size; verifies every checksum
  to-hf CKPT -o DIR [--dtype fp32|bf16|fp16] [--keep-padded-vocab]
        [--max-shard-size SIZE] [--iteration N]
      writes a Hugging Face transformers folder (config.json,
      generation_config.json, model.safetensors or shards with
      model.safetensors.index.json, the tokenizer's files when the spec
      names GPT-2 BPE or tokenizer.json ones) that AutoModelForCausalLM
      and AutoTokenizer load:
      GPT2LMHeadModel for GPT-2-style specs, LlamaForCausalLM for
      Llama-style ones; every tensor-, pipeline- and data-parallel shard
      merged; the vocabulary cut to the tokenizer's unless
      --keep-padded-vocab; shards above SIZE (default 5GB; KB, MB, GB and
      KiB, MiB, GiB); DIR is written whole or not at all

CKPT is a --save directory (its latest iteration, or --iteration N), an
iter_XXXXXXX directory in one, or a rank file (*.mtckpt) in that.
)";

int usage_error(const std::string &msg) {
  std::fprintf(stderr, "mt-checkpoint: error: %s; run 'mt-checkpoint --help' for the usage\n",
               msg.c_str());
  return 2;
}

int fail(const std::string &msg) {
  std::fprintf(stderr, "%s\n", msg.c_str());
  return 1;
}

struct Args {
  std::string ckpt, out, dtype = "fp32", shard_size;
  int64_t iteration = -1;
  bool keep_padded = false;
};

// Parses the options of `cmd`; "" or the usage error's text.
std::string parse_args(const std::string &cmd, const std::vector<std::string> &args, Args *a) {
  const bool to_hf = cmd == "to-hf";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &s = args[i];
    auto value = [&](std::string *v) {
      if (i + 1 >= args.size())
        return false;
      *v = args[++i];
      return true;
    };
    std::string v;
    if (s == "--iteration") {
      if (!value(&v) || !ckpt_detail::parse_int(v, 0, kMaxCheckpointCount, &a->iteration))
        return "--iteration needs an iteration number";
    } else if (to_hf && (s == "-o" || s == "--output")) {
      if (!value(&a->out))
        return s + " needs the directory to write";
    } else if (to_hf && s == "--dtype") {
      if (!value(&a->dtype) || (a->dtype != "fp32" && a->dtype != "bf16" && a->dtype != "fp16"))
        return "--dtype needs fp32, bf16 or fp16";
    } else if (to_hf && s == "--keep-padded-vocab") {
      a->keep_padded = true;
    } else if (to_hf && s == "--max-shard-size") {
      uint64_t bytes = 0;
      if (!value(&a->shard_size) || !parse_shard_size(a->shard_size, &bytes))
        return "--max-shard-size needs a size such as 5GB, 500MB or 2GiB";
    } else if (!s.empty() && s[0] == '-') {
      return "mt-checkpoint " + cmd + " has no option " + s;
    } else if (a->ckpt.empty()) {
      a->ckpt = s;
    } else {
      return "mt-checkpoint " + cmd + " takes one checkpoint, got '" + a->ckpt + "' and '" + s +
             "'";
    }
  }
  if (a->ckpt.empty())
    return "mt-checkpoint " + cmd + " needs the checkpoint (a --save directory)";
  if (to_hf && a->out.empty())
    return "mt-checkpoint to-hf needs -o DIR, the folder to write";
  return "";
}

// CKPT may also be an iteration directory (SAVE/iter_0000100) or a rank
// file in one, as tools/mt_checkpoint.py takes them: they name SAVE and the
// iteration. Returns "" or one error line.
std::string resolve_checkpoint(Args *a) {
  std::string path = a->ckpt;
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return "mt-checkpoint: error: no checkpoint at " + path +
           " (no such file or directory); give mtrun's --save directory";
  auto split = [](const std::string &p, std::string *dir, std::string *base) {
    size_t slash = p.find_last_of('/');
    *dir = slash == std::string::npos ? "." : p.substr(0, slash);
    *base = slash == std::string::npos ? p : p.substr(slash + 1);
  };
  std::string dir, base;
  if (S_ISREG(st.st_mode)) {
    std::string name = path;
    split(name, &path, &base);
    if (base.size() < 7 || base.compare(base.size() - 7, 7, ".mtckpt") != 0)
      return name + ": error: not a checkpoint; give mtrun's --save directory, an "
                    "iter_XXXXXXX directory in it, or a rank file (*.mtckpt)";
  }
  split(path, &dir, &base);
  int64_t it = -1;
  if (!ckpt_detail::exists(path + "/" + ckpt_detail::kTracker) && base.size() == 12 &&
      base.compare(0, 5, "iter_") == 0 &&
      ckpt_detail::parse_int(base.substr(5), 0, kMaxCheckpointCount, &it)) {
    if (a->iteration >= 0 && a->iteration != it)
      return "mt-checkpoint: error: " + a->ckpt + " is iteration " + std::to_string(it) +
             " but --iteration says " + std::to_string(a->iteration) + "; give one of them";
    a->iteration = it;
    path = dir;
  }
  a->ckpt = path;
  return "";
}

std::string value_or(const CheckpointMeta &m, const char *key, const std::string &dflt) {
  auto it = m.values.find(key);
  return it == m.values.end() ? dflt : it->second;
}

// Prints one rank file's table; returns its tensor count and bytes.
void print_file(const CheckpointReader &r, size_t *tensors, uint64_t *bytes) {
  const std::vector<std::string> names = r.tensor_names();
  uint64_t total = 0;
  for (const std::string &n : names)
    total += r.bytes(n);
  const std::string path = r.path();
  std::printf("%s: %zu tensors, %s\n", path.substr(path.find_last_of('/') + 1).c_str(),
              names.size(), ckpt_detail::size_text(total).c_str());
  size_t w_name = 4, w_shape = 5;
  for (const std::string &n : names) {
    w_name = std::max(w_name, n.size());
    w_shape = std::max(w_shape, ckpt_detail::shape_str(r.shape(n)).size());
  }
  for (const std::string &n : names)
    std::printf("  %-*s  %-4s  %-*s  %s\n", int(w_name), n.c_str(), r.dtype(n).c_str(),
                int(w_shape), ckpt_detail::shape_str(r.shape(n)).c_str(),
                ckpt_detail::size_text(r.bytes(n)).c_str());
  *tensors += names.size();
  *bytes += total;
}

int run_info(const Args &a, const SpecModelReader &read_spec) {
  std::string err;
  auto first = CheckpointReader::open_first(a.ckpt, a.iteration, &err);
  if (!first)
    return fail(err);
  const CheckpointMeta &m = first->meta();
  int64_t tp = 1, dp = 1;
  if (!(err = first->int_value("tensor_parallel", 1, 1 << 16, 1, &tp)).empty() ||
      !(err = first->int_value("data_parallel", 1, 1 << 16, 1, &dp)).empty())
    return fail(err);
  const int pp = first->pp_size();
  const bool distopt = m.values.count("distributed_optimizer") > 0;
  std::printf("checkpoint: %s, iteration %lld\n", a.ckpt.c_str(),
              static_cast<long long>(m.iteration));
  std::printf("consumed samples: train %lld, valid %lld\n",
              static_cast<long long>(m.consumed_train_samples),
              static_cast<long long>(m.consumed_valid_samples));
  std::printf("layout: tensor %lld x pipeline %d x data %lld, distributed optimizer: %s\n",
              static_cast<long long>(tp), pp, static_cast<long long>(dp),
              distopt ? value_or(m, "distributed_optimizer", "").c_str() : "no");
  std::printf("optimizer: %s, %s steps, weights trained in %s\n",
              value_or(m, "optimizer", "adam").c_str(),
              value_or(m, "optimizer_steps", "?").c_str(),
              value_or(m, "weights_dtype_in_plan", "f32").c_str());
  HfModelSpec model;
  if (std::string e = read_spec(m.spec_toml, first->path() + " (its spec)", &model); !e.empty()) {
    std::printf("model: the checkpoint's spec does not read: %s\n", e.c_str());
  } else {
    std::string why;
    const std::string arch = hf_architecture(model, &why);
    std::printf("model: %lld layers, hidden %lld, %lld heads, %lld query groups, vocabulary %lld "
                "(padded %lld); to-hf: %s\n",
                static_cast<long long>(model.num_layers), static_cast<long long>(model.hidden_size),
                static_cast<long long>(model.num_attention_heads),
                static_cast<long long>(model.num_query_groups),
                static_cast<long long>(model.vocab_size),
                static_cast<long long>(model.padded_vocab_size),
                arch == "gpt2"    ? "GPT2LMHeadModel"
                : arch == "llama" ? "LlamaForCausalLM"
                                  : ("cannot export (" + why + ")").c_str());
  }
  size_t files = 0, tensors = 0;
  uint64_t bytes = 0;
  const int64_t iteration = m.iteration;
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < int(tp); ++r)
      for (bool optim : {false, true}) {
        if (optim && !distopt)
          continue;
        auto reader = CheckpointReader::open(a.ckpt, iteration, r, s, pp, &err, optim);
        if (!reader)
          return fail(err);
        print_file(*reader, &tensors, &bytes);
        ++files;
      }
  std::printf("checksums verified: %zu file%s, %zu tensors, %s\n", files, files == 1 ? "" : "s",
              tensors, ckpt_detail::size_text(bytes).c_str());
  return 0;
}

int run_to_hf(const Args &a, const SpecModelReader &read_spec) {
  std::string err;
  auto first = CheckpointReader::open_first(a.ckpt, a.iteration, &err);
  if (!first)
    return fail(err);
  HfModelSpec model;
  if (std::string e = read_spec(first->meta().spec_toml, first->path() + " (its spec)", &model);
      !e.empty())
    return fail(e);
  HfExportOptions o;
  o.dtype = a.dtype;
  o.keep_padded_vocab = a.keep_padded;
  if (!a.shard_size.empty())
    parse_shard_size(a.shard_size, &o.max_shard_bytes);
  std::string summary;
  if (std::string e =
          export_hf(a.ckpt, first->meta().iteration, model, o, a.out, &summary);
      !e.empty())
    return fail(e);
  std::printf("%s\n", summary.c_str());
  return 0;
}

} // namespace

int run_mt_checkpoint(const std::vector<std::string> &args, const SpecModelReader &read_spec) {
  if (args.empty()) {
    std::fputs(kMainHelp, stderr);
    return 2;
  }
  const std::string &cmd = args[0];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kMainHelp, stdout);
    return 0;
  }
  if (cmd != "info" && cmd != "to-hf")
    return usage_error("unknown command '" + cmd + "' (commands: info, to-hf)");
  Args a;
  if (std::string e = parse_args(cmd, std::vector<std::string>(args.begin() + 1, args.end()), &a);
      !e.empty())
    return usage_error(e);
  if (std::string e = resolve_checkpoint(&a); !e.empty())
    return fail(e);
  return cmd == "info" ? run_info(a, read_spec) : run_to_hf(a, read_spec);
}

} // namespace mt::rt
