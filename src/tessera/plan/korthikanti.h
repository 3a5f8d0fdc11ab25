// Activation memory of a transformer layer as Korthikanti et al. 2022 count it ("Reducing
// Activation Recomputation in Large Transformer Models", section 4): 16-bit activations, 1-byte
// dropout masks, s tokens, b sequences, hidden size h, a heads, t tensor-parallel ranks.
// The planner's megatron engine sums these terms one by one; the closed forms of the paper's
// table 2 are kept beside them so the tests can check the sum against the paper exactly.
#pragma once

#include "tessera/nn/gpt_config.h"

namespace tessera::plan {

struct LayerShape {
  double s = 2048, b = 1, h = 0, a = 0;
  int t = 1;
  bool sp = false;      // sequence parallelism: the replicated parts are split over t too
  bool dropout = true;  // the paper always keeps the dropout masks
  // Context parallelism (not in the paper): a device holds s / cp tokens of each sequence, whose
  // queries meet all s keys, so every term, the a s^2 b score terms too, is / cp.
  int cp = 1;
};

// Bytes one device keeps for one layer's backward, term by term (section 4.1): attention
// (QKV input, Q and K, softmax output, its dropout mask and output, V, the projection input and
// its dropout mask), MLP (c_fc input, GeLU input, GeLU output, dropout mask), both LayerNorms'
// inputs. Selective recomputation drops the softmax output, mask and dropped output; full
// recomputation keeps only the layer's input.
double layer_activation_bytes(const LayerShape& x, nn::Recompute r);

// The paper's table 2 (per layer, bytes; cp = 1, as the paper):
//   no parallelism                              s b h (34 + 5 a s / h)
//   tensor parallel                             s b h (10 + 24 / t + 5 a s / (h t))
//   tensor + sequence parallel                  s b h (34 / t + 5 a s / (h t))
//   tensor parallel + selective recomputation   s b h (10 + 24 / t)
//   tensor + sequence parallel + selective      s b h (34 / t)
//   full recomputation                          2 s b h
double table2_bytes(const LayerShape& x, nn::Recompute r);

// Section 4.3: the embedding's dropout mask (s b h / t with sequence parallelism, else s b h) and
// the output layer's: the final LayerNorm's and the projection's inputs, 2 s b h each (/ t with
// sequence parallelism), and fp32 logits 4 s b v / t.
double embedding_activation_bytes(const LayerShape& x);
double output_activation_bytes(const LayerShape& x, double vocab);

}  // namespace tessera::plan
