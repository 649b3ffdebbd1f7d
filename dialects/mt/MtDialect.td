// The mt dialect: declaration, enums and shared type constraints.
#ifndef MT_DIALECT_TD
#define MT_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/EnumAttr.td"

def Mt_Dialect : Dialect {
  let name = "mt";
  let cppNamespace = "::mt";
  let summary = "A dialect for training GPT-style language models";
  let description = [{
    The `mt` dialect describes one training step of a transformer language
    model at several levels. At the model-graph level, parameters are
    module-level `mt.param` symbols that carry their shape, element type and
    initialisation, and the forward graph is a `func.func` whose operations
    (`mt.embedding`, `mt.layer_norm`, `mt.matmul`, `mt.attention`, ...) work on
    statically shaped tensors: batch, sequence and every parallel degree are
    known at compile time, so later passes can plan memory exactly.

    Layers are unrolled: each layer's operations appear once per layer and
    refer to that layer's parameters by symbol name, using Megatron-LM's
    parameter names (`decoder.layers.3.self_attention.linear_qkv.weight`) so
    that users and checkpoints speak the same language.
  }];
  let dependentDialects = ["::mlir::func::FuncDialect"];
}

def Mt_InitKind : I32EnumAttr<"InitKind", "how a parameter is initialised", [
    I32EnumAttrCase<"Zeros", 0, "zeros">,
    I32EnumAttrCase<"Ones", 1, "ones">,
    I32EnumAttrCase<"Normal", 2, "normal">,
  ]> {
  let cppNamespace = "::mt";
}

def Mt_GeluApproximation : I32EnumAttr<"GeluApproximation",
    "which GeLU formula is used", [
    I32EnumAttrCase<"Tanh", 0, "tanh">,
    I32EnumAttrCase<"Erf", 1, "erf">,
  ]> {
  let cppNamespace = "::mt";
}

// Mixture of experts: the router's choices (mt.moe_router, mt.moe_router_grad),
// named as Megatron-LM's --moe-router-* flags spell them.
def Mt_MoeScoreFunction : I32EnumAttr<"MoeScoreFunction",
    "how the router turns logits into expert scores", [
    I32EnumAttrCase<"Softmax", 0, "softmax">,
    I32EnumAttrCase<"Sigmoid", 1, "sigmoid">,
  ]> {
  let cppNamespace = "::mt";
}

def Mt_MoeLoadBalancing : I32EnumAttr<"MoeLoadBalancing",
    "the router's load-balancing loss", [
    I32EnumAttrCase<"None", 0, "none">,
    I32EnumAttrCase<"AuxLoss", 1, "aux_loss">,
    I32EnumAttrCase<"SeqAuxLoss", 2, "seq_aux_loss">,
  ]> {
  let cppNamespace = "::mt";
}

def Mt_MoeDropPolicy : I32EnumAttr<"MoeDropPolicy",
    "which tokens an expert over its capacity keeps", [
    I32EnumAttrCase<"Probs", 0, "probs">,
    I32EnumAttrCase<"Position", 1, "position">,
  ]> {
  let cppNamespace = "::mt";
}

def Mt_MoeRouterDtype : I32EnumAttr<"MoeRouterDtype",
    "the precision of the router's score computation", [
    I32EnumAttrCase<"None", 0, "none">,
    I32EnumAttrCase<"FP32", 1, "fp32">,
    I32EnumAttrCase<"FP64", 2, "fp64">,
  ]> {
  let cppNamespace = "::mt";
}

def Mt_MoeDispatcher : I32EnumAttr<"MoeDispatcher",
    "how tokens reach the expert-parallel ranks that own their experts", [
    I32EnumAttrCase<"AllToAll", 0, "alltoall">,
    I32EnumAttrCase<"AllGather", 1, "allgather">,
  ]> {
  let cppNamespace = "::mt";
}

// Floating-point tensors with a static shape: every activation and parameter.
def Mt_FloatTensor : StaticShapeTensorOf<[F32, F16, BF16]>;
// The MoE router's logits and their gradient, f64 with moe_router_dtype
// fp64 (Megatron's router_gating_linear computes them in that type); the
// linear layer that gives them (mt.matmul, its two gradients) takes them.
def Mt_WideFloatTensor : StaticShapeTensorOf<[F32, F16, BF16, F64]>;
// Token ids, labels and positions.
def Mt_IndexTensor : StaticShapeTensorOf<[I32, I64]>;
// The scalar loss.
def Mt_ScalarF32 : 0DTensorOf<[F32]>;
// Routing maps, token-to-row maps and per-expert token counts.
def Mt_I32Tensor : StaticShapeTensorOf<[I32]>;
// Routing probabilities: f32 whatever the model's type.
def Mt_F32Tensor : StaticShapeTensorOf<[F32]>;

class Mt_Op<string mnemonic, list<Trait> traits = []>
    : Op<Mt_Dialect, mnemonic, traits>;

#endif // MT_DIALECT_TD
