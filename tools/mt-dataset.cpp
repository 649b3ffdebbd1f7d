// mt-dataset: inspect and verify Megatron indexed datasets, print training
// samples (runtime/data/dataset_tool.h).
#include "runtime/data/dataset_tool.h"

#include <string>
#include <vector>

int main(int argc, char **argv) {
  return mt::rt::run_mt_dataset(std::vector<std::string>(argv + 1, argv + argc));
}
