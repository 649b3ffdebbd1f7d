// mt-data-parallel: with plain data parallelism, @grad_norm starts with the
// gradient all-reduce over the dp group, scaled by 1/dp; otherwise nothing.
// RUN: mtc-opt %s -split-input-file -mt-data-parallel | FileCheck %s

// CHECK-LABEL: module attributes
// CHECK-SAME: mt.data_parallel = 4 : i64
// CHECK: func.func @grad_norm() -> tensor<f32> {
// CHECK-NEXT: mt.all_reduce_grads {group = "dp", scale = 2.500000e-01 : f64}
// CHECK-NEXT: mt.grad_norm
module attributes {mt.parallel = {data_parallel_size = 4 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = false}} {
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// One rank: nothing to reduce.
// CHECK-LABEL: module attributes
// CHECK-NOT: mt.data_parallel
// CHECK-NOT: mt.all_reduce_grads
module attributes {mt.parallel = {data_parallel_size = 1 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = false}} {
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// The distributed optimizer shards gradients first: left to the sharding
// passes, so the plan stays a one-rank program for now.
// CHECK-LABEL: module attributes
// CHECK-NOT: mt.all_reduce_grads
module attributes {mt.parallel = {data_parallel_size = 4 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = true}} {
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}
