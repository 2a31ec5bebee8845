"""A real multi-node Ray cluster on this host: a head and workers started with ``ray start``, each
with its own temp dir and ports, token authentication on, and torn down by PID (``ray stop`` would
kill every Ray on the host, other tests' included)."""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from netutil import free_port

RAY = str(Path(sys.executable).with_name("ray"))


def _ports(prefix: str, names: tuple[str, ...]) -> list[str]:
    return [f"--{prefix}{n}={free_port()}" for n in names]


def _worker_ports() -> list[str]:
    """A range of 100 worker ports below the ephemeral range, so that no port picked by free_port
    (or by the OS for a client) falls inside it."""
    low = random.randrange(20000, 32000, 100)
    return [f"--min-worker-port={low}", f"--max-worker-port={low + 99}"]


_NODE_PORTS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
               "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")


@dataclass
class RayCluster:
    """``address`` (GCS, host:port), ``dashboard`` (the job server's http URL) and ``token``."""

    address: str
    dashboard: str
    token: str
    temp_dir: Path
    env: dict[str, str]
    nodes: list[str] = field(default_factory=list)
    """Each node's temp dir."""

    def add_node(self, num_cpus: int, num_gpus: int = 0, timeout: float = 90.0) -> None:
        """Join one more worker node (its own temp dir and ports) and wait until the GCS lists it."""
        tmp = tempfile.mkdtemp(prefix="w", dir=self.temp_dir)
        self._start(["--address", self.address, f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
                     f"--temp-dir={tmp}", *_ports("", _NODE_PORTS), *_worker_ports()], tmp)
        self.wait_for_nodes(len(self.nodes), timeout)

    def wait_for_nodes(self, n: int, timeout: float = 90.0) -> None:
        script = ("import ray, sys, time\nray.init(address=sys.argv[1], logging_level='ERROR')\n"
                  "t = time.time()\n"
                  "while len([x for x in ray.nodes() if x['Alive']]) < int(sys.argv[2]) and time.time() - t < 60:\n"
                  "    time.sleep(0.5)\n"
                  "print(len([x for x in ray.nodes() if x['Alive']]))\n")
        out = subprocess.run([sys.executable, "-c", script, self.address, str(n)], env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        if out.stdout.strip() != str(n):
            raise RuntimeError(f"the cluster has {out.stdout.strip()!r} nodes, not {n}: {out.stderr[-2000:]}")

    def _start(self, args: list[str], tmp: str) -> None:
        log = open(Path(tmp) / "ray-start.log", "w")
        proc = subprocess.run([RAY, "start", "--node-ip-address=127.0.0.1", "--disable-usage-stats", *args],
                              env=self.env, stdout=log, stderr=subprocess.STDOUT, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start failed: {(Path(tmp) / 'ray-start.log').read_text()[-2000:]}")
        self.nodes.append(tmp)

    def stop(self) -> None:
        """SIGKILL every process started for this cluster: its command line or environment names the
        cluster's root (``RAY_TMPDIR`` is inherited by every process Ray starts)."""
        roots = [str(self.temp_dir)]
        for _ in range(3):
            victims = []
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or int(pid) == os.getpid():
                    continue
                try:
                    cmd = (Path("/proc") / pid / "cmdline").read_bytes().decode(errors="replace")
                    environ = (Path("/proc") / pid / "environ").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if any(r in cmd or r in environ for r in roots):
                    victims.append(int(pid))
            if not victims:
                return
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)


def start_cluster(root: Path, head_cpus: int = 1, head_gpus: int = 0) -> RayCluster:
    """A head node on 127.0.0.1 with token auth and a job server on a loopback port."""
    root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_TMPDIR": str(root)}
    env.pop("RAY_ADDRESS", None)
    gcs, dash = free_port(), free_port()
    tmp = tempfile.mkdtemp(prefix="h", dir=root)
    cluster = RayCluster(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", token, root, env)
    cluster._start(["--head", f"--port={gcs}", f"--num-cpus={head_cpus}", f"--num-gpus={head_gpus}",
                    f"--temp-dir={tmp}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={dash}", f"--ray-client-server-port={free_port()}",
                    *_ports("", _NODE_PORTS), *_worker_ports()], tmp)
    cluster.wait_for_nodes(1)
    return cluster
