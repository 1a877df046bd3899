"""The fleet client's view of labgrid's coordinator: places, board resources, reservations, locks.

One labgrid `ClientSession` (gRPC) keeps a live copy of every place and resource. A board
is a place whose match names one `NetworkAmdflashBoard` resource. Taking a board is
labgrid's usual two steps: a reservation filtered by the place's tags and its name, then
acquiring the place (the coordinator refuses a place acquired, or reserved, by someone
else: nothing here ever takes a board from its holder).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from labgrid.remote.client import ClientSession, Error as LabgridError
from labgrid.remote.common import TAG_KEY, Place, Reservation, ReservationState, ResourceEntry
from labgrid.remote.generated import labgrid_coordinator_pb2 as pb

from amdflash.pipeline.fleet.trust import shown

BOARD_CLASSES = ("NetworkAmdflashBoard", "AmdflashBoard")
DEFAULT_ADDRESS = "127.0.0.1:20408"   # labgrid's default coordinator port
#: How long the coordinator has to answer anything asked of it (a real one answers in
#: milliseconds): one that never answers, or answers a trickle, must not hold the fleet.
ANSWER_SECONDS = 30.0
#: The longest place name used (labgrid sets none; a place is HOST-GROUP): a longer one, or
#: one with control characters, is the coordinator's word, not a place `fleet places` made.
PLACE_MAX = 200
#: The most places, and board-or-other resources, a line has (a few hundred boards): more is a
#: coordinator flooding the client, whose memory would grow with every one it is sent.
ENTRIES_MAX = 20_000


class CoordinatorError(RuntimeError):
    pass


class _Flooded(Exception):
    """The coordinator sent more places or resources than ENTRIES_MAX."""


class _NoAnswer(Exception):
    """The coordinator did not answer within ANSWER_SECONDS."""


def place_name_ok(name: str) -> bool:
    """A name the fleet takes a place by: at most PLACE_MAX printable characters."""
    return 0 < len(name) <= PLACE_MAX and name.isprintable()


@dataclass
class BoardPlace:
    """A place and the board resource it matches, as published when the place was chosen
    (the session's own entry changes, or empties, when the exporter updates or goes)."""

    place: str
    exporter: str
    group: str
    resource: str
    cls: str
    args: dict[str, Any]           # the resource's attributes (spec, host, db, …)
    extra: dict[str, Any]          # labgrid's proxy settings for the exporter
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> tuple[str, str, str, str]:
        return (self.exporter, self.group, self.cls, self.resource)

    @property
    def host(self) -> str:
        return str(self.args.get("host") or self.exporter)

    @property
    def spec(self) -> str:
        return str(self.args.get("spec"))


def parse_tags(pairs: list[str], what: str = "tag") -> dict[str, str]:
    tags: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value:
            raise ValueError(f"{what} {pair!r} is not KEY=VALUE")
        if not TAG_KEY.fullmatch(key) and key != "name":
            raise ValueError(f"{what} key {key!r}: labgrid tag keys are lower-case letters, digits and '_', "
                             f"starting with a letter")
        tags[key] = value
    return tags


def _quiet_labgrid_client(record: logging.LogRecord) -> bool:
    """labgrid's client logs a lost coordinator on the root logger; the fleet reports it itself,
    once, so that line is shown only when debugging (-vv)."""
    from_client = record.pathname.replace("\\", "/").endswith("labgrid/remote/client.py")
    return not from_client or logging.getLogger().getEffectiveLevel() <= logging.DEBUG


logging.getLogger().addFilter(_quiet_labgrid_client)


class Coordinator:
    """A live session with the coordinator; `lost` once it stopped answering."""

    def __init__(self, address: str):
        self.address = address
        self.session: ClientSession | None = None
        self.lost_at: float | None = None
        self.flooded: str | None = None
        self._guard: asyncio.Task[None] | None = None

    def _overflow(self) -> str | None:
        assert self.session is not None
        places = len(getattr(self.session, "places", {}))
        resources = sum(len(g) for groups in getattr(self.session, "resources", {}).values() for g in groups.values())
        if max(places, resources) > ENTRIES_MAX:
            return f"it sent {places} places and {resources} resources, more than {ENTRIES_MAX} of either"
        return None

    async def _start(self) -> None:
        """labgrid's session start (its first sync), stopped early by a flood of places or resources."""
        assert self.session is not None
        start = asyncio.ensure_future(self.session.start())
        # Its failure is told by open(), whichever way this ends (a flood, the bound, an error).
        start.add_done_callback(lambda task: task.cancelled() or task.exception())
        try:
            while not start.done():
                await asyncio.wait({start}, timeout=0.1)
                self.flooded = self._overflow()
                if self.flooded:
                    raise _Flooded
            start.result()
            self.flooded = self._overflow()   # all of it between two looks
            if self.flooded:
                raise _Flooded
        finally:
            start.cancel()

    async def _watch(self) -> None:
        """While the session lasts: a flood after the start ends it (the run goes on as with a lost coordinator)."""
        assert self.session is not None
        while not self.session.stopping.is_set():
            await asyncio.sleep(0.5)
            if self._overflow():
                self.flooded = self._overflow()
                await self.session.stop()

    async def open(self) -> Coordinator:
        self.session = ClientSession(self.address, asyncio.get_running_loop())
        try:
            await asyncio.wait_for(self._start(), ANSWER_SECONDS)
        except (TimeoutError, _Flooded, LabgridError, grpc.aio.AioRpcError) as e:
            if isinstance(e, (TimeoutError, _Flooded)):
                await self.session.stop()
                why = self.flooded or f"it did not answer within {ANSWER_SECONDS:g} s"
            else:
                why = e.details() if isinstance(e, grpc.aio.AioRpcError) else " ".join(map(str, e.args))
            await self.session.close()
            raise CoordinatorError(f"cannot reach the labgrid coordinator at {self.address} "
                                   f"({shown(str(why))})") from None
        self._guard = asyncio.ensure_future(self._watch())
        return self

    async def _ask(self, call: Any) -> Any:
        """One answer of the coordinator's (a unary call's awaitable, or a sync), in ANSWER_SECONDS."""
        try:
            return await asyncio.wait_for(call, ANSWER_SECONDS)
        except TimeoutError:
            raise _NoAnswer(f"the coordinator did not answer within {ANSWER_SECONDS:g} s") from None

    async def _sync(self) -> None:
        assert self.session is not None
        await self._ask(self.session.sync_with_coordinator())

    async def close(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
        if self.session is not None:
            if not self.lost:
                await self.session.stop()
            await self.session.close()

    @property
    def lost(self) -> bool:
        lost = self.session is not None and self.session.stopping.is_set()
        if lost and self.lost_at is None:
            self.lost_at = time.time()
        return lost

    @property
    def user(self) -> str:
        assert self.session is not None
        return f"{self.session.gethostname()}/{self.session.getuser()}"

    @property
    def places(self) -> dict[str, Place]:
        assert self.session is not None
        return self.session.places

    # -- what there is ----------------------------------------------------------------------

    def board_resources(self) -> list[tuple[str, str, str, ResourceEntry]]:
        """(exporter, group, resource name, entry) of every board resource the exporters publish."""
        assert self.session is not None
        found = []
        for exporter, groups in sorted(self.session.resources.items()):
            for group, resources in sorted(groups.items()):
                for name, entry in sorted(resources.items()):
                    if entry.data and entry.cls in BOARD_CLASSES:
                        found.append((exporter, group, name, entry))
        return found

    def board_places(self, where: dict[str, str]) -> tuple[list[BoardPlace], dict[str, str]]:
        """Places whose tags include `where` (and `name`), with their board; and why others are unusable."""
        usable: list[BoardPlace] = []
        unusable: dict[str, str] = {}
        resources = self.board_resources()
        for name, place in sorted(self.places.items()):
            tags = {**place.tags, "name": name}
            if any(tags.get(k) != v for k, v in where.items()):
                continue
            if not place_name_ok(name):
                # Shown shortened and escaped, never taken: its name would be printed, logged and
                # pasted whole (a megabyte of it, or a newline that starts a line of its own).
                unusable[shown(name)] = (f"its name is not a place name (at most {PLACE_MAX} printable characters; "
                                         "'amdflash fleet places' names places HOST-GROUP): not taken")
                continue
            boards = [(e, g, n, entry) for e, g, n, entry in resources if place.hasmatch((e, g, entry.cls, n))]
            if len(boards) == 1:
                e, g, n, entry = boards[0]
                usable.append(BoardPlace(name, e, g, n, entry.cls, dict(entry.args), dict(entry.extra),
                                         dict(place.tags)))
            elif not boards:
                if any(m.cls in BOARD_CLASSES or m.cls == "*" for m in place.matches):
                    unusable[name] = "no board resource published for it (is its exporter running?)"
            else:
                unusable[name] = f"matches {len(boards)} boards; a place must name exactly one"
        return usable, unusable

    def resource_state(self, board: BoardPlace) -> str | None:
        """None while the board is published and available, else what happened to it."""
        assert self.session is not None
        entry = self.session.resources.get(board.exporter, {}).get(board.group, {}).get(board.resource)
        if entry is None or not entry.data:
            return f"exporter {board.exporter} no longer publishes the board"
        if not entry.avail:
            return f"exporter {board.exporter} reports the board unavailable"
        return None

    # -- taking and giving back ---------------------------------------------------------------

    def holder(self, place: str) -> str | None:
        """Who holds the place (acquired, or allocated to a reservation), if anyone."""
        p = self.places.get(place)
        if p is None:
            return "place deleted"
        if p.acquired:
            return f"acquired by {shown(str(p.acquired))}"
        if p.reservation:
            return f"reserved ({shown(str(p.reservation))})"
        return None

    async def take(self, board: BoardPlace, where: dict[str, str]) -> tuple[str | None, str | None]:
        """Reserve and acquire the board's place: (reservation token, None) or (None, why not)."""
        assert self.session is not None
        held = self.holder(board.place)
        if held:
            return None, held
        stub = self.session.stub
        request = pb.CreateReservationRequest(
            filters={"main": pb.Reservation.Filter(filter={**where, "name": board.place})}, prio=0)
        try:
            response = await self._ask(stub.CreateReservation(request))
        except grpc.aio.AioRpcError as e:
            return None, f"reservation refused: {shown(str(e.details()))}"
        except _NoAnswer as e:
            return None, f"reservation not made: {e}"
        token = response.reservation.token
        try:
            reservation = Reservation.from_pb2(response.reservation)
        except (ValueError, TypeError, AssertionError):   # a state labgrid has no name for
            await self._cancel(token)
            return None, f"the coordinator's reservation answer is malformed (state {response.reservation.state})"
        try:
            if reservation.state is not ReservationState.allocated:
                await self._cancel(reservation.token)
                await self._sync()
                return None, self.holder(board.place) or f"reservation {reservation.state.name}"
            try:
                await self._ask(stub.AcquirePlace(pb.AcquirePlaceRequest(placename=board.place)))
                await self._sync()
            except grpc.aio.AioRpcError as e:
                await self._cancel(reservation.token)
                await self._sync()
                return None, shown(str(self.holder(board.place) or e.details()))
        except _NoAnswer as e:
            # Perhaps acquired: given back as a taken board would be (the cancel and release are bounded too).
            await self.give_back(board, reservation.token)
            return None, f"not acquired: {e}"
        return reservation.token, None

    async def give_back(self, board: BoardPlace, token: str) -> str | None:
        """Release the place and cancel its reservation; None, or why that failed."""
        assert self.session is not None
        if self.lost:
            return "coordinator unreachable"
        try:
            await self._ask(self.session.stub.ReleasePlace(pb.ReleasePlaceRequest(placename=board.place)))
        except grpc.aio.AioRpcError as e:
            return shown(str(e.details()))
        except _NoAnswer as e:
            return str(e)
        finally:
            await self._cancel(token)
        return None

    async def _cancel(self, token: str) -> None:
        assert self.session is not None
        try:
            await self._ask(self.session.stub.CancelReservation(pb.CancelReservationRequest(token=token)))
        except (grpc.aio.AioRpcError, _NoAnswer):
            pass   # expired or already gone (or the coordinator is mute): it expires there by itself

    # -- making places --------------------------------------------------------------------------

    async def ensure_place(self, name: str, pattern: str, tags: dict[str, str]) -> bool:
        """Create the place (if new) with its match, and set its tags. True if it was created."""
        assert self.session is not None
        stub = self.session.stub
        created = name not in self.places
        try:
            if created:
                await self._ask(stub.AddPlace(pb.AddPlaceRequest(name=name)))
                await self._ask(stub.AddPlaceMatch(pb.AddPlaceMatchRequest(placename=name, pattern=pattern)))
            if tags:
                await self._ask(stub.SetPlaceTags(pb.SetPlaceTagsRequest(placename=name, tags=tags)))
            await self._sync()
        except grpc.aio.AioRpcError as e:
            raise CoordinatorError(f"place {shown(name)}: {shown(str(e.details()))}") from None
        except _NoAnswer as e:
            raise CoordinatorError(f"place {shown(name)}: {e}") from None
        if name not in self.places:   # a real coordinator publishes it before it answers the sync
            raise CoordinatorError(f"place {shown(name)}: the coordinator says it made it, and does not publish it")
        return created

