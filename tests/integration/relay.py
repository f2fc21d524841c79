"""A TCP relay for the tests that cut a network: `python relay.py HOST PORT TO_HOST TO_PORT`.

Listens on HOST:PORT, relays each connection to TO_HOST:TO_PORT, and prints "ready" once it listens. Run in
a network namespace (`ip netns exec`), it puts a link the test can cut between a client and a server of the
machine's own namespace; socat would do, but it is not on every machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until its end, then close the other side's writing half."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()


async def main(host: str, port: int, to_host: str, to_port: int) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(to_host, to_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, host, port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
