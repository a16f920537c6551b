"""Requests the servers send themselves (a broker registering with remote name servers, a
name server creating a topic on a broker): one request per connection, on the event loop."""

from __future__ import annotations

import asyncio
import ssl

from ..codec import split_host
from ..remoting.frame import DEFAULT_MAX_FRAME, RemotingCommand, read_frame_length

__all__ = ["request"]


async def request(address: str, cmd: RemotingCommand, timeout_s: float = 3.0,
                  max_frame: int = DEFAULT_MAX_FRAME, tls: ssl.SSLContext | None = None) -> RemotingCommand:
    """Send ``cmd`` to ``address`` (over TLS with the client context ``tls``) and return the
    response. Raises OSError (connection, TLS) or TimeoutError; the caller names the address and
    the operation in what it reports."""
    host, port = split_host(address)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=tls), timeout_s)
    try:
        writer.write(cmd.encode())
        await writer.drain()

        async def answer() -> RemotingCommand:
            while True:
                prefix = await reader.readexactly(4)
                frame = await reader.readexactly(read_frame_length(prefix, max_frame))
                resp = RemotingCommand.decode(frame)
                if resp.is_response and resp.opaque == cmd.opaque:
                    return resp

        return await asyncio.wait_for(answer(), timeout_s)
    except asyncio.IncompleteReadError as exc:
        raise ConnectionError(f"{address} closed the connection") from exc
    finally:
        writer.close()
