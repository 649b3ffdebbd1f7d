// Checkpoints of a whole parallel layout: the collective save of every
// model-parallel rank's file, the layout each file records, its check on
// load, and the conversion between layouts behind `mtc reshard`.
//
// Each rank file's metadata "values" describe the layout that saved it:
//   tensor_parallel, pipeline_parallel, data_parallel   the sizes
//   distributed_optimizer   the shard layout ("dp 2, flat 35200, buckets
//                           [0, 35200)"), only with the distributed optimizer
//   param_layout            this rank's parameters, ";"-separated, each
//                           "NAME TP_DIM TP_BLOCKS FLAT_OFFSET SHAPE" with the
//                           shard's SHAPE as "32x96" (plan.fbs, Param)
// With them a checkpoint is self-describing: a loader refuses another layout
// by name, and reshard reassembles every whole tensor without the plan that
// saved it.
#ifndef MT_RUNTIME_CHECKPOINT_LAYOUT_H
#define MT_RUNTIME_CHECKPOINT_LAYOUT_H

#include "runtime/ckpt/checkpoint.h"
#include "runtime/comm/collectives.h"
#include "runtime/plan/plan_reader.h"

#include <map>
#include <string>
#include <vector>

namespace mt::rt {

// The distributed optimizer's shard layout of `rank` (the value above).
std::string shard_layout(const mt::plan::Plan &plan, const mt::plan::Rank &rank);
// "NAME TP_DIM TP_BLOCKS FLAT_OFFSET SHAPE;..." of `rank`'s parameters.
std::string param_layout(const mt::plan::Rank &rank);
// Adds the layout values of `rank` of `plan` to meta->values (without the
// distributed optimizer's when meta->values says "no_save_optim").
void add_layout_values(const mt::plan::Plan &plan, const mt::plan::Rank &rank,
                       CheckpointMeta *meta);
// Every file a checkpoint of `plan` holds: one per model-parallel rank, and
// the distributed optimizer's beside each when the plan uses it and the
// optimizer's state is saved.
std::vector<std::string> checkpoint_files_of(const mt::plan::Plan &plan,
                                             bool with_optimizer = true);

// "" when the checkpoint whose first rank file is `first` was saved by the
// tensor and pipeline layout of `plan`; else one line naming the file and
// the `mtc reshard` command that converts it.
std::string check_saved_layout(const CheckpointReader &first, const std::string &load_dir,
                               const mt::plan::Plan &plan, const std::string &plan_path);
// "" when `reader` (this rank's file) holds the parameters of `rank`
// (same names, shards and flat offsets); else one line.
std::string check_rank_params(const CheckpointReader &reader, const mt::plan::Rank &rank,
                              const std::string &load_dir, const std::string &plan_path);

// The collective save: every rank of `world` (null for one process) calls it
// at the same iteration. World rank 0 creates the staging directory and
// broadcasts its name; the ranks with `writes` (data-parallel rank 0 of each
// model-parallel rank) write their files into it; all agree on success with
// an all-reduce; rank 0 checks that `files` are all present, renames the
// directory into place and replaces the tracker; all agree again. A failure
// anywhere leaves the previous checkpoint the latest and intact, and every
// rank returns an error (the failing rank its own, the others one naming it).
std::string save_checkpoint_collective(Communicator *world, int world_rank,
                                       const std::string &save_dir, const CheckpointMeta &meta,
                                       const std::vector<std::string> &files, bool writes,
                                       const std::vector<CheckpointTensor> &tensors, int tp_rank,
                                       int pp_rank, int pp_size,
                                       const std::vector<CheckpointTensor> *distrib_optim);

// A parameter of a checkpoint, whole: its tensor-parallel shards joined.
struct WholeWeight {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// mt-checkpoint from-hf: a checkpoint in the layout of `plan` at iteration
// 0 that starts training from `weights` (every parameter of the plan,
// whole, f32): each rank's slices of the weights (rounded to the plan's
// dtype), their f32 master copies where the plan keeps them, the
// optimizer's state zero (Adam's moments or SGD's momentum; the distributed
// optimizer's as its dp shards), 0 optimizer steps, the plan's initial loss
// scale, so `mtrun PLAN --load` starts from them as from its own
// initialisation. `values` go into every rank file's metadata; `source`
// names the weights' origin in errors. save_dir is written as a save is
// (staged, then renamed, then the tracker). Returns "" or one error line;
// *files gets the number of rank files.
std::string save_initial_checkpoint(const std::map<std::string, WholeWeight> &weights,
                                    const mt::plan::Plan &plan, const std::string &plan_path,
                                    const std::string &source,
                                    const std::map<std::string, std::string> &values,
                                    const std::string &save_dir, size_t *files);

// mtc reshard: reads the checkpoint in load_dir (the tracker's iteration, or
// `iteration` when >= 0), reassembles every whole tensor (weights, master
// copies, Adam moments, the distributed optimizer's shards included) and
// saves it in the layout of `plan` into save_dir, atomically, with the
// iteration, data position, random state, optimizer step count and
// loss-scale state carried over. A checkpoint saved without its optimizer
// state ("no_save_optim") is converted as the weights alone, and stays so. Returns "" or one error line; *summary gets one line on
// what was done.
std::string reshard_checkpoint(const std::string &load_dir, int64_t iteration,
                               const mt::plan::Plan &plan, const std::string &plan_path,
                               const std::string &save_dir, std::string *summary);


// Every parameter (the weights, no optimizer state) of the checkpoint in
// load_dir (the tracker's iteration, or `iteration` when >= 0), whole, as
// reshard_checkpoint assembles them: each rank file's param_layout says
// how its shards join, every pipeline stage's file is read, the pipeline's
// tied copy of the embedding once. *meta gets the first rank file's
// metadata (iteration, spec, layout). Returns "" or one error line.
std::string read_whole_weights(const std::string &load_dir, int64_t iteration,
                               CheckpointMeta *meta, std::map<std::string, WholeWeight> *out);

} // namespace mt::rt

#endif // MT_RUNTIME_CHECKPOINT_LAYOUT_H
