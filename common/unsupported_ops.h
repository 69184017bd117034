// Complete ops tables for the parts of a fid an object does not implement.
//
// libfabric's inline wrappers call through a fid's tables without checking them
// (fi_atomicvalid(ep, ...) is ep->atomic->writevalid(...)), so a NULL table or entry is a
// crash in the application, never an error it can handle. Every fid tandem or off_tandem hands
// out carries a full table for each of its parts; a part it does not offer gets one of these,
// whose every entry returns a negative fabric errno.
#pragma once

#include "common/fid_adaptor.h"

#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

namespace tandem {

// Like enosys, for operations that exist but that this object does not offer (-FI_EOPNOTSUPP:
// fi_atomic(3) and fi_collective(3) name it for an operation the endpoint does not support).
template <class FnPtr>
struct OpNotSupported;

template <class R, class... A>
struct OpNotSupported<R (*)(A...)> {
    static R call(A...) noexcept { return error_return<R>(-FI_EOPNOTSUPP); }
};

template <class FnPtr>
inline constexpr FnPtr eopnotsupp = &OpNotSupported<FnPtr>::call;

// No atomics: every call -FI_EOPNOTSUPP, the *valid queries included.
inline fi_ops_atomic kNoAtomicOps = {
    .size = sizeof(fi_ops_atomic),
    .write = eopnotsupp<decltype(fi_ops_atomic::write)>,
    .writev = eopnotsupp<decltype(fi_ops_atomic::writev)>,
    .writemsg = eopnotsupp<decltype(fi_ops_atomic::writemsg)>,
    .inject = eopnotsupp<decltype(fi_ops_atomic::inject)>,
    .readwrite = eopnotsupp<decltype(fi_ops_atomic::readwrite)>,
    .readwritev = eopnotsupp<decltype(fi_ops_atomic::readwritev)>,
    .readwritemsg = eopnotsupp<decltype(fi_ops_atomic::readwritemsg)>,
    .compwrite = eopnotsupp<decltype(fi_ops_atomic::compwrite)>,
    .compwritev = eopnotsupp<decltype(fi_ops_atomic::compwritev)>,
    .compwritemsg = eopnotsupp<decltype(fi_ops_atomic::compwritemsg)>,
    .writevalid = eopnotsupp<decltype(fi_ops_atomic::writevalid)>,
    .readwritevalid = eopnotsupp<decltype(fi_ops_atomic::readwritevalid)>,
    .compwritevalid = eopnotsupp<decltype(fi_ops_atomic::compwritevalid)>,
};

// No collectives: every call -FI_EOPNOTSUPP.
inline fi_ops_collective kNoCollectiveOps = {
    .size = sizeof(fi_ops_collective),
    .barrier = eopnotsupp<decltype(fi_ops_collective::barrier)>,
    .broadcast = eopnotsupp<decltype(fi_ops_collective::broadcast)>,
    .alltoall = eopnotsupp<decltype(fi_ops_collective::alltoall)>,
    .allreduce = eopnotsupp<decltype(fi_ops_collective::allreduce)>,
    .allgather = eopnotsupp<decltype(fi_ops_collective::allgather)>,
    .reduce_scatter = eopnotsupp<decltype(fi_ops_collective::reduce_scatter)>,
    .reduce = eopnotsupp<decltype(fi_ops_collective::reduce)>,
    .scatter = eopnotsupp<decltype(fi_ops_collective::scatter)>,
    .gather = eopnotsupp<decltype(fi_ops_collective::gather)>,
    .msg = eopnotsupp<decltype(fi_ops_collective::msg)>,
    .barrier2 = eopnotsupp<decltype(fi_ops_collective::barrier2)>,
};

// No connection management (a shared receive context, an offload endpoint): -FI_ENOSYS.
inline fi_ops_cm kNoCmOps = {
    .size = sizeof(fi_ops_cm),
    .setname = enosys<decltype(fi_ops_cm::setname)>,
    .getname = enosys<decltype(fi_ops_cm::getname)>,
    .getpeer = enosys<decltype(fi_ops_cm::getpeer)>,
    .connect = enosys<decltype(fi_ops_cm::connect)>,
    .listen = enosys<decltype(fi_ops_cm::listen)>,
    .accept = enosys<decltype(fi_ops_cm::accept)>,
    .reject = enosys<decltype(fi_ops_cm::reject)>,
    .shutdown = enosys<decltype(fi_ops_cm::shutdown)>,
    .join = enosys<decltype(fi_ops_cm::join)>,
};

// No messages: -FI_ENOSYS.
inline fi_ops_msg kNoMsgOps = {
    .size = sizeof(fi_ops_msg),
    .recv = enosys<decltype(fi_ops_msg::recv)>,
    .recvv = enosys<decltype(fi_ops_msg::recvv)>,
    .recvmsg = enosys<decltype(fi_ops_msg::recvmsg)>,
    .send = enosys<decltype(fi_ops_msg::send)>,
    .sendv = enosys<decltype(fi_ops_msg::sendv)>,
    .sendmsg = enosys<decltype(fi_ops_msg::sendmsg)>,
    .inject = enosys<decltype(fi_ops_msg::inject)>,
    .senddata = enosys<decltype(fi_ops_msg::senddata)>,
    .injectdata = enosys<decltype(fi_ops_msg::injectdata)>,
};

// No tagged messages: -FI_ENOSYS.
inline fi_ops_tagged kNoTaggedOps = {
    .size = sizeof(fi_ops_tagged),
    .recv = enosys<decltype(fi_ops_tagged::recv)>,
    .recvv = enosys<decltype(fi_ops_tagged::recvv)>,
    .recvmsg = enosys<decltype(fi_ops_tagged::recvmsg)>,
    .send = enosys<decltype(fi_ops_tagged::send)>,
    .sendv = enosys<decltype(fi_ops_tagged::sendv)>,
    .sendmsg = enosys<decltype(fi_ops_tagged::sendmsg)>,
    .inject = enosys<decltype(fi_ops_tagged::inject)>,
    .senddata = enosys<decltype(fi_ops_tagged::senddata)>,
    .injectdata = enosys<decltype(fi_ops_tagged::injectdata)>,
};

// No RMA: -FI_ENOSYS.
inline fi_ops_rma kNoRmaOps = {
    .size = sizeof(fi_ops_rma),
    .read = enosys<decltype(fi_ops_rma::read)>,
    .readv = enosys<decltype(fi_ops_rma::readv)>,
    .readmsg = enosys<decltype(fi_ops_rma::readmsg)>,
    .write = enosys<decltype(fi_ops_rma::write)>,
    .writev = enosys<decltype(fi_ops_rma::writev)>,
    .writemsg = enosys<decltype(fi_ops_rma::writemsg)>,
    .inject = enosys<decltype(fi_ops_rma::inject)>,
    .writedata = enosys<decltype(fi_ops_rma::writedata)>,
    .injectdata = enosys<decltype(fi_ops_rma::injectdata)>,
};

// Gives every part of an endpoint-shaped fid (fid_ep) that is still NULL the table above, so
// an object fills in what it implements and this completes the rest. (The tables are not
// const because fid_ep's members are plain pointers; nothing writes through them.)
inline void complete_ep_tables(fid_ep &ep) noexcept {
    if (!ep.cm) ep.cm = &kNoCmOps;
    if (!ep.msg) ep.msg = &kNoMsgOps;
    if (!ep.rma) ep.rma = &kNoRmaOps;
    if (!ep.tagged) ep.tagged = &kNoTaggedOps;
    if (!ep.atomic) ep.atomic = &kNoAtomicOps;
    if (!ep.collective) ep.collective = &kNoCollectiveOps;
}

}  // namespace tandem
