// Scatter lists (iovec arrays): their length, copies into and out of them at an offset, and
// a window of one as another list. Both providers move payloads between buffers the
// application scattered and contiguous ones (link frames, ring cells, bounce copies).
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem {

inline size_t iov_length(const iovec *iov, size_t count) {
    size_t n = 0;
    for (size_t i = 0; i < count; ++i) n += iov[i].iov_len;
    return n;
}

// Bytes [from, from + len) of a list as a list of at most `room` entries; returns the
// entries written (fewer bytes than len when the list or `room` runs out).
inline size_t iov_slice(const iovec *in, size_t count, size_t from, size_t len, iovec *out,
                        size_t room) {
    size_t k = 0;
    for (size_t i = 0; i < count && len && k < room; ++i) {
        if (from >= in[i].iov_len) {
            from -= in[i].iov_len;
            continue;
        }
        size_t take = std::min(in[i].iov_len - from, len);
        out[k++] = {static_cast<uint8_t *>(in[i].iov_base) + from, take};
        len -= take;
        from = 0;
    }
    return k;
}

// Calls piece(i, ptr, n) for each part of bytes [offset, offset + len) of the list, in
// order (i: the entry it lies in); a piece returning false stops the walk. Returns the bytes
// walked (fewer than len when the list runs out or a piece said stop).
template <typename Piece>
size_t iov_walk(const iovec *iov, size_t count, size_t offset, size_t len, Piece &&piece) {
    size_t done = 0;
    for (size_t i = 0; i < count && done < len; ++i) {
        if (offset >= iov[i].iov_len) {
            offset -= iov[i].iov_len;
            continue;
        }
        size_t n = std::min(iov[i].iov_len - offset, len - done);
        if (!piece(i, static_cast<uint8_t *>(iov[i].iov_base) + offset, n)) break;
        done += n;
        offset = 0;
    }
    return done;
}

// Walks two lists side by side over their first len bytes: piece(i, a, j, b, n) for each run
// of n bytes that lies in entry i of the first list (at a) and entry j of the second (at b),
// in order; a piece returning false stops the walk. Returns the bytes walked.
template <typename Piece>
size_t iov_walk2(const iovec *x, size_t nx, const iovec *y, size_t ny, size_t len, Piece &&piece) {
    size_t i = 0, xoff = 0, j = 0, yoff = 0, done = 0;
    while (done < len && i < nx && j < ny) {
        size_t xleft = x[i].iov_len - xoff, yleft = y[j].iov_len - yoff;
        if (!xleft) {
            ++i, xoff = 0;
            continue;
        }
        if (!yleft) {
            ++j, yoff = 0;
            continue;
        }
        size_t n = std::min({xleft, yleft, len - done});
        if (!piece(i, static_cast<uint8_t *>(x[i].iov_base) + xoff, j,
                   static_cast<uint8_t *>(y[j].iov_base) + yoff, n))
            break;
        xoff += n, yoff += n, done += n;
    }
    return done;
}

// Whether bytes [offset, offset + len) lie in the list's first entry: the usual case of a
// small message, which iov_scatter and iov_gather copy without the walk (it cost more than
// the copy).
inline bool iov_in_first(const iovec *iov, size_t count, size_t offset, size_t len) {
    return count && offset <= iov[0].iov_len && len <= iov[0].iov_len - offset;
}

// n (at most 16) bytes from src to dst without a call: a small message's bytes, where a
// call to memcpy cost more than the copy.
inline void copy_small(void *dst, const void *src, size_t n) {
    auto *d = static_cast<uint8_t *>(dst);
    auto *s = static_cast<const uint8_t *>(src);
    if (n >= 8) {  // two overlapping words
        uint64_t a, b;
        memcpy(&a, s, 8);
        memcpy(&b, s + n - 8, 8);
        memcpy(d, &a, 8);
        memcpy(d + n - 8, &b, 8);
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        memcpy(d, &a, 4);
        memcpy(d + n - 4, &b, 4);
    } else {
        for (size_t i = 0; i < n; ++i) d[i] = s[i];
    }
}

// memcpy, with copy_small for a few bytes.
inline void copy_bytes(void *dst, const void *src, size_t n) {
    if (n <= 16)
        copy_small(dst, src, n);
    else
        memcpy(dst, src, n);
}

// Copies len bytes of src into the list from `offset` on; returns the bytes copied.
inline size_t iov_scatter(const iovec *iov, size_t count, size_t offset, const void *src,
                          size_t len) {
    if (iov_in_first(iov, count, offset, len)) {
        copy_bytes(static_cast<uint8_t *>(iov[0].iov_base) + offset, src, len);
        return len;
    }
    auto *from = static_cast<const uint8_t *>(src);
    return iov_walk(iov, count, offset, len, [&](size_t, uint8_t *p, size_t n) {
        memcpy(p, from, n);
        from += n;
        return true;
    });
}

// Copies len bytes of the list, from `offset` on, to dst; returns the bytes copied.
inline size_t iov_gather(void *dst, const iovec *iov, size_t count, size_t offset, size_t len) {
    if (iov_in_first(iov, count, offset, len)) {
        if (len) memcpy(dst, static_cast<const uint8_t *>(iov[0].iov_base) + offset, len);
        return len;
    }
    auto *to = static_cast<uint8_t *>(dst);
    return iov_walk(iov, count, offset, len, [&](size_t, const uint8_t *p, size_t n) {
        memcpy(to, p, n);
        to += n;
        return true;
    });
}

}  // namespace tandem
