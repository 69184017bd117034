// The senders whose cells wait behind an RMA write of theirs. A large node-local write is
// split (split_claims.h): the target copies the first part and the initiator the rest, which
// ends with the initiator's WriteDone. Whatever that initiator sent after the write (a
// message, a read, another write) must not overtake it (FI_ORDER_SAW, RAW, WAW), so the
// inbox's reader keeps that sender's cells, in order, until the write is done, and then hands
// them on through its one dispatch, ahead of anything newer of the sender's in the ring.
//
// The hold is the channel's, not the RMA target's: the RMA target (off_tandem) sets and lifts
// it, but the reader of the inbox (tandem when it is the owner, else off_tandem itself) keeps
// and replays the cells, so that a held message goes to the same decoder as any other.
// Answers to our own operations (Fin, Cts, WriteDone, ReadData, AtomicResp) are never held:
// a WriteDone is what lifts a hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::shm {

class SenderHold {
  public:
    // Cells of `sender` (its address bytes) are kept from now on, until lift(sender).
    void hold(std::string_view sender);
    // The sender's write is done: its kept cells are released, in order, for replay().
    void lift(std::string_view sender);
    // Whether a cell must look at the hold at all: some sender is held, or released cells
    // wait for replay. (Inline, and one load: the reader asks for every cell.)
    bool active() const { return active_; }
    bool has_released() const { return !released_.empty(); }
    // Keeps a copy of the cell if its sender is held (the caller then releases it from the
    // ring); false for a cell that goes on now (an answer, a malformed cell, a free sender).
    bool keep_if_held(const uint8_t *cell);
    // The released cells, in order, each to dispatch(cell), unless its sender was held again
    // meanwhile (a replayed write split once more): then it is kept again, behind the hold.
    // dispatch may hold and lift senders itself.
    template <class Dispatch>
    void replay(Dispatch &&dispatch) {
        while (!released_.empty()) {
            CellCopy cell = std::move(released_.front());
            released_.pop_front();
            if (!keep_copy(cell)) dispatch(static_cast<const uint8_t *>(cell.get()));
            recycle(std::move(cell));
        }
        update();
    }
    // A sender that died: its kept and released cells go, nobody waits for them. `same(sender)`
    // tells whether a sender's address bytes name it.
    template <class Same>
    void forget(Same &&same) {
        std::erase_if(held_, [&](const auto &h) { return same(std::string_view(h.first)); });
        std::erase_if(released_, [&](const CellCopy &c) {
            auto sender = sender_of(c.get());
            return sender && same(*sender);
        });
        update();
    }
    // Senders held now (tests and diagnostics).
    size_t held_senders() const { return held_.size(); }

    // The sender a cell names, for a cell that can be held: nullopt for an answer or a cell
    // whose name does not fit.
    static std::optional<std::string_view> sender_of(const uint8_t *cell);

  private:
    using CellCopy = std::unique_ptr<uint8_t[]>;
    bool keep_copy(CellCopy &cell);
    std::deque<CellCopy> *queue_of(const uint8_t *cell);
    CellCopy copy_of(const uint8_t *cell);
    void recycle(CellCopy cell);
    void update() { active_ = !held_.empty() || !released_.empty(); }

    std::map<std::string, std::deque<CellCopy>, std::less<>> held_;
    std::deque<CellCopy> released_;
    // Copies kept for reuse (up to a default ring's worth): fresh heap memory per cell cost
    // page faults that halved the rate of a stream of split writes.
    static constexpr size_t kSpareCells = 256;
    std::vector<CellCopy> spare_;
    bool active_ = false;
};

}  // namespace tandem::shm
