/* Collective checks for Open MPI over a libfabric provider (pml cm / mtl ofi).
 *
 * Open MPI's collectives (coll tuned/basic/libnbc) are built on point-to-point messages, so
 * these exercise the provider with the message patterns real applications produce:
 *   barrier    a late rank holds everyone back; many barriers in a row
 *   bcast      every root, 0 B .. 16 MiB
 *   allreduce  sum/max/min/prod over int, long long and double, in place and not, 1 .. 1M items
 *   alltoall   1 .. 64K items per peer, and alltoallv with uneven counts
 *   allgather  and reduce_scatter_block
 *   nonblock   Ibcast and Iallreduce overlapping each other
 *   split      collectives on sub-communicators (distinct communicator ids in the tags)
 * Rank 0 prints "mpi_coll: PASS" or "mpi_coll: FAIL"; the exit code is non-zero on any failure.
 */
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int nprocs;
#define PROGRAM "mpi_coll"
#include "mpi_check.h"

static void phase_done(const char *name) {
    long all;
    MPI_OK(MPI_Allreduce(&failures, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) printf("mpi_coll: %-10s %s\n", name, all ? "FAILED" : "ok");
    fflush(stdout);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_barrier(void) {
    /* The late rank enters the second barrier 400 ms after it left the first, so nobody may
     * leave the second barrier less than 400 ms after entering the first (the late rank
     * could not leave the first before everyone had entered it). Timing from the exit of
     * the first barrier would be wrong: a rank may leave it later than the late rank did. */
    for (int late = 0; late < nprocs; late += (nprocs > 1 ? nprocs - 1 : 1)) {
        MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
        double t0 = MPI_Wtime();
        MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
        if (rank == late) sleep_ms(400);
        MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
        double waited = MPI_Wtime() - t0;
        CHECK(waited >= 0.35, "barrier returned after %.3f s while rank %d was still sleeping",
              waited, late);
        if (nprocs == 1) break;
    }
    for (int i = 0; i < 200; ++i) MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
}

static void test_bcast(void) {
    static const size_t sizes[] = {0, 1, 8, 1000, 65536, 1u << 20, 16u << 20};
    unsigned char *buf = xmalloc(16u << 20);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; ++k) {
        size_t size = sizes[k];
        for (int root = 0; root < nprocs; ++root) {
            STEP("bcast %zu B from root %d", size, root);
            if (rank == root)
                for (size_t i = 0; i < size; ++i) buf[i] = pattern(i, root, (int)k);
            else
                memset(buf, 0, size);
            MPI_OK(MPI_Bcast(buf, (int)size, MPI_BYTE, root, MPI_COMM_WORLD));
            size_t bad = size;
            for (size_t i = 0; i < size; ++i)
                if (buf[i] != pattern(i, root, (int)k)) {
                    bad = i;
                    break;
                }
            CHECK(bad == size, "bcast %zu B from root %d: byte %zu differs", size, root, bad);
        }
    }
    free(buf);
}

static void test_allreduce(void) {
    static const int counts[] = {1, 7, 1000, 65536, 1 << 20};
    const long long n = nprocs;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; ++k) {
        int count = counts[k];
        STEP("allreduce count %d", count);
        int *in = xmalloc(sizeof(int) * (size_t)count), *out = xmalloc(sizeof(int) * (size_t)count);
        for (int i = 0; i < count; ++i) in[i] = rank * 7 + i % 13;
        MPI_OK(MPI_Allreduce(in, out, count, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
        for (int i = 0; i < count; ++i) {
            long long expect = 7 * n * (n - 1) / 2 + n * (i % 13);
            if (out[i] != expect) {
                CHECK(0, "allreduce int sum count %d: [%d] = %d, expected %lld", count, i, out[i],
                      expect);
                break;
            }
        }
        /* in place, MAX */
        for (int i = 0; i < count; ++i) out[i] = (i + rank) % nprocs;
        MPI_OK(MPI_Allreduce(MPI_IN_PLACE, out, count, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
        for (int i = 0; i < count; ++i)
            if (out[i] != nprocs - 1) {
                CHECK(0, "allreduce in-place max count %d: [%d] = %d", count, i, out[i]);
                break;
            }
        free(in);
        free(out);

        double *din = xmalloc(sizeof(double) * (size_t)count),
               *dout = xmalloc(sizeof(double) * (size_t)count);
        for (int i = 0; i < count; ++i) din[i] = -1.5 * rank + i * 0.25;
        MPI_OK(MPI_Allreduce(din, dout, count, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
        for (int i = 0; i < count; ++i)
            if (dout[i] != -1.5 * (nprocs - 1) + i * 0.25) {
                CHECK(0, "allreduce double min count %d: [%d] = %g", count, i, dout[i]);
                break;
            }
        free(din);
        free(dout);
    }
    long long v = rank + 2, prod = 0, expect = 1;
    for (int r = 0; r < nprocs; ++r) expect *= r + 2;
    MPI_OK(MPI_Allreduce(&v, &prod, 1, MPI_LONG_LONG, MPI_PROD, MPI_COMM_WORLD));
    CHECK(prod == expect, "allreduce long long prod = %lld, expected %lld", prod, expect);
}

static int64_t a2a_value(int from, int to, int k) {
    return (int64_t)from * 1000000007LL + to * 100003LL + k;
}

static void test_alltoall(void) {
    static const int counts[] = {1, 3, 100, 4096, 65536};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; ++c) {
        int count = counts[c];
        STEP("alltoall count %d", count);
        size_t total = (size_t)count * (size_t)nprocs;
        int64_t *s = xmalloc(sizeof(int64_t) * total), *r = xmalloc(sizeof(int64_t) * total);
        for (int to = 0; to < nprocs; ++to)
            for (int k = 0; k < count; ++k) s[(size_t)to * count + k] = a2a_value(rank, to, k);
        memset(r, 0, sizeof(int64_t) * total);
        MPI_OK(MPI_Alltoall(s, count, MPI_INT64_T, r, count, MPI_INT64_T, MPI_COMM_WORLD));
        int bad = 0;
        for (int from = 0; from < nprocs && !bad; ++from)
            for (int k = 0; k < count; ++k)
                if (r[(size_t)from * count + k] != a2a_value(from, rank, k)) {
                    CHECK(0, "alltoall count %d: item %d from rank %d wrong", count, k, from);
                    bad = 1;
                    break;
                }
        free(s);
        free(r);
    }

    /* alltoallv: rank i sends (i + j + 1) * 1000 items to rank j. */
    STEP("alltoallv");
    int *scounts = xmalloc(sizeof(int) * (size_t)nprocs),
        *rcounts = xmalloc(sizeof(int) * (size_t)nprocs);
    int *sdispl = xmalloc(sizeof(int) * (size_t)nprocs),
        *rdispl = xmalloc(sizeof(int) * (size_t)nprocs);
    int stotal = 0, rtotal = 0;
    for (int j = 0; j < nprocs; ++j) {
        scounts[j] = (rank + j + 1) * 1000;
        rcounts[j] = (j + rank + 1) * 1000;
        sdispl[j] = stotal;
        rdispl[j] = rtotal;
        stotal += scounts[j];
        rtotal += rcounts[j];
    }
    int64_t *s = xmalloc(sizeof(int64_t) * (size_t)stotal),
            *r = xmalloc(sizeof(int64_t) * (size_t)rtotal);
    for (int j = 0; j < nprocs; ++j)
        for (int k = 0; k < scounts[j]; ++k) s[sdispl[j] + k] = a2a_value(rank, j, k);
    MPI_OK(MPI_Alltoallv(s, scounts, sdispl, MPI_INT64_T, r, rcounts, rdispl, MPI_INT64_T,
                         MPI_COMM_WORLD));
    for (int j = 0; j < nprocs; ++j)
        for (int k = 0; k < rcounts[j]; ++k)
            if (r[rdispl[j] + k] != a2a_value(j, rank, k)) {
                CHECK(0, "alltoallv: item %d from rank %d wrong", k, j);
                break;
            }
    free(s);
    free(r);
    free(scounts);
    free(rcounts);
    free(sdispl);
    free(rdispl);
}

static void test_gather_scatter(void) {
    const int count = 50000;
    int *mine = xmalloc(sizeof(int) * count),
        *all = xmalloc(sizeof(int) * (size_t)count * (size_t)nprocs);
    for (int i = 0; i < count; ++i) mine[i] = rank * count + i;
    MPI_OK(MPI_Allgather(mine, count, MPI_INT, all, count, MPI_INT, MPI_COMM_WORLD));
    for (int i = 0; i < count * nprocs; ++i)
        if (all[i] != i) {
            CHECK(0, "allgather: [%d] = %d", i, all[i]);
            break;
        }
    /* reduce_scatter_block: everyone contributes all; rank r gets the sum of block r. */
    int *out = xmalloc(sizeof(int) * count);
    MPI_OK(MPI_Reduce_scatter_block(all, out, count, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    for (int i = 0; i < count; ++i)
        if (out[i] != nprocs * (rank * count + i)) {
            CHECK(0, "reduce_scatter_block: [%d] = %d", i, out[i]);
            break;
        }
    free(mine);
    free(all);
    free(out);
}

static void test_nonblocking(void) {
    const int count = 200000;
    int *b = xmalloc(sizeof(int) * count), *x = xmalloc(sizeof(int) * count),
        *y = xmalloc(sizeof(int) * count);
    int root = nprocs - 1;
    for (int i = 0; i < count; ++i) {
        b[i] = rank == root ? i ^ 0x5a5a : -1;
        x[i] = rank + i;
    }
    MPI_Request reqs[2];
    MPI_OK(MPI_Ibcast(b, count, MPI_INT, root, MPI_COMM_WORLD, &reqs[0]));
    MPI_OK(MPI_Iallreduce(x, y, count, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &reqs[1]));
    MPI_OK(MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE));
    for (int i = 0; i < count; ++i) {
        if (b[i] != (i ^ 0x5a5a)) {
            CHECK(0, "ibcast: [%d] = %d", i, b[i]);
            break;
        }
    }
    for (int i = 0; i < count; ++i) {
        if (y[i] != nprocs * (nprocs - 1) / 2 + nprocs * i) {
            CHECK(0, "iallreduce: [%d] = %d", i, y[i]);
            break;
        }
    }
    free(b);
    free(x);
    free(y);
}

static void test_split(void) {
    MPI_Comm half, dup;
    MPI_OK(MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half)); /* reversed order inside */
    MPI_OK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    MPI_Comm_set_errhandler(half, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    int hr, hn;
    MPI_Comm_rank(half, &hr);
    MPI_Comm_size(half, &hn);
    int expect_n = (nprocs + 1 - rank % 2) / 2;
    CHECK(hn == expect_n, "split: size %d, expected %d", hn, expect_n);
    /* Traffic on three communicators at once must not cross. */
    int v = rank, sum_half = -1, sum_world = -1, sum_dup = -1;
    MPI_Request reqs[3];
    MPI_OK(MPI_Iallreduce(&v, &sum_half, 1, MPI_INT, MPI_SUM, half, &reqs[0]));
    MPI_OK(MPI_Iallreduce(&v, &sum_world, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &reqs[1]));
    MPI_OK(MPI_Iallreduce(&v, &sum_dup, 1, MPI_INT, MPI_MAX, dup, &reqs[2]));
    MPI_OK(MPI_Waitall(3, reqs, MPI_STATUSES_IGNORE));
    int expect_half = 0;
    for (int r = rank % 2; r < nprocs; r += 2) expect_half += r;
    CHECK(sum_half == expect_half, "split allreduce: %d, expected %d", sum_half, expect_half);
    CHECK(sum_world == nprocs * (nprocs - 1) / 2, "world allreduce: %d", sum_world);
    CHECK(sum_dup == nprocs - 1, "dup allreduce max: %d", sum_dup);
    /* Rank order inside the split communicator is reversed: its root is the highest rank. */
    int root_world = -1;
    int me = rank;
    MPI_OK(MPI_Bcast(hr == 0 ? &me : &root_world, 1, MPI_INT, 0, half));
    if (hr != 0) {
        int highest = rank % 2;
        for (int r = rank % 2; r < nprocs; r += 2) highest = r;
        CHECK(root_world == highest, "split bcast: root is world rank %d, expected %d", root_world,
              highest);
    }
    MPI_OK(MPI_Comm_free(&half));
    MPI_OK(MPI_Comm_free(&dup));
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    /* Errors come back to us (and are reported with context) instead of aborting blindly. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    start_watchdog();
    if (rank == 0) {
        char host[256] = "?";
        gethostname(host, sizeof host);
        printf("mpi_coll: %d ranks on %s\n", nprocs, host);
    }
    struct {
        const char *name;
        void (*fn)(void);
    } phases[] = {{"barrier", test_barrier},
                  {"bcast", test_bcast},
                  {"allreduce", test_allreduce},
                  {"alltoall", test_alltoall},
                  {"allgather", test_gather_scatter},
                  {"nonblock", test_nonblocking},
                  {"split", test_split}};
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; ++i) {
        STEP("phase %s", phases[i].name);
        phases[i].fn();
        phase_done(phases[i].name);
    }
    return finish(nprocs);
}
