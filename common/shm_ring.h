// ShmRing: a bounded multi-producer, single-consumer queue of fixed-size cells that lives
// inside shared memory, so that several processes on a node can post to one process's
// queue without a lock or a system call.
//
// Positions count up from 0 and never wrap in practice (64 bits); position p lives in cell
// p % cells. Three words decide everything:
//  - each cell's *owner word* (an array of its own, away from the cells) holds the last
//    position claimed in that cell and its claimant's id. A producer claims position p by
//    compare-exchanging it from the previous lap's stamp (p - cells) to (p, its id): the one
//    locked instruction of a send, and it leaves every claimed cell naming its producer;
//  - each cell's *sequence* becomes p + 1 when the producer publishes position p (a plain
//    release store; the consumer never writes it);
//  - `head` is the consumer's next position, stored (release) once it has read a cell.
// Position p is free when the consumer is past p - cells. A producer knows that from the
// head it read last (a ProducerView it keeps), and reads `head` again only when that says the
// ring may be full: the line the consumer writes on every cell is not fetched on every send.
// `tail` is only a hint of where to start looking, stored without a locked instruction:
// every position below any value it ever holds has been claimed (a producer stores p + 1
// only after claiming p, and claims p only after finding every position from its own start
// to p claimed), so starting from a stale value costs a few steps, never a lost cell.
//
// A producer that dies between try_reserve() and publish() can be told from a slow one by
// its stamp: reclaim_dead() hands such a cell back (head moves past it) and the consumer
// moves on to the cells behind it. Without that, the consumer would stop at that cell for
// ever and producers would stop once the ring is full.
//
// Sleep: a consumer that wants to sleep calls arm() and sleeps only if it returns false. A
// producer learns in try_reserve (ProducerView::wake) whether the consumer was armed, reading
// the flag after its claim, and then calls take_wake() after publishing; the one of them that
// wins take_wake() wakes the consumer. arm() stores the flag and then looks for a claim or a
// publish at head: the producer's claim and the consumer's store are both sequentially
// consistent, so either the producer sees the flag or the consumer sees the claim and stays
// awake (a claimed cell is about to be published). No fence on the producer's side.
//
// Everything in the ring is an offset from the ring itself, never a pointer, because each
// process maps the memory at its own address. Peers are the same user (the segment is 0600)
// and trusted not to scribble on it. A ring starts as zeroed memory (a fresh segment) plus
// its header line: init() touches no cell, so an endpoint's inbox costs resident memory only
// for the cells traffic has used.
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <new>
#include <sys/types.h>
#include <type_traits>

namespace tandem {

class ShmRing {
  public:
    // Fixed rather than std::hardware_destructive_interference_size: processes built by
    // different compilers must agree on the layout.
    static constexpr size_t kCacheLine = 64;
    static constexpr uint32_t kMaxCells = 1u << 24;
    static constexpr uint32_t kMaxCellSize = 1u << 20;

    // What one producer keeps of one ring between its calls (process-local memory).
    struct ProducerView {
        uint64_t head = 0;  // the consumer's head, as last read
        bool wake = false;  // the last try_reserve found the consumer armed: take_wake()
    };

    // Bytes of shared memory a ring of `cells` cells of `cell_size` payload bytes takes, or 0
    // when cells is not a power of two in [2, kMaxCells] or cell_size not in
    // [1, kMaxCellSize].
    static size_t bytes_for(uint32_t cells, uint32_t cell_size) {
        if (cells < 2 || cells > kMaxCells || (cells & (cells - 1)) != 0) return 0;
        if (cell_size == 0 || cell_size > kMaxCellSize) return 0;
        return sizeof(ShmRing) + size_t(cells) * stride_for(cell_size) + owners_bytes(cells);
    }

    // Builds an empty ring in `mem` (kCacheLine-aligned, bytes_for(cells, cell_size) long).
    // Called once, by the consumer, before any producer attaches. `zeroed`: the memory is
    // known to be all zero bytes (a fresh shared-memory object), so no cell needs writing and
    // none becomes resident before traffic uses it. nullptr on bad arguments.
    static ShmRing *init(void *mem, uint32_t cells, uint32_t cell_size, bool zeroed = false) {
        if (bytes_for(cells, cell_size) == 0 || !aligned(mem)) return nullptr;
        auto *ring = new (mem) ShmRing();
        ring->version_ = kVersion;
        ring->cell_count_ = cells;
        ring->cell_size_ = cell_size;
        ring->cell_stride_ = uint32_t(stride_for(cell_size));
        ring->cells_offset_ = sizeof(ShmRing);
        ring->owners_offset_ = sizeof(ShmRing) + uint64_t(cells) * ring->cell_stride_;
        ring->armed_.store(0, std::memory_order_relaxed);
        ring->tail_.store(0, std::memory_order_relaxed);
        ring->head_.store(0, std::memory_order_relaxed);
        // Sequence 0 is no position's publish (those are p + 1), and owner word 0 is what a
        // first-lap claim expects (see claimable).
        if (!zeroed) {
            for (uint32_t i = 0; i < cells; ++i) {
                new (ring->cell_at(i)) Cell{0, 0};
                new (&ring->owner_at(i)) std::atomic<uint64_t>(0);
            }
        }
        // Release: a process that sees the magic (acquire in attach) sees the whole layout.
        ring->magic_.store(kMagic, std::memory_order_release);
        return ring;
    }

    // The ring another process built in `mem`, or nullptr when mem does not hold one of this
    // layout. The second form also refuses a ring that would extend past `available` bytes.
    static ShmRing *attach(void *mem) {
        if (!aligned(mem)) return nullptr;
        auto *ring = static_cast<ShmRing *>(mem);
        if (ring->magic_.load(std::memory_order_acquire) != kMagic) return nullptr;
        if (ring->version_ != kVersion || ring->cells_offset_ != sizeof(ShmRing) ||
            bytes_for(ring->cell_count_, ring->cell_size_) == 0 ||
            ring->cell_stride_ != stride_for(ring->cell_size_) ||
            ring->owners_offset_ !=
                sizeof(ShmRing) + uint64_t(ring->cell_count_) * ring->cell_stride_)
            return nullptr;
        return ring;
    }
    static ShmRing *attach(void *mem, size_t available) {
        ShmRing *ring = attach(mem);
        if (!ring || bytes_for(ring->cell_count_, ring->cell_size_) > available) return nullptr;
        return ring;
    }

    // Producer (any thread of any process `producer`, a nonzero id naming the process, such
    // as own_process_token(), which the consumer's reclaim_dead check understands): claims the next
    // cell and returns its payload area (cell_size() bytes, 16-byte aligned), or nullptr when the
    // ring is full. The cell reaches the consumer when publish() is called on it; cells published
    // out of claim order are still consumed in claim order. `view` is this producer's own
    // (one per thread that produces). Always inline: it is most of a small send, and gcc
    // otherwise moved it out of line in the send calls, where the claim's arguments then
    // travelled through memory (docs/latency.md).
    [[gnu::always_inline]] void *try_reserve(uint32_t producer, ProducerView &view) {
        // Relaxed: tail is only a hint of where to start (see the top of the file).
        uint64_t position = tail_.load(std::memory_order_relaxed);
        for (;;) {
            if (position - view.head >= cell_count_) {
                // Acquire pairs with the consumer's release in release(): once head is past
                // p - cells, the consumer has finished reading that cell, so writing the new
                // payload cannot overwrite bytes still being read.
                view.head = head_.load(std::memory_order_acquire);
                if (int64_t(position - view.head) >= int64_t(cell_count_)) return nullptr;
                if (int64_t(position - view.head) < 0) {  // a stale start: catch up
                    position = view.head;
                    continue;
                }
            }
            std::atomic<uint64_t> &owner = owner_at(position);
            // Relaxed: a stale word only sends us to the next position (or makes the
            // compare-exchange below fail).
            uint64_t word = owner.load(std::memory_order_relaxed);
            // Sequentially consistent: the claim must come before our load of armed_ below
            // in the single order that also holds the consumer's arm() (see the top).
            if (claimable(word, position) &&
                owner.compare_exchange_strong(word, stamp(position, producer),
                                              std::memory_order_seq_cst)) {
                tail_.store(position + 1, std::memory_order_relaxed);
                view.wake = armed_.load(std::memory_order_seq_cst) != 0;
                Cell *cell = cell_at(position);
                cell->claimed = position;  // for publish(); the consumer never reads it
                return payload_of(cell);
            }
            // The position is someone else's already: the next one.
            ++position;
        }
    }
    // The same, for a caller that keeps no view (tests, rare paths): reads head every time.
    void *try_reserve(uint32_t producer) {
        ProducerView view;
        view.head = head_.load(std::memory_order_acquire);
        return try_reserve(producer, view);
    }

    // Producer's hint: whether try_reserve would find a free cell now (another producer may
    // take it first).
    bool has_room(ProducerView &view) const {
        uint64_t position = tail_.load(std::memory_order_relaxed);
        if (position - view.head < cell_count_) return true;
        view.head = head_.load(std::memory_order_acquire);
        return int64_t(position - view.head) < int64_t(cell_count_);
    }
    bool has_room() const {
        ProducerView view;
        view.head = head_.load(std::memory_order_acquire);
        return has_room(view);
    }

    // Producer's estimate of the cells free now (head read again).
    uint32_t free_cells(ProducerView &view) const {
        view.head = head_.load(std::memory_order_acquire);
        auto used = int64_t(tail_.load(std::memory_order_relaxed) - view.head);
        if (used < 0) used = 0;  // (tail is a hint, and may lag behind)
        return used >= int64_t(cell_count_) ? 0 : uint32_t(int64_t(cell_count_) - used);
    }

    // Producer: hands the cell returned by try_reserve() to the consumer.
    void publish(void *payload) {
        Cell *cell = cell_of(payload);
        uint64_t position = cell->claimed;
        // Release pairs with the consumer's acquire in peek(): the payload written before
        // this store is visible to the consumer that sees position + 1.
        cell->sequence.store(position + 1, std::memory_order_release);
    }

    // Producer, after publishing a cell whose try_reserve set view.wake: true when this
    // producer is the one to wake the consumer (the flag was still set; it is cleared).
    bool take_wake() { return armed_.exchange(0, std::memory_order_acq_rel) != 0; }

    // Consumer: about to sleep. True when it may (the producers' next claim will see the
    // flag); false when a cell is already claimed or published at head (it will be ready
    // without a wake-up). disarm() when done sleeping, or when not sleeping after all.
    bool arm() {
        armed_.store(1, std::memory_order_seq_cst);
        uint64_t position = head_.load(std::memory_order_relaxed);
        // Sequentially consistent, against the producer's claim (see the top of the file).
        uint64_t word = owner_at(position).load(std::memory_order_seq_cst);
        if (uint32_t(word >> 32) == uint32_t(position) && uint32_t(word) != 0) return false;
        return cell_at(position)->sequence.load(std::memory_order_acquire) != position + 1;
    }
    void disarm() { armed_.store(0, std::memory_order_relaxed); }

    // Consumer (one thread of one process): the oldest entry's payload, to be read in place,
    // or nullptr when there is none yet. Repeated calls return the same entry until release().
    const void *peek() {
        // Relaxed: only the consumer writes head.
        uint64_t position = head_.load(std::memory_order_relaxed);
        Cell *cell = cell_at(position);
        // Acquire pairs with the producer's release in publish(): seeing position + 1 makes
        // the payload's bytes visible.
        if (cell->sequence.load(std::memory_order_acquire) != position + 1) return nullptr;
        return payload_of(cell);
    }

    // Consumer: done with the entry peek() returned; its cell goes back to the producers.
    void release() {
        uint64_t position = head_.load(std::memory_order_relaxed);
        assert(cell_at(position)->sequence.load(std::memory_order_relaxed) == position + 1);
        // Release pairs with the producer's acquire of head in try_reserve(): every read of
        // the payload made in place happens before the next lap's producer may write it.
        head_.store(position + 1, std::memory_order_release);
    }

    // Consumer: hands the oldest cells back to the next lap while they were claimed by a
    // producer that died before publishing them (`is_alive(id)` false for their claimant),
    // so that the cells published behind them can be consumed. Returns how many it skipped.
    // A live claimant's cell, or an unclaimed or published one, stops it.
    template <class IsAlive>
    uint32_t reclaim_dead(IsAlive &&is_alive) {
        uint32_t reclaimed = 0;
        for (;;) {
            uint64_t position = head_.load(std::memory_order_relaxed);
            Cell *cell = cell_at(position);
            if (cell->sequence.load(std::memory_order_acquire) == position + 1) return reclaimed;
            // Relaxed: a stale word (the lap before) only makes us leave the cell for now.
            uint64_t word = owner_at(position).load(std::memory_order_relaxed);
            if (!claimed_for(word, position) || is_alive(uint32_t(word))) return reclaimed;
            // Dead: it publishes nothing more. Looked at again in case it published just
            // before it died.
            if (cell->sequence.load(std::memory_order_acquire) == position + 1) return reclaimed;
            // As release() does; the dead producer will not write the payload any more.
            head_.store(position + 1, std::memory_order_release);
            ++reclaimed;
        }
    }

    // Consumer: one past the last cell claimed now in this lap (published or not), head when
    // none is. A consumer that learns a producer died knows every cell that producer claimed
    // is below this position, and has read them all (or skipped them, reclaim_dead) once
    // consumed() reaches it. One load per cell: for rare checks, not for a data path.
    uint64_t claimed_end() {
        const uint64_t head = head_.load(std::memory_order_relaxed);
        uint64_t end = head;
        for (uint64_t position = head; position < head + cell_count_; ++position)
            if (claimed_for(owner_at(position).load(std::memory_order_acquire), position))
                end = position + 1;
        return end;
    }
    // Consumer: the position of the next cell to consume (every cell below it consumed).
    uint64_t consumed() const { return head_.load(std::memory_order_acquire); }

    // Payload bytes that share the cache line of the cell's sequence number (the line the
    // consumer polls).
    static constexpr size_t kFirstLinePayload = kCacheLine - 16;

    uint32_t cells() const { return cell_count_; }
    uint32_t cell_size() const { return cell_size_; }

  private:
    static constexpr uint64_t kMagic = 0x54414e44454d5251ULL;  // "TANDEMRQ"
    // 2: owner words (claims that name their producer). 3: one locked instruction per claim
    // (tail a hint, head read by producers only when full), the sleep flag in the ring.
    static constexpr uint32_t kVersion = 3;
    // The sequence number and the claimed position sit in front of each payload; 16 keeps
    // payloads aligned for any scalar type.
    static constexpr size_t kPayloadOffset = 16;

    struct Cell {
        std::atomic<uint64_t> sequence;
        uint64_t claimed;  // the position its producer claimed, kept for publish()
    };
    static_assert(sizeof(Cell) <= kPayloadOffset);
    static_assert(kFirstLinePayload == kCacheLine - kPayloadOffset);

    ShmRing() = default;

    // Each cell starts on its own cache line, so producers filling neighbouring cells do
    // not take the line from each other.
    static size_t stride_for(uint32_t cell_size) {
        return (kPayloadOffset + cell_size + kCacheLine - 1) / kCacheLine * kCacheLine;
    }
    // The owner words: one per cell, 8 to a line, after the cells.
    static size_t owners_bytes(uint32_t cells) {
        return (size_t(cells) * sizeof(uint64_t) + kCacheLine - 1) / kCacheLine * kCacheLine;
    }
    // An owner word: the low 32 bits of the position claimed and the claimant's id (0: none).
    static uint64_t stamp(uint64_t position, uint32_t producer) {
        return uint64_t(uint32_t(position)) << 32 | producer;
    }
    static bool claimed_for(uint64_t word, uint64_t position) {
        return uint32_t(word >> 32) == uint32_t(position) && uint32_t(word) != 0;
    }
    // Whether a claim of `position` may replace `word`: it holds the stamp of the lap
    // before (whoever claimed it), or, in the first lap, nothing yet. Expecting exactly that
    // keeps a producer whose view is a lap old from stamping over a newer claim.
    bool claimable(uint64_t word, uint64_t position) const {
        if (position < cell_count_) return word == 0;
        return uint32_t(word >> 32) == uint32_t(position - cell_count_) && uint32_t(word) != 0;
    }
    static bool aligned(const void *mem) {
        return mem && reinterpret_cast<uintptr_t>(mem) % kCacheLine == 0;
    }
    Cell *cell_at(uint64_t position) const {
        char *cells = const_cast<char *>(reinterpret_cast<const char *>(this)) + cells_offset_;
        return reinterpret_cast<Cell *>(cells + (position & (cell_count_ - 1)) * cell_stride_);
    }
    std::atomic<uint64_t> &owner_at(uint64_t position) {
        char *owners = reinterpret_cast<char *>(this) + owners_offset_;
        return reinterpret_cast<std::atomic<uint64_t> *>(owners)[position & (cell_count_ - 1)];
    }
    static void *payload_of(Cell *cell) { return reinterpret_cast<char *>(cell) + kPayloadOffset; }
    Cell *cell_of(void *payload) {
        auto *cell = reinterpret_cast<Cell *>(static_cast<char *>(payload) - kPayloadOffset);
        assert(reinterpret_cast<char *>(cell) >= reinterpret_cast<char *>(this) + cells_offset_);
        assert(size_t(reinterpret_cast<char *>(cell) - reinterpret_cast<char *>(this) -
                      cells_offset_) %
                   cell_stride_ ==
               0);
        return cell;
    }
    // Line 0: written once by init(), read-only afterwards but for armed_ (the consumer's,
    // rarely), which every producer reads after each claim.
    std::atomic<uint64_t> magic_;
    uint32_t version_;
    uint32_t cell_count_;
    uint32_t cell_size_;
    uint32_t cell_stride_;
    uint64_t cells_offset_;
    uint64_t owners_offset_;
    std::atomic<uint32_t> armed_;
    // Line 1: the producers' hint.
    alignas(kCacheLine) std::atomic<uint64_t> tail_;
    // Line 2: the consumer's alone (producers read it when the ring looks full).
    alignas(kCacheLine) std::atomic<uint64_t> head_;
};

static_assert(std::is_standard_layout_v<ShmRing>);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(ShmRing) == 3 * ShmRing::kCacheLine);

}  // namespace tandem
