// A user's own data set (--data-file): a safetensors file of 'inputs' and
// 'labels', and optionally 'test_inputs' and 'test_labels'.
#include "runtime/data/dataset.h"
#include "tests/fuzz/fuzz_files.h"

namespace mix::fuzz {

const char* const kTargetName = "data_file";

Outcome run_one(const std::string& bytes) {
  const std::string path = write_input("data.safetensors", bytes);
  return refused_naming(path, [&] {
    const data::TrainTest tt = data::load_safetensors_dataset(path);
    for (const data::Dataset* split : {&tt.train, &tt.test}) {
      const int64_t n = split->labels.numel();
      if (split->inputs.ndim() < 2 || split->inputs.dim(0) != n)
        throw ContractBroken("a split of " + std::to_string(n) + " labels and inputs of another count");
      const int64_t* labels = split->labels.data<int64_t>();
      for (int64_t i = 0; i < n; ++i)
        if (labels[i] < 0 || labels[i] >= split->num_classes)
          throw ContractBroken("label " + std::to_string(labels[i]) + " among " + std::to_string(split->num_classes) +
                               " classes");
    }
  });
}

}  // namespace mix::fuzz
