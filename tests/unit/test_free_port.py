"""sluice.testing's ports: below the kernel's ephemeral range, free, never handed out twice."""

from __future__ import annotations

import socket

from sluice.testing import _net
from sluice.testing._net import free_port, port_is_free


def test_ports_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(port_is_free("127.0.0.1", p) for p in ports)
    span = _net._listen_port_range()
    if span is not None:  # Linux: no outgoing connection's source port can take one meanwhile
        assert all(p in span for p in ports)
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            assert span.stop == int(f.read().split()[0])
        assert max(ports) < span.stop  # span.stop: the first ephemeral port


def test_a_port_someone_listens_on_is_never_handed_out() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert not port_is_free("127.0.0.1", taken)
        span = range(taken, taken + 1)
        original = _net._listen_port_range
        _net._listen_port_range = lambda: span  # type: ignore[assignment]
        try:
            try:
                free_port(attempts=5)
            except RuntimeError as exc:
                assert "no free port" in str(exc)
            else:
                raise AssertionError("the listened-on port was handed out")
        finally:
            _net._listen_port_range = original  # type: ignore[assignment]
