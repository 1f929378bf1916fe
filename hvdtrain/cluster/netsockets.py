"""Where the ranks listen, and keeping them on the loopback interface when that is enough.

When every rank of a job runs on one host (a job of one rank included: `python train.py`, an
MPI singleton), nothing needs to accept connections from elsewhere, yet Open MPI's TCP transport
listens on every interface of every rank (0.0.0.0 and [::]), and anyone who can reach the node
can connect. `loopback_settings` (exported before MPI_Init; a
user's own export wins) makes ranks use shared memory only (`btl self,vader`: no TCP listener at
all) and Gloo the loopback interface. `listening(pid)` lists a process's listening TCP sockets
from /proc, for the doctor and the tests.
"""
from __future__ import annotations

import ipaddress
import os

from hvdtrain.cluster.env import ClusterEnv

WILDCARDS = ("0.0.0.0", "::")


def single_host(env: ClusterEnv) -> bool:
    return env.local_world_size == env.world_size


def loopback_settings(env: ClusterEnv) -> dict[str, str]:
    if not single_host(env):
        return {}
    return {"OMPI_MCA_btl": "self,vader", "GLOO_SOCKET_IFNAME": "lo"}


def _address(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    # /proc/net/tcp{,6} holds the address as 32-bit words in host (little-endian) order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{ipaddress.ip_address(raw)}:{int(port, 16)}"


def listening(pid: int | str = "self") -> list[str]:
    """The addresses (ip:port) on which process `pid` listens for TCP connections."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to read
        return []
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                found.append(_address(fields[1]))
    return sorted(found)


def exposed(addresses: list[str]) -> list[str]:
    """Those of `addresses` that accept connections from other hosts (not loopback)."""
    return [a for a in addresses if not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback]


