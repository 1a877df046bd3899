"""The line view's pages, rendered on the server as plain HTML (complete with JavaScript off):
the line, a host's health, the history, and a run's page (its report from the central record,
checked again here). Everything shown from the record is escaped."""
from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

from amdflash.pipeline.fleet.serve.line import ORDER, Board, LineSnapshot
from amdflash.pipeline.fleet.serve.words import age, amount, duration, escape, run_href
from amdflash.store.status import ENDS

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 10px 20px; display: flex; gap: 24px; align-items: baseline; }
header a { color: #cfe0ff; } header h1 { font-size: 18px; margin: 0; }
main { padding: 16px 20px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e3e6ea; vertical-align: top; }
th { background: #eef1f5; font-weight: 600; }
.state { font-weight: 600; padding: 1px 6px; border-radius: 3px; }
.s-failed, .s-interrupted, .s-refused { background: #fde2e1; color: #8e1b13; }
.s-running { background: #e2eefe; color: #123f86; }
.s-succeeded { background: #e0f4e3; color: #14592a; }
.s-unreadable { background: #fff7d6; color: #6b4e00; }
tr.s-failed td, tr.s-interrupted td { background: #fff6f5; }
progress { width: 160px; height: 14px; }
.muted { color: #6b7280; } .mono { font-family: ui-monospace, monospace; font-size: 12px; }
.summary span { margin-right: 16px; } .error { color: #8e1b13; max-width: 420px; }
.end { color: #1d2330; margin-top: 4px; font-size: 13px; }
form.filters label { margin-right: 12px; } .note { color: #6b7280; margin: 8px 0; }
.banner { padding: 8px 20px; background: #fff7d6; border-bottom: 1px solid #e8d98a; }
.banner.bad { background: #fde2e1; } .banner.good { background: #e0f4e3; }
"""

SCRIPT = """// Live updates: the server sends the line's table as it changes (server-sent events).
(function () {
  if (!window.EventSource) { return; }
  var source = new EventSource("events");
  source.addEventListener("line", function (event) {
    var data = JSON.parse(event.data);
    document.getElementById("boards").innerHTML = data.rows;
    document.getElementById("summary").innerHTML = data.summary;
    document.getElementById("updated").textContent = data.updated;
    document.body.setAttribute("data-version", data.version);
  });
  source.onerror = function () {   // closed for good (the server had too many streams: 503): say so
    document.getElementById("updated").textContent = source.readyState === EventSource.CLOSED
      ? "live updates unavailable: reload for the newest" : "reconnecting…";
  };
})();
"""

CSP = ("default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def page(title: str, body: str, script: bool = False, prefix: str = "") -> str:
    nav = (f"<header><h1>amdflash line</h1><a href=\"{prefix}./\">line</a><a href=\"{prefix}history\">history</a>"
           f"<a href=\"{prefix}health\">health</a></header>")
    tail = f"<script src=\"{prefix}static/line.js\"></script>" if script else ""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{nav}<main>{body}</main>{tail}</body></html>\n")


def _state(state: str) -> str:
    return f"<span class=\"state s-{escape(state)}\">{escape(state)}</span>"


def time_text(when: Any) -> str:
    if isinstance(when, dt.datetime):
        return escape(when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
    return escape(str(when or ""))


def board_row(b: Board, prefix: str = "") -> str:
    row = b.row
    state = b.state
    done, total = row.get("bytes_done"), row.get("bytes_total")
    if state == "running" and total:
        bar = f"<progress value=\"{int(done or 0)}\" max=\"{int(total)}\"></progress> "
    elif total:
        bar = f"<progress value=\"{int(done or 0)}\" max=\"{int(total)}\"></progress> "
    else:
        bar = ""
    amounts = f"{amount(done)} / {amount(total)}" if total else ""
    rate = f"{amount(int(row['rate']))}/s" if row.get("rate") and state == "running" else ""
    eta = duration(row.get("eta")) if state == "running" else ""
    href = run_href(b.host_id, row.get("run_id"), prefix)
    run = escape(str(row.get("run_id") or ""))
    link = f"<a class=\"mono\" href=\"{href}\">{run}</a>" if href else f"<span class=\"mono\">{run}</span>"
    source = ("<span title=\"the run's signed record, verified by the central database\">signed</span>"
              if b.source == "signed" else
              "<span class=\"muted\" title=\"the host's live word: advisory, not signed\">live</span>")
    witnessed = ""
    if b.source == "signed" and b.witnessed is not None:      # its receipt is in the central record
        from amdflash.store.central import witness_words

        witnessed = escape(witness_words(b.witnessed))
        source += f" <span class=\"muted\" data-field=\"witnessed\">{witnessed}</span>"
    stage = escape(str(row.get("stage") or "")) if state == "running" else ""
    if b.stale:
        stage += " <span class=\"muted\">(no word of it for a long time: not waited for)</span>"
    error = escape(str(row.get("error") or "")) if state != "succeeded" else ""
    if state == "unreadable":
        error = escape(f"this row does not read: {row.get('unreadable')}")
    elif b.end and b.end.get("lines") and state in ("failed", "interrupted"):
        # What the run left and the way out, as its signed record tells it (fleet report's words).
        error += "<div class=\"end\" data-field=\"end\">" + "<br>".join(escape(line) for line in b.end["lines"]) \
            + "</div>"
    job = escape(str(row.get("command") or ""))
    if row.get("resumes"):
        job += " <span class=\"muted\">(resumes " + escape(str(row["resumes"])) + ")</span>"
    return (f"<tr class=\"s-{escape(state)}\" data-host=\"{escape(b.host)}\" data-place=\"{escape(b.place)}\" "
            f"data-state=\"{escape(state)}\" data-run=\"{run}\" data-source=\"{b.source}\" "
            f"data-job=\"{escape(str(row.get('command') or ''))}\" data-witnessed=\"{witnessed}\">"
            f"<td>{escape(b.host)}</td><td>{escape(b.place)}</td><td>{_state(state)} {source}</td>"
            f"<td>{job}</td><td>{stage}</td><td data-field=\"progress\">{bar}{escape(amounts)}</td>"
            f"<td>{escape(rate)}</td><td>{escape(eta)}</td><td>{link}</td><td class=\"error\">{error}</td></tr>")


def _unreadable_row(b: Board, problem: Exception) -> str:
    return (f"<tr class=\"s-unreadable\" data-host=\"{escape(b.host)}\" data-place=\"{escape(b.place)}\" "
            f"data-state=\"unreadable\"><td>{escape(b.host)}</td><td>{escape(b.place)}</td>"
            f"<td>{_state('unreadable')}</td><td colspan=\"7\" class=\"error\">this row does not read: "
            f"{escape(type(problem).__name__)}</td></tr>")


def rows_html(snap: LineSnapshot, prefix: str = "") -> str:
    if not snap.boards:
        return "<tr><td colspan=\"10\" class=\"muted\">no board has said anything in the window</td></tr>"
    out = []
    for b in snap.boards:
        try:
            out.append(board_row(b, prefix))
        except (TypeError, ValueError, OverflowError, KeyError) as e:   # one odd row never takes the page down
            out.append(_unreadable_row(b, e))
    return "\n".join(out)


def summary_html(snap: LineSnapshot, error: str | None = None) -> str:
    counts: dict[str, int] = {}
    for b in snap.boards:
        counts[b.state] = counts.get(b.state, 0) + 1
    parts = [f"<span>{len(snap.boards)} board(s)</span>"]
    parts += [f"<span>{_state(s)} {n}</span>" for s, n in sorted(counts.items(), key=lambda x: ORDER.get(x[0], 9))]
    if error:
        parts.append(f"<span class=\"error\">central database: {escape(error)}</span>")
    return "".join(parts)


def line_page(snap: LineSnapshot, window_hours: float, error: str | None = None, rows: str | None = None,
              summary: str | None = None) -> str:
    """The line's page; `rows` and `summary`: the table as already rendered for this snapshot
    (app.Table: once per change, for every client)."""
    rows = rows_html(snap) if rows is None else rows
    summary = summary_html(snap, error) if summary is None else summary
    head = ("<tr><th>host</th><th>place</th><th>state</th><th>job</th><th>stage</th><th>progress</th><th>rate</th>"
            "<th>ETA</th><th>run (report)</th><th>error</th></tr>")
    body = (f"<p class=\"summary\" id=\"summary\">{summary}</p>"
            f"<p class=\"note\">Every board that said anything in the last {window_hours:g} h, failures first. "
            "<b>signed</b>: the run's end as its signed record says it (pushed, verified by the central "
            "database); <b>live</b>: the host's word, advisory until its record is pushed. "
            f"Updated <span id=\"updated\">{time_text(snap.at)}</span>"
            "<noscript> (live updates need JavaScript: reload for the newest)</noscript>.</p>"
            f"<table><thead>{head}</thead><tbody id=\"boards\">{rows}</tbody></table>")
    return page("amdflash line", body, script=True)


def health_page(snap: LineSnapshot, error: str | None = None) -> str:
    rows = []
    for h in snap.hosts:
        pushed, heard = h.get("pushed_at"), h.get("last_heard")
        central_last, host_last = h.get("checkpoint"), h.get("host_checkpoint")
        behind = (host_last - central_last) if host_last is not None and central_last is not None else None
        lag = ("" if behind is None else "up to date" if behind <= 0 else f"{behind} checkpoint(s) not pushed yet")
        verified = (f"verified by the central database at every push, through #{central_last}"
                    if central_last else "nothing pushed yet")
        rows.append(f"<tr data-host=\"{escape(str(h['name']))}\"><td>{escape(str(h['name']))}</td>"
                    f"<td>{time_text(pushed)} <span class=\"muted\">{escape(duration(age(pushed, snap.at)))} "
                    f"ago</span></td><td>{escape(verified)}</td><td>{escape(lag)}</td>"
                    f"<td>{time_text(heard)} <span class=\"muted\">{escape(duration(age(heard, snap.at)))} ago</span>"
                    "</td></tr>")
    problem = f"<p class=\"error\">central database: {escape(error)}</p>" if error else ""
    body = (f"{problem}<table><thead><tr><th>host</th><th>last push</th><th>chain</th><th>push lag</th>"
            "<th>last heard (progress)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            "<p class=\"note\">The central database verifies every checkpoint and row as it is pushed and "
            "refuses what does not verify; push lag compares the newest checkpoint the host last said it had "
            "with the newest the record holds.</p>")
    return page("amdflash line: health", body)


def history_page(runs: list[dict[str, Any]], filters: dict[str, str], hosts: list[str]) -> str:
    def field_(name: str, label: str, kind: str = "text") -> str:
        return (f"<label>{label} <input type=\"{kind}\" name=\"{name}\" value=\"{escape(filters.get(name, ''))}\">"
                "</label>")

    options = "".join(f"<option{' selected' if filters.get('status') == s else ''}>{s}</option>"
                      for s in ("", "running", *ENDS))
    host_options = "".join(f"<option{' selected' if filters.get('host') == h else ''}>{escape(h)}</option>"
                           for h in ["", *hosts])
    form = (f"<form class=\"filters\" method=\"get\" action=\"history\"><label>host <select name=\"host\">"
            f"{host_options}</select></label>{field_('board', 'board')}<label>status <select name=\"status\">"
            f"{options}</select></label>{field_('part', 'image part number')}{field_('since', 'from', 'date')}"
            f"{field_('until', 'before', 'date')}<button type=\"submit\">filter</button></form>")
    rows = []
    for r in runs:
        href = run_href(r["host_id"], r["run_id"])
        run = escape(r["run_id"])
        link = f"<a class=\"mono\" href=\"{href}\">{run}</a>" if href else f"<span class=\"mono\">{run}</span>"
        rows.append(f"<tr data-run=\"{run}\" data-state=\"{escape(r['status'])}\"><td>{escape(r['host'])}</td>"
                    f"<td>{link}</td><td>{escape(str(r['command']))}</td><td>{_state(r['status'])}</td>"
                    f"<td class=\"mono\">{escape(str(r['board_spec'] or ''))}</td>"
                    f"<td class=\"mono\">{escape(str(r['unique_id'] or ''))}</td>"
                    f"<td>{escape(str(r['part'] or ''))}</td>"
                    f"<td>{escape(str(r['started'] or ''))}</td><td>{escape(str(r['updated'] or ''))}</td>"
                    f"{_witnessed(r.get('witnessed'))}</tr>")
    table = ("<table><thead><tr><th>host</th><th>run</th><th>command</th><th>status</th><th>board</th>"
             "<th>unique ID</th><th>image part</th><th>started</th><th>updated</th><th>witnesses</th></tr></thead>"
             "<tbody>" + ("".join(rows) or "<tr><td colspan=\"10\" class=\"muted\">no run matches</td></tr>")
             + "</tbody></table>")
    note = ("<p class=\"note\">Runs of the signed record (pushed and verified by the central database), newest "
            f"first; {len(runs)} shown.</p>")
    return page("amdflash line: history", form + note + table)


def _witnessed(state: tuple[int, int | None] | None) -> str:
    """A run's witness state: how many witnesses cosigned a tree head of its host's log that holds
    its receipt (of the n its host names), from the central record's mirror of the log."""
    from amdflash.store.central import witness_words

    words = witness_words(state) if state is not None else "no receipt"
    muted = "" if state is not None and state[0] else " class=\"muted\""
    return f"<td data-field=\"witnessed\"{muted}>{escape(words)}</td>"


def _banner(ok: bool, host: str, run_id: str, problem: str | None) -> str:
    if ok:
        return (f"<div class=\"banner good\" data-field=\"verification\">verified here: run {escape(run_id)} of "
                f"host {escape(host)}, copied from the central record, its chain and signatures checked again "
                "against the host's enrolled key</div>")
    return (f"<div class=\"banner bad\" data-field=\"verification\">NOT verified: run {escape(run_id)} of host "
            f"{escape(host)}: {escape(problem or 'its chain or signatures do not hold')}</div>")


def render_run(url: str, host_id: int, run_id: str) -> tuple[int, str]:
    """(HTTP status, page) of one run: its report from the central record, checked again here."""
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.engine.next_step import BARE
    from amdflash.pipeline.errors import Refusal
    from amdflash.store import central
    from amdflash.store.keys import KeyError_
    from amdflash.store.run_rows import RunUnverified, checked_on

    with central.connect(url) as pg:
        central.need_schema(pg)
        host = pg.execute(f"SELECT name, public_key FROM {central.NS}.hosts WHERE id = %s", (host_id,)).fetchone()
    if host is None:
        return 404, page("no such host", f"<p>No host #{int(host_id)} is enrolled.</p>", prefix="../../")
    name, public = str(host[0]), bytes(host[1])
    with tempfile.TemporaryDirectory(prefix="amdflash-serve-") as tmp:
        key = Path(tmp) / "host.pub"
        from amdflash.store.keys import public_line

        key.write_text(public_line(public) + "\n")
        try:
            found = central.materialize(url, f"{name}/{run_id}", Path(tmp) / "run.sqlite")
        except central.CentralError as e:
            return 404, page("run not in the record", f"<p>{escape(str(e))}: a run's page exists once its host "
                             "has pushed it (its follow service pushes after every end; the push timer every 30 s)."
                             " Its live state is on the <a href=\"../../\">line</a>.</p>", prefix="../../")
        try:
            # A run of another host: its commands name none of this server's places.
            rep, html = commands.report(found, str(Path(tmp) / "run.sqlite"), html=True, keys=[key], advice=BARE)
        except (Refusal, RunUnverified, KeyError_) as e:
            # What does not match, and where to check it: on its host, in its own trail (the
            # copy checked here is this server's temporary file, nothing a reader can open).
            said = checked_on(name, run_id, e.problem) if isinstance(e, RunUnverified) else str(e)
            return 409, page("run does not verify", _banner(False, name, run_id, said), prefix="../../")
    chain = rep.get("chain") or {}
    banner = _banner(bool(chain.get("ok")), name, run_id, chain.get("problem"))
    nav = ("<nav style=\"padding:6px 20px;background:#1d2330\"><a style=\"color:#cfe0ff\" href=\"../../\">line</a> · "
           "<a style=\"color:#cfe0ff\" href=\"../../history\">history</a></nav>")
    assert html is not None
    return 200, html.replace("<body>\n", f"<body>\n{nav}{banner}\n", 1)
