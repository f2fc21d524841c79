"""A TCP relay for the tests that cut a network: `python relay.py HOST PORT TO_HOST TO_PORT [--keep-upstream]`.

Listens on HOST:PORT, relays each connection to TO_HOST:TO_PORT, and prints "ready" once it listens. Run in
a network namespace (`ip netns exec`), it puts a link the test can cut between a client and a server of the
machine's own namespace; socat would do, but it is not on every machine. With `--keep-upstream`, a connection
whose client side ends or fails keeps its upstream side open: the server never hears of it, as a server whose
client the network cut off does not. It exits when its standard input ends (the test, its parent, is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, close: bool = True) -> None:
    """Copy one direction until its end, then close the other side (unless told not to)."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    if close:
        with contextlib.suppress(OSError):
            writer.close()


async def main(host: str, port: int, to_host: str, to_port: int, keep_upstream: bool) -> None:
    kept: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(to_host, to_port)
        except OSError:
            writer.close()
            return
        if keep_upstream:
            kept.append(up_writer)
        await asyncio.gather(pipe(reader, up_writer, close=not keep_upstream), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, host, port)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    async with server:
        await stdin.read()  # until the parent closes it, or dies


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), "--keep-upstream" in sys.argv))
