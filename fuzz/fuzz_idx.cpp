// Fuzz target: a dataset's PREFIX.idx beside the seed dataset's .bin
// ($MT_FUZZ_SEEDS/data/micro_text_document.bin), opened and read as mtrun's
// data loader reads it (dataset_common.h).
#include "fuzz/dataset_common.h"
#include "fuzz/fuzz_common.h"

#include <filesystem>
#include <sys/stat.h>

namespace {
std::string g_prefix, g_cache;
}

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  mt::fuzz::quiet_stdout();
  g_prefix = mt::fuzz::temp_dir() + "/data";
  g_cache = mt::fuzz::temp_dir() + "/cache";
  ::mkdir(g_cache.c_str(), 0755);
  std::filesystem::copy_file(mt::fuzz::seed_file("data/micro_text_document.bin"),
                             g_prefix + ".bin");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mt::fuzz::write_file(g_prefix + ".idx", data, size);
  mt::fuzz::exercise_dataset(g_prefix, g_cache);
  return 0;
}
