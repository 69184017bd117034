// Checks that an ops table a provider handed out is complete: libfabric's inline wrappers call
// through the tables without looking (fi_atomicvalid(ep, ...) is ep->atomic->writevalid(...)),
// so a NULL table or entry crashes the application where an error belongs.
#pragma once

#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <cstring>
#include <string>

namespace tandem_test {

// Every fi_ops_* structure is a size_t followed by function pointers only. The table must
// cover at least the structure of the headers we build against (so no wrapper of these headers
// finds an entry missing), and no entry may be NULL.
template <class Ops>
void expect_complete_table(const std::string &what, const Ops *ops) {
    ASSERT_NE(ops, nullptr) << what << ": no ops table";
    size_t size;
    std::memcpy(&size, ops, sizeof size);
    EXPECT_GE(size, sizeof(Ops)) << what << ": table smaller than this libfabric's";
    using Fn = void (*)();
    constexpr size_t entries = (sizeof(Ops) - sizeof(size_t)) / sizeof(Fn);
    static_assert(sizeof(size_t) + entries * sizeof(Fn) == sizeof(Ops));
    const auto *first = reinterpret_cast<const unsigned char *>(ops) + sizeof(size_t);
    for (size_t i = 0; i < entries; ++i) {
        Fn fn;
        std::memcpy(&fn, first + i * sizeof fn, sizeof fn);
        EXPECT_NE(fn, nullptr) << what << ": entry " << i << " is NULL";
    }
}

inline void expect_complete_fid(const std::string &what, const fid *f) {
    ASSERT_NE(f, nullptr) << what;
    expect_complete_table(what + " fi_ops", f->ops);
}

// Any endpoint-shaped fid: an endpoint, an alias, a shared receive or transmit context.
inline void expect_complete_ep(const std::string &what, const fid_ep *ep) {
    ASSERT_NE(ep, nullptr) << what;
    expect_complete_fid(what, &ep->fid);
    expect_complete_table(what + " ops", ep->ops);
    expect_complete_table(what + " cm", ep->cm);
    expect_complete_table(what + " msg", ep->msg);
    expect_complete_table(what + " rma", ep->rma);
    expect_complete_table(what + " tagged", ep->tagged);
    expect_complete_table(what + " atomic", ep->atomic);
    expect_complete_table(what + " collective", ep->collective);
}

inline void expect_complete_domain(const std::string &what, const fid_domain *d) {
    ASSERT_NE(d, nullptr) << what;
    expect_complete_fid(what, &d->fid);
    expect_complete_table(what + " ops", d->ops);
    expect_complete_table(what + " mr", d->mr);
}

inline void expect_complete_fabric(const std::string &what, const fid_fabric *f) {
    ASSERT_NE(f, nullptr) << what;
    expect_complete_fid(what, &f->fid);
    expect_complete_table(what + " ops", f->ops);
}

inline void expect_complete_cq(const std::string &what, const fid_cq *cq) {
    ASSERT_NE(cq, nullptr) << what;
    expect_complete_fid(what, &cq->fid);
    expect_complete_table(what + " ops", cq->ops);
}

inline void expect_complete_eq(const std::string &what, const fid_eq *eq) {
    ASSERT_NE(eq, nullptr) << what;
    expect_complete_fid(what, &eq->fid);
    expect_complete_table(what + " ops", eq->ops);
}

inline void expect_complete_av(const std::string &what, const fid_av *av) {
    ASSERT_NE(av, nullptr) << what;
    expect_complete_fid(what, &av->fid);
    expect_complete_table(what + " ops", av->ops);
}

inline void expect_complete_av_set(const std::string &what, const fid_av_set *set) {
    ASSERT_NE(set, nullptr) << what;
    expect_complete_fid(what, &set->fid);
    expect_complete_table(what + " ops", set->ops);
}

}  // namespace tandem_test
