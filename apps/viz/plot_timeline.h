// Draws a Timeline (timeline.h) as SVG: one row per rank on a light grey band, a coloured box
// per computation (forward blue, backward green, BI teal, W purple, other grey; a model chunk
// further down the model darker), its label inside when it fits, a tooltip with the details, the
// idle gaps left as bare band, each row's idle share at its right, a legend and a time axis.
// Every box is a <rect class="box">; communication spans are <rect class="comm">.
#pragma once

#include <string>

#include "viz/timeline.h"

namespace tessera::viz {

std::string timeline_svg(const Timeline& t);

}  // namespace tessera::viz
