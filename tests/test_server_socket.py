"""The server's listening socket (server/launch.py): connections it accepts send each small
write at once. uvicorn serves on it through asyncio, which turns Nagle's algorithm off only on
sockets created as IPPROTO_TCP; with it on, a stream's chunks after the first waited for the
client's delayed ACK on a kept-alive connection (the first tokens ~40 ms late, together)."""
import asyncio
import socket

import pytest

from autoglm_serve.server.launch import bind_socket


def _accepted_nodelay(host: str) -> int:
    sock = bind_socket(host, 0)
    port = sock.getsockname()[1]

    async def run() -> int:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_connection(reader, writer):
            accepted.set_result(writer.get_extra_info("socket").getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connection, sock=sock)   # as uvicorn does
        async with server:
            _, writer = await asyncio.open_connection(host, port)
            nodelay = await asyncio.wait_for(accepted, 10)
            writer.close()
            return nodelay

    return asyncio.run(run())


def test_accepted_connections_have_nagle_off():
    assert _accepted_nodelay("127.0.0.1") != 0


def test_ipv6_listener_too():
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback on this host")
    assert _accepted_nodelay("::1") != 0
