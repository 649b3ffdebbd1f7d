// mt-data-parallel's errors.
// RUN: mtc-opt %s -mt-data-parallel -split-input-file -verify-diagnostics

// expected-error @below {{mt-data-parallel: the module has no @grad_norm; run mt-optimizer first}}
module attributes {mt.parallel = {data_parallel_size = 2 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = false}} {
}

// -----

// expected-error @below {{mt-data-parallel: mt.parallel.data_parallel_size must be >= 1}}
module attributes {mt.parallel = {data_parallel_size = 0 : i64}} {
}
