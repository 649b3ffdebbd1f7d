// mt-optimizer: @grad_norm and @optimizer_step from the module's settings;
// no weight decay for biases and 1-D parameters.
// RUN: mtc-opt %s -mt-optimizer | FileCheck %s

module attributes {mt.training = {lr = 6.0e-04 : f64, min_lr = 6.0e-05 : f64, lr_decay_style = "cosine", lr_warmup_iters = 20 : i64, lr_decay_iters = 200 : i64, weight_decay = 1.0e-01 : f64, adam_beta1 = 9.0e-01 : f64, adam_beta2 = 9.5e-01 : f64, adam_eps = 1.0e-08 : f64, clip_grad = 1.0 : f64}} {
  mt.param @fc.weight : tensor<16x8xf32>, normal(2.000000e-02)
  mt.param @fc.bias : tensor<16xf32>, zeros
  mt.param @ln.weight : tensor<8xf32>, ones
}

// CHECK-LABEL: func.func @grad_norm() -> tensor<f32>
// CHECK-NEXT:    %[[N:.*]] = mt.grad_norm : tensor<f32>
// CHECK-NEXT:    return %[[N]]
// CHECK-LABEL: func.func @optimizer_step(
// CHECK-SAME:      %[[STEPS:.*]]: tensor<i64> {mt.name = "steps"}, %[[STEP:.*]]: tensor<i64> {mt.name = "step"}, %[[NORM:.*]]: tensor<f32> {mt.name = "grad_norm"}, %[[SCALE:.*]]: tensor<f32> {mt.name = "grad_scale"}) -> (tensor<f32>, tensor<f32>)
// CHECK-NEXT:    %[[LR:.*]] = mt.lr_schedule %[[STEPS]] cosine {decay_iters = 200 : i64, lr = 6.000000e-04 : f64, min_lr = 6.000000e-05 : f64, warmup_iters = 20 : i64}
// CHECK-NEXT:    %[[C:.*]] = mt.clip_coeff %[[NORM]], %[[SCALE]] {max_norm = 1.000000e+00 : f64}
// CHECK-NEXT:    mt.adamw @fc.weight, %[[LR]], %[[C]], %[[STEP]] {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64}
// CHECK-NEXT:    mt.adamw @fc.bias, %[[LR]], %[[C]], %[[STEP]] {{{.*}}weight_decay = 0.000000e+00 : f64}
// CHECK-NEXT:    mt.adamw @ln.weight, %[[LR]], %[[C]], %[[STEP]] {{{.*}}weight_decay = 0.000000e+00 : f64}
// CHECK-NEXT:    %[[NEXT:.*]] = mt.lr_schedule %[[STEP]] cosine {decay_iters = 200 : i64, lr = 6.000000e-04 : f64, min_lr = 6.000000e-05 : f64, warmup_iters = 20 : i64}
// CHECK-NEXT:    return %[[LR]], %[[NEXT]] : tensor<f32>, tensor<f32>
