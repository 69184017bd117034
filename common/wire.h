// Every byte tandem puts on a wire, in one place: the TCP link's frames and the protocol's
// headers carried inside link sends. All fields are little-endian host order (x86-64 and
// aarch64 clusters); sizes are asserted so a change shows up at compile time. Every field is
// validated on receipt (main_prov/link/tcp_framing.cpp, tcp_served_rma.cpp, tcp_connect.cpp;
// the protocol's messages in main_prov/engine_link.cpp; local cells in offload_prov/ep/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tandem::wire {

// ---------------------------------------------------------------------------------------
// TCP link frames. A frame is a TcpFrame header, then (for RDMA operations) a TcpRdma
// extension, then `length` payload bytes.

inline constexpr uint32_t kTcpMagic = 0x746e6431;  // "tnd1"
inline constexpr uint16_t kTcpVersion = 2;

enum class TcpOp : uint8_t {
    Send = 1,       // two-sided; payload lands in a posted receive buffer of the peer
    Write = 2,      // RDMA write; TcpRdma{addr,key}; payload is the data
    ReadReq = 3,    // RDMA read request; TcpRdma{addr,key,length}; no payload
    ReadResp = 4,   // answer to the oldest outstanding ReadReq; payload is the data
    Nak = 5,        // status for the work request numbered `ack` (remote access error)
    Ack = 6,        // nothing but the piggy-backed acknowledgement
    CmRequest = 7,  // first frame of a connection; payload: TcpCmHello + private data
    CmAccept = 8,   // payload: private data
    CmReject = 9,   // payload: private data
    Disconnect = 10,
};

enum TcpFlags : uint16_t {
    kTcpHasImm = 1u << 0,
    // ReadResp: more frames of this response follow (a response from device memory comes in
    // chunks, each copied to the host before its header leaves).
    kTcpMore = 1u << 1,
    // Send: deliver it only if the Write received just before it on this connection
    // succeeded; otherwise the target drops it (it still counts as received). What a verbs QP
    // does by itself: a failed RDMA write moves it to error and the send behind it is flushed.
    kTcpIfWriteOk = 1u << 2,
};

// SourceFault: the sender could not copy the memory it was to send (a device copy failed);
// it ends a ReadResp or a Write, with no payload. TargetFault: the target of a Write could not
// copy the payload into its device memory; it answers the write with a Nak.
enum class TcpStatus : uint8_t {
    Ok = 0,
    RemoteAccess = 1,
    RemoteInvalid = 2,
    SourceFault = 3,
    TargetFault = 4
};

struct TcpFrame {
    uint8_t op;      // TcpOp
    uint8_t status;  // TcpStatus (ReadResp, Nak)
    uint16_t flags;  // TcpFlags
    uint32_t imm;    // immediate data when kTcpHasImm
    uint32_t ack;    // work requests (Send, Write, ReadReq) of the peer received so far
    uint32_t reserved;
    uint64_t length;  // payload bytes that follow the header (and extension)
};
static_assert(sizeof(TcpFrame) == 24 && std::is_trivially_copyable_v<TcpFrame>);

struct TcpRdma {
    uint64_t addr;
    uint64_t key;
    uint64_t length;  // ReadReq: bytes requested; Write: equal to the frame length
};
static_assert(sizeof(TcpRdma) == 24 && std::is_trivially_copyable_v<TcpRdma>);

struct TcpCmHello {
    uint32_t magic;    // kTcpMagic
    uint16_t version;  // kTcpVersion
    uint16_t reserved;
    uint32_t priv_len;  // private data bytes that follow
    uint32_t reserved2;
};
static_assert(sizeof(TcpCmHello) == 16);

inline constexpr size_t kMaxCmPrivate = 256;

// ---------------------------------------------------------------------------------------
// Protocol messages, carried as link sends (or, for Hello, as connection private data).

inline constexpr uint32_t kProtoMagic = 0x746d7031;  // "tmp1"
inline constexpr uint16_t kProtoVersion = 1;

enum class ProtoOp : uint8_t {
    Eager = 1,        // header + the whole message
    Rts = 2,          // rendezvous request: header + RtsBody; the receiver reads the data
    Fin = 3,          // rendezvous done: FinBody
    DeliveryAck = 4,  // an eager message asking for delivery completion was processed
    WriteNotify = 5,  // an RMA write with remote CQ data just landed: WriteNotifyBody
    AtomicReq = 6,    // an atomic operation for the target to execute: AtomicBody + operands
    AtomicResp = 7,   // its answer (msg_id of the request): AtomicRespBody + fetched values
    RmaReq = 8,       // an RMA the target carries out itself: RmaReqBody; answered by a Fin
};

enum ProtoFlags : uint8_t {
    kProtoTagged = 1u << 0,
    kProtoCqData = 1u << 1,
    kProtoAckReq = 1u << 2,  // sender wants a DeliveryAck carrying msg_id
    kProtoPeer = 1u << 3,    // the offload twins' own traffic (FI_PEER_TRANSFER): matched
                             // only against the twin's receives, never the application's
};

struct ProtoHeader {
    uint8_t op;     // ProtoOp
    uint8_t flags;  // ProtoFlags
    uint16_t reserved;
    uint32_t reserved2;
    uint64_t tag;
    uint64_t cq_data;
    uint64_t size;    // total message bytes (Eager: bytes that follow; Rts: bytes to read)
    uint64_t msg_id;  // sender's operation id, echoed in Fin / DeliveryAck
};
static_assert(sizeof(ProtoHeader) == 40 && std::is_trivially_copyable_v<ProtoHeader>);

inline constexpr size_t kMaxRtsIov = 4;

struct RtsIov {
    uint64_t addr;
    uint64_t length;
    uint64_t key;
};

struct RtsBody {
    uint32_t iov_count;  // 1..kMaxRtsIov
    uint32_t reserved;
    RtsIov iov[kMaxRtsIov];
};
static_assert(sizeof(RtsBody) == 8 + 24 * kMaxRtsIov);

enum class FinStatus : uint32_t { Ok = 0, ReadFailed = 1, Canceled = 2, AccessDenied = 3 };

struct FinBody {
    uint64_t msg_id;
    uint32_t status;  // FinStatus
    uint32_t reserved;
};
static_assert(sizeof(FinBody) == 16);

// RMA served by the target (RmaReq), where the link has keys of its own but the domain's
// regions are not the NIC's (Domain::rma_served: remote-access events, keys of the
// application's choosing, offset addressing). The target resolves (addr, key) in its MR
// table, moves the data itself with RDMA reads from (fi_write) or writes into (fi_read) the
// initiator's buffers, exposed in `buf` under the link's keys as a rendezvous source is,
// counts the access and answers with a Fin: Ok, AccessDenied (key, bounds or access refused)
// or ReadFailed (a transfer failed). hdr.size is the length, hdr.msg_id the initiator's
// operation, kProtoCqData the remote CQ data of an fi_writedata. Requests from one
// connection are served one at a time, and what that connection sends meanwhile waits behind
// them, so every ordering the endpoint promises holds as for RMA the NIC moves.
struct RmaReqTarget {
    uint64_t addr;  // the target address as the initiator named it
    uint64_t key;
    uint32_t write;  // 1: fi_write (data to the target), 0: fi_read
    uint32_t reserved;
};
static_assert(sizeof(RmaReqTarget) == 24);

struct RmaReqBody {
    RmaReqTarget target;
    RtsBody buf;  // iov_count 0 for a zero-length access
};
static_assert(sizeof(RmaReqBody) == 24 + sizeof(RtsBody) &&
              std::is_trivially_copyable_v<RmaReqBody>);

struct WriteNotifyBody {
    uint64_t addr;  // the target address as the initiator named it
    uint64_t length;
    uint64_t key;
};
static_assert(sizeof(WriteNotifyBody) == 24);

// ---------------------------------------------------------------------------------------
// Atomic operations (fi_atomic(3)). The target executes them in its progress engine, so
// the request is the same on the link (after a ProtoHeader, ProtoOp::AtomicReq) and on the
// node-local path (the body of a LocalOp::Atomic cell): an AtomicBody, then `count` operand
// elements (none for FI_ATOMIC_READ), then, for the compare kind, `count` compare elements.
// The answer carries the target's previous values for the fetch and compare kinds.

enum class AtomicKind : uint8_t { Base = 0, Fetch = 1, Compare = 2 };

struct AtomicBody {
    uint8_t op;        // enum fi_op
    uint8_t datatype;  // enum fi_datatype (point-to-point types only: < 16)
    uint8_t kind;      // AtomicKind
    uint8_t reserved;
    uint32_t count;  // elements, 1..atomic::max_count(datatype)
    uint64_t addr;   // the target address as the initiator named it
    uint64_t key;
};
static_assert(sizeof(AtomicBody) == 24 && std::is_trivially_copyable_v<AtomicBody>);

// Link answer to an AtomicReq: status 0 or a positive FI_* error (FI_EACCES: key, bounds or
// access refused; FI_EINVAL: a misaligned target or a malformed request; FI_EIO: the target's
// device memory could not be copied), then `length` bytes of fetched values (0 on error and
// for the base kind).
struct AtomicRespBody {
    int32_t status;
    uint32_t reserved;
    uint64_t length;
};
static_assert(sizeof(AtomicRespBody) == 16);

// Private data of a connection request (after the link's own hello): this, then addr_len
// bytes of name, then user_len bytes of application data, and nothing else
// (main_prov/conn_hello.cpp builds and checks it).
enum class ConnKind : uint8_t { Msg = 1, Rdm = 2 };
inline constexpr uint16_t kConnHelloVersion = 2;

struct ConnHello {
    uint32_t magic;     // kProtoMagic
    uint16_t version;   // kConnHelloVersion
    uint8_t kind;       // ConnKind
    uint8_t addr_len;   // bytes of the sender's RDM endpoint name that follow (RDM only)
    uint32_t user_len;  // bytes of application connection data that follow the name (MSG only)
    uint32_t reserved;
    uint64_t auth;  // the connecting endpoint's authorization key, as a digest (0: none); the
                    // listener refuses a request whose key is not its endpoint's
};
static_assert(sizeof(ConnHello) == 24 && std::is_trivially_copyable_v<ConnHello>);

// ---------------------------------------------------------------------------------------
// Node-local path (off_tandem): cells of the receiver's inbox ring in its shared segment.
// A cell is a LocalHeader, then the sender's endpoint name (name_len bytes, padded to
// kLocalNameRoom), then the body: inline data, or LocalIov entries naming the sender's
// buffers for a single copy by cross-memory attach (process_vm_readv / _writev).

inline constexpr uint32_t kLocalCellSize = 8192;  // ring cell payload, header included
inline constexpr size_t kLocalNameRoom = 32;      // a sockaddr_in6 fits

enum class LocalOp : uint8_t {
    Eager = 1,        // whole message inline
    Rts = 2,          // the receiver reads the sender's LocalIov list (CMA), then answers Fin
    Frag = 3,         // staged message (no CMA): `size` bytes at `offset` of a `total`-byte message
    Fin = 4,          // msg_id done: status in `status` (receive side of Rts, or RMA done)
    Write = 5,        // RMA write: inline data, or LocalIov list to read (CMA); target answers Fin
    Read = 6,         // RMA read: LocalIov list the target writes into (CMA); target answers Fin
    WriteFrag = 7,    // staged RMA write: `size` bytes for rma_addr + offset
    ReadData = 8,     // staged RMA read answer: `size` bytes at `offset` of read msg_id
    Cts = 9,          // receiver to sender of Rts msg_id: write your bytes from `offset`, `total`
                      // of them, into my LocalIov list (process `pid`), while I read the rest;
                      // `rma_key`: the claim (slot << 32 | generation) in my segment's split
                      // table that whoever copies that part takes first (kLocalNoClaim: none)
    WriteDone = 10,   // sender to receiver: the Cts part of msg_id is written (`status`)
    IpcRts = 11,      // device memory peer to peer: the receiver maps the sender's LocalIpc
                      // handles and copies with its device's engine, then answers Fin
    Short = 12,       // an Eager message nobody waits a Fin for, under a LocalShortHeader
    Atomic = 13,      // an atomic operation, under a LocalShortHeader (see below); the
                      // target executes it and answers AtomicResp
    AtomicResp = 14,  // its answer, under a LocalShortHeader without a name (see below)
    IpcWrite = 15,    // RMA write from device memory peer to peer: the target maps the
                      // initiator's LocalIpc handles and copies into the region with its
                      // device's engine, then answers Fin (FI_EOPNOTSUPP: it could not map
                      // them, and the initiator writes again staged)
};

// Rts messages of at least this size are copied by both sides at once (Cts / WriteDone):
// the receiver reads the first half while the sender writes the second.
inline constexpr uint64_t kLocalSplitMin = 256 * 1024;
inline constexpr uint64_t kLocalNoClaim = ~uint64_t(0);

// An operation id (msg_id) is its sender's own, only echoed by the receiver. One endpoint's
// two providers send under one name: tandem's ids have this bit, off_tandem's do not, so that
// the answers (Fin, Cts) reach the operation's owner and no receiver confuses two messages.
inline constexpr uint64_t kLocalOwnerOp = uint64_t(1) << 63;

enum LocalFlags : uint8_t {
    kLocalTagged = 1u << 0,
    kLocalCqData = 1u << 1,
    kLocalLast = 1u << 2,    // last Frag / WriteFrag of its message
    kLocalAckReq = 1u << 3,  // the sender waits for a Fin once the message is delivered
    // A Frag of a device message whose receiver could not map its IpcRts: the staged copy
    // sent again, or the empty last Frag that ends it with an error (FI_HMEM_P2P_REQUIRED).
    // The receive it goes to was matched already, by whoever decodes IpcRts.
    kLocalRestaged = 1u << 4,
};

struct LocalHeader {
    uint8_t op;     // LocalOp
    uint8_t flags;  // LocalFlags
    uint8_t name_len;
    uint8_t iov_count;  // LocalIov entries in the body (Rts, Write, Read)
    int32_t status;     // Fin: 0 or a positive FI_* error code
    uint32_t size;      // inline bytes in this cell
    int32_t pid;        // sender's pid (the process CMA reads from or writes to)
    uint64_t msg_id;    // sender's operation id, echoed in Fin
    uint64_t tag;
    uint64_t cq_data;
    uint64_t total;     // bytes of the whole message / RMA
    uint64_t offset;    // Frag, WriteFrag: where this cell's bytes go
    uint64_t rma_addr;  // Write, Read: target address and key
    uint64_t rma_key;
};
static_assert(sizeof(LocalHeader) == 72 && std::is_trivially_copyable_v<LocalHeader>);

// The cell of a Short message: this header, the sender's name (name_len bytes, padded to a
// multiple of 8), then the data. A small message then fits the cell's first cache line
// (ShmRing's 16-byte sequence + 24 + a 16-byte IPv4 name + up to 8 bytes), so the receiver
// waits for one line from the sender's core instead of two. Everything a Short cell leaves
// out is implied: total == size, no id (nobody answers it), no pid, no offset.
struct LocalShortHeader {
    uint8_t op;  // LocalOp::Short
    uint8_t flags;
    uint8_t name_len;
    uint8_t reserved;
    uint32_t size;
    uint64_t tag;
    uint64_t cq_data;
};
static_assert(sizeof(LocalShortHeader) == 24 && std::is_trivially_copyable_v<LocalShortHeader>);

inline constexpr size_t local_short_body_offset(size_t name_len) {
    return sizeof(LocalShortHeader) + (name_len + 7) / 8 * 8;
}

// Atomic and AtomicResp cells use the same compact header, so that a small atomic's request
// takes two cache lines of the ring and its answer one (the long header would take three and
// two): Atomic: `size` = bytes of the request (AtomicBody + operands) after the name, `tag` =
// the initiator's operation id, `cq_data` = the remote CQ data (flag kLocalCqData).
// AtomicResp: the target's name (the initiator takes the answer only from the target it
// asked), `size` = bytes of previous values that follow the name, `tag` = the id, `cq_data` =
// the status (0 or a positive FI_* error).

inline constexpr size_t kLocalMaxIov = 4;

struct LocalIov {
    uint64_t addr;
    uint64_t length;
};

inline constexpr size_t kLocalBodyRoom = kLocalCellSize - sizeof(LocalHeader) - kLocalNameRoom;

// One device buffer of an IpcRts: the interface's IPC handle of the allocation holding it
// and where in the allocation it lies. The receiver checks iface and bounds before mapping.
struct LocalIpc {
    uint8_t handle[64];  // hmem::IpcHandle (CUDA: CUipcMemHandle)
    uint64_t buffer_id;  // of the allocation, for the receiver's cache of mappings
    uint64_t alloc_len;
    uint64_t offset;  // of the buffer in its allocation
    uint64_t length;
    uint64_t addr;    // the buffer in the sender's address space (a receiver in the same
                      // process copies from it directly: no IPC handle opens in its own process)
    uint32_t iface;   // fi_hmem_iface
    uint32_t device;  // the sender's device
};
static_assert(sizeof(LocalIpc) == 112 && std::is_trivially_copyable_v<LocalIpc>);
static_assert(kLocalBodyRoom >= kLocalMaxIov * sizeof(LocalIpc));

// ---------------------------------------------------------------------------------------
// The offload twins' own messages to each other across nodes: collectives
// (offload_prov/coll/), carried as peer transfers (FI_PEER_TRANSFER) over tandem's endpoint
// with kProtoPeer, tagged
//   bits 60-63: 0xC, collective traffic
//   bits 28-59: the group (a hash both ends compute from its members and join number)
//   bits 12-27: the operation's number in its group (wraps)
//   bits  0-11: the round of the operation's schedule
// so a collective's messages never meet an application's (peer transfers are matched only
// against the twin's receives) nor another group's, operation's or round's.
// Round 0xfff is no operation's: it is the group's notice channel (CollNotice).
inline constexpr uint64_t kCollTagClass = 0xcull << 60;
inline constexpr uint64_t kCollNoticeRound = 0xfff;
inline constexpr uint64_t coll_tag(uint32_t group, uint16_t seq) {
    return kCollTagClass | uint64_t(group) << 28 | uint64_t(seq) << 12;
}
inline constexpr uint64_t coll_notice_tag(uint32_t group) {
    return coll_tag(group, 0) | kCollNoticeRound;
}

// What a member tells the others of a group outside any operation's rounds: that operation
// `seq` failed at its end (err, a fabric errno: every member then fails it too, so none waits
// for a message that will never come), or nothing (a probe, sent to a member that has been
// silent too long: only whether it can be delivered matters).
inline constexpr uint32_t kCollNoticeMagic = 0x636e7431;  // "cnt1"
enum class CollNoticeKind : uint16_t { Abort = 1, Probe = 2 };
struct CollNotice {
    uint32_t magic;  // kCollNoticeMagic
    uint16_t kind;   // CollNoticeKind
    uint16_t seq;    // the operation (Abort)
    int32_t err;     // positive fabric errno (Abort)
    uint32_t reserved;
};
static_assert(sizeof(CollNotice) == 16);

static_assert(kLocalBodyRoom >= kLocalMaxIov * sizeof(LocalIov));

// ---------------------------------------------------------------------------------------
// The NCCL network plugin (nccl_plugin/): its own protocol, carried by tandem's RDM endpoint
// through the public libfabric API (tagged messages, RMA writes). Tags:
//   bits 62-63: NcclTagKind
//   bits 44-61: the destination comm's number on its endpoint (18 bits, reused last)
//   bits 12-43: NCCL's tag of the operation (an int)
//   bits  0-11: the operation's number among those of its comm with the same NCCL tag (wraps)
// The k-th send with tag t of a comm meets the k-th receive buffer with tag t of its peer:
// NCCL matches sends to grouped receives in posting order and picks a group's buffer by tag,
// which comes to the same (a group's tags are distinct), and needs no sequence shared by both.
enum class NcclTagKind : uint64_t { Data = 0, Cts = 1, Connect = 2, Accept = 3 };
inline constexpr unsigned kNcclCommBits = 18;
inline constexpr uint32_t kNcclMaxComms = (1u << kNcclCommBits) - 1;  // number 0 is never used
inline constexpr uint16_t kNcclSeqMask = 0xfff;
inline constexpr uint64_t nccl_tag(NcclTagKind kind, uint32_t comm, int32_t tag, uint16_t seq) {
    return uint64_t(kind) << 62 | uint64_t(comm & kNcclMaxComms) << 44 |
           uint64_t(uint32_t(tag)) << 12 | (seq & kNcclSeqMask);
}
// What a receive of every message of one kind to one comm ignores.
inline constexpr uint64_t kNcclCommIgnore = (uint64_t(1) << 44) - 1;

// The handle listen() gives and NCCL carries to the sender out of band (at most 128 bytes).
// `connecting` is the sender's: NCCL passes the same buffer to every connect() call of one
// connection, which keeps its progress there (0 before the first call).
inline constexpr uint32_t kNcclHandleMagic = 0x6e746e64;  // "dntn"
inline constexpr uint16_t kNcclVersion = 1;
inline constexpr size_t kNcclMaxAddr = 64;
struct NcclHandle {
    uint32_t magic;  // kNcclHandleMagic
    uint16_t version;
    uint8_t addr_len;  // bytes of addr used: the listener's fi_getname
    uint8_t reserved;
    uint32_t listen_comm;  // the listener's comm number (Connect tags)
    uint32_t reserved2;
    uint64_t nonce;  // random per listen: a Connect must repeat it
    uint8_t addr[kNcclMaxAddr];
    uint64_t connecting;  // the sender's send comm while connecting
};
static_assert(sizeof(NcclHandle) == 96 && std::is_trivially_copyable_v<NcclHandle>);

// Connect (sender to listener) and Accept (listener to sender): the comm numbers each side's
// tags use for the other, the listener's nonce echoed both ways, and the sender's address.
struct NcclConnect {
    uint32_t magic;  // kNcclHandleMagic
    uint16_t version;
    uint8_t addr_len;
    uint8_t reserved;
    uint32_t comm;  // Connect: the sender's send comm; Accept: the listener's new recv comm
    uint32_t reserved2;
    uint64_t nonce;
    uint8_t addr[kNcclMaxAddr];  // Connect only
};
static_assert(sizeof(NcclConnect) == 88 && std::is_trivially_copyable_v<NcclConnect>);

// Clear to send, receiver to sender, one per receive buffer: where a send larger than the eager
// limit is to be written. A Cts message carries 1 to kNcclCtsBatch of them (the buffers the
// receiver posted since its last message). Remote CQ data of the 0-byte Data message that
// follows such a write: the bytes written, or kNcclFinTruncated | the send's size when the
// buffer was too small (nothing was written then, and both ends fail the operation).
struct NcclCts {
    int32_t tag;    // NCCL's tag
    uint32_t seq;   // the buffer's count among its comm's buffers with that tag (the Data tag
                    // carries its low 12 bits)
    uint64_t addr;  // target address (virtual or offset, as the MR mode says)
    uint64_t key;
    uint64_t size;  // the buffer's size
};
static_assert(sizeof(NcclCts) == 32 && std::is_trivially_copyable_v<NcclCts>);
inline constexpr size_t kNcclCtsBatch = 64;  // 2 KiB: under tandem's inject size
inline constexpr uint64_t kNcclFinTruncated = uint64_t(1) << 63;
// ... or kNcclFinFailed | the send's size when the write failed (the buffer holds nothing usable).
inline constexpr uint64_t kNcclFinFailed = uint64_t(1) << 62;

}  // namespace tandem::wire
