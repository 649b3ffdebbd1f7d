// mt-optimizer's errors.
// RUN: mtc-opt %s -mt-optimizer -split-input-file -verify-diagnostics

// expected-error @below {{mt-optimizer: the module has no mt.training settings (mtc's importer writes them)}}
module {
}

// -----

// expected-error @below {{mt-optimizer: mt.training.adam_eps is missing}}
module attributes {mt.training = {lr = 6.0e-04 : f64, min_lr = 6.0e-05 : f64, lr_decay_style = "cosine", lr_warmup_iters = 20 : i64, lr_decay_iters = 200 : i64, weight_decay = 1.0e-01 : f64, adam_beta1 = 9.0e-01 : f64, adam_beta2 = 9.5e-01 : f64, clip_grad = 1.0 : f64}} {
}

// -----

// expected-error @below {{mt-optimizer: mt.training.lr_decay_style is missing or unknown}}
module attributes {mt.training = {lr = 6.0e-04 : f64, min_lr = 6.0e-05 : f64, lr_decay_style = "step", lr_warmup_iters = 20 : i64, lr_decay_iters = 200 : i64, weight_decay = 1.0e-01 : f64, adam_beta1 = 9.0e-01 : f64, adam_beta2 = 9.5e-01 : f64, adam_eps = 1.0e-08 : f64, clip_grad = 1.0 : f64}} {
}

// -----

// expected-error @below {{mt-optimizer: the wsd schedule needs mt.training.lr_wsd_decay_style (exponential, linear, cosine or minus_sqrt)}}
module attributes {mt.training = {lr = 6.0e-04 : f64, min_lr = 6.0e-05 : f64, lr_decay_style = "wsd", lr_wsd_decay_iters = 20 : i64, lr_warmup_iters = 20 : i64, lr_decay_iters = 200 : i64, weight_decay = 1.0e-01 : f64, adam_beta1 = 9.0e-01 : f64, adam_beta2 = 9.5e-01 : f64, adam_eps = 1.0e-08 : f64, clip_grad = 1.0 : f64}} {
}
