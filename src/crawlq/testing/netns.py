"""Simulated hosts for tests and benchmarks: Linux network namespaces on a private bridge.

    with Network(hosts=3) as net:            # needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)
        net.gateway                          # "10.213.X.1": this namespace, on the bridge
        sites = net.add_addresses(2)         # more addresses here, for servers
        host = net.hosts[0]                  # host.name (the namespace), host.address
        proc = host.popen(["python", "-m", "crawlq", ...])   # runs inside the namespace
        net.cut(host); ...; net.restore(host)                # pull the cable, plug it back

Each run takes a /24 of 10.213.0.0/16 that no interface or route here uses yet, and names
everything it makes with a random prefix (`cq` and 6 hex digits), so runs never meet. The
namespaces have no default route: they reach the bridge's addresses and each other, nothing
else. Leaving the `with` block (an error included) kills what still runs in the namespaces
and removes them, their links and the bridge. A failure to create any of it raises
NetnsError: a test that needs hosts fails, it is never skipped.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")
#: The namespace side of every host's link.
INSIDE = "eth0"


class NetnsError(RuntimeError):
    """A namespace, link or address could not be made (not root? no `ip`?)."""


def ip(*args: str) -> str:
    """Runs `ip ARGS...`; its output, or NetnsError with what it said."""
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"ip {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A random /24 of SUPERNET that overlaps no address or route of this namespace."""
    used = [
        ipaddress.IPv4Network(found, strict=False)
        for found in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", ip("-4", "addr") + ip("route"))
    ]
    subnets = list(SUPERNET.subnets(new_prefix=24))
    start = secrets.randbelow(len(subnets))
    for subnet in subnets[start:] + subnets[:start]:
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise NetnsError(f"no free /24 left in {SUPERNET}")


def _holders(subnet: ipaddress.IPv4Network) -> set[str]:
    """The interfaces of this namespace with an address in `subnet`."""
    rows = re.findall(r"^\d+:\s+(\S+)\s+inet\s+(\S+)", ip("-4", "-o", "addr"), re.MULTILINE)
    return {name for name, address in rows if ipaddress.IPv4Interface(address) in subnet}


@dataclass(kw_only=True)
class Host:
    """A namespace `name` whose link `INSIDE` has `address`; `link` is the link's other end,
    on the bridge in this namespace."""

    name: str
    address: str
    link: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host (`ip netns exec` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
        """Starts `argv` inside this host; killed when the network is removed."""
        process: subprocess.Popen[bytes] = subprocess.Popen(self.command(argv), **options)
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """Every process running inside this host now."""
        return [int(pid) for pid in ip("netns", "pids", self.name).split()]

    def unsent(self, address: str) -> int:
        """Bytes this host's TCP sockets (closed ones the kernel still keeps included) have
        yet to get acknowledged by `address`."""
        return socket_queues("dst", address, netns=self.name)[1]


class Network:
    """A bridge in this namespace at `gateway` and `hosts` namespaces linked to it."""

    def __init__(self, hosts: int = 3, *, prefix: str | None = None) -> None:
        self.tag = prefix or f"cq{secrets.token_hex(3)}"
        if len(self.tag) > 10 or not self.tag.isalnum():
            raise NetnsError(f"prefix {self.tag!r}: at most 10 letters and digits")
        self.count = hosts
        self.bridge = f"{self.tag}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.hosts: list[Host] = []
        self._next = 1
        self._undo = contextlib.ExitStack()

    def _subnet(self) -> ipaddress.IPv4Network:
        if self.subnet is None:
            raise NetnsError("the network is not up: use it in a `with` block")
        return self.subnet

    @property
    def network(self) -> str:
        """The run's subnet as CIDR, e.g. for `crawlq crawl --allow-network`."""
        return str(self._subnet())

    @property
    def gateway(self) -> str:
        """This namespace's address on the bridge."""
        return str(self._subnet()[1])

    def _take(self) -> str:
        subnet = self._subnet()
        self._next += 1
        if self._next >= subnet.num_addresses - 1:
            raise NetnsError(f"no address left in {subnet}")
        return str(subnet[self._next])

    def __enter__(self) -> Network:
        try:
            self._build()
        except BaseException:
            self._undo.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._undo.close()

    def _build(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        self._undo.callback(_quietly, "link", "del", self.bridge)
        # Another run may pick the same subnet at the same moment: whoever finds it taken
        # once its own address is on picks again.
        for _ in range(10):
            self.subnet = _free_subnet()
            ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            if _holders(self.subnet) == {self.bridge}:
                break
            ip("addr", "del", f"{self.gateway}/24", "dev", self.bridge)
        else:
            raise NetnsError(f"found no free /24 in {SUPERNET}")
        ip("link", "set", self.bridge, "up")
        for number in range(self.count):
            self.hosts.append(self._add_host(number))

    def _add_host(self, number: int) -> Host:
        host = Host(name=f"{self.tag}h{number}", address=self._take(), link=f"{self.tag}v{number}")
        ip("netns", "add", host.name)
        self._undo.callback(self._remove_host, host)
        ip("link", "add", host.link, "type", "veth", "peer", "name", INSIDE, "netns", host.name)
        ip("link", "set", host.link, "master", self.bridge, "up")
        inside = ["-n", host.name]
        ip(*inside, "addr", "add", f"{host.address}/24", "dev", INSIDE)
        ip(*inside, "link", "set", INSIDE, "up")
        ip(*inside, "link", "set", "lo", "up")
        return host

    def _remove_host(self, host: Host) -> None:
        for process in host.processes:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        with contextlib.suppress(NetnsError):
            for pid in host.pids():  # started inside our namespace by whoever ran the test
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _quietly("link", "del", host.link)  # removes the inside end with it
        _quietly("netns", "del", host.name)

    def add_addresses(self, count: int) -> list[str]:
        """`count` further addresses of this namespace on the bridge, consecutive (for
        servers the hosts reach)."""
        addresses = [self._take() for _ in range(count)]
        for address in addresses:
            ip("addr", "add", f"{address}/24", "dev", self.bridge)
        return addresses

    def cut(self, host: Host) -> None:
        """Cuts `host` off completely: its link goes down on the bridge side, so whatever it
        sends is lost and nothing reaches it (as a pulled cable; its processes keep running
        and their connections stay open)."""
        ip("link", "set", host.link, "down")

    def restore(self, host: Host) -> None:
        """Plugs `host` back in; its connections resume where TCP left them."""
        ip("link", "set", host.link, "up")

    def leftovers(self) -> list[str]:
        """Namespaces and links of this run that still exist (empty once removed)."""
        names = ip("netns", "list") + ip("-o", "link")
        return sorted(set(re.findall(rf"\b{self.tag}\w*", names)))


def socket_queues(*selector: str, netns: str | None = None) -> tuple[int, int]:
    """The bytes waiting in the TCP sockets of `netns` (None: this namespace) that match the
    `ss` filter `selector` (e.g. "dst", "10.213.7.2"): received and not read yet by their
    process, and sent and not acknowledged yet by the peer (closed sockets the kernel still
    keeps included)."""
    command = ["ss", "-tnH", *selector]
    if netns is not None:
        command = ["ip", "netns", "exec", netns, *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NetnsError(f"{' '.join(command)}: {exc}") from exc
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    return sum(int(row[1]) for row in rows), sum(int(row[2]) for row in rows)


def _quietly(*args: str) -> None:
    with contextlib.suppress(NetnsError):
        ip(*args)
