// Megatron-LM's indexed dataset (`PREFIX.bin` + `PREFIX.idx`): written by
// mt-preprocess, read by mmap by the runtime's data loader and mt-dataset.
//
// .idx layout (little-endian): 9-byte magic "MMIDIDX\0\0", u64 version 1,
// u8 dtype code, u64 sequence count S, u64 document count D (= documents + 1),
// int32 sequence lengths [S], int64 sequence byte offsets into .bin [S],
// int64 document indices [D] (document i spans sequences
// [doc_idx[i], doc_idx[i+1])). .bin holds the raw token ids, no header.
#ifndef MT_RUNTIME_INDEXED_DATASET_H
#define MT_RUNTIME_INDEXED_DATASET_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

// Megatron's dtype codes.
enum class TokenDtype : uint8_t {
  UInt8 = 1, Int8 = 2, Int16 = 3, Int32 = 4, Int64 = 5, Float64 = 6, Float32 = 7, UInt16 = 8,
};
size_t dtype_size(TokenDtype d);
const char *dtype_name(TokenDtype d);
// Megatron's choice: uint16 when the vocabulary has fewer than 65500 ids, else int32.
TokenDtype dtype_for_vocab_size(size_t vocab_size);

// Streams documents to PREFIX.bin/.idx through temporaries; nothing appears
// under the final names until finish() succeeds, and an unfinished writer
// removes its temporaries when destroyed.
class IndexedDatasetWriter {
public:
  static std::unique_ptr<IndexedDatasetWriter>
  create(const std::string &prefix, TokenDtype dtype, std::string *error);
  ~IndexedDatasetWriter();

  // One document made of sequences with the given lengths (their sum is n).
  // Returns "" or an error line.
  std::string add_document(const int32_t *tokens, size_t n,
                           const std::vector<int32_t> &sequence_lengths);
  // One document that is one sequence.
  std::string add_document(const int32_t *tokens, size_t n);
  // Writes the .idx, fsyncs, renames both into place. Returns "" or an error.
  std::string finish();

  uint64_t num_documents() const;
  uint64_t num_tokens() const;

  struct Impl;
private:
  explicit IndexedDatasetWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Read-only view by mmap; every header field and array is validated against
// the file sizes before use.
class IndexedDataset {
public:
  // Returns null and sets *error to one line naming the file, what is wrong and
  // what to do (e.g. "re-run mt-preprocess") on any inconsistency.
  static std::unique_ptr<IndexedDataset> open(const std::string &prefix, std::string *error);
  ~IndexedDataset();

  TokenDtype dtype() const;
  uint64_t num_sequences() const;
  uint64_t num_documents() const;          // documents, not the D array length
  uint64_t num_tokens() const;
  int32_t sequence_length(uint64_t i) const;
  int64_t sequence_offset(uint64_t i) const;   // in bytes, into .bin
  // Document i spans sequences [document_index(i), document_index(i + 1)),
  // i <= num_documents(); read from the mapped file (it is not 8-aligned).
  int64_t document_index(uint64_t i) const;
  // The document sequence s belongs to (binary search).
  uint64_t document_of_sequence(uint64_t s) const;
  // Copies tokens [start, start + n) of sequence i, widened to int32.
  void read(uint64_t sequence, uint64_t start, uint64_t n, int32_t *out) const;

  struct Impl;
private:
  explicit IndexedDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace mt::rt

#endif // MT_RUNTIME_INDEXED_DATASET_H
