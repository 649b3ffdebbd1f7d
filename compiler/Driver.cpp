// The `mtc` command line: subcommands, options, and the compile flow
// (spec -> IR -> pipeline -> output). tools/mtc.cpp only calls runMtc.
#include "compiler/Driver.h"

#include "compiler/import/ImportSpec.h"
#include "compiler/report/MemoryReport.h"
#include "compiler/report/ModelSummary.h"
#include "compiler/plan/PlanWriter.h"
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"
#include "plan_generated.h"
#include "runtime/base/atomic_file.h"
#include "runtime/ckpt/checkpoint_layout.h"
#include "runtime/comm/comm_order.h"
#include "runtime/exec/cuda/cuda_api.h"
#include "runtime/exec/cuda/cuda_device.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "runtime/plan/plan_reader.h"
#include "spec/MegatronFlags.h"
#include "spec/MegatronImport.h"
#include "spec/HfImport.h"
#include "spec/Spec.h"
#include "spec/SpecKeys.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace mlir;

namespace mt {
namespace {

const char *kVersion = "0.1.0";

void printMainHelp(llvm::raw_ostream &os) {
  os << R"(mtc - the mt compiler for training GPT-style language models

usage: mtc <command> [options]

commands:
  compile SPEC.toml       validate a spec, build its IR, run the pipeline, and
                          print the model summary (see 'mtc compile --help')
  import-megatron ARGS    turn a Megatron-LM pretrain_gpt.py command line into a
                          spec (see 'mtc import-megatron --help')
  import-hf DIR           write the spec of a Hugging Face model folder's
                          config.json (see 'mtc import-hf --help')
  reshard --load SRC --plan PLAN --save DST
                          convert a checkpoint to the parallel layout of PLAN
                          (see 'mtc reshard --help')
  spec-keys               print the reference of every spec key (docs/spec.md)
  megatron-flags          print what import-megatron does with every Megatron-LM
                          flag (docs/megatron-flags.md)
  help                    this text

options:
  --help, -h              this text
  --version               print the version
)";
}

void printCompileHelp(llvm::raw_ostream &os) {
  os << R"(usage: mtc compile SPEC.toml [options]

Validates SPEC.toml, imports it into the mt dialect, runs the pass pipeline
(mt-train-pipeline) and prints the model summary and the memory plan per
GPU. With -o it also writes the plan that `mtrun` executes.

options:
  -o FILE, --output FILE   write what --emit selects to FILE (atomically):
                           the plan (default), the summary or the IR
  --set SECTION.KEY=VALUE  override a spec key; VALUE in TOML syntax
                           (repeatable; later ones win), e.g.
                           --set parallel.tensor_model_parallel_size=2
                           --set training.precision=bf16
  --emit=plan|summary|mlir|cuda
                           what -o receives: plan.bin (default; the summary
                           still goes to standard output), the summary and
                           memory plan, the IR after the pipeline, or the
                           generated CUDA C of every kernel (each source
                           after a comment line naming the kernel, its entry
                           point and launch geometry)
  --check-kernels          compile every generated kernel with NVRTC (loaded
                           at run time; no GPU needed) for each architecture
                           of --kernel-archs and print the count; an error
                           names the kernel, the architecture and NVRTC's
                           first error
  --kernel-archs=LIST      architectures --check-kernels compiles for
                           (default sm_80,sm_90; sm_80 or newer, among
                           those the NVRTC found lists)
  --flash-backward=kv64|kv128
                           the flash attention backward's main kernel: kv64
                           (default; 64 key rows a block) or kv128 (128 key
                           rows a block in 8 warps, the query tiles
                           double-buffered in over 48 KiB of shared memory);
                           both compute the same gradients
  --report=text|json       format of the summary and memory plan (default text)
  --no-fuse                skip mt-fuse: every op runs as its own kernel (to
                           compare against the fused plan, which trains the
                           same numbers on the CPU executor)
  --mlir-print-ir-after-all
                           print the IR after every pass (to standard error)
  --mlir-print-ir-after=PASS
                           print the IR after the named pass (e.g. cse)
  --mlir-print-ir-before=PASS, --mlir-print-ir-after-failure,
  --mlir-print-debuginfo, --mlir-timing and other --mlir-* options of MLIR
                           are accepted as well
  --help, -h               this text

On any error, mtc prints one line saying where and what to change, exits
with status 1 and writes no output file.
)";
}

// The pass arguments of mt-train-pipeline, in order.
std::vector<std::string> pipelinePassNames(MLIRContext &context) {
  PassManager pm(&context);
  buildTrainPipeline(pm);
  std::vector<std::string> names;
  for (Pass &pass : pm.getPasses())
    names.push_back(pass.getArgument().str());
  return names;
}

// LLVM reports an unknown pass name on its own, over several lines; check the
// names of --mlir-print-ir-{before,after}=A,B first so the error is ours.
bool checkPassNameOptions(const std::vector<std::string> &mlirArgs) {
  MLIRContext context;
  context.loadDialect<MtDialect, func::FuncDialect>();
  std::vector<std::string> passes = pipelinePassNames(context);
  for (const std::string &arg : mlirArgs) {
    for (const char *opt : {"--mlir-print-ir-after", "--mlir-print-ir-before"}) {
      std::string prefix = std::string(opt) + "=";
      if (arg.rfind(prefix, 0) != 0)
        continue;
      llvm::SmallVector<llvm::StringRef> names;
      llvm::StringRef(arg).drop_front(prefix.size()).split(names, ',');
      for (llvm::StringRef name : names) {
        if (std::find(passes.begin(), passes.end(), name.str()) != passes.end())
          continue;
        std::string hint = spec::didYouMean(name.str(), passes);
        llvm::errs() << "mtc compile: error: " << opt
                     << " names no pass of the pipeline: '" << name << "'; ";
        if (!hint.empty())
          llvm::errs() << "did you mean '" << hint << "'?\n";
        else
          llvm::errs() << "passes are: " << llvm::join(passes, ", ") << "\n";
        return false;
      }
    }
  }
  return true;
}

// Applies the --mlir-* options through LLVM's option parser, which owns them.
bool parseMlirOptions(const std::vector<std::string> &mlirArgs) {
  if (!checkPassNameOptions(mlirArgs))
    return false;
  static bool registered = false;
  if (!registered) {
    // Passes first: the pass-name options list what is registered when they
    // are created.
    registerMtPasses();
    registerAsmPrinterCLOptions();
    registerMLIRContextCLOptions();
    registerPassManagerCLOptions();
    registerDefaultTimingManagerCLOptions();
    registered = true;
  }
  std::vector<const char *> argv = {"mtc"};
  for (const auto &a : mlirArgs)
    argv.push_back(a.c_str());
  std::string err;
  llvm::raw_string_ostream errs(err);
  bool ok = llvm::cl::ParseCommandLineOptions(static_cast<int>(argv.size()),
                                              argv.data(), "mtc", &errs);
  if (!ok) {
    // LLVM's message is multi-line; keep its first line.
    std::string first = err.substr(0, err.find('\n'));
    llvm::errs() << "mtc compile: error: " << first
                 << "; see 'mtc compile --help'\n";
  }
  return ok;
}

struct CompileOptions {
  std::string specPath;
  std::string output;
  std::vector<spec::Override> overrides;
  std::string emit = "plan";
  std::string report = "text";
  std::vector<std::string> mlirArgs;
  PipelineOptions pipeline;
  bool checkKernels = false;
  std::vector<std::string> kernelArchs = {"sm_80", "sm_90"};
  GpuKernelOptions kernels;
};

int usageError(const std::string &msg) {
  llvm::errs() << "mtc compile: error: " << msg << "; see 'mtc compile --help'\n";
  return 1;
}

// Reads `--name VALUE` or `--name=VALUE`; advances i past the value.
bool takeValue(const std::vector<std::string> &args, size_t &i,
               const std::string &name, std::string &value, bool &missing) {
  const std::string &a = args[i];
  missing = false;
  if (a == name) {
    if (i + 1 >= args.size()) {
      missing = true;
      return true;
    }
    value = args[++i];
    return true;
  }
  if (a.rfind(name + "=", 0) == 0) {
    value = a.substr(name.size() + 1);
    return true;
  }
  return false;
}

// Spec -> IR -> mt-train-pipeline. `cliOptions` applies the --mlir-* options
// (IR printing) to this run; variants planned for suggestions run quietly.
OwningOpRef<ModuleOp> compileSpec(MLIRContext &context, const spec::Spec &spec,
                                  const std::string &specPath, bool cliOptions,
                                  const PipelineOptions &pipeline) {
  OwningOpRef<ModuleOp> module = importSpec(context, spec);
  if (failed(verify(*module))) {
    llvm::errs() << "mtc: internal error: the imported IR of '" << specPath
                 << "' does not verify; please report this with the spec\n";
    return nullptr;
  }
  PassManager pm(&context);
  if (cliOptions && failed(applyPassManagerCLOptions(pm))) {
    llvm::errs() << "mtc compile: error: invalid pass manager options; see 'mtc compile --help'\n";
    return nullptr;
  }
  if (cliOptions)
    applyDefaultTimingPassManagerCLOptions(pm);
  buildTrainPipeline(pm, pipeline);
  // The IR is verified once, after the pipeline, not after every pass: on
  // the largest models verifying after every pass cost as much as the
  // passes that changed it. mtc-opt, which every pass test runs, verifies
  // after each pass.
  pm.enableVerifier(false);
  if (failed(pm.run(*module))) {
    if (cliOptions)
      llvm::errs() << "mtc: error: the pass pipeline failed on '" << specPath
                   << "' (diagnostics above); rerun with "
                      "--mlir-print-ir-after-failure to see the IR\n";
    return nullptr;
  }
  if (failed(verify(*module))) {
    llvm::errs() << "mtc: internal error: the IR that mt-train-pipeline made of '" << specPath
                 << "' does not verify (diagnostics above); please report this with the spec\n";
    return nullptr;
  }
  return module;
}

// Each stage's workspace as the plan states it (Memory.workspace): the
// stated cuBLASLt workspace, the GPU steps' kernel workspace and the GPU
// executor's device scalars (loss scale, seed, RNG offsets), all known only
// once the plan is written. Memory rows are per stage, in stage order; every
// rank of a stage has the same.
void addKernelWorkspace(MemoryPlan &memory, const plan::Plan &plan) {
  const auto *ranks = plan.ranks();
  for (uint32_t i = 0; ranks && i < ranks->size(); ++i) {
    const plan::Rank &r = *ranks->Get(i);
    const size_t stage = size_t(r.pp_rank());
    if (r.tp_rank() == 0 && r.dp_rank() == 0 && stage < memory.ranks.size() && r.memory())
      memory.ranks[stage].workspace = int64_t(r.memory()->workspace());
  }
  for (auto [i, r] : llvm::enumerate(memory.ranks))
    if (r.total() > memory.ranks[memory.heaviest].total())
      memory.heaviest = int(i);
}

// Every kernel's CUDA C, each after a comment line that names it.
std::string kernelSources(const plan::Plan &plan) {
  std::string out;
  auto str = [](const flatbuffers::String *s) { return s ? s->str() : std::string(); };
  auto dims = [](const flatbuffers::Vector<uint32_t> *v) {
    std::string s;
    for (uint32_t i = 0; v && i < v->size(); ++i)
      s += (i ? ", " : "") + std::to_string(v->Get(i));
    return "(" + s + ")";
  };
  const auto *kernels = plan.kernels();
  for (uint32_t k = 0; kernels && k < kernels->size(); ++k) {
    const plan::Kernel &kern = *kernels->Get(k);
    if (!kern.cuda_source() || kern.cuda_source()->size() == 0)
      continue; // a gemm kernel: cuBLASLt runs it
    std::string scalars;
    for (uint32_t i = 0; kern.scalar_args() && i < kern.scalar_args()->size(); ++i)
      scalars += (i ? ", " : "") + kern.scalar_args()->Get(i)->str();
    out += "// ===== kernel " + std::to_string(k) + " \"" + str(kern.name()) + "\": entry " +
           str(kern.entry()) + ", grid " + dims(kern.grid()) + ", block " + dims(kern.block()) +
           ", shared_bytes " + std::to_string(kern.shared_bytes()) + ", scalar args (" +
           scalars + ")\n";
    out += str(kern.cuda_source());
  }
  return out;
}

// --check-kernels: every kernel through NVRTC for every architecture. Equal
// sources (the same kernel in every layer) are compiled once.
// "sm_90" -> 90 (validated when the option was read).
int archNumber(const std::string &arch) { return std::stoi(arch.substr(3)); }

// NVRTC and the compile are the runtime's (runtime/exec/cuda/cuda_api, kernel_cache),
// with the options mtrun compiles with, so a kernel that passes here is one
// mtrun can build. NVRTC programs are independent, so the compiles run on
// every core; a failure is reported for the first failing kernel in plan
// order, whatever order the compiles finished in.
int checkKernels(const plan::Plan &plan, const std::vector<std::string> &archs) {
  std::string err;
  const cu::Nvrtc *nvrtc = cu::load_nvrtc(&err);
  if (!nvrtc) {
    llvm::errs() << "mtc compile: error: --check-kernels: " << err << "\n";
    return 1;
  }
  for (const std::string &arch : archs)
    if (std::string why = rt::nvrtc_arch_unsupported(*nvrtc, archNumber(arch)); !why.empty()) {
      llvm::errs() << "mtc compile: error: --kernel-archs: " << why
                   << "; list only those, or set MT_CUDA_HOME to a CUDA toolkit whose NVRTC "
                      "supports "
                   << arch << "\n";
      return 1;
    }
  const std::string version = std::to_string(nvrtc->major) + "." + std::to_string(nvrtc->minor);
  const auto *kernels = plan.kernels();
  uint32_t count = 0;
  std::map<std::string_view, uint32_t> distinct; // source -> first kernel with it
  struct Job {
    uint32_t kernel;
    int arch;
  };
  std::vector<Job> jobs;
  for (uint32_t k = 0; kernels && k < kernels->size(); ++k) {
    const plan::Kernel &kern = *kernels->Get(k);
    if (!kern.cuda_source() || kern.cuda_source()->size() == 0)
      continue; // a gemm kernel: cuBLASLt runs it
    ++count;
    if (distinct.emplace(kern.cuda_source()->string_view(), k).second)
      for (const std::string &arch : archs)
        jobs.push_back({k, archNumber(arch)});
  }
  std::vector<std::string> errors(jobs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const plan::Kernel &kern = *kernels->Get(jobs[j].kernel);
      const std::string entry = kern.entry() ? kern.entry()->str() : "";
      std::string cubin;
      if (!rt::nvrtc_compile(*nvrtc, entry, kern.cuda_source()->str(), jobs[j].arch,
                             rt::nvrtc_options(jobs[j].arch), &cubin, &errors[j]) &&
          errors[j].empty())
        errors[j] = "NVRTC failed without a message";
    }
  };
  const size_t threads =
      std::min<size_t>(jobs.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t)
    pool.emplace_back(work);
  work();
  for (std::thread &t : pool)
    t.join();
  for (size_t j = 0; j < jobs.size(); ++j)
    if (!errors[j].empty()) {
      const plan::Kernel &kern = *kernels->Get(jobs[j].kernel);
      llvm::errs() << "mtc compile: error: kernel " << jobs[j].kernel << " '"
                   << (kern.name() ? kern.name()->str() : "") << "': " << errors[j] << "\n";
      return 1;
    }
  std::string list;
  for (size_t i = 0; i < archs.size(); ++i)
    list += (i == 0 ? "" : i + 1 == archs.size() ? " and " : ", ") + archs[i];
  llvm::outs() << "kernels: " << count << " generated (" << distinct.size() << " distinct source"
               << (distinct.size() == 1 ? "" : "s") << "), compiled with NVRTC " << version
               << " for " << list << "\n";
  return 0;
}

int runCompile(const std::vector<std::string> &args) {

  CompileOptions opts;
  static const std::vector<std::string> known = {
      "--output", "--set", "--emit", "--report", "--no-fuse", "--help", "--check-kernels",
      "--kernel-archs", "--flash-backward",
      "--mlir-print-ir-after-all", "--mlir-print-ir-after"};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    std::string value;
    bool missing = false;
    if (a == "--help" || a == "-h") {
      printCompileHelp(llvm::outs());
      return 0;
    }
    if (a.rfind("--mlir-", 0) == 0) {
      opts.mlirArgs.push_back(a);
      continue;
    }
    if (a == "-o" || takeValue(args, i, "--output", value, missing)) {
      if (a == "-o") {
        if (i + 1 >= args.size())
          return usageError("-o needs a file name");
        value = args[++i];
      }
      if (missing || value.empty())
        return usageError("--output needs a file name");
      opts.output = value;
    } else if (takeValue(args, i, "--set", value, missing)) {
      if (missing)
        return usageError("--set needs SECTION.KEY=VALUE");
      opts.overrides.push_back({value});
    } else if (takeValue(args, i, "--emit", value, missing)) {
      if (value != "plan" && value != "summary" && value != "mlir" && value != "cuda")
        return usageError("--emit must be 'plan', 'summary', 'mlir' or 'cuda', got '" + value +
                          "'");
      opts.emit = value;
    } else if (takeValue(args, i, "--report", value, missing)) {
      if (value != "text" && value != "json")
        return usageError("--report must be 'text' or 'json', got '" + value + "'");
      opts.report = value;
    } else if (a == "--no-fuse") {
      opts.pipeline.fuse = false;
    } else if (a == "--check-kernels") {
      opts.checkKernels = true;
    } else if (takeValue(args, i, "--flash-backward", value, missing)) {
      if (missing)
        return usageError("--flash-backward needs 'kv64' or 'kv128'");
      std::optional<FlashBackward> b = parseFlashBackward(value);
      if (!b)
        return usageError("--flash-backward must be 'kv64' or 'kv128', got '" + value + "'");
      opts.kernels.flashBackward = *b;
    } else if (takeValue(args, i, "--kernel-archs", value, missing)) {
      llvm::SmallVector<llvm::StringRef> archs;
      llvm::StringRef(value).split(archs, ',', -1, false);
      if (missing || archs.empty())
        return usageError("--kernel-archs needs a list such as sm_80,sm_90");
      opts.kernelArchs.clear();
      for (llvm::StringRef arch : archs) {
        arch = arch.trim();
        unsigned number = 0;
        if (!arch.consume_front("sm_") || arch.getAsInteger(10, number) || number == 0)
          return usageError("--kernel-archs takes architectures such as sm_80,sm_90, got '" +
                            value + "'");
        if (number < unsigned(rt::kMinComputeCapability))
          return usageError("--kernel-archs: mt's kernels need sm_" +
                            std::to_string(rt::kMinComputeCapability) +
                            " or newer (bf16 tensor cores, asynchronous copies), got 'sm_" +
                            arch.str() + "'");
        opts.kernelArchs.push_back("sm_" + arch.str());
      }
    } else if (!a.empty() && a[0] == '-') {
      std::string name = a.substr(0, a.find('='));
      std::string hint = spec::didYouMean(name, known);
      return usageError("unknown option '" + a + "'" +
                        (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
    } else if (opts.specPath.empty()) {
      opts.specPath = a;
    } else {
      return usageError("more than one spec given ('" + opts.specPath + "' and '" +
                        a + "'); compile one spec at a time");
    }
  }
  if (opts.specPath.empty())
    return usageError("no spec given: mtc compile SPEC.toml");
  if (!parseMlirOptions(opts.mlirArgs))
    return 1;

  absl::StatusOr<spec::Spec> parsed = spec::parseSpecFile(opts.specPath, opts.overrides);
  if (!parsed.ok()) {
    llvm::errs() << std::string(parsed.status().message()) << "\n";
    return 1;
  }
  const spec::Spec &spec = *parsed;

  MLIRContext context;
  context.loadDialect<MtDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = compileSpec(context, spec, opts.specPath, true, opts.pipeline);
  if (!module)
    return 1;

  MemoryPlan memory = memoryPlanOf(*module, spec);
  // The plan: its GPU steps decide each rank's kernel workspace, which the
  // memory plan states beside cuBLASLt's.
  std::string payload;
  {
    FailureOr<std::string> p = buildPlanPayload(*module, spec, opts.kernels);
    if (failed(p)) {
      llvm::errs() << "mtc: internal error: could not lower '" << opts.specPath
                   << "' to a plan (diagnostics above); please report this with the spec\n";
      return 1;
    }
    payload = std::move(*p);
  }
  const plan::Plan *plan = plan::GetPlan(reinterpret_cast<const uint8_t *>(payload.data()));
  // The pipeline schedule must also complete under NCCL's stricter rules
  // (messages matched by order, no buffering) than the CPU executor's.
  if (std::string e = rt::check_comm_order(*plan); !e.empty()) {
    llvm::errs() << "mtc: internal error: the plan for '" << opts.specPath
                 << "' would not run on GPUs: " << e << "; please report this with the spec\n";
    return 1;
  }
  addKernelWorkspace(memory, *plan);
  suggestFixes(memory, spec, [&](const spec::Spec &variant) -> std::optional<int64_t> {
    MLIRContext ctx;
    ctx.loadDialect<MtDialect, func::FuncDialect>();
    ScopedDiagnosticHandler quiet(&ctx, [](Diagnostic &) { return success(); });
    OwningOpRef<ModuleOp> m = compileSpec(ctx, variant, opts.specPath, false, opts.pipeline);
    if (!m)
      return std::nullopt;
    MemoryPlan p = memoryPlanOf(*m, variant);
    FailureOr<std::string> payload = buildPlanPayload(*m, variant, opts.kernels);
    if (failed(payload))
      return std::nullopt;
    addKernelWorkspace(p, *plan::GetPlan(reinterpret_cast<const uint8_t *>(payload->data())));
    return p.ranks[p.heaviest].total();
  });

  std::string report;
  {
    llvm::raw_string_ostream os(report);
    ModelSummary summary = summarizeModel(*module, spec);
    if (opts.report == "json") {
      std::string js;
      llvm::raw_string_ostream jos(js);
      printSummaryJson(jos, summary, spec);
      llvm::Expected<llvm::json::Value> v = llvm::json::parse(jos.str());
      llvm::json::Object root;
      if (v && v->getAsObject())
        root = *v->getAsObject();
      else if (!v)
        llvm::consumeError(v.takeError());
      root["memory"] = memoryPlanJson(memory);
      os << llvm::formatv("{0:2}", llvm::json::Value(std::move(root))) << "\n";
    } else {
      printSummaryText(os, summary, spec);
      os << "\n";
      printMemoryPlanText(os, memory);
    }
  }

  std::string text;
  if (opts.emit == "cuda") {
    llvm::raw_string_ostream os(text);
    os << kernelSources(*plan);
  }
  if (opts.checkKernels) {
    // Printed before the summary so that a failure is the last line.
    if (int rc = checkKernels(*plan, opts.kernelArchs); rc != 0)
      return rc;
  }

  if (opts.emit == "cuda") {
    if (opts.output.empty())
      llvm::outs() << report;
  } else if (opts.emit == "mlir") {
    llvm::raw_string_ostream os(text);
    module->print(os);
  } else if (opts.emit == "summary") {
    text = report;
  } else {
    llvm::outs() << report;
    if (opts.output.empty())
      return 0;
  }
  if (opts.output.empty()) {
    llvm::outs() << text;
    return 0;
  }
  std::string err;
  if (opts.emit == "plan") {
    // The header, then the payload as built: a plan of hundreds of MB is
    // not copied once more to be written.
    std::string header =
        rt::plan_header(reinterpret_cast<const uint8_t *>(payload.data()), payload.size());
    err = rt::write_pieces_atomically(opts.output, {header, payload});
  } else {
    err = rt::write_file_atomically(opts.output, text);
  }
  if (!err.empty()) {
    llvm::errs() << "mtc: error: " << err << "; check the directory exists and is writable\n";
    return 1;
  }
  // The largest modules hold hundreds of thousands of operations; freeing
  // them one by one only to exit is wasted time, so the module is left to
  // the process's exit (as clang's -disable-free leaves its AST).
  (void)module.release();
  return 0;
}

const char *kReshardHelp = R"(usage: mtc reshard --load SRC --plan PLAN --save DST [--iteration N]

Converts the checkpoint in SRC (the latest, or iteration N) to the tensor,
pipeline and data parallel layout of PLAN (a plan.bin from 'mtc compile' of
the same model with other [parallel] sizes) and saves it into DST, whose
tracker then names that iteration. The source layout comes from the
checkpoint's metadata. Every whole tensor is reassembled from the source rank
files (weights, master copies, Adam moments, the distributed optimizer's
shards) and each target rank's slice is written; the iteration, consumed
samples, optimizer step count and loss-scale state are carried over, so
'mtrun PLAN --load DST' resumes where the source run stopped. The save is
atomic, as mtrun's are.

options:
  --load SRC        the checkpoint directory to convert
  --plan PLAN       the plan whose layout to convert to
  --save DST        where to save the converted checkpoint (not SRC)
  --iteration N     convert iteration N instead of the tracker's
  --help, -h        this text
)";

int runReshard(const std::vector<std::string> &args) {
  std::string load, planPath, save;
  int64_t iteration = -1;
  auto usage = [](const std::string &msg) {
    llvm::errs() << "mtc reshard: error: " << msg << "; see 'mtc reshard --help'\n";
    return 1;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    if (a == "--help" || a == "-h") {
      llvm::outs() << kReshardHelp;
      return 0;
    }
    std::string *dst = a == "--load" ? &load : a == "--plan" ? &planPath : a == "--save" ? &save
                                                                                        : nullptr;
    std::string value;
    std::string key = a.substr(0, a.find('='));
    if (a.find('=') != std::string::npos &&
        (key == "--load" || key == "--plan" || key == "--save" || key == "--iteration")) {
      value = a.substr(a.find('=') + 1);
    } else if (dst || a == "--iteration") {
      if (i + 1 >= args.size())
        return usage(a + " needs a value");
      value = args[++i];
      key = a;
    } else {
      return usage("unknown argument '" + a + "'");
    }
    if (key == "--iteration") {
      char *end = nullptr;
      long long n = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 0)
        return usage("--iteration needs a number >= 0, got '" + value + "'");
      iteration = n;
      continue;
    }
    if (value.empty())
      return usage(key + " needs a value");
    (key == "--load" ? load : key == "--plan" ? planPath : save) = value;
  }
  if (load.empty() || planPath.empty() || save.empty())
    return usage(std::string("missing ") +
                 (load.empty() ? "--load SRC" : planPath.empty() ? "--plan PLAN" : "--save DST"));
  std::string err;
  std::unique_ptr<rt::PlanFile> plan = rt::PlanFile::open(planPath, &err);
  if (!plan) {
    llvm::errs() << "mtc: " << err << "\n";
    return 1;
  }
  std::string summary;
  // Past the file size limit a write fails with EFBIG, which the save
  // reports by file, instead of SIGXFSZ killing mtc silently.
  std::signal(SIGXFSZ, SIG_IGN);
  err = rt::reshard_checkpoint(load, iteration, *plan->plan(), planPath, save, &summary);
  if (!err.empty()) {
    llvm::errs() << "mtc: " << (err.find(": error: ") == std::string::npos ? "error: " : "")
                 << err << "\n";
    return 1;
  }
  llvm::outs() << summary << "\n";
  return 0;
}

} // namespace

int runMtc(int argc, char **argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    printMainHelp(llvm::errs());
    return 1;
  }
  std::string cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    printMainHelp(llvm::outs());
    return 0;
  }
  if (cmd == "--version") {
    llvm::outs() << "mtc " << kVersion << "\n";
    return 0;
  }
  if (cmd == "compile")
    return runCompile(rest);
  if (cmd == "import-megatron")
    return spec::runImportMegatronCommand(rest);
  if (cmd == "import-hf")
    return spec::runImportHfCommand(rest);
  if (cmd == "reshard")
    return runReshard(rest);
  if (cmd == "spec-keys") {
    llvm::outs() << spec::renderKeyReferenceMarkdown();
    return 0;
  }
  if (cmd == "megatron-flags") {
    if (!rest.empty()) {
      llvm::errs() << "mtc megatron-flags: error: it takes no arguments ('" << rest[0]
                   << "'); run 'mtc megatron-flags'\n";
      return 1;
    }
    llvm::outs() << spec::renderMegatronFlagsMarkdown();
    return 0;
  }
  std::string hint = spec::didYouMean(
      cmd, {"compile", "import-megatron", "import-hf", "reshard", "spec-keys", "megatron-flags",
             "help"});
  llvm::errs() << "mtc: error: unknown command '" << cmd << "'"
               << (hint.empty() ? "" : "; did you mean '" + hint + "'?")
               << "; run 'mtc --help' for the list\n";
  return 1;
}

} // namespace mt
