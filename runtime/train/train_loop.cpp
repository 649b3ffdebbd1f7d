// mtrun: load and verify the plan, then train as Megatron-LM's train() does.
#include "runtime/train/train_loop.h"

#include "runtime/base/activity.h"
#include "runtime/base/batch_rampup.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/checkpoint_layout.h"
#include "runtime/comm/collectives.h"
#include "runtime/comm/comm_order.h"
#include "runtime/exec/cpu_executor.h"
#include "runtime/exec/cuda/kernel_cache.h"
#include "runtime/exec/cuda_gpu_device.h"
#include "runtime/exec/gpu_executor.h"
#include "runtime/exec/log_stats.h"
#include "runtime/data/gpt_dataset.h"
#include "runtime/comm/launch.h"
#include "runtime/comm/parallel_groups.h"
#include "runtime/plan/plan_reader.h"
#include "runtime/train/power_log.h"
#include "runtime/train/tensorboard.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <vector>

#include <unistd.h>

namespace mt::rt {
namespace {

namespace pl = mt::plan;

// One line on stderr. Library errors that already name their file as
// "FILE: error: ..." keep that form.
// Set by SIGTERM; the training loop checks it after each iteration.
volatile std::sig_atomic_t g_terminate = 0;
// When run_training began (--exit-duration-in-mins).
std::chrono::steady_clock::time_point g_start = std::chrono::steady_clock::now();
extern "C" void on_sigterm(int) { g_terminate = 1; }

int fail(const std::string &msg) {
  if (msg.find(": error: ") != std::string::npos)
    std::fprintf(stderr, "mtrun: %s\n", msg.c_str());
  else
    std::fprintf(stderr, "mtrun: error: %s\n", msg.c_str());
  return 1;
}

std::string str(const flatbuffers::String *s) { return plan_string(s); }


std::vector<int64_t> shape_of(const pl::Param *p) { return param_shape(*p); }

// The positions of a program's named inputs and outputs.
struct ProgramIO {
  const pl::Program *program = nullptr;
  uint32_t find(const flatbuffers::Vector<uint32_t> *ids,
                const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>> *names,
                const char *name) const {
    for (uint32_t i = 0; ids && names && i < ids->size() && i < names->size(); ++i)
      if (names->Get(i)->str() == name)
        return ids->Get(i);
    return UINT32_MAX;
  }
  uint32_t input(const char *name) const {
    return find(program->inputs(), program->input_names(), name);
  }
  uint32_t output(const char *name) const {
    return find(program->outputs(), program->output_names(), name);
  }
};

// datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f'), as Megatron's log line.
std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const long long us = std::chrono::duration_cast<std::chrono::microseconds>(
                           now.time_since_epoch()).count() % 1000000;
  char buf[32], out[48];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  std::snprintf(out, sizeof out, "%s.%06lld", buf, us);
  return out;
}

class Trainer {
public:
  // `groups` are this rank's communicators (all null for one rank); `rank`
  // this process's rank in the plan.
  Trainer(const pl::Plan &plan, const RunOptions &opts, int rank, int localRank,
          const ParallelGroups &groups)
      : plan(plan), opts(opts), rank(rank), localRank(localRank), groups(groups),
        comm(groups.get(Group::DP)) {}

  int run() {
    const pl::Training *t = plan.training();
    if (!t)
      return fail(opts.plan_path + " has no training settings; recompile it with mtc");
    dp = std::max(1, plan.data_parallel());
    pp = std::max(1, plan.pipeline_parallel());
    myRank = find_rank(plan, rank);
    dpRank = myRank->dp_rank();
    ppRank = myRank->pp_rank();
    // Megatron prints from the last rank.
    printer = rank == plan.world_size() - 1;
    trainIters = opts.train_iters >= 0 ? opts.train_iters : t->train_iters();
    mbs = t->micro_batch_size();
    gbs = t->global_batch_size();
    microBatches = t->num_micro_batches();
    if (std::string err = sampleBasedLength(*t); !err.empty())
      return fail(err);
    seq = t->seq_length();
    save = !opts.save.empty() ? opts.save : str(t->save());
    load = !opts.load.empty() ? opts.load : str(t->load());
    // What a load takes and a save writes: the plan's keys, or mtrun's
    // flags of Megatron's names.
    finetune = opts.finetune || t->finetune();
    noLoadOptim = opts.no_load_optim || !t->load_optim();
    noLoadRng = opts.no_load_rng || !t->load_rng();
    noSaveOptim = opts.no_save_optim || !t->save_optim();
    noSaveRng = opts.no_save_rng || !t->save_rng();
    ckptStep = opts.ckpt_step >= 0 ? opts.ckpt_step : t->ckpt_step();
    sayPaths();

    tpRank = myRank->tp_rank();
    set_activity("setting up rank " + std::to_string(rank) + "'s executor for " + opts.plan_path,
                 myRank->state_bytes() + myRank->arena_bytes(),
                 "the plan's state_bytes + arena_bytes of rank " + std::to_string(rank));
    if (opts.device == "cuda") {
      std::string err;
      std::unique_ptr<GpuDevice> device = open_cuda_gpu_device(localRank, "", &err);
      if (!device)
        return fail("--device cuda: " + err);
      auto gpu = std::make_unique<GpuExecutor>(plan, rank, std::move(device));
      gpu->set_groups(&groups); // open() connects each group's GPUs (NCCL)
      if (std::string e = gpu->open(); !e.empty())
        return fail("--device cuda: " + opts.plan_path + ": " + e);
      gpu->set_cuda_graphs(opts.cuda_graphs);
      exec = std::move(gpu);
    } else {
      exec = std::make_unique<CpuExecutor>(plan, rank);
    }
    // The executor has expanded a pipelined train_step (pipeline_expand.h):
    // the program it runs is the whole step, unrolled.
    if (std::string e = exec->load_error(); !e.empty())
      return fail(opts.plan_path + ": " + e);
    exec->set_groups(&groups);
    fp16 = str(t->precision()) == "fp16";
    logThroughput = opts.log_throughput || t->log_throughput();
    logParamsNorm = opts.log_params_norm || t->log_params_norm();
    logZeros = opts.log_num_zeros_in_grad || t->log_num_zeros_in_grad();
    logMemoryBoard = opts.log_memory_to_tensorboard || t->log_memory_to_tensorboard();
    timingLevel = opts.timing_log_level >= 0 ? opts.timing_log_level : t->timing_log_level();
    timingOption = !opts.timing_log_option.empty() ? opts.timing_log_option
                   : t->timing_log_option() && t->timing_log_option()->size()
                       ? str(t->timing_log_option())
                       : std::string("minmax");
    nanCheck = t->check_for_nan_in_loss_and_grad();
    if (opts.check_for_nan_in_loss_and_grad == 0)
      nanCheck = false;
    if (opts.check_for_nan_in_loss_and_grad == 1) {
      if (fp16)
        return fail("--check-for-nan-in-loss-and-grad cannot apply to an fp16 plan: its "
                    "dynamic loss scaling skips a step whose gradients overflow instead of "
                    "stopping; drop the flag, or compile the spec with precision bf16 or fp32");
      nanCheck = true;
    }
    lossScale = fp16 ? t->initial_loss_scale() : 1.0;
    hysteresisTracker = t->hysteresis();
    exec->set_loss_scale(float(lossScale));
    rngSeed = uint64_t(t->seed());
    exec->set_seed(rngSeed);
    exec->set_check_memory_plan(opts.check_memory_plan);
    trainStep.program = exec->program("train_step");
    lastStep.program = exec->program("train_step_last");
    firstStep.program = exec->program("train_step_first");
    gatherProg.program = exec->program("gather_params");
    evalStep.program = exec->program("eval_step");
    normProg.program = exec->program("grad_norm");
    optStep.program = exec->program("optimizer_step");
    if (!trainStep.program || !normProg.program || !optStep.program)
      return fail(opts.plan_path + " lacks the train_step, grad_norm or optimizer_step "
                                   "program; recompile it with this mtc");
    trackRouterLosses(*t);
    // The printing rank's logs; every rank learns whether they opened, so
    // a failure stops all of them at once.
    std::string logErr = openLogs();
    float logFailed = logErr.empty() ? 0.0f : 1.0f;
    if (groups.world)
      if (std::string err = groups.world->all_reduce(&logFailed, 1, ReduceOp::Max); !err.empty())
        return fail(err);
    if (!logErr.empty())
      return fail(logErr);
    if (logFailed > 0)
      return fail("rank " + std::to_string(plan.world_size() - 1) +
                  " could not open its log file or TensorBoard directory (its error says why)");
    // Every rank samples its own GPU; all stop at once if one cannot.
    std::string powerErr = startPowerLog();
    float powerFailed = powerErr.empty() ? 0.0f : float(rank + 1);
    if (groups.world)
      if (std::string err = groups.world->all_reduce(&powerFailed, 1, ReduceOp::Max);
          !err.empty())
        return fail(err);
    if (!powerErr.empty())
      return fail(powerErr);
    if (powerFailed > 0)
      return fail("rank " + std::to_string(int(powerFailed) - 1) +
                  " could not start its power log (its error says why)");

    // Every rank loads its own file; all agree on the outcome, so a rank
    // whose file is missing or refused stops the others at once.
    set_activity(load.empty() ? "initialising the weights" : "loading the checkpoint in " + load);
    std::string loadErr = restoreOrInit();
    float loadFailed = loadErr.empty() ? 0.0f : float(rank + 1);
    if (groups.world)
      if (std::string err = groups.world->all_reduce(&loadFailed, 1, ReduceOp::Max); !err.empty())
        return fail(err);
    if (!loadErr.empty())
      return fail(loadErr);
    if (loadFailed > 0)
      return fail("rank " + std::to_string(int(loadFailed) - 1) + " could not load the checkpoint "
                  "in " + load + " (its error says why); fix that, or start without --load");
    set_activity("building the data indices");
    if (std::string err = buildData(); !err.empty())
      return fail(err);
    if (std::string err = checkResumePosition(); !err.empty())
      return fail(err);
    checkSampleOrder();

    std::string batch = ", global batch " + std::to_string(gbs) + " (" +
                        std::to_string(microBatches) + " micro-batch" +
                        (microBatches == 1 ? "" : "es") + " of " + std::to_string(mbs) +
                        "), sequence " + std::to_string(seq);
    if (ramp.on())
      batch += ", after a batch ramp-up from " + std::to_string(ramp.start) + " by " +
               std::to_string(ramp.increment) + " over " + std::to_string(ramp.samples) +
               " samples";
    announceRampup();
    curMicro = microBatchesAt(consumedTrain);
    if (iteration == 0)
      say("training: " + std::to_string(trainIters) + " iterations" + batch);
    else if (iteration < trainIters)
      say("training: iterations " + std::to_string(iteration + 1) + " to " +
          std::to_string(trainIters) + " (" + std::to_string(trainIters - iteration) +
          " after the checkpoint's " + std::to_string(iteration) + ")" + batch);
    else
      say("training: none: the checkpoint is at iteration " + std::to_string(iteration) +
          " and the run ends at " + std::to_string(trainIters) + batch);

    // Megatron's training_log accumulators: the interval's time (training
    // steps only: evaluation and saves are not in it), its advanced and
    // skipped iterations, the losses of the advanced ones, and the skipped
    // ones whose loss was NaN or Inf.
    const int64_t loadedIteration = iteration;
    bool firstIteration = true, reportMemory = true;
    if (opts.skip_train)
      say("skipping training (--skip-train is on) ...");
    while (!opts.skip_train && iteration < trainIters) {
      set_activity("training iteration " + std::to_string(iteration + 1));
      if (std::string err = rampBatch(); !err.empty())
        return fail(err);
      const auto stepStart = std::chrono::steady_clock::now();
      // Whether this iteration's figures are printed or written.
      const int64_t next = iteration + 1;
      const bool logNow = (t->log_interval() > 0 && next % t->log_interval() == 0) ||
                          firstIteration;
      const bool boardNow = !opts.tensorboard_dir.empty() &&
                            next % opts.tensorboard_log_interval == 0;
      double loss = 0;
      powerMark(next, "forward-backward");
      if (std::string err = forwardBackward(&loss); !err.empty())
        return fail(err);
      if (std::string err = reduceRouterLosses(); !err.empty())
        return fail(err);
      const auto optStart = std::chrono::steady_clock::now();
      powerMark(next, "grad-norm");
      timers[kForwardBackward] += msSince(stepStart, optStart);
      float scaledNorm = 0;
      if (std::string err = runScalar(normProg, "grad_norm", 0, &scaledNorm); !err.empty())
        return fail(err);
      timers[kClipMainGrad] += msSince(optStart);
      // Gradients carry the loss scale; an Inf or NaN anywhere in them shows
      // in their norm. Megatron skips such a step and adjusts the scale (fp16),
      // or, with its NaN check on, stops the run.
      bool finite = std::isfinite(scaledNorm);
      if (nanCheck)
        if (std::string err = checkForNan(next, finite); !err.empty())
          return fail(err);
      float norm = float(double(scaledNorm) / lossScale * rampFactor());
      numZeros = -1;
      if (finite && logZeros && (logNow || boardNow)) {
        const auto zerosStart = std::chrono::steady_clock::now();
        if (std::string err = countZeros(norm, &numZeros); !err.empty())
          return fail(err);
        timers[kCountZeros] += msSince(zerosStart);
      }
      if (finite) {
        const auto innerStart = std::chrono::steady_clock::now();
        powerMark(next, "optimizer");
        if (std::string err = update(norm); !err.empty())
          return fail(err);
        timers[kInnerStep] += msSince(innerStart);
        // overlap_param_gather: the next iteration's first micro-batch
        // gathers the updated weights; until then each rank's are whole
        // only in its own shards.
        weightsGathered = !gatherProg.program;
      } else {
        ++skipped;
        ++intervalSkipped;
        if (!std::isfinite(loss))
          ++intervalNan;
      }
      timers[kOptimizer] += msSince(optStart);
      powerMark(next, "logging");
      updateLossScale(!finite);
      exec->zero_grads();
      ++iteration;
      consumedTrain += curMicro * mbs * dp;
      if (finite) {
        ++intervalAdvanced;
        intervalLoss += loss;
      }
      lastNorm = norm;
      lastSkipped = !finite;
      paramsNorm = NAN;
      if (logParamsNorm && (logNow || boardNow))
        if (std::string err = computeParamsNorm(&paramsNorm); !err.empty())
          return fail(err);
      if (board && boardNow)
        boardIteration(loss);
      addRouterLosses();
      if (power)
        if (std::string err = power->error(); !err.empty())
          return fail(err);

      intervalSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                       stepStart).count();
      if (logNow) {
        if (std::string err = logIteration(firstIteration); !err.empty())
          return fail(err);
        // Megatron reports memory at the first logged iterations, until one
        // after the second iteration of the run has been reported.
        if (reportMemory) {
          memoryReport();
          if (iteration > loadedIteration + 1)
            reportMemory = false;
        }
      }
      firstIteration = false;
      if (t->eval_interval() > 0 && iteration % t->eval_interval() == 0 && valid)
        if (std::string err = evaluate(*valid, &consumedValid,
                                       "iteration " + std::to_string(iteration), true);
            !err.empty())
          return fail(err);
      if (!save.empty() && t->save_interval() > 0 && iteration % t->save_interval() == 0 &&
          iteration < trainIters)
        if (std::string err = saveCheckpoint(); !err.empty())
          return fail(err);
      // SIGTERM (SLURM's warning before a time limit, or scancel), the
      // run's time budget or its exit interval: finish the iteration, save,
      // and exit cleanly, as Megatron's --exit-signal-handler,
      // --exit-duration-in-mins and --exit-interval do. Every rank must
      // agree to stop together.
      Stop stop = Stop::No;
      if (std::string err = anyRankStops(&stop); !err.empty())
        return fail(err);
      if (stop != Stop::No) {
        char why[128];
        if (stop == Stop::Signal)
          std::snprintf(why, sizeof why, "received SIGTERM at iteration %lld",
                        (long long)iteration);
        else if (stop == Stop::Duration)
          std::snprintf(why, sizeof why,
                        "exiting after %.2f minutes (--exit-duration-in-mins %g) at iteration %lld",
                        minutesSinceStart(), opts.exit_duration_mins, (long long)iteration);
        else
          std::snprintf(why, sizeof why, "exiting at iteration %lld (--exit-interval %lld)",
                        (long long)iteration, (long long)opts.exit_interval);
        if (save.empty()) {
          say(std::string(why) +
              "; no save directory (--save or [training] save), so exiting without a checkpoint");
          return 0;
        }
        if (savedIteration != iteration)
          if (std::string err = saveCheckpoint(); !err.empty())
            return fail(err);
        say(std::string(why) + "; checkpoint saved, exiting");
        return 0;
      }
    }
    if (!opts.skip_train && !save.empty() && savedIteration != iteration)
      if (std::string err = saveCheckpoint(); !err.empty())
        return fail(err);
    // Megatron's pretrain() ends with the validation set, then the test set
    // (its TensorBoard too, unless training was skipped).
    const std::string at = "iteration " + std::to_string(iteration);
    if (valid)
      if (std::string err =
              evaluate(*valid, &consumedValid, at + " on validation set", !opts.skip_train);
          !err.empty())
        return fail(err);
    if (test) {
      int64_t consumedTest = 0;
      if (std::string err = evaluate(*test, &consumedTest, at + " on test set", !opts.skip_train);
          !err.empty())
        return fail(err);
    } else if (!testNote.empty()) {
      say(testNote);
    }
    if (power)
      if (std::string err = power->finish(); !err.empty())
        return fail(err);
    return 0;
  }

private:
  // A sample-based plan trains for train_samples (or --train-samples): its
  // iterations are Megatron's update_train_iters count, batch ramp-up
  // included. --train-iters would contradict that, so it is refused.
  std::string sampleBasedLength(const pl::Training &t) {
    bySamples = t.train_samples() > 0;
    ramp = {t.rampup_start(), t.rampup_increment(), t.rampup_samples(), gbs};
    if (!bySamples) {
      if (opts.train_samples >= 0)
        return "--train-samples: " + opts.plan_path + " counts iterations ([training] "
               "train_iters = " + std::to_string(t.train_iters()) + "); use --train-iters, or "
               "compile a spec with train_samples";
      return "";
    }
    if (opts.train_iters >= 0)
      return "--train-iters: " + opts.plan_path + " trains for [training] train_samples = " +
             std::to_string(t.train_samples()) + " samples, which give its " +
             std::to_string(t.train_iters()) + " iterations; use --train-samples instead";
    trainSamples = opts.train_samples >= 0 ? opts.train_samples : t.train_samples();
    trainIters = rampup_train_iters(ramp, trainSamples);
    return "";
  }

  // What Megatron prints of the ramp-up and of a sample-based length at
  // start: the calculator's set-up, update_train_iters, and on resume the
  // batch the checkpoint's samples reached.
  void announceRampup() {
    if (ramp.on()) {
      say("will use batch size rampup starting from global batch size " +
          std::to_string(ramp.start) + " to global batch size " + std::to_string(gbs) +
          " with batchsize increments " + std::to_string(ramp.increment) + " over " +
          std::to_string(ramp.samples) + " samples.");
      say("setting initial batch size to " + std::to_string(ramp.start));
    }
    if (bySamples)
      say("setting training iterations to " + std::to_string(trainIters));
    if (ramp.on() && rampup_batch_at(ramp, consumedTrain) != ramp.start)
      say("ramping up batch size from " + std::to_string(ramp.start) + " to " +
          std::to_string(rampup_batch_at(ramp, consumedTrain)));
  }

  int64_t microBatchesAt(int64_t consumed) const {
    return rampup_batch_at(ramp, consumed) / (mbs * dp);
  }

  // Megatron's update_num_microbatches at the top of each iteration: the
  // global batch at the samples consumed so far. A change is logged, and
  // with a save directory the run is checkpointed before the first
  // iteration of a new micro-batch count, as Megatron does.
  std::string rampBatch() {
    if (!ramp.on())
      return "";
    const int64_t step = mbs * dp, batch = rampup_batch_at(ramp, consumedTrain);
    if (batch != curMicro * step)
      say("ramping up batch size from " + std::to_string(curMicro * step) + " to " +
          std::to_string(batch));
    if (batch % step != 0)
      return "iteration " + std::to_string(iteration + 1) + ": the batch ramp-up's global batch " +
             std::to_string(batch) + " is not a multiple of micro_batch_size x " +
             "data_parallel_size = " + std::to_string(mbs) + " x " + std::to_string(dp) +
             "; recompile with a rampup_batch_size whose start and increment are multiples "
             "of " + std::to_string(step) + ", or train fewer samples";
    const int64_t micro = batch / step;
    // Megatron's interleaved schedule raises when the count is no multiple
    // of its micro-batch groups (pipeline_model_parallel_size).
    if (const int64_t stages = interleavedStages(); stages > 0 && micro % stages != 0)
      return "iteration " + std::to_string(iteration + 1) + ": the batch ramp-up's global batch " +
             std::to_string(batch) + " is " + std::to_string(micro) + " micro-batches, not a "
             "multiple of pipeline_model_parallel_size = " + std::to_string(stages) +
             " as the interleaved schedule needs; recompile with a rampup_batch_size whose "
             "start and increment are multiples of micro_batch_size x data_parallel_size x "
             "pipeline_model_parallel_size = " + std::to_string(step * stages) +
             ", or train fewer samples";
    if (micro != curMicro && iteration != 0 && !save.empty() && savedIteration != iteration)
      if (std::string err = saveCheckpoint(); !err.empty())
        return err;
    curMicro = micro;
    return "";
  }

  // The stages of this rank's interleaved schedule, or 0 (none, or 1F1B).
  int64_t interleavedStages() const {
    if (myRank->programs())
      for (const pl::Program *p : *myRank->programs())
        if (const pl::PipelineSchedule *ps = p->pipeline(); ps && ps->chunks() > 1)
          return ps->stages();
    return 0;
  }

  // The compiled backward scales each micro-batch's gradients by 1 / (the
  // plan's micro-batches); a ramp-up iteration with fewer averages over its
  // own count, as Megatron divides each loss by get_num_microbatches().
  double rampFactor() const { return double(microBatches) / double(curMicro); }

  // --power-log: this rank's GPU, sampled on a side thread (power_log.h).
  std::string startPowerLog() {
    const pl::Training *t = plan.training();
    const std::string given =
        !opts.power_log.empty() ? opts.power_log
        : t->power_log() && t->power_log()->size() ? str(t->power_log())
                                                   : std::string();
    if (given.empty())
      return "";
    const int64_t interval =
        opts.power_log_interval_ms > 0 ? opts.power_log_interval_ms : t->power_log_interval_ms();
    const std::string path = power_log_path(given, rank, int(plan.world_size()));
    std::string err;
    power = PowerLog::start(path, interval > 0 ? interval : 100, localRank, &err);
    if (!power)
      return err;
    say("power log: " + path + " every " + std::to_string(interval > 0 ? interval : 100) +
        " ms, " + power->device());
    return "";
  }
  void powerMark(int64_t iteration, const char *phase) {
    if (power)
      power->mark(iteration, phase);
  }

  std::string openLogs() {
    if (!printer)
      return "";
    if (!opts.log_file.empty()) {
      log.open(opts.log_file, std::ios::app);
      if (!log)
        return "cannot open the log file " + opts.log_file +
               " for appending; check the directory exists and is writable";
    }
    if (!opts.tensorboard_dir.empty()) {
      std::string err;
      board = TensorBoardWriter::open(opts.tensorboard_dir, &err);
      if (!board)
        return err;
    }
    return "";
  }

  // One TensorBoard scalar. A failed write (a full disk) warns once and
  // ends TensorBoard logging; the training goes on.
  void scalar(const std::string &tag, double value, int64_t step) {
    if (!board)
      return;
    if (std::string e = board->add_scalar(tag, value, step); !e.empty()) {
      std::fprintf(stderr, "mtrun: warning: %s; TensorBoard logging stops here\n", e.c_str());
      board.reset();
    }
  }
  // The scalar, and the same against consumed samples (Megatron's "X vs
  // samples" charts).
  void scalars(const std::string &tag, double value) {
    scalar(tag, value, iteration);
    scalar(tag + " vs samples", value, consumedTrain);
  }

  // What Megatron-LM's training_log writes for an iteration, in its order.
  void boardIteration(double loss) {
    if (opts.log_learning_rate_to_tensorboard)
      scalars("learning-rate", lastLr);
    if (opts.log_batch_size_to_tensorboard)
      scalars("batch-size", double(curMicro * mbs * dp));
    scalars("lm loss", loss);
    if (opts.log_loss_scale_to_tensorboard)
      scalars("loss-scale", lossScale);
    if (opts.log_world_size_to_tensorboard)
      scalars("world-size", double(plan.world_size()));
    if (!lastSkipped) // no norm for a skipped step, as in the iteration line
      scalars("grad-norm", lastNorm);
    if (numZeros >= 0)
      scalars("num-zeros", numZeros);
    if (logParamsNorm)
      scalars("params-norm", paramsNorm);
    if (power) {
      // This rank's GPU since the last write: means, and power's peak.
      const PowerAverages a = power->averages();
      const std::pair<const char *, double> figures[] = {
          {"gpu-power-watts", a.mean.power_w},
          {"gpu-power-max-watts", a.power_max_w},
          {"gpu-sm-clock-mhz", a.mean.sm_clock_mhz},
          {"gpu-memory-clock-mhz", a.mean.mem_clock_mhz},
          {"gpu-temperature-celsius", a.mean.temperature_c},
          {"gpu-utilization-percent", a.mean.gpu_util_pct},
          {"gpu-memory-utilization-percent", a.mean.mem_util_pct},
          {"gpu-memory-used-mib", a.mean.memory_used_mib}};
      if (a.samples > 0)
        for (auto [tag, v] : figures)
          if (v >= 0)
            scalar(tag, v, iteration);
    }
    if (logMemoryBoard) {
      const Executor::MemoryStats m = exec->memory_stats();
      scalar("mem-reserved-bytes", double(m.reserved), iteration);
      scalar("mem-allocated-bytes", double(m.allocated), iteration);
      scalar("mem-max-allocated-bytes", double(m.max_allocated), iteration);
      scalar("mem-allocated-count", double(m.allocations), iteration);
    }
  }

  // Every path the run reads or writes, resolved against the working
  // directory, printed once before anything is written, as Megatron prints
  // its arguments: a plan whose paths lead somewhere unexpected shows it
  // here. Files are written only under these (checkpoints in save's
  // iter_NNNNNNN folders, index files in each data_cache_path).
  void sayPaths() {
    if (!printer)
      return;
    const pl::Training *t = plan.training();
    auto resolve = [](const std::string &p) -> std::string {
      if (p.empty())
        return "None";
      std::error_code ec;
      std::filesystem::path a = std::filesystem::absolute(p, ec);
      return ec ? p : a.lexically_normal().string();
    };
    std::string data, caches;
    for (size_t i = 0; !t->mock_data() && i < (t->data_paths() ? t->data_paths()->size() : 0u);
         ++i) {
      const std::string prefix = t->data_paths()->Get(uint32_t(i))->str();
      data += (data.empty() ? "" : " ") + resolve(prefix);
      caches += (caches.empty() ? "" : " ") + resolve(prefix + "/cache/GPTDataset_indices");
    }
    const std::string power =
        !opts.power_log.empty() ? opts.power_log
        : t->power_log() && t->power_log()->size() ? str(t->power_log())
                                                   : std::string();
    const int world = int(plan.world_size());
    std::vector<std::pair<std::string, std::string>> rows = {
        {"data_cache_path", caches.empty() ? "None" : caches},
        {"data_path", data.empty() ? "None" : data},
        {"load", resolve(load)},
        {"log_file", resolve(opts.log_file)},
        {"power_log", power.empty() ? "None"
                      : world > 1   ? resolve(power_log_path(power, rank, world)) +
                                        " (and one for each other rank)"
                                    : resolve(power)},
        {"save", resolve(save)},
        {"tensorboard_dir", resolve(opts.tensorboard_dir)},
    };
    if (opts.device == "cuda") {
      const std::string kernels = default_kernel_cache_dir();
      rows.insert(rows.begin() + 2, {"kernel_cache", kernels.empty() ? "None" : resolve(kernels)});
    }
    say("------------------------ paths ------------------------");
    for (const auto &[name, value] : rows)
      say("  " + name + " " + std::string(48 - name.size(), '.') + " " + value);
    say("-------------------- end of paths ---------------------");
  }

  void say(const std::string &line) {
    if (!printer)
      return;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (log.is_open()) {
      log << line << "\n";
      log.flush();
    }
  }

  static double msSince(std::chrono::steady_clock::time_point from,
                        std::chrono::steady_clock::time_point to =
                            std::chrono::steady_clock::now()) {
    return std::chrono::duration<double, std::milli>(to - from).count();
  }

  // A sum of the ranks' figures, exactly enough for a norm or a count: each
  // rank's double travels as two floats (its value and the remainder).
  std::string sumOverRanks(Communicator *c, double *v) {
    if (!c || c->size() == 1)
      return "";
    const float hi = float(*v), lo = float(*v - double(hi));
    float mine[2] = {hi, lo};
    std::vector<float> all(size_t(c->size()) * 2);
    if (std::string err = c->all_gather(mine, 2, all.data()); !err.empty())
      return err;
    double sum = 0;
    for (float x : all)
      sum += double(x);
    *v = sum;
    return "";
  }
  // The group over which the ranks' statistics add up (log_stats.h).
  Communicator *statsGroup() const {
    return stats_over_world(plan, *myRank) ? groups.world : groups.get(Group::MP);
  }

  // Megatron's calc_params_l2_norm: every parameter once over the model.
  std::string computeParamsNorm(double *out) {
    double sq = 0;
    if (std::string err = exec->params_sum_squares(&sq); !err.empty())
      return err;
    if (std::string err = sumOverRanks(statsGroup(), &sq); !err.empty())
      return err;
    *out = std::sqrt(sq);
    return "";
  }

  // Megatron's count_zeros_fp32, on the gradients as its optimizer sees them
  // when it counts: unscaled (fp16), then clipped. The total is a float, as
  // Megatron's (an f32 tensor's .item()).
  std::string countZeros(float norm, double *out) {
    const float unscale = fp16 ? float(1.0 / lossScale) : 1.0f;
    const double maxNorm = plan.training()->clip_grad();
    float clip = 1.0f;
    if (maxNorm > 0) {
      const double coeff = maxNorm / (double(norm) + 1.0e-6);
      if (coeff < 1.0)
        clip = float(coeff);
    }
    Executor::GradStats g;
    if (std::string err = exec->grad_stats(unscale, clip, &g); !err.empty())
      return err;
    double zeros = double(g.zeros);
    if (std::string err = sumOverRanks(statsGroup(), &zeros); !err.empty())
      return err;
    *out = double(float(zeros));
    return "";
  }

  // Megatron's check_for_nan_in_loss_and_grad: a NaN or Inf in a rank's
  // loss (before the data-parallel average) or in its gradients stops the
  // run, naming the rank and the iteration, before anything is saved. The
  // ranks share what they found, so all of them stop together; the loss
  // comes first, as Megatron checks it in the forward step. mt's gradients
  // are looked at once their norm shows a NaN or Inf, after the
  // data-parallel reduction, so the rank named is the first holding one.
  std::string checkForNan(int64_t iter, bool normFinite) {
    float code = std::isnan(localLoss) ? 1.0f : std::isinf(localLoss) ? 2.0f : 0.0f;
    if (code == 0 && !normFinite) {
      Executor::GradStats g;
      if (std::string err = exec->grad_stats(1.0f, 1.0f, &g); !err.empty())
        return err;
      code = g.nans ? 3.0f : g.infs ? 4.0f : 0.0f;
      // Finite gradients whose norm overflows (Megatron's bucket norm
      // would be Inf too): every rank sees that norm, the first one is named.
      if (code == 0)
        code = 5.0f;
    }
    const int world = plan.world_size();
    std::vector<float> codes(size_t(world), 0.0f);
    codes[size_t(rank)] = code;
    if (groups.world)
      if (std::string err = groups.world->all_gather(&code, 1, codes.data()); !err.empty())
        return err;
    int who = -1;
    for (int pass = 0; pass < 2 && who < 0; ++pass)
      for (int r = 0; r < world && who < 0; ++r)
        if (codes[size_t(r)] > 0 && (codes[size_t(r)] <= 2) == (pass == 0))
          who = r;
    if (who < 0)
      return "";
    const int found = int(codes[size_t(who)]);
    const bool isNan = found == 1 || found == 3;
    const std::string what = std::string(isNan ? "NaN" : "Inf") +
                             (found <= 2   ? " in local forward loss calculation"
                              : found <= 4 ? " in local gradients after their data-parallel "
                                             "reduction"
                                           : " in the gradient norm (finite gradients whose "
                                             "squares overflow)");
    const std::string stop = "; stopping without saving a checkpoint "
                             "(check_for_nan_in_loss_and_grad is on; mtrun "
                             "--no-check-for-nan-in-loss-and-grad turns it off)";
    if (who != rank)
      return "rank " + std::to_string(who) + " found a" + (isNan ? " " : "n ") + what +
             " at iteration " + std::to_string(iter) + stop;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const std::string device =
        opts.device == "cuda" ? "cuda:" + std::to_string(localRank) : std::string("cpu");
    return "Rank " + std::to_string(rank) + ", node " + host + ", device " + device +
           ", iteration " + std::to_string(iter) + ": Unexpected result " +
           (isNan ? "nan" : "inf") + " (message='found " + what + "')" + stop;
  }

  // Megatron's report_memory, printed by every rank of the first
  // data-parallel replica.
  void memoryReport() {
    if (dpRank != 0)
      return;
    const Executor::MemoryStats m = exec->memory_stats();
    const double mb = 1024.0 * 1024.0;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "[Rank %d] (after %lld iterations) memory (MB) | allocated: %.2f | max "
                  "allocated: %.2f | reserved: %.2f | max reserved: %.2f",
                  rank, (long long)iteration, double(m.allocated) / mb,
                  double(m.max_allocated) / mb, double(m.reserved) / mb,
                  double(m.max_reserved) / mb);
    std::printf("%s\n", buf);
    std::fflush(stdout);
    if (log.is_open()) {
      log << buf << "\n";
      log.flush();
    }
  }

  // Megatron's timers (megatron/core/timers.py) that mt has a phase for,
  // in training_log's order, with their levels.
  enum Timer { kForwardBackward, kClipMainGrad, kCountZeros, kInnerStep, kOptimizer,
               kBatchGenerator, kTimerCount };
  static constexpr const char *kTimerNames[kTimerCount] = {
      "forward-backward",       "optimizer-clip-main-grad", "optimizer-count-zeros",
      "optimizer-inner-step",   "optimizer",                "batch-generator"};
  static constexpr int kTimerLevels[kTimerCount] = {1, 1, 1, 1, 1, 2};

  // The timers block (Timers.log with --timing-log-option), per iteration
  // of the interval, over every rank; and their TensorBoard scalars
  // ("NAME-time", the maximum, in seconds) with --log-timers-to-tensorboard.
  std::string logTimers(int64_t iters) {
    std::vector<int> names;
    for (int k = 0; k < kTimerCount; ++k)
      if (kTimerLevels[k] <= timingLevel)
        names.push_back(k);
    if (names.empty())
      return "";
    const int world = plan.world_size();
    const size_t n = names.size();
    std::vector<float> mine(n), all(size_t(world) * n);
    for (size_t i = 0; i < n; ++i)
      mine[i] = float(timers[names[i]] / double(std::max<int64_t>(1, iters)));
    if (groups.world) {
      if (std::string err = groups.world->all_gather(mine.data(), n, all.data()); !err.empty())
        return err;
    } else {
      all = mine;
    }
    auto at = [&](int r, size_t i) { return double(all[size_t(r) * n + i]); };
    auto dotted = [](const char *name) {
      std::string s = std::string(name) + " ";
      if (s.size() < 48)
        s.append(48 - s.size(), '.');
      return s;
    };
    std::string out;
    bool any = false;
    char buf[160];
    if (timingOption == "all") {
      out = "times across ranks (ms):";
      for (size_t i = 0; i < n; ++i) {
        bool named = false;
        for (int r = 0; r < world; ++r)
          if (at(r, i) > 0) {
            any = true;
            if (!named)
              out += std::string("\n  ") + kTimerNames[names[i]] + ":";
            named = true;
            std::snprintf(buf, sizeof buf, "\n     rank %2d: %.2f", r, at(r, i));
            out += buf;
          }
      }
    } else {
      const bool maxOnly = timingOption == "max";
      out = maxOnly ? "max time across ranks (ms):" : "(min, max) time across ranks (ms):";
      for (size_t i = 0; i < n; ++i) {
        double lo = INFINITY, hi = 0;
        for (int r = 0; r < world; ++r)
          if (at(r, i) > 0) {
            lo = std::min(lo, at(r, i));
            hi = std::max(hi, at(r, i));
          }
        if (hi <= 0)
          continue;
        any = true;
        if (maxOnly)
          std::snprintf(buf, sizeof buf, "\n    %s: %.2f", dotted(kTimerNames[names[i]]).c_str(),
                        hi);
        else
          std::snprintf(buf, sizeof buf, "\n    %s: (%.2f, %.2f)",
                        dotted(kTimerNames[names[i]]).c_str(), lo, hi);
        out += buf;
        if (board && opts.log_timers_to_tensorboard)
          scalar(std::string(kTimerNames[names[i]]) + "-time", hi / 1000.0, iteration);
      }
    }
    if (any)
      say(out);
    return "";
  }

  // Megatron-LM's iteration line, field for field (Python's formatting: NaN
  // and Inf print as "nan" and "inf"; a loss average that is NaN or not
  // above 0 is left out, as Megatron's `if avg > 0.0` does). As in
  // Megatron-Core 0.16 the first iteration of a run is logged too; unlike
  // it, each line then starts a new interval (Megatron folds that first
  // iteration into the next line's averages too), so a line's figures do
  // not depend on where the run started.
  std::string logIteration(bool first) {
    const int64_t total = intervalAdvanced + intervalSkipped;
    const double perIter = intervalSeconds / double(std::max<int64_t>(1, total));
    // Megatron's num_floating_point_operations is linear in the batch: a
    // ramp-up iteration does its batch's share of the full one's.
    const int64_t batch = curMicro * mbs * dp;
    const double throughput = plan.training()->flops_per_iteration() * double(batch) /
                              double(gbs) / (perIter * 1e12 * double(plan.world_size()));
    auto field = [](const char *fmt, auto... v) {
      char b[160];
      std::snprintf(b, sizeof b, fmt, v...);
      return std::string(b);
    };
    auto real = [](double v) { return std::isnan(v) ? std::fabs(v) : v; };
    std::string line = " [" + timestamp() + "]";
    line += field(" iteration %8lld/%8lld |", (long long)iteration, (long long)trainIters);
    line += field(" consumed samples: %12lld |", (long long)consumedTrain);
    line += field(" elapsed time per iteration (ms): %.1f |", perIter * 1000.0);
    if (logThroughput)
      line += field(" throughput per GPU (TFLOP/s/GPU): %.1f |", throughput);
    line += field(" learning rate: %.6E |", double(lastLr));
    line += field(" global batch size: %5lld |", (long long)batch);
    const double avg = intervalLoss / double(std::max<int64_t>(1, intervalAdvanced));
    if (avg > 0.0)
      line += field(" lm loss: %.6E |", avg);
    for (int i : routerLossOrder) {
      const double v = routerLoss[i].interval / double(std::max<int64_t>(1, intervalAdvanced));
      if (v > 0.0)
        line += field(" %s: %.6E |", kRouterLossNames[i], v);
      routerLoss[i].interval = 0;
    }
    line += field(" loss scale: %.1f |", lossScale);
    if (!lastSkipped)
      line += field(" grad norm: %.3f |", real(double(lastNorm)));
    if (numZeros >= 0)
      line += field(" num zeros: %.1f |", numZeros);
    if (logParamsNorm)
      line += field(" params norm: %.3f |", real(paramsNorm));
    line += field(" number of skipped iterations: %3lld |", (long long)intervalSkipped);
    line += field(" number of nan iterations: %3lld |", (long long)intervalNan);
    say(line);
    if (board && opts.log_timers_to_tensorboard) {
      if (!first)
        scalar("iteration-time", perIter, iteration);
      if (logThroughput)
        scalar("throughput", throughput, iteration);
    }
    if (std::string err = logTimers(total); !err.empty())
      return err;
    intervalSeconds = intervalLoss = 0;
    intervalAdvanced = intervalSkipped = intervalNan = 0;
    std::fill(std::begin(timers), std::end(timers), 0.0);
    return "";
  }

  std::string restoreOrInit() {
    // What the load takes besides the weights (Megatron's load_checkpoint:
    // --finetune implies neither).
    const bool loadOptim = !finetune && !noLoadOptim;
    const bool loadRng = !finetune && !noLoadRng;
    // Each setting as the user gave it: mtrun's flag, or the plan's key.
    const std::string finetuneName = opts.finetune ? "--finetune" : "training.finetune = true";
    const std::string noOptimName =
        opts.no_load_optim ? "--no-load-optim" : "training.load_optim = false";
    const std::string noRngName = opts.no_load_rng ? "--no-load-rng" : "training.load_rng = false";
    const std::string stepName =
        (opts.ckpt_step >= 0 ? "--ckpt-step " : "training.ckpt_step = ") + std::to_string(ckptStep);
    if (load.empty() && (finetune || noLoadOptim || noLoadRng || ckptStep >= 0))
      return (finetune      ? finetuneName
              : noLoadOptim ? noOptimName
              : noLoadRng   ? noRngName
                            : stepName) +
             " changes what a checkpoint load takes, but there is no checkpoint directory to "
             "load: give --load DIR (or [training] load)";
    // As Megatron's load_checkpoint: without the tracker, a directory that
    // holds no checkpoint starts from random with a warning; one that holds
    // checkpoints is refused, naming them (training over them from scratch
    // would be a silent wrong start). --ckpt-step names its iteration
    // itself, and --finetune needs weights to fine-tune.
    if (!load.empty() && !checkpoint_exists(load) && ckptStep < 0) {
      const std::string tracker = load + "/latest_checkpointed_iteration.txt";
      std::vector<std::string> held = checkpoint_contents(load);
      if (!held.empty()) {
        std::string names;
        for (size_t i = 0; i < held.size() && i < 4; ++i)
          names += (i ? ", " : "") + held[i];
        if (held.size() > 4)
          names += ", ... (" + std::to_string(held.size()) + " in all)";
        return "--load " + load + ": error: " + tracker + " is missing but the directory " +
               "holds checkpoints (" + names + "); write the iteration to resume into the "
               "tracker or name it with --ckpt-step (a directory holding *.mtckpt files is "
               "one iteration's: load its parent), or load an empty directory to start from "
               "scratch";
      }
      if (finetune)
        return finetuneName + ": --load " + load + " holds no checkpoint (" + tracker +
               " is missing) to fine-tune from; load the pretrained model's checkpoint "
               "directory, or drop --finetune to train from scratch";
      say("WARNING: could not find the metadata file " + tracker);
      say("    will not load any checkpoints and will start from random");
    }
    if (load.empty() || (!checkpoint_exists(load) && ckptStep < 0))
      return exec->init_params(uint64_t(plan.training()->seed()));
    std::string err;
    // The layout first: the first rank's file records it.
    auto first = CheckpointReader::open_first(load, ckptStep, &err);
    if (!first)
      return ckptStep >= 0 ? stepName + ": " + err : err;
    if (std::string e = check_saved_layout(*first, load, plan, opts.plan_path); !e.empty())
      return e;
    // The files this rank's parameters are in (checkpoint_layout.h): its
    // dense parameters' writer's, and its experts' writer's when they differ.
    const int ep = std::max(1, plan.expert_model_parallel());
    auto openOf = [&](const pl::Rank *w, bool distribOptim) {
      return CheckpointReader::open(load, first->meta().iteration, checkpoint_name_rank(plan, *w),
                                    w->pp_rank(), pp,
                                    &err, distribOptim, int(expert_coords(plan, *w).ep_rank), ep);
    };
    const pl::Rank *denseWriter = checkpoint_writer(plan, *myRank, false);
    const pl::Rank *expertWriter = checkpoint_writer(plan, *myRank, true);
    if (!denseWriter || !expertWriter)
      return opts.plan_path + ": error: lacks the rank that writes rank " + std::to_string(rank) +
             "'s checkpoint file; recompile it with mtc";
    bool hasExperts = false;
    for (uint32_t i = 0; i < myRank->params()->size(); ++i)
      hasExperts = hasExperts || myRank->params()->Get(i)->expert();
    const bool twoFiles = hasExperts && expertWriter != denseWriter;
    auto reader = openOf(denseWriter, false);
    if (!reader)
      return err;
    std::unique_ptr<CheckpointReader> expertFile;
    if (twoFiles && !(expertFile = openOf(expertWriter, false)))
      return err;
    const CheckpointReader &expertReader = twoFiles ? *expertFile : *reader;
    const CheckpointMeta &m = reader->meta();
    std::string want = str(plan.model_fingerprint());
    if (m.model_fingerprint != want)
      return "checkpoint " + reader->path() + " is of another model (" +
             m.model_fingerprint + ") than this plan (" + want +
             "); load a checkpoint of this model or start without --load";
    if (std::string e = check_rank_params(*reader, plan, *denseWriter, load, opts.plan_path);
        !e.empty())
      return e;
    if (twoFiles) {
      if (expertFile->meta().model_fingerprint != want ||
          expertFile->meta().iteration != m.iteration)
        return "checkpoint " + expertFile->path() + " belongs to another save than " +
               reader->path() + " (another model or iteration); load another iteration";
      if (std::string e =
              check_rank_params(*expertFile, plan, *expertWriter, load, opts.plan_path);
          !e.empty())
        return e;
    }
    // A checkpoint saved without a part cannot give it: the load says which
    // and how to go without it (Megatron's "Specify --no-load-optim or
    // --finetune ...").
    if (loadOptim && m.values.count("no_save_optim"))
      return "checkpoint " + reader->path() + " was saved without its optimizer state "
             "(mtrun --no-save-optim): it holds no master weights, Adam moments, step count, "
             "learning-rate schedule position or loss scale; load it with --no-load-optim "
             "(a fresh optimizer, keeping the iteration and data position) or --finetune "
             "(the weights only, from iteration 0)";
    if (loadRng && m.values.count("no_save_rng"))
      return "checkpoint " + reader->path() + " was saved without its random state "
             "(mtrun --no-save-rng); load it with --no-load-rng (dropout draws afresh from "
             "the seed) or --finetune (the weights only, from iteration 0)";
    for (const char *key : {"no_save_optim", "no_save_rng"})
      if (auto it = m.values.find(key); it != m.values.end() && it->second != "true")
        return reader->path() + ": error: the metadata value '" + key + "' is '" +
               it->second.substr(0, 40) + "', not \"true\"; the file is damaged: load an "
               "earlier iteration instead, or start from scratch";
    if (loadOptim) {
      // Adam's moments and SGD's momentum buffer are different state: a
      // checkpoint of one does not resume the other (one without the record
      // predates SGD: Adam).
      auto saved = m.values.find("optimizer");
      const std::string have = saved == m.values.end() ? "adam" : saved->second;
      const std::string want = planOptimizer();
      if (have != want)
        return "checkpoint " + reader->path() + " holds the optimizer state of " +
               optimizerName(have) + ", but this plan trains with " + optimizerName(want) +
               " (training.optimizer = \"" + want + "\"); load it with a plan of the same "
               "optimizer, load it with --no-load-optim, or start without --load";
      // A distributed-optimizer checkpoint fits only the same shard layout,
      // and a plain one only a plan without it.
      const int64_t shard = exec->shard_elements();
      auto savedLayout = m.values.find("distributed_optimizer");
      std::string haveLayout = savedLayout == m.values.end() ? "" : savedLayout->second;
      std::string wantLayout = shard > 0 ? shard_layout(plan, *myRank) : "";
      if (haveLayout != wantLayout)
        return "checkpoint " + reader->path() + " holds optimizer state " +
               (haveLayout.empty() ? std::string("without the distributed optimizer")
                                   : "sharded by the distributed optimizer (" + haveLayout + ")") +
               ", but this plan " +
               (wantLayout.empty() ? std::string("does not use the distributed optimizer")
                                   : "shards it as " + wantLayout) +
               "; load it with a plan of the same data_parallel_size, buckets and "
               "use_distributed_optimizer, load it with --no-load-optim, or start without "
               "--load";
      // Each group's shards from the file beside its parameters: this
      // rank's dense shards as dp_rank_RR, its expert shards as edp_rank_RR.
      for (bool experts : {false, true}) {
        const int64_t n = shard > 0 ? packed_shard_elements(plan, *myRank, experts) : 0;
        if (n == 0)
          continue;
        auto optim = openOf(experts ? expertWriter : denseWriter, true);
        if (!optim)
          return err;
        const int groupRank = experts ? int(expert_coords(plan, *myRank).edp_rank) : dpRank;
        std::vector<float> packed(static_cast<size_t>(n));
        for (auto &[kind, data] : shardKinds()) {
          if (std::string e = optim->read(shard_tensor_name(experts, groupRank, kind), "f32", {n},
                                          packed.data(), size_t(n) * 4);
              !e.empty())
            return e;
          unpack_shard(plan, *myRank, experts, packed.data(), data);
        }
      }
    }
    const pl::Rank *rank = myRank;
    for (uint32_t i = 0; i < rank->params()->size(); ++i) {
      const pl::Param *p = rank->params()->Get(i);
      std::string name = str(p->name());
      std::vector<int64_t> shape = shape_of(p);
      size_t bytes = size_t(exec->param_elements(int(i))) * 4;
      struct Part { std::string suffix; float *dst; };
      std::vector<Part> parts = {{"", exec->weight(int(i))}};
      if (loadOptim) {
        for (auto &[suffix, data] : stateParts(int(i)))
          parts.push_back({"." + suffix, data});
        if (exec->master(int(i)))
          parts.push_back({".master", exec->master(int(i))});
      }
      for (const Part &part : parts) {
        if (!part.dst)
          continue;
        const CheckpointReader &from = p->expert() ? expertReader : *reader;
        if (std::string e = from.read(name + part.suffix, "f32", shape, part.dst, bytes);
            !e.empty())
          return e;
      }
    }
    // Without the optimizer's state: masters from the loaded weights,
    // moments zero (Megatron's reload_model_params).
    if (!loadOptim)
      if (std::string e = exec->reset_optimizer_state(); !e.empty())
        return e;
    if (std::string e = exec->state_to_device(); !e.empty())
      return e;
    exec->zero_grads();
    const int64_t savedAt = m.iteration;
    iteration = finetune ? 0 : m.iteration;
    if (!finetune) {
      consumedTrain = m.consumed_train_samples;
      consumedValid = m.consumed_valid_samples;
      if (std::string e = reader->int_value("skipped_iterations", 0, iteration, 0, &skipped);
          !e.empty())
        return e;
    }
    if (loadOptim) {
      lossScale = m.loss_scale;
      growthTracker = m.loss_scale_growth_tracker;
      hysteresisTracker = m.loss_scale_hysteresis_tracker;
      exec->set_loss_scale(float(lossScale));
      // Every number the metadata holds, checked: the file and field are named.
      if (std::string e = reader->int_value("optimizer_steps", 0, iteration, 0, &stepsTaken);
          !e.empty())
        return e;
      // Megatron's scheduler counts samples; an iteration-based run's are its
      // steps times the global batch.
      if (std::string e = reader->int_value(
              "lr_scheduler_samples", 0, kMaxCheckpointCount,
              stepsTaken <= kMaxCheckpointCount / std::max<int64_t>(1, gbs) ? stepsTaken * gbs
                                                                             : kMaxCheckpointCount,
              &lrSamples);
          !e.empty())
        return e;
    }
    // The random state: the seed and how far the dropout counter has run
    // since it was seeded. Checkpoints from before the record ran it from
    // iteration 0 with the plan's seed. Not loaded, it starts afresh from
    // the plan's seed here, as Megatron's generators keep their seeding.
    rngBase = iteration;
    if (loadRng) {
      if (m.rng_state.size() == 2 && m.rng_state[1] <= uint64_t(iteration)) {
        rngSeed = m.rng_state[0];
        exec->set_seed(rngSeed);
        rngBase = iteration - int64_t(m.rng_state[1]);
      } else if (m.rng_state.empty()) {
        rngBase = 0;
      } else {
        return reader->path() + ": error: the metadata's rng_state is not [seed, draws] with "
               "draws <= the iteration " + std::to_string(iteration) + "; the file is "
               "damaged: load an earlier iteration instead, load it with --no-load-rng, or "
               "start from scratch";
      }
    }
    if (!finetune)
      if (auto it = m.values.find("train_order_hash"); it != m.values.end()) {
        uint64_t h = 0;
        const std::string &x = it->second;
        auto r = std::from_chars(x.data(), x.data() + x.size(), h, 16);
        if (x.size() != 16 || r.ec != std::errc() || r.ptr != x.data() + x.size())
          return reader->path() + ": error: the metadata value 'train_order_hash' is not 16 "
                                  "hex digits; the file is damaged: load an earlier iteration "
                                  "instead, or start from scratch";
        loadedOrderHash = h;
        if (std::string e = reader->int_value("train_index_samples", 0, kMaxCheckpointCount, 0,
                                              &loadedIndexSamples);
            !e.empty())
          return e;
      }
    // A fine-tuning run's iteration 0 is not the checkpoint's: a save there
    // writes the fine-tuning run's own.
    savedIteration = finetune ? -1 : iteration;
    loadedPath = reader->path();
    if (finetune) {
      say("loaded checkpoint " + reader->path() + " at iteration 0 (" + finetuneName +
          ": the weights of iteration " + std::to_string(savedAt) + " only)");
      say("    fine-tuning from iteration 0: the consumed samples, optimizer state, "
          "learning-rate schedule, loss scale and random state start fresh");
    } else {
      say("loaded checkpoint " + reader->path() + " at iteration " + std::to_string(iteration));
      if (!loadOptim)
        say("    " + noOptimName + ": the optimizer state (master weights from the loaded "
            "weights, zero moments), learning-rate schedule and loss scale start fresh");
      if (!loadRng)
        say("    " + noRngName + ": the random state starts afresh from the seed " +
            std::to_string(plan.training()->seed()));
    }
    return "";
  }

  // The distributed optimizer's state kinds, with this rank's shard of each.
  std::vector<std::pair<std::string, float *>> shardKinds() {
    std::vector<std::pair<std::string, float *>> kinds;
    if (float *m = exec->shard_master())
      kinds.push_back({"master", m});
    if (planOptimizer() == "sgd") {
      kinds.push_back({"momentum_buffer", exec->shard_exp_avg()});
    } else {
      kinds.push_back({"exp_avg", exec->shard_exp_avg()});
      kinds.push_back({"exp_avg_sq", exec->shard_exp_avg_sq()});
    }
    return kinds;
  }

  // A parameter's optimizer state as the checkpoint names it (torch's
  // state names): Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer.
  std::vector<std::pair<std::string, float *>> stateParts(int i) {
    if (planOptimizer() == "sgd")
      return {{"momentum_buffer", exec->exp_avg(i)}};
    return {{"exp_avg", exec->exp_avg(i)}, {"exp_avg_sq", exec->exp_avg_sq(i)}};
  }

  // "adam" or "sgd"; plans without the field predate SGD.
  std::string planOptimizer() const {
    const pl::Training *t = plan.training();
    return t && t->optimizer() && t->optimizer()->size() ? t->optimizer()->str() : "adam";
  }
  static std::string optimizerName(const std::string &o) {
    return o == "sgd" ? "SGD (momentum_buffer)" : "Adam (exp_avg, exp_avg_sq)";
  }

  // The weights whole on every rank before evaluation or a save reads them.
  std::string gatherWeights() {
    if (weightsGathered)
      return "";
    weightsGathered = true;
    return exec->run(*gatherProg.program, 0);
  }

  std::string saveCheckpoint() {
    ActivityScope saving("saving the checkpoint of iteration " + std::to_string(iteration) +
                         " to " + save);
    powerMark(iteration, "checkpoint");
    if (std::string e = gatherWeights(); !e.empty())
      return e;
    if (std::string e = exec->state_to_host(); !e.empty())
      return e;
    // --no-save-optim leaves the optimizer's state (master weights, moments,
    // the distributed optimizer's file, the step count and schedule
    // position) out, as Megatron's.
    const bool saveOptim = !noSaveOptim;
    // What this rank writes (checkpoint_layout.h): the dense parameters at
    // data-parallel rank 0, the experts at expert-data-parallel rank 0.
    const CheckpointRole role = checkpoint_role(plan, *myRank);
    const int ep = std::max(1, plan.expert_model_parallel());
    // Distributed optimizer: each group's shards (dense buckets over dp,
    // expert buckets over expt_dp) gathered to the group's rank 0.
    const int64_t shard = saveOptim ? exec->shard_elements() : 0;
    struct Gathered {
      bool experts;
      int group;
      int64_t n;
      std::vector<std::vector<float>> kinds; // per shardKinds(), group x n
    };
    std::vector<Gathered> gathered;
    for (bool experts : {false, true}) {
      const int64_t n = shard > 0 ? packed_shard_elements(plan, *myRank, experts) : 0;
      if (n == 0)
        continue;
      Communicator *c = groups.get(experts ? Group::EXPT_DP : Group::DP);
      const int group = experts ? int(expert_data_parallel(plan)) : dp;
      Gathered g{experts, group, n, {}};
      std::vector<float> mine(size_t(n), 0.0f);
      for (auto &[kind, data] : shardKinds()) {
        pack_shard(plan, *myRank, experts, data, mine.data());
        g.kinds.emplace_back(size_t(n) * size_t(group));
        if (c) {
          if (std::string err = c->all_gather(mine.data(), size_t(n), g.kinds.back().data());
              !err.empty())
            return err;
        } else if (group == 1) {
          std::copy(mine.begin(), mine.end(), g.kinds.back().begin());
        } else {
          return "rank " + std::to_string(this->rank) + " has no " +
                 (experts ? "expert-data-parallel" : "data-parallel") +
                 " communicator to gather the optimizer's shards for the checkpoint";
        }
      }
      gathered.push_back(std::move(g));
    }
    // Replicas hold the same weights: each part is written once, by the
    // rank its role names; every rank takes part in the save.
    const bool writes = role.writes();
    const pl::Rank *rank = myRank;
    std::vector<CheckpointTensor> tensors;
    for (uint32_t i = 0; writes && i < rank->params()->size(); ++i) {
      const pl::Param *p = rank->params()->Get(i);
      if (!(p->expert() ? role.experts : role.dense))
        continue;
      std::string name = str(p->name());
      std::vector<int64_t> shape = shape_of(p);
      size_t bytes = size_t(exec->param_elements(int(i))) * 4;
      // The CPU executor keeps every float tensor as f32.
      tensors.push_back({name, "f32", shape, exec->weight(int(i)), bytes});
      if (shard > 0 || !saveOptim)
        continue;
      if (exec->master(int(i)))
        tensors.push_back({name + ".master", "f32", shape, exec->master(int(i)), bytes});
      for (auto &[suffix, data] : stateParts(int(i)))
        tensors.push_back({name + "." + suffix, "f32", shape, data, bytes});
    }
    std::vector<CheckpointTensor> distrib;
    const auto kinds = shardKinds();
    for (const Gathered &g : gathered) {
      if (!(g.experts ? role.experts : role.dense))
        continue;
      for (int r = 0; r < g.group; ++r)
        for (size_t k = 0; k < kinds.size(); ++k)
          distrib.push_back({shard_tensor_name(g.experts, r, kinds[k].first), "f32", {g.n},
                             g.kinds[k].data() + size_t(r) * size_t(g.n), size_t(g.n) * 4});
    }
    CheckpointMeta m;
    m.iteration = iteration;
    m.consumed_train_samples = consumedTrain;
    m.consumed_valid_samples = consumedValid;
    m.spec_toml = str(plan.spec_toml());
    m.model_fingerprint = str(plan.model_fingerprint());
    m.loss_scale = lossScale;
    m.loss_scale_growth_tracker = growthTracker;
    m.loss_scale_hysteresis_tracker = hysteresisTracker;
    if (saveOptim) {
      m.values["optimizer_steps"] = std::to_string(stepsTaken);
      m.values["optimizer"] = planOptimizer();
      if (bySamples)
        m.values["lr_scheduler_samples"] = std::to_string(lrSamples);
    } else {
      m.values["no_save_optim"] = "true";
    }
    // The random state: the seed and the dropout counter's run since it
    // was seeded (restoreOrInit); --no-save-rng leaves it out.
    if (noSaveRng)
      m.values["no_save_rng"] = "true";
    else
      m.rng_state = {uint64_t(rngSeed), uint64_t(iteration - rngBase)};
    m.values["skipped_iterations"] = std::to_string(skipped);
    if (orderKnown && train) {
      orderHash = train->order_hash(orderHash, orderHashed, consumedTrain);
      orderHashed = consumedTrain;
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)orderHash);
      m.values["train_order_hash"] = hex;
      m.values["train_index_samples"] = std::to_string(trainIndexSamples);
    }
    if (rank->params()->size() > 0)
      m.values["weights_dtype_in_plan"] = dtype_label(rank->params()->Get(0)->dtype());
    add_layout_values(plan, *rank, &m);
    if (std::string err = save_checkpoint_collective(
            groups.world, this->rank, save, m, checkpoint_files_of(plan, saveOptim), writes,
            tensors, checkpoint_name_rank(plan, *myRank), ppRank, pp,
            distrib.empty() ? nullptr : &distrib,
            int(expert_coords(plan, *myRank).ep_rank), ep);
        !err.empty())
      return err;
    savedIteration = iteration;
    if (this->rank == 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "iter_%07lld", (long long)iteration);
      // Rank 0 says so, as Megatron's does.
      std::printf("saved checkpoint at iteration %lld to %s/%s\n", (long long)iteration,
                  save.c_str(), buf);
      std::fflush(stdout);
    }
    return "";
  }

  std::string buildData() {
    const pl::Training *t = plan.training();
    GptDataConfig cfg;
    cfg.mock = t->mock_data();
    if (t->data_paths())
      for (uint32_t i = 0; i < t->data_paths()->size(); ++i)
        cfg.blend.push_back({t->data_weights() && i < t->data_weights()->size()
                                 ? t->data_weights()->Get(i)
                                 : 1.0,
                             t->data_paths()->Get(i)->str()});
    if (!cfg.mock && cfg.blend.empty())
      return "the plan names no data: set [data] data_path, or mock_data = true, and recompile";
    cfg.split = str(t->split());
    cfg.seq_length = seq;
    cfg.seed = uint64_t(t->seed());
    cfg.vocab_size = t->vocab_size();
    cfg.eod = t->eod_id();
    auto counts = megatron_num_samples(trainIters, gbs, t->eval_interval(), t->eval_iters());
    if (bySamples) // Megatron's index holds train_samples when training counts them
      counts[0] = trainSamples;
    trainIndexSamples = counts[0];
    std::string err;
    // The sample counts follow from train_iters, eval_iters and the global
    // batch: an index too large for this machine is an error, not an abort.
    auto build = [&](DataSplit split, int64_t samples) -> std::unique_ptr<GptDataset> {
      try {
        return GptDataset::build(cfg, split, samples, &err);
      } catch (const std::bad_alloc &) {
        const char *name = split == DataSplit::Train ? "training"
                           : split == DataSplit::Valid ? "validation" : "test";
        err = "data: the " + std::string(name) + " index of " + std::to_string(samples) +
              " samples (from train_iters, eval_interval, eval_iters and global_batch_size) "
              "needs more memory than this machine has; lower them and recompile";
        return nullptr;
      }
    };
    train = build(DataSplit::Train, counts[0]);
    if (!train)
      return err;
    say(train->describe());
    if (t->eval_iters() > 0 && t->eval_interval() > 0 && counts[1] > 0) {
      valid = build(DataSplit::Valid, counts[1]);
      if (!valid)
        return err;
    }
    // The test set, evaluated once at the end. Megatron has none when the
    // split gives it no share; one whose share rounds to no document would
    // never fill a sample, so mtrun says so at the end instead.
    if (t->eval_iters() > 0 && counts[2] > 0) {
      const int64_t docs = split_documents(cfg, DataSplit::Test, &err);
      if (docs < 0)
        return err;
      if (docs == 0) {
        testNote = "no evaluation on the test set: [data] split '" + cfg.split +
                   "' leaves it no documents";
      } else if (!(test = build(DataSplit::Test, counts[2]))) {
        return err;
      }
    }
    return "";
  }

  // Fills the program's tokens and labels with micro-batch `m` of the batch
  // starting at sample `first`.
  // A pipeline plan's unrolled step has an input per micro-batch ("tokens.3"),
  // and a stage only those it reads (tokens on the first, labels on the last).
  std::string fillBatch(const ProgramIO &io, const GptDataset &data, int64_t first,
                        const std::string &suffix = "") {
    uint32_t t = io.input(("tokens" + suffix).c_str()), l = io.input(("labels" + suffix).c_str());
    auto *tokens = t == UINT32_MAX ? nullptr : static_cast<int32_t *>(exec->value_data(*io.program, t));
    auto *labels = l == UINT32_MAX ? nullptr : static_cast<int32_t *>(exec->value_data(*io.program, l));
    if (!tokens && !labels)
      return "";
    if (data.size() <= 0)
      return "data: error: the dataset's index holds no samples to fill a batch with";
    std::vector<int32_t> sample(size_t(seq + 1));
    for (int64_t b = 0; b < mbs; ++b) {
      if (std::string e = data.sample((first + b) % data.size(), sample.data()); !e.empty())
        return e;
      if (tokens)
        std::memcpy(tokens + b * seq, sample.data(), size_t(seq) * 4);
      if (labels)
        std::memcpy(labels + b * seq, sample.data() + 1, size_t(seq) * 4);
    }
    return "";
  }

  // A pipeline stage's train_step is the whole iteration's schedule in one
  // program (the plan's compact step as the executor expanded it, with
  // unrolled_micro_batches set): every micro-batch's inputs
  // first, each with its own RNG offset, then one run; the last stage reads
  // every micro-batch's loss. Returns the sum of the losses (0 on stages
  // without the loss).
  std::string runPipelined(const ProgramIO &io, const GptDataset &data, int64_t consumed,
                           int64_t micro, double *lossSum) {
    std::vector<uint64_t> offsets;
    const auto batchStart = std::chrono::steady_clock::now();
    for (int64_t m = 0; m < micro; ++m) {
      if (std::string e = fillBatch(io, data, sampleOf(consumed, m), "." + std::to_string(m));
          !e.empty())
        return e;
      offsets.push_back(rngOffset(m, false));
    }
    timers[kBatchGenerator] += msSince(batchStart);
    exec->set_micro_batch_rng_offsets(offsets);
    if (std::string err = exec->run(*io.program, 0); !err.empty())
      return err;
    *lossSum = 0;
    for (int64_t m = 0; m < micro; ++m) {
      uint32_t out = io.output(("loss." + std::to_string(m)).c_str());
      if (out != UINT32_MAX)
        *lossSum += *static_cast<float *>(exec->value_data(*io.program, out));
      collectRouterLosses(io, "." + std::to_string(m));
    }
    return "";
  }

  // --- Mixture of experts: Megatron's router-loss tracker (moe_utils.py
  // track_moe_metrics, called by training_log every iteration). A train
  // step outputs the sums over its stage's MoE layers of each router loss
  // (without its coefficient) per micro-batch; the tracker sums them over
  // micro-batches, over the pipeline group, averages the load-balancing
  // losses over data parallelism (z_loss has no reduce group in Megatron,
  // so the printing rank's own is logged), scales by 1 / micro-batches and
  // divides by the model's MoE layers. training_log adds each iteration's
  // value to total_loss_dict (skipped iterations too) and prints the
  // interval's sum over its advanced iterations after the lm loss, when
  // above 0, in the tracker's order; TensorBoard gets every tracked name
  // every iteration. Megatron's router computes these only in training, so
  // the validation lines have none.
  static constexpr const char *kRouterLossNames[3] = {"load_balancing_loss",
                                                      "seq_load_balancing_loss", "z_loss"};
  struct RouterLoss {
    bool tracked = false;
    double step = 0;     // this iteration: this rank's sum over micro-batches, then reduced
    double interval = 0; // the log interval's sum of the iterations' values
  };
  RouterLoss routerLoss[3];
  std::vector<int> routerLossOrder; // tracked names in the tracker's order
  int64_t moeLayers = 0;
  // Under sequence parallelism (the routers' count_group 1) each
  // tensor-parallel rank's load-balancing loss is its tokens' part of the
  // loss, and Megatron's tracker sums them over tp (the loss's reduce_group,
  // tp_cp) before the data-parallel average.
  bool routerLossOverTp = false;

  // The names Megatron's training_log tracks ("aux_loss" and "seq_aux_loss"
  // are matched as Python's `in` matches a substring: seq_aux_loss tracks a
  // zero load_balancing_loss too), in the order its tracker holds them on
  // the printing rank: those its own forward recorded (the router records
  // z_loss before the load-balancing loss), then the rest as training_log
  // lists them.
  void trackRouterLosses(const pl::Training &t) {
    moeLayers = t.moe_layers();
    if (moeLayers == 0)
      return;
    // Every rank decides alike (a stage without MoE layers has no router).
    for (const pl::Rank *r : *plan.ranks())
      for (size_t p = 0; r->programs() && p < r->programs()->size(); ++p)
        if (const pl::Program *prog = r->programs()->Get(uint32_t(p));
            str(prog->name()) == "train_step" && prog->instructions())
          for (const pl::Instruction *ins : *prog->instructions())
            if (ins->op() == pl::Opcode::MOE_ROUTER && ins->ints()->Get(9) == 1)
              routerLossOverTp = true;
    const std::string type = str(t.moe_load_balancing_type());
    routerLoss[0].tracked = type.find("aux_loss") != std::string::npos;
    routerLoss[1].tracked = type.find("seq_aux_loss") != std::string::npos;
    routerLoss[2].tracked = t.moe_z_loss_coeff() > 0;
    auto computed = [&](int i) {
      const std::string name = kRouterLossNames[i];
      return trainStep.output(name.c_str()) != UINT32_MAX ||
             trainStep.output((name + ".0").c_str()) != UINT32_MAX;
    };
    for (int i : {2, 0, 1})
      if (routerLoss[i].tracked && computed(i))
        routerLossOrder.push_back(i);
    for (int i : {0, 1, 2})
      if (routerLoss[i].tracked &&
          std::find(routerLossOrder.begin(), routerLossOrder.end(), i) == routerLossOrder.end())
        routerLossOrder.push_back(i);
  }

  // Adds a micro-batch's router losses (outputs NAME + suffix) to the step's.
  void collectRouterLosses(const ProgramIO &io, const std::string &suffix) {
    for (int i = 0; i < 3; ++i)
      if (const uint32_t out = io.output((kRouterLossNames[i] + suffix).c_str());
          out != UINT32_MAX)
        routerLoss[i].step += *static_cast<float *>(exec->value_data(*io.program, out));
  }

  // Every rank, after its forward-backward: the sums over the pipeline
  // group, the load-balancing losses averaged over data parallelism, then
  // the iteration's value per name.
  std::string reduceRouterLosses() {
    if (moeLayers == 0)
      return "";
    float v[3] = {float(routerLoss[0].step), float(routerLoss[1].step),
                  float(routerLoss[2].step)};
    if (Communicator *ppGroup = groups.get(Group::PP); ppGroup && pp > 1)
      if (std::string err = ppGroup->all_reduce(v, 3, ReduceOp::Sum); !err.empty())
        return err;
    if (Communicator *tpGroup = groups.get(Group::TP); tpGroup && routerLossOverTp)
      if (std::string err = tpGroup->all_reduce(v, 2, ReduceOp::Sum); !err.empty())
        return err;
    if (comm && dp > 1) {
      float sum[3] = {v[0], v[1], v[2]};
      if (std::string err = comm->all_reduce(sum, 3, ReduceOp::Sum); !err.empty())
        return err;
      v[0] = sum[0] / float(dp);
      v[1] = sum[1] / float(dp);
    }
    for (int i = 0; i < 3; ++i)
      routerLoss[i].step = double(v[i]) / double(curMicro) / double(moeLayers);
    return "";
  }

  // After the iteration: its values into the interval and TensorBoard.
  void addRouterLosses() {
    for (int i : routerLossOrder) {
      routerLoss[i].interval += routerLoss[i].step;
      scalar(kRouterLossNames[i], routerLoss[i].step, iteration);
    }
    for (RouterLoss &r : routerLoss)
      r.step = 0;
  }

  std::string runScalar(const ProgramIO &io, const char *output, uint64_t rngOffset,
                        float *out) {
    if (std::string err = exec->run(*io.program, rngOffset); !err.empty())
      return err;
    *out = *static_cast<float *>(exec->value_data(*io.program, io.output(output)));
    return "";
  }

  // Why the run stops after this iteration. The interval is the same on
  // every rank; a signal or the clock may reach one rank first, so the
  // ranks take the strongest reason any of them has.
  enum class Stop { No = 0, Interval = 1, Duration = 2, Signal = 3 };
  std::string anyRankStops(Stop *stop) {
    float flag = g_terminate ? float(Stop::Signal) : float(Stop::No);
    if (opts.exit_duration_mins > 0 && minutesSinceStart() > opts.exit_duration_mins)
      flag = std::max(flag, float(Stop::Duration));
    if (opts.exit_interval > 0 && iteration % opts.exit_interval == 0 && iteration < trainIters)
      flag = std::max(flag, float(Stop::Interval));
    if (groups.world)
      if (std::string err = groups.world->all_reduce(&flag, 1, ReduceOp::Max); !err.empty())
        return err;
    *stop = Stop(int(flag));
    return "";
  }
  // Since mtrun started, as Megatron counts from pretrain()'s start.
  double minutesSinceStart() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count() / 60.0;
  }

  // Megatron's sampler: each micro-batch step takes mbs * dp consecutive
  // samples, and data-parallel rank r reads its mbs of them at r * mbs.
  int64_t sampleOf(int64_t consumed, int64_t micro) const {
    return consumed + micro * mbs * dp + int64_t(dpRank) * mbs;
  }

  // The logged loss is the mean over data-parallel ranks, as Megatron
  // averages it across the data-parallel group.
  std::string averageOverDataParallel(double *loss) {
    if (!comm || dp == 1)
      return "";
    float v = float(*loss);
    if (std::string err = comm->all_reduce(&v, 1, ReduceOp::Sum); !err.empty())
      return err;
    *loss = double(v) / double(dp);
    return "";
  }

  // Dropout masks differ per iteration and micro-batch, and are reproduced
  // exactly on resume: the RNG is counter-based, keyed by this offset.
  uint64_t rngOffset(int64_t micro, bool eval) const {
    // Data-parallel ranks see different samples: they draw their own masks.
    uint64_t m = uint64_t(micro) * uint64_t(dp) + uint64_t(dpRank);
    return ((uint64_t(iteration - rngBase) << 20) + m) * 2 + (eval ? 1 : 0);
  }

  std::string forwardBackward(double *meanLoss) {
    double sum = 0;
    // A ramp-up's single micro-batch runs the last micro-batch's copy of the
    // step, which opens with the weight gathers only when the plan's batch
    // is one micro-batch too: gather them first.
    if (curMicro == 1 && microBatches > 1 && lastStep.program && firstStep.program)
      if (std::string err = gatherWeights(); !err.empty())
        return err;
    weightsGathered = true; // by the first micro-batch, where the plan gathers late
    if (trainStep.program->unrolled_micro_batches() > 0) {
      // A ramp-up's smaller batch runs the step expanded for its count.
      ProgramIO io = trainStep;
      if (curMicro != microBatches) {
        std::string err;
        io.program = exec->program_for_micro_batches("train_step", curMicro, &err);
        if (!io.program)
          return err;
      }
      if (std::string err = runPipelined(io, *train, consumedTrain, curMicro, &sum);
          !err.empty())
        return err;
      localLoss = sum;
      *meanLoss = sum / double(curMicro);
      return averageOverDataParallel(meanLoss);
    }
    for (int64_t m = 0; m < curMicro; ++m) {
      // Overlapped gradient reduction: the last micro-batch runs the copy of
      // the step that reduces each bucket as soon as its gradients are done;
      // overlapped weight gathers: the first runs the copy that opens with
      // them (with one micro-batch, the last's copy has both).
      const ProgramIO &io = m + 1 == curMicro && lastStep.program ? lastStep
                            : m == 0 && firstStep.program             ? firstStep
                                                                      : trainStep;
      // The last micro-batch's step reduces the gradients over data
      // parallel (overlapped with its backward): the power log's phase.
      if (m + 1 == curMicro && lastStep.program)
        powerMark(iteration + 1, "grad-reduce");
      const auto batchStart = std::chrono::steady_clock::now();
      if (std::string e = fillBatch(io, *train, sampleOf(consumedTrain, m)); !e.empty())
        return e;
      timers[kBatchGenerator] += msSince(batchStart);
      float loss = 0;
      if (std::string err = runScalar(io, "loss", rngOffset(m, false), &loss); !err.empty())
        return err;
      sum += loss;
      collectRouterLosses(io, "");
    }
    localLoss = sum;
    *meanLoss = sum / double(curMicro);
    return averageOverDataParallel(meanLoss);
  }

  std::string update(float norm) {
    auto *steps = static_cast<int64_t *>(exec->value_data(*optStep.program, optStep.input("steps")));
    auto *step = static_cast<int64_t *>(exec->value_data(*optStep.program, optStep.input("step")));
    auto *gn = static_cast<float *>(exec->value_data(*optStep.program, optStep.input("grad_norm")));
    auto *gs = static_cast<float *>(exec->value_data(*optStep.program, optStep.input("grad_scale")));
    *steps = stepsTaken;
    *step = stepsTaken + 1;
    *gn = norm;
    *gs = float(rampFactor() / lossScale);
    // A sample-based plan's schedule counts samples: those of the updates
    // so far, then with this one's (Megatron's scheduler.step(increment)).
    const int64_t batch = curMicro * mbs * dp;
    if (uint32_t next = optStep.input("next_steps"); next != UINT32_MAX) {
      *steps = lrSamples;
      *static_cast<int64_t *>(exec->value_data(*optStep.program, next)) = lrSamples + batch;
    }
    float next = 0;
    if (std::string err = runScalar(optStep, "next_lr", 0, &next); !err.empty())
      return err;
    lastLr = next; // what Megatron logs: the rate after the scheduler's step
    ++stepsTaken;
    lrSamples += batch;
    return "";
  }

  // Megatron's DynamicGradScaler (fp16 only; other precisions keep 1):
  // an overflow costs one hysteresis credit and, when none is left, halves
  // the scale (not below the minimum); `loss_scale_window` clean steps in a
  // row double it and restore the credits.
  void updateLossScale(bool foundInf) {
    const pl::Training *t = plan.training();
    if (!fp16)
      return;
    if (foundInf) {
      growthTracker = 0;
      if (--hysteresisTracker <= 0)
        lossScale = std::max(lossScale * 0.5, t->min_loss_scale());
    } else if (++growthTracker == t->loss_scale_window()) {
      growthTracker = 0;
      hysteresisTracker = t->hysteresis();
      lossScale *= 2.0;
    }
    exec->set_loss_scale(float(lossScale));
  }

  // Megatron's evaluate_and_print_results: eval_iters global batches of
  // `data` from sample *consumed on, "validation loss at WHERE".
  std::string evaluate(const GptDataset &data, int64_t *consumed, const std::string &where,
                       bool toBoard) {
    powerMark(iteration, "evaluation");
    const pl::Training *t = plan.training();
    if (!evalStep.program)
      return opts.plan_path + " lacks the eval_step program; recompile it with this mtc";
    if (std::string err = gatherWeights(); !err.empty())
      return err;
    double sum = 0;
    int64_t n = 0;
    // eval_step is one micro-batch's forward, pipelined or not: run once per
    // micro-batch (a pipeline stage's messages of one micro-batch complete
    // before the next one's start). Only the last stage has the loss.
    if (evalStep.program->unrolled_micro_batches() > 0)
      return opts.plan_path + "'s eval_step is unrolled over micro-batches; recompile it with "
                              "this mtc";
    const uint32_t lossOut = evalStep.output("loss");
    for (int64_t it = 0; it < t->eval_iters(); ++it) {
      for (int64_t m = 0; m < microBatches; ++m) {
        if (std::string e = fillBatch(evalStep, data, sampleOf(*consumed, m)); !e.empty())
          return e;
        if (std::string err = exec->run(*evalStep.program, rngOffset(m, true)); !err.empty())
          return err;
        if (lossOut != UINT32_MAX)
          sum += *static_cast<float *>(exec->value_data(*evalStep.program, lossOut));
      }
      n += microBatches;
      *consumed += gbs;
    }
    double loss = sum / double(n);
    if (std::string err = averageOverDataParallel(&loss); !err.empty())
      return err;
    if (std::isnan(loss))
      loss = std::fabs(loss);
    const double ppl = std::exp(std::isnan(loss) ? 20.0 : std::min(20.0, loss));
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  " validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ",
                  where.c_str(), loss, ppl);
    if (board && toBoard) {
      scalars("lm loss validation", loss);
      if (opts.log_validation_ppl_to_tensorboard)
        scalars("lm loss validation ppl", ppl);
    }
    std::string line(buf);
    std::string rule(line.size() + 1, '-');
    say(rule);
    say(line);
    say(rule);
    return "";
  }

  const pl::Plan &plan;
  const RunOptions &opts;
  int rank = 0;
  int localRank = 0; // which GPU of the node (--device cuda)
  const ParallelGroups &groups;
  Communicator *comm = nullptr; // the data-parallel group
  int dp = 1, dpRank = 0, pp = 1, ppRank = 0, tpRank = 0;
  const pl::Rank *myRank = nullptr;
  bool printer = true;
  std::unique_ptr<Executor> exec;
  std::unique_ptr<GptDataset> train, valid, test;
  // Megatron builds the training index for train_iters x global batch
  // samples, and its shuffle depends on the epochs that needs: a run resumed
  // with another --train-iters may find the samples its checkpoint trained on
  // elsewhere in the new index. The checkpoint records a hash of the order
  // the run trained in; a resumed run says when its index disagrees (it
  // keeps Megatron's order either way).
  void checkSampleOrder() {
    if (consumedTrain == 0 || !train)
      return;

    if (!loadedOrderHash) { // a checkpoint from before the record: unknown
      orderKnown = false;
      return;
    }
    orderHash = *loadedOrderHash;
    orderHashed = consumedTrain;
    if (!printer || iteration >= trainIters) // nothing trains: the order does not matter
      return;
    if (train->order_hash(GptDataset::kOrderHashStart, 0, consumedTrain) == *loadedOrderHash)
      return;
    say("data: the checkpoint's " + std::to_string(consumedTrain) +
        " training samples came in another order than this run's index gives them (it is "
        "built for " + std::string(bySamples ? "train_samples" : "train_iters x global batch") +
        " samples, " +
        (loadedIndexSamples > 0 ? std::to_string(loadedIndexSamples) + " then, " : "") +
        std::to_string(trainIndexSamples) + " now, as Megatron builds it): training goes on in "
        "this index's order, so it will not match a run of " + std::to_string(trainIters) +
        " iterations from the start");
  }

  // The checkpoint's data position against this plan: as Megatron's
  // sampler asserts, a run that trains on starts below the end of its
  // training index (consumed_train_samples is range-checked at parse; this
  // is the plan's limit).
  std::string checkResumePosition() const {
    if (loadedPath.empty() || !train || iteration >= trainIters || consumedTrain < train->size())
      return "";
    return loadedPath + ": error: the metadata's consumed_train_samples " +
           std::to_string(consumedTrain) + " is not below the " + std::to_string(train->size()) +
           " samples of this run's training index (built for " +
           (bySamples ? "train_samples" : "train_iters x global batch") + " = " +
           std::to_string(trainIndexSamples) + ") although the run trains on from iteration " +
           std::to_string(iteration) + " to " + std::to_string(trainIters) +
           "; the field is damaged or the checkpoint was trained with a larger batch: load "
           "an earlier iteration, or train for more samples";
  }

  std::string testNote; // why there is no test set to evaluate, if there is none
  ProgramIO trainStep, lastStep, firstStep, gatherProg, evalStep, normProg, optStep;
  std::ofstream log;
  std::unique_ptr<TensorBoardWriter> board; // the printing rank's, with --tensorboard-dir
  std::unique_ptr<PowerLog> power;          // every rank's, with --power-log
  std::string save, load;
  int64_t trainIters = 0, mbs = 0, gbs = 0, microBatches = 1, seq = 0;
  // Sample-based training: the samples to train (0: the plan counts
  // iterations), the batch ramp-up, this iteration's micro-batch count and
  // the LR scheduler's samples (those of the updates taken).
  int64_t trainSamples = 0, curMicro = 1, lrSamples = 0;
  bool bySamples = false;
  BatchRampup ramp;
  int64_t iteration = 0, consumedTrain = 0, consumedValid = 0, stepsTaken = 0, skipped = 0;
  int64_t savedIteration = -1;
  // The iteration at which the dropout counter was seeded: 0, or where a
  // load that left the random state out (or a checkpoint) put it.
  int64_t rngBase = 0;
  // The plan's checkpoint keys with mtrun's flags over them.
  bool finetune = false, noLoadOptim = false, noLoadRng = false, noSaveOptim = false,
       noSaveRng = false;
  int64_t ckptStep = -1;
  uint64_t rngSeed = 0; // the dropout masks' seed: the plan's, or a loaded checkpoint's
  int64_t trainIndexSamples = 0; // the samples the training index is built for
  // The order hash (GptDataset::order_hash) of training samples [0, orderHashed),
  // carried through checkpoints; unknown after a checkpoint without one.
  uint64_t orderHash = GptDataset::kOrderHashStart;
  int64_t orderHashed = 0;
  bool orderKnown = true;
  std::optional<uint64_t> loadedOrderHash;
  int64_t loadedIndexSamples = 0;
  std::string loadedPath; // the rank file a run resumed from, if any
  float lastLr = 0, lastNorm = 0;
  bool lastSkipped = false, fp16 = false;
  bool weightsGathered = true; // false between an update and the gathers it needs
  double lossScale = 1.0;
  // The training log's extras (the plan's settings, or mtrun's flags).
  bool logThroughput = false, logParamsNorm = false, logZeros = false, logMemoryBoard = false;
  bool nanCheck = true;
  int timingLevel = 0;
  std::string timingOption = "minmax";
  // This iteration's figures: the params norm (NAN when not computed), the
  // zero count (-1: none, as Megatron's None) and this rank's loss before
  // the data-parallel average (the sum over its micro-batches).
  double paramsNorm = NAN, numZeros = -1, localLoss = 0;
  // The log interval's accumulators (Megatron's total_loss_dict and timers).
  double intervalSeconds = 0, intervalLoss = 0;
  int64_t intervalAdvanced = 0, intervalSkipped = 0, intervalNan = 0;
  double timers[kTimerCount] = {};
  int64_t growthTracker = 0, hysteresisTracker = 0;
};

const char *kUsage = R"(usage: mtrun PLAN [options]

Trains the model of PLAN (written by `mtc compile SPEC.toml -o PLAN`).

options:
  --device cpu|cuda     where to run (default cpu; cuda: each rank on one GPU of
                        its node, local rank N on device N, NCCL between them)
  --no-cuda-graph       with --device cuda, launch every kernel and GEMM of every
                        step from the host instead of capturing each program
                        once as a CUDA graph and replaying it (for debugging
                        and timing comparisons; the results are the same bits)
  --save DIR            save checkpoints to DIR (overrides [training] save)
  --load DIR            resume from the latest checkpoint in DIR (overrides [training] load)
  --ckpt-step N         load iteration N of --load instead of the tracker's latest
  --finetune            load the weights only: start at iteration 0 from the first
                        sample, with a fresh optimizer, learning-rate schedule,
                        loss scale and random state (Megatron's --finetune)
  --no-load-optim       load without the optimizer state: masters from the loaded
                        weights, zero moments, a fresh learning-rate schedule and
                        loss scale; the iteration and data position are kept
  --no-load-rng         load without the random state: dropout draws afresh from
                        the seed
  --no-save-optim, --no-save-rng
                        leave the optimizer state / the random state out of every
                        checkpoint saved (smaller files; such a checkpoint loads
                        with --no-load-optim / --no-load-rng or --finetune)
  --train-iters N       stop after iteration N (overrides [training] train_iters)
  --train-samples N     a sample-based plan's samples to train (overrides
                        [training] train_samples; the iterations follow as
                        Megatron derives them, batch ramp-up included)
  --log-file FILE       also append the log lines to FILE
  --exit-interval N     save and exit after an iteration divisible by N
  --skip-train          no training: evaluate the validation and test sets at
                        the loaded iteration (Megatron's --skip-train)
  --exit-duration-in-mins M
                        save and exit after the first iteration that ends
                        more than M minutes after mtrun started (every rank
                        stops at the same iteration); SIGTERM does the same
  --tensorboard-dir DIR write TensorBoard event files to DIR (the last rank,
                        as Megatron-LM): learning-rate, lm loss, loss-scale,
                        grad-norm and lm loss validation, each also against
                        consumed samples ("... vs samples")
  --tensorboard-log-interval N
                        write them every N iterations (default 1)
  --log-batch-size-to-tensorboard, --log-world-size-to-tensorboard,
  --log-validation-ppl-to-tensorboard, --log-timers-to-tensorboard
                        also batch-size, world-size, lm loss validation ppl,
                        iteration-time (seconds, every log_interval)
  --no-log-learning-rate-to-tensorboard, --no-log-loss-scale-to-tensorboard
                        leave those out
  --log-throughput, --log-params-norm, --log-num-zeros-in-grad
                        add those fields to the iteration line (TFLOP/s per
                        GPU, the parameters' L2 norm, the zero gradient
                        elements), as the spec's keys of the same names
  --timing-log-level 0|1|2, --timing-log-option max|minmax|all
                        print Megatron's timers block after each iteration
                        line (1: forward-backward and the optimizer's
                        phases; 2: also batch-generator), reduced over ranks
  --log-memory-to-tensorboard
                        also mem-reserved-bytes, mem-allocated-bytes,
                        mem-max-allocated-bytes, mem-allocated-count
  --power-log FILE      sample this rank's GPU through NVML on a side thread
                        (power, SM and memory clocks, temperature,
                        utilisation, memory used) into the CSV FILE, with a
                        mark at each phase of each iteration; with several
                        ranks FILE.rankN.csv (or %r in FILE); TensorBoard
                        gets the means as gpu-power-watts and the like
  --power-log-interval MS
                        sample every MS milliseconds (default 100; 1-60000)
  --no-check-for-nan-in-loss-and-grad, --check-for-nan-in-loss-and-grad
                        whether a NaN or Inf loss or gradient stops the run
                        (default: the plan's; on unless fp16)
  --check-memory-plan   poison dead arena bytes and fail if a value is read
                        after its planned lifetime (slow; for testing plans)
  --nproc N             start N ranks on this machine (outside SLURM); under
                        srun, rank and world size come from SLURM_*
  --rank R, --world-size W, --job NAME, --rendezvous-dir DIR
                        this process's rank, the number of ranks, the run's
                        name and a directory every rank can reach, when
                        starting ranks by hand (or MT_RANK, MT_WORLD_SIZE,
                        MT_JOB, MT_RENDEZVOUS_DIR; see docs/launch.md)
  --timeout S           seconds a rank waits for the others in a collective
                        before it fails naming the rank that never entered
                        it, its host and its last collective (default 300)
  --distributed-timeout-minutes M
                        the same in minutes, as Megatron-LM's flag
  --help, -h            this text
)";


} // namespace

int run_training(const RunOptions &opts) {
  g_start = std::chrono::steady_clock::now();
  set_activity("reading the plan " + opts.plan_path);
  // From the start: a SIGTERM during set-up also ends the run cleanly. A
  // rank of `--nproc` starts with it blocked (LocalRunOptions::
  // block_stop_signals), so one the launcher passed on before this line is
  // delivered now, to the handler.
  std::signal(SIGTERM, on_sigterm);
  unblock_stop_signals();
  // A write past the file size limit (ulimit -f) fails with EFBIG, which
  // the save reports with the file's name, instead of killing the run
  // silently with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  if (opts.device != "cpu" && opts.device != "cuda")
    return fail("--device must be 'cpu' or 'cuda', got '" + opts.device + "'");
  std::string err;
  std::unique_ptr<PlanFile> file = PlanFile::open(opts.plan_path, &err);
  if (!file)
    return fail(err);
  const pl::Plan &plan = *file->plan();
  LaunchInfo launch = launch_from_environment(opts.launch, &err);
  if (!err.empty())
    return fail(err);
  const int world = plan.world_size();
  if (!plan.ranks() || int(plan.ranks()->size()) != world)
    return fail(opts.plan_path + " is for " + std::to_string(world) +
                " ranks but its rank table has " +
                std::to_string(plan.ranks() ? plan.ranks()->size() : 0) +
                " entries; recompile it with this mtc");
  if (launch.world != world)
    return fail(opts.plan_path + " is for " + std::to_string(world) + " rank" +
                (world == 1 ? "" : "s") + " but " + std::to_string(launch.world) +
                " were started (" + launch.source + "); start it with " +
                (world == 1 ? std::string("one process")
                            : "srun -n " + std::to_string(world) + " or mtrun --nproc " +
                                  std::to_string(world)));
  if (!find_rank(plan, launch.rank))
    return fail(opts.plan_path + " has no rank " + std::to_string(launch.rank));
  // A plan from an mtc that did not check its schedule against NCCL's rules
  // would hang the GPUs; mtc refuses to write such a plan now.
  if (opts.device == "cuda")
    if (std::string e = check_comm_order(plan); !e.empty())
      return fail("--device cuda: " + opts.plan_path + " would hang on GPUs: " + e +
                  "; recompile the spec with this mtc");
  std::unique_ptr<Communicator> comm;
  if (world > 1) {
    set_activity_speaker("rank " + std::to_string(launch.rank) + ": ");
    set_activity("connecting to the other " + std::to_string(world - 1) + " ranks");
    if (std::string e = prepare_rendezvous_dir(launch); !e.empty())
      return fail(e);
    GlooOptions g;
    g.rank = launch.rank;
    g.world = launch.world;
    g.store_dir = launch.rendezvous_base;
    g.job = launch.job;
    g.hostname = launch.hostname;
    g.timeout = std::chrono::milliseconds(int64_t(opts.timeout_s * 1000));
    comm = connect_gloo(g, &err);
    if (!comm)
      return fail(err);
  }
  ParallelGroups groups;
  ParallelLayout layout{std::max(1, plan.tensor_parallel()), std::max(1, plan.pipeline_parallel()),
                        std::max(1, plan.data_parallel())};
  // The expert layout (the reader checked ep x etp divides tp x dp); its
  // groups exist when some parameter is an expert's.
  layout.ep = std::max(1, plan.expert_model_parallel());
  layout.etp = std::max(1, plan.expert_tensor_parallel());
  layout.experts = plan_has_experts(plan);
  if (layout.world() != world)
    return fail(opts.plan_path + " says tensor " + std::to_string(layout.tp) + " x pipeline " +
                std::to_string(layout.pp) + " x data " + std::to_string(layout.dp) +
                " parallel but has " + std::to_string(world) + " ranks; recompile it with mtc");
  if (std::string e = make_parallel_groups(comm.get(), layout, launch.rank, &groups); !e.empty())
    return fail(e);
  if (world > 1) {
    // Every rank says where it is, once its groups are up.
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const std::string expert =
        layout.ep > 1 || layout.etp > 1
            ? ", ep rank " + std::to_string(groups.coords.ep) + " of " +
                  std::to_string(layout.ep) +
                  (layout.etp > 1 ? ", expert tp rank " + std::to_string(groups.coords.etp) +
                                        " of " + std::to_string(layout.etp)
                                  : std::string()) +
                  ", expert dp rank " + std::to_string(groups.coords.edp) + " of " +
                  std::to_string(layout.edp())
            : std::string();
    std::printf("rank %d of %d: tp rank %d of %d, pp rank %d of %d, dp rank %d of %d%s (%s, %s)\n",
                launch.rank, world, groups.coords.tp, layout.tp, groups.coords.pp, layout.pp,
                groups.coords.dp, layout.dp, expert.c_str(), host, launch.source.c_str());
    std::fflush(stdout);
  }
  int status = Trainer(plan, opts, launch.rank, launch.local_rank, groups).run();
  if (comm && status == 0) {
    // Everyone is done with the rendezvous before the first rank removes it.
    if (std::string e = comm->barrier(); !e.empty())
      return fail(e);
    if (launch.rank == 0)
      remove_rendezvous_dir(launch);
  }
  return status;
}

// mtrun's switches: flags without a value, each setting one option.
struct Switch {
  const char *name;
  bool RunOptions::*option;
  bool value;
};
constexpr Switch kSwitches[] = {
    {"--check-memory-plan", &RunOptions::check_memory_plan, true},
    {"--skip-train", &RunOptions::skip_train, true},
    {"--no-cuda-graph", &RunOptions::cuda_graphs, false},
    {"--log-batch-size-to-tensorboard", &RunOptions::log_batch_size_to_tensorboard, true},
    {"--log-world-size-to-tensorboard", &RunOptions::log_world_size_to_tensorboard, true},
    {"--log-validation-ppl-to-tensorboard", &RunOptions::log_validation_ppl_to_tensorboard, true},
    {"--log-timers-to-tensorboard", &RunOptions::log_timers_to_tensorboard, true},
    {"--no-log-learning-rate-to-tensorboard", &RunOptions::log_learning_rate_to_tensorboard,
     false},
    {"--no-log-loss-scale-to-tensorboard", &RunOptions::log_loss_scale_to_tensorboard, false},
    {"--log-throughput", &RunOptions::log_throughput, true},
    {"--log-params-norm", &RunOptions::log_params_norm, true},
    {"--log-num-zeros-in-grad", &RunOptions::log_num_zeros_in_grad, true},
    {"--log-memory-to-tensorboard", &RunOptions::log_memory_to_tensorboard, true},
    {"--finetune", &RunOptions::finetune, true},
    {"--no-load-optim", &RunOptions::no_load_optim, true},
    {"--no-load-rng", &RunOptions::no_load_rng, true},
    {"--no-save-optim", &RunOptions::no_save_optim, true},
    {"--no-save-rng", &RunOptions::no_save_rng, true},
};

int mtrun_main(int argc, char **argv) {
  RunOptions o;
  int nproc = 0;
  auto usage = [](const std::string &msg) {
    std::fprintf(stderr, "mtrun: error: %s; see 'mtrun --help'\n", msg.c_str());
    return 1;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char *name, std::string *out) -> int {
      std::string n(name);
      if (a == n) {
        if (i + 1 >= argc)
          return -1;
        *out = argv[++i];
        return 1;
      }
      if (a.rfind(n + "=", 0) == 0) {
        *out = a.substr(n.size() + 1);
        return 1;
      }
      return 0;
    };
    std::string v;
    int r;
    // The value `value` found (r > 0): a whole number in [lo, hi]; a real > 0.
    auto integer = [&](long long lo, long long hi, long long *n) {
      char *end = nullptr;
      *n = r < 0 ? -1 : std::strtoll(v.c_str(), &end, 10);
      return r > 0 && !v.empty() && *end == '\0' && *n >= lo && *n <= hi;
    };
    auto positive = [&](double *x) {
      char *end = nullptr;
      *x = r < 0 ? -1 : std::strtod(v.c_str(), &end);
      return r > 0 && !v.empty() && *end == '\0' && *x > 0;
    };
    const Switch *sw = nullptr;
    for (const Switch &s : kSwitches)
      if (a == s.name)
        sw = &s;
    long long n = 0;
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (sw) {
      o.*(sw->option) = sw->value;
    } else if (a == "--no-check-for-nan-in-loss-and-grad" ||
               a == "--check-for-nan-in-loss-and-grad") {
      o.check_for_nan_in_loss_and_grad = a[2] == 'n' ? 0 : 1;
    } else if ((r = value("--timing-log-level", &v))) {
      if (!integer(0, 2, &n))
        return usage("--timing-log-level needs 0, 1 or 2, got '" + v + "'");
      o.timing_log_level = int(n);
    } else if ((r = value("--timing-log-option", &o.timing_log_option))) {
      if (r < 0 || (o.timing_log_option != "max" && o.timing_log_option != "minmax" &&
                    o.timing_log_option != "all"))
        return usage("--timing-log-option needs max, minmax or all, got '" +
                     o.timing_log_option + "'");
    } else if ((r = value("--tensorboard-dir", &o.tensorboard_dir))) {
      if (r < 0 || o.tensorboard_dir.empty()) return usage("--tensorboard-dir needs a directory");
    } else if ((r = value("--exit-interval", &v))) {
      if (!integer(1, LLONG_MAX, &n))
        return usage("--exit-interval needs a number of iterations >= 1, got '" + v + "'");
      o.exit_interval = n;
    } else if ((r = value("--exit-duration-in-mins", &v))) {
      if (!positive(&o.exit_duration_mins))
        return usage("--exit-duration-in-mins needs minutes > 0, got '" + v + "'");
    } else if ((r = value("--power-log", &o.power_log))) {
      if (r < 0 || o.power_log.empty())
        return usage("--power-log needs a file");
    } else if ((r = value("--power-log-interval", &v))) {
      if (!integer(1, 60000, &n))
        return usage("--power-log-interval needs milliseconds from 1 to 60000, got '" + v + "'");
      o.power_log_interval_ms = n;
    } else if ((r = value("--tensorboard-log-interval", &v))) {
      if (!integer(1, LLONG_MAX, &n))
        return usage("--tensorboard-log-interval needs a number >= 1, got '" + v + "'");
      o.tensorboard_log_interval = n;
    } else if ((r = value("--device", &o.device))) {
      if (r < 0) return usage("--device needs cpu or cuda");
    } else if ((r = value("--save", &o.save))) {
      if (r < 0 || o.save.empty()) return usage("--save needs a directory");
    } else if ((r = value("--load", &o.load))) {
      if (r < 0 || o.load.empty()) return usage("--load needs a directory");
    } else if ((r = value("--ckpt-step", &v))) {
      if (!integer(0, mt::rt::kMaxCheckpointCount, &n))
        return usage("--ckpt-step needs an iteration >= 0, got '" + v + "'");
      o.ckpt_step = n;
    } else if ((r = value("--log-file", &o.log_file))) {
      if (r < 0 || o.log_file.empty()) return usage("--log-file needs a file name");
    } else if ((r = value("--train-iters", &v))) {
      if (!integer(0, LLONG_MAX, &n))
        return usage("--train-iters needs a number >= 0, got '" + v + "'");
      o.train_iters = n;
    } else if ((r = value("--train-samples", &v))) {
      if (!integer(0, LLONG_MAX, &n))
        return usage("--train-samples needs a number >= 0, got '" + v + "'");
      o.train_samples = n;
    } else if ((r = value("--nproc", &v))) {
      if (!integer(1, 1024, &n))
        return usage("--nproc needs a number of ranks from 1 to 1024, got '" + v + "'");
      nproc = int(n);
    } else if ((r = value("--rank", &v)) || (r = value("--world-size", &v))) {
      bool isRank = a.rfind("--rank", 0) == 0;
      if (!integer(isRank ? 0 : 1, INT_MAX, &n))
        return usage(std::string(isRank ? "--rank" : "--world-size") + " needs a number, got '" +
                     v + "'");
      (isRank ? o.launch.rank : o.launch.world) = int(n);
    } else if ((r = value("--job", &o.launch.job))) {
      if (r < 0 || o.launch.job.empty()) return usage("--job needs a name for this run");
    } else if ((r = value("--rendezvous-dir", &o.launch.rendezvous_dir))) {
      if (r < 0 || o.launch.rendezvous_dir.empty())
        return usage("--rendezvous-dir needs a directory every rank can reach");
    } else if ((r = value("--timeout", &v))) {
      // At most a week: beyond it a wait is a hang, and the deadline's
      // arithmetic stays exact.
      if (!positive(&o.timeout_s) || o.timeout_s > 604800)
        return usage("--timeout needs seconds in (0, 604800] (a week at most), got '" + v + "'");
    } else if ((r = value("--distributed-timeout-minutes", &v))) {
      if (!positive(&o.timeout_s) || o.timeout_s > 10080)
        return usage("--distributed-timeout-minutes needs minutes in (0, 10080] (a week at "
                     "most), got '" + v + "'");
      o.timeout_s *= 60;
    } else if (!a.empty() && a[0] == '-') {
      return usage("unknown option '" + a + "'");
    } else if (o.plan_path.empty()) {
      o.plan_path = a;
    } else {
      return usage("more than one plan given ('" + o.plan_path + "' and '" + a + "')");
    }
  }
  if (o.plan_path.empty())
    return usage("no plan given: mtrun PLAN");
  if (nproc > 0) {
    // Run this same command line once per rank, without --nproc.
    std::vector<std::string> args;
    for (int i = 0; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--nproc") {
        ++i;
        continue;
      }
      if (a.rfind("--nproc=", 0) == 0)
        continue;
      args.push_back(i == 0 ? std::string("/proc/self/exe") : a);
    }
    char exe[4096];
    ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0)
      args[0] = std::string(exe, size_t(len));
    LocalRunOptions lo;
    lo.tool = "mtrun";
    lo.prefix_output = false; // only the last rank prints, in Megatron's format
    lo.block_stop_signals = true;
    return run_local_ranks(nproc, args, lo);
  }
  return run_training(o);
}

} // namespace mt::rt
