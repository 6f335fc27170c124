"""Tensors cross to a spawned process intact: large ones through shared memory (memfd), small
ones inline, every dtype and layout; the receiver keeps no file descriptor per tensor."""
import multiprocessing as mp
import os
import select
import threading

import pytest
import torch

from autoglm_serve.engine.process import tensor_channel
from autoglm_serve.engine.process.tensor_channel import TensorChannel


def _echo(conn) -> None:
    """Sends back what it got, with its count of open descriptors."""
    channel = TensorChannel(conn)
    kept = []
    while (msg := channel.recv()) is not None:
        kept.append(msg)          # alive: their mappings must not hold descriptors
        channel.send((msg, len(os.listdir("/proc/self/fd"))))


@pytest.fixture(scope="module")
def echo():
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_echo, args=(child,))
    proc.start()
    child.close()
    channel = TensorChannel(conn)
    yield channel
    channel.send(None)
    proc.join(30)
    channel.close()
    assert proc.exitcode == 0


def test_tensors_round_trip(echo):
    gen = torch.Generator().manual_seed(0)
    msg = {"patches": torch.rand(700, 1176, generator=gen),                 # 3.3 MB: shared memory
           "bf16": torch.rand(1024, 600, generator=gen).bfloat16(),       # shared
           "uint8": torch.randint(0, 255, (2400, 1080, 3), dtype=torch.uint8, generator=gen),
           "positions": torch.arange(3 * 50).reshape(3, 50),              # inline
           "transposed": torch.rand(600, 700, generator=gen).t(),         # not contiguous
           "empty": torch.empty(0, 4), "scalar": torch.tensor(3.5),
           "text": ["not a tensor", 1, None]}
    assert msg["patches"].numel() * 4 >= tensor_channel.SHARE_MIN_BYTES
    fds = []
    for _ in range(3):
        echo.send(msg)
        back, open_fds = echo.recv()
        fds.append(open_fds)
    for key, value in msg.items():
        if isinstance(value, torch.Tensor):
            assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
            assert torch.equal(back[key], value), key
        else:
            assert back[key] == value
    assert fds[0] == fds[1] == fds[2], fds


def test_device_tensors_are_refused(echo):
    with pytest.raises(TypeError, match="cannot be sent to another process"):
        echo.send({"x": torch.zeros(2, device="meta")})
    echo.send({"still": torch.ones(2)})          # the channel still works
    assert torch.equal(echo.recv()[0]["still"], torch.ones(2))


def test_a_reader_that_must_not_wait_gets_whole_messages_only():
    """recv_ready (an event loop's reader) returns the messages that arrived whole, never
    waits for the rest of one (a 4 MB message outgrows the socket's buffer), and reports
    end-of-file only after the last message."""
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe(duplex=True)
    sender, receiver = TensorChannel(a), TensorChannel(b)
    try:
        assert receiver.recv_ready() == []
        sender.send({"n": 1})
        sender.send(["two", torch.arange(4)])
        first, second = receiver.recv_ready()
        assert first == {"n": 1} and torch.equal(second[1], torch.arange(4))

        big = bytes(range(256)) * (4 << 12)
        writer = threading.Thread(target=lambda: (sender.send(big), sender.send("last"),
                                                  sender.close()))
        writer.start()
        got = []
        while len(got) < 2:
            select.select([receiver], [], [], 5)
            got += receiver.recv_ready()
        writer.join()
        assert got == [big, "last"]
        with pytest.raises(EOFError):
            receiver.recv_ready()
    finally:
        receiver.close()
