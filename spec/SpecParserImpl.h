// Internal to spec/: the Parser class and helpers SpecParser.cpp and SpecValidate.cpp share.
#ifndef MT_SPEC_SPECPARSERIMPL_H
#define MT_SPEC_SPECPARSERIMPL_H

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <toml++/toml.h>

#include "spec/Spec.h"
#include "spec/SpecKeys.h"

namespace mt::spec::detail {

// Where a value came from: the spec file or one `--set` override, which acts
// as its own little file so messages point into what the user typed.
struct Loc {
  std::string file;
  int64_t line = 1;
  int64_t col = 1;
  bool hasPosition = true;
  std::string str() const {
    if (!hasPosition)
      return file;
    return file + ":" + std::to_string(line) + ":" + std::to_string(col);
  }
};

// Thrown inside the parser, turned into a Status at the API boundary.
struct SpecError {
  Loc loc;
  std::string message;
};

[[noreturn]] void fail(const Loc &loc, const std::string &what, const std::string &todo);

struct Entry {
  const KeyInfo *info = nullptr;
  const toml::node *value = nullptr; // owned by a document the parser keeps
  Loc keyLoc;
  Loc valueLoc;
};

struct SectionState {
  bool inFile = false; // has a header (or dotted keys) in the spec file
  Loc header;
  std::map<std::string, Entry> entries; // later overrides replace earlier values
};

std::string quote(const std::string &s);
// "float 12.0", "string \"abc\"", "array": a value's type, and the value when short.
std::string got(const toml::node &n);

constexpr int64_t kMaxInt = 2147483647; // 2^31 - 1
constexpr int64_t kMaxSamples = 1000000000000000; // 1e15: the *_samples keys

// Megatron's --moe-layer-freq list expression ("([1]*3+[0]*1)*3", "[0]+[1]*23"):
// Python integers and lists with +, * and parentheses, as megatron/training/
// arguments.py evaluates it (SpecMoe.cpp). Returns false with `err` saying
// what is wrong; an expression of a single integer sets `isInt` and `value`.
struct LayerPattern {
  bool isInt = false;
  int64_t value = 0;
  std::vector<int64_t> list;
};
bool evalLayerPattern(const std::string &text, LayerPattern *out, std::string *err);

class Parser {
public:
  explicit Parser(std::string source) : source(std::move(source)) {}

  Spec run(const std::string &text, const std::vector<Override> &overrides) {
    addDocument(parseDocument(text, source, "fix the TOML syntax"), source, false);
    for (const Override &o : overrides)
      addOverride(o.text);
    checkRequired();
    Spec spec;
    spec.source = source;
    readValues(spec);
    resolveTokenizer(spec);
    resolveModel(spec);
    resolveMoe(spec);
    checkParallel(spec);
    checkMoeParallel(spec);
    resolveTraining(spec);
    checkData(spec);
    resolveCluster(spec);
    return spec;
  }

private:
  std::string source;
  std::vector<std::unique_ptr<toml::table>> docs;
  std::map<std::string, SectionState> sections;

  // Reading the keys, with their types and locations (SpecParser.cpp).
  static Loc locOf(const toml::source_region &r, const std::string &file);
  const toml::table &parseDocument(const std::string &text, const std::string &file,
                                   const std::string &todo);
  static SpecError syntaxError(const toml::parse_error &e, const std::string &file,
                               const std::string &todo);
  void addDocument(const toml::table &root, const std::string &file, bool isOverride);
  void addOverride(const std::string &text);
  void checkValue(const Entry &e);
  void checkRange(const Entry &e, const std::string &name, double x);
  void checkSplit(const Entry &e, const std::string &name);
  void readDataPath(const Entry &e, std::vector<std::pair<double, std::string>> *out);
  void readDeviceMemory(const Entry &e, ClusterConfig *out);
  void checkRequired();
  const Entry *given(const std::string &section, const std::string &name) const;
  void getInt(const char *section, const char *name, int64_t &out);
  void getFloat(const char *section, const char *name, double &out);
  void getBool(const char *section, const char *name, bool &out);
  void getString(const char *section, const char *name, std::string &out);
  void getStrings(const char *section, const char *name, std::vector<std::string> &out);
  template <typename T>
  void getEnum(const char *section, const char *name, T &out, std::initializer_list<T> all);
  void readValues(Spec &spec);

  // Megatron's defaults and the cross-key rules (SpecValidate.cpp).
  Loc at(const std::string &section, const std::string &name) const;
  std::string ref(const std::string &section, const std::string &name,
                  const std::string &value) const;
  std::string ref(const std::string &section, const std::string &name, int64_t v) const;
  void resolveModel(Spec &spec);
  // Mixture of experts (SpecMoe.cpp): moe_layer_freq, Megatron's rules, and
  // what mt does not implement yet.
  void checkLayerPattern(const Entry &e);
  void resolveMoe(Spec &spec);
  void checkMoeParallel(Spec &spec);
  void resolveTokenizer(Spec &spec); // SpecTokenizer.cpp
  void checkParallel(Spec &spec);
  void resolveLength(Spec &spec);
  void resolveTraining(Spec &spec);
  void checkData(Spec &spec);
  void resolveCluster(Spec &spec);
};

} // namespace mt::spec::detail

#endif // MT_SPEC_SPECPARSERIMPL_H
