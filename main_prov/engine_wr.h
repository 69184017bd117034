// Link work-request ids of an endpoint: what each work request it gives the link belongs to,
// in the id's low bits (the objects named are 8-aligned).
#pragma once

#include <cstdint>

namespace tandem {

enum WrKind : uint64_t {
    kWrTx = 1,       // a TxOp's send, write or read
    kWrBuffer = 2,   // one of the endpoint's receive buffers
    kWrRxRead = 3,   // a rendezvous receive's read of the sender's buffer (RxOp)
    kWrControl = 4,  // a protocol message of the endpoint's own (ControlMsg)
    kWrServed = 5,   // a served RMA's read or write of the initiator's buffer (ServedRma)
    kWrDirect = 6,   // a send_by_link message, reported already: no object behind it
};
inline constexpr uint64_t kWrKindMask = 7;

template <class T>
uint64_t wr_id(T *p, WrKind kind) {
    return reinterpret_cast<uint64_t>(p) | kind;
}
template <class T>
T *wr_ptr(uint64_t id) {
    return reinterpret_cast<T *>(id & ~kWrKindMask);
}

}  // namespace tandem
