// tessera/nn.h: the public API of the nn layer (docs/API.md).
// Parameters with global identity, the GPT-2 and Llama-family modules over caller-owned activation records, GPT,
// the tensor-parallel pair, and UnitModel: the contract a custom model implements.
#pragma once

#include "tessera/nn/activations.h"
#include "tessera/nn/attention.h"
#include "tessera/nn/attention_branch.h"
#include "tessera/nn/block.h"
#include "tessera/nn/block_workspace.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/gelu_mlp.h"
#include "tessera/nn/gpt.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/gpt_costs.h"
#include "tessera/nn/head.h"
#include "tessera/nn/linear.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/moe.h"
#include "tessera/nn/moe_mlp.h"
#include "tessera/nn/moe_router.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/rotary_attention.h"
#include "tessera/nn/stage_model.h"
#include "tessera/nn/swiglu_mlp.h"
#include "tessera/nn/tensor_parallel.h"
#include "tessera/nn/unit_hooks.h"
#include "tessera/nn/unit_model.h"
