// Short cells (wire::LocalShortHeader): the node-local path's small messages, written and
// read in one place for both providers. tandem writes them into a peer's ring through the
// peer's Outbox in its channel (shm::Outbox::claim) and decodes every one that arrives for it,
// reading its channel's inbox itself (Channel::owner_reads); off_tandem writes them for its own
// sends and reads them only for an owner that is not tandem (the peer-API face).
#pragma once

#include "common/iov.h"
#include "common/shm_ring.h"
#include "common/wire.h"

#include <rdma/fabric.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tandem {

// The first line of a sender's Short cells past the header: the name, zero-padded, and
// where their data starts (after the name).
struct ShortLine {
    uint8_t bytes[ShmRing::kFirstLinePayload] = {};  // header room (zero), then the name
    uint8_t rest[wire::kLocalNameRoom] = {};         // the name past the first line (IPv6), padded
    size_t at = 0;
    uint8_t name_len = 0;

    void build(const uint8_t *name, size_t len) {
        uint8_t padded[wire::kLocalNameRoom] = {};
        memcpy(padded, name, std::min(len, sizeof padded));
        name_len = static_cast<uint8_t>(len);
        at = wire::local_short_body_offset(len);
        const size_t first = std::min(at, sizeof bytes) - sizeof(wire::LocalShortHeader);
        memcpy(bytes + sizeof(wire::LocalShortHeader), padded, first);
        if (at > sizeof bytes) memcpy(rest, padded + first, at - sizeof bytes);
    }
};

// A Short cell's header and the first line of its name, for len bytes of data: stores straight
// into the cell, of sizes the compiler knows, in a row. The first line used to be assembled on
// the stack and copied over, and its 16-byte reloads of the narrower stores just made there
// could not be forwarded from the store buffer: a stall on every small send, before the
// publish. Always inline, as the ring's claim is (shm_ring.h).
[[gnu::always_inline]] inline void write_short_head(uint8_t *cell, const ShortLine &line,
                                                    uint8_t flags, size_t len, uint64_t tag,
                                                    uint64_t data) {
    // Field by field: gcc built a header object on the stack and copied it with a 16-byte
    // load, the very stall this avoids.
    using Header = wire::LocalShortHeader;
    const uint32_t size = static_cast<uint32_t>(len);
    cell[offsetof(Header, op)] = static_cast<uint8_t>(wire::LocalOp::Short);
    cell[offsetof(Header, flags)] = flags;
    cell[offsetof(Header, name_len)] = line.name_len;
    cell[offsetof(Header, reserved)] = 0;
    memcpy(cell + offsetof(Header, size), &size, sizeof size);
    memcpy(cell + offsetof(Header, tag), &tag, sizeof tag);
    memcpy(cell + offsetof(Header, cq_data), &data, sizeof data);
    // The first line's name part whole (zero past the name): the data then overwrites its end.
    memcpy(cell + sizeof(Header), line.bytes + sizeof(Header), sizeof line.bytes - sizeof(Header));
}

// A Short cell of len bytes of buf into `cell` (a ring cell's payload).
[[gnu::always_inline]] inline void write_short(uint8_t *cell, const ShortLine &line, uint8_t flags,
                                               const void *buf, size_t len, uint64_t tag,
                                               uint64_t data) {
    write_short_head(cell, line, flags, len, tag, data);
    if (line.at + len <= sizeof line.bytes) {
        copy_bytes(cell + line.at, buf, len);
        return;
    }
    if (line.at > sizeof line.bytes) memcpy(cell + sizeof line.bytes, line.rest, sizeof line.rest);
    // (An empty send may name no buffer at all: memcpy must not be given its null pointer.)
    if (len) memcpy(cell + line.at, buf, len);
}

// The same for len bytes gathered from a list of buffers (a send of several).
inline void write_short_gather(uint8_t *cell, const ShortLine &line, uint8_t flags,
                               const iovec *iov, size_t count, size_t len, uint64_t tag,
                               uint64_t data) {
    write_short_head(cell, line, flags, len, tag, data);
    if (line.at > sizeof line.bytes) memcpy(cell + sizeof line.bytes, line.rest, sizeof line.rest);
    iov_gather(cell + line.at, iov, count, 0, len);
}

// A Short cell as read: false for a malformed one (a name or size it cannot hold). The
// header's fields are loaded one by one from the cell, where a copy of the whole header went
// through the stack on every message.
struct ShortView {
    uint8_t flags;  // wire::LocalFlags
    uint32_t size;
    uint64_t tag;
    uint64_t cq_data;
    std::string_view sender;  // its name: name_len bytes, zero-padded to a word in the cell
    const uint8_t *data;
};
inline bool read_short(const uint8_t *cell, ShortView &v) {
    using Header = wire::LocalShortHeader;
    const uint8_t name_len = cell[offsetof(Header, name_len)];
    memcpy(&v.size, cell + offsetof(Header, size), sizeof v.size);
    if (name_len > wire::kLocalNameRoom || v.size > wire::kLocalBodyRoom) return false;
    v.flags = cell[offsetof(Header, flags)];
    memcpy(&v.tag, cell + offsetof(Header, tag), sizeof v.tag);
    memcpy(&v.cq_data, cell + offsetof(Header, cq_data), sizeof v.cq_data);
    v.sender = {reinterpret_cast<const char *>(cell + sizeof(Header)), name_len};
    v.data = cell + wire::local_short_body_offset(name_len);
    return true;
}

// The last sender a receiver resolved, compared word by word (names are zero-padded to whole
// words in cells and here): a run of cells from one sender resolves without a lookup. An IPv4
// name (16 bytes, the usual one) is two words compared without a loop; longer names compare
// the rest after them. The name's view must be readable to a whole word past its end and to
// at least 16 bytes: a cell's name is followed by its body, and a cell holds both.
struct LastSender {
    uint8_t name[wire::kLocalNameRoom] = {};
    size_t len = SIZE_MAX;
    uint64_t version = ~0ull;  // of the AV it was resolved in
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    uint64_t second_mask = 0;  // all ones when the name has a second word

    bool matches(std::string_view sender, uint64_t av_version) const {
        if (sender.size() != len || version != av_version) return false;
        uint64_t a0, a1, b0, b1;
        memcpy(&a0, sender.data(), 8);
        memcpy(&a1, sender.data() + 8, 8);
        memcpy(&b0, name, 8);
        memcpy(&b1, name + 8, 8);
        uint64_t diff = (a0 ^ b0) | ((a1 ^ b1) & second_mask);
        if (len > 16) [[unlikely]] {
            for (size_t i = 2; i < (len + 7) / 8; ++i) {
                memcpy(&a0, sender.data() + 8 * i, 8);
                memcpy(&b0, name + 8 * i, 8);
                diff |= a0 ^ b0;
            }
        }
        return diff == 0;
    }
    void remember(std::string_view sender, uint64_t av_version, fi_addr_t a) {
        if (sender.size() > sizeof name) return;
        memset(name, 0, sizeof name);
        memcpy(name, sender.data(), sender.size());
        len = sender.size();
        version = av_version;
        addr = a;
        second_mask = len > 8 ? ~uint64_t(0) : 0;
    }
};

}  // namespace tandem
