// `mtc import-hf`: a spec.toml from a Hugging Face model folder's
// config.json (GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM), so that
// `mt-checkpoint from-hf` can load its weights into a plan of that spec.
// docs/checkpoints.md, "Importing from Hugging Face".
#ifndef MT_SPEC_HFIMPORT_H
#define MT_SPEC_HFIMPORT_H

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mt::spec {

struct HfImportResult {
  std::string toml;                // the spec, validated
  std::string architecture;        // "GPT2LMHeadModel", "LlamaForCausalLM", ...
  std::vector<std::string> notes;  // what the user should know or edit
};

// config.json's text to a spec. `source` names the file in errors; `dir` is
// the folder (a tokenizer.json there becomes [data]'s tokenizer). An
// architecture other than the two, or a key that changes the model's math
// in a way mt does not compute, fails the import naming it.
absl::StatusOr<HfImportResult> importHfConfig(const std::string &json, const std::string &source,
                                              const std::string &dir);

// The `mtc import-hf` subcommand: args after the subcommand name. Writes the
// spec to stdout or `-o FILE` (atomically), notes to stderr.
int runImportHfCommand(const std::vector<std::string> &args);

} // namespace mt::spec

#endif // MT_SPEC_HFIMPORT_H
