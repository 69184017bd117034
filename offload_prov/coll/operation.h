// Runs one rank's schedule of a collective over a transport: round after round, it starts the
// round's receives and sends, and once all of them have completed it runs the round's local
// steps (copies, reductions through the one engine, hmem/atomic.h) and goes on. A transfer's
// tag is the operation's tag base with the round's index, so a sender and its receiver meet
// whatever else the two ranks have in flight.
#pragma once

#include "offload_prov/coll/schedule.h"

#include <cstdint>
#include <vector>

namespace tandem::off::coll {

// How an operation's transfers travel (peer transfers on the owner's endpoint in the provider,
// an in-process exchange in the tests). A started transfer ends with one call of
// Operation::transfer_done on the operation given.
class Operation;
class Transport {
  public:
    virtual ~Transport() = default;
    // 0: started; -FI_EAGAIN: no room now, asked again at a later progress; another negative
    // fabric errno: the operation fails with it.
    virtual int send(uint32_t peer, uint64_t tag, const void *buf, size_t len, Operation *op) = 0;
    virtual int recv(uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *op) = 0;
};

class Operation {
  public:
    // send / recv: the call's host buffers (the executor never sees device memory: the caller
    // stages it). tag_base has the low 12 bits free for the round.
    Operation(Schedule schedule, const void *send, void *recv, int datatype, int op,
              uint64_t tag_base);

    // Starts what it can; true once the operation has finished (successfully or not: status).
    bool progress(Transport &t);
    // One started transfer ended: 0, or the positive fabric errno it failed with.
    void transfer_done(int err);
    bool finished() const { return finished_; }
    int status() const { return status_; }           // 0, or a positive fabric errno
    size_t in_flight() const { return in_flight_; }  // transfers started, not ended
    // Fails it now (a member died, the group closes); transfers in flight still end through
    // transfer_done, which the owner waits for before it frees the operation.
    void fail(int err);

  private:
    uint8_t *resolve(const Span &s);
    int run_steps(const std::vector<Step> &steps);
    int start_round(Transport &t);

    Schedule schedule_;
    const uint8_t *send_;
    uint8_t *recv_;
    std::vector<uint8_t> scratch_;
    int datatype_, op_;
    uint64_t tag_base_;
    size_t round_ = 0;
    size_t recvs_started_ = 0, sends_started_ = 0;  // of the current round
    size_t in_flight_ = 0;
    bool began_ = false, finished_ = false;
    int status_ = 0;
};

}  // namespace tandem::off::coll
