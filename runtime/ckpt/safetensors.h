// safetensors, Hugging Face's tensor file (huggingface/safetensors, its
// format description):
//   0   u64 little-endian N: the header's size in bytes
//   8   N bytes of UTF-8 JSON, one object: per tensor
//         "NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}
//       and optionally "__metadata__": {"key": "value", ...} (strings only);
//       the writer pads it with spaces to a multiple of 8 bytes, so the data
//       starts 8-byte aligned
//   8+N the data: each tensor's bytes, row-major, little-endian, at
//       [BEGIN, END) relative to the data's start; together the tensors
//       cover the data exactly, without gaps or overlaps.
// The writer orders tensors as the reference writer does (larger elements
// first, then by name), so every tensor is aligned to its element size.
// The reader checks every field of the header against the format and the
// file's size before a byte of data is used.
#ifndef MT_RUNTIME_SAFETENSORS_H
#define MT_RUNTIME_SAFETENSORS_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

// The reference's limit on the header (100 MB): a larger one is refused.
inline constexpr uint64_t kSafetensorsMaxHeader = 100000000;

// The size of one element of a safetensors dtype ("F32", "BF16", "F16",
// "F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
// "F8_E4M3", "F8_E5M2"); 0 for any other name.
size_t safetensors_dtype_size(const std::string &dtype);

// One tensor to write; bytes must be the product of shape times the
// dtype's element size.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void *data = nullptr;
  size_t bytes = 0;
};

// The 8-byte length and the padded JSON header of a file holding `tensors`
// in the writer's order (which *order gets, as indices into tensors), with
// `metadata` as __metadata__ when not empty. Returns "" or one error line
// naming the tensor (unknown dtype, bytes that do not match the shape, an
// empty, duplicate or "__metadata__" name).
std::string safetensors_header(const std::vector<SafetensorsTensor> &tensors,
                               const std::map<std::string, std::string> &metadata,
                               std::string *header, std::vector<size_t> *order);

// Writes PATH atomically (a temporary beside it, fsync, rename). Returns ""
// or one error line.
std::string write_safetensors(const std::string &path,
                              const std::vector<SafetensorsTensor> &tensors,
                              const std::map<std::string, std::string> &metadata);

// A validated safetensors file (mapped read-only) or buffer.
class SafetensorsReader {
public:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0; // relative to the data's start
  };

  // Maps PATH and validates it; null with *error one line naming the file
  // and the tensor or field at fault ("... is truncated: ..." when it ends
  // early) on any problem.
  static std::unique_ptr<SafetensorsReader> open(const std::string &path, std::string *error);
  // The same for bytes in memory; `name` stands for the file in errors.
  static std::unique_ptr<SafetensorsReader> parse(std::string bytes, const std::string &name,
                                                  std::string *error);
  ~SafetensorsReader();

  const std::vector<Entry> &tensors() const; // in data order
  const Entry *find(const std::string &name) const;
  const std::map<std::string, std::string> &metadata() const;
  // The tensor's bytes (end - begin of them).
  const unsigned char *data(const Entry &e) const;
  uint64_t header_size() const; // N: the JSON's bytes, padding included

  struct Impl;

private:
  explicit SafetensorsReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace mt::rt

#endif // MT_RUNTIME_SAFETENSORS_H
