#include "tessera/optim/optimizer.h"

#include "tessera/core/error.h"

namespace tessera::optim {

std::vector<Segment> whole_parameter_segments(const nn::ParameterSet& params) {
  std::vector<Segment> out;
  for (int i = 0; i < params.size(); ++i) {
    const nn::ParamInfo& info = params.infos()[i];
    out.push_back(Segment{i, 0, info.local_numel(), params.param_data(i), params.grad_data(i),
                          info.offset, info.weight_decay, params.bf16_copy(i)});
  }
  return out;
}

std::vector<NamedTensor> Optimizer::state(const nn::ParameterSet& params) {
  std::vector<NamedTensor> out;
  for (auto& [kind, buf] : state_buffers()) {
    for (const Segment& s : segments()) {
      const nn::ParamInfo& info = params.infos()[s.param];
      TESSERA_ASSERT(s.param_offset == 0 && s.n == info.local_numel(),
                     "per-parameter optimizer state needs whole-parameter segments");
      out.emplace_back(kind + "." + info.name, buf.view(s.state_offset, info.local_shape));
    }
  }
  return out;
}

}  // namespace tessera::optim
