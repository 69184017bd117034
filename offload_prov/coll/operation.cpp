#include "offload_prov/coll/operation.h"

#include "hmem/atomic.h"

#include <rdma/fi_errno.h>

#include <cstring>

namespace tandem::off::coll {

Operation::Operation(Schedule schedule, const void *send, void *recv, int datatype, int op,
                     uint64_t tag_base)
    : schedule_(std::move(schedule)),
      send_(static_cast<const uint8_t *>(send)),
      recv_(static_cast<uint8_t *>(recv)),
      scratch_(schedule_.scratch),
      datatype_(datatype),
      op_(op),
      tag_base_(tag_base) {}

// Span -> address, or null for a buffer the call did not give. A span into Send is only ever
// read (the caller's const input).
uint8_t *Operation::resolve(const Span &s) {
    switch (s.buf) {
        case Buf::Send:
            return send_ ? const_cast<uint8_t *>(send_) + s.offset : nullptr;
        case Buf::Recv:
            return recv_ ? recv_ + s.offset : nullptr;
        case Buf::Scratch:
            return scratch_.data() + s.offset;
    }
    return nullptr;
}

int Operation::run_steps(const std::vector<Step> &steps) {
    const size_t elem = atomic::datatype_size(datatype_);
    for (const Step &st : steps) {
        uint8_t *dst = resolve(st.dst);
        uint8_t *src = resolve(st.src);
        if (!st.dst.len) continue;
        if (!dst || !src) return FI_EINVAL;  // a buffer the call did not give
        switch (st.kind) {
            case Step::Kind::Copy:
                if (dst != src) memmove(dst, src, st.dst.len);
                break;
            case Step::Kind::Reduce:
                if (atomic::reduce(op_, datatype_, dst, src, st.dst.len / elem)) return FI_EINVAL;
                break;
            case Step::Kind::ReduceInto:
                if (atomic::reduce(op_, datatype_, src, dst, st.dst.len / elem)) return FI_EINVAL;
                memcpy(dst, src, st.dst.len);
                break;
        }
    }
    return 0;
}

int Operation::start_round(Transport &t) {
    Round &r = schedule_.rounds[round_];
    const uint64_t tag = tag_base_ | round_;
    // Receives first, so that a peer's message finds its buffer rather than the unexpected queue.
    for (; recvs_started_ < r.recvs.size(); ++recvs_started_) {
        const Transfer &x = r.recvs[recvs_started_];
        int ret = t.recv(x.peer, tag, resolve(x.span), x.span.len, this);
        if (ret) return ret;
        ++in_flight_;
    }
    for (; sends_started_ < r.sends.size(); ++sends_started_) {
        const Transfer &x = r.sends[sends_started_];
        int ret = t.send(x.peer, tag, resolve(x.span), x.span.len, this);
        if (ret) return ret;
        ++in_flight_;
    }
    return 0;
}

bool Operation::progress(Transport &t) {
    if (finished_) return true;
    if (!began_) {
        began_ = true;
        if (!status_)
            if (int err = run_steps(schedule_.before)) fail(err);
    }
    while (!status_ && round_ < schedule_.rounds.size()) {
        Round &r = schedule_.rounds[round_];
        int ret = start_round(t);
        if (ret == -FI_EAGAIN) return false;
        if (ret) {
            fail(-ret);
            break;
        }
        if (in_flight_) return false;  // (recvs_started_ == r.recvs.size(): all started)
        if (int err = run_steps(r.after)) {
            fail(err);
            break;
        }
        ++round_;
        recvs_started_ = sends_started_ = 0;
    }
    if (in_flight_) return false;
    finished_ = true;
    return true;
}

void Operation::transfer_done(int err) {
    --in_flight_;
    if (err && !status_) status_ = err;
}

void Operation::fail(int err) {
    if (!status_) status_ = err;
}

}  // namespace tandem::off::coll
