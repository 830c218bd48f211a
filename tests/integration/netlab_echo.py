"""A TCP echo server for the netlab tests: greets each client with the client's address + "\\n",
then sends back every byte it receives. Usage: netlab_echo.py ADDRESS PORT (runs until killed)."""

from __future__ import annotations

import asyncio
import sys


async def serve(address: str, port: int) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"{writer.get_extra_info('peername')[0]}\n".encode())
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, address, port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
