// mt-plan-memory with mixture-of-experts values: a stacked expert weight
// [E, out, in] takes its element count in every state region (4 x 32 x 8 f32 =
// 4096 B of weights, gradients and each Adam moment), and the permutation's
// i32 results take arena bytes like any value. The dispatched rows are
// sized statically (T * topk rows without capacity), so the arena is exact
// for every routing.
// RUN: mtc-opt %s -mt-plan-memory | FileCheck %s

// CHECK: module attributes {mt.arena_bytes = 2816 : i64, mt.memory = {activations = 2816 : i64, grads = 4096 : i64, master_weights = 0 : i64, optimizer_moments = 8192 : i64, weights = 4096 : i64}, mt.state_bytes = 16384 : i64}
// CHECK: mt.param @fc1 : tensor<4x32x8xf32>, normal(2.000000e-02) {mt.exp_avg_offset = 8192 : i64, mt.exp_avg_sq_offset = 12288 : i64, mt.grad_offset = 4096 : i64, mt.master_offset = -1 : i64, mt.weight_offset = 0 : i64}
// x [8, 8] f32 at 0 and the routing map [8, 4] i32 at 256 (256-byte
// aligned); the rows [16, 8] f32 (512 B), row ids [16] i32 and counts [4] i32
// after them; the product [16, 32] f32 (2048 B) reuses the bytes of what
// died at the permutation (x, the map, the row ids), never the rows or counts
// it reads.
// CHECK: func.func @f(%{{.*}}: tensor<8x8xf32> {mt.offset = 0 : i64}, %{{.*}}: tensor<8x4xi32> {mt.offset = 256 : i64})
// CHECK: mt.moe_permute {{.*}}mt.offsets = array<i64: 2048, 512, 2560>
// CHECK: mt.moe_grouped_matmul {{.*}}mt.offsets = array<i64: 0>
mt.param @fc1 : tensor<4x32x8xf32>, normal(2.000000e-02)
func.func @f(%x: tensor<8x8xf32>, %m: tensor<8x4xi32>) -> tensor<16x32xf32> {
  %y, %rows, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
  %w1 = mt.param_ref @fc1 : tensor<4x32x8xf32>
  %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<16x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<16x32xf32>
  return %h : tensor<16x32xf32>
}
