#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (corpus/NAME/*): well-formed inputs of each kind,
built from the layouts in common/wire.h, that the fuzzers start from. Run it again after a
change to the wire formats; the files it writes are kept in the repository."""
import os
import socket
import struct

here = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


PROTO_MAGIC, HELLO_VERSION = 0x746D7031, 2
TCP_MAGIC, TCP_VERSION = 0x746E6431, 2
REGION_KEY = 0x1BADCAFE  # fuzz_tcp_link.cpp's region
KEY_MAGIC, PID_MAGIC = 0x4B4B4B4B4B4B4B4B, 0x50494450  # fuzz_local_cell.cpp's placeholders


def sockaddr_in(port, addr="127.0.0.1"):
    return struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(addr) + bytes(8)


def sockaddr_in6(port):
    return struct.pack("<H", socket.AF_INET6) + struct.pack(">HI", port, 0) + socket.inet_pton(socket.AF_INET6, "::1") + struct.pack("<I", 0)


def conn_hello(kind, name=b"", user=b"", auth=0):
    return struct.pack("<IHBBIIQ", PROTO_MAGIC, HELLO_VERSION, kind, len(name), len(user), 0, auth) + name + user


# ---- conn_hello ------------------------------------------------------------------------------
write("conn_hello", "rdm_ipv4", conn_hello(2, sockaddr_in(4000)))
write("conn_hello", "rdm_ipv6", conn_hello(2, sockaddr_in6(4000)))
write("conn_hello", "rdm_auth", conn_hello(2, sockaddr_in(4000), auth=0x1234567890ABCDEF))
write("conn_hello", "msg_user", conn_hello(1, user=b"hello, listener"))
write("conn_hello", "msg_empty", conn_hello(1))
write("conn_hello", "short", conn_hello(2, sockaddr_in(4000))[:20])


# ---- tcp_link --------------------------------------------------------------------------------
def frame(op, payload=b"", ext=None, status=0, flags=0, imm=0, ack=0):
    body = (struct.pack("<QQQ", *ext) if ext else b"") + payload
    return struct.pack("<BBHIIIQ", op, status, flags, imm, ack, 0, len(payload)) + body


def cm_request(priv):
    return frame(7, struct.pack("<IHHII", TCP_MAGIC, TCP_VERSION, 0, len(priv), 0) + priv)


hello = cm_request(conn_hello(2, sockaddr_in(9)))
send = frame(1, bytes(range(100)))
send_imm = frame(1, b"x" * 40, flags=1, imm=7)
write_ok = frame(2, b"w" * 64, ext=(0, REGION_KEY, 64))
write_bad_key = frame(2, b"w" * 64, ext=(0, 0x1234, 64))
write_past = frame(2, b"w" * 64, ext=(4090, REGION_KEY, 64))
read_req = frame(3, ext=(128, REGION_KEY, 256))
read_past = frame(3, ext=(4000, REGION_KEY, 1000))
too_big = frame(1, b"b" * 2000)
ack = frame(6, ack=3)
disconnect = frame(10)
write("tcp_link", "handshake", b"\x01" + hello)
write("tcp_link", "rejected", b"\x00" + hello)
write("tcp_link", "send", b"\x01" + hello + send + send_imm)
write("tcp_link", "write", b"\x01" + hello + write_ok + frame(1, b"after", flags=4))
write("tcp_link", "write_refused", b"\x01" + hello + write_bad_key + write_past)
write("tcp_link", "read", b"\x01" + hello + read_req + read_past)
write("tcp_link", "too_big", b"\x01" + hello + too_big)
write("tcp_link", "everything", b"\x01" + hello + send + write_ok + read_req + ack + send_imm + disconnect)
write("tcp_link", "before_hello", b"\x01" + write_ok + hello)
write("tcp_link", "garbage", b"\x01" + bytes((i * 37) & 0xFF for i in range(300)))


# ---- local_cell ------------------------------------------------------------------------------
NAME4 = 16  # the harness writes the sender's IPv4 name (16 bytes) when control bit 0 is set


def long_cell(op, body=b"", flags=0, iov_count=0, status=0, size=None, msg_id=1, tag=0,
              cq_data=0, total=None, offset=0, rma_addr=0, rma_key=0):
    size = len(body) if size is None else size
    total = size if total is None else total
    hdr = struct.pack("<BBBBiIIQQQQQQQ", op, flags, NAME4, iov_count, status, size, PID_MAGIC, msg_id,
                      tag, cq_data, total, offset, rma_addr, rma_key)
    return hdr + bytes(32) + body


def short_cell(op, body, flags=0, tag=0, cq_data=0):
    return struct.pack("<BBBBIQQ", op, flags, NAME4, 0, len(body), tag, cq_data) + bytes(NAME4) + body


def cells(*items):
    out = b""
    for ctl, c in items:
        out += struct.pack("<BH", ctl, len(c)) + c
    return out


def iov(*pairs):
    return b"".join(struct.pack("<QQ", a, l) for a, l in pairs)


def local_ipc(buffer_id=1, alloc_len=65536, offset=0, length=4096, addr=0, iface=1, device=0):
    return bytes(64) + struct.pack("<QQQQQII", buffer_id, alloc_len, offset, length, addr, iface, device)


def atomic_body(op=0, datatype=8, kind=0, count=1, addr=0, key=KEY_MAGIC, operands=b""):
    return struct.pack("<BBBBIQQ", op, datatype, kind, 0, count, addr, key) + operands


SHORT, EAGER, RTS, FRAG, FIN, WRITE, READ, WRITEFRAG, READDATA, CTS, WRITEDONE, IPCRTS, ATOMIC, ATOMICRESP, IPCWRITE = (
    12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15)
write("local_cell", "short", cells((1, short_cell(SHORT, b"s" * 8)), (1, short_cell(SHORT, b"t" * 64, flags=1, tag=5))))
write("local_cell", "eager", cells((3, long_cell(EAGER, b"e" * 200, flags=1, tag=9))))
write("local_cell", "eager_ackreq", cells((3, long_cell(EAGER, b"a" * 20, flags=8))))
write("local_cell", "frags", cells((3, long_cell(FRAG, b"f" * 4000, total=6000, offset=0)),
                                   (3, long_cell(FRAG, b"g" * 2000, total=6000, offset=4000, flags=4))))
write("local_cell", "rts", cells((3, long_cell(RTS, iov((0x10000, 4096)), iov_count=1, size=0, total=4096))))
write("local_cell", "write_inline", cells((3, long_cell(WRITE, b"w" * 64, rma_addr=0, rma_key=KEY_MAGIC))))
write("local_cell", "write_cma", cells((3, long_cell(WRITE, iov((0x10000, 512)), iov_count=1, size=0, total=512, rma_key=KEY_MAGIC))))
write("local_cell", "read", cells((3, long_cell(READ, iov((0x10000, 512)), iov_count=1, size=0, total=512, rma_key=KEY_MAGIC))))
write("local_cell", "writefrag", cells((3, long_cell(WRITEFRAG, b"q" * 1000, total=3000, offset=1000, rma_key=KEY_MAGIC, flags=4))))
write("local_cell", "fin_readdata", cells((3, long_cell(FIN, status=5)), (3, long_cell(READDATA, b"r" * 100, flags=4))))
write("local_cell", "cts", cells((3, long_cell(CTS, iov((0x10000, 65536)), iov_count=1, size=0, total=300000, offset=150000)),
                                 (3, long_cell(WRITEDONE))))
write("local_cell", "ipc_rts", cells((3, long_cell(IPCRTS, local_ipc(), iov_count=1, size=0, total=4096))))
write("local_cell", "ipc_write", cells((3, long_cell(IPCWRITE, local_ipc(), iov_count=1, size=0, total=4096, rma_key=KEY_MAGIC))))
write("local_cell", "atomic", cells((3, short_cell(ATOMIC, atomic_body(operands=struct.pack("<Q", 5)))),
                                    (3, short_cell(ATOMIC, atomic_body(kind=2, op=0x10, operands=struct.pack("<QQ", 1, 2))))))
write("local_cell", "atomic_resp", cells((2, struct.pack("<BBBBIQQ", ATOMICRESP, 0, 0, 0, 8, 3, 0) + bytes(8))))


# ---- ipc_import ------------------------------------------------------------------------------
write("ipc_import", "real", b"\x03" + local_ipc())
write("ipc_import", "real_tail", b"\x03" + local_ipc(offset=61440, length=4096))
write("ipc_import", "past_end", b"\x03" + local_ipc(offset=61440, length=8192))
write("ipc_import", "lying_alloc_len", b"\x03" + local_ipc(alloc_len=1 << 20, offset=65536, length=4096))
write("ipc_import", "device0", b"\x07" + local_ipc(device=1))
write("ipc_import", "garbage_handle", b"\x02" + local_ipc())
write("ipc_import", "host_iface", b"\x03" + local_ipc(iface=0))
