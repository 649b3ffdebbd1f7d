// `mtc import-megatron`: turns a Megatron-LM pretrain_gpt.py command line into
// a spec.toml, so users migrate their launch scripts one to one.
#ifndef MT_SPEC_MEGATRONIMPORT_H
#define MT_SPEC_MEGATRONIMPORT_H

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
};

struct MegatronImportOptions {
  bool fp8AsBf16 = false; // plan fp8 flags as bf16 instead of refusing them
};

// Splits a shell command line the way a POSIX shell would for plain words:
// quotes, backslash escapes, backslash-newline continuations, # comments.
// Refuses unexpanded shell variables ($VAR) with an error naming them.
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
