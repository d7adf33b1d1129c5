"""What the sockets (Unix, TCP, UDP) of a sandbox's network namespace hold in their buffers: kernel memory no
process's resident size and no descriptor's file shows.

A sandbox has a network namespace of its own, so every socket of that namespace is one of its processes' (held
by a descriptor or in flight in another socket's queue: ``/proc/PID/fd`` shows only the first). A Unix socket pair
holds megabytes unread (40 descriptors held 300 MiB here): a process's thousands of descriptors could hold
more than the machine has. ``isolate.Child``'s watchdog adds this count to what it reads (a cgroup v1 charges
Unix sockets' buffers, never TCP's: it counts them either way).

``python -I -S socket_memory.py PID FD`` joins PID's network namespace (and, as a plain user, the user namespace
that owns it: the grader made that one, so it may), opens a ``sock_diag`` netlink socket there and hands it back
over the Unix socket FD (``diag_socket``). Run as its own process: a process joins a user namespace only while it
has a single thread. The grader then asks the kernel through that socket for the memory of every socket of the
namespace (``socket_bytes``), as often as it likes, with no process started per ask (one a second per child was
a third of the grader's short processes). Standard library only, run with ``-I -S``.
"""

import array
import contextlib
import ctypes
import os
import socket
import struct
import subprocess
import sys

NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR = 1, 0x300, 3, 2
UDIAG_SHOW_MEMINFO, UNIX_DIAG_MEMINFO = 0x20, 5
INET_DIAG_SHOW_SKMEMINFO, INET_DIAG_SKMEMINFO = 1 << 6, 7
CLONE_NEWUSER, CLONE_NEWNET, NS_GET_USERNS = 0x10000000, 0x40000000, 0xB701


def _enter(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    if os.geteuid() != 0:  # the grader owns the sandbox's user namespace: inside it, it may join the network's
        import fcntl
        user = fcntl.ioctl(net, NS_GET_USERNS)
        if libc.setns(user, CLONE_NEWUSER) != 0:
            raise OSError(ctypes.get_errno(), "setns user")
    if libc.setns(net, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns net")


def _diag() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)


def _dump(nl: socket.socket, request: bytes, message_bytes: int, meminfo: int) -> int:
    """Sum, over the sockets a ``sock_diag`` dump ``request`` lists, what their memory attribute (``meminfo``, the
    kernel's ``SK_MEMINFO`` array) says they hold: read, and written (in flight or queued)."""
    nl.send(struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
            + request)
    total = 0
    while True:
        data, offset = nl.recv(1 << 20), 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if kind == NLMSG_DONE:
                return total
            if kind == NLMSG_ERROR or length < 16:
                raise OSError("sock_diag refused the dump")
            attribute, end = offset + 16 + message_bytes, offset + length
            while attribute + 4 <= end:
                size, name = struct.unpack_from("=HH", data, attribute)
                if size < 4:
                    break
                if name == meminfo and size >= 4 + 6 * 4:
                    info = struct.unpack_from("=9I", data + b"\0" * 36, attribute + 4)
                    total += info[0] + max(info[2], info[5])
                attribute += (size + 3) & ~3
            offset += (length + 3) & ~3


def socket_bytes(nl: socket.socket | None = None) -> int:
    """The buffers of every Unix, TCP and UDP socket of the network namespace of the ``sock_diag`` socket ``nl``
    (None: this process's), in bytes (a cgroup v1 charges none of TCP's: loopback connections held 300 MiB past a
    memory cgroup's limit)."""
    with contextlib.ExitStack() as stack:
        if nl is None:
            nl = stack.enter_context(_diag())
        unix = struct.pack("=BBHIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, UDIAG_SHOW_MEMINFO, 0) + b"\0" * 4
        total = _dump(nl, unix, 16, UNIX_DIAG_MEMINFO)
        for family in (socket.AF_INET, socket.AF_INET6):
            for protocol in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
                inet = struct.pack("=BBBBI", family, protocol, INET_DIAG_SHOW_SKMEMINFO, 0, 0xFFFFFFFF) + b"\0" * 48
                total += _dump(nl, inet, 72, INET_DIAG_SKMEMINFO)
        return total


def diag_socket(pid: int, timeout_s: float = 20) -> socket.socket | None:
    """A ``sock_diag`` socket of ``pid``'s network namespace (a process of the sandbox), opened there by a helper
    process and kept by the caller for ``socket_bytes``; None where it cannot be had (the process ended, or the
    kernel refuses). The socket holds the namespace, not a process: the caller closes it when the child ends."""
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with here:
        try:
            with there:
                done = subprocess.run([sys.executable, "-I", "-S", __file__, str(pid), str(there.fileno())],
                                      capture_output=True, timeout=timeout_s, pass_fds=(there.fileno(),))
            if done.returncode != 0:
                return None
            here.setblocking(False)  # the helper has ended: what it sent is there, or nothing is
            _, fds, _, _ = socket.recv_fds(here, 1, 1)
        except (OSError, subprocess.SubprocessError):
            return None
    if not fds:
        return None
    nl = socket.socket(fileno=fds[0])
    if nl.family != socket.AF_NETLINK:  # only the helper could have sent it; still, never dump through another
        nl.close()
        return None
    nl.settimeout(timeout_s)  # the kernel answers a dump at once: a watchdog never waits on it for long
    return nl


def _send_diag_socket(pid: int, to: int) -> None:
    _enter(pid)
    with _diag() as nl, socket.socket(fileno=to) as channel:
        channel.sendmsg([b"s"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [nl.fileno()]))])


if __name__ == "__main__":
    _send_diag_socket(int(sys.argv[1]), int(sys.argv[2]))
