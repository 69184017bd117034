// The table of peer::OffloadOps (peer/offload_ops.h) that off_tandem's domain hands out on
// fi_open_ops(peer::kOffloadOpsName).
#pragma once

#include "peer/offload_ops.h"

namespace tandem::off {

const peer::OffloadOps &offload_ops();

}  // namespace tandem::off
