// mt-data-parallel's errors.
// RUN: mtc-opt %s -mt-data-parallel -split-input-file -verify-diagnostics

// expected-error @below {{mt-data-parallel: the module has no @grad_norm or @optimizer_step; run mt-optimizer first}}
module attributes {mt.parallel = {data_parallel_size = 2 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = false}} {
}

// -----

// expected-error @below {{mt-data-parallel: mt.parallel.data_parallel_size must be >= 1}}
module attributes {mt.parallel = {data_parallel_size = 0 : i64}} {
}

// -----

// expected-error @below {{mt-data-parallel: overlap_grad_reduce needs @train_step; run mt-autodiff first}}
module attributes {mt.parallel = {data_parallel_size = 2 : i64, overlap_grad_reduce = true}} {
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

module attributes {mt.parallel = {data_parallel_size = 2 : i64, use_distributed_optimizer = true}} {
  mt.param @a : tensor<4x4xf32>, zeros
  mt.param @b : tensor<4x4xf32>, zeros
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%lr: tensor<f32>, %lr2: tensor<f32>, %clip: tensor<f32>, %step: tensor<i64>) {
    mt.adamw @a, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    // expected-error @below {{mt-data-parallel: the distributed optimizer needs every mt.adamw to share lr, clip, step, betas and epsilon, and a weight decay of 0 or 1.000000e-01}}
    mt.adamw @b, %lr2, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    return
  }
}

// -----

// expected-error @below {{mt-data-parallel: overlap_param_gather needs use_distributed_optimizer and overlap_grad_reduce}}
module attributes {mt.parallel = {data_parallel_size = 2 : i64, overlap_grad_reduce = true, overlap_param_gather = true}} {
}

// -----

// expected-error @below {{mt-data-parallel: expert_tensor_parallel_size (1) times expert_model_parallel_size (4) must divide tensor_model_parallel_size (1) times data_parallel_size (2)}}
module attributes {mt.parallel = {data_parallel_size = 2 : i64, tensor_model_parallel_size = 1 : i64, expert_model_parallel_size = 4 : i64, expert_tensor_parallel_size = 1 : i64}} {
  mt.param @experts : tensor<1x4x4xf32>, zeros {mt.expert}
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}
