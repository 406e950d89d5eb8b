"""A fault-injecting TCP proxy: one per agent, between it and the backend.

It forwards bytes both ways and, when told, misbehaves as a network does:
added latency on each request, every open connection dropped, a blackhole
(nothing gets through, nothing is refused) for some seconds, an answer lost
after its request reached the store (the request is forwarded, the response
discarded and the connection closed), or a reset in the middle of a response
(part of it forwarded, then an RST from an SO_LINGER 0 close). The proxy
works on bytes, not on any one protocol: a "request" is the next chunk a
client sends, a "response" the next chunk the server sends back.

A second port (`side_port`) carries the runs' own traffic to the store (the
counter, counter.py) through the same latency, drops and blackholes; an
answer lost or reset is armed against the agent, so only its connections
take those.
"""

import asyncio
import socket
import struct
import time

CHUNK = 65536


def _abort(writer, rst=True):
    """Closes at once; with `rst`, as an RST (SO_LINGER 0) rather than a FIN."""
    if writer is None:
        return
    try:
        if rst:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    except (OSError, RuntimeError):
        pass


class Conn:
    def __init__(self, proxy, client_writer):
        self.proxy = proxy
        self.client = client_writer
        self.server = None
        self.mode = None  # None, "lost", "reset" (the next response), "side" (none)
        self.dead = False  # caught in a blackhole: discards all, aborted when it ends
        self.closed = False

    def close(self, rst=True):
        if not self.closed:
            self.closed = True
            _abort(self.client, rst)
            _abort(self.server, rst)
            self.proxy.conns.discard(self)


class Proxy:
    def __init__(self, name, upstream_host, upstream_port):
        self.name = name
        self.upstream = (upstream_host, upstream_port)
        self.conns = set()
        self.server = None
        self.side = None
        self.port = None
        self.side_port = None
        self.latency_s = 0.0
        self.latency_until = 0.0
        self.blackhole_until = 0.0
        self.armed = []  # "lost" / "reset" faults waiting for the next request
        self.fired = []  # (kind, monotonic ns) of armed faults that took effect
        self.forwarded = 0

    async def start(self):
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.side = await asyncio.start_server(
            lambda r, w: self._accept(r, w, side=True), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.side_port = self.side.sockets[0].getsockname()[1]
        return self.port

    async def close(self):
        servers = [s for s in (self.server, self.side) if s is not None]
        for s in servers:
            s.close()
        for conn in list(self.conns):
            conn.close()
        for s in servers:
            try:
                await asyncio.wait_for(s.wait_closed(), 2)
            except asyncio.TimeoutError:
                pass

    # --- faults -----------------------------------------------------------

    def blackholed(self):
        return time.monotonic() < self.blackhole_until

    def add_latency(self, seconds, duration):
        self.latency_s = seconds
        self.latency_until = time.monotonic() + duration

    def drop_all(self):
        """Drops every open connection; returns how many there were."""
        conns = list(self.conns)
        for conn in conns:
            conn.close(rst=True)
        return len(conns)

    async def blackhole(self, duration):
        """Nothing gets through for `duration` s; connections caught in it are then reset."""
        self.blackhole_until = time.monotonic() + duration
        await asyncio.sleep(duration)
        for conn in list(self.conns):
            if conn.dead:
                conn.close(rst=True)

    def arm(self, kind):
        self.armed.append(kind)

    def disarm(self, kind):
        """Takes back an armed fault that never met a request; True if it was still armed."""
        if kind in self.armed:
            self.armed.remove(kind)
            return True
        return False

    # --- forwarding -------------------------------------------------------

    async def _accept(self, reader, writer, side=False):
        conn = Conn(self, writer)
        if side:
            conn.mode = "side"  # never takes an armed fault
        self.conns.add(conn)
        try:
            if self.blackholed():
                conn.dead = True
                await self._swallow(reader)
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.upstream), 5)
            except (OSError, asyncio.TimeoutError):
                conn.close()
                return
            conn.server = up_writer
            await asyncio.gather(
                self._pump(conn, reader, up_writer, upward=True),
                self._pump(conn, up_reader, writer, upward=False))
        except Exception:
            pass
        finally:
            conn.close(rst=False)

    async def _swallow(self, reader):
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return

    async def _pump(self, conn, reader, writer, upward):
        try:
            while not conn.closed:
                data = await reader.read(CHUNK)
                if not data:
                    # Half-close: pass the FIN on.
                    if not conn.closed and writer.can_write_eof():
                        writer.write_eof()
                    return
                if conn.dead or self.blackholed():
                    conn.dead = True
                    continue  # into the hole; aborted when the blackhole ends
                if upward:
                    if conn.mode is None and self.armed:
                        conn.mode = self.armed.pop(0)
                    if self.latency_s and time.monotonic() < self.latency_until:
                        await asyncio.sleep(self.latency_s)
                    writer.write(data)
                    await writer.drain()
                    self.forwarded += 1
                    continue
                if conn.mode == "lost":
                    self.fired.append(("lost", time.monotonic_ns()))
                    conn.close(rst=False)
                    return
                if conn.mode == "reset":
                    self.fired.append(("reset", time.monotonic_ns()))
                    writer.write(data[: len(data) // 2])
                    await writer.drain()
                    # A moment for the part to be read before the RST arrives.
                    await asyncio.sleep(0.02)
                    conn.close(rst=True)
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            conn.close()
