"""A rogue labgrid coordinator on loopback: labgrid's own gRPC service (its generated stubs),
answering the fleet client with whatever a test scripts — hostile places and resources, a
reservation that names another place, answers that never come or come slowly, malformed
messages. It serves in a thread of its own and stops by itself (`lifetime`), so a client that
hangs on it is let go, and the test that found the hang fails rather than hangs."""
from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
from labgrid.remote.generated import labgrid_coordinator_pb2_grpc as pb_grpc


def value(v: Any) -> pb.MapValue:
    if isinstance(v, bool):
        return pb.MapValue(bool_value=v)
    if isinstance(v, int):
        return pb.MapValue(int_value=v)
    return pb.MapValue(string_value=str(v))


def resource(exporter: str, group: str, name: str, params: dict[str, Any], cls: str = "NetworkAmdflashBoard",
             extra: dict[str, Any] | None = None) -> pb.UpdateResponse:
    return pb.UpdateResponse(resource=pb.Resource(
        path=pb.Resource.Path(exporter_name=exporter, group_name=group, resource_name=name), cls=cls,
        params={k: value(v) for k, v in params.items()}, extra={k: value(v) for k, v in (extra or {}).items()},
        avail=True))


def place(name: str, pattern: tuple[str, str, str, str], tags: dict[str, str] | None = None) -> pb.UpdateResponse:
    e, g, c, n = pattern
    return pb.UpdateResponse(place=pb.Place(name=name, tags=tags or {},
                                            matches=[pb.ResourceMatch(exporter=e, group=g, cls=c, name=n)]))


@dataclass
class Script:
    """What the rogue answers. `updates`: sent once the client subscribed, then its syncs are
    answered (`stall_stream`: never answered; `sync_id_offset`: answered with ids it never
    sent). `stall`: names of unary calls that never answer; `reservation`: the Reservation a
    CreateReservation returns (None: one allocated to the place asked for)."""

    updates: list[pb.UpdateResponse] = field(default_factory=list)
    stall_stream: bool = False
    trickle: bool = False            # after the updates, a new place every 50 ms and never the sync
    flood_after_sync: bool = False   # once the first sync is answered, 500 new places every 10 ms
    refuse_with: str | None = None   # CreateReservation refused with these details
    publish_added: bool = False      # a place AddPlace made is published (before the next sync), as labgrid's are
    sync_id_offset: int = 0
    stall: set[str] = field(default_factory=set)
    reservation: pb.Reservation | None = None
    lifetime: float = 15.0
    calls: list[tuple[str, Any]] = field(default_factory=list)   # what the client asked, in order


class _Rogue(pb_grpc.CoordinatorServicer):
    def __init__(self, script: Script, stop: asyncio.Event):
        self.script, self.stop = script, stop
        self.pending: list[pb.UpdateResponse] = []

    async def _stalled(self, name: str, context: Any) -> bool:
        if name in self.script.stall:
            await self.stop.wait()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "rogue coordinator went away")
        return False

    async def ClientStream(self, request_iterator: Any, context: Any) -> Any:
        sent = False
        async for msg in request_iterator:
            kind = msg.WhichOneof("kind")
            self.script.calls.append(("stream", kind))
            if self.script.stall_stream:
                continue
            if kind == "sync":
                if not sent:
                    sent = True
                    for i in range(0, len(self.script.updates), 500):   # gRPC's 4 MB per message
                        yield pb.ClientOutMessage(updates=self.script.updates[i:i + 500])
                    for n in itertools.count() if self.script.trickle else ():
                        if self.stop.is_set():
                            return
                        yield pb.ClientOutMessage(updates=[place(f"p{n}", ("hosta", f"g{n}", "*", "r"))])
                        await asyncio.sleep(0.05)
                if self.pending:
                    yield pb.ClientOutMessage(updates=self.pending)
                    self.pending = []
                yield pb.ClientOutMessage(sync=pb.Sync(id=msg.sync.id + self.script.sync_id_offset))
                for n in itertools.count() if self.script.flood_after_sync else ():
                    if self.stop.is_set():
                        return
                    yield pb.ClientOutMessage(updates=[place(f"f{n}-{i}", ("hostz", "g", "*", "r"))
                                                       for i in range(500)])
                    await asyncio.sleep(0.01)

    async def CreateReservation(self, request: Any, context: Any) -> Any:
        self.script.calls.append(("CreateReservation", dict(request.filters["main"].filter)))
        await self._stalled("CreateReservation", context)
        if self.script.refuse_with is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.script.refuse_with)
        reservation = self.script.reservation or pb.Reservation(
            owner="rogue", token="T0K3N", state=1, filters=dict(request.filters),
            allocations={"main": request.filters["main"].filter.get("name", "")})
        return pb.CreateReservationResponse(reservation=reservation)

    async def CancelReservation(self, request: Any, context: Any) -> Any:
        self.script.calls.append(("CancelReservation", request.token))
        await self._stalled("CancelReservation", context)
        return pb.CancelReservationResponse()

    async def AcquirePlace(self, request: Any, context: Any) -> Any:
        self.script.calls.append(("AcquirePlace", request.placename))
        await self._stalled("AcquirePlace", context)
        return pb.AcquirePlaceResponse()

    async def ReleasePlace(self, request: Any, context: Any) -> Any:
        self.script.calls.append(("ReleasePlace", request.placename))
        await self._stalled("ReleasePlace", context)
        return pb.ReleasePlaceResponse()

    async def AddPlace(self, request: Any, context: Any) -> Any:
        self.script.calls.append(("AddPlace", request.name))
        await self._stalled("AddPlace", context)
        if self.script.publish_added:
            self.pending.append(pb.UpdateResponse(place=pb.Place(name=request.name)))
        return pb.AddPlaceResponse()

    async def AddPlaceMatch(self, request: Any, context: Any) -> Any:
        self.script.calls.append(("AddPlaceMatch", request.placename))
        await self._stalled("AddPlaceMatch", context)
        return pb.AddPlaceMatchResponse()

    async def SetPlaceTags(self, request: Any, context: Any) -> Any:
        self.script.calls.append(("SetPlaceTags", request.placename))
        await self._stalled("SetPlaceTags", context)
        return pb.SetPlaceTagsResponse()


@contextmanager
def rogue_coordinator(script: Script) -> Iterator[str]:
    """Serve `script` on 127.0.0.1 (a free port); yields HOST:PORT. Stops by itself after
    `script.lifetime` seconds, or when the block ends."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        state["loop"], state["stop"] = asyncio.get_running_loop(), stop
        server = grpc.aio.server()
        pb_grpc.add_CoordinatorServicer_to_server(_Rogue(script, stop), server)
        state["port"] = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.set()
        try:
            await asyncio.wait_for(stop.wait(), script.lifetime)
        except TimeoutError:
            stop.set()
        await server.stop(grace=0.5)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the rogue coordinator did not start"
    try:
        yield f"127.0.0.1:{state['port']}"
    finally:
        if thread.is_alive():
            state["loop"].call_soon_threadsafe(state["stop"].set)
            thread.join(10)
