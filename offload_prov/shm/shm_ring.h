// ShmRing: a bounded multi-producer, single-consumer queue of fixed-size cells that lives
// inside shared memory, so that several processes on a node can post to one process's
// queue without a lock or a system call.
//
// The algorithm is Dmitry Vyukov's bounded queue: every cell carries a sequence number that
// says whose turn it is. Cell i of lap L (position p = L * cells + i) is
//   free for the producer of position p      when sequence == p,
//   published, waiting for the consumer      when sequence == p + 1,
//   and handed to the next lap by the consumer by setting sequence = p + cells.
// The consumer alone advances `head`. Positions are 64-bit and never wrap in practice.
//
// A producer claims position p by stamping the cell's owner word (an array of its own, away
// from the line the consumer polls) with its producer id and p, in one compare-exchange; `tail`
// then moves past p, by the claimant or by any producer that finds p stamped (so a claimant that
// dies right after its stamp does not stop the others). A claimed cell therefore always
// names its producer, and a producer that dies between try_reserve() and publish() can be
// told from a slow one: reclaim_dead() hands such a cell back to the next lap, and the
// consumer moves on to the cells behind it. Without that, the consumer would stop at that
// cell for ever and producers would stop once the ring is full.
//
// Everything in the ring is an offset from the ring itself, never a pointer, because each
// process maps the memory at its own address. Peers are the same user (the segment is 0600)
// and trusted not to scribble on it.
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

    // Bytes of shared memory a ring of `cells` cells of `cell_size` payload bytes takes, or 0
    // when cells is not a power of two in [2, kMaxCells] or cell_size not in
    // [1, kMaxCellSize]. (With a single cell, "free for the next lap" and "published" would
    // be the same sequence number.)
    static size_t bytes_for(uint32_t cells, uint32_t cell_size) {
        if (cells < 2 || cells > kMaxCells || (cells & (cells - 1)) != 0) return 0;
        if (cell_size == 0 || cell_size > kMaxCellSize) return 0;
        return sizeof(ShmRing) + size_t(cells) * stride_for(cell_size) + owners_bytes(cells);
    }

    // Builds an empty ring in `mem` (kCacheLine-aligned, bytes_for(cells, cell_size) long).
    // Called once, by the consumer, before any producer attaches. nullptr on bad arguments.
    static ShmRing *init(void *mem, uint32_t cells, uint32_t cell_size) {
        if (bytes_for(cells, cell_size) == 0 || !aligned(mem)) return nullptr;
        auto *ring = new (mem) ShmRing();
        ring->version_ = kVersion;
        ring->cell_count_ = cells;
        ring->cell_size_ = cell_size;
        ring->cell_stride_ = uint32_t(stride_for(cell_size));
        ring->cells_offset_ = sizeof(ShmRing);
        ring->owners_offset_ = sizeof(ShmRing) + uint64_t(cells) * ring->cell_stride_;
        ring->tail_.store(0, std::memory_order_relaxed);
        ring->head_.store(0, std::memory_order_relaxed);
        for (uint32_t i = 0; i < cells; ++i) {
            new (ring->cell_at(i)) Cell{i};  // cell i is free for position i
            // Claimed by nobody, for the position of the lap before.
            new (&ring->owner_at(i)) std::atomic<uint64_t>(stamp(uint64_t(i) - cells, 0));
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
    // out of claim order are still consumed in claim order.
    void *try_reserve(uint32_t producer) {
        // Relaxed: tail is only a hint of where to try; the sequence check below decides.
        uint64_t position = tail_.load(std::memory_order_relaxed);
        for (;;) {
            Cell *cell = cell_at(position);
            // Acquire pairs with the consumer's release in release(): once the cell says it
            // is free for this position, the consumer has finished reading its old payload,
            // so writing the new one cannot overwrite bytes still being read.
            uint64_t sequence = cell->sequence.load(std::memory_order_acquire);
            auto lag = int64_t(sequence - position);
            if (lag < 0) return nullptr;  // the cell still holds the previous lap's entry: full
            if (lag == 0) {
                // Free for this position: whoever stamps the owner word first owns it. The
                // word still holds the stamp of the lap before while nobody has; expecting
                // exactly that keeps a producer whose view is a lap old (the cell claimed,
                // consumed and claimed again meanwhile) from stamping over a newer claim.
                // Relaxed: the stamp only decides who owns the position and names the owner
                // for reclaim_dead; the payload is published through the cell's sequence.
                std::atomic<uint64_t> &owner = owner_at(position);
                uint64_t word = owner.load(std::memory_order_relaxed);
                if (uint32_t(word >> 32) == uint32_t(position - cell_count_) &&
                    owner.compare_exchange_strong(word, stamp(position, producer),
                                                  std::memory_order_relaxed)) {
                    advance_tail(position);
                    return payload_of(cell);
                }
            }
            // The position is someone else's (stamped, or already published or consumed):
            // tail moves past it, by us if its claimant has not done it yet.
            advance_tail(position);
            position = tail_.load(std::memory_order_relaxed);
        }
    }

    // Producer's hint: whether try_reserve would find a free cell now (another producer may
    // take it first).
    bool has_room() const {
        uint64_t position = tail_.load(std::memory_order_relaxed);
        return int64_t(cell_at(position)->sequence.load(std::memory_order_acquire) - position) >= 0;
    }

    // Producer: hands the cell returned by try_reserve() to the consumer.
    void publish(void *payload) {
        Cell *cell = cell_of(payload);
        // Relaxed: between claim and publish only this producer touches the cell, and it
        // read this very value (its position) in try_reserve.
        uint64_t position = cell->sequence.load(std::memory_order_relaxed);
        // Release pairs with the consumer's acquire in peek(): the payload written before
        // this store is visible to the consumer that sees position + 1.
        cell->sequence.store(position + 1, std::memory_order_release);
    }

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
        Cell *cell = cell_at(position);
        assert(cell->sequence.load(std::memory_order_relaxed) == position + 1);
        // Release pairs with the producer's acquire in try_reserve(): every read of the
        // payload made in place happens before the next lap's producer may write it.
        cell->sequence.store(position + cell_count_, std::memory_order_release);
        // Relaxed: no other process or thread reads head.
        head_.store(position + 1, std::memory_order_relaxed);
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
            if (cell->sequence.load(std::memory_order_acquire) != position) return reclaimed;
            // Relaxed: a stale word (the lap before) only makes us leave the cell for now.
            uint64_t word = owner_at(position).load(std::memory_order_relaxed);
            if (!claimed_for(word, position) || is_alive(uint32_t(word))) return reclaimed;
            // As release() does; the dead producer will not write the payload any more.
            cell->sequence.store(position + cell_count_, std::memory_order_release);
            head_.store(position + 1, std::memory_order_relaxed);
            ++reclaimed;
        }
    }

    // Payload bytes that share the cache line of the cell's sequence number (the line the
    // consumer polls).
    static constexpr size_t kFirstLinePayload = kCacheLine - 16;

    uint32_t cells() const { return cell_count_; }
    uint32_t cell_size() const { return cell_size_; }

  private:
    static constexpr uint64_t kMagic = 0x54414e44454d5251ULL;  // "TANDEMRQ"
    // 2: owner words (claims that name their producer).
    static constexpr uint32_t kVersion = 2;
    // The sequence number sits in front of each payload; 16 keeps payloads aligned for any
    // scalar type.
    static constexpr size_t kPayloadOffset = 16;

    struct Cell {
        std::atomic<uint64_t> sequence;
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
    void advance_tail(uint64_t position) {
        // Relaxed: only moves the hint past a claimed position (see try_reserve).
        tail_.compare_exchange_strong(position, position + 1, std::memory_order_relaxed);
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

    // Line 0: written once by init(), read-only afterwards. magic_ is stored last.
    std::atomic<uint64_t> magic_;
    uint32_t version_;
    uint32_t cell_count_;
    uint32_t cell_size_;
    uint32_t cell_stride_;
    uint64_t cells_offset_;
    uint64_t owners_offset_;
    // Line 1: contended by every producer.
    alignas(kCacheLine) std::atomic<uint64_t> tail_;
    // Line 2: the consumer's alone, so producers' traffic on tail does not slow it down.
    alignas(kCacheLine) std::atomic<uint64_t> head_;
};

static_assert(std::is_standard_layout_v<ShmRing>);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(ShmRing) == 3 * ShmRing::kCacheLine);

}  // namespace tandem
