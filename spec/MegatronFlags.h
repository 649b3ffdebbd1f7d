// The one table of Megatron-LM's flags and what `mtc import-megatron` does with
// each: implemented (it sets spec keys), mtrun's (a flag of mtrun with the same
// meaning, carried to the user), not applicable (no meaning for mt, with the
// reason) or refused (import fails naming it). The key table's flags are
// implemented by construction; docs/megatron-flags.md is rendered from here.
#ifndef MT_SPEC_MEGATRONFLAGS_H
#define MT_SPEC_MEGATRONFLAGS_H

#include <string>
#include <vector>

namespace mt::spec {

// The Megatron-LM release whose flags the table covers (Megatron-Core's tag).
inline constexpr char kMegatronRelease[] = "core_v0.16.1";

enum class FlagStatus {
  Implemented,   // takes effect: sets spec keys (`text` says which)
  Mtrun,         // mtrun's flag `text` means the same; import hands it to mtrun
  NotApplicable, // no meaning for mt (`text` says why); import notes it
  Refused,       // import fails naming it (`text` says why and what to do)
};

// What follows the flag on a command line.
enum class FlagArity {
  Switch, // nothing
  Value,  // one word
  Values, // one or more words (nargs '+' or '*', or a count)
};

// Refused flags that an mtc import-megatron option turns into something else.
enum class FlagFamily {
  None,
  Fp8, // --fp8-as-bf16 plans them as bf16
};

struct MegatronFlag {
  std::string flag; // "--num-layers"
  FlagArity arity;
  FlagStatus status;
  // Implemented: what it sets ("model.num_layers", or a sentence); Mtrun: the
  // mtrun flag; NotApplicable: why; Refused: why, and what to do instead.
  std::string text;
  // A Refused flag may be accepted for one value, the one that is mt's own
  // behaviour (`--context-parallel-size 1`); onlyWhy says why it is.
  std::string onlyValue, onlyWhy;
  FlagFamily family = FlagFamily::None;
  // "" for megatron/training/arguments.py (what pretrain_gpt.py parses);
  // "post-training" for megatron/post_training/arguments.py (ModelOpt scripts).
  std::string source;
  bool fromKeyTable = false; // derived from the spec key table
};

// Every flag, sorted by name: the key table's flags and the table's own rows.
const std::vector<MegatronFlag> &megatronFlags();

// The row for a flag (spelled with dashes), or null for a flag Megatron lacks.
const MegatronFlag *findMegatronFlag(const std::string &flag);

// Whether `value` is the one a row accepts (numerically equal for numbers).
bool acceptsOnlyValue(const MegatronFlag &row, const std::string &value);

const char *flagStatusName(FlagStatus s);
const char *flagArityName(FlagArity a);

// docs/megatron-flags.md's table (between its GENERATED markers).
std::string renderMegatronFlagsMarkdown();

} // namespace mt::spec

#endif // MT_SPEC_MEGATRONFLAGS_H
