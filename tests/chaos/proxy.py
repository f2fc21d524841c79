"""A TCP proxy on loopback that a test can cut: the network between workers and the server, under control.

`cut()` turns it into a black hole, as a failed link or firewall is: connections stay open but nothing
passes, and new ones are accepted and hear nothing. `restore()` closes whatever was opened during or
across the cut (clients see a reset and connect again) and forwards again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to a target port on loopback, on a thread of its own."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cut_now = False
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="chaos-proxy", daemon=True)

    def start(self) -> CuttableProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            if self.cut_now:
                await reader.read(-1)  # a black hole: take everything, say nothing
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            self._close(writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.cut_now:
                    continue  # dropped on the floor
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            self._close(writer)

    def _close(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        with contextlib.suppress(Exception):
            writer.close()

    def cut(self) -> None:
        self.cut_now = True

    def restore(self) -> None:
        """Forward again; connections that lived through the cut are closed so their clients reconnect."""

        def reset() -> None:
            for w in list(self._writers):
                with contextlib.suppress(Exception):
                    w.transport.abort()
            self._writers.clear()
            self.cut_now = False

        self._loop.call_soon_threadsafe(reset)

    def stop(self) -> None:
        """Close every connection and end the proxy's loop."""

        async def shutdown() -> None:
            for w in list(self._writers):
                w.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(10)
