// mt-preprocess: raw text or jsonl -> Megatron indexed dataset (runtime/data/preprocess.cpp).
#include "runtime/data/preprocess.h"

int main(int argc, char **argv) {
  return mt::rt::run_mt_preprocess(std::vector<std::string>(argv + 1, argv + argc));
}
