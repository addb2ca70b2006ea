"""Which process holds a port, read from /proc, against a real listening socket."""

from __future__ import annotations

import os
import socket

import pytest

from diagnose.host.ports import free_port, port_holder


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_port_holder_finds_this_process():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        held = port_holder(port)
        assert held is not None and held[0] == os.getpid()
        assert "python" in held[1] or "pytest" in held[1]
        assert free_port(port, tries=1) is None
    assert port_holder(port) is None


def test_free_port_skips_a_taken_one():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        got = free_port(port)
        assert got is not None and got != port
