// Fuzz target: a dataset's PREFIX.bin with its PREFIX.idx, opened and read
// as mtrun's data loader reads it (dataset_common.h). The input is the two
// files in one: a little-endian u32 length of the .idx, the .idx, then the
// .bin (fuzz/make_seeds.sh joins the seed dataset's so).
#include "fuzz/dataset_common.h"
#include "fuzz/fuzz_common.h"

#include <algorithm>
#include <sys/stat.h>

namespace {
std::string g_prefix, g_cache;
}

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  mt::fuzz::quiet_stdout();
  g_prefix = mt::fuzz::temp_dir() + "/data";
  g_cache = mt::fuzz::temp_dir() + "/cache";
  ::mkdir(g_cache.c_str(), 0755);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  size_t idx = size_t(data[0]) | size_t(data[1]) << 8 | size_t(data[2]) << 16 |
               size_t(data[3]) << 24;
  idx = std::min(idx, size - 4);
  mt::fuzz::write_file(g_prefix + ".idx", data + 4, idx);
  mt::fuzz::write_file(g_prefix + ".bin", data + 4 + idx, size - 4 - idx);
  mt::fuzz::exercise_dataset(g_prefix, g_cache);
  return 0;
}
