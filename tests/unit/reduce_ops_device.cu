// Compiled, never run (ctest unit.atomic_engine.compiles_for_gpu): the reduction engine
// (hmem/reduce_ops.h) must stay CUDA device code for every datatype a GPU has, since GPU
// collectives are to share it with the host atomics. long double types are left out: CUDA
// has none, and the engine refuses them in a device pass.
#include "hmem/reduce_ops.h"

namespace tandem::reduce::device_check {

// One thread per element, as a GPU reduction would run it.
template <int Datatype>
__global__ void apply_kernel(int op, void *target, const void *operand, const void *compare,
                             void *result, size_t count, int *status) {
    constexpr size_t n = sizeof(typename DatatypeDesc<Datatype>::type);
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    if (!valid(op, Datatype) || datatype_size(Datatype) != n) {
        *status = -FI_EINVAL;
        return;
    }
    const int rc =
        apply_op<Datatype>(op, static_cast<unsigned char *>(target) + i * n,
                           operand ? static_cast<const unsigned char *>(operand) + i * n : nullptr,
                           compare ? static_cast<const unsigned char *>(compare) + i * n : nullptr,
                           result ? static_cast<unsigned char *>(result) + i * n : nullptr, 1);
    if (rc) *status = rc;
}

// A fixed op, without the runtime dispatch.
template <int Op, int Datatype>
__global__ void reduce_kernel(void *dst, const void *src, size_t count) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) {
        constexpr size_t n = sizeof(typename DatatypeDesc<Datatype>::type);
        apply_elements<Op, Datatype>(static_cast<unsigned char *>(dst) + i * n,
                                     static_cast<const unsigned char *>(src) + i * n, nullptr,
                                     nullptr, 1);
    }
}

#define TANDEM_APPLY_KERNEL(dt)                                                                \
    template __global__ void apply_kernel<dt>(int, void *, const void *, const void *, void *, \
                                              size_t, int *)
TANDEM_APPLY_KERNEL(FI_INT8);
TANDEM_APPLY_KERNEL(FI_UINT8);
TANDEM_APPLY_KERNEL(FI_INT16);
TANDEM_APPLY_KERNEL(FI_UINT16);
TANDEM_APPLY_KERNEL(FI_INT32);
TANDEM_APPLY_KERNEL(FI_UINT32);
TANDEM_APPLY_KERNEL(FI_INT64);
TANDEM_APPLY_KERNEL(FI_UINT64);
TANDEM_APPLY_KERNEL(FI_FLOAT);
TANDEM_APPLY_KERNEL(FI_DOUBLE);
TANDEM_APPLY_KERNEL(FI_FLOAT_COMPLEX);
TANDEM_APPLY_KERNEL(FI_DOUBLE_COMPLEX);
TANDEM_APPLY_KERNEL(FI_INT128);
TANDEM_APPLY_KERNEL(FI_UINT128);
#undef TANDEM_APPLY_KERNEL

template __global__ void reduce_kernel<FI_SUM, FI_FLOAT>(void *, const void *, size_t);
template __global__ void reduce_kernel<FI_PROD, FI_DOUBLE_COMPLEX>(void *, const void *, size_t);
template __global__ void reduce_kernel<FI_MAX, FI_INT64>(void *, const void *, size_t);
template __global__ void reduce_kernel<FI_BXOR, FI_UINT128>(void *, const void *, size_t);

}  // namespace tandem::reduce::device_check
