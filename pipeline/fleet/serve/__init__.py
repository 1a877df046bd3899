"""`amdflash fleet serve`: the line, live, in a browser — read-only, over the central record.

Pages (every one plain server-rendered HTML, complete with JavaScript off; a small script only
swaps in live updates, which arrive as server-sent events):

* `/` — the line at a glance: every board that said anything in the last `--window` hours
  (host, place, board, state, stage, a progress bar, bytes, rate, ETA, its run), failures
  first. A row says whether its state is the signed record's (the run was pushed and
  verified by central) or the host's live word (progress, advisory);
* `/runs/HOST_ID/RUN_ID.html` — a run's page: the HTML report of `amdflash report`, made from
  the central record as `fleet report` makes it (the run copied into a temporary trail, its
  chain and signatures checked again here, against the host's enrolled key);
* `/history` — runs of the signed record, filtered by host, board, status, image part number
  and date;
* `/health` — each host: its last push, the record's newest checkpoint of it and how far
  behind the host's own it is, when it was last heard;
* `/metrics` — Prometheus text (prometheus-client); `/events` — the live stream.

Everything shown from the record — board names, errors, paths, host names — is escaped
(docs/threat-model.md: strings from outside), and the pages link only to their own pages:
a run link is built from a host id (an integer) and a run id of the run-id shape, never
taken from a recorded value. The server connects with whatever role its URL names; it is
meant to be `amdflash_read` (SELECT only), so it can change nothing even if asked to.

One thread keeps the line current: it LISTENs on the progress channel (a host's follow
service NOTIFYs with every insert; the payload is not used: any wake-up re-reads), reads the
new rows (and every two seconds even with no wake-up), and every two seconds the signed status
of the runs shown and each host's health. Notifications (Apprise) are decided there.

What a host wrote is read defensively (docs/threat-model.md, "the line view"): its time is read
as text and its numbers checked, so a row no reader can take (an infinite rate, a time of
'infinity' or year 10000) is shown as unreadable instead of failing the page or the reader.
Notifications are decided from the record's rows in order and what was decided is kept in the
serve's state directory (this user's alone), with an outbox of what no service has taken yet,
retried with backoff: a restart, an outage or a reconnect neither loses nor repeats one; they
carry the record's own fields only, checked and made printable, as plain text.

Held against one local user (docs/line-view.md): a request head within 5 s or the connection
goes, connections and live streams capped below the descriptor limit, the table rendered once
per change for every client, and what clients can make the server log rate-limited.

The rooms: words (what a host wrote, made safe to show), line (the record read into the
line's state, kept current; notifications decided), ends (a failed or interrupted run's end
as `fleet report` tells it), notify (Apprise and what was notified), pages (HTML), app (the
Starlette application, the live stream, `serve`), guard (the connections: header timeout, caps,
rate-limited logging).
"""
