// mt-fuse: RoPE into the QKV split and out of its gradient first; GEMMs
// with their epilogues (bias, bias + tanh GeLU) next, as gemm kernels, and backward GEMMs with theirs (DGELU, DGELU_BGRAD, BGRADB)
// as gemm_grad kernels; then maximal chains of adjacent fusible ops, each
// op's result read by the next (an intermediate read after the chain too is
// one more output), become mt.fused kernels at the position of their last
// op. A second run changes nothing.
// RUN: mtc-opt %s -split-input-file -mt-fuse | FileCheck %s
// RUN: mtc-opt %s -split-input-file -mt-fuse -mt-fuse | FileCheck %s

// The bias add goes into the GEMM's epilogue (a gemm kernel); dropout and
// the residual add become one kernel, named after its layer, reading the
// gemm kernel's result.
// CHECK-LABEL: func.func @epilogue_bias(
// CHECK-SAME:      %[[X:.*]]: tensor<2x4x16xf32>, %[[RES:.*]]: tensor<2x4x16xf32>)
// CHECK:         %[[W:.*]] = mt.param_ref @l0.proj.weight
// CHECK-NEXT:    %[[B:.*]] = mt.param_ref @l0.proj.bias
// CHECK-NEXT:    %[[YB:.*]] = mt.fused gemm "decoder.layers.0 matmul+bias_add" (%[[GX:.*]] = %[[X]], %[[GW:.*]] = %[[W]], %[[GB:.*]] = %[[B]]) : (tensor<2x4x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<2x4x16xf32> attributes {mt.layer = 0 : i64} {
// CHECK-NEXT:      %[[M:.*]] = mt.matmul %[[GX]], %[[GW]] {mt.layer = 0 : i64}
// CHECK-NEXT:      %[[O:.*]] = mt.bias_add %[[M]], %[[GB]] {mt.layer = 0 : i64}
// CHECK-NEXT:      mt.yield %[[O]] : tensor<2x4x16xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[H:.*]] = mt.fused elementwise "decoder.layers.0 dropout+add" (%[[A:.*]] = %[[YB]], %[[R:.*]] = %[[RES]]) : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32> attributes {mt.layer = 0 : i64} {
// CHECK-NEXT:      %[[D:.*]] = mt.dropout %[[A]] {mt.layer = 0 : i64, rate = 1.000000e-01 : f64, stream = 2 : i64}
// CHECK-NEXT:      %[[S:.*]] = mt.add %[[R]], %[[D]] {mt.layer = 0 : i64}
// CHECK-NEXT:      mt.yield %[[S]] : tensor<2x4x16xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[H]]
mt.param @l0.proj.weight : tensor<16x16xf32>, normal(2.000000e-02)
mt.param @l0.proj.bias : tensor<16xf32>, zeros
func.func @epilogue_bias(%x: tensor<2x4x16xf32>, %res: tensor<2x4x16xf32>) -> tensor<2x4x16xf32> {
  %w = mt.param_ref @l0.proj.weight : tensor<16x16xf32>
  %y = mt.matmul %x, %w {mt.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %b = mt.param_ref @l0.proj.bias : tensor<16xf32>
  %yb = mt.bias_add %y, %b {mt.layer = 0 : i64} : tensor<2x4x16xf32>, tensor<16xf32>
  %d = mt.dropout %yb {mt.layer = 0 : i64, rate = 0.1 : f64, stream = 2 : i64} : tensor<2x4x16xf32>
  %h = mt.add %res, %d {mt.layer = 0 : i64} : tensor<2x4x16xf32>
  return %h : tensor<2x4x16xf32>
}

// -----

// A tanh GeLU after the bias add joins the epilogue; the bias add's result
// is also a result of the kernel (cuBLASLt's aux output), the
// pre-activation the backward's gelu_grad reads. The dropout after the gelu
// is left alone (a chain of one).
// CHECK-LABEL: func.func @epilogue_bias_gelu(
// CHECK:         %[[K:.*]]:2 = mt.fused gemm "matmul+bias_add+gelu"
// CHECK-NEXT:      %[[M:.*]] = mt.matmul
// CHECK-NEXT:      %[[YB:.*]] = mt.bias_add %[[M]]
// CHECK-NEXT:      %[[G:.*]] = mt.gelu %[[YB]] tanh
// CHECK-NEXT:      mt.yield %[[YB]], %[[G]]
// CHECK-NEXT:    }
// CHECK-NEXT:    mt.dropout %[[K]]#1
// CHECK-NEXT:    mt.gelu_grad %{{.*}}, %[[K]]#0 tanh
// CHECK-NOT:     mt.fused
mt.param @l0.fc1.weight : tensor<32x16xf32>, normal(2.000000e-02)
mt.param @l0.fc1.bias : tensor<32xf32>, zeros
func.func @epilogue_bias_gelu(%x: tensor<2x4x16xf32>, %dy: tensor<2x4x32xf32>) -> (tensor<2x4x32xf32>, tensor<2x4x32xf32>) {
  %w = mt.param_ref @l0.fc1.weight : tensor<32x16xf32>
  %y = mt.matmul %x, %w : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
  %b = mt.param_ref @l0.fc1.bias : tensor<32xf32>
  %yb = mt.bias_add %y, %b : tensor<2x4x32xf32>, tensor<32xf32>
  %g = mt.gelu %yb tanh : tensor<2x4x32xf32>
  %d = mt.dropout %g {rate = 0.1 : f64, stream = 3 : i64} : tensor<2x4x32xf32>
  %dg = mt.gelu_grad %dy, %yb tanh : tensor<2x4x32xf32>
  return %d, %dg : tensor<2x4x32xf32>, tensor<2x4x32xf32>
}

// -----

// With 36 features the aux output's leading dimension is no multiple of 8,
// which cuBLASLt's GELU_AUX_BIAS refuses: the GeLU stays out of the GEMM
// (the bias still goes in) and fuses with the dropout.
// CHECK-LABEL: func.func @epilogue_aux_not_multiple_of_8(
// CHECK:         %[[YB:.*]] = mt.fused gemm "matmul+bias_add"
// CHECK-NOT:       mt.gelu
// CHECK:         mt.fused elementwise "gelu+dropout" (%{{.*}} = %[[YB]])
// CHECK:         mt.gelu_grad %{{.*}}, %[[YB]] tanh
mt.param @l0.fc1.weight : tensor<36x16xf32>, normal(2.000000e-02)
mt.param @l0.fc1.bias : tensor<36xf32>, zeros
func.func @epilogue_aux_not_multiple_of_8(%x: tensor<2x4x16xf32>, %dy: tensor<2x4x36xf32>) -> (tensor<2x4x36xf32>, tensor<2x4x36xf32>) {
  %w = mt.param_ref @l0.fc1.weight : tensor<36x16xf32>
  %y = mt.matmul %x, %w : (tensor<2x4x16xf32>, tensor<36x16xf32>) -> tensor<2x4x36xf32>
  %b = mt.param_ref @l0.fc1.bias : tensor<36xf32>
  %yb = mt.bias_add %y, %b : tensor<2x4x36xf32>, tensor<36xf32>
  %g = mt.gelu %yb tanh : tensor<2x4x36xf32>
  %d = mt.dropout %g {rate = 0.1 : f64, stream = 3 : i64} : tensor<2x4x36xf32>
  %dg = mt.gelu_grad %dy, %yb tanh : tensor<2x4x36xf32>
  return %d, %dg : tensor<2x4x36xf32>, tensor<2x4x36xf32>
}

// -----

// cuBLASLt's GELU epilogue is the tanh form: an erf GeLU stays out of the
// GEMM and fuses with what follows it.
// CHECK-LABEL: func.func @erf_gelu(
// CHECK:         %[[YB:.*]] = mt.fused gemm "matmul+bias_add"
// CHECK-NOT:       mt.gelu
// CHECK:         mt.fused elementwise "gelu+dropout" (%[[A:.*]] = %[[YB]])
// CHECK-NEXT:      mt.gelu %[[A]] erf
// CHECK-NEXT:      mt.dropout
// CHECK-NEXT:      mt.yield
mt.param @l0.fc1.weight : tensor<32x16xf32>, normal(2.000000e-02)
mt.param @l0.fc1.bias : tensor<32xf32>, zeros
func.func @erf_gelu(%x: tensor<2x4x16xf32>) -> tensor<2x4x32xf32> {
  %w = mt.param_ref @l0.fc1.weight : tensor<32x16xf32>
  %y = mt.matmul %x, %w : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
  %b = mt.param_ref @l0.fc1.bias : tensor<32xf32>
  %yb = mt.bias_add %y, %b : tensor<2x4x32xf32>, tensor<32xf32>
  %g = mt.gelu %yb erf : tensor<2x4x32xf32>
  %d = mt.dropout %g {rate = 0.1 : f64, stream = 3 : i64} : tensor<2x4x32xf32>
  return %d : tensor<2x4x32xf32>
}

// -----

// A bias add whose input comes from no GEMM (after a collective, say) starts
// a chain: bias_add -> gelu -> dropout -> residual add is one kernel, and the
// bias parameter is one of its inputs.
// CHECK-LABEL: func.func @no_gemm_producer(
// CHECK-SAME:      %[[Y:[^:]*]]: tensor<2x4x32xf32>)
// CHECK-NEXT:    %[[B:.*]] = mt.param_ref @l3.fc1.bias
// CHECK-NEXT:    %[[R:.*]] = mt.fused elementwise "decoder.layers.3 bias_add+gelu+dropout+add" (%[[A0:.*]] = %[[Y]], %[[A1:.*]] = %[[B]]) : (tensor<2x4x32xf32>, tensor<32xf32>) -> tensor<2x4x32xf32> attributes {mt.layer = 3 : i64} {
// CHECK-NEXT:      %[[V0:.*]] = mt.bias_add %[[A0]], %[[A1]]
// CHECK-NEXT:      %[[V1:.*]] = mt.gelu %[[V0]] tanh
// CHECK-NEXT:      %[[V2:.*]] = mt.dropout %[[V1]]
// CHECK-NEXT:      %[[V3:.*]] = mt.add %[[V2]], %[[A0]]
// CHECK-NEXT:      mt.yield %[[V3]]
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[R]]
mt.param @l3.fc1.bias : tensor<32xf32>, zeros
func.func @no_gemm_producer(%y: tensor<2x4x32xf32>) -> tensor<2x4x32xf32> {
  %b = mt.param_ref @l3.fc1.bias : tensor<32xf32>
  %yb = mt.bias_add %y, %b {mt.layer = 3 : i64} : tensor<2x4x32xf32>, tensor<32xf32>
  %g = mt.gelu %yb tanh {mt.layer = 3 : i64} : tensor<2x4x32xf32>
  %d = mt.dropout %g {mt.layer = 3 : i64, rate = 0.1 : f64, stream = 3 : i64} : tensor<2x4x32xf32>
  %r = mt.add %d, %y {mt.layer = 3 : i64} : tensor<2x4x32xf32>
  return %r : tensor<2x4x32xf32>
}

// -----

// A GEMM result read twice gets no gemm kernel; its bias add fuses instead.
// Ops of different layers give a kernel name without a layer.
// CHECK-LABEL: func.func @matmul_used_twice(
// CHECK:         %[[Y:.*]] = mt.matmul
// CHECK-SAME:    -> tensor<2x4x32xf32>
// CHECK:         %[[G:.*]] = mt.fused elementwise "bias_add+gelu" (%{{.*}} = %[[Y]], %{{.*}} = %{{.*}})
// CHECK-NOT:     attributes
// CHECK-SAME:    {
// CHECK:         return %[[G]], %[[Y]]
mt.param @l0.fc1.weight : tensor<32x16xf32>, normal(2.000000e-02)
mt.param @l0.fc1.bias : tensor<32xf32>, zeros
func.func @matmul_used_twice(%x: tensor<2x4x16xf32>) -> (tensor<2x4x32xf32>, tensor<2x4x32xf32>) {
  %w = mt.param_ref @l0.fc1.weight : tensor<32x16xf32>
  %y = mt.matmul %x, %w : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
  %b = mt.param_ref @l0.fc1.bias : tensor<32xf32>
  %yb = mt.bias_add %y, %b {mt.layer = 0 : i64} : tensor<2x4x32xf32>, tensor<32xf32>
  %g = mt.gelu %yb tanh {mt.layer = 1 : i64} : tensor<2x4x32xf32>
  return %g, %y : tensor<2x4x32xf32>, tensor<2x4x32xf32>
}

// -----

// An intermediate read after the chain is one more output of the kernel
// (the backward's gradient sum, read by its dropout and the next sum).
// CHECK-LABEL: func.func @intermediate_read_later(
// CHECK-NEXT:    %[[K:.*]]:2 = mt.fused elementwise "add+dropout"
// CHECK-NEXT:      %[[S:.*]] = mt.add
// CHECK-NEXT:      %[[D:.*]] = mt.dropout %[[S]]
// CHECK-NEXT:      mt.yield %[[S]], %[[D]] : tensor<2x4x16xf32>, tensor<2x4x16xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[K]]#0, %[[K]]#1
func.func @intermediate_read_later(%a: tensor<2x4x16xf32>, %b: tensor<2x4x16xf32>) -> (tensor<2x4x16xf32>, tensor<2x4x16xf32>) {
  %s = mt.add %a, %b : tensor<2x4x16xf32>
  %d = mt.dropout %s {rate = 0.1 : f64, stream = 1 : i64} : tensor<2x4x16xf32>
  return %s, %d : tensor<2x4x16xf32>, tensor<2x4x16xf32>
}

// -----

// The residual stream: dropout + residual add + the next layer's norm are
// one row_reduction kernel that writes the sum (the next residual add reads
// it) and the normalised rows.
// CHECK-LABEL: func.func @residual_add_norm(
// CHECK:         %[[K:.*]]:2 = mt.fused row_reduction "decoder.layers.1 dropout+add+layer_norm"
// CHECK-NEXT:      %[[D:.*]] = mt.dropout
// CHECK-NEXT:      %[[S:.*]] = mt.add %{{.*}}, %[[D]]
// CHECK-NEXT:      %[[N:.*]] = mt.layer_norm %[[S]]
// CHECK-NEXT:      mt.yield %[[S]], %[[N]]
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[M:.*]] = mt.matmul %[[K]]#1
// CHECK-NEXT:    %[[R:.*]] = mt.add %[[K]]#0, %[[M]]
// CHECK-NEXT:    return %[[R]]
mt.param @ln.weight : tensor<16xf32>, ones
mt.param @ln.bias : tensor<16xf32>, zeros
func.func @residual_add_norm(%x: tensor<2x4x16xf32>, %res: tensor<2x4x16xf32>, %w2: tensor<16x16xf32>) -> tensor<2x4x16xf32> {
  %d = mt.dropout %x {mt.layer = 1 : i64, rate = 0.1 : f64, stream = 2 : i64} : tensor<2x4x16xf32>
  %s = mt.add %res, %d {mt.layer = 1 : i64} : tensor<2x4x16xf32>
  %w = mt.param_ref @ln.weight : tensor<16xf32>
  %b = mt.param_ref @ln.bias : tensor<16xf32>
  %n = mt.layer_norm %s, %w, %b {epsilon = 1.0e-05 : f64, mt.layer = 1 : i64} : tensor<2x4x16xf32>, tensor<16xf32>
  %m = mt.matmul %n, %w2 : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %r = mt.add %s, %m : tensor<2x4x16xf32>
  return %r : tensor<2x4x16xf32>
}

// -----

// A kernel's outputs share one index space: a value read twice whose next
// op changes the element count (SwiGLU halves it) ends the chain there.
// CHECK-LABEL: func.func @outputs_of_two_sizes(
// CHECK-NOT:     mt.fused
// CHECK:         return
func.func @outputs_of_two_sizes(%a: tensor<2x4x32xf32>, %b: tensor<2x4x32xf32>) -> (tensor<2x4x32xf32>, tensor<2x4x16xf32>) {
  %s = mt.add %a, %b : tensor<2x4x32xf32>
  %g = mt.swiglu %s : (tensor<2x4x32xf32>) -> tensor<2x4x16xf32>
  return %s, %g : tensor<2x4x32xf32>, tensor<2x4x16xf32>
}

// -----

// Only parameter reads may lie between two ops of a chain; a GEMM between
// them keeps them apart (moving either across it would change lifetimes).
// CHECK-LABEL: func.func @not_adjacent(
// CHECK-NOT:     mt.fused
// CHECK:         return
mt.param @w : tensor<16x16xf32>, normal(2.000000e-02)
func.func @not_adjacent(%a: tensor<2x4x16xf32>, %b: tensor<2x4x16xf32>, %x: tensor<2x4x16xf32>) -> (tensor<2x4x16xf32>, tensor<2x4x16xf32>) {
  %s = mt.add %a, %b : tensor<2x4x16xf32>
  %w = mt.param_ref @w : tensor<16x16xf32>
  %m = mt.matmul %x, %w : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %d = mt.dropout %s {rate = 0.1 : f64, stream = 1 : i64} : tensor<2x4x16xf32>
  return %d, %m : tensor<2x4x16xf32>, tensor<2x4x16xf32>
}

// -----

// The backward's sum of gradients and its dropout: the last op's result may
// have any number of users.
// CHECK-LABEL: func.func @backward_add_dropout(
// CHECK-NEXT:    %[[D:.*]] = mt.fused elementwise "add+dropout"
// CHECK:         mt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    mt.bias_grad %[[D]] into @b
// CHECK:         mt.matmul_input_grad %[[D]]
mt.param @w : tensor<16x16xf32>, normal(2.000000e-02)
mt.param @b : tensor<16xf32>, zeros
func.func @backward_add_dropout(%g1: tensor<2x4x16xf32>, %g2: tensor<2x4x16xf32>) -> tensor<2x4x16xf32> {
  %s = mt.add %g1, %g2 : tensor<2x4x16xf32>
  %d = mt.dropout %s {rate = 0.1 : f64, stream = 0 : i64} : tensor<2x4x16xf32>
  mt.bias_grad %d into @b : tensor<2x4x16xf32>
  %w = mt.param_ref @w : tensor<16x16xf32>
  %dx = mt.matmul_input_grad %d, %w : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  return %dx : tensor<2x4x16xf32>
}

// -----

// A chain holds one row-wise op: add -> layer_norm is one row_reduction
// kernel, rms_norm -> gelu the next. The parameter reads in between stay in
// place and feed both kernels.
// CHECK-LABEL: func.func @row_reduction(
// CHECK-NEXT:    %[[W:.*]] = mt.param_ref @ln.weight
// CHECK-NEXT:    %[[B:.*]] = mt.param_ref @ln.bias
// CHECK-NEXT:    %[[N:.*]] = mt.fused row_reduction "add+layer_norm" (%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %[[W]], %{{.*}} = %[[B]])
// CHECK-NEXT:      mt.add
// CHECK-NEXT:      mt.layer_norm
// CHECK-NEXT:      mt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[G:.*]] = mt.fused row_reduction "rms_norm+gelu" (%{{.*}} = %[[N]], %{{.*}} = %[[W]])
// CHECK-NEXT:      mt.rms_norm
// CHECK-NEXT:      mt.gelu
// CHECK-NEXT:      mt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[G]]
mt.param @ln.weight : tensor<16xf32>, ones
mt.param @ln.bias : tensor<16xf32>, zeros
func.func @row_reduction(%a: tensor<2x4x16xf32>, %b: tensor<2x4x16xf32>) -> tensor<2x4x16xf32> {
  %s = mt.add %a, %b : tensor<2x4x16xf32>
  %w = mt.param_ref @ln.weight : tensor<16xf32>
  %bias = mt.param_ref @ln.bias : tensor<16xf32>
  %n = mt.layer_norm %s, %w, %bias {epsilon = 1.0e-05 : f64} : tensor<2x4x16xf32>, tensor<16xf32>
  %r = mt.rms_norm %n, %w {epsilon = 1.0e-05 : f64} : tensor<2x4x16xf32>, tensor<16xf32>
  %g = mt.gelu %r tanh : tensor<2x4x16xf32>
  return %g : tensor<2x4x16xf32>
}

// -----

// A reshape inside a chain is kept (free in a kernel); a trailing one is
// left outside (alone it aliases its input); one before a row-wise op ends
// the chain (a row_reduction kernel holds no reshape).
// CHECK-LABEL: func.func @reshapes(
// CHECK-NEXT:    %[[K:.*]] = mt.fused elementwise "gelu+reshape+dropout+gelu"
// CHECK-NEXT:      mt.gelu
// CHECK-NEXT:      mt.reshape
// CHECK-NEXT:      mt.dropout
// CHECK-NEXT:      mt.gelu
// CHECK-NEXT:      mt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    mt.reshape %[[K]]
// CHECK-NEXT:    mt.matmul
// CHECK-NEXT:    mt.reshape
// CHECK-NEXT:    mt.param_ref
// CHECK-NEXT:    mt.rms_norm
// CHECK-NEXT:    return
mt.param @ln.weight : tensor<16xf32>, ones
func.func @reshapes(%a: tensor<2x4x16xf32>, %w: tensor<16x16xf32>) -> (tensor<8x16xf32>, tensor<2x4x16xf32>) {
  %g = mt.gelu %a tanh : tensor<2x4x16xf32>
  %r = mt.reshape %g : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
  %d = mt.dropout %r {rate = 0.1 : f64, stream = 1 : i64} : tensor<8x16xf32>
  %g2 = mt.gelu %d tanh : tensor<8x16xf32>
  %r2 = mt.reshape %g2 : (tensor<8x16xf32>) -> tensor<2x4x16xf32>
  %m = mt.matmul %r2, %w : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %r3 = mt.reshape %m : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
  %wn = mt.param_ref @ln.weight : tensor<16xf32>
  %ln = mt.rms_norm %r3, %wn {epsilon = 1.0e-05 : f64} : tensor<8x16xf32>, tensor<16xf32>
  return %ln, %m : tensor<8x16xf32>, tensor<2x4x16xf32>
}

// -----

// A GPT MLP's backward as mt-autodiff writes it, f32. FC2's weight gradient
// takes its bias gradient (BGRADB; the bias_grad moves past FC2's input
// gradient, which allocates but reads the same dy); FC2's input gradient
// takes the GeLU gradient and FC1's bias gradient (DGELU_BGRAD), moving past
// FC2's weight gradient. FC1's weight and input gradients stay plain GEMMs.
// CHECK-LABEL: func.func @mlp_backward(
// CHECK-SAME:      %[[DY:[^:]*]]: tensor<2x4x16xf32>, %[[X:[^:]*]]: tensor<2x4x16xf32>, %[[PRE:[^:]*]]: tensor<2x4x32xf32>, %[[H:[^:]*]]: tensor<2x4x32xf32>)
// CHECK:         mt.fused gemm_grad "decoder.layers.0 matmul_weight_grad+bias_grad" (%[[G:.*]] = %[[DY]], %[[A:.*]] = %[[H]]) : (tensor<2x4x16xf32>, tensor<2x4x32xf32>) -> () attributes {mt.layer = 0 : i64} {
// CHECK-NEXT:      mt.matmul_weight_grad %[[G]], %[[A]] into @l0.fc2.weight
// CHECK-NEXT:      mt.bias_grad %[[G]] into @l0.fc2.bias
// CHECK-NEXT:      mt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[DPRE:.*]] = mt.fused gemm_grad "decoder.layers.0 matmul_input_grad+gelu_grad+bias_grad" (%[[G2:.*]] = %[[DY]], %[[W2:.*]] = %{{.*}}, %[[P:.*]] = %[[PRE]]) : (tensor<2x4x16xf32>, tensor<16x32xf32>, tensor<2x4x32xf32>) -> tensor<2x4x32xf32> attributes {mt.layer = 0 : i64} {
// CHECK-NEXT:      %[[DH:.*]] = mt.matmul_input_grad %[[G2]], %[[W2]]
// CHECK-NEXT:      %[[D:.*]] = mt.gelu_grad %[[DH]], %[[P]] tanh
// CHECK-NEXT:      mt.bias_grad %[[D]] into @l0.fc1.bias
// CHECK-NEXT:      mt.yield %[[D]] : tensor<2x4x32xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    mt.param_ref @l0.fc1.weight
// CHECK-NEXT:    %[[DX:.*]] = mt.matmul_input_grad %[[DPRE]]
// CHECK-NEXT:    mt.matmul_weight_grad %[[DPRE]], %[[X]] into @l0.fc1.weight
// CHECK-NEXT:    return %[[DX]]
mt.param @l0.fc1.weight : tensor<32x16xf32>, normal(2.000000e-02)
mt.param @l0.fc1.bias : tensor<32xf32>, zeros
mt.param @l0.fc2.weight : tensor<16x32xf32>, normal(2.000000e-02)
mt.param @l0.fc2.bias : tensor<16xf32>, zeros
func.func @mlp_backward(%dy: tensor<2x4x16xf32>, %x: tensor<2x4x16xf32>, %pre: tensor<2x4x32xf32>, %h: tensor<2x4x32xf32>) -> tensor<2x4x16xf32> {
  mt.bias_grad %dy into @l0.fc2.bias {mt.layer = 0 : i64} : tensor<2x4x16xf32>
  %w2 = mt.param_ref @l0.fc2.weight : tensor<16x32xf32>
  %dh = mt.matmul_input_grad %dy, %w2 {mt.layer = 0 : i64} : (tensor<2x4x16xf32>, tensor<16x32xf32>) -> tensor<2x4x32xf32>
  mt.matmul_weight_grad %dy, %h into @l0.fc2.weight {mt.layer = 0 : i64} : tensor<2x4x16xf32>, tensor<2x4x32xf32>
  %dpre = mt.gelu_grad %dh, %pre tanh {mt.layer = 0 : i64} : tensor<2x4x32xf32>
  mt.bias_grad %dpre into @l0.fc1.bias {mt.layer = 0 : i64} : tensor<2x4x32xf32>
  %w1 = mt.param_ref @l0.fc1.weight : tensor<32x16xf32>
  %dx = mt.matmul_input_grad %dpre, %w1 {mt.layer = 0 : i64} : (tensor<2x4x32xf32>, tensor<32x16xf32>) -> tensor<2x4x16xf32>
  mt.matmul_weight_grad %dpre, %x into @l0.fc1.weight {mt.layer = 0 : i64} : tensor<2x4x32xf32>, tensor<2x4x16xf32>
  return %dx : tensor<2x4x16xf32>
}

// -----

// The same in bf16: cuBLASLt's DGELU_BGRAD would sum the GeLU gradients
// before they are rounded to bf16, so FC1's bias gradient goes to FC1's
// weight-gradient GEMM (BGRADB over the stored values, as the CPU sums).
// CHECK-LABEL: func.func @mlp_backward_bf16(
// CHECK:         mt.fused gemm_grad "matmul_weight_grad+bias_grad"
// CHECK:         mt.bias_grad %{{.*}} into @l0.fc2.bias
// CHECK:         %[[DPRE:.*]] = mt.fused gemm_grad "matmul_input_grad+gelu_grad"
// CHECK-NEXT:      mt.matmul_input_grad
// CHECK-NEXT:      %[[D:.*]] = mt.gelu_grad
// CHECK-NEXT:      mt.yield %[[D]] : tensor<2x4x32xbf16>
// CHECK-NEXT:    }
// CHECK-NEXT:    mt.param_ref @l0.fc1.weight
// CHECK-NEXT:    %[[DX:.*]] = mt.matmul_input_grad %[[DPRE]]
// CHECK-NEXT:    mt.fused gemm_grad "matmul_weight_grad+bias_grad" (%[[G:.*]] = %[[DPRE]], %{{.*}}) : (tensor<2x4x32xbf16>, tensor<2x4x16xbf16>) -> () {
// CHECK-NEXT:      mt.matmul_weight_grad %[[G]], %{{.*}} into @l0.fc1.weight
// CHECK-NEXT:      mt.bias_grad %[[G]] into @l0.fc1.bias
// CHECK-NEXT:      mt.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[DX]]
mt.param @l0.fc1.weight : tensor<32x16xbf16>, normal(2.000000e-02)
mt.param @l0.fc1.bias : tensor<32xbf16>, zeros
mt.param @l0.fc2.weight : tensor<16x32xbf16>, normal(2.000000e-02)
mt.param @l0.fc2.bias : tensor<16xbf16>, zeros
func.func @mlp_backward_bf16(%dy: tensor<2x4x16xbf16>, %x: tensor<2x4x16xbf16>, %pre: tensor<2x4x32xbf16>, %h: tensor<2x4x32xbf16>) -> tensor<2x4x16xbf16> {
  mt.bias_grad %dy into @l0.fc2.bias : tensor<2x4x16xbf16>
  %w2 = mt.param_ref @l0.fc2.weight : tensor<16x32xbf16>
  %dh = mt.matmul_input_grad %dy, %w2 : (tensor<2x4x16xbf16>, tensor<16x32xbf16>) -> tensor<2x4x32xbf16>
  mt.matmul_weight_grad %dy, %h into @l0.fc2.weight : tensor<2x4x16xbf16>, tensor<2x4x32xbf16>
  %dpre = mt.gelu_grad %dh, %pre tanh : tensor<2x4x32xbf16>
  mt.bias_grad %dpre into @l0.fc1.bias : tensor<2x4x32xbf16>
  %w1 = mt.param_ref @l0.fc1.weight : tensor<32x16xbf16>
  %dx = mt.matmul_input_grad %dpre, %w1 : (tensor<2x4x32xbf16>, tensor<32x16xbf16>) -> tensor<2x4x16xbf16>
  mt.matmul_weight_grad %dpre, %x into @l0.fc1.weight : tensor<2x4x32xbf16>, tensor<2x4x16xbf16>
  return %dx : tensor<2x4x16xbf16>
}

// -----

// No backward epilogue where it would not be exact or would move work
// across what it must not: an erf GeLU gradient (cuBLASLt's DGELU is the
// tanh form), a feature count that is no multiple of 8 (cuBLASLt's aux
// leading dimension), and a bias gradient whose dy another bias gradient
// sums too.
// CHECK-LABEL: func.func @no_backward_epilogue(
// CHECK-NOT:     mt.fused
// CHECK:         return
mt.param @w : tensor<16x12xf32>, normal(2.000000e-02)
mt.param @b : tensor<16xf32>, zeros
mt.param @b2 : tensor<16xf32>, zeros
func.func @no_backward_epilogue(%dy: tensor<2x4x16xf32>, %pre: tensor<2x4x12xf32>, %x: tensor<2x4x12xf32>) -> (tensor<2x4x12xf32>, tensor<2x4x12xf32>) {
  %w = mt.param_ref @w : tensor<16x12xf32>
  %dh = mt.matmul_input_grad %dy, %w : (tensor<2x4x16xf32>, tensor<16x12xf32>) -> tensor<2x4x12xf32>
  %d1 = mt.gelu_grad %dh, %pre erf : tensor<2x4x12xf32>
  %dh2 = mt.matmul_input_grad %dy, %w : (tensor<2x4x16xf32>, tensor<16x12xf32>) -> tensor<2x4x12xf32>
  %d2 = mt.gelu_grad %dh2, %pre tanh : tensor<2x4x12xf32>
  mt.bias_grad %dy into @b : tensor<2x4x16xf32>
  mt.bias_grad %dy into @b2 : tensor<2x4x16xf32>
  mt.matmul_weight_grad %dy, %x into @w : tensor<2x4x16xf32>, tensor<2x4x12xf32>
  return %d1, %d2 : tensor<2x4x12xf32>, tensor<2x4x12xf32>
}

// -----

// A bias gradient does not move past a gradient reduction to reach its
// weight-gradient GEMM.
// CHECK-LABEL: func.func @no_move_past_reduction(
// CHECK-NOT:     mt.fused
// CHECK:         return
mt.param @w : tensor<16x16xf32>, normal(2.000000e-02)
mt.param @b : tensor<16xf32>, zeros
func.func @no_move_past_reduction(%dy: tensor<2x4x16xf32>, %x: tensor<2x4x16xf32>) {
  mt.bias_grad %dy into @b : tensor<2x4x16xf32>
  mt.all_reduce_grads {group = "dp", scale = 5.000000e-01 : f64}
  mt.matmul_weight_grad %dy, %x into @w : tensor<2x4x16xf32>, tensor<2x4x16xf32>
  return
}

// -----

// Each of q and k has one user, an mt.rope of one base: the split rotates
// them (rope_base) and the ropes go. In the backward, dq and dk each come
// from an mt.rope_grad used only by the merge, which rotates them back.
// CHECK-LABEL: func.func @rope_into_split(
// CHECK-SAME:      %[[QKV:.*]]: tensor<2x8x64xf32>, %[[DO:.*]]: tensor<2x8x4x8xf32>)
// CHECK-NOT:     mt.rope
// CHECK:         %[[Q:[^,]*]], %[[K:[^,]*]], %[[V:[^ ]*]] = mt.split_qkv %[[QKV]] {mt.layer = 0 : i64, rope_base = 1.000000e+04 : f64} : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
// CHECK-NEXT:    %[[O:[^,]*]], %[[LSE:[^ ]*]] = mt.attention %[[Q]], %[[K]], %[[V]]
// CHECK-NEXT:    %[[DQ:[^,]*]], %[[DK:[^,]*]], %[[DV:[^ ]*]] = mt.attention_grad %[[DO]], %[[Q]], %[[K]], %[[V]], %[[O]], %[[LSE]]
// CHECK-NEXT:    %[[D:.*]] = mt.split_qkv_grad %[[DQ]], %[[DK]], %[[DV]] {rope_base = 1.000000e+04 : f64} : (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x64xf32>
// CHECK-NEXT:    return %[[O]], %[[D]]
func.func @rope_into_split(%qkv: tensor<2x8x64xf32>, %do: tensor<2x8x4x8xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x64xf32>) {
  %q, %k, %v = mt.split_qkv %qkv {mt.layer = 0 : i64} : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %qr = mt.rope %q {base = 1.000000e+04 : f64, mt.layer = 0 : i64} : tensor<2x8x4x8xf32>
  %kr = mt.rope %k {base = 1.000000e+04 : f64, mt.layer = 0 : i64} : tensor<2x8x2x8xf32>
  %o, %lse = mt.attention %qr, %kr, %v {causal, dropout_rate = 0.000000e+00 : f64, scale = 3.500000e-01 : f64, stream = 1 : i64} : tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>
  %dqr, %dkr, %dv = mt.attention_grad %do, %qr, %kr, %v, %o, %lse {causal, dropout_rate = 0.000000e+00 : f64, scale = 3.500000e-01 : f64, stream = 1 : i64} : tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>
  %dq = mt.rope_grad %dqr {base = 1.000000e+04 : f64} : tensor<2x8x4x8xf32>
  %dk = mt.rope_grad %dkr {base = 1.000000e+04 : f64} : tensor<2x8x2x8xf32>
  %dqkv = mt.split_qkv_grad %dq, %dk, %dv : (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x64xf32>
  return %o, %dqkv : tensor<2x8x4x8xf32>, tensor<2x8x64xf32>
}

// -----

// The unrotated q is read by something else too, and the rotated dq
// likewise: both would have to exist, so nothing changes. Ropes of two
// bases do not fuse either.
// CHECK-LABEL: func.func @rope_stays(
// CHECK-NOT:     rope_base
// CHECK:         mt.split_qkv
// CHECK-NEXT:    mt.rope
// CHECK-NEXT:    mt.rope
// CHECK:         mt.rope_grad
// CHECK-NEXT:    mt.rope_grad
// CHECK-NEXT:    mt.split_qkv_grad
// CHECK:         mt.split_qkv
// CHECK-NEXT:    mt.rope {{.*}}base = 1.000000e+04
// CHECK-NEXT:    mt.rope {{.*}}base = 5.000000e+05
// CHECK-NOT:     rope_base
// CHECK:         return
func.func @rope_stays(%qkv: tensor<2x8x64xf32>, %dqr: tensor<2x8x4x8xf32>, %dkr: tensor<2x8x2x8xf32>, %dv: tensor<2x8x2x8xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x64xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>) {
  %q, %k, %v = mt.split_qkv %qkv : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %qr = mt.rope %q {base = 1.000000e+04 : f64} : tensor<2x8x4x8xf32>
  %kr = mt.rope %k {base = 1.000000e+04 : f64} : tensor<2x8x2x8xf32>
  %dq = mt.rope_grad %dqr {base = 1.000000e+04 : f64} : tensor<2x8x4x8xf32>
  %dk = mt.rope_grad %dkr {base = 1.000000e+04 : f64} : tensor<2x8x2x8xf32>
  %dqkv = mt.split_qkv_grad %dq, %dk, %dv : (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x64xf32>
  %q2, %k2, %v2 = mt.split_qkv %qkv : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %qr2 = mt.rope %q2 {base = 1.000000e+04 : f64} : tensor<2x8x4x8xf32>
  %kr2 = mt.rope %k2 {base = 5.000000e+05 : f64} : tensor<2x8x2x8xf32>
  return %q, %qr, %kr, %dqkv, %dq, %qr2, %kr2 : tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x64xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>
}
