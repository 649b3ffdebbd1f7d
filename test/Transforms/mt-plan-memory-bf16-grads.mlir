// mt-plan-memory with grad_reduce_in_bf16 (Megatron's --grad-reduce-in-bf16):
// the gradients take the parameters' bf16, 2 bytes an element, and each
// parameter says so with mt.grad_dtype; an f32 parameter is an error.
// RUN: mtc-opt %s -split-input-file -verify-diagnostics -mt-plan-memory | FileCheck %s

// 16x8 bf16 = 256 B of weights and 256 B of gradients (f32 gradients: 512 B).
// CHECK-LABEL: module @bf16
// CHECK-SAME: mt.memory = {activations = 0 : i64, grads = 512 : i64, master_weights = 768 : i64, optimizer_moments = 1536 : i64, weights = 512 : i64}
// CHECK: mt.param @w : tensor<16x8xbf16>, normal(2.000000e-02) {mt.exp_avg_offset = 1792 : i64, mt.exp_avg_sq_offset = 2560 : i64, mt.grad_dtype = bf16, mt.grad_offset = 512 : i64, mt.master_offset = 1024 : i64, mt.weight_offset = 0 : i64}
// CHECK: mt.param @v : tensor<8xbf16>, ones {mt.exp_avg_offset = 2304 : i64, mt.exp_avg_sq_offset = 3072 : i64, mt.grad_dtype = bf16, mt.grad_offset = 768 : i64, mt.master_offset = 1536 : i64, mt.weight_offset = 256 : i64}
module @bf16 attributes {mt.training = {grad_reduce_in_bf16}} {
  mt.param @w : tensor<16x8xbf16>, normal(2.000000e-02)
  mt.param @v : tensor<8xbf16>, ones
}

// -----

module @mixed attributes {mt.training = {grad_reduce_in_bf16}} {
  mt.param @w : tensor<16x8xbf16>, normal(2.000000e-02)
  // expected-error @+1 {{mt-plan-memory: mt.training.grad_reduce_in_bf16 needs bf16 parameters, but this one is 'f32'}}
  mt.param @v : tensor<8xf32>, ones
}
