"""Print every signal from one gpulaunch job's object as a JSON line (a test's bus subscriber).

`ready` is printed once the match rule is in place; it exits after `Finished`.
Each line: {"t": time.time() on receipt, "member": ..., "sender": ..., "body": [...]}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus


def plain(value: Any) -> Any:
    if isinstance(value, Variant):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--session", action="store_true")
    args = p.parse_args()
    bus = await MessageBus(bus_type=BusType.SESSION if args.session else BusType.SYSTEM).connect()
    done = asyncio.get_running_loop().create_future()

    def on_message(msg: Message) -> None:
        if msg.message_type is not MessageType.SIGNAL or msg.path != args.path:
            return
        line = {"t": time.time(), "member": msg.member, "sender": msg.sender}
        print(json.dumps({**line, "body": plain(msg.body)}), flush=True)
        if msg.member == "Finished" and not done.done():
            done.set_result(None)

    bus.add_message_handler(on_message)
    await bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=[f"type='signal',path='{args.path}'"],
        )
    )
    print("ready", flush=True)
    await done
    bus.disconnect()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
