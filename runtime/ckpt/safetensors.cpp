// safetensors read and write (see safetensors.h).
#include "runtime/ckpt/safetensors.h"

#include "runtime/base/atomic_file.h"
#include "runtime/ckpt/checkpoint_format.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <set>
#include <simdjson.h>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mt::rt {

using ckpt_detail::json_string;
using ckpt_detail::shape_bytes;
using ckpt_detail::shape_str;

namespace {

struct Dtype {
  const char *name;
  size_t size;
};
constexpr Dtype kDtypes[] = {
    {"F64", 8},  {"I64", 8},     {"U64", 8},     {"F32", 4}, {"I32", 4},
    {"U32", 4},  {"F16", 2},     {"BF16", 2},    {"I16", 2}, {"U16", 2},
    {"I8", 1},   {"U8", 1},      {"BOOL", 1},    {"F8_E4M3", 1}, {"F8_E5M2", 1},
};
constexpr const char *kDtypeList =
    "F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8 or BOOL";

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

} // namespace

size_t safetensors_dtype_size(const std::string &dtype) {
  for (const Dtype &d : kDtypes)
    if (dtype == d.name)
      return d.size;
  return 0;
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

std::string safetensors_header(const std::vector<SafetensorsTensor> &tensors,
                               const std::map<std::string, std::string> &metadata,
                               std::string *header, std::vector<size_t> *order) {
  std::set<std::string> names;
  for (const SafetensorsTensor &t : tensors) {
    const size_t elem = safetensors_dtype_size(t.dtype);
    uint64_t bytes = 0;
    if (t.name.empty() || t.name == "__metadata__" ||
        !simdjson::validate_utf8(t.name.data(), t.name.size()))
      return "safetensors: error: the tensor name '" + t.name +
             "' cannot be written (empty, not UTF-8, or the reserved __metadata__)";
    if (!names.insert(t.name).second)
      return "safetensors: error: two tensors are named " + t.name;
    if (elem == 0)
      return "safetensors: error: tensor " + t.name + " has dtype '" + t.dtype +
             "', which is none of " + kDtypeList;
    if (!shape_bytes(t.shape, elem, &bytes) || bytes != t.bytes)
      return "safetensors: error: tensor " + t.name + " has " + std::to_string(t.bytes) +
             " bytes but " + t.dtype + " " + shape_str(t.shape) + " needs " +
             std::to_string(bytes);
  }
  for (const auto &[k, v] : metadata)
    if (!simdjson::validate_utf8(k.data(), k.size()) ||
        !simdjson::validate_utf8(v.data(), v.size()))
      return "safetensors: error: the metadata entry '" + k + "' is not UTF-8";
  // The reference writer's order: larger elements first, then by name.
  order->resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    (*order)[i] = i;
  std::sort(order->begin(), order->end(), [&](size_t a, size_t b) {
    size_t ea = safetensors_dtype_size(tensors[a].dtype),
           eb = safetensors_dtype_size(tensors[b].dtype);
    return ea != eb ? ea > eb : tensors[a].name < tensors[b].name;
  });
  std::string j = "{";
  if (!metadata.empty()) {
    j += "\"__metadata__\":{";
    bool first = true;
    for (const auto &[k, v] : metadata) {
      j += first ? "" : ",";
      first = false;
      json_string(j, k);
      j += ':';
      json_string(j, v);
    }
    j += "}";
  }
  uint64_t at = 0;
  for (size_t i : *order) {
    const SafetensorsTensor &t = tensors[i];
    j += j.size() > 1 ? "," : "";
    json_string(j, t.name);
    j += ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d)
      j += (d ? "," : "") + std::to_string(t.shape[d]);
    j += "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + t.bytes) + "]}";
    at += t.bytes;
  }
  j += "}";
  j.append((8 - j.size() % 8) % 8, ' ');
  if (j.size() > kSafetensorsMaxHeader)
    return "safetensors: error: the header would be " + std::to_string(j.size()) +
           " bytes, more than the format's limit of " + std::to_string(kSafetensorsMaxHeader);
  *header = le64(j.size()) + j;
  return "";
}

std::string write_safetensors(const std::string &path,
                              const std::vector<SafetensorsTensor> &tensors,
                              const std::map<std::string, std::string> &metadata) {
  std::string header;
  std::vector<size_t> order;
  if (std::string e = safetensors_header(tensors, metadata, &header, &order); !e.empty())
    return path + ": " + e.substr(std::strlen("safetensors: "));
  std::vector<std::string_view> pieces = {header};
  for (size_t i : order)
    if (tensors[i].bytes)
      pieces.emplace_back(static_cast<const char *>(tensors[i].data), tensors[i].bytes);
  return write_pieces_atomically(path, pieces);
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

struct SafetensorsReader::Impl {
  std::string name;
  std::string owned; // parse(): the bytes
  const unsigned char *file = nullptr;
  size_t size = 0;
  bool mapped = false;
  uint64_t header_size = 0;
  std::vector<Entry> entries;
  std::map<std::string, size_t> index;
  std::map<std::string, std::string> metadata;

  ~Impl() {
    if (mapped && file)
      ::munmap(const_cast<unsigned char *>(file), size);
  }
  std::string validate();
};

std::string SafetensorsReader::Impl::validate() {
  const std::string at = name + ": error: ";
  const std::string damaged = "; the file is not a valid safetensors file: write it again";
  if (size < 8)
    return at + "is truncated: " + std::to_string(size) +
           " bytes, shorter than the 8-byte header length; copy the whole file again";
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | file[i];
  if (n > kSafetensorsMaxHeader)
    return at + "the header length is " + std::to_string(n) + " bytes, more than the format's " +
           "limit of " + std::to_string(kSafetensorsMaxHeader) + damaged;
  if (n > size - 8)
    return at + "is truncated: the header length says " + std::to_string(n) +
           " bytes of header but only " + std::to_string(size - 8) +
           " follow; copy the whole file again";
  if (n < 2 || file[8] != '{')
    return at + "the header does not start with '{'" + damaged;
  header_size = n;
  simdjson::dom::parser parser;
  simdjson::padded_string text(reinterpret_cast<const char *>(file + 8), size_t(n));
  simdjson::dom::element root;
  simdjson::dom::object obj;
  if (auto e = parser.parse(text).get(root); e != simdjson::SUCCESS)
    return at + "the header is not valid JSON (" + simdjson::error_message(e) + ")" + damaged;
  if (root.get_object().get(obj) != simdjson::SUCCESS)
    return at + "the header is not a JSON object" + damaged;
  const uint64_t data_size = size - 8 - n;
  std::set<std::string> seen;
  for (auto field : obj) {
    std::string key(field.key);
    if (!seen.insert(key).second)
      return at + "the header names " + key + " twice" + damaged;
    if (key == "__metadata__") {
      simdjson::dom::object m;
      if (field.value.get_object().get(m) != simdjson::SUCCESS)
        return at + "__metadata__ is not an object of strings" + damaged;
      for (auto kv : m) {
        std::string_view v;
        if (kv.value.get_string().get(v) != simdjson::SUCCESS)
          return at + "__metadata__ entry '" + std::string(kv.key) + "' is not a string" + damaged;
        metadata[std::string(kv.key)] = std::string(v);
      }
      continue;
    }
    const std::string t = at + "tensor " + key + ": ";
    simdjson::dom::object info;
    if (field.value.get_object().get(info) != simdjson::SUCCESS)
      return t + "is not an object with dtype, shape and data_offsets" + damaged;
    Entry e;
    e.name = key;
    std::string_view dtype;
    if (info["dtype"].get_string().get(dtype) != simdjson::SUCCESS)
      return t + "has no dtype string" + damaged;
    e.dtype = std::string(dtype);
    const size_t elem = safetensors_dtype_size(e.dtype);
    if (elem == 0)
      return t + "dtype '" + e.dtype + "' is none of " + kDtypeList + damaged;
    simdjson::dom::array shape, offsets;
    if (info["shape"].get_array().get(shape) != simdjson::SUCCESS)
      return t + "has no shape array" + damaged;
    for (auto d : shape) {
      uint64_t v = 0;
      if (d.get_uint64().get(v) != simdjson::SUCCESS || v > uint64_t(INT64_MAX))
        return t + "shape has an entry that is not a non-negative integer" + damaged;
      e.shape.push_back(int64_t(v));
    }
    if (info["data_offsets"].get_array().get(offsets) != simdjson::SUCCESS ||
        offsets.size() != 2)
      return t + "has no data_offsets [BEGIN, END]" + damaged;
    if (offsets.at(0).get_uint64().get(e.begin) != simdjson::SUCCESS ||
        offsets.at(1).get_uint64().get(e.end) != simdjson::SUCCESS)
      return t + "data_offsets are not non-negative integers" + damaged;
    if (e.end < e.begin)
      return t + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
             "] end before they begin" + damaged;
    uint64_t bytes = 0;
    if (!shape_bytes(e.shape, elem, &bytes) || bytes != e.end - e.begin)
      return t + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
             "] hold " + std::to_string(e.end - e.begin) + " bytes but " + e.dtype + " " +
             shape_str(e.shape) + " needs " +
             (shape_bytes(e.shape, elem, &bytes) ? std::to_string(bytes) : "more than 2^64") +
             damaged;
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry &a, const Entry &b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensor that reaches furthest names a file cut short.
  const Entry *last = nullptr;
  for (const Entry &e : entries)
    if (!last || e.end > last->end)
      last = &e;
  if (last && last->end > data_size)
    return at + "is truncated: tensor " + last->name + " ends at data byte " +
           std::to_string(last->end) + " but the file holds " + std::to_string(data_size) +
           " bytes of data; copy the whole file again";
  // Together the tensors cover the data exactly, as the reference requires.
  uint64_t end = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry &e = entries[i];
    if (e.begin != end)
      return at + "tensor " + e.name + ": data_offsets begin at " + std::to_string(e.begin) +
             " but the previous tensor" + (i ? " (" + entries[i - 1].name + ")" : "") +
             " ends at " + std::to_string(end) + " (the tensors must cover the data without " +
             "gaps or overlaps)" + damaged;
    end = e.end;
    index[e.name] = i;
  }
  if (end != data_size)
    return at + "has " + std::to_string(data_size - end) +
           " bytes after the last tensor's data (the header accounts for " +
           std::to_string(end) + " of " + std::to_string(data_size) + ")" + damaged;
  return "";
}

SafetensorsReader::SafetensorsReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsReader::~SafetensorsReader() = default;

std::unique_ptr<SafetensorsReader> SafetensorsReader::open(const std::string &path,
                                                           std::string *error) {
  auto impl = std::make_unique<Impl>();
  impl->name = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = path + ": error: cannot open: " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *error = path + ": error: not a regular file";
    ::close(fd);
    return nullptr;
  }
  impl->size = size_t(st.st_size);
  if (impl->size > 0) {
    void *p = ::mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      *error = path + ": error: cannot map: " + std::strerror(errno);
      ::close(fd);
      return nullptr;
    }
    impl->file = static_cast<const unsigned char *>(p);
    impl->mapped = true;
  }
  ::close(fd);
  if (std::string e = impl->validate(); !e.empty()) {
    *error = e;
    return nullptr;
  }
  return std::unique_ptr<SafetensorsReader>(new SafetensorsReader(std::move(impl)));
}

std::unique_ptr<SafetensorsReader> SafetensorsReader::parse(std::string bytes,
                                                            const std::string &name,
                                                            std::string *error) {
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  impl->owned = std::move(bytes);
  impl->file = reinterpret_cast<const unsigned char *>(impl->owned.data());
  impl->size = impl->owned.size();
  if (std::string e = impl->validate(); !e.empty()) {
    *error = e;
    return nullptr;
  }
  return std::unique_ptr<SafetensorsReader>(new SafetensorsReader(std::move(impl)));
}

const std::vector<SafetensorsReader::Entry> &SafetensorsReader::tensors() const {
  return impl_->entries;
}
const SafetensorsReader::Entry *SafetensorsReader::find(const std::string &name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->entries[it->second];
}
const std::map<std::string, std::string> &SafetensorsReader::metadata() const {
  return impl_->metadata;
}
const unsigned char *SafetensorsReader::data(const Entry &e) const {
  return impl_->file + 8 + impl_->header_size + e.begin;
}
uint64_t SafetensorsReader::header_size() const { return impl_->header_size; }

} // namespace mt::rt
