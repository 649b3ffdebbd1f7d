// mt-checkpoint (see checkpoint_tool.h).
#include "runtime/ckpt/checkpoint_tool.h"

#include "runtime/ckpt/checkpoint_format.h"
#include "runtime/ckpt/checkpoint_layout.h"
#include "runtime/ckpt/hf_import.h"
#include "runtime/plan/plan_reader.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace mt::rt {

namespace {

const char *kMainHelp = R"(usage: mt-checkpoint COMMAND [options]

Looks into mt training checkpoints, exports them to Hugging Face
transformers and starts them from it (docs/checkpoints.md).

commands:
  info CKPT [--iteration N]
      the iteration, the data position, the parallel layout, the optimizer
      and random state (or that they were not saved), every rank file's
      tensors with dtype, shape and size; verifies every checksum
  to-hf CKPT -o DIR [--dtype fp32|bf16|fp16] [--keep-padded-vocab]
        [--max-shard-size SIZE] [--iteration N]
      writes a Hugging Face transformers folder (config.json,
      generation_config.json, model.safetensors or shards with
      model.safetensors.index.json, the tokenizer's files when the spec
      names GPT-2 BPE or tokenizer.json ones) that AutoModelForCausalLM
      and AutoTokenizer load:
      GPT2LMHeadModel for GPT-2-style specs, LlamaForCausalLM for
      Llama-style ones, MixtralForCausalLM for mixtures of experts (one
      expert-parallel rank); every tensor-, pipeline- and data-parallel shard
      merged; the vocabulary cut to the tokenizer's unless
      --keep-padded-vocab; shards above SIZE (default 5GB; KB, MB, GB and
      KiB, MiB, GiB); DIR is written whole or not at all
  from-hf DIR (--spec SPEC | --plan PLAN) -o CKPT
      writes a checkpoint that starts training from the Hugging Face model
      in DIR (config.json, model.safetensors or shards with
      model.safetensors.index.json; F32, BF16 or F16): SPEC is the spec
      'mtc import-hf DIR' writes (edited to any parallel layout), compiled
      here by the mtc beside this program as 'mtc compile SPEC' does, or
      PLAN the plan compiled from it; every tensor is checked against the
      spec, the vocabulary padded to its padded size; iteration 0, a fresh
      optimizer state, in the plan's layout, so that 'mtrun PLAN --load
      CKPT' starts from it; CKPT is written whole or not at all

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
  std::string ckpt, out, dtype = "fp32", shard_size, plan, spec;
  int64_t iteration = -1;
  bool keep_padded = false;
};

// Parses the options of `cmd`; "" or the usage error's text.
std::string parse_args(const std::string &cmd, const std::vector<std::string> &args, Args *a) {
  const bool to_hf = cmd == "to-hf", from_hf = cmd == "from-hf";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &s = args[i];
    auto value = [&](std::string *v) {
      if (i + 1 >= args.size())
        return false;
      *v = args[++i];
      return true;
    };
    std::string v;
    if (from_hf && (s == "-o" || s == "--output")) {
      if (!value(&a->out))
        return s + " needs the checkpoint directory to write";
    } else if (from_hf && s == "--plan") {
      if (!value(&a->plan))
        return "--plan needs the compiled plan (mtc compile SPEC -o PLAN)";
    } else if (from_hf && s == "--spec") {
      if (!value(&a->spec))
        return "--spec needs the spec (mtc import-hf DIR -o SPEC)";
    } else if (!from_hf && s == "--iteration") {
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
      return "mt-checkpoint " + cmd + " takes one " + (from_hf ? "folder" : "checkpoint") +
             ", got '" + a->ckpt + "' and '" + s + "'";
    }
  }
  if (from_hf) {
    if (a->ckpt.empty())
      return "mt-checkpoint from-hf needs the Hugging Face model folder";
    if (a->plan.empty() == a->spec.empty())
      return "mt-checkpoint from-hf needs " +
             std::string(a->plan.empty() ? "--spec SPEC or --plan PLAN" : "one of --spec and --plan") +
             ": the spec to train (from 'mtc import-hf'), or the plan compiled from it";
    if (a->out.empty())
      return "mt-checkpoint from-hf needs -o CKPT, the checkpoint directory to write";
    return "";
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
  int64_t tp = 1, dp = 1, ep = 1, etp = 1;
  if (!(err = first->int_value("tensor_parallel", 1, 1 << 16, 1, &tp)).empty() ||
      !(err = first->int_value("data_parallel", 1, 1 << 16, 1, &dp)).empty() ||
      !(err = first->int_value("expert_model_parallel", 1, 1 << 16, 1, &ep)).empty() ||
      !(err = first->int_value("expert_tensor_parallel", 1, (1 << 16) / ep, 1, &etp)).empty())
    return fail(err);
  if (ep != first->ep_size())
    return fail(first->path() + ": error: its name and header give expert-parallel size " +
                std::to_string(first->ep_size()) + " but its metadata expert_model_parallel " +
                std::to_string(ep) + "; the file is damaged: use an earlier iteration");
  const int pp = first->pp_size();
  const bool distopt = m.values.count("distributed_optimizer") > 0;
  std::printf("checkpoint: %s, iteration %lld\n", a.ckpt.c_str(),
              static_cast<long long>(m.iteration));
  std::printf("consumed samples: train %lld, valid %lld\n",
              static_cast<long long>(m.consumed_train_samples),
              static_cast<long long>(m.consumed_valid_samples));
  const std::string expert =
      (ep > 1 ? ", expert-parallel " + std::to_string(ep) : "") +
      (etp > 1 ? ", expert-tensor-parallel " + std::to_string(etp) : "");
  std::printf("layout: tensor %lld x pipeline %d x data %lld%s, distributed optimizer: %s\n",
              static_cast<long long>(tp), pp, static_cast<long long>(dp), expert.c_str(),
              distopt ? value_or(m, "distributed_optimizer", "").c_str() : "no");
  if (m.values.count("no_save_optim"))
    std::printf("optimizer: not saved (--no-save-optim: load with --no-load-optim or "
                "--finetune), weights trained in %s\n",
                value_or(m, "weights_dtype_in_plan", "f32").c_str());
  else
    std::printf("optimizer: %s, %s steps, weights trained in %s\n",
                value_or(m, "optimizer", "adam").c_str(),
                value_or(m, "optimizer_steps", "?").c_str(),
                value_or(m, "weights_dtype_in_plan", "f32").c_str());
  if (m.values.count("no_save_rng"))
    std::printf("random state: not saved (--no-save-rng: load with --no-load-rng or "
                "--finetune)\n");
  else if (m.rng_state.size() == 2)
    std::printf("random state: seed %llu, dropout drawn for %llu iterations since seeded\n",
                static_cast<unsigned long long>(m.rng_state[0]),
                static_cast<unsigned long long>(m.rng_state[1]));
  else
    std::printf("random state: the seed's, drawn since iteration 0 (not recorded)\n");
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
                arch.empty() ? ("cannot export (" + why + ")").c_str()
                             : hf_class_name(arch).c_str());
  }
  size_t files = 0, tensors = 0;
  uint64_t bytes = 0;
  const int64_t iteration = m.iteration;
  for (int s = 0; s < pp; ++s)
    for (const auto &[r, e] : checkpoint_stage_files(int(tp), int(ep), int(etp))) {
      auto reader = CheckpointReader::open(a.ckpt, iteration, r, s, pp, &err, false, e, int(ep));
      if (!reader)
        return fail(err);
      print_file(*reader, &tensors, &bytes);
      ++files;
      // A file without parameters (an expert writer's of a stage without
      // experts) has no optimizer state beside it.
      if (!distopt || m.values.count("no_save_optim") ||
          value_or(reader->meta(), "param_layout", "x").empty())
        continue;
      auto optim = CheckpointReader::open(a.ckpt, iteration, r, s, pp, &err, true, e, int(ep));
      if (!optim)
        return fail(err);
      print_file(*optim, &tensors, &bytes);
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

// --spec: the spec compiled by the mtc beside this binary into a temporary
// directory (*tmp/plan.bin), as 'mtc compile SPEC -o PLAN' compiles it; this
// tool links no compiler. Returns "" or one error line (with mtc's own).
std::string compile_spec(const std::string &spec, std::string *tmp) {
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string mtc = n > 0 ? std::string(self, size_t(n)) : "";
  mtc = mtc.substr(0, mtc.find_last_of('/') + 1) + "mtc";
  if (n <= 0 || ::access(mtc.c_str(), X_OK) != 0)
    return "mt-checkpoint: error: --spec needs mtc beside this program (" + mtc +
           ") to compile " + spec + "; compile it yourself ('mtc compile " + spec +
           " -o PLAN') and give --plan PLAN";
  const char *base = std::getenv("TMPDIR");
  std::string dir = std::string(base && *base ? base : "/tmp") + "/mt-checkpoint.XXXXXX";
  if (!::mkdtemp(dir.data()))
    return "mt-checkpoint: error: cannot create a temporary directory for the plan: " +
           std::string(std::strerror(errno));
  const std::string plan = dir + "/plan.bin", log = dir + "/mtc.log";
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    const char *argv[] = {mtc.c_str(), "compile", spec.c_str(), "-o", plan.c_str(), nullptr};
    ::execv(mtc.c_str(), const_cast<char *const *>(argv));
    ::_exit(127);
  }
  int status = 0;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string out;
  if (FILE *f = std::fopen(log.c_str(), "r")) {
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0)
      out.append(buf, got);
    std::fclose(f);
  }
  ::unlink(log.c_str());
  if (pid <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ::unlink(plan.c_str());
    ::rmdir(dir.c_str());
    // mtc's errors are its last lines; the summary before them is not needed.
    size_t at = out.find(": error: ");
    at = at == std::string::npos ? 0 : out.rfind('\n', at);
    std::string why = out.substr(at == std::string::npos ? 0 : at + 1);
    while (!why.empty() && why.back() == '\n')
      why.pop_back();
    return why.empty() ? "mt-checkpoint: error: 'mtc compile " + spec + "' failed" : why;
  }
  *tmp = dir;
  return "";
}

int run_from_hf(const Args &a, const SpecModelReader &read_spec,
                const HfConfigReader &read_config) {
  std::string dir = a.ckpt;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  if (!ckpt_detail::is_dir(dir))
    return fail(dir + ": error: not a directory; give the Hugging Face model folder (the one "
                      "holding config.json and model.safetensors)");
  std::string err, tmp;
  std::string plan_path = a.plan;
  if (!a.spec.empty()) {
    if (std::string e = compile_spec(a.spec, &tmp); !e.empty())
      return fail(e + " (nothing was written)");
    plan_path = tmp + "/plan.bin";
  }
  std::unique_ptr<PlanFile> plan = PlanFile::open(plan_path, &err);
  if (!tmp.empty()) { // mapped or not, the file is no longer needed by name
    ::unlink(plan_path.c_str());
    ::rmdir(tmp.c_str());
  }
  if (!plan)
    return fail("mt-checkpoint: " + err);
  const std::string label = a.spec.empty() ? a.plan : a.spec;
  HfModelSpec model, config;
  if (std::string e = read_spec(plan->plan()->spec_toml() ? plan->plan()->spec_toml()->str() : "",
                                label + (a.spec.empty() ? " (its spec)" : ""), &model);
      !e.empty())
    return fail(e);
  if (std::string e = read_config(dir, &config); !e.empty())
    return fail(e + " (nothing was written)");
  std::string summary;
  if (std::string e = import_hf(dir, model, &config, *plan->plan(), label, a.out, &summary);
      !e.empty())
    return fail(e);
  std::printf("%s; train it with 'mtrun %s --load %s'%s\n", summary.c_str(),
              a.spec.empty() ? a.plan.c_str() : "PLAN", a.out.c_str(),
              a.spec.empty() ? "" : (", PLAN compiled from " + a.spec + " as it is").c_str());
  return 0;
}

} // namespace

int run_mt_checkpoint(const std::vector<std::string> &args, const SpecModelReader &read_spec,
                      const HfConfigReader &read_config) {
  if (args.empty()) {
    std::fputs(kMainHelp, stderr);
    return 2;
  }
  const std::string &cmd = args[0];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kMainHelp, stdout);
    return 0;
  }
  if (cmd != "info" && cmd != "to-hf" && cmd != "from-hf")
    return usage_error("unknown command '" + cmd + "' (commands: info, to-hf, from-hf)");
  Args a;
  if (std::string e = parse_args(cmd, std::vector<std::string>(args.begin() + 1, args.end()), &a);
      !e.empty())
    return usage_error(e);
  if (cmd == "from-hf")
    return run_from_hf(a, read_spec, read_config);
  if (std::string e = resolve_checkpoint(&a); !e.empty())
    return fail(e);
  return cmd == "info" ? run_info(a, read_spec) : run_to_hf(a, read_spec);
}

} // namespace mt::rt
