// `mtc import-megatron`: turns a Megatron-LM pretrain_gpt.py command line into
// a spec.toml, so users migrate their launch scripts one to one.
#ifndef MT_SPEC_MEGATRONIMPORT_H
#define MT_SPEC_MEGATRONIMPORT_H

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mt::spec {

// A flag (with its values) that has no meaning for mt, and why.
struct IgnoredFlag {
  std::string flag;
  std::string reason;
};

struct MegatronImportResult {
  std::string toml;                      // the spec, validated
  std::vector<IgnoredFlag> ignoredFlags; // not applicable, in command-line order
  std::vector<std::string> mtrunArgs;    // mtrun's flags and values, to run the plan with
  std::vector<std::string> notes;        // what else the user should know
  std::vector<std::string> warnings;     // what the import changed as Megatron would, and why
};

struct MegatronImportOptions {
  bool fp8AsBf16 = false; // plan fp8 flags as bf16 instead of refusing them
  // The job's size, over the launcher's --nnodes / --nproc_per_node in the
  // command (a script written for one node, run on many).
  std::optional<int64_t> nnodes, nprocPerNode;
  std::string origin;     // where the command came from, for the spec's header
};

// How to evaluate a launch script (MegatronShell.cpp).
struct ShellOptions {
  std::string source = "the command line"; // the script's name in messages
  std::vector<std::string> args;            // $1, $2, ...
  bool scriptArgs = false;  // args come after `--script FILE` (for the advice on $1..)
  bool flagLines = false;   // an argument file: a line of flags continues the command
  std::optional<std::vector<std::string>> environment; // NAME=value; unset: the process's
};

// The training command a script runs, its words expanded as bash would.
struct TrainingCommand {
  std::vector<std::string> words;
  int line = 0;
};

// Evaluates a launch script without running anything: its assignments,
// arrays, `${VAR:-default}`, `$1`.., `$((...))`, `if`/`case`/loops over known
// values. Finds the one command that runs pretrain_gpt.py (or another *.py
// script) and returns its words. A value mtc cannot know (a command's output,
// an unset variable) is an error only when that command uses it, naming the
// line and what to do.
absl::StatusOr<TrainingCommand> evaluateLaunchScript(const std::string &text,
                                                     const ShellOptions &opts);

// An argument file's or a one-string command line's words: evaluateLaunchScript
// in argument-file mode with the process environment.
absl::StatusOr<std::vector<std::string>> splitCommandLine(const std::string &text);

// Maps Megatron flags to spec keys, by the table of spec/MegatronFlags.h: a
// refused or unknown flag fails the import, naming every such flag. Leading
// launcher words (torchrun, python, pretrain_gpt.py and their options) are
// skipped.
absl::StatusOr<MegatronImportResult>
importMegatronArgs(const std::vector<std::string> &args,
                   const MegatronImportOptions &options = {});

// `mtrun PLAN` followed by the given mtrun flags, shell-quoted.
std::string mtrunCommandLine(const std::vector<std::string> &mtrunArgs);

// The `mtc import-megatron` subcommand: args after the subcommand name.
// Writes the spec to stdout or `-o FILE` (atomically), reports to stderr.
int runImportMegatronCommand(const std::vector<std::string> &args);

} // namespace mt::spec

#endif // MT_SPEC_MEGATRONIMPORT_H
