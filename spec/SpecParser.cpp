// Reads spec.toml (and --set overrides) with TOML++: each key with its type,
// range and location; SpecValidate.cpp then checks the rules between keys.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "absl/status/status.h"
#include "spec/Spec.h"
#include "spec/SpecKeys.h"
#include "spec/SpecParserImpl.h"

namespace mt::spec::detail {

[[noreturn]] void fail(const Loc &loc, const std::string &what, const std::string &todo) {
  throw SpecError{loc, what + "; " + todo};
}

std::string quote(const std::string &s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      r += '\\';
    if (c == '\n')
      r += "\\n";
    else
      r += c;
  }
  return r + "\"";
}

namespace {

std::string floatText(double v) {
  std::string s = formatNumber(v);
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  return s;
}

const char *typeOf(const toml::node &n) {
  switch (n.type()) {
  case toml::node_type::integer:
    return "integer";
  case toml::node_type::floating_point:
    return "float";
  case toml::node_type::string:
    return "string";
  case toml::node_type::boolean:
    return "boolean";
  case toml::node_type::array:
    return "array";
  case toml::node_type::table:
    return "table";
  case toml::node_type::date:
    return "date";
  case toml::node_type::time:
    return "time";
  case toml::node_type::date_time:
    return "date-time";
  default:
    return "nothing";
  }
}


bool parseNumber(const std::string &s, double &out) {
  if (s.empty())
    return false;
  char *end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && errno == 0 && std::isfinite(out);
}

std::string joinQuoted(const std::vector<std::string> &items) {
  std::string r;
  for (size_t i = 0; i < items.size(); ++i)
    r += (i ? ", " : "") + quote(items[i]);
  return r;
}

std::string sectionList() {
  std::string r;
  const auto &s = specSections();
  for (size_t i = 0; i < s.size(); ++i)
    r += (i == 0 ? "" : i + 1 == s.size() ? " and " : ", ") + ("[" + s[i] + "]");
  return r;
}

std::vector<std::pair<const toml::key *, const toml::node *>> inSourceOrder(const toml::table &t) {
  std::vector<std::pair<const toml::key *, const toml::node *>> items;
  for (auto &&[k, v] : t)
    items.emplace_back(&k, &v);
  auto pos = [](const toml::key *k) {
    return std::make_pair(k->source().begin.line, k->source().begin.column);
  };
  std::stable_sort(items.begin(), items.end(),
                   [&](const auto &a, const auto &b) { return pos(a.first) < pos(b.first); });
  return items;
}

// The section a key name belongs to, or "".
std::string findSection(const std::string &name) {
  for (const KeyInfo &k : specKeys())
    if (name == k.name)
      return k.section;
  return "";
}

// "'lr' belongs in [training]" or "did you mean 'x'?" for a key that [section]
// does not have.
std::string keyHint(const std::string &section, const std::string &name) {
  for (const KeyInfo &k : specKeys())
    if (name == k.name && section != k.section)
      return "'" + name + "' belongs in [" + k.section + "]";
  std::vector<std::string> here, all;
  for (const KeyInfo &k : specKeys()) {
    if (section == k.section)
      here.push_back(k.name);
    all.push_back(k.name);
  }
  std::string hint = didYouMean(name, here);
  if (!hint.empty())
    return "did you mean '" + hint + "'?";
  hint = didYouMean(name, all);
  if (!hint.empty())
    return "did you mean '" + hint + "' in [" + findSection(hint) + "]?";
  return "see 'mtc spec-keys' or docs/spec.md for the keys of [" + section + "]";
}

} // namespace

// "float 12.0", "string \"abc\"", "array": the type, and the value when short.
std::string got(const toml::node &n) {
  std::string t = typeOf(n);
  if (auto v = n.value_exact<int64_t>())
    return t + " " + std::to_string(*v);
  if (auto v = n.value_exact<double>())
    return t + " " + floatText(*v);
  if (auto v = n.value_exact<bool>())
    return t + " " + (*v ? "true" : "false");
  if (auto v = n.value_exact<std::string>())
    return t + " " + quote(*v);
  return t;
}

Loc Parser::locOf(const toml::source_region &r, const std::string &file) {
  Loc l;
  l.file = file;
  if (r.begin.line > 0) {
    l.line = r.begin.line;
    l.col = r.begin.column;
  }
  return l;
}

const toml::table &Parser::parseDocument(const std::string &text, const std::string &file,
                                          const std::string &todo) {
  try {
    docs.push_back(std::make_unique<toml::table>(
        toml::parse(std::string_view(text), std::string_view(file))));
  } catch (const toml::parse_error &e) {
    throw syntaxError(e, file, todo);
  }
  return *docs.back();
}

SpecError Parser::syntaxError(const toml::parse_error &e, const std::string &file,
                              const std::string &todo) {
  // TOML++ says "Error while parsing key-value pair: expected value, saw '\n'".
  std::string desc(e.description());
  const std::string prefix = "Error while parsing ";
  if (desc.rfind(prefix, 0) == 0)
    desc = "TOML syntax error while parsing " + desc.substr(prefix.size());
  else
    desc = "TOML syntax error: " + desc;
  for (char &c : desc)
    if (c == '\n' || c == '\r')
      c = ' ';
  return SpecError{locOf(e.source(), file), desc + "; " + todo};
}

void Parser::addDocument(const toml::table &root, const std::string &file, bool isOverride) {
  for (auto [k, v] : inSourceOrder(root)) {
    const std::string name(k->str());
    Loc at = locOf(v->source(), file);
    const toml::table *table = v->as_table();
    bool isSection =
        std::find(specSections().begin(), specSections().end(), name) != specSections().end();
    if (!table) {
      Loc keyAt = locOf(k->source(), file);
      if (isSection)
        fail(keyAt, "'" + name + "' must be a section, got " + got(*v),
             "write [" + name + "] on its own line with the keys below it");
      std::string where = findSection(name);
      if (!where.empty())
        fail(keyAt, "key '" + name + "' is outside any section", "move it under [" + where + "]");
      std::vector<std::string> all;
      for (const KeyInfo &info : specKeys())
        all.push_back(info.name);
      std::string hint = didYouMean(name, all);
      fail(keyAt, "unknown key '" + name + "' outside any section",
           hint.empty() ? "keys live in the sections " + sectionList()
                        : "did you mean '" + hint + "' in [" + findSection(hint) + "]?");
    }
    if (!isSection) {
      std::string hint = didYouMean(name, specSections());
      fail(at, "unknown section [" + name + "]",
           hint.empty() ? "the sections are " + sectionList() : "did you mean [" + hint + "]?");
    }
    SectionState &state = sections[name];
    if (!isOverride && !state.inFile) {
      state.inFile = true;
      state.header = at;
    }
    for (auto [kk, vv] : inSourceOrder(*table)) {
      const std::string keyName(kk->str());
      Entry e;
      e.info = findKey(name, keyName);
      e.value = vv;
      e.keyLoc = locOf(kk->source(), file);
      e.valueLoc = locOf(vv->source(), file);
      if (!e.info)
        fail(e.keyLoc, "unknown key '" + keyName + "' in [" + name + "]", keyHint(name, keyName));
      checkValue(e);
      state.entries[keyName] = e;
    }
  }
}

void Parser::addOverride(const std::string &text) {
  const std::string file = "--set " + text;
  Loc whole{file, 1, 1, false};
  const std::string form = "write it as --set SECTION.KEY=VALUE, e.g. --set model.num_layers=24";
  size_t eq = text.find('=');
  if (eq == std::string::npos)
    fail(whole, "malformed override '" + text + "': no '='", form);
  std::string lhs = text.substr(0, eq);
  size_t b = lhs.find_first_not_of(" \t"), e = lhs.find_last_not_of(" \t");
  lhs = b == std::string::npos ? "" : lhs.substr(b, e - b + 1);
  size_t dot = lhs.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == lhs.size() ||
      lhs.find('.', dot + 1) != std::string::npos) {
    std::string where = dot == std::string::npos ? findSection(lhs) : "";
    if (!where.empty())
      fail(whole, "malformed override '" + text + "': no section before '" + lhs + "'",
           "write --set " + where + "." + text);
    fail(whole, "malformed override '" + text + "': expected SECTION.KEY before '='", form);
  }
  for (char c : lhs)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      fail(whole, "malformed override '" + text + "': '" + lhs + "' is not SECTION.KEY", form);
  size_t vstart = text.find_first_not_of(" \t", eq + 1);
  if (vstart == std::string::npos)
    fail(whole, "malformed override '" + text + "': no value after '='", form);
  if (text.find_first_of("\r\n") != std::string::npos)
    fail(whole, "malformed override: the value spans several lines", "give one value per --set");

  const std::string todo =
      "write VALUE in TOML syntax, e.g. 24, 0.1, true, \"bf16\" or [\"a\", \"b\"]";
  const toml::table *root = nullptr;
  try {
    docs.push_back(std::make_unique<toml::table>(
        toml::parse(std::string_view(text), std::string_view(file))));
    root = docs.back().get();
  } catch (const toml::parse_error &err) {
    // A bare word is a string: --set training.precision=bf16. Quoting keeps
    // the value's column, so later errors still point at it.
    std::string value = text.substr(vstart);
    size_t vend = value.find_last_not_of(" \t");
    value = value.substr(0, vend + 1);
    bool bare = value.find_first_of("\"'\\[]{}=#") == std::string::npos;
    if (!bare)
      throw syntaxError(err, file, todo);
    std::string quoted = text.substr(0, vstart) + "\"" + value + "\"";
    try {
      docs.push_back(std::make_unique<toml::table>(
          toml::parse(std::string_view(quoted), std::string_view(file))));
      root = docs.back().get();
    } catch (const toml::parse_error &) {
      throw syntaxError(err, file, todo);
    }
  }
  addDocument(*root, file, true);
}

// Type and range of one value, as soon as it is read, so the first
// problem in the file is the one reported.
void Parser::checkValue(const Entry &e) {
  const KeyInfo &k = *e.info;
  const toml::node &v = *e.value;
  const std::string name = std::string(k.section) + "." + k.name;
  switch (k.type) {
  case KeyType::Int: {
    if (!v.is_integer()) {
      std::string hint = "write a whole number without quotes";
      // A whole float in range: the same number as an integer. One outside
      // (1e300) has no integer form to suggest.
      if (auto d = v.value_exact<double>(); d && std::floor(*d) == *d && std::isfinite(*d)) {
        const bool low = *d < k.min || (k.minExclusive && *d == k.min);
        const bool high = *d > k.max || (k.maxExclusive && *d == k.max) || *d > double(kMaxInt);
        const std::string range =
            std::isfinite(k.max) ? rangeText(k)
            : std::isfinite(k.min) ? rangeText(k) + " and <= " + std::to_string(kMaxInt)
                                   : "<= " + std::to_string(kMaxInt);
        hint = low || high ? "use a whole number " + range
                           : "write " + formatNumber(*d) + " without the decimal point";
      }
      fail(e.valueLoc, name + " must be an integer, got " + got(v), hint);
    }
    checkRange(e, name, static_cast<double>(*v.value_exact<int64_t>()));
    return;
  }
  case KeyType::Float: {
    if (!v.is_number())
      fail(e.valueLoc, name + " must be a number, got " + got(v),
           v.is_string() ? "write the number without quotes" : "write a number such as 0.1");
    checkRange(e, name, *v.value<double>());
    return;
  }
  case KeyType::Bool:
    if (!v.is_boolean())
      fail(e.valueLoc, name + " must be true or false, got " + got(v),
           "write true or false without quotes");
    return;
  case KeyType::String:
    if (!v.is_string())
      fail(e.valueLoc, name + " must be a string, got " + got(v),
           "put the value in double quotes");
    if (std::string(k.name) == "split")
      checkSplit(e, name);
    return;
  case KeyType::Enum: {
    if (!v.is_string())
      fail(e.valueLoc,
           name + " must be a string, one of " + joinQuoted(k.choices) + ", got " + got(v),
           "put the value in double quotes");
    std::string s = *v.value_exact<std::string>();
    if (std::find(k.choices.begin(), k.choices.end(), s) != k.choices.end())
      return;
    std::string hint = didYouMean(s, k.choices);
    fail(e.valueLoc, name + " must be one of " + joinQuoted(k.choices) + ", got " + quote(s),
         hint.empty() ? "use one of those values" : "did you mean " + quote(hint) + "?");
  }
  case KeyType::DataPath:
    readDataPath(e, nullptr);
    return;
  case KeyType::DeviceMemory:
    readDeviceMemory(e, nullptr);
    return;
  case KeyType::StringList: {
    const std::string form = "write strings in brackets, e.g. " + name + " = [\"<unk>\", \"<s>\"]";
    const toml::array *a = v.as_array();
    if (!a)
      fail(e.valueLoc, name + " must be an array of strings, got " + got(v), form);
    if (a->empty())
      fail(e.valueLoc, name + " is an empty array", form + ", or remove the key");
    for (const toml::node &item : *a)
      if (!item.is_string())
        fail(locOf(item.source(), e.valueLoc.file), name + " must hold strings, got " + got(item),
             form);
    return;
  }
  case KeyType::LayerPattern:
    checkLayerPattern(e);
    return;
  case KeyType::IntList: {
    // rampup_batch_size = [16, 16, 5859375]: the flag's three numbers.
    const std::string form = "write " + std::to_string(k.listLength) + " whole numbers in "
                             "brackets, e.g. " + name + " = [16, 16, 5859375]";
    const toml::array *a = v.as_array();
    if (!a)
      fail(e.valueLoc, name + " must be an array of " + std::to_string(k.listLength) +
                           " integers, got " + got(v),
           form);
    if (a->size() != size_t(k.listLength))
      fail(e.valueLoc, name + " must have " + std::to_string(k.listLength) +
                           " integers, got " + std::to_string(a->size()),
           form);
    for (const toml::node &item : *a) {
      Entry one = e;
      one.value = &item;
      one.valueLoc = locOf(item.source(), e.valueLoc.file);
      if (!item.is_integer())
        fail(one.valueLoc, name + " must hold integers, got " + got(item), form);
      checkRange(one, name, static_cast<double>(*item.value_exact<int64_t>()));
    }
    return;
  }
  }
}

void Parser::checkRange(const Entry &e, const std::string &name, double x) {
  const KeyInfo &k = *e.info;
  if (!std::isfinite(x))
    fail(e.valueLoc, name + " must be a finite number, got " + got(*e.value),
         "use a value " + rangeText(k));
  bool low = x < k.min || (k.minExclusive && x == k.min);
  bool high = x > k.max || (k.maxExclusive && x == k.max);
  if (low || high)
    fail(e.valueLoc, name + " must be " + rangeText(k) + ", got " + got(*e.value),
         "use a value in that range");
  // Sizes multiply (world size, 4 * hidden_size, batch * dp); a 32-bit cap
  // keeps every product the checks form inside int64.
  // Sample counts of a whole run may pass 2^31 (tokens / seq_length); they
  // only add and compare.
  const std::string key = k.name;
  const bool samples = key.size() > 8 && key.compare(key.size() - 8, 8, "_samples") == 0;
  const int64_t cap = samples ? kMaxSamples : kMaxInt;
  if ((k.type == KeyType::Int || k.type == KeyType::IntList) && x > double(cap))
    fail(e.valueLoc, name + " must be <= " + std::to_string(cap) + ", got " + got(*e.value),
         "use a smaller value");
}

void Parser::checkSplit(const Entry &e, const std::string &name) {
  // Megatron splits on ',' if present, else on '/'.
  std::string s = *e.value->value_exact<std::string>();
  char sep = s.find(',') != std::string::npos ? ',' : '/';
  std::vector<double> parts;
  std::stringstream ss(s);
  std::string item;
  bool ok = !s.empty();
  while (ok && std::getline(ss, item, sep)) {
    size_t b = item.find_first_not_of(" \t"), en = item.find_last_not_of(" \t");
    double d = 0;
    ok = b != std::string::npos && parseNumber(item.substr(b, en - b + 1), d) && d >= 0;
    parts.push_back(d);
  }
  if (!s.empty() && s.back() == sep)
    ok = false;
  if (!ok || parts.empty() || parts.size() > 3)
    fail(e.valueLoc,
         name + " must be 1 to 3 non-negative numbers separated by ',' or '/', got " + quote(s),
         "write train, validation and test proportions, e.g. split = \"969,30,1\"");
  double sum = 0;
  for (double d : parts)
    sum += d;
  if (sum <= 0)
    fail(e.valueLoc, name + " = " + quote(s) + " gives no samples to any split",
         "make at least one part positive, e.g. split = \"969,30,1\"");
}

// Checks data_path's shape; fills `out` when given.
void Parser::readDataPath(const Entry &e, std::vector<std::pair<double, std::string>> *out) {
  const std::string form =
      "write a prefix \"path/corpus_text_document\", [\"prefix\"] or a blend "
      "[w1, \"prefix1\", w2, \"prefix2\", ...]";
  auto prefix = [&](const toml::node &n, const std::string &what) {
    if (!n.is_string())
      fail(locOf(n.source(), e.valueLoc.file),
           "data.data_path " + what + " must be a dataset prefix (a string), got " + got(n),
           form);
    std::string p = *n.value_exact<std::string>();
    if (p.empty())
      fail(locOf(n.source(), e.valueLoc.file), "data.data_path has an empty prefix",
           "give the dataset prefix, or remove data_path");
    return p;
  };
  std::vector<std::pair<double, std::string>> blend;
  if (e.value->is_string()) {
    blend.emplace_back(1.0, prefix(*e.value, "value"));
  } else if (const toml::array *a = e.value->as_array()) {
    if (a->empty())
      fail(e.valueLoc, "data.data_path is an empty array", form + ", or remove data_path");
    if (a->size() == 1) {
      blend.emplace_back(1.0, prefix(*a->get(0), "element 1"));
    } else {
      if (a->size() % 2 != 0)
        fail(e.valueLoc,
             "data.data_path blend has " + std::to_string(a->size()) +
                 " elements; a blend alternates weight and prefix",
             "give a weight before every prefix: [w1, \"prefix1\", w2, \"prefix2\", ...]");
      for (size_t i = 0; i < a->size(); i += 2) {
        const toml::node &w = *a->get(i);
        Loc wAt = locOf(w.source(), e.valueLoc.file);
        double weight = 0;
        std::string what = "element " + std::to_string(i + 1);
        if (auto d = w.value<double>(); d && w.is_number())
          weight = *d;
        else if (!w.is_string() || !parseNumber(*w.value_exact<std::string>(), weight))
          fail(wAt,
               "data.data_path " + what + " must be a weight (a number or numeric string), got " +
                   got(w),
               form);
        if (!(weight > 0) || !std::isfinite(weight))
          fail(wAt, "data.data_path weight must be > 0, got " + got(w),
               "give every dataset a positive weight, or drop it from the blend");
        blend.emplace_back(weight, prefix(*a->get(i + 1), "element " + std::to_string(i + 2)));
      }
    }
  } else {
    fail(e.valueLoc, "data.data_path must be a string or an array, got " + got(*e.value), form);
  }
  if (out)
    *out = blend;
}

void Parser::readDeviceMemory(const Entry &e, ClusterConfig *out) {
  const toml::node &v = *e.value;
  std::vector<std::string> names;
  for (const DevicePreset &p : devicePresets())
    names.push_back(p.name);
  if (v.is_string()) {
    std::string s = *v.value_exact<std::string>();
    for (const DevicePreset &p : devicePresets())
      if (s == p.name) {
        if (out) {
          out->device = p.name;
          out->device_memory_bytes = p.bytes;
        }
        return;
      }
    std::string hint = didYouMean(s, names);
    fail(e.valueLoc,
         "cluster.device_memory " + quote(s) +
             " is not a known device (presets: " + joinQuoted(names) + ")",
         hint.empty() ? "use a preset, or give the memory in GiB as a number, e.g. "
                        "device_memory = 80"
                      : "did you mean " + quote(hint) +
                            "? (a number gives the memory in GiB, e.g. device_memory = 80)");
  }
  if (!v.is_number())
    fail(e.valueLoc,
         "cluster.device_memory must be a preset name or a size in GiB, got " + got(v),
         "write e.g. device_memory = \"H100-80GB\" or device_memory = 80");
  double gib = *v.value<double>();
  if (!(gib > 0) || !(gib <= 1048576))
    fail(e.valueLoc, "cluster.device_memory must be in (0, 1048576] GiB, got " + got(v),
         "give the memory of one GPU in GiB, e.g. device_memory = 80");
  if (out) {
    out->device = "custom";
    out->device_memory_bytes = std::llround(gib * static_cast<double>(1LL << 30));
  }
}

void Parser::checkRequired() {
  for (const KeyInfo &k : specKeys()) {
    if (!k.required || given(k.section, k.name))
      continue;
    auto it = sections.find(k.section);
    std::string sec = std::string("[") + k.section + "]";
    std::string doc = k.doc;
    if (!doc.empty() && doc.back() == '.')
      doc.pop_back();
    if (!doc.empty())
      doc[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(doc[0])));
    if (it != sections.end() && it->second.inFile)
      fail(it->second.header, sec + " is missing the required key '" + k.name + "' (" + doc + ")",
           std::string("add ") + k.name + " = VALUE to " + sec);
    fail(Loc{source, 1, 1},
         std::string("missing required key '") + k.name + "' (" + doc + "): the spec has no " +
             sec + " section",
         "add a " + sec + " section with " + k.name + " = VALUE");
  }
}

const Entry *Parser::given(const std::string &section, const std::string &name) const {
  auto it = sections.find(section);
  if (it == sections.end())
    return nullptr;
  auto e = it->second.entries.find(name);
  return e == it->second.entries.end() ? nullptr : &e->second;
}

void Parser::getInt(const char *section, const char *name, int64_t &out) {
  if (const Entry *e = given(section, name))
    out = *e->value->value_exact<int64_t>();
}
void Parser::getFloat(const char *section, const char *name, double &out) {
  if (const Entry *e = given(section, name))
    out = *e->value->value<double>();
}
void Parser::getBool(const char *section, const char *name, bool &out) {
  if (const Entry *e = given(section, name))
    out = *e->value->value_exact<bool>();
}
void Parser::getString(const char *section, const char *name, std::string &out) {
  if (const Entry *e = given(section, name))
    out = *e->value->value_exact<std::string>();
}
void Parser::getStrings(const char *section, const char *name, std::vector<std::string> &out) {
  if (const Entry *e = given(section, name))
    for (const toml::node &item : *e->value->as_array())
      out.push_back(*item.value_exact<std::string>());
}
template <typename T>
void Parser::getEnum(const char *section, const char *name, T &out, std::initializer_list<T> all) {
  if (const Entry *e = given(section, name)) {
    std::string s = *e->value->value_exact<std::string>();
    for (T v : all)
      if (s == toString(v))
        out = v;
  }
}

void Parser::readValues(Spec &spec) {
  ModelConfig &m = spec.model;
  getInt("model", "num_layers", m.num_layers);
  getInt("model", "hidden_size", m.hidden_size);
  getInt("model", "ffn_hidden_size", m.ffn_hidden_size);
  getInt("model", "num_attention_heads", m.num_attention_heads);
  getInt("model", "num_query_groups", m.num_query_groups);
  getInt("model", "kv_channels", m.kv_channels);
  getInt("model", "seq_length", m.seq_length);
  getInt("model", "max_position_embeddings", m.max_position_embeddings);
  getInt("model", "vocab_size", m.vocab_size);
  getInt("model", "make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  getEnum("model", "position_embedding_type", m.position_embedding_type,
          {PositionEmbedding::LearnedAbsolute, PositionEmbedding::Rope});
  getInt("model", "rotary_base", m.rotary_base);
  getBool("model", "use_rope_scaling", m.use_rope_scaling);
  getFloat("model", "rope_scaling_factor", m.rope_scaling_factor);
  getEnum("model", "normalization", m.normalization,
          {Normalization::LayerNorm, Normalization::RMSNorm});
  getFloat("model", "norm_epsilon", m.norm_epsilon);
  getBool("model", "apply_layernorm_1p", m.apply_layernorm_1p);
  getBool("model", "swiglu", m.swiglu);
  getBool("model", "untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights);
  getBool("model", "add_bias_linear", m.add_bias_linear);
  getFloat("model", "hidden_dropout", m.hidden_dropout);
  getFloat("model", "attention_dropout", m.attention_dropout);
  getFloat("model", "init_method_std", m.init_method_std);
  getInt("model", "num_experts", m.num_experts);
  getInt("model", "moe_ffn_hidden_size", m.moe_ffn_hidden_size);
  getInt("model", "moe_router_topk", m.moe_router_topk);
  getEnum("model", "moe_router_load_balancing_type", m.moe_router_load_balancing_type,
          {MoeLoadBalancing::AuxLoss, MoeLoadBalancing::SeqAuxLoss, MoeLoadBalancing::None});
  getFloat("model", "moe_aux_loss_coeff", m.moe_aux_loss_coeff);
  getFloat("model", "moe_z_loss_coeff", m.moe_z_loss_coeff);
  getEnum("model", "moe_router_score_function", m.moe_router_score_function,
          {MoeScoreFunction::Softmax, MoeScoreFunction::Sigmoid});
  getBool("model", "moe_router_pre_softmax", m.moe_router_pre_softmax);
  getFloat("model", "moe_router_topk_scaling_factor", m.moe_router_topk_scaling_factor);
  getFloat("model", "moe_expert_capacity_factor", m.moe_expert_capacity_factor);
  getBool("model", "moe_pad_expert_input_to_capacity", m.moe_pad_expert_input_to_capacity);
  getEnum("model", "moe_token_drop_policy", m.moe_token_drop_policy,
          {MoeTokenDropPolicy::Probs, MoeTokenDropPolicy::Position});
  getInt("model", "moe_shared_expert_intermediate_size",
         m.moe_shared_expert_intermediate_size);
  getBool("model", "moe_grouped_gemm", m.moe_grouped_gemm);
  getEnum("model", "moe_router_dtype", m.moe_router_dtype,
          {MoeRouterDtype::FP32, MoeRouterDtype::FP64});

  ParallelConfig &p = spec.parallel;
  getInt("parallel", "tensor_model_parallel_size", p.tensor_model_parallel_size);
  getInt("parallel", "pipeline_model_parallel_size", p.pipeline_model_parallel_size);
  getInt("parallel", "data_parallel_size", p.data_parallel_size);
  getInt("parallel", "virtual_pipeline_model_parallel_size",
         p.virtual_pipeline_model_parallel_size);
  getInt("parallel", "decoder_first_pipeline_num_layers", p.decoder_first_pipeline_num_layers);
  getInt("parallel", "decoder_last_pipeline_num_layers", p.decoder_last_pipeline_num_layers);
  getBool("parallel", "sequence_parallel", p.sequence_parallel);
  getBool("parallel", "use_distributed_optimizer", p.use_distributed_optimizer);
  getBool("parallel", "overlap_grad_reduce", p.overlap_grad_reduce);
  getBool("parallel", "overlap_param_gather", p.overlap_param_gather);
  getInt("parallel", "ddp_bucket_size", p.ddp_bucket_size);
  getEnum("parallel", "recompute_granularity", p.recompute_granularity,
          {RecomputeGranularity::Selective, RecomputeGranularity::Full});
  getEnum("parallel", "recompute_method", p.recompute_method,
          {RecomputeMethod::Uniform, RecomputeMethod::Block});
  getInt("parallel", "recompute_num_layers", p.recompute_num_layers);
  getInt("parallel", "expert_model_parallel_size", p.expert_model_parallel_size);
  getInt("parallel", "expert_tensor_parallel_size", p.expert_tensor_parallel_size);
  getEnum("parallel", "moe_token_dispatcher_type", p.moe_token_dispatcher_type,
          {MoeTokenDispatcher::AllGather, MoeTokenDispatcher::AllToAll});
  getFloat("parallel", "moe_dispatch_buffer_factor", p.moe_dispatch_buffer_factor);

  TrainingConfig &t = spec.training;
  getInt("training", "micro_batch_size", t.micro_batch_size);
  getInt("training", "global_batch_size", t.global_batch_size);
  getInt("training", "train_iters", t.train_iters);
  getInt("training", "train_samples", t.train_samples);
  if (const Entry *e = given("training", "rampup_batch_size"))
    for (const toml::node &item : *e->value->as_array())
      t.rampup_batch_size.push_back(*item.value_exact<int64_t>());
  getInt("training", "lr_decay_samples", t.lr_decay_samples);
  getInt("training", "lr_warmup_samples", t.lr_warmup_samples);
  getInt("training", "lr_wsd_decay_samples", t.lr_wsd_decay_samples);
  getFloat("training", "lr", t.lr);
  getFloat("training", "min_lr", t.min_lr);
  getFloat("training", "decoupled_lr", t.decoupled_lr);
  getFloat("training", "decoupled_min_lr", t.decoupled_min_lr);
  getEnum("training", "lr_decay_style", t.lr_decay_style,
          {LrDecayStyle::Constant, LrDecayStyle::Linear, LrDecayStyle::Cosine,
           LrDecayStyle::InverseSquareRoot, LrDecayStyle::WSD});
  getEnum("training", "lr_wsd_decay_style", t.lr_wsd_decay_style,
          {WsdDecayStyle::Exponential, WsdDecayStyle::Linear, WsdDecayStyle::Cosine,
           WsdDecayStyle::MinusSqrt});
  getInt("training", "lr_wsd_decay_iters", t.lr_wsd_decay_iters);
  getInt("training", "lr_decay_iters", t.lr_decay_iters);
  getInt("training", "lr_warmup_iters", t.lr_warmup_iters);
  getFloat("training", "weight_decay", t.weight_decay);
  getFloat("training", "adam_beta1", t.adam_beta1);
  getFloat("training", "adam_beta2", t.adam_beta2);
  getFloat("training", "adam_eps", t.adam_eps);
  getFloat("training", "clip_grad", t.clip_grad);
  getEnum("training", "optimizer", t.optimizer, {Optimizer::Adam, Optimizer::SGD});
  getFloat("training", "sgd_momentum", t.sgd_momentum);
  getEnum("training", "precision", t.precision,
          {Precision::FP32, Precision::FP16, Precision::BF16});
  getBool("training", "grad_reduce_in_bf16", t.grad_reduce_in_bf16);
  getFloat("training", "initial_loss_scale", t.initial_loss_scale);
  getFloat("training", "min_loss_scale", t.min_loss_scale);
  getInt("training", "loss_scale_window", t.loss_scale_window);
  getInt("training", "hysteresis", t.hysteresis);
  getInt("training", "seed", t.seed);
  getInt("training", "log_interval", t.log_interval);
  getBool("training", "calculate_per_token_loss", t.calculate_per_token_loss);
  getBool("training", "log_throughput", t.log_throughput);
  getBool("training", "log_params_norm", t.log_params_norm);
  getBool("training", "log_num_zeros_in_grad", t.log_num_zeros_in_grad);
  getInt("training", "timing_log_level", t.timing_log_level);
  getString("training", "timing_log_option", t.timing_log_option);
  getBool("training", "log_memory_to_tensorboard", t.log_memory_to_tensorboard);
  getString("training", "power_log", t.power_log);
  getInt("training", "power_log_interval_ms", t.power_log_interval_ms);
  getBool("training", "check_for_nan_in_loss_and_grad", t.check_for_nan_in_loss_and_grad);
  getInt("training", "eval_interval", t.eval_interval);
  getInt("training", "eval_iters", t.eval_iters);
  getInt("training", "save_interval", t.save_interval);
  getString("training", "save", t.save);
  getString("training", "load", t.load);
  getInt("training", "ckpt_step", t.ckpt_step);
  getBool("training", "finetune", t.finetune);
  getBool("training", "load_optim", t.load_optim);
  getBool("training", "load_rng", t.load_rng);
  getBool("training", "save_optim", t.save_optim);
  getBool("training", "save_rng", t.save_rng);

  DataConfig &d = spec.data;
  if (const Entry *e = given("data", "data_path"))
    readDataPath(*e, &d.data_path);
  getString("data", "split", d.split);
  getString("data", "tokenizer_type", d.tokenizer_type);
  getString("data", "vocab_file", d.vocab_file);
  getString("data", "merge_file", d.merge_file);
  getString("data", "tokenizer_model", d.tokenizer_model);
  getStrings("data", "tokenizer_special_tokens", d.tokenizer_special_tokens);
  getString("data", "tiktoken_pattern", d.tiktoken_pattern);
  getInt("data", "tiktoken_num_special_tokens", d.tiktoken_num_special_tokens);
  getStrings("data", "tiktoken_special_tokens", d.tiktoken_special_tokens);
  getBool("data", "tokenizer_sentencepiece_legacy", d.tokenizer_sentencepiece_legacy);
  getBool("data", "tokenizer_hf_include_special_tokens", d.tokenizer_hf_include_special_tokens);
  getBool("data", "legacy_tokenizer", d.legacy_tokenizer);
  getBool("data", "mock_data", d.mock_data);

  ClusterConfig &c = spec.cluster;
  c.device = devicePresets()[0].name;
  c.device_memory_bytes = devicePresets()[0].bytes;
  if (const Entry *e = given("cluster", "device_memory"))
    readDeviceMemory(*e, &c);
  getInt("cluster", "gpus_per_node", c.gpus_per_node);
  getInt("cluster", "nodes", c.nodes);
}

} // namespace mt::spec::detail

namespace mt::spec {

absl::StatusOr<Spec> parseSpecString(const std::string &text, const std::string &sourceName,
                                     const std::vector<Override> &overrides) {
  try {
    return detail::Parser(sourceName).run(text, overrides);
  } catch (const detail::SpecError &e) {
    return absl::InvalidArgumentError(e.loc.str() + ": error: " + e.message);
  }
}

absl::StatusOr<Spec> parseSpecFile(const std::string &path,
                                   const std::vector<Override> &overrides) {
  std::FILE *f = std::fopen(path.c_str(), "rb");
  std::string text;
  int err = 0;
  if (!f) {
    err = errno;
  } else {
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0)
      text.append(buf, n);
    if (std::ferror(f))
      err = errno ? errno : EIO;
    std::fclose(f);
  }
  if (err)
    return absl::NotFoundError(path + ": error: cannot read spec file: " + std::strerror(err) +
                               "; check the path");
  return parseSpecString(text, path, overrides);
}

} // namespace mt::spec
