// The interface tables the registry chooses from (internal to hmem/).
#pragma once

#include "hmem/hmem.h"

namespace tandem::hmem {

extern const IfaceOps kSystemOps;
extern const IfaceOps kCudaOps;

// Loads the CUDA driver API (dlopen of libcuda.so.1) and finds its devices; true when at
// least one device is usable. `why` says what is missing otherwise.
bool cuda_load(int *devices, const char **why);

}  // namespace tandem::hmem
