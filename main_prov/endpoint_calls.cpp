// The adapter's RMA, atomic and collective calls (fi_rma(3), fi_atomic(3), fi_collective(3)):
// each form maps onto one of the engine's posts (post_rma, post_atomic, post_collective), and
// the tables that hold them. The message and tagged calls are in endpoint_data.cpp, compiled
// with the engine's small-message path they inline.
#include "common/fabric_error.h"
#include "hmem/atomic_target.h"
#include "main_prov/endpoint.h"
#include "main_prov/endpoint_alias.h"
#include "main_prov/tx_request.h"

namespace tandem {

namespace {

// A call naming one buffer, as the message of the *msg form.
fi_msg_atomic one_msg(const fi_ioc &ioc, void **desc, fi_addr_t dest, const fi_rma_ioc &rma,
                      enum fi_datatype datatype, enum fi_op op, void *context) {
    fi_msg_atomic m{};
    m.msg_iov = &ioc;
    m.desc = desc;
    m.iov_count = 1;
    m.addr = dest;
    m.rma_iov = &rma;
    m.rma_iov_count = 1;
    m.datatype = datatype;
    m.op = op;
    m.context = context;
    return m;
}

using atomic::element_count;

ssize_t rma_read(Engine &e, const OpDefaults &d, void *buf, size_t len, void *desc, fi_addr_t src,
                 uint64_t addr, uint64_t key, void *context) {
    iovec iov{buf, len};
    return e.post_rma({&iov, &desc, 1, src, addr, key, context, d.tx, 0, false});
}

ssize_t rma_readv(Engine &e, const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                  fi_addr_t src, uint64_t addr, uint64_t key, void *context) {
    return e.post_rma({iov, desc, count, src, addr, key, context, d.tx, 0, false});
}

ssize_t rma_readmsg(Engine &e, const OpDefaults &, const fi_msg_rma *msg, uint64_t flags) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    return e.post_rma({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->rma_iov[0].addr,
                       msg->rma_iov[0].key, msg->context, flags & ~kNoCompletion, msg->data,
                       false});
}

ssize_t rma_write(Engine &e, const OpDefaults &d, const void *buf, size_t len, void *desc,
                  fi_addr_t dest, uint64_t addr, uint64_t key, void *context) {
    iovec iov{const_cast<void *>(buf), len};
    return e.post_rma({&iov, &desc, 1, dest, addr, key, context, d.tx, 0, true});
}

ssize_t rma_writev(Engine &e, const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                   fi_addr_t dest, uint64_t addr, uint64_t key, void *context) {
    return e.post_rma({iov, desc, count, dest, addr, key, context, d.tx, 0, true});
}

ssize_t rma_writemsg(Engine &e, const OpDefaults &, const fi_msg_rma *msg, uint64_t flags) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    return e.post_rma({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->rma_iov[0].addr,
                       msg->rma_iov[0].key, msg->context, flags & ~kNoCompletion, msg->data, true});
}

ssize_t rma_inject(Engine &e, const OpDefaults &, const void *buf, size_t len, fi_addr_t dest,
                   uint64_t addr, uint64_t key) {
    iovec iov{const_cast<void *>(buf), len};
    return e.post_rma(
        {&iov, nullptr, 1, dest, addr, key, nullptr, FI_INJECT | kNoCompletion, 0, true});
}

ssize_t rma_writedata(Engine &e, const OpDefaults &d, const void *buf, size_t len, void *desc,
                      uint64_t data, fi_addr_t dest, uint64_t addr, uint64_t key, void *context) {
    iovec iov{const_cast<void *>(buf), len};
    return e.post_rma(
        {&iov, &desc, 1, dest, addr, key, context, d.tx | FI_REMOTE_CQ_DATA, data, true});
}

ssize_t rma_injectdata(Engine &e, const OpDefaults &, const void *buf, size_t len, uint64_t data,
                       fi_addr_t dest, uint64_t addr, uint64_t key) {
    iovec iov{const_cast<void *>(buf), len};
    return e.post_rma({&iov, nullptr, 1, dest, addr, key, nullptr,
                       FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, data, true});
}

ssize_t atomic_write(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                     fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype datatype,
                     enum fi_op op, void *context) {
    fi_ioc ioc{const_cast<void *>(buf), count};
    fi_rma_ioc rma{addr, count, key};
    return e.post_atomic(
        {one_msg(ioc, &desc, dest, rma, datatype, op, context), atomic::Kind::Base, d.tx});
}

ssize_t atomic_writev(Engine &e, const OpDefaults &d, const fi_ioc *iov, void **desc, size_t count,
                      fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype datatype,
                      enum fi_op op, void *context) {
    fi_rma_ioc rma{addr, iov ? element_count(iov, count) : 0, key};
    fi_msg_atomic m{iov, desc, count, dest, &rma, 1, datatype, op, context, 0};
    return e.post_atomic({m, atomic::Kind::Base, d.tx});
}

ssize_t atomic_writemsg(Engine &e, const OpDefaults &, const fi_msg_atomic *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return e.post_atomic({*msg, atomic::Kind::Base, flags & ~kNoCompletion});
}

ssize_t atomic_inject(Engine &e, const OpDefaults &, const void *buf, size_t count, fi_addr_t dest,
                      uint64_t addr, uint64_t key, enum fi_datatype datatype, enum fi_op op) {
    fi_ioc ioc{const_cast<void *>(buf), count};
    fi_rma_ioc rma{addr, count, key};
    return e.post_atomic({one_msg(ioc, nullptr, dest, rma, datatype, op, nullptr),
                          atomic::Kind::Base, FI_INJECT | kNoCompletion});
}

ssize_t atomic_readwrite(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                         void *result, void *result_desc, fi_addr_t dest, uint64_t addr,
                         uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context) {
    fi_ioc ioc{const_cast<void *>(buf), count};
    fi_ioc res{result, count};
    fi_rma_ioc rma{addr, count, key};
    AtomicCall a{one_msg(ioc, &desc, dest, rma, datatype, op, context), atomic::Kind::Fetch, d.tx};
    return e.post_atomic(a.with_result(&res, &result_desc, 1));
}

ssize_t atomic_readwritev(Engine &e, const OpDefaults &d, const fi_ioc *iov, void **desc,
                          size_t count, fi_ioc *resultv, void **result_desc, size_t result_count,
                          fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype datatype,
                          enum fi_op op, void *context) {
    fi_rma_ioc rma{addr, iov ? element_count(iov, count) : 0, key};
    AtomicCall a{
        {iov, desc, count, dest, &rma, 1, datatype, op, context, 0}, atomic::Kind::Fetch, d.tx};
    return e.post_atomic(a.with_result(resultv, result_desc, result_count));
}

ssize_t atomic_readwritemsg(Engine &e, const OpDefaults &, const fi_msg_atomic *msg,
                            fi_ioc *resultv, void **result_desc, size_t result_count,
                            uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    AtomicCall a{*msg, atomic::Kind::Fetch, flags & ~kNoCompletion};
    return e.post_atomic(a.with_result(resultv, result_desc, result_count));
}

ssize_t atomic_compwrite(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                         const void *compare, void *compare_desc, void *result, void *result_desc,
                         fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype datatype,
                         enum fi_op op, void *context) {
    fi_ioc ioc{const_cast<void *>(buf), count};
    fi_ioc cmp{const_cast<void *>(compare), count};
    fi_ioc res{result, count};
    fi_rma_ioc rma{addr, count, key};
    AtomicCall a{one_msg(ioc, &desc, dest, rma, datatype, op, context), atomic::Kind::Compare,
                 d.tx};
    a.compare = &cmp;
    a.compare_desc = &compare_desc;
    a.compare_count = 1;
    return e.post_atomic(a.with_result(&res, &result_desc, 1));
}

ssize_t atomic_compwritev(Engine &e, const OpDefaults &d, const fi_ioc *iov, void **desc,
                          size_t count, const fi_ioc *comparev, void **compare_desc,
                          size_t compare_count, fi_ioc *resultv, void **result_desc,
                          size_t result_count, fi_addr_t dest, uint64_t addr, uint64_t key,
                          enum fi_datatype datatype, enum fi_op op, void *context) {
    fi_rma_ioc rma{addr, iov ? element_count(iov, count) : 0, key};
    AtomicCall a{
        {iov, desc, count, dest, &rma, 1, datatype, op, context, 0}, atomic::Kind::Compare, d.tx};
    a.compare = comparev;
    a.compare_desc = compare_desc;
    a.compare_count = compare_count;
    return e.post_atomic(a.with_result(resultv, result_desc, result_count));
}

ssize_t atomic_compwritemsg(Engine &e, const OpDefaults &, const fi_msg_atomic *msg,
                            const fi_ioc *comparev, void **compare_desc, size_t compare_count,
                            fi_ioc *resultv, void **result_desc, size_t result_count,
                            uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    AtomicCall a{*msg, atomic::Kind::Compare, flags & ~kNoCompletion};
    a.compare = comparev;
    a.compare_desc = compare_desc;
    a.compare_count = compare_count;
    return e.post_atomic(a.with_result(resultv, result_desc, result_count));
}

// fi_atomicvalid, fi_fetch_atomicvalid and fi_compare_atomicvalid: the kind is the call's.
template <atomic::Kind K>
int atomic_valid(Engine &e, const OpDefaults &, enum fi_datatype datatype, enum fi_op op,
                 size_t *count) {
    if (!(e.caps() & FI_ATOMIC)) return -FI_EOPNOTSUPP;
    return atomic::query(K, datatype, op, count);
}

ssize_t coll_barrier2(Engine &e, const OpDefaults &d, fi_addr_t coll_addr, uint64_t flags,
                      void *context) {
    Engine::CollCall c;
    c.coll = FI_BARRIER;
    c.coll_addr = coll_addr;
    c.flags = flags | d.tx;
    c.context = context;
    return e.post_collective(c);
}

ssize_t coll_barrier(Engine &e, const OpDefaults &d, fi_addr_t coll_addr, void *context) {
    return coll_barrier2(e, d, coll_addr, 0, context);
}

ssize_t coll_broadcast(Engine &e, const OpDefaults &d, void *buf, size_t count, void *desc,
                       fi_addr_t coll_addr, fi_addr_t root_addr, enum fi_datatype datatype,
                       uint64_t flags, void *context) {
    Engine::CollCall c{
        FI_BROADCAST,       nullptr, nullptr,      buf,    desc, count, coll_addr, root_addr,
        raw_enum(datatype), FI_NOOP, flags | d.tx, context};
    return e.post_collective(c);
}

ssize_t coll_alltoall(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                      void *result, void *result_desc, fi_addr_t coll_addr,
                      enum fi_datatype datatype, uint64_t flags, void *context) {
    Engine::CollCall c{FI_ALLTOALL,        buf,     desc,         result,
                       result_desc,        count,   coll_addr,    FI_ADDR_NOTAVAIL,
                       raw_enum(datatype), FI_NOOP, flags | d.tx, context};
    return e.post_collective(c);
}

ssize_t coll_allreduce(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                       void *result, void *result_desc, fi_addr_t coll_addr,
                       enum fi_datatype datatype, enum fi_op op, uint64_t flags, void *context) {
    Engine::CollCall c{FI_ALLREDUCE,       buf,          desc,         result,
                       result_desc,        count,        coll_addr,    FI_ADDR_NOTAVAIL,
                       raw_enum(datatype), raw_enum(op), flags | d.tx, context};
    return e.post_collective(c);
}

ssize_t coll_allgather(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                       void *result, void *result_desc, fi_addr_t coll_addr,
                       enum fi_datatype datatype, uint64_t flags, void *context) {
    Engine::CollCall c{FI_ALLGATHER,       buf,     desc,         result,
                       result_desc,        count,   coll_addr,    FI_ADDR_NOTAVAIL,
                       raw_enum(datatype), FI_NOOP, flags | d.tx, context};
    return e.post_collective(c);
}

ssize_t coll_reduce_scatter(Engine &e, const OpDefaults &d, const void *buf, size_t count,
                            void *desc, void *result, void *result_desc, fi_addr_t coll_addr,
                            enum fi_datatype datatype, enum fi_op op, uint64_t flags,
                            void *context) {
    Engine::CollCall c{FI_REDUCE_SCATTER,  buf,          desc,         result,
                       result_desc,        count,        coll_addr,    FI_ADDR_NOTAVAIL,
                       raw_enum(datatype), raw_enum(op), flags | d.tx, context};
    return e.post_collective(c);
}

ssize_t coll_reduce(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                    void *result, void *result_desc, fi_addr_t coll_addr, fi_addr_t root_addr,
                    enum fi_datatype datatype, enum fi_op op, uint64_t flags, void *context) {
    Engine::CollCall c{FI_REDUCE,          buf,          desc,         result,
                       result_desc,        count,        coll_addr,    root_addr,
                       raw_enum(datatype), raw_enum(op), flags | d.tx, context};
    return e.post_collective(c);
}

ssize_t coll_scatter(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                     void *result, void *result_desc, fi_addr_t coll_addr, fi_addr_t root_addr,
                     enum fi_datatype datatype, uint64_t flags, void *context) {
    Engine::CollCall c{FI_SCATTER,         buf,     desc,         result,
                       result_desc,        count,   coll_addr,    root_addr,
                       raw_enum(datatype), FI_NOOP, flags | d.tx, context};
    return e.post_collective(c);
}

ssize_t coll_gather(Engine &e, const OpDefaults &d, const void *buf, size_t count, void *desc,
                    void *result, void *result_desc, fi_addr_t coll_addr, fi_addr_t root_addr,
                    enum fi_datatype datatype, uint64_t flags, void *context) {
    Engine::CollCall c{FI_GATHER,          buf,     desc,         result,
                       result_desc,        count,   coll_addr,    root_addr,
                       raw_enum(datatype), FI_NOOP, flags | d.tx, context};
    return e.post_collective(c);
}

// fi_collective_msg: one fi_ioc each way (the calls' buffers as lists of one); the flags
// replace the endpoint's defaults, as for the other *msg calls.
ssize_t coll_msg(Engine &e, const OpDefaults &, const fi_msg_collective *msg, fi_ioc *resultv,
                 void **result_desc, size_t result_count, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    if (msg->iov_count > 1 || result_count > 1) return -FI_EINVAL;
    const int coll = raw_enum(msg->coll);
    const bool bcast = coll == FI_BROADCAST;
    Engine::CollCall c;
    c.coll = coll;
    c.coll_addr = msg->coll_addr;
    c.root = msg->root_addr;
    c.datatype = raw_enum(msg->datatype);
    c.op = raw_enum(msg->op);
    c.flags = flags;
    c.context = msg->context;
    if (msg->iov_count == 1) {
        if (!msg->msg_iov) return -FI_EINVAL;
        c.count = msg->msg_iov[0].count;
        void *desc = msg->desc ? msg->desc[0] : nullptr;
        if (bcast) {
            c.result = msg->msg_iov[0].addr;
            c.result_desc = desc;
        } else {
            c.buf = msg->msg_iov[0].addr;
            c.desc = desc;
        }
    }
    if (result_count == 1 && !bcast) {
        if (!resultv) return -FI_EINVAL;
        c.result = resultv[0].addr;
        c.result_desc = result_desc ? result_desc[0] : nullptr;
        if (msg->iov_count == 0) c.count = resultv[0].count;
    }
    return e.post_collective(c);
}

}  // namespace

fi_ops_rma ep_rma_ops = {
    .size = sizeof(fi_ops_rma),
    .read = &DataCall<&rma_read>::call,
    .readv = &DataCall<&rma_readv>::call,
    .readmsg = &DataCall<&rma_readmsg>::call,
    .write = &DataCall<&rma_write>::call,
    .writev = &DataCall<&rma_writev>::call,
    .writemsg = &DataCall<&rma_writemsg>::call,
    .inject = &DataCall<&rma_inject>::call,
    .writedata = &DataCall<&rma_writedata>::call,
    .injectdata = &DataCall<&rma_injectdata>::call,
};

fi_ops_atomic ep_atomic_ops = {
    .size = sizeof(fi_ops_atomic),
    .write = &DataCall<&atomic_write>::call,
    .writev = &DataCall<&atomic_writev>::call,
    .writemsg = &DataCall<&atomic_writemsg>::call,
    .inject = &DataCall<&atomic_inject>::call,
    .readwrite = &DataCall<&atomic_readwrite>::call,
    .readwritev = &DataCall<&atomic_readwritev>::call,
    .readwritemsg = &DataCall<&atomic_readwritemsg>::call,
    .compwrite = &DataCall<&atomic_compwrite>::call,
    .compwritev = &DataCall<&atomic_compwritev>::call,
    .compwritemsg = &DataCall<&atomic_compwritemsg>::call,
    .writevalid = &DataCall<&atomic_valid<atomic::Kind::Base>>::call,
    .readwritevalid = &DataCall<&atomic_valid<atomic::Kind::Fetch>>::call,
    .compwritevalid = &DataCall<&atomic_valid<atomic::Kind::Compare>>::call,
};

fi_ops_collective ep_coll_ops = {
    .size = sizeof(fi_ops_collective),
    .barrier = &DataCall<&coll_barrier>::call,
    .broadcast = &DataCall<&coll_broadcast>::call,
    .alltoall = &DataCall<&coll_alltoall>::call,
    .allreduce = &DataCall<&coll_allreduce>::call,
    .allgather = &DataCall<&coll_allgather>::call,
    .reduce_scatter = &DataCall<&coll_reduce_scatter>::call,
    .reduce = &DataCall<&coll_reduce>::call,
    .scatter = &DataCall<&coll_scatter>::call,
    .gather = &DataCall<&coll_gather>::call,
    .msg = &DataCall<&coll_msg>::call,
    .barrier2 = &DataCall<&coll_barrier2>::call,
};

}  // namespace tandem
