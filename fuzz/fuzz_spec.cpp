// Fuzz target: a spec file (TOML) through the parser and validator mtc
// compile uses (spec::parseSpecString, the same code as parseSpecFile after
// reading the file). A refused spec is fine; a crash, a sanitizer report or
// an accepted spec whose echo (spec::toToml, stored in plans and
// checkpoints) does not parse back to the same echo is a finding. The MLIR import and passes
// behind the parser are not fuzzed here (see docs/fuzzing.md).
#include "spec/Spec.h"

#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  absl::StatusOr<mt::spec::Spec> spec = mt::spec::parseSpecString(text, "fuzz.toml");
  if (!spec.ok()) {
    // One line naming the place, as mtc prints it.
    const std::string msg(spec.status().message());
    if (msg.empty() || msg.find('\n') != std::string::npos) {
      std::fprintf(stderr, "fuzz_spec: the error is not one line: '%s'\n", msg.c_str());
      std::abort();
    }
    return 0;
  }
  const std::string echo = mt::spec::toToml(*spec);
  absl::StatusOr<mt::spec::Spec> again = mt::spec::parseSpecString(echo, "fuzz.toml");
  if (!again.ok()) {
    std::fprintf(stderr, "fuzz_spec: an accepted spec's echo is refused: %s\n--- echo\n%s\n",
                 std::string(again.status().message()).c_str(), echo.c_str());
    std::abort();
  }
  if (const std::string echo2 = mt::spec::toToml(*again); echo2 != echo) {
    size_t at = 0;
    while (at < echo.size() && at < echo2.size() && echo[at] == echo2[at])
      ++at;
    at = echo.rfind('\n', at) + 1; // the line where they part
    std::fprintf(stderr, "fuzz_spec: the echo of the echo differs at:\n%s\n--- from:\n%s\n",
                 echo2.substr(at, echo2.find('\n', at) - at).c_str(),
                 echo.substr(at, echo.find('\n', at) - at).c_str());
    std::abort();
  }
  return 0;
}
