"""One end of a message channel between two processes that ships tensors as shared memory.

Messages are pickled; CPU tensors inside them are not. A small tensor travels as raw bytes in
the message; a large one (a screenshot) is copied once into an anonymous shared-memory file
(memfd) whose descriptor crosses the Unix socket beside the message, and the receiver maps that
file: no further copy, no pickling of the data. Unlike torch.multiprocessing's sharing this
needs no /dev/shm space (containers often get 64 MB) and no resource-sharer thread. Where
memfd is missing (not Linux), every tensor goes as bytes.

A message leaves in one write, so a reader never waits for the rest of it on a sender that
lost the GIL halfway; and ``recv_ready`` never waits at all (an event loop reads with it).
Each end is used by one sending thread and one receiving thread at most.
"""
from __future__ import annotations

import copyreg
import io
import os
import pickle
import socket
import struct
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds, sendfds

import torch

SHARE_MIN_BYTES = 1 << 16        # below this a copy into the message is cheaper than a file
_MAX_FDS_PER_SEND = 200          # the kernel passes at most 253 descriptors per message
_HEADER = struct.Struct("<QI")   # pickle bytes, descriptors sent after the message
_HAS_MEMFD = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def _map_file(fd: int, nbytes: int) -> torch.Tensor:
    # torch maps the file and keeps no descriptor open (mmap.mmap would keep one per tensor)
    return torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=nbytes, dtype=torch.uint8)


def _tensor_from_bytes(data: bytes, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _write_all(fd: int, data) -> None:
    """data into the file: write(2) fills its pages in the kernel, where copying into a fresh
    mapping faulted each page in first (a screenshot's 7.8 MB: 4.5 against 6.2 ms on a 2-core
    host); it drops the GIL like torch's copy did."""
    view = memoryview(data).cast("B")
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])


def _shared_tensor(index: int, nbytes: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    raise RuntimeError("a shared tensor is only rebuilt by TensorChannel")


class _Pickler(pickle.Pickler):
    def __init__(self, file, fds: list[int]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.fds = fds
        # a per-type table: only tensors pay a Python call, the other objects pickle as usual
        self.dispatch_table = copyreg.dispatch_table.copy()
        self.dispatch_table[torch.Tensor] = self._reduce_tensor

    def _reduce_tensor(self, tensor: torch.Tensor):
        if tensor.device.type != "cpu":
            raise TypeError(f"a {tensor.device} tensor cannot be sent to another process: "
                            "keep the front-end's tensors on the CPU")
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        dtype, shape = tensor.dtype, tuple(tensor.shape)
        if flat.numel() < SHARE_MIN_BYTES or not _HAS_MEMFD:
            return _tensor_from_bytes, (flat.numpy().tobytes(), dtype, shape)
        fd = os.memfd_create("autoglm-tensor", os.MFD_CLOEXEC)
        try:
            _write_all(fd, flat.numpy())
        except BaseException:
            os.close(fd)
            raise
        self.fds.append(fd)
        return _shared_tensor, (len(self.fds) - 1, flat.numel(), dtype, shape)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, fds: list[int]):
        super().__init__(file)
        self.fds = fds

    def find_class(self, module: str, name: str):
        if module == __name__ and name == "_shared_tensor":
            return self._shared_tensor     # bound to this message's descriptors
        return super().find_class(module, name)

    def _shared_tensor(self, index: int, nbytes: int, dtype: torch.dtype, shape: tuple):
        return _map_file(self.fds[index], nbytes).view(dtype).reshape(shape)


class TensorChannel:
    def __init__(self, conn: Connection):
        """conn: one end of a duplex multiprocessing Pipe (a Unix socket pair), which this
        channel takes over."""
        self._sock = socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
        conn.close()
        self._buffer = bytearray()     # received bytes not yet part of a whole message

    def send(self, obj) -> None:
        fds: list[int] = []
        buf = io.BytesIO()
        buf.write(bytes(_HEADER.size))
        try:
            _Pickler(buf, fds).dump(obj)
            view = buf.getbuffer()
            _HEADER.pack_into(view, 0, len(view) - _HEADER.size, len(fds))
            self._sock.sendall(view)
            view.release()
            for i in range(0, len(fds), _MAX_FDS_PER_SEND):
                sendfds(self._sock, fds[i:i + _MAX_FDS_PER_SEND])
        finally:
            for fd in fds:      # the receiver holds its own descriptors now
                os.close(fd)

    def recv(self):
        """The next message, waiting for it; EOFError once the other end is closed."""
        while (frame := self._next_frame()) is None:
            self._read(block=True)
        return self._load(*frame)

    def recv_ready(self) -> list:
        """The messages that have arrived whole, without waiting (for an event loop's reader:
        call it when the socket is readable); EOFError once the other end is closed."""
        messages = []
        try:
            while self._read(block=False):
                if (frame := self._next_frame()) is not None:
                    messages.append(self._load(*frame))
        except EOFError:
            if not messages:
                raise
        return messages     # an end-of-file after them shows at the next call

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def _read(self, block: bool) -> bool:
        """Reads what the current message still lacks, never past it: the byte after a
        message may carry its descriptors, which a plain read would drop. False when
        nothing was there (without ``block``)."""
        missing = _HEADER.size - len(self._buffer)
        if missing <= 0:
            missing += _HEADER.unpack_from(self._buffer)[0]
        try:
            data = self._sock.recv(missing, 0 if block else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        if not data:
            raise EOFError("the other end of the channel is closed")
        self._buffer += data
        return True

    def _next_frame(self) -> tuple[bytes, int] | None:
        if len(self._buffer) < _HEADER.size:
            return None
        size, num_fds = _HEADER.unpack_from(self._buffer)
        if len(self._buffer) < _HEADER.size + size:
            return None
        with memoryview(self._buffer) as view:
            payload = bytes(view[_HEADER.size:])
        self._buffer.clear()
        return payload, num_fds

    def _load(self, payload: bytes, num_fds: int):
        fds: list[int] = []
        try:
            # the descriptors follow their message; nothing else is sent until they are
            while len(fds) < num_fds:
                fds += recvfds(self._sock, min(_MAX_FDS_PER_SEND, num_fds - len(fds)))
            return _Unpickler(io.BytesIO(payload), fds).load()
        finally:
            for fd in fds:      # each tensor maps its file; the descriptors are not needed
                os.close(fd)
