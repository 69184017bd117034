/* Point-to-point checks for Open MPI over a libfabric provider (mtl ofi).
 *
 * Every rank takes part; every received byte is verified. Phases:
 *   ring      ANY_SOURCE/ANY_TAG receives of 0 B .. 64 MiB, checking source, tag, count, data
 *   probe     MPI_Probe (any and specific source/tag), then a receive sized from the status
 *   iprobe    MPI_Iprobe polling, and no false positive for a tag nobody sent
 *   mprobe    MPI_Mprobe/MPI_Mrecv and MPI_Improbe/MPI_Imrecv, out of send order
 *   order     non-overtaking: mixed small and large messages, several tags, ANY_TAG receives
 *   tags      receives posted in reverse tag order against unexpected messages
 *   many      every pair exchanges many messages at once (Isend/Irecv/Waitall)
 *   ssend     synchronous sends and Sendrecv_replace
 *   cancel    a posted receive that nothing matches is cancelled
 * Rank 0 prints "mpi_p2p: PASS" or "mpi_p2p: FAIL"; the exit code is non-zero on any failure.
 */
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int nprocs, left, right;
#define PROGRAM "mpi_p2p"
#include "mpi_check.h"

static void fill(unsigned char *buf, size_t n, int src, int tag) {
    for (size_t i = 0; i < n; ++i) buf[i] = pattern(i, src, tag);
}

/* Returns the index of the first wrong byte, or n. */
static size_t verify(const unsigned char *buf, size_t n, int src, int tag) {
    for (size_t i = 0; i < n; ++i)
        if (buf[i] != pattern(i, src, tag)) return i;
    return n;
}

static void phase_done(const char *name) {
    long all;
    MPI_OK(MPI_Allreduce(&failures, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) printf("mpi_p2p: %-8s %s\n", name, all ? "FAILED" : "ok");
    fflush(stdout);
}

static void check_status(const MPI_Status *st, int src, int tag, size_t size, const char *what) {
    int count = -1;
    MPI_OK(MPI_Get_count(st, MPI_BYTE, &count));
    CHECK(st->MPI_SOURCE == src, "%s: source %d, expected %d", what, st->MPI_SOURCE, src);
    CHECK(st->MPI_TAG == tag, "%s: tag %d, expected %d", what, st->MPI_TAG, tag);
    CHECK(count == (int)size, "%s: count %d, expected %zu", what, count, size);
}

static const size_t ring_sizes[] = {0,       1,       3,        8,       64,    512,
                                    1000,    4096,    8192,     65536,   65537, 262144,
                                    1048576, 4194304, 16777216, 67108864};

static void test_ring(void) {
    const size_t max = 64u << 20;
    unsigned char *sbuf = xmalloc(max), *rbuf = xmalloc(max);
    for (size_t k = 0; k < sizeof ring_sizes / sizeof ring_sizes[0]; ++k) {
        size_t size = ring_sizes[k];
        int tag = 100 + (int)k;
        STEP("ring, %zu B messages", size);
        MPI_Request req;
        MPI_Status st;
        memset(rbuf, 0, size);
        fill(sbuf, size, rank, tag);
        MPI_OK(MPI_Irecv(rbuf, (int)size, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD,
                         &req));
        MPI_OK(MPI_Send(sbuf, (int)size, MPI_BYTE, right, tag, MPI_COMM_WORLD));
        MPI_OK(MPI_Wait(&req, &st));
        check_status(&st, left, tag, size, "ring");
        size_t bad = verify(rbuf, size, left, tag);
        CHECK(bad == size, "ring %zu B: data differs at byte %zu", size, bad);
    }
    free(sbuf);
    free(rbuf);
}

static size_t probe_size(int src, int round) {
    /* sizes the receiver cannot guess: small, medium and rendezvous-sized */
    static const size_t base[] = {0, 17, 4093, 70001, 3u << 20};
    return base[round % 5] + (size_t)src * 3;
}

static void test_probe(void) {
    for (int round = 0; round < 10; ++round) {
        int tag = 200 + round;
        size_t size = probe_size(rank, round);
        STEP("probe round %d", round);
        unsigned char *sbuf = xmalloc(size);
        fill(sbuf, size, rank, tag);
        MPI_Request req;
        MPI_OK(MPI_Isend(sbuf, (int)size, MPI_BYTE, right, tag, MPI_COMM_WORLD, &req));

        MPI_Status st;
        if (round % 2 == 0)
            MPI_OK(MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
        else
            MPI_OK(MPI_Probe(left, tag, MPI_COMM_WORLD, &st));
        size_t expect = probe_size(left, round);
        check_status(&st, left, tag, expect, "probe");
        int count = 0;
        MPI_OK(MPI_Get_count(&st, MPI_BYTE, &count));
        unsigned char *rbuf = xmalloc((size_t)count);
        MPI_Status st2;
        MPI_OK(MPI_Recv(rbuf, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &st2));
        check_status(&st2, left, tag, expect, "recv after probe");
        size_t bad = verify(rbuf, (size_t)count, left, tag);
        CHECK(bad == (size_t)count, "probe round %d: data differs at byte %zu", round, bad);
        MPI_OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
        free(rbuf);
        free(sbuf);
    }
}

static void test_iprobe(void) {
    int flag = 1;
    MPI_Status st;
    /* Nothing with tag 299 was ever sent. */
    MPI_OK(MPI_Iprobe(MPI_ANY_SOURCE, 299, MPI_COMM_WORLD, &flag, &st));
    CHECK(!flag, "iprobe found a message with tag 299 that nobody sent");
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));

    for (int round = 0; round < 6; ++round) {
        int tag = 300 + round;
        size_t size = probe_size(rank, round + 1);
        unsigned char *sbuf = xmalloc(size);
        fill(sbuf, size, rank, tag);
        MPI_Request req;
        MPI_OK(MPI_Isend(sbuf, (int)size, MPI_BYTE, right, tag, MPI_COMM_WORLD, &req));
        double t0 = MPI_Wtime();
        flag = 0;
        while (!flag) {
            MPI_OK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st));
            if (!flag) {
                int sent = 0; /* let our own send progress too */
                MPI_OK(MPI_Test(&req, &sent, MPI_STATUS_IGNORE));
                if (sent) req = MPI_REQUEST_NULL;
            }
            if (MPI_Wtime() - t0 > 120) {
                CHECK(0, "iprobe round %d: no message after 120 s", round);
                MPI_Abort(MPI_COMM_WORLD, 3);
            }
        }
        size_t expect = probe_size(left, round + 1);
        check_status(&st, left, tag, expect, "iprobe");
        unsigned char *rbuf = xmalloc(expect);
        MPI_OK(MPI_Recv(rbuf, (int)expect, MPI_BYTE, left, tag, MPI_COMM_WORLD, &st));
        check_status(&st, left, tag, expect, "recv after iprobe");
        size_t bad = verify(rbuf, expect, left, tag);
        CHECK(bad == expect, "iprobe round %d: data differs at byte %zu", round, bad);
        MPI_OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
        free(rbuf);
        free(sbuf);
    }
}

static void test_mprobe(void) {
    /* Each rank sends tag A (large) then tag B (small) to its right neighbour; the receiver
     * matches B first with Mprobe/Mrecv, then A with Improbe/Imrecv. */
    const int tag_a = 400, tag_b = 401;
    const size_t size_a = 1u << 20, size_b = 100;
    unsigned char *sa = xmalloc(size_a), *sb = xmalloc(size_b);
    fill(sa, size_a, rank, tag_a);
    fill(sb, size_b, rank, tag_b);
    MPI_Request reqs[2];
    MPI_OK(MPI_Isend(sa, (int)size_a, MPI_BYTE, right, tag_a, MPI_COMM_WORLD, &reqs[0]));
    MPI_OK(MPI_Isend(sb, (int)size_b, MPI_BYTE, right, tag_b, MPI_COMM_WORLD, &reqs[1]));

    MPI_Message msg;
    MPI_Status st;
    STEP("mprobe: MPI_Mprobe for tag %d (a 1 MiB tag %d message was sent before it)", tag_b, tag_a);
    MPI_OK(MPI_Mprobe(MPI_ANY_SOURCE, tag_b, MPI_COMM_WORLD, &msg, &st));
    check_status(&st, left, tag_b, size_b, "mprobe");
    unsigned char *rb = xmalloc(size_b);
    MPI_OK(MPI_Mrecv(rb, (int)size_b, MPI_BYTE, &msg, &st));
    check_status(&st, left, tag_b, size_b, "mrecv");
    CHECK(verify(rb, size_b, left, tag_b) == size_b, "mrecv: data differs");

    int flag = 0;
    double t0 = MPI_Wtime();
    STEP("mprobe: MPI_Improbe for ANY_TAG (expecting the 1 MiB tag %d message)", tag_a);
    while (!flag) {
        MPI_OK(MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &msg, &st));
        if (!flag && MPI_Wtime() - t0 > 120) {
            CHECK(0, "improbe: no message after 120 s");
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    check_status(&st, left, tag_a, size_a, "improbe");
    unsigned char *ra = xmalloc(size_a);
    MPI_Request rreq;
    STEP("mprobe: MPI_Imrecv of the 1 MiB message");
    MPI_OK(MPI_Imrecv(ra, (int)size_a, MPI_BYTE, &msg, &rreq));
    MPI_OK(MPI_Wait(&rreq, &st));
    check_status(&st, left, tag_a, size_a, "imrecv");
    size_t bad = verify(ra, size_a, left, tag_a);
    CHECK(bad == size_a, "imrecv: data differs at byte %zu", bad);
    STEP("mprobe: waiting for our own two sends");
    MPI_OK(MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE));
    free(sa);
    free(sb);
    free(ra);
    free(rb);
}

static void test_order(void) {
    /* 64 messages of alternating sizes and 3 tags; ANY_TAG receives must see them in order. */
    enum { N = 64 };
    static const size_t sizes[] = {8, 200000, 0, 1u << 20, 33, 65536};
    MPI_Request reqs[N];
    unsigned char *bufs[N];
    for (int i = 0; i < N; ++i) {
        size_t size = sizes[i % 6];
        int tag = 500 + i % 3;
        bufs[i] = xmalloc(size);
        fill(bufs[i], size, rank, 1000 + i);
        MPI_OK(MPI_Isend(bufs[i], (int)size, MPI_BYTE, right, tag, MPI_COMM_WORLD, &reqs[i]));
    }
    unsigned char *rbuf = xmalloc(1u << 20);
    for (int i = 0; i < N; ++i) {
        size_t size = sizes[i % 6];
        MPI_Status st;
        MPI_OK(MPI_Recv(rbuf, 1 << 20, MPI_BYTE, left, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
        check_status(&st, left, 500 + i % 3, size, "order");
        size_t bad = verify(rbuf, size, left, 1000 + i);
        CHECK(bad == size, "order: message %d overtaken or corrupt (byte %zu)", i, bad);
    }
    MPI_OK(MPI_Waitall(N, reqs, MPI_STATUSES_IGNORE));
    for (int i = 0; i < N; ++i) free(bufs[i]);
    free(rbuf);
}

static void test_tags(void) {
    /* Send tags 600..607 in order (mixed sizes), make them unexpected, then receive in reverse. */
    enum { N = 8 };
    MPI_Request reqs[N];
    unsigned char *bufs[N];
    size_t sizes[N];
    for (int i = 0; i < N; ++i) {
        sizes[i] = (i % 2) ? (size_t)(2u << 20) + (size_t)i : (size_t)(16 * i + 1);
        bufs[i] = xmalloc(sizes[i]);
        fill(bufs[i], sizes[i], rank, 600 + i);
        MPI_OK(
            MPI_Isend(bufs[i], (int)sizes[i], MPI_BYTE, right, 600 + i, MPI_COMM_WORLD, &reqs[i]));
    }
    /* Give the messages time to arrive unexpected. */
    double t0 = MPI_Wtime();
    while (MPI_Wtime() - t0 < 0.2) {
        int flag;
        MPI_OK(MPI_Iprobe(MPI_ANY_SOURCE, 9999, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE));
    }
    unsigned char *rbuf = xmalloc((2u << 20) + N);
    for (int i = N - 1; i >= 0; --i) {
        MPI_Status st;
        memset(rbuf, 0, sizes[i]);
        MPI_OK(MPI_Recv(rbuf, (int)sizes[i], MPI_BYTE, left, 600 + i, MPI_COMM_WORLD, &st));
        check_status(&st, left, 600 + i, sizes[i], "tags");
        size_t bad = verify(rbuf, sizes[i], left, 600 + i);
        CHECK(bad == sizes[i], "tags: tag %d data differs at byte %zu", 600 + i, bad);
    }
    MPI_OK(MPI_Waitall(N, reqs, MPI_STATUSES_IGNORE));
    for (int i = 0; i < N; ++i) free(bufs[i]);
    free(rbuf);
}

static void test_many(void) {
    /* Every rank sends K messages to every other rank (including itself) at once. */
    enum { K = 16 };
    const size_t size = 3000;
    int nreq = 2 * K * nprocs;
    MPI_Request *reqs = xmalloc(sizeof(MPI_Request) * (size_t)nreq);
    unsigned char *sbuf = xmalloc(size * K * (size_t)nprocs);
    unsigned char *rbuf = xmalloc(size * K * (size_t)nprocs);
    int r = 0;
    for (int peer = 0; peer < nprocs; ++peer)
        for (int k = 0; k < K; ++k)
            MPI_OK(MPI_Irecv(rbuf + (size_t)(peer * K + k) * size, (int)size, MPI_BYTE, peer,
                             700 + k, MPI_COMM_WORLD, &reqs[r++]));
    for (int peer = 0; peer < nprocs; ++peer)
        for (int k = 0; k < K; ++k) {
            unsigned char *b = sbuf + (size_t)(peer * K + k) * size;
            fill(b, size, rank * 1000 + peer, 700 + k);
            MPI_OK(MPI_Isend(b, (int)size, MPI_BYTE, peer, 700 + k, MPI_COMM_WORLD, &reqs[r++]));
        }
    MPI_OK(MPI_Waitall(nreq, reqs, MPI_STATUSES_IGNORE));
    for (int peer = 0; peer < nprocs; ++peer)
        for (int k = 0; k < K; ++k) {
            size_t bad =
                verify(rbuf + (size_t)(peer * K + k) * size, size, peer * 1000 + rank, 700 + k);
            CHECK(bad == size, "many: from %d tag %d differs at byte %zu", peer, 700 + k, bad);
        }
    free(reqs);
    free(sbuf);
    free(rbuf);
}

static void test_ssend(void) {
    const size_t sizes[] = {0, 10, 100000, 5u << 20};
    for (int k = 0; k < 4; ++k) {
        size_t size = sizes[k];
        unsigned char *sbuf = xmalloc(size), *rbuf = xmalloc(size);
        STEP("ssend %zu B", size);
        fill(sbuf, size, rank, 800 + k);
        MPI_Request req;
        MPI_Status st;
        MPI_OK(MPI_Irecv(rbuf, (int)size, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD,
                         &req));
        MPI_OK(MPI_Ssend(sbuf, (int)size, MPI_BYTE, right, 800 + k, MPI_COMM_WORLD));
        MPI_OK(MPI_Wait(&req, &st));
        check_status(&st, left, 800 + k, size, "ssend");
        CHECK(verify(rbuf, size, left, 800 + k) == size, "ssend %zu B: data differs", size);

        /* Sendrecv_replace: the buffer travels one step around the ring. */
        fill(sbuf, size, rank, 850 + k);
        MPI_OK(MPI_Sendrecv_replace(sbuf, (int)size, MPI_BYTE, right, 850 + k, left, 850 + k,
                                    MPI_COMM_WORLD, &st));
        check_status(&st, left, 850 + k, size, "sendrecv_replace");
        CHECK(verify(sbuf, size, left, 850 + k) == size, "sendrecv_replace %zu B: data differs",
              size);
        free(sbuf);
        free(rbuf);
    }
}

static void test_cancel(void) {
    unsigned char buf[64];
    MPI_Request req;
    MPI_Status st;
    MPI_OK(MPI_Irecv(buf, sizeof buf, MPI_BYTE, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &req));
    MPI_OK(MPI_Cancel(&req));
    MPI_OK(MPI_Wait(&req, &st));
    int cancelled = 0;
    MPI_OK(MPI_Test_cancelled(&st, &cancelled));
    CHECK(cancelled, "a receive that nothing matches was not cancelled");
    /* The endpoint still works afterwards. */
    int v = rank, got = -1;
    MPI_OK(
        MPI_Sendrecv(&v, 1, MPI_INT, right, 998, &got, 1, MPI_INT, left, 998, MPI_COMM_WORLD, &st));
    CHECK(got == left, "after cancel: got %d from %d", got, left);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    /* Errors come back to us (and are reported with context) instead of aborting blindly. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    start_watchdog();
    left = (rank + nprocs - 1) % nprocs;
    right = (rank + 1) % nprocs;
    if (rank == 0) {
        char host[256] = "?";
        gethostname(host, sizeof host);
        printf("mpi_p2p: %d ranks on %s\n", nprocs, host);
    }

    struct {
        const char *name;
        void (*fn)(void);
    } phases[] = {{"ring", test_ring},     {"probe", test_probe}, {"iprobe", test_iprobe},
                  {"mprobe", test_mprobe}, {"order", test_order}, {"tags", test_tags},
                  {"many", test_many},     {"ssend", test_ssend}, {"cancel", test_cancel}};
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; ++i) {
        STEP("phase %s", phases[i].name);
        phases[i].fn();
        MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
        phase_done(phases[i].name);
    }

    return finish(nprocs);
}
