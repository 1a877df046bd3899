"""Where things live, and the user's defaults.

The audit database path comes from here and nowhere else: `--db`, else `$AMDFLASH_DB`,
else `db` in the config file, else `audit.sqlite` in the platform's data directory
(`$XDG_DATA_HOME/amdflash`, by default `~/.local/share/amdflash`, on Linux).

The config file is TOML in the platform's config directory (`$XDG_CONFIG_HOME/amdflash/
config.toml`, by default `~/.config/amdflash/config.toml`) or `$AMDFLASH_CONFIG`. It holds
defaults that the command line overrides:

    db = "/srv/flash/audit.sqlite"
    board = ["usb:0", "usb:1"]       # or one spec as a string
    prescale = 4
    rx_mode = "chained"
    restore_each = false
    reads = 2
    progress = true
    fleet_hosts = ["hosta", "hostb"]     # the hosts `amdflash fleet` may reach (pipeline/fleet/settings.py)
    fleet_host_command = "/opt/amdflash/bin/amdflash"
    notify = ["mailto://…", "ntfy://…"]  # Apprise URLs `amdflash fleet serve` notifies (pipeline/fleet/serve/)
    witnesses = [{url = "https://w1.example/sub", key = "w1.example+1a2b3c4d+BASE64"}]   # C2SP tlog-witnesses
    witness_quorum = 1                   # cosignatures needed (default: every witness named)
    witness_timeout = 2                  # seconds a run's end waits for them (pipeline/engine/witnessing.py)
    timestamp_authorities = [{url = "https://tsa.example/", roots = "/etc/amdflash/tsa-root.pem"}]   # RFC 3161
    log_origin = "example.com/flash-line/host7"   # the transparency log's origin (pipeline/commands/transparency.py)
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from amdflash.pipeline.errors import UsageError

# platformdirs, tomllib and difflib are imported where they are used: every command line
# imports this module (main's `finally`), --version and --help included.

APP = "amdflash"
ENV_DB = "AMDFLASH_DB"
ENV_CONFIG = "AMDFLASH_CONFIG"
MAX_CONFIG_BYTES = 1 << 20   # a settings file is a few lines; anything this big is the wrong file

# key -> the types it accepts; what each key means is in the module docstring.
KEYS: dict[str, tuple[type, ...]] = {
    "db": (str,), "board": (str, list), "prescale": (int,), "rx_mode": (str,), "restore_each": (bool,),
    "reads": (int,), "progress": (bool,), "fleet_hosts": (list, str), "fleet_host_command": (str,),
    "notify": (list, str), "log_origin": (str,),
    "witnesses": (list,), "witness_quorum": (int,), "witness_timeout": (int, float), "timestamp_authorities": (list,),
}


# The values the command line's own options accept (board_cli: --prescale, --rx-mode, --reads).
RANGES: dict[str, range | tuple[str, ...]] = {"prescale": range(0, 16), "rx_mode": ("chained", "primed"),
                                               "reads": range(1, 10)}
_KIND = {int: "a whole number", str: "a string", bool: "true or false", list: "a list"}

_chosen: Path | None = None   # --config of the command line being run


def choose(path: str | Path | None) -> None:
    """Use this config file (the CLI's --config) instead of the default, for this process."""
    global _chosen
    _chosen = Path(path) if path is not None else None


def config_path() -> Path:
    import platformdirs

    return _chosen or Path(os.environ.get(ENV_CONFIG) or Path(platformdirs.user_config_dir(APP)) / "config.toml")


def data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir(APP))


def load(path: Path | None = None) -> dict[str, Any]:
    """The config file's settings ({} when there is none); UsageError if it is malformed."""
    path = path or config_path()
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):   # a FIFO would block and /dev/zero never ends
            raise UsageError(f"config file {path} is not a regular file")
        with open(path, "rb") as f:
            text = f.read(MAX_CONFIG_BYTES + 1)
            st = os.fstat(f.fileno())       # the file read, whatever is at the name by now
    except FileNotFoundError:
        if (_chosen or os.environ.get(ENV_CONFIG)) and path == config_path():   # named, so it must exist
            raise UsageError(f"config file {path} does not exist") from None
        return {}
    except OSError as e:
        raise UsageError(f"config file {path}: {e}") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise UsageError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes; is it the right file?")
    import tomllib      # only when there is a file to parse (most command lines have none)

    try:
        data = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"config file {path} is not UTF-8 text (byte {e.start}); is it the right file?") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"config file {path}: {e}") from None
    for key, value in data.items():
        if key not in KEYS:
            import difflib

            near = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f" (known: {', '.join(KEYS)})"
            raise UsageError(f"config file {path}: unknown setting {key!r}{hint}")
        if not isinstance(value, KEYS[key]) or (isinstance(value, bool) and bool not in KEYS[key]):
            raise UsageError(f"config file {path}: {key} = {value!r}: must be {_KIND[KEYS[key][0]]}")
        if key == "board" and isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise UsageError(f"config file {path}: board must be a spec or a list of specs")
        allowed = RANGES.get(key)
        if allowed is not None and value not in allowed:
            shown = (f"{allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range)
                     else " or ".join(repr(a) for a in allowed))
            raise UsageError(f"config file {path}: {key} = {value!r}: must be {shown}")
    decides = [key for key in TRUST_KEYS if key in data]
    if decides:
        _only_its_owner_writes(path, st, decides[0])
    return data


#: Settings that decide trust or place, each with what it decides: a config file naming any of
#: them is taken only if nobody but its owner and root can change it.
TRUST_KEYS = {
    "fleet_host_command": "run on every fleet host",
    "db": "where the audit trail, its backups and the key that signs it are",
    "board": "which board a command writes",
    "fleet_hosts": "which hosts the fleet trusts",
    "notify": "where the line's failures are told",
    "witnesses": "which outside parties vouch that this host's log only grew",
    "witness_quorum": "how many witnesses must vouch for it",
    "timestamp_authorities": "whose time the record's tree heads carry",
}


def _only_its_owner_writes(path: Path, st: os.stat_result, key: str) -> None:
    """A config naming what decides trust or place (TRUST_KEYS) is taken only if nobody but
    its owner and root can change it: owned by root or by this user, with no group or other
    write bit. Another user who could edit it would run their command on every host of the
    line (fleet_host_command), move the trail and so the key its runs are checked against
    (db), point a flash at another board (board), or silence the line (fleet_hosts, notify)."""
    where = f"config file {path} sets {key}, {TRUST_KEYS[key]}, but"
    if st.st_uid not in (0, os.getuid()):
        raise UsageError(f"{where} it is owned by uid {st.st_uid}, neither root nor this user (uid {os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(f"{where} others may write it (mode {stat.S_IMODE(st.st_mode):04o}); "
                         f"chmod go-w {path}")


#: Where a line host's units and jobs write its trail (pipeline/fleet/units: StateDirectory).
LINE_DB = "/var/lib/amdflash/audit.sqlite"


def default_db(settings: dict[str, Any] | None = None) -> str:
    """The audit database when --db is not given, by its real path (see audit_db)."""
    return audit_db(None, settings)


def audit_db(named: str | None = None, settings: dict[str, Any] | None = None) -> str:
    """The audit database, by its real path: `named` (--db, the API's db=), else $AMDFLASH_DB,
    else the config file's `db`, else audit.sqlite in the data directory.

    One trail has one name, however it was reached: relative paths and links are resolved
    here, once, so that the database, its anchor, its backups and the key that signs it
    (engine/auditdb.host_key_path) are found beside the same real path whether it was named
    by --db, the environment, the config file, a relative path or a link. A link to nothing
    is refused rather than followed: creating the trail wherever a dangling link points is a
    place someone else may have chosen."""
    if named:
        raw, where = named, "--db"
    elif os.environ.get(ENV_DB):
        raw, where = os.environ[ENV_DB], f"${ENV_DB}"
    else:
        configured = (settings if settings is not None else load()).get("db")
        if not configured:
            return os.path.realpath(data_dir() / "audit.sqlite")
        raw, where = configured, f"the config file's db ({config_path()})"
    return real_db(raw, where)


def real_db(raw: str, where: str = "--db") -> str:
    """`raw`, a database path given by `where`, made absolute with every link resolved; a name
    that is not UTF-8 or a link to nothing is refused (UsageError: exit 2, nothing created)."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = raw.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise UsageError(f"{where} {shown}: the name is not UTF-8 (byte {e.start}); "
                         "the audit trail's name is printed in every step it suggests: rename it") from None
    if not raw.strip():
        raise UsageError(f"{where} is empty: name the audit database's file")
    given = os.path.abspath(os.path.expanduser(raw))
    real = os.path.realpath(given)
    if os.path.islink(given) and not os.path.exists(given):
        raise UsageError(f"{where} {given} is a link to {real}, which does not exist: name {real} itself "
                         "to start a trail there")
    return real
