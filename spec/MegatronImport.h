// `mtc import-megatron`: turns a Megatron-LM pretrain_gpt.py command line into
// a spec.toml, so users migrate their launch scripts one to one.
#ifndef MT_SPEC_MEGATRONIMPORT_H
#define MT_SPEC_MEGATRONIMPORT_H

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mt::spec {

struct MegatronImportResult {
  std::string toml;                      // the spec, validated
  std::vector<std::string> unknownFlags; // flags we do not know at all
  std::vector<std::string> ignoredFlags; // "--flag: why it has no meaning here"
};

// Splits a shell command line the way a POSIX shell would for plain words:
// quotes, backslash escapes, backslash-newline continuations, # comments.
// Refuses unexpanded shell variables ($VAR) with an error naming them.
absl::StatusOr<std::vector<std::string>> splitCommandLine(const std::string &text);

// Maps Megatron flags to spec keys. Leading launcher words (torchrun, python,
// pretrain_gpt.py and their options) are skipped.
absl::StatusOr<MegatronImportResult>
importMegatronArgs(const std::vector<std::string> &args);

// The `mtc import-megatron` subcommand: args after the subcommand name.
// Writes the spec to stdout or `-o FILE` (atomically), reports to stderr.
int runImportMegatronCommand(const std::vector<std::string> &args);

} // namespace mt::spec

#endif // MT_SPEC_MEGATRONIMPORT_H
