"""A real Redis Cluster on loopback ports, for the tests: 3 primaries, 3 replicas.

Started with ``redis-server --cluster-enabled yes`` and
``redis-cli --cluster create`` (about two seconds), in a temporary directory
that is removed afterwards. Node timeout is one second, so a killed primary
is replaced by its replica in two or three.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_ports(count: int) -> list[int]:
    """``count`` loopback ports free now (and their cluster bus ports, +10000)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 < 65536 and port not in ports:
            ports.append(port)
    return ports


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _command(port: int, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done.stdout


@dataclass
class Cluster:
    """A running test cluster.

    Attributes:
        ports: Every node's port; the first half started as primaries.
        directory: Where the nodes keep their config and data.
    """

    ports: list[int]
    directory: str
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """A URL naming one node (redis-py discovers the others)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    @classmethod
    def start(cls, primaries: int = 3, replicas: int = 1) -> Cluster:
        """Start the nodes, create the cluster, and wait until every slot is served."""
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            raise RuntimeError("redis-server and redis-cli are needed for a cluster")
        cluster = cls(free_ports(primaries * (1 + replicas)), tempfile.mkdtemp(prefix="ctxcl-"))
        for port in cluster.ports:
            cluster.start_node(port)
        addresses = [f"127.0.0.1:{port}" for port in cluster.ports]
        done = subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", str(replicas),
             "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            cluster.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        cluster.wait_ok()
        return cluster

    def start_node(self, port: int) -> None:
        """Start (or restart) the node on ``port``."""
        node_dir = Path(self.directory) / str(port)
        node_dir.mkdir(exist_ok=True)
        self.processes[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", "1000", "--appendonly", "yes", "--appendfsync", "always",
             "--save", "", "--protected-mode", "no", "--repl-diskless-sync-delay", "0",
             "--logfile", str(node_dir / "redis.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not _ping(port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {port} did not start")
            time.sleep(0.01)

    def wait_ok(self, timeout: float = 30) -> None:
        """Wait until every live node says the cluster is ok and every replica is in sync.

        A replica that never finished its first sync cannot be promoted.
        """
        deadline = time.monotonic() + timeout
        while True:
            live = [p for p, proc in self.processes.items() if proc.poll() is None]
            replication = {p: _command(p, "info", "replication") for p in live}
            synced = all(
                "master_link_status:up" in info
                for info in replication.values()
                if "role:slave" in info
            )
            if synced and all("cluster_state:ok" in _command(p, "cluster", "info") for p in live):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become ok")
            time.sleep(0.05)

    def primaries(self) -> list[int]:
        """The ports of the nodes that are primaries now."""
        return [
            port
            for port, proc in self.processes.items()
            if proc.poll() is None and "role:master" in _command(port, "info", "replication")
        ]

    def live(self) -> int:
        """The port of a node that is running."""
        return next(p for p, proc in self.processes.items() if proc.poll() is None)

    def primary_of(self, key: str) -> int | None:
        """The port of the primary serving ``key``'s slot now (None during a failover)."""
        node = self.live()
        slot = int(_command(node, "cluster", "keyslot", key).strip())
        for line in _command(node, "cluster", "nodes").splitlines():
            parts = line.split()
            if "master" in parts[2] and "fail" not in parts[2]:
                for span in parts[8:]:
                    low, _, high = span.partition("-")
                    if low.isdigit() and int(low) <= slot <= int(high or low):
                        return int(parts[1].split(":")[1].split("@")[0])
        return None

    def replica_of(self, primary: int) -> int:
        """The port of a replica of the primary on ``primary``."""
        lines = _command(self.live(), "cluster", "nodes").splitlines()
        primary_id = next(line.split()[0] for line in lines if f":{primary}@" in line)
        for line in lines:
            parts = line.split()
            if parts[3] == primary_id and "fail" not in parts[2]:
                return int(parts[1].split(":")[1].split("@")[0])
        raise RuntimeError(f"{primary} has no replica")

    def pause(self, port: int) -> None:
        """SIGSTOP one node (it stops answering, and replicating)."""
        self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        """SIGCONT a paused node."""
        self.processes[port].send_signal(signal.SIGCONT)

    def cut_replication(self, primary: int) -> None:
        """Drop the primary's links to its replicas (they reconnect, unless paused)."""
        _command(primary, "client", "kill", "type", "replica")

    def kill(self, port: int) -> None:
        """SIGKILL one node."""
        process = self.processes[port]
        process.kill()
        process.wait()

    def stop(self) -> None:
        """Stop every node and remove the directory."""
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
