// mt-optimizer: the warmup-stable-decay schedule carries its anneal, and
// inverse-square-root the samples a step (Megatron counts samples).
// RUN: mtc-opt %s -split-input-file -mt-optimizer | FileCheck %s

// CHECK-LABEL: func.func @optimizer_step(
// CHECK:         mt.lr_schedule %{{.*}} wsd anneal minus_sqrt {decay_iters = 200 : i64, lr = 6.000000e-04 : f64, min_lr = 6.000000e-05 : f64, warmup_iters = 20 : i64, wsd_decay_iters = 40 : i64}
// CHECK:         mt.lr_schedule %{{.*}} wsd anneal minus_sqrt {{.*}}wsd_decay_iters = 40 : i64}
module attributes {mt.training = {lr = 6.0e-04 : f64, min_lr = 6.0e-05 : f64, lr_decay_style = "wsd", lr_wsd_decay_style = "minus_sqrt", lr_wsd_decay_iters = 40 : i64, global_batch_size = 512 : i64, lr_warmup_iters = 20 : i64, lr_decay_iters = 200 : i64, weight_decay = 1.0e-01 : f64, adam_beta1 = 9.0e-01 : f64, adam_beta2 = 9.5e-01 : f64, adam_eps = 1.0e-08 : f64, clip_grad = 1.0 : f64}} {
  mt.param @fc.weight : tensor<16x8xf32>, normal(2.000000e-02)
}

// -----

// CHECK-LABEL: func.func @optimizer_step(
// CHECK:         mt.lr_schedule %{{.*}} inverse_square_root {decay_iters = 200 : i64, lr = 6.000000e-04 : f64, min_lr = 6.000000e-05 : f64, samples_per_step = 512 : i64, warmup_iters = 0 : i64}
module attributes {mt.training = {lr = 6.0e-04 : f64, min_lr = 6.0e-05 : f64, lr_decay_style = "inverse_square_root", lr_wsd_decay_style = "exponential", lr_wsd_decay_iters = 0 : i64, global_batch_size = 512 : i64, lr_warmup_iters = 0 : i64, lr_decay_iters = 200 : i64, weight_decay = 1.0e-01 : f64, adam_beta1 = 9.0e-01 : f64, adam_beta2 = 9.5e-01 : f64, adam_eps = 1.0e-08 : f64, clip_grad = 1.0 : f64}} {
  mt.param @fc.weight : tensor<16x8xf32>, normal(2.000000e-02)
}
