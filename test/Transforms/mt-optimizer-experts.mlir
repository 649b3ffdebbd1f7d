// mt-optimizer with sequence parallelism and experts: @grad_norm sums the
// partial gradients of parameters read on sequence shards over tp, but not
// an expert parameter's (mt.expert): mt-data-parallel sums those over
// expt_dp, whose ranks include the tensor-parallel ones holding the same
// experts (and a tensor-parallel peer holding other experts must not add in).
// RUN: mtc-opt %s -mt-optimizer | FileCheck %s

module attributes {mt.training = {lr = 6.0e-04 : f64, min_lr = 6.0e-05 : f64, lr_decay_style = "cosine", lr_warmup_iters = 20 : i64, lr_decay_iters = 200 : i64, weight_decay = 1.0e-01 : f64, adam_beta1 = 9.0e-01 : f64, adam_beta2 = 9.5e-01 : f64, adam_eps = 1.0e-08 : f64, clip_grad = 1.0 : f64}} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02) {mt.tp_partial_grad}
  mt.param @fc1 : tensor<2x16x8xf32>, normal(2.000000e-02) {mt.expert, mt.tp_partial_grad}
  mt.param @ln : tensor<8xf32>, ones {mt.tp_partial_grad}
}

// CHECK-LABEL: func.func @grad_norm() -> tensor<f32>
// CHECK-NEXT:    mt.all_reduce_grads {group = "tp", params = [@router, @ln], scale = 1.000000e+00 : f64}
// CHECK-NEXT:    mt.grad_norm
// CHECK-LABEL: func.func @optimizer_step(
// CHECK:         mt.adamw @fc1
