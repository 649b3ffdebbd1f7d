// mt-plan-memory's flat buffers with expert buckets: each bucket padded to a
// multiple of its group's size times 64 elements (256 bytes of f32), so it
// splits into that many equal aligned shards; with the distributed optimizer
// each bucket's shard sits at its shard_offset in the shard state, in the
// flat buffers' order (the last bucket first).
// RUN: mtc-opt %s -split-input-file -mt-plan-memory | FileCheck %s --enable-var-scope

// dp 2, edp 4 (tp 2 x dp 2, ep 1). Bucket 1 (@fc1, 640 elements) is laid out
// first, padded to 768 (a multiple of 4 x 64): shards of 192 at 0. Bucket 0
// (@router, 32) follows at 768, padded to 128 (2 x 64): shards of 64 at 192.
// The shard state holds 256 elements (1024 bytes) per array.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.flat_elements = 896 : i64
// CHECK-SAME: mt.grad_buckets = [{begin = 768 : i64, end = 896 : i64, group = "dp", params = [@router], shard_offset = 192 : i64}, {begin = 0 : i64, end = 768 : i64, group = "expt_dp", params = [@fc1], shard_offset = 0 : i64}]
// CHECK-SAME: mt.memory = {activations = 0 : i64, grads = 3584 : i64, master_weights = 0 : i64, optimizer_moments = 2048 : i64, weights = 3584 : i64}
// CHECK-SAME: mt.shard_state = {elements = 256 : i64, exp_avg_offset = 7168 : i64, exp_avg_sq_offset = 8192 : i64, master_offset = -1 : i64}
// CHECK: mt.param @router {{.*}}mt.flat_offset = 768 : i64
// CHECK: mt.param @fc1 {{.*}}mt.flat_offset = 0 : i64
module attributes {mt.data_parallel = 2 : i64, mt.expert_data_parallel = 4 : i64, mt.distributed_optimizer, mt.grad_buckets = [{group = "dp", params = [@router]}, {group = "expt_dp", params = [@fc1]}]} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<4x20x8xf32>, normal(2.000000e-02) {mt.expert}
}

// -----

// dp 2, edp 1 (dp 2 x ep 2) without the distributed optimizer: the expert
// bucket is padded to a multiple of 64 only; no shard state.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.flat_elements = 448 : i64
// CHECK-SAME: mt.grad_buckets = [{begin = 320 : i64, end = 448 : i64, group = "dp", params = [@router]}, {begin = 0 : i64, end = 320 : i64, group = "expt_dp", params = [@fc1]}]
// CHECK-NOT: mt.shard_state
module attributes {mt.data_parallel = 2 : i64, mt.expert_data_parallel = 1 : i64, mt.grad_buckets = [{group = "dp", params = [@router]}, {group = "expt_dp", params = [@fc1]}]} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<2x20x8xf32>, normal(2.000000e-02) {mt.expert}
}
