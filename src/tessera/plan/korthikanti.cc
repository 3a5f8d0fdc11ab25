#include "tessera/plan/korthikanti.h"

namespace tessera::plan {

double layer_activation_bytes(const LayerShape& x, nn::Recompute r) {
  const double sbh = x.s * x.b * x.h / x.cp, t = x.t;
  const double rep = x.sp ? 1.0 / t : 1.0;    // replicated over tp unless sequence-parallel
  const double mask = x.dropout ? 1.0 : 0.0;  // bytes per element of a dropout mask
  if (r == nn::Recompute::Full) return 2 * sbh * rep;
  const double as2b = x.a * x.s * x.s * x.b / x.cp;
  // Attention.
  double attention = 2 * sbh * rep        // QKV input (the LayerNorm's output)
                     + 4 * sbh / t        // Q and K
                     + 2 * sbh / t        // V
                     + 2 * sbh / t        // the projection's input
                     + mask * sbh * rep;  // the projection's dropout mask
  if (r == nn::Recompute::None)
    attention += 2 * as2b / t             // softmax output
                 + mask * as2b / t        // its dropout mask
                 + 2 * as2b / t;          // its dropped output (multiplied with V)
  const double mlp = 2 * sbh * rep        // c_fc input
                     + 8 * sbh / t        // GeLU input
                     + 8 * sbh / t        // GeLU output (c_proj input)
                     + mask * sbh * rep;  // dropout mask
  const double layernorms = 2 * (2 * sbh * rep);
  return attention + mlp + layernorms;
}

double table2_bytes(const LayerShape& x, nn::Recompute r) {
  const double sbh = x.s * x.b * x.h, t = x.t, ash = x.a * x.s / x.h;
  if (r == nn::Recompute::Full) return 2 * sbh;
  if (t == 1 && !x.sp) return sbh * (34 + (r == nn::Recompute::None ? 5 * ash : 0));
  if (x.sp) return sbh * (34 / t + (r == nn::Recompute::None ? 5 * ash / t : 0));
  return sbh * (10 + 24 / t + (r == nn::Recompute::None ? 5 * ash / t : 0));
}

double embedding_activation_bytes(const LayerShape& x) {
  return x.dropout ? x.s * x.b * x.h / x.cp * (x.sp ? 1.0 / x.t : 1.0) : 0.0;
}

double output_activation_bytes(const LayerShape& x, double vocab) {
  const double sb = x.s * x.b / x.cp, sbh = sb * x.h, rep = x.sp ? 1.0 / x.t : 1.0;
  return 2 * sbh * rep + 2 * sbh * rep + 4 * sb * vocab / x.t;
}

}  // namespace tessera::plan
