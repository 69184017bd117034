/* Intercommunicators over a libfabric provider (mtl ofi): what a user's first
 * MPI_Intercomm_create asks of it.
 *
 * Open MPI builds an intercommunicator by inserting the remote group's processes into the
 * provider's AV again (they are already there from MPI_Init) and directing the new
 * communicator's receives at the addresses that second insert returns. Phases:
 *   create   MPI_Comm_split by parity, MPI_Intercomm_create between the halves
 *   p2p      every rank exchanges with the remote group: directed and ANY_SOURCE receives,
 *            status checked for the remote rank and tag, every byte verified
 *   coll     MPI_Bcast (MPI_ROOT) and MPI_Allreduce across the intercommunicator
 *   merge    MPI_Intercomm_merge, then MPI_Allreduce and a ring on the merged communicator
 *   again    a second intercommunicator of the same groups (inserted a third time), and a dup
 * Rank 0 prints "mpi_intercomm: PASS" or "mpi_intercomm: FAIL". Needs an even number of ranks
 * (two groups of equal size), at least 2.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int nprocs;
#define PROGRAM "mpi_intercomm"
#include "mpi_check.h"

static void phase_done(const char *name) {
    long all;
    MPI_OK(MPI_Allreduce(&failures, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) printf("%s: %-8s %s\n", PROGRAM, name, all ? "FAILED" : "ok");
    fflush(stdout);
}

/* Each rank of the local group sends `size` bytes to every remote rank and receives from
 * each: half of the receives directed, half ANY_SOURCE, both checked by status. */
static void exchange(MPI_Comm inter, int tag, size_t size) {
    int lrank, rsize;
    MPI_OK(MPI_Comm_rank(inter, &lrank));
    MPI_OK(MPI_Comm_remote_size(inter, &rsize));
    unsigned char *out = xmalloc(size), *in = xmalloc(size * (size_t)rsize);
    for (size_t i = 0; i < size; ++i) out[i] = pattern(i, lrank, tag);
    MPI_Request *reqs = xmalloc(sizeof(MPI_Request) * 2 * (size_t)rsize);
    MPI_Status *st = xmalloc(sizeof(MPI_Status) * 2 * (size_t)rsize);
    for (int r = 0; r < rsize; ++r) {
        int src = (r % 2) ? MPI_ANY_SOURCE : r;
        MPI_OK(MPI_Irecv(in + (size_t)r * size, (int)size, MPI_BYTE, src, tag, inter, &reqs[r]));
    }
    for (int r = 0; r < rsize; ++r)
        MPI_OK(MPI_Isend(out, (int)size, MPI_BYTE, r, tag, inter, &reqs[rsize + r]));
    MPI_OK(MPI_Waitall(2 * rsize, reqs, st));
    int seen[64] = {0};
    for (int r = 0; r < rsize; ++r) {
        int from = st[r].MPI_SOURCE, count = -1;
        MPI_OK(MPI_Get_count(&st[r], MPI_BYTE, &count));
        CHECK(from >= 0 && from < rsize, "tag %d: source %d is no remote rank", tag, from);
        CHECK(st[r].MPI_TAG == tag, "tag %d: status tag %d", tag, st[r].MPI_TAG);
        CHECK(count == (int)size, "tag %d: count %d, expected %zu", tag, count, size);
        if (r % 2 == 0) CHECK(from == r, "directed receive from %d reports source %d", r, from);
        if (from < 0 || from >= rsize || from >= 64) continue;
        CHECK(!seen[from]++, "tag %d: two messages from remote rank %d", tag, from);
        const unsigned char *b = in + (size_t)r * size;
        for (size_t i = 0; i < size; ++i)
            if (b[i] != pattern(i, from, tag)) {
                CHECK(0, "tag %d: byte %zu from remote rank %d wrong", tag, i, from);
                break;
            }
    }
    free(out), free(in), free(reqs), free(st);
}

static void collectives(MPI_Comm inter, int group) {
    int lrank, lsize, rsize;
    MPI_OK(MPI_Comm_rank(inter, &lrank));
    MPI_OK(MPI_Comm_size(inter, &lsize));
    MPI_OK(MPI_Comm_remote_size(inter, &rsize));
    /* Group 0's rank 0 broadcasts to group 1. */
    int value = -1;
    if (group == 0) {
        value = 4242;
        MPI_OK(MPI_Bcast(&value, 1, MPI_INT, lrank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter));
    } else {
        MPI_OK(MPI_Bcast(&value, 1, MPI_INT, 0, inter));
        CHECK(value == 4242, "intercommunicator bcast gave %d", value);
    }
    /* Each group receives the sum over the other group's ranks (their world ranks). */
    int mine = rank, sum = -1, expect = 0;
    MPI_OK(MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, inter));
    for (int w = 0; w < nprocs; ++w)
        if (w % 2 != group) expect += w;
    CHECK(sum == expect, "intercommunicator allreduce gave %d, expected %d", sum, expect);
    (void)lsize, (void)rsize;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_OK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_OK(MPI_Comm_size(MPI_COMM_WORLD, &nprocs));
    start_watchdog();
    if (nprocs < 2 || nprocs % 2 || nprocs > 64) {
        if (rank == 0) fprintf(stderr, "%s: needs an even number of ranks (2..64)\n", PROGRAM);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const int group = rank % 2;
    MPI_Comm local, inter, merged, inter2, dup;

    STEP("create: MPI_Comm_split");
    MPI_OK(MPI_Comm_split(MPI_COMM_WORLD, group, rank, &local));
    STEP("create: MPI_Intercomm_create");
    MPI_OK(MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, 1 - group, 7, &inter));
    int flag = 0, rsize = 0;
    MPI_OK(MPI_Comm_test_inter(inter, &flag));
    MPI_OK(MPI_Comm_remote_size(inter, &rsize));
    CHECK(flag, "MPI_Intercomm_create made no intercommunicator");
    CHECK(rsize == nprocs / 2, "remote group of %d, expected %d", rsize, nprocs / 2);
    phase_done("create");

    STEP("p2p: small, eager, large");
    exchange(inter, 11, 8);
    exchange(inter, 12, 4096);
    exchange(inter, 13, 1 << 20);
    phase_done("p2p");

    STEP("coll: MPI_Bcast and MPI_Allreduce across");
    collectives(inter, group);
    phase_done("coll");

    STEP("merge: MPI_Intercomm_merge");
    MPI_OK(MPI_Intercomm_merge(inter, group, &merged));
    int mrank = -1, msize = 0, sum = -1;
    MPI_OK(MPI_Comm_rank(merged, &mrank));
    MPI_OK(MPI_Comm_size(merged, &msize));
    CHECK(msize == nprocs, "merged size %d", msize);
    /* high = group: group 0's ranks come first. */
    CHECK(mrank == group * (nprocs / 2) + rank / 2, "merged rank %d for world rank %d", mrank,
          rank);
    STEP("merge: MPI_Allreduce on the merged communicator");
    MPI_OK(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, merged));
    CHECK(sum == nprocs * (nprocs - 1) / 2, "merged allreduce gave %d", sum);
    STEP("merge: ring on the merged communicator");
    int got = -1, next = (mrank + 1) % msize, prev = (mrank + msize - 1) % msize;
    MPI_OK(MPI_Sendrecv(&mrank, 1, MPI_INT, next, 21, &got, 1, MPI_INT, prev, 21, merged,
                        MPI_STATUS_IGNORE));
    CHECK(got == prev, "ring on the merged communicator: got %d from %d", got, prev);
    phase_done("merge");

    STEP("again: a second intercommunicator and a dup");
    MPI_OK(MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, 1 - group, 8, &inter2));
    exchange(inter2, 31, 256);
    MPI_OK(MPI_Comm_dup(inter2, &dup));
    exchange(dup, 32, 256);
    MPI_OK(MPI_Comm_free(&inter));
    exchange(inter2, 33, 64);
    phase_done("again");

    MPI_OK(MPI_Comm_free(&dup));
    MPI_OK(MPI_Comm_free(&inter2));
    MPI_OK(MPI_Comm_free(&merged));
    MPI_OK(MPI_Comm_free(&local));
    return finish(nprocs);
}
