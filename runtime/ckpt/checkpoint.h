// Training checkpoints: one atomic save per iteration and an exact resume,
// laid out as Megatron-LM lays out its own so its users find their way.
//
// Directory layout (SAVE is --save, LOAD is --load):
//   SAVE/latest_checkpointed_iteration.txt   the iteration as decimal text, no
//                                             newline, as Megatron writes it
//   SAVE/iter_0000100/mp_rank_00.mtckpt      one file per model-parallel rank:
//                                             mp_rank_{tp:02d} when pp == 1,
//                                             mp_rank_{tp:02d}_{pp:03d} otherwise,
//                                             and _{ep:03d} after either when
//                                             expert_model_parallel_size > 1
//                                             (Megatron's get_checkpoint_name;
//                                             when expert_tensor_parallel_size
//                                             > tp, {tp} is the writer's etp
//                                             rank: checkpoint_layout.h)
//   SAVE/iter_0000100/mp_rank_00.distrib_optim.mtckpt
//                                             with the distributed optimizer: every
//                                             data-parallel rank's shard of the
//                                             optimizer state (Megatron's
//                                             mp_rank_00/distrib_optim.pt)
// Every checkpoint is kept (Megatron deletes none either). Names starting with
// ".tmp.iter_" or "latest_checkpointed_iteration.txt.tmp." are the leftovers
// of an interrupted save: loads never look at them and the next save deletes
// them. There is no data-parallel rank in the name: data-parallel replicas
// hold identical state and only data-parallel rank 0 of each model-parallel
// rank saves, as in Megatron;
// the distributed optimizer's shards are gathered to it and saved as tensors
// dp_rank_RR.master / .exp_avg / .exp_avg_sq (SGD: .momentum_buffer) of the
// distrib_optim file. With expert parallelism the experts of each ep rank
// (with expert tensor parallelism, each etp rank's shard of them) are
// written by its expert-data-parallel rank 0 (their shards gathered over
// expt_dp as edp_rank_RR.*) and the dense parameters as above, each once:
// checkpoint_layout.h says which rank writes which file.
//
// Rank file, format version 1 (all integers little-endian):
//   0   char[8] magic "MTCKPT\0\0"
//   8   u32     format version (1)
//   12  u32     CRC32C of bytes [16, 64), then of the metadata, then of the table
//   16  u64     file size in bytes
//   24  u64     metadata offset (64)           32  u64  metadata size
//   40  u64     table offset (after metadata)  48  u64  table size
//   56  u64     tensor count
//   64  metadata: one UTF-8 JSON object (see CheckpointMeta), written as
//       {"format": "mt-checkpoint", "iteration": N, "consumed_train_samples": N,
//        "consumed_valid_samples": N, "model_fingerprint": "...",
//        "spec_toml": "...", "rng_state": [u64, ...], "loss_scale": X,
//        "loss_scale_growth_tracker": N, "loss_scale_hysteresis_tracker": N,
//        "tp_rank": N, "pp_rank": N, "pp_size": N, ["ep_rank": N, "ep_size": N,]
//        "values": {"k": "v", ...}}
//       (ep_rank and ep_size only in files of expert-parallel runs, ep_size > 1;
//       absent, they are 0 and 1)
//   table: per tensor, u16 name size, name (UTF-8), u8 dtype code
//       (1 f32, 2 bf16, 3 f16, 4 i32, 5 i64, 6 u64, 7 u8), u8 rank,
//       i64 dims[rank], u64 data offset, u64 data size, u32 CRC32C of the data
//   data: each tensor's bytes at a 64-byte aligned offset, zeros between; the
//       file ends with the last tensor's bytes.
// A load checks every number of the metadata against its range: iteration,
// consumed_*_samples, optimizer_steps and the like in [0, 10^15] (the most
// samples a spec can train), the loss-scale trackers in [0, 2^31 - 1]
// (hysteresis: [-2^31, 2^31 - 1]), the
// ranks in [0, 2^16), loss_scale finite and > 0; a value out of range names
// the file and the field.
// CRC32C is the Castagnoli CRC (iSCSI, ext4): init and final xor 0xFFFFFFFF.
// tools/mt_checkpoint.py reads the same format with numpy.
#ifndef MT_RUNTIME_CHECKPOINT_H
#define MT_RUNTIME_CHECKPOINT_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

// One tensor to save. dtype is "f32", "bf16", "f16", "i32", "i64", "u64" or
// "u8"; bytes must equal the product of shape times the element size.
struct CheckpointTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void *data = nullptr;
  size_t bytes = 0;
};

// The largest iteration or sample count a checkpoint may record (10^15, the
// spec's limit on sample counts).
inline constexpr int64_t kMaxCheckpointCount = 1000000000000000;

// Everything besides tensors that an exact resume needs.
struct CheckpointMeta {
  int64_t iteration = 0;
  // Also the data position: like Megatron's samplers, the loader resumes at
  // sample consumed_train_samples of the (seeded, deterministic) sample order.
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  std::string spec_toml;           // the spec the run was compiled from, verbatim
  std::string model_fingerprint;   // the caller's identity of the model's shapes
  // Opaque to the checkpoint; mtrun writes [seed, iterations of dropout
  // drawn since seeding], or none with --no-save-rng.
  std::vector<uint64_t> rng_state;
  // Dynamic loss scaling, as Megatron's DynamicGradScaler keeps it.
  double loss_scale = 1.0;
  int64_t loss_scale_growth_tracker = 0;
  int64_t loss_scale_hysteresis_tracker = 0;
  // Anything else, free-form; mtrun writes optimizer_steps,
  // skipped_iterations, and train_order_hash (16 hex digits: the sample
  // order it trained in, GptDataset::order_hash) with train_index_samples;
  // "no_save_optim" and "no_save_rng" ("true") when --no-save-optim left the
  // optimizer's state out (its tensors, optimizer_steps, the distrib_optim
  // file) or --no-save-rng the random state, as Megatron's checkpoint args.
  std::map<std::string, std::string> values;
};

// Saves SAVE/iter_XXXXXXX/<rank file> and then points the tracker at it.
// Order: a directory SAVE/.tmp.iter_XXXXXXX.?????? is made; the rank file is
// written into it and fsync'd; the directory is fsync'd and renamed to
// iter_XXXXXXX; SAVE is fsync'd; only then is the tracker replaced (write a
// temporary, fsync, rename, fsync SAVE). A crash at any point leaves the
// previous checkpoint as the latest and intact. An existing iter_XXXXXXX is
// replaced by exchanging the two directories in one rename (RENAME_EXCHANGE),
// so the name never points at nothing; on a file system that cannot exchange,
// the save is refused rather than leave a moment without the old checkpoint.
// This is one process's save of one rank file (runtime/ckpt/checkpoint_layout.h
// has the collective save of a whole layout); one save at a time may write
// into SAVE. Returns "" or one error line.
// `distrib_optim`, when given, is written beside the rank file as
// <rank>.distrib_optim.mtckpt (same format and metadata), in the same atomic
// save: the distributed optimizer's state, gathered from every data-parallel
// rank as Megatron-LM gathers it into distrib_optim.pt.
std::string save_checkpoint(const std::string &save_dir, const CheckpointMeta &meta,
                            const std::vector<CheckpointTensor> &tensors, int tp_rank = 0,
                            int pp_rank = 0, int pp_size = 1,
                            const std::vector<CheckpointTensor> *distrib_optim = nullptr,
                            int ep_rank = 0, int ep_size = 1);

// The same save in steps, for a save that several processes share (the
// collective in checkpoint_layout.h): one process calls begin, which makes
// SAVE, deletes leftovers of interrupted saves and creates the staging
// directory SAVE/.tmp.iter_XXXXXXX.??????; every saving process writes its
// rank's file(s) into it (each fsync'd); once all have, one process calls
// commit, which checks that `files` are all there, then renames and updates
// the tracker exactly as save_checkpoint does. On any failure before commit,
// abort deletes the staging directory. Each returns "" or one error line.
std::string begin_checkpoint_save(const std::string &save_dir, int64_t iteration,
                                  std::string *staging);
std::string write_checkpoint_files(const std::string &staging, const CheckpointMeta &meta,
                                   const std::vector<CheckpointTensor> &tensors, int tp_rank,
                                   int pp_rank, int pp_size,
                                   const std::vector<CheckpointTensor> *distrib_optim = nullptr,
                                   int ep_rank = 0, int ep_size = 1);
std::string commit_checkpoint_save(const std::string &save_dir, int64_t iteration,
                                   const std::string &staging,
                                   const std::vector<std::string> &files);
void abort_checkpoint_save(const std::string &staging);

// True when LOAD has a tracker file: whether a run resumes or starts fresh.
bool checkpoint_exists(const std::string &load_dir);

// What of a checkpoint LOAD holds besides the tracker, sorted: its
// iter_XXXXXXX directories and any rank files (*.mtckpt) directly in it
// (LOAD is then an iteration's directory). Empty when LOAD does not exist.
std::vector<std::string> checkpoint_contents(const std::string &load_dir);

// "mp_rank_00" (pp_size 1) or "mp_rank_00_000", as Megatron names ranks;
// with ep_size > 1 the expert-parallel rank follows: "mp_rank_00_001" (pp 1)
// or "mp_rank_00_000_001".
std::string checkpoint_rank_name(int tp_rank, int pp_rank, int pp_size, int ep_rank = 0,
                                 int ep_size = 1);
// The rank's file in iter_XXXXXXX: "mp_rank_00.mtckpt" or, for the
// distributed optimizer's state, "mp_rank_00.distrib_optim.mtckpt".
std::string checkpoint_file_name(int tp_rank, int pp_rank, int pp_size, bool distrib_optim,
                                 int ep_rank = 0, int ep_size = 1);

// A validated rank file, mapped read-only.
class CheckpointReader {
public:
  // Reads the tracker (iteration -1) or opens iter_XXXXXXX for the given
  // iteration, then validates magic, version, sizes, the table's bounds and
  // every checksum before returning. On any problem returns null and sets
  // *error to one line naming the file, what is wrong and what to do.
  // With `distrib_optim`, opens the rank's distributed-optimizer file instead.
  // ep_rank / ep_size: the expert-parallel rank's file (ep_size > 1).
  static std::unique_ptr<CheckpointReader> open(const std::string &load_dir, int64_t iteration,
                                                int tp_rank, int pp_rank, int pp_size,
                                                std::string *error, bool distrib_optim = false,
                                                int ep_rank = 0, int ep_size = 1);
  // The first model-parallel rank's file (mp_rank_00, mp_rank_00_000 or
  // mp_rank_00_000_000), whatever layout saved it: where a loader reads the
  // saved layout.
  static std::unique_ptr<CheckpointReader> open_first(const std::string &load_dir,
                                                      int64_t iteration, std::string *error);
  ~CheckpointReader();

  const CheckpointMeta &meta() const;
  const std::string &path() const;               // the rank file
  int tp_rank() const;                           // the rank that saved it
  int pp_rank() const;
  int pp_size() const;
  int ep_rank() const;                           // 0 and 1 when saved without ep
  int ep_size() const;
  std::vector<std::string> tensor_names() const; // in file order
  bool has(const std::string &name) const;
  // The tensor's shape (empty when there is no such tensor).
  std::vector<int64_t> shape(const std::string &name) const;
  // Its dtype ("f32", ...) and size in bytes ("" and 0 when there is none).
  std::string dtype(const std::string &name) const;
  uint64_t bytes(const std::string &name) const;
  // The metadata value KEY (meta().values) as a decimal integer in [lo, hi],
  // or dflt when the file has none. Returns "" or one error line naming the
  // file and the field.
  std::string int_value(const std::string &key, int64_t lo, int64_t hi, int64_t dflt,
                        int64_t *out) const;
  // Copies tensor NAME into dst after checking that its dtype and shape are
  // the expected ones and that bytes fits them. Returns "" or one error line.
  std::string read(const std::string &name, const std::string &dtype,
                   const std::vector<int64_t> &shape, void *dst, size_t bytes) const;

  struct Impl;

private:
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// For crash tests: save_checkpoint calls the hook before each step that
// changes the disk (step names: "mkdir", "write", "fsync", "rename", "tracker",
// "cleanup"), so a test can kill the process there. Null (the default) is off.
void set_checkpoint_step_hook(void (*hook)(const char *step));

} // namespace mt::rt

#endif // MT_RUNTIME_CHECKPOINT_H
