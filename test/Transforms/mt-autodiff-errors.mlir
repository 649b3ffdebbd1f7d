// mt-autodiff's errors, one per case.
// RUN: mtc-opt %s -mt-autodiff -split-input-file -verify-diagnostics

// expected-error @below {{mt-autodiff: the module has no func.func @forward}}
module {
}

// -----

module {
  func.func @forward(%x: tensor<2x4x8xf32>, %w: tensor<16x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
    // expected-error @below {{cannot differentiate: its weight is not read from an mt.param}}
    %h = mt.matmul %x, %w : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
    %loss = mt.cross_entropy %h, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// expected-error @below {{mt-autodiff: mt.training.num_micro_batches must be >= 1}}
module attributes {mt.training = {num_micro_batches = 0 : i64}} {
  func.func @forward(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
    %loss = mt.cross_entropy %x, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// expected-error @below {{mt-autodiff: per-token loss: 2 micro-batches of 64 tokens on 2 data-parallel ranks are not the iteration's 300 tokens}}
module attributes {mt.training = {num_micro_batches = 2 : i64, loss_tokens_per_micro_batch = 64 : i64, loss_tokens_per_iteration = 300 : i64}, mt.parallel = {data_parallel_size = 2 : i64}} {
  func.func @forward(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
    %loss = mt.cross_entropy %x, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// expected-error @below {{mt-autodiff: per-token loss needs both mt.training.loss_tokens_per_micro_batch and loss_tokens_per_iteration, each >= 1}}
module attributes {mt.training = {num_micro_batches = 1 : i64, loss_tokens_per_micro_batch = 64 : i64}} {
  func.func @forward(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
    %loss = mt.cross_entropy %x, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

module {
  // expected-error @below {{mt-autodiff: @forward must return exactly one loss (its other results are named with mt.name)}}
  func.func @forward(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> (tensor<f32>, tensor<f32>) {
    %loss = mt.cross_entropy %x, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss, %loss : tensor<f32>, tensor<f32>
  }
}

// -----

module {
  // expected-error @below {{mt-autodiff: @forward's named result #1 must be an f32 scalar, got 'tensor<2x4x8xf32>'}}
  func.func @forward(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> (tensor<f32>, tensor<2x4x8xf32> {mt.name = "x"}) {
    %loss = mt.cross_entropy %x, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss, %x : tensor<f32>, tensor<2x4x8xf32>
  }
}

// -----

module {
  // expected-error @below {{mt-autodiff: @forward must return exactly one loss (its other results are named with mt.name)}}
  func.func @forward(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) {
    return
  }
}
