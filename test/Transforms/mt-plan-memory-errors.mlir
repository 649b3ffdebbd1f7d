// mt-plan-memory's errors.
// RUN: mtc-opt %s -mt-plan-memory -split-input-file -verify-diagnostics

// expected-error @below {{mt-plan-memory: mt.grad_buckets[1] is an expt_dp bucket, which needs mt.expert_data_parallel >= 1}}
module attributes {mt.data_parallel = 2 : i64, mt.grad_buckets = [{group = "dp", params = [@router]}, {group = "expt_dp", params = [@fc1]}]} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<2x20x8xf32>, normal(2.000000e-02) {mt.expert}
}

// -----

// expected-error @below {{mt-plan-memory: mt.grad_buckets[0] has group "tp"; expected "dp" or "expt_dp"}}
module attributes {mt.data_parallel = 2 : i64, mt.grad_buckets = [{group = "tp", params = [@router]}]} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
}
