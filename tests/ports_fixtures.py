"""The servers the tests start: a free TCP port on 127.0.0.1, and stopping the server again."""

import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, *, timeout: float = 20) -> None:
    """Terminate a server the test started; kill it if it has not ended within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
