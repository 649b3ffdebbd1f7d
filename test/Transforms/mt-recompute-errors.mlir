// mt-recompute's errors, one per case.
// RUN: mtc-opt %s -mt-recompute -split-input-file -verify-diagnostics

// expected-error @below {{mt-recompute: the module has no mt.training settings (mtc's importer writes them)}}
module {
}

// -----

// expected-error @below {{mt-recompute: mt.training.recompute_granularity is missing}}
module attributes {mt.training = {num_micro_batches = 1 : i64}} {
}

// -----

// expected-error @below {{mt-recompute: mt.training.recompute_granularity is "layers"; expected "none", "selective" or "full"}}
module attributes {mt.training = {recompute_granularity = "layers", recompute_method = "none", recompute_num_layers = 0 : i64}} {
}

// -----

// expected-error @below {{mt-recompute: mt.training.recompute_method is "even"; expected "none", "uniform" or "block"}}
module attributes {mt.training = {recompute_granularity = "full", recompute_method = "even", recompute_num_layers = 1 : i64}} {
}

// -----

// expected-error @below {{mt-recompute: recompute_granularity "full" needs recompute_method "uniform" or "block", got "none"}}
module attributes {mt.training = {recompute_granularity = "full", recompute_method = "none", recompute_num_layers = 1 : i64}} {
}

// -----

// expected-error @below {{mt-recompute: mt.training.recompute_method is missing}}
module attributes {mt.training = {recompute_granularity = "full", recompute_num_layers = 1 : i64}} {
}

// -----

// expected-error @below {{mt-recompute: recompute_method "uniform" needs recompute_granularity "full", got "selective"}}
module attributes {mt.training = {recompute_granularity = "selective", recompute_method = "uniform", recompute_num_layers = 1 : i64}} {
}

// -----

// expected-error @below {{mt-recompute: recompute_num_layers is 0; recompute_granularity "full" needs at least 1}}
module attributes {mt.training = {recompute_granularity = "full", recompute_method = "uniform", recompute_num_layers = 0 : i64}} {
}

// -----

// expected-error @below {{mt-recompute: the module has no func.func @train_step (mt-autodiff builds it; run it first)}}
module attributes {mt.training = {recompute_granularity = "full", recompute_method = "uniform", recompute_num_layers = 1 : i64}} {
  func.func @forward(%x: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
    return %x : tensor<2x4x8xf32>
  }
}

// -----

module attributes {mt.training = {recompute_granularity = "full", recompute_method = "block", recompute_num_layers = 1 : i64}} {
  // expected-error @below {{mt-recompute: @train_step has no mt.grad_seed, so its backward part cannot be told from its forward}}
  func.func @train_step(%x: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
    %0 = mt.gelu %x tanh {mt.layer = 0 : i64} : tensor<2x4x8xf32>
    return %0 : tensor<2x4x8xf32>
  }
}

// -----

module attributes {mt.training = {recompute_granularity = "full", recompute_method = "block", recompute_num_layers = 3 : i64}} {
  // expected-error @below {{mt-recompute: recompute_num_layers is 3 but @train_step has 2 layers (ops with mt.layer before mt.grad_seed)}}
  func.func @train_step(%x: tensor<2x4x8xf32>) -> tensor<f32> {
    %0 = mt.gelu %x tanh {mt.layer = 0 : i64} : tensor<2x4x8xf32>
    %1 = mt.gelu %0 tanh {mt.layer = 1 : i64} : tensor<2x4x8xf32>
    %seed = mt.grad_seed {scale = 1.000000e+00 : f64} : tensor<f32>
    return %seed : tensor<f32>
  }
}

// -----

module attributes {mt.training = {recompute_granularity = "full", recompute_method = "uniform", recompute_num_layers = 2 : i64}} {
  // expected-error @below {{mt-recompute: recompute_num_layers = 2 does not divide the 3 layers of @train_step (recompute_method "uniform")}}
  func.func @train_step(%x: tensor<2x4x8xf32>) -> tensor<f32> {
    %0 = mt.gelu %x tanh {mt.layer = 0 : i64} : tensor<2x4x8xf32>
    %1 = mt.gelu %0 tanh {mt.layer = 1 : i64} : tensor<2x4x8xf32>
    %2 = mt.gelu %1 tanh {mt.layer = 2 : i64} : tensor<2x4x8xf32>
    %seed = mt.grad_seed {scale = 1.000000e+00 : f64} : tensor<f32>
    return %seed : tensor<f32>
  }
}
