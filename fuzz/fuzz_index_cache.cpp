// Fuzz target: a GPT dataset's index cache (<hash>-GPTDataset-train.mtidx)
// for the seed dataset ($MT_FUZZ_SEEDS/data/micro_text_document), loaded as
// mtrun loads it (GptDataset::build with a cache_dir, then every sample).
// A corrupt cache must be rebuilt or refused with one line, never trusted
// into a crash.
//
// The header's FNV-1a hash (over the first 72 bytes and the description)
// and, from cache version 2, the arrays' CRC-32C are recomputed before each
// load, so mutations reach the checks behind it;
// the layout is runtime/data/gpt_dataset.h's.
#include "fuzz/dataset_common.h"
#include "fuzz/fuzz_common.h"
#include "runtime/base/crc32c.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sys/stat.h>

namespace {

std::string g_prefix, g_cache, g_file;

uint64_t fnv1a(const uint8_t *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  mt::fuzz::quiet_stdout();
  g_prefix = mt::fuzz::seed_file("data/micro_text_document.idx");
  g_prefix.resize(g_prefix.size() - 4);
  g_cache = mt::fuzz::temp_dir() + "/cache";
  ::mkdir(g_cache.c_str(), 0755);
  // Build once to learn the cache file's name (a hash of what it describes).
  const auto config = mt::fuzz::dataset_config(g_prefix, g_cache);
  if (std::string e = mt::fuzz::build_and_sample(config, mt::rt::DataSplit::Train,
                                                 mt::fuzz::kTrainSamples);
      !e.empty()) {
    std::fprintf(stderr, "fuzz_index_cache: the seed dataset does not load: %s\n", e.c_str());
    std::abort();
  }
  for (const auto &e : std::filesystem::directory_iterator(g_cache))
    if (e.path().string().find("-GPTDataset-train.mtidx") != std::string::npos)
      g_file = e.path().string();
  if (g_file.empty()) {
    std::fprintf(stderr, "fuzz_index_cache: no index cache was written in %s\n", g_cache.c_str());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string bytes(reinterpret_cast<const char *>(data), size);
  auto *p = reinterpret_cast<uint8_t *>(bytes.data());
  if (size >= 80 && std::memcmp(p, "MTGPTIDX", 8) == 0) {
    const uint64_t dlen = mt::fuzz::get_u64(p + 16);
    if (dlen <= size - 80) {
      // Version 2 also keeps a CRC-32C of the arrays (every byte after the
      // zero-padded description) at offset 52, inside the hashed header.
      const uint64_t arrays = 80 + (dlen + 7) / 8 * 8;
      if (p[8] == 2 && arrays <= size)
        mt::fuzz::put_u32(p + 52, mt::rt::crc32c(p + arrays, size - arrays));
      mt::fuzz::put_u64(p + 72, fnv1a(p + 80, size_t(dlen), fnv1a(p, 72, 0xcbf29ce484222325ull)));
    }
  }
  mt::fuzz::write_file(g_file, bytes.data(), bytes.size());
  const auto config = mt::fuzz::dataset_config(g_prefix, g_cache);
  if (std::string e = mt::fuzz::build_and_sample(config, mt::rt::DataSplit::Train,
                                                 mt::fuzz::kTrainSamples);
      !e.empty())
    mt::fuzz::check_error("fuzz_index_cache", e, g_prefix);
  return 0;
}
