// Short cells (wire::LocalShortHeader): the node-local path's small messages, written and
// read in one place for both providers. off_tandem writes and reads them for every sender it
// serves; tandem writes them into a peer's ring through the twin's lane, and takes them from
// its twin's inbox while the twin has nothing else to do (peer::LocalLane, peer::LocalInbox),
// which keeps a small message's path to one provider's code.
#pragma once

#include "common/iov.h"
#include "common/shm_ring.h"
#include "common/wire.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tandem {

// The first line of a sender's Short cells but for size, flags, tag and data (the header with
// op and name_len, then the name, zero-padded), and where their data starts (after the name).
struct ShortLine {
    uint8_t bytes[ShmRing::kFirstLinePayload] = {};
    uint8_t rest[wire::kLocalNameRoom] = {};  // the name past the first line (IPv6), padded
    size_t at = 0;

    void build(const uint8_t *name, size_t name_len) {
        wire::LocalShortHeader h{.op = static_cast<uint8_t>(wire::LocalOp::Short),
                                 .flags = 0,
                                 .name_len = static_cast<uint8_t>(name_len),
                                 .reserved = 0,
                                 .size = 0,
                                 .tag = 0,
                                 .cq_data = 0};
        uint8_t padded[wire::kLocalNameRoom] = {};
        memcpy(padded, name, std::min(name_len, sizeof padded));
        at = wire::local_short_body_offset(name_len);
        memcpy(bytes, &h, sizeof h);
        const size_t first = std::min(at, sizeof bytes) - sizeof h;
        memcpy(bytes + sizeof h, padded, first);
        if (at > sizeof bytes) memcpy(rest, padded + first, at - sizeof bytes);
    }
};

// A Short cell of len bytes of buf into `cell` (a ring cell's payload). The first line, the
// one the receiver polls, is built on the stack and stored in one burst, so that the
// receiver's polling cannot take it back between our stores. Always inline, as the ring's
// claim is (shm_ring.h).
[[gnu::always_inline]] inline void write_short(uint8_t *cell, const ShortLine &line, uint8_t flags,
                                               const void *buf, size_t len, uint64_t tag,
                                               uint64_t data) {
    uint8_t first[sizeof line.bytes];
    memcpy(first, line.bytes, sizeof first);
    wire::LocalShortHeader h;
    memcpy(&h, first, sizeof h);
    h.flags = flags;
    h.size = static_cast<uint32_t>(len);
    h.tag = tag;
    h.cq_data = data;
    memcpy(first, &h, sizeof h);
    if (line.at + len <= sizeof first) {
        copy_bytes(first + line.at, buf, len);
        memcpy(cell, first, sizeof first);
        return;
    }
    memcpy(cell, first, std::min(line.at, sizeof first));
    if (line.at > sizeof first) memcpy(cell + sizeof first, line.rest, line.at - sizeof first);
    memcpy(cell + line.at, buf, len);
}

// A Short cell as read: false for a malformed one (a name or size it cannot hold).
struct ShortView {
    wire::LocalShortHeader hdr;
    std::string_view sender;  // its name: name_len bytes, zero-padded to a word in the cell
    const uint8_t *data;
};
inline bool read_short(const uint8_t *cell, ShortView &v) {
    memcpy(&v.hdr, cell, sizeof v.hdr);
    if (v.hdr.name_len > wire::kLocalNameRoom || v.hdr.size > wire::kLocalBodyRoom) return false;
    v.sender = {reinterpret_cast<const char *>(cell + sizeof v.hdr), v.hdr.name_len};
    v.data = cell + wire::local_short_body_offset(v.hdr.name_len);
    return true;
}

// The last sender a receiver resolved, compared word by word (names are zero-padded to whole
// words in cells and here): a run of cells from one sender resolves without a lookup.
struct LastSender {
    uint8_t name[wire::kLocalNameRoom] = {};
    size_t len = SIZE_MAX;
    uint64_t version = ~0ull;  // of the AV it was resolved in
    fi_addr_t addr = FI_ADDR_NOTAVAIL;

    bool matches(std::string_view sender, uint64_t av_version) const {
        if (sender.size() != len || version != av_version) return false;
        uint64_t diff = 0;
        for (size_t i = 0; i < (len + 7) / 8; ++i) {
            uint64_t a, b;
            memcpy(&a, sender.data() + 8 * i, 8);
            memcpy(&b, name + 8 * i, 8);
            diff |= a ^ b;
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
    }
};

}  // namespace tandem
