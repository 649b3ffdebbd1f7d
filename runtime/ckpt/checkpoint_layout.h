// Checkpoints of a whole parallel layout: the collective save of every
// model-parallel rank's file, the layout each file records, its check on
// load, and the conversion between layouts behind `mtc reshard`.
//
// Each rank file's metadata "values" describe the layout that saved it:
//   tensor_parallel, pipeline_parallel, data_parallel   the sizes
//   expert_model_parallel   ep, only when ep > 1 (the file name's _EEE)
//   expert_tensor_parallel  etp, only when etp > 1
//   distributed_optimizer   the shard layout ("dp 2, flat 35200, buckets
//                           [0, 35200)"; with expert buckets "dp 2, edp 1,
//                           flat 40000, shard 37600, buckets [35200, 40000)
//                           edp@0 [0, 35200) dp@2400"), only with the
//                           distributed optimizer
//   param_layout            the file's parameters, ";"-separated, each
//                           "NAME TP_DIM TP_BLOCKS FLAT_OFFSET SHAPE [EP_DIM
//                           [etp]]" with the shard's SHAPE as "32x96",
//                           EP_DIM for an expert-parallel shard, and "etp"
//                           when TP_DIM is an expert's shard over the
//                           expert-tensor-parallel ranks (EP_DIM then -1
//                           without ep; plan.fbs, Param)
// With them a checkpoint is self-describing: a loader refuses another layout
// by name, and reshard reassembles every whole tensor without the plan that
// saved it.
//
// Who writes what (nothing is written twice): within a pipeline stage, the
// dense parameters (and their optimizer state) of tensor-parallel rank t are
// written by data-parallel rank 0 of t; the expert parameters of
// expert-parallel rank e and expert-tensor-parallel rank x (and theirs) by
// expert-data-parallel rank 0 of (x, e): stage index x + etp e. A writer's
// file is named by its own coordinates, mp_rank_TT[_PPP][_EEE] (Megatron's
// get_checkpoint_name: TT the tp rank, _EEE the ep rank when ep > 1; when
// etp > tp, TT is the stage index modulo etp, the etp rank of an expert
// writer, see checkpoint_name_rank); a rank that writes both writes one
// file. A stage so has max(tp, etp ep) files, those of stage index >= tp
// holding experts alone. The distributed
// optimizer's state is saved per group: dp_rank_RR.KIND, the dense buckets'
// shards of dp rank RR (gathered over dp), beside the dense parameters;
// edp_rank_RR.KIND, the expert buckets' shards of expert-dp rank RR
// (gathered over expt_dp), beside the experts. Each is the rank's shards of
// that group's buckets in shard-state order.
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
// The same of the parameters `rank` writes into its file (its role below).
std::string param_layout(const mt::plan::Plan &plan, const mt::plan::Rank &rank);

// What a rank writes into its checkpoint file: the dense parameters
// (data-parallel rank 0), the expert parameters (expert-data-parallel rank
// 0), both, or nothing (no file).
struct CheckpointRole {
  bool dense = false, experts = false;
  bool writes() const { return dense || experts; }
};
CheckpointRole checkpoint_role(const mt::plan::Plan &plan, const mt::plan::Rank &rank);
// The TT of the rank's file name: its tp rank, or its stage index modulo
// etp when expert_tensor_parallel_size > tp (the expert writers of one ep
// rank then share a tp rank; the dense writers' index is their tp rank).
int checkpoint_name_rank(const mt::plan::Plan &plan, const mt::plan::Rank &rank);
// The rank's checkpoint file, named by checkpoint_name_rank, its pp rank
// and its ep rank.
std::string rank_checkpoint_file(const mt::plan::Plan &plan, const mt::plan::Rank &rank,
                                 bool distrib_optim);
// The rank that writes `rank`'s dense (experts false) or expert parameters:
// the rank of the same stage and tp rank at dp rank 0, or of the same etp
// and ep ranks at expert-dp rank 0. Null when the plan lacks it.
const mt::plan::Rank *checkpoint_writer(const mt::plan::Plan &plan, const mt::plan::Rank &rank,
                                        bool experts);

// The files of one pipeline stage of a checkpoint saved by tp, ep and etp
// ranks, as (name rank TT, ep_rank), sorted: the writers' stage indices i
// in [0, max(tp, etp ep)) give (i % max(tp, etp), (i / etp) % ep); at etp 1
// the dense writers' (t, t % ep) and the expert writers' (e % tp, e).
std::vector<std::pair<int, int>> checkpoint_stage_files(int tp, int ep, int etp = 1);

// The distributed optimizer's shard state of a rank by group: the shards of
// its dense buckets (experts false) or of its expert buckets, packed in
// shard-state order; what dp_rank_RR.KIND / edp_rank_RR.KIND hold.
int64_t packed_shard_elements(const mt::plan::Plan &plan, const mt::plan::Rank &rank,
                              bool experts);
void pack_shard(const mt::plan::Plan &plan, const mt::plan::Rank &rank, bool experts,
                const float *shard, float *packed);
void unpack_shard(const mt::plan::Plan &plan, const mt::plan::Rank &rank, bool experts,
                  const float *packed, float *shard);
// "dp_rank_01.exp_avg" or "edp_rank_01.exp_avg".
std::string shard_tensor_name(bool experts, int group_rank, const std::string &kind);
// Adds the layout values of `rank` of `plan` to meta->values (without the
// distributed optimizer's when meta->values says "no_save_optim").
void add_layout_values(const mt::plan::Plan &plan, const mt::plan::Rank &rank,
                       CheckpointMeta *meta);
// Every file a checkpoint of `plan` holds: one per writing rank, and the
// distributed optimizer's beside each when the rank writes optimizer shards
// and the optimizer's state is saved.
std::vector<std::string> checkpoint_files_of(const mt::plan::Plan &plan,
                                             bool with_optimizer = true);

// "" when the checkpoint whose first rank file is `first` was saved by the
// tensor, pipeline and expert-parallel layout of `plan`; else one line
// naming the file, both layouts and the `mtc reshard` command that converts
// it.
std::string check_saved_layout(const CheckpointReader &first, const std::string &load_dir,
                               const mt::plan::Plan &plan, const std::string &plan_path);
// "" when `reader` (the file `writer` wrote) holds the parameters `writer`
// writes (same names, shards and flat offsets); else one line.
std::string check_rank_params(const CheckpointReader &reader, const mt::plan::Plan &plan,
                              const mt::plan::Rank &writer, const std::string &load_dir,
                              const std::string &plan_path);

// The collective save: every rank of `world` (null for one process) calls it
// at the same iteration. World rank 0 creates the staging directory and
// broadcasts its name; the ranks with `writes` (checkpoint_role) write
// their files (named by tp_rank, pp_rank and, with ep_size > 1, ep_rank)
// into it; all agree on success with
// an all-reduce; rank 0 checks that `files` are all present, renames the
// directory into place and replaces the tracker; all agree again. A failure
// anywhere leaves the previous checkpoint the latest and intact, and every
// rank returns an error (the failing rank its own, the others one naming it).
std::string save_checkpoint_collective(Communicator *world, int world_rank,
                                       const std::string &save_dir, const CheckpointMeta &meta,
                                       const std::vector<std::string> &files, bool writes,
                                       const std::vector<CheckpointTensor> &tensors, int tp_rank,
                                       int pp_rank, int pp_size,
                                       const std::vector<CheckpointTensor> *distrib_optim,
                                       int ep_rank = 0, int ep_size = 1);

// A parameter of a checkpoint, whole: its tensor- and expert-parallel
// shards joined (an expert tensor is the concatenation over the ep ranks in
// ep-rank order on its ep_dim).
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
