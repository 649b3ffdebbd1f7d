// mtrun's training loop: sequences a plan's programs the way Megatron-LM's
// train() does (micro-batches, grad norm, update or skip, logging, evaluation,
// checkpoints), with every number computed by the plan's instructions.
#ifndef MT_RUNTIME_TRAIN_LOOP_H
#define MT_RUNTIME_TRAIN_LOOP_H

#include <cstdint>
#include <string>

#include "runtime/comm/launch.h"

namespace mt::rt {

struct RunOptions {
  std::string plan_path;
  std::string device = "cpu";
  std::string save;          // overrides the plan's [training] save
  std::string load;          // overrides the plan's [training] load
  // Megatron-LM's fine-tuning and checkpoint-content flags of the same
  // names: --finetune loads the weights only and starts at iteration 0;
  // --no-load-optim / --no-load-rng leave the optimizer state (with the
  // learning-rate schedule and the loss scale) / the random state out of
  // the load, --no-save-optim / --no-save-rng out of every save;
  // --ckpt-step loads that iteration instead of the tracker's (-1: the
  // tracker's).
  bool finetune = false;
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool no_save_optim = false;
  bool no_save_rng = false;
  int64_t ckpt_step = -1;
  int64_t train_iters = -1;  // overrides the plan's train_iters when >= 0
  int64_t train_samples = -1; // overrides a sample-based plan's train_samples when >= 1
  std::string log_file;      // iteration lines are also appended here
  bool check_memory_plan = false;
  bool cuda_graphs = true;   // --device cuda: replay each program as a captured CUDA graph
  LaunchFlags launch;        // --rank / --world-size; SLURM_* and MT_* otherwise
  double timeout_s = 300;    // how long a rank waits for the others
  bool skip_train = false;       // evaluate only (Megatron's --skip-train)
  int64_t exit_interval = 0;     // save and exit after an iteration divisible by it
  double exit_duration_mins = 0; // save and exit once the run is older than this
  // TensorBoard, as Megatron-LM's flags of the same names (the last rank
  // writes, every tensorboard_log_interval iterations).
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  bool log_learning_rate_to_tensorboard = true;
  bool log_loss_scale_to_tensorboard = true;
  bool log_batch_size_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_timers_to_tensorboard = false; // iteration-time, at each log_interval
  // The training log's extras, as Megatron-LM's flags of the same names:
  // on when the plan or these say so; -1 (and "") keep the plan's value.
  bool log_throughput = false;
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  bool log_memory_to_tensorboard = false;
  int timing_log_level = -1;
  std::string timing_log_option;
  int check_for_nan_in_loss_and_grad = -1; // 0: --no-..., 1: --check-...
  // --power-log FILE and --power-log-interval MS; "" and 0 keep the plan's.
  std::string power_log;
  int64_t power_log_interval_ms = 0;
};

// Runs the whole job; returns the process exit status. Errors are printed as
// one line "mtrun: error: ..." on stderr.
int run_training(const RunOptions &options);

// mtrun's command line (tools/mtrun.cpp is a one-line main).
int mtrun_main(int argc, char **argv);

} // namespace mt::rt

#endif // MT_RUNTIME_TRAIN_LOOP_H
