// mt-recompute: full recomputation (uniform, block) clones forward ops of a
// chunk of layers right before the first backward op that reads one of their
// results; selective and none leave the IR as it is. One 4-layer @train_step
// (layer = x + fc2(dropout(fc1(x))), ordered as mt-autodiff builds it) serves
// every setting: sed rewrites the module's mt.training for each RUN.
// RUN: mtc-opt %s -mt-recompute | FileCheck %s --check-prefix=NONE
// RUN: sed -e 's/granularity = "none"/granularity = "selective"/' %s \
// RUN:   | mtc-opt -mt-recompute | FileCheck %s --check-prefix=SEL
// RUN: sed -e 's/granularity = "none"/granularity = "full"/' -e 's/method = "none"/method = "uniform"/' -e 's/num_layers = 0/num_layers = 1/' %s \
// RUN:   | mtc-opt -mt-recompute | FileCheck %s --check-prefix=UNI1
// RUN: sed -e 's/granularity = "none"/granularity = "full"/' -e 's/method = "none"/method = "uniform"/' -e 's/num_layers = 0/num_layers = 2/' %s \
// RUN:   | mtc-opt -mt-recompute | FileCheck %s --check-prefix=UNI2
// RUN: sed -e 's/granularity = "none"/granularity = "full"/' -e 's/method = "none"/method = "block"/' -e 's/num_layers = 0/num_layers = 2/' %s \
// RUN:   | mtc-opt -mt-recompute | FileCheck %s --check-prefix=BLOCK
// CSE must not fold the clones back into the originals.
// RUN: sed -e 's/granularity = "none"/granularity = "full"/' -e 's/method = "none"/method = "uniform"/' -e 's/num_layers = 0/num_layers = 1/' %s \
// RUN:   | mtc-opt -mt-recompute -cse | FileCheck %s --check-prefix=CSE
// The point of it all: a smaller arena.
// RUN: mtc-opt %s -mt-recompute -mt-plan-memory | FileCheck %s --check-prefix=MEM-NONE
// RUN: sed -e 's/granularity = "none"/granularity = "full"/' -e 's/method = "none"/method = "uniform"/' -e 's/num_layers = 0/num_layers = 1/' %s \
// RUN:   | mtc-opt -mt-recompute -mt-plan-memory | FileCheck %s --check-prefix=MEM-FULL

module attributes {mt.training = {recompute_granularity = "none", recompute_method = "none", recompute_num_layers = 0 : i64}} {
  mt.param @emb : tensor<16x8xf32>, normal(2.000000e-02)
  mt.param @l0.fc1 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l0.fc2 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l1.fc1 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l1.fc2 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l2.fc1 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l2.fc2 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l3.fc1 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l3.fc2 : tensor<8x8xf32>, normal(2.000000e-02)
  func.func @train_step(%tokens: tensor<2x4xi32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
    %e = mt.param_ref @emb : tensor<16x8xf32>
    %x0 = mt.embedding %e, %tokens : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %w0 = mt.param_ref @l0.fc1 {mt.layer = 0 : i64} : tensor<8x8xf32>
    %a0 = mt.matmul %x0, %w0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %d0 = mt.dropout %a0 {mt.layer = 0 : i64, rate = 1.000000e-01 : f64, stream = 1 : i64} : tensor<2x4x8xf32>
    %v0 = mt.param_ref @l0.fc2 {mt.layer = 0 : i64} : tensor<8x8xf32>
    %o0 = mt.matmul %d0, %v0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %x1 = mt.add %x0, %o0 {mt.layer = 0 : i64} : tensor<2x4x8xf32>
    %w1 = mt.param_ref @l1.fc1 {mt.layer = 1 : i64} : tensor<8x8xf32>
    %a1 = mt.matmul %x1, %w1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %d1 = mt.dropout %a1 {mt.layer = 1 : i64, rate = 1.000000e-01 : f64, stream = 2 : i64} : tensor<2x4x8xf32>
    %v1 = mt.param_ref @l1.fc2 {mt.layer = 1 : i64} : tensor<8x8xf32>
    %o1 = mt.matmul %d1, %v1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %x2 = mt.add %x1, %o1 {mt.layer = 1 : i64} : tensor<2x4x8xf32>
    %w2 = mt.param_ref @l2.fc1 {mt.layer = 2 : i64} : tensor<8x8xf32>
    %a2 = mt.matmul %x2, %w2 {mt.layer = 2 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %d2 = mt.dropout %a2 {mt.layer = 2 : i64, rate = 1.000000e-01 : f64, stream = 3 : i64} : tensor<2x4x8xf32>
    %v2 = mt.param_ref @l2.fc2 {mt.layer = 2 : i64} : tensor<8x8xf32>
    %o2 = mt.matmul %d2, %v2 {mt.layer = 2 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %x3 = mt.add %x2, %o2 {mt.layer = 2 : i64} : tensor<2x4x8xf32>
    %w3 = mt.param_ref @l3.fc1 {mt.layer = 3 : i64} : tensor<8x8xf32>
    %a3 = mt.matmul %x3, %w3 {mt.layer = 3 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %d3 = mt.dropout %a3 {mt.layer = 3 : i64, rate = 1.000000e-01 : f64, stream = 4 : i64} : tensor<2x4x8xf32>
    %v3 = mt.param_ref @l3.fc2 {mt.layer = 3 : i64} : tensor<8x8xf32>
    %o3 = mt.matmul %d3, %v3 {mt.layer = 3 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %x4 = mt.add %x3, %o3 {mt.layer = 3 : i64} : tensor<2x4x8xf32>
    %logits = mt.matmul %x4, %e : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
    %seed = mt.grad_seed {scale = 1.000000e+00 : f64} : tensor<f32>
    %dlogits = mt.cross_entropy_grad %logits, %labels, %seed : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<f32>) -> tensor<2x4x16xf32>
    %dx4 = mt.matmul_input_grad %dlogits, %e : (tensor<2x4x16xf32>, tensor<16x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %dlogits, %x4 into @emb : tensor<2x4x16xf32>, tensor<2x4x8xf32>
    %dd3 = mt.matmul_input_grad %dx4, %v3 {mt.layer = 3 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %dx4, %d3 into @l3.fc2 {mt.layer = 3 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32>
    %da3 = mt.dropout %dd3 {mt.layer = 3 : i64, rate = 1.000000e-01 : f64, stream = 4 : i64} : tensor<2x4x8xf32>
    %dxa3 = mt.matmul_input_grad %da3, %w3 {mt.layer = 3 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %da3, %x3 into @l3.fc1 {mt.layer = 3 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32>
    %dx3 = mt.add %dx4, %dxa3 {mt.layer = 3 : i64} : tensor<2x4x8xf32>
    %dd2 = mt.matmul_input_grad %dx3, %v2 {mt.layer = 2 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %dx3, %d2 into @l2.fc2 {mt.layer = 2 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32>
    %da2 = mt.dropout %dd2 {mt.layer = 2 : i64, rate = 1.000000e-01 : f64, stream = 3 : i64} : tensor<2x4x8xf32>
    %dxa2 = mt.matmul_input_grad %da2, %w2 {mt.layer = 2 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %da2, %x2 into @l2.fc1 {mt.layer = 2 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32>
    %dx2 = mt.add %dx3, %dxa2 {mt.layer = 2 : i64} : tensor<2x4x8xf32>
    %dd1 = mt.matmul_input_grad %dx2, %v1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %dx2, %d1 into @l1.fc2 {mt.layer = 1 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32>
    %da1 = mt.dropout %dd1 {mt.layer = 1 : i64, rate = 1.000000e-01 : f64, stream = 2 : i64} : tensor<2x4x8xf32>
    %dxa1 = mt.matmul_input_grad %da1, %w1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %da1, %x1 into @l1.fc1 {mt.layer = 1 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32>
    %dx1 = mt.add %dx2, %dxa1 {mt.layer = 1 : i64} : tensor<2x4x8xf32>
    %dd0 = mt.matmul_input_grad %dx1, %v0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %dx1, %d0 into @l0.fc2 {mt.layer = 0 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32>
    %da0 = mt.dropout %dd0 {mt.layer = 0 : i64, rate = 1.000000e-01 : f64, stream = 1 : i64} : tensor<2x4x8xf32>
    %dxa0 = mt.matmul_input_grad %da0, %w0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    mt.matmul_weight_grad %da0, %x0 into @l0.fc1 {mt.layer = 0 : i64} : tensor<2x4x8xf32>, tensor<2x4x8xf32>
    %dx0 = mt.add %dx1, %dxa0 {mt.layer = 0 : i64} : tensor<2x4x8xf32>
    mt.embedding_grad %dx0, %tokens into @emb : tensor<2x4x8xf32>, tensor<2x4xi32>
    return %loss : tensor<f32>
  }
}

// NONE-LABEL: func.func @train_step(
// NONE-SAME: attributes {mt.recompute = "none", mt.recomputed_layers = array<i64>}
// NONE-NOT: mt.recomputed{{[,}]}}

// Megatron's selective recomputation (core attention) is inherent:
// mt.attention_grad recomputes the probabilities.
// SEL-LABEL: func.func @train_step(
// SEL-SAME: attributes {mt.recompute = "selective (core attention: inherent, mt.attention_grad recomputes the probabilities from q, k and the log-sum-exp)", mt.recomputed_layers = array<i64>}
// SEL-NOT: mt.recomputed{{[,}]}}

// Uniform, 1 layer per chunk: every layer is its own chunk.
// UNI1-LABEL: func.func @train_step(
// UNI1-SAME: attributes {mt.recompute = "full (uniform, 1 layer per chunk)", mt.recomputed_layers = array<i64: 0, 1, 2, 3>}
// UNI1: %[[X0:.*]] = mt.embedding
// UNI1: %[[W0:.*]] = mt.param_ref @l0.fc1
// UNI1: %[[X1:.*]] = mt.add %[[X0]], %{{.*}} {mt.layer = 0 : i64}
// UNI1: %[[W1:.*]] = mt.param_ref @l1.fc1
// UNI1: %[[X2:.*]] = mt.add %[[X1]], %{{.*}} {mt.layer = 1 : i64}
// UNI1: %[[W2:.*]] = mt.param_ref @l2.fc1
// UNI1: %[[X3:.*]] = mt.add %[[X2]], %{{.*}} {mt.layer = 2 : i64}
// UNI1: %[[W3:.*]] = mt.param_ref @l3.fc1
// UNI1: %[[X4:.*]] = mt.add %[[X3]], %{{.*}} {mt.layer = 3 : i64}
// UNI1: mt.grad_seed
// Layer 3's first backward op reads nothing of the layer: the recomputation
// comes after it, right before the first op that does. The chunk's input
// and the parameter read are used as they are; the dropout keeps its stream.
// UNI1: mt.matmul_input_grad {{.*}} {mt.layer = 3 : i64}
// UNI1-NEXT: %[[A3R:.*]] = mt.matmul %[[X3]], %[[W3]] {mt.layer = 3 : i64, mt.recomputed}
// UNI1-NEXT: %[[D3R:.*]] = mt.dropout %[[A3R]] {mt.layer = 3 : i64, mt.recomputed, rate = 1.000000e-01 : f64, stream = 4 : i64}
// UNI1-NEXT: mt.matmul_weight_grad %{{.*}}, %[[D3R]] into @l3.fc2
// UNI1: mt.matmul_weight_grad %{{.*}}, %[[X3]] into @l3.fc1
// UNI1: mt.matmul_input_grad {{.*}} {mt.layer = 2 : i64}
// UNI1-NEXT: %[[A2R:.*]] = mt.matmul %[[X2]], %[[W2]] {mt.layer = 2 : i64, mt.recomputed}
// UNI1-NEXT: %[[D2R:.*]] = mt.dropout %[[A2R]] {{{.*}}stream = 3 : i64}
// UNI1-NEXT: mt.matmul_weight_grad %{{.*}}, %[[D2R]] into @l2.fc2
// UNI1: mt.matmul_input_grad {{.*}} {mt.layer = 1 : i64}
// UNI1-NEXT: %[[A1R:.*]] = mt.matmul %[[X1]], %[[W1]] {mt.layer = 1 : i64, mt.recomputed}
// UNI1-NEXT: %[[D1R:.*]] = mt.dropout %[[A1R]] {{{.*}}stream = 2 : i64}
// UNI1-NEXT: mt.matmul_weight_grad %{{.*}}, %[[D1R]] into @l1.fc2
// UNI1: mt.matmul_input_grad {{.*}} {mt.layer = 0 : i64}
// UNI1-NEXT: %[[A0R:.*]] = mt.matmul %[[X0]], %[[W0]] {mt.layer = 0 : i64, mt.recomputed}
// UNI1-NEXT: %[[D0R:.*]] = mt.dropout %[[A0R]] {{{.*}}stream = 1 : i64}
// UNI1-NEXT: mt.matmul_weight_grad %{{.*}}, %[[D0R]] into @l0.fc2
// UNI1-NOT: mt.recomputed{{[,}]}}
// UNI1: mt.embedding_grad

// Uniform, 2 layers per chunk: chunks {0, 1} and {2, 3}. A chunk's inner
// residual (x1, x3) is recomputed; what it hands on (x2, x4) is kept. Only
// what the backward reads is re-executed: fc2 of a chunk's last layer is not.
// UNI2-LABEL: func.func @train_step(
// UNI2-SAME: attributes {mt.recompute = "full (uniform, 2 layers per chunk)", mt.recomputed_layers = array<i64: 0, 1, 2, 3>}
// UNI2: %[[X0:.*]] = mt.embedding
// UNI2: %[[W0:.*]] = mt.param_ref @l0.fc1
// UNI2: %[[V0:.*]] = mt.param_ref @l0.fc2
// UNI2: %[[W1:.*]] = mt.param_ref @l1.fc1
// UNI2: %[[X2:.*]] = mt.add %{{.*}}, %{{.*}} {mt.layer = 1 : i64}
// UNI2: %[[W2:.*]] = mt.param_ref @l2.fc1
// UNI2: %[[V2:.*]] = mt.param_ref @l2.fc2
// UNI2: %[[W3:.*]] = mt.param_ref @l3.fc1
// UNI2: mt.grad_seed
// UNI2: mt.matmul_input_grad {{.*}} {mt.layer = 3 : i64}
// UNI2-NEXT: %[[A2R:.*]] = mt.matmul %[[X2]], %[[W2]] {mt.layer = 2 : i64, mt.recomputed}
// UNI2-NEXT: %[[D2R:.*]] = mt.dropout %[[A2R]] {{{.*}}stream = 3 : i64}
// UNI2-NEXT: %[[O2R:.*]] = mt.matmul %[[D2R]], %[[V2]] {mt.layer = 2 : i64, mt.recomputed}
// UNI2-NEXT: %[[X3R:.*]] = mt.add %[[X2]], %[[O2R]] {mt.layer = 2 : i64, mt.recomputed}
// UNI2-NEXT: %[[A3R:.*]] = mt.matmul %[[X3R]], %[[W3]] {mt.layer = 3 : i64, mt.recomputed}
// UNI2-NEXT: %[[D3R:.*]] = mt.dropout %[[A3R]] {{{.*}}stream = 4 : i64}
// UNI2-NEXT: mt.matmul_weight_grad %{{.*}}, %[[D3R]] into @l3.fc2
// UNI2: mt.matmul_weight_grad %{{.*}}, %[[X3R]] into @l3.fc1
// UNI2: mt.matmul_weight_grad %{{.*}}, %[[D2R]] into @l2.fc2
// UNI2: mt.matmul_weight_grad %{{.*}}, %[[X2]] into @l2.fc1
// UNI2: mt.matmul_input_grad {{.*}} {mt.layer = 1 : i64}
// UNI2-NEXT: %[[A0R:.*]] = mt.matmul %[[X0]], %[[W0]] {mt.layer = 0 : i64, mt.recomputed}
// UNI2-NEXT: %[[D0R:.*]] = mt.dropout %[[A0R]] {{{.*}}stream = 1 : i64}
// UNI2-NEXT: %[[O0R:.*]] = mt.matmul %[[D0R]], %[[V0]] {mt.layer = 0 : i64, mt.recomputed}
// UNI2-NEXT: %[[X1R:.*]] = mt.add %[[X0]], %[[O0R]] {mt.layer = 0 : i64, mt.recomputed}
// UNI2-NEXT: %[[A1R:.*]] = mt.matmul %[[X1R]], %[[W1]] {mt.layer = 1 : i64, mt.recomputed}
// UNI2-NEXT: %[[D1R:.*]] = mt.dropout %[[A1R]] {{{.*}}stream = 2 : i64}
// UNI2-NEXT: mt.matmul_weight_grad %{{.*}}, %[[D1R]] into @l1.fc2
// UNI2: mt.matmul_weight_grad %{{.*}}, %[[X1R]] into @l1.fc1
// UNI2: mt.matmul_weight_grad %{{.*}}, %[[D0R]] into @l0.fc2
// UNI2: mt.matmul_weight_grad %{{.*}}, %[[X0]] into @l0.fc1

// Block, 2 layers: layers 0 and 1 are recomputed, each alone; 2 and 3 keep
// their activations.
// BLOCK-LABEL: func.func @train_step(
// BLOCK-SAME: attributes {mt.recompute = "full (block, the first 2 layers)", mt.recomputed_layers = array<i64: 0, 1>}
// BLOCK: %[[X0:.*]] = mt.embedding
// BLOCK: %[[W0:.*]] = mt.param_ref @l0.fc1
// BLOCK: %[[X1:.*]] = mt.add %[[X0]], %{{.*}} {mt.layer = 0 : i64}
// BLOCK: %[[W1:.*]] = mt.param_ref @l1.fc1
// BLOCK: %[[D2:.*]] = mt.dropout {{.*}}stream = 3 : i64}
// BLOCK: %[[D3:.*]] = mt.dropout {{.*}}stream = 4 : i64}
// BLOCK: mt.grad_seed
// BLOCK-NOT: mt.recomputed{{[,}]}}
// BLOCK: mt.matmul_weight_grad %{{.*}}, %[[D3]] into @l3.fc2
// BLOCK-NOT: mt.recomputed{{[,}]}}
// BLOCK: mt.matmul_weight_grad %{{.*}}, %[[D2]] into @l2.fc2
// BLOCK-NOT: mt.recomputed{{[,}]}}
// BLOCK: mt.matmul_input_grad {{.*}} {mt.layer = 1 : i64}
// BLOCK-NEXT: %[[A1R:.*]] = mt.matmul %[[X1]], %[[W1]] {mt.layer = 1 : i64, mt.recomputed}
// BLOCK-NEXT: %[[D1R:.*]] = mt.dropout %[[A1R]] {{{.*}}stream = 2 : i64}
// BLOCK-NEXT: mt.matmul_weight_grad %{{.*}}, %[[D1R]] into @l1.fc2
// BLOCK: mt.matmul_input_grad {{.*}} {mt.layer = 0 : i64}
// BLOCK-NEXT: %[[A0R:.*]] = mt.matmul %[[X0]], %[[W0]] {mt.layer = 0 : i64, mt.recomputed}
// BLOCK-NEXT: %[[D0R:.*]] = mt.dropout %[[A0R]] {{{.*}}stream = 1 : i64}
// BLOCK-NEXT: mt.matmul_weight_grad %{{.*}}, %[[D0R]] into @l0.fc2

// The clones carry mt.recomputed, so their attributes differ from the
// originals' and CSE leaves all four layers' recomputation in place.
// CSE-LABEL: func.func @train_step(
// CSE: mt.grad_seed
// CSE-COUNT-4: mt.matmul {{.*}}mt.recomputed}
// CSE-NOT: mt.recomputed}

// 2x4x8 f32 activations are 256 bytes each: the kept dropout outputs (one
// per layer) no longer sit in the arena while the backward runs.
// MEM-NONE: module attributes {mt.arena_bytes = 3840 : i64
// MEM-FULL: module attributes {mt.arena_bytes = 2816 : i64
