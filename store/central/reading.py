"""Reading the central record: `fleet runs`, `fleet report` (a run materialized into a
temporary trail) and the queries `fleet serve` asks (line progress, signed status, hosts)."""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

from amdflash.store import schema as host_schema
from amdflash.store.chain import LEGACY
from amdflash.store.schema import PHYSICAL, PLAIN
from amdflash.store.central.bounds import BOARDS_PAGE, BOARDS_PER_HOST
from amdflash.store.central.schema import NS, READ_ROLE, CentralError, connect, need_schema, quoted

def runs(url: str, host: str | None = None) -> list[dict[str, Any]]:
    """Every run of every host (or of `host`), in the row shape of the local `runs`
    (store.queries.runs), with the host's enrolled name added. A run's status is the one the
    host's own `runs` shows (store.status.run_status: resumed and never ended is interrupted),
    and so are its reason and the resume that fixed it (store.queries.fixed_by, per host: a
    run resumes a run of its own host)."""
    from amdflash.store.queries import fixed_by

    from amdflash.store.central.tlog_mirror import witness_states

    with connect(url) as pg:
        need_schema(pg)
        rows = select_runs(pg, host=host)
        witnessed = witness_states(pg, NS, [(r["host_id"], r["run_id"]) for r in rows])
    for r in rows:
        # [k, n]: the most witnesses that cosigned a tree head holding its receipt, of the n its
        # host names (null: no receipt of it in the central record)
        state = witnessed.get((r["host_id"], r["run_id"]))
        r["witnessed"] = list(state) if state else None
    of_host: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        r["reason"] = r["reason"] if r["status"] != "succeeded" else None
        # The central database stores a row only once it rebuilt the head its checkpoint signed
        # and checked that signature (schema.py's sealed_* checks, at the push): every status
        # it holds is sealed. An older amdflash's unsigned run is neither, as the host says.
        r["status_verified"] = None if r["legacy"] else True
        of_host.setdefault(r.pop("host_id"), []).append(r)
    for host_rows in of_host.values():
        fixed = fixed_by(host_rows)
        for r in host_rows:
            r["fixed_by"] = fixed.get(r["run_id"])
            r["superseded_by"] = None
        for r in host_rows:
            if _maybe_superseded(r, host_rows):
                r["superseded_by"] = _superseded(url, r)
    return rows


def _maybe_superseded(run: dict[str, Any], host_rows: list[dict[str, Any]]) -> bool:
    """Whether an unfinished flash has a later run of its host that writes its board (its spec
    or its unique ID): only then is the host's verdict (store.queries.superseded_by) asked for."""
    from amdflash.store.originals import WRITES
    from amdflash.store.queries import UNFINISHED, WRITERS

    if run["fixed_by"] or run["command"] not in WRITES or run["status"] not in UNFINISHED:
        return False
    return any(r["started"] > run["started"] and r["command"] in WRITERS and r["run_id"] != run["run_id"]
               and (r["board_spec"] == run["board_spec"] or (run["unique_id"] and r["unique_id"] == run["unique_id"]))
               for r in host_rows)


def _superseded(url: str, run: dict[str, Any]) -> str | None:
    """The run that superseded this unfinished flash, decided as its host's `runs` decides it:
    on the run and the board's flashes materialized into a trail nobody else can open, their
    chains and signatures checked there again (store.queries.superseded_by)."""
    import tempfile

    from amdflash.store.queries import open_readonly, superseded_by

    with tempfile.TemporaryDirectory(prefix="amdflash-central-") as tmp:
        path = Path(tmp) / "run.sqlite"
        run_id = materialize(url, run["run_id"], path, run["host"])
        db = open_readonly(str(path))
        try:
            return superseded_by(db, run_id)
        finally:
            db.conn.close()


def select_runs(pg: Any, host: str | None = None, board: str | None = None, since: str | None = None,
                until: str | None = None, limit: int | None = None, newest_first: bool = False,
                host_id: int | None = None, run_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Runs of the signed record (filters: host name or id, board spec or unique ID substring,
    start time from `since` and before `until`, given run ids), each with its status as
    store.status.run_status decides it, its last status row's detail (`reason`) and its host's
    id and name."""
    from amdflash.store.status import ENDS, PROCESS_STAGE, run_status

    where = ["(%(host)s::text IS NULL OR h.name = %(host)s)", "(%(host_id)s::int IS NULL OR r.host_id = %(host_id)s)",
             "(%(since)s::text IS NULL OR r.at >= %(since)s)", "(%(until)s::text IS NULL OR r.at < %(until)s)",
             "(%(run_ids)s::text[] IS NULL OR r.run_id = ANY(%(run_ids)s))",
             "(%(board)s::text IS NULL OR strpos(r.board_spec, %(board)s) > 0 OR strpos(b.unique_id, %(board)s) > 0)"]
    cur = pg.execute(f"""
        SELECT r.run_id, r.command, r.board_spec, r.at AS started, r.image_sha256, r.resumes_run_id,
               s.status, s.at AS updated, s.detail AS reason, b.unique_id, b.emulated, h.name AS host, r.host_id,
               r.machine_id, CASE WHEN s.status IN ({", ".join(f"'{e}'" for e in ENDS)}) THEN NULL ELSE
                 (SELECT p.detail FROM {NS}.stages p WHERE p.host_id = r.host_id AND p.run_id = r.run_id
                  AND p.stage = '{PROCESS_STAGE}' ORDER BY p.seq LIMIT 1) END AS process,
               EXISTS (SELECT 1 FROM {NS}.runs x WHERE x.host_id = r.host_id AND x.resumes_run_id = r.run_id)
                   AS resumed,
               EXISTS (SELECT 1 FROM {NS}.checkpoints c WHERE c.host_id = r.host_id AND c.run_id = r.run_id
                       AND c.kind = '{LEGACY}') AS legacy
        FROM {NS}.runs r JOIN {NS}.hosts h ON h.id = r.host_id
        LEFT JOIN LATERAL (SELECT status, at, detail FROM {NS}.run_status s WHERE s.host_id = r.host_id
                           AND s.run_id = r.run_id ORDER BY s.seq DESC LIMIT 1) s ON true
        LEFT JOIN LATERAL (SELECT unique_id, emulated FROM {NS}.boards b WHERE b.host_id = r.host_id
                           AND b.run_id = r.run_id ORDER BY b.seq LIMIT 1) b ON true
        WHERE {" AND ".join(where)}
        ORDER BY r.at {"DESC" if newest_first else ""}, h.name, r.seq {"DESC" if newest_first else ""}
        {"LIMIT %(limit)s" if limit else ""}""",
                     {"host": host, "host_id": host_id, "since": since, "until": until, "board": board,
                      "run_ids": run_ids, "limit": limit})
    names = [d.name for d in cur.description]
    rows = [dict(zip(names, row, strict=True)) for row in cur]
    seen = process_evidence(pg, rows)
    for r in rows:
        # As the host's own `runs` decides (and `fleet report`, through it): the process a run with
        # no end recorded can be seen only on its own machine; here, by what the record shows of it.
        r["status"] = run_status(r["status"], bool(r.pop("resumed")), r.pop("process"), r.pop("machine_id"),
                                 *seen.get((r["host_id"], r["run_id"]), (None, None)))
    return rows


def process_evidence(pg: Any, rows: list[dict[str, Any]]) -> dict[tuple[int, str], tuple[str | None, str | None]]:
    """{(host id, run id): (the boot id of the newest process its machine recorded, the host's
    newest progress state of it)} for the runs with no end that no run resumed: what
    store.status.run_status takes, off the host, for the process it cannot see."""
    from amdflash.store.status import ENDS, PROCESS_STAGE, boot_of

    open_runs = [r for r in rows if r["status"] not in ENDS and not r["resumed"] and r["process"]]
    if not open_runs:
        return {}
    hosts, ids = [int(r["host_id"]) for r in open_runs], [str(r["run_id"]) for r in open_runs]
    newest = {(h, m): boot_of(d) for h, m, d in pg.execute(f"""
        SELECT DISTINCT ON (r.host_id, r.machine_id) r.host_id, r.machine_id, p.detail
        FROM {NS}.runs r JOIN {NS}.stages p ON p.host_id = r.host_id AND p.run_id = r.run_id
        WHERE r.host_id = ANY(%s) AND p.stage = '{PROCESS_STAGE}' ORDER BY r.host_id, r.machine_id, p.seq DESC""",
                                                              (sorted(set(hosts)),))}
    said = {(h, r): s for h, r, s in pg.execute(f"""
        SELECT DISTINCT ON (p.host_id, p.run_id) p.host_id, p.run_id, p.state FROM {NS}.progress p
        WHERE (p.host_id, p.run_id) IN (SELECT * FROM unnest(%s::int[], %s::text[])) ORDER BY p.host_id, p.run_id,
        p.id DESC""", (hosts, ids))}
    return {(h, i): (newest.get((h, r["machine_id"])), said.get((h, i))) for h, i, r in zip(hosts, ids, open_runs,
                                                                                           strict=True)}


def image_parts(pg: Any, runs: list[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """{(host id, run id): the image's VBIOS part number} as each run's part check recorded it."""
    if not runs:
        return {}
    found: dict[tuple[int, str], str] = {}
    for host_id, run_id, detail in pg.execute(
            f"SELECT host_id, run_id, detail FROM {NS}.stages WHERE stage = 'part_number' AND "
            "(host_id, run_id) IN (SELECT * FROM unnest(%s::int[], %s::text[])) ORDER BY seq",
            ([h for h, _ in runs], [r for _, r in runs])):
        try:
            part = json.loads(detail or "{}").get("image_part")
        except (ValueError, AttributeError):
            continue
        if isinstance(part, str) and (host_id, run_id) not in found:
            found[(host_id, run_id)] = part
    return found


def shown_url(url: str) -> str:
    """The central database for a message: its URL without a password."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1@", url)


def not_a_reader(pg: Any) -> str | None:
    """Why this session is not a read-only reviewer (a login in amdflash_read that may write
    nothing), or None."""
    user, superuser, reads, writes = pg.execute(
        f"SELECT session_user, r.rolsuper, pg_has_role(session_user, '{READ_ROLE}', 'MEMBER'), "
        f"has_table_privilege('{NS}.checkpoints', 'INSERT') OR has_table_privilege('{NS}.progress', 'INSERT') "
        "FROM pg_roles r WHERE r.rolname = session_user").fetchone()
    if superuser:
        return f"login {user} is a superuser"
    if writes:
        return f"login {user} may insert into the record (it is a push login)"
    if not reads:
        return f"login {user} is not in {READ_ROLE}"
    return None


def line_progress(pg: Any, hours: float, page: int = 0) -> list[dict[str, Any]]:
    """The newest progress row of every board that said anything in the last `hours`: a page of
    at most BOARDS_PAGE boards (page 0 the newest), at most BOARDS_PER_HOST of one host."""
    cur = pg.execute(f"""
        SELECT p.*, h.name AS host FROM (
            SELECT *, row_number() OVER (PARTITION BY host_id ORDER BY id DESC) AS nth FROM (
                SELECT DISTINCT ON (host_id, coalesce(board, run_id)) * FROM {NS}.progress
                WHERE received_at > now() - make_interval(secs => %s) AND run_id IS NOT NULL
                ORDER BY host_id, coalesce(board, run_id), id DESC) b) p
        JOIN {NS}.hosts h ON h.id = p.host_id
        WHERE p.nth <= {int(BOARDS_PER_HOST)} ORDER BY p.id DESC LIMIT {int(BOARDS_PAGE)} OFFSET %s""",
                     (hours * 3600, int(page) * BOARDS_PAGE))
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def progress_after(pg: Any, last_id: int, limit: int = 20000) -> list[dict[str, Any]]:
    """Progress rows newer than `last_id` (every host's, oldest first)."""
    cur = pg.execute(f"SELECT p.*, h.name AS host FROM {NS}.progress p JOIN {NS}.hosts h ON h.id = p.host_id "
                     "WHERE p.id > %s ORDER BY p.id LIMIT %s", (last_id, limit))
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def last_progress_id(pg: Any) -> int:
    return int(pg.execute(f"SELECT coalesce(max(id), 0) FROM {NS}.progress").fetchone()[0])


def signed_status(pg: Any, runs: list[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """{(host id, run id): status} of the given runs that the signed record holds (the status
    every view shows, store.status.run_status); a run not pushed yet is not in it."""
    if not runs:
        return {}
    from amdflash.store.status import run_status

    hosts, ids = [h for h, _ in runs], [r for _, r in runs]
    resumed = {(h, r) for h, r in pg.execute(
        f"SELECT DISTINCT host_id, resumes_run_id FROM {NS}.runs WHERE (host_id, resumes_run_id) IN "
        "(SELECT * FROM unnest(%s::int[], %s::text[]))", (hosts, ids))}
    out = {}
    for host_id, run_id, status in pg.execute(f"""
            SELECT r.host_id, r.run_id, (SELECT status FROM {NS}.run_status s WHERE s.host_id = r.host_id
                                         AND s.run_id = r.run_id ORDER BY s.seq DESC LIMIT 1)
            FROM {NS}.runs r WHERE (r.host_id, r.run_id) IN (SELECT * FROM unnest(%s::int[], %s::text[]))""",
                                          (hosts, ids)):
        out[(host_id, run_id)] = run_status(status, (host_id, run_id) in resumed)
    return out


def hosts_health(pg: Any) -> list[dict[str, Any]]:
    """Per enrolled host: its newest checkpoint in the record and when it was pushed, its newest
    progress row (when, and the newest checkpoint the host said it had then)."""
    cur = pg.execute(f"""
        SELECT h.id, h.name, c.id AS checkpoint, c.pushed_at, c.kind, p.received_at AS last_heard,
               p.checkpoint AS host_checkpoint, p.state AS last_state,
               (SELECT count(*) FROM {NS}.checkpoints x WHERE x.host_id = h.id) AS checkpoints
        FROM {NS}.hosts h
        LEFT JOIN LATERAL (SELECT id, pushed_at, kind FROM {NS}.checkpoints c WHERE c.host_id = h.id
                           ORDER BY c.id DESC LIMIT 1) c ON true
        LEFT JOIN LATERAL (SELECT received_at, checkpoint, state FROM {NS}.progress p WHERE p.host_id = h.id
                           ORDER BY p.id DESC LIMIT 1) p ON true
        ORDER BY h.name""")
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def line_totals(pg: Any) -> dict[str, Any]:
    """Sums over the signed record for metrics: bytes programmed and read disagreements per host."""
    written = dict(pg.execute(f"SELECT h.name, coalesce(sum(u.size), 0) FROM {NS}.hosts h LEFT JOIN {NS}.log_units u "
                              "ON u.host_id = h.id AND u.state = 'programmed' GROUP BY h.name").fetchall())
    disagreements = dict(pg.execute(f"SELECT h.name, count(d.seq) FROM {NS}.hosts h LEFT JOIN "
                                    f"{NS}.log_disagreements d ON d.host_id = h.id GROUP BY h.name").fetchall())
    return {"bytes_written": written, "read_disagreements": disagreements}


class AmbiguousRun(CentralError):
    """A run named by an ID or prefix that runs of several hosts match."""


def split_run(name: str, host: str | None = None) -> tuple[str | None, str]:
    """(host, run id or prefix) from `HOST/RUN` or `RUN` (with `--host HOST`)."""
    if "/" in name:
        named, _, name = name.partition("/")
        if host is not None and host != named:
            raise AmbiguousRun(f"run {named}/{name} names host {named}, and --host says {host}")
        host = named
    return host, name


def resolve(pg: Any, run_id: str, host: str | None = None) -> tuple[int, str, int]:
    """(host id, run id, run key) of a run named by a unique prefix (`HOST/RUN`, or `host`)."""
    host, run_id = split_run(run_id, host)
    found = pg.execute(f"SELECT r.host_id, r.run_id, r.seq, h.name FROM {NS}.runs r JOIN {NS}.hosts h "
                       "ON h.id = r.host_id WHERE left(r.run_id, %s) = %s AND (%s::text IS NULL OR h.name = %s) "
                       "ORDER BY r.run_id, h.name", (len(run_id), run_id, host, host)).fetchall()
    exact = [r for r in found if r[1] == run_id]
    if exact:
        found = exact
    where = f" of host {host}" if host else ""
    if not found:
        raise CentralError(f"no run {run_id!r}{where} in the central database")
    if len(found) > 1:
        hosts = sorted({r[3] for r in found})
        if len(hosts) > 1:
            raise AmbiguousRun(f"run id {run_id!r} matches runs of hosts {', '.join(hosts)} in the central "
                               f"database: name one as HOST/RUN (e.g. {hosts[0]}/{found[0][1]}) or with --host")
        raise AmbiguousRun(f"run id {run_id!r} is ambiguous{where} in the central database ({len(found)} runs match)")
    return found[0][:3]


# Tables copied whole for the run's host: the report follows resumes and their outcome.
_HOST_WIDE = ("runs", "run_status", "boards")


def _related(run_id: str, runs: list[dict[str, Any]], boards: list[dict[str, Any]]) -> dict[str, int]:
    """{run id: run key} of the runs a report of `run_id` reads whole, each of which must verify
    as on the host: the run, the runs linked to it by resumes (those it resumes, those that
    resume it, and so on: its status, fixed-by and backup come from them), and the flashes of
    its board (store.originals finds the board's original among their backups)."""
    from amdflash.store.originals import WRITES, BoardKey

    key_of = {r["run_id"]: r["seq"] for r in runs}
    linked: dict[str, set[str]] = {}
    for r in runs:
        if r["resumes_run_id"]:
            linked.setdefault(r["run_id"], set()).add(r["resumes_run_id"])
            linked.setdefault(r["resumes_run_id"], set()).add(r["run_id"])
    found, todo = {run_id}, [run_id]
    while todo:
        for other in linked.get(todo.pop(), ()):
            if other not in found and other in key_of:
                found.add(other)
                todo.append(other)
    # The board as store.originals knows it across runs: by its flash's unique ID and chip, else its spec.
    mine = next((b for b in boards if b["run_id"] == run_id and b["chip"]), None)
    spec = next(r["board_spec"] for r in runs if r["run_id"] == run_id)
    board = BoardKey(mine["unique_id"] or "", mine["chip"] or "", spec) if mine else None
    if board is not None and board.by_uid:
        same = {b["run_id"] for b in boards if (b["unique_id"], b["chip"]) == (board.unique_id, board.chip)}
    else:
        same = {r["run_id"] for r in runs if r["board_spec"] == spec}
    found |= {r["run_id"] for r in runs if r["run_id"] in same and r["command"] in WRITES}
    return {r: key_of[r] for r in sorted(found, key=key_of.__getitem__)}


def materialize(url: str, run_id: str, path: Path, host: str | None = None) -> str:
    """Copy one run — its rows, blobs and checkpoints (with the one before each, which its hash
    chains to) and the host's run list — from the central database into a new SQLite audit
    database at `path`, in the host's own schema, so the local report code reads it as it reads
    a host's trail (and checks the run's chain and signatures again). The runs the report
    speaks of are copied whole with it (_related: its resumes and the runs they resume, and the
    board's flashes, whose backups hold its original), so each verifies as it does on the host.
    Returns the run id."""
    with connect(url) as pg:
        need_schema(pg)
        host_id, run_id, _ = resolve(pg, run_id, host)
        local = host_schema.connect(str(path))
        try:
            local.execute("BEGIN")
            host_schema.create(local)
            public, name, enrolled = pg.execute(f"SELECT public_key, name, enrolled_at::text FROM {NS}.hosts "
                                                "WHERE id = %s", (host_id,)).fetchone()
            local.execute("INSERT INTO hosts (id, public_key, hostname, first_seen) VALUES (?, ?, ?, ?)",
                          (host_id, public, name, enrolled))
            blob_ids: dict[bytes, int] = {}
            last_seq = 0
            copied: dict[str, list[dict[str, Any]]] = {}
            keys: dict[str, int] = {}
            for table, columns in PHYSICAL.items():     # the host-wide tables come first
                names = ", ".join(quoted(c) for c, _ in columns)
                args: tuple[Any, ...]
                if table not in _HOST_WIDE and not keys:
                    keys = _related(run_id, copied["runs"], copied["boards"])
                if table in _HOST_WIDE:
                    where, args = "host_id = %s", (host_id,)
                elif table in PLAIN:
                    where, args = "host_id = %s AND run_id = ANY(%s)", (host_id, list(keys))
                else:
                    where, args = ("host_id = %s AND run = ANY(%s) AND seq >= %s",
                                   (host_id, list(keys.values()), min(keys.values())))
                found = pg.execute(f"SELECT seq, {names} FROM {NS}.{table} WHERE {where} ORDER BY seq", args).fetchall()
                if table in _HOST_WIDE:
                    copied[table] = [dict(zip(["seq", *(c for c, _ in columns)], r, strict=True)) for r in found]
                refs = [i for i, (_, k) in enumerate(columns, 1) if k == "ref"]
                out = []
                for r in found:
                    r = list(r)
                    for i in refs:
                        if r[i] is not None:
                            r[i] = blob_ids.setdefault(bytes(r[i]), len(blob_ids) + 1)
                    out.append(r)
                    last_seq = max(last_seq, r[0])
                marks = ", ".join("?" * (len(columns) + 1))
                local.executemany(f"INSERT INTO {table} (seq, {names}) VALUES ({marks})", out)
            if blob_ids:
                data = dict(pg.execute(f"SELECT sha256, data FROM {NS}.blobs WHERE host_id = %s AND sha256 = ANY(%s)",
                                       (host_id, list(blob_ids))).fetchall())
                local.executemany("INSERT INTO blobs (id, sha256, data) VALUES (?, ?, ?)",
                                  ((i, sha, data.get(sha)) for sha, i in blob_ids.items()))
            cps = pg.execute(f"""
                SELECT c.id, c.kind, c.run, c.run_id, c.rows, c.last_seq, c.head, c.at, c.detail, c.hash, c.sig
                FROM {NS}.checkpoints c WHERE c.host_id = %s AND (c.run = ANY(%s) OR c.id + 1 IN
                    (SELECT id FROM {NS}.checkpoints WHERE host_id = %s AND run = ANY(%s))) ORDER BY c.id""",
                             (host_id, list(keys.values()), host_id, list(keys.values()))).fetchall()
            local.executemany("INSERT INTO checkpoints (id, kind, run, run_id, rows, last_seq, head, host, at, detail, "
                              "hash, sig) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              [(*c[:7], host_id, *c[7:]) for c in cps])
            if cps:
                local.execute("UPDATE chain_head SET seq = ?, checkpoint = ?, hash = ? WHERE id = 1",
                              (max(last_seq, cps[-1][5] or 0), cps[-1][0], cps[-1][9]))
            local.execute("COMMIT")
        finally:
            local.close()
    return run_id


def materialized_host(local: sqlite3.Connection) -> str:
    """The enrolled name of the host whose run `materialize` copied into the trail `local` reads."""
    return str(local.execute("SELECT hostname FROM hosts").fetchone()[0])
