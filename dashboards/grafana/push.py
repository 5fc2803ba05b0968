"""`ackscope dashboards push`: the generated dashboards into a Grafana, through its HTTP API with
grafana-client. Idempotent: each dashboard is saved by its uid with overwrite, so a second push
updates the first in place (Grafana keeps the versions), and the folder is found by title before
one is created.

Endpoints used (Grafana's documented HTTP API, unchanged from Grafana 8 to 12): GET /api/health,
GET /api/search?type=dash-folder, POST /api/folders, GET /api/dashboards/uid/:uid,
POST /api/dashboards/db. The token goes in an `Authorization: Bearer` header and nowhere else: not
in a message, not in an exception."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import niquests
from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaTimeoutError

from .files import load

EXIT_UNREACHABLE = 6   # no answer: wrong URL, Grafana down, network, timeout
EXIT_REJECTED = 7      # Grafana refused the credentials (401) or their rights (403)
EXIT_GRAFANA_ERROR = 8  # Grafana answered with another error
MESSAGE = "ackscope dashboards push"


class PushError(Exception):
    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


@dataclass(frozen=True)
class Pushed:
    uid: str
    title: str
    action: str     # "created" or "updated"
    version: int
    url: str


def read_token(path: str) -> str:
    """The token in a file (a service account token), surrounding whitespace removed."""
    with open(path, encoding="utf-8") as file:
        token = file.read().strip()
    if not token:
        raise ValueError(f"the token file {path} is empty")
    if any(c.isspace() for c in token):
        raise ValueError(f"the token file {path} holds more than one word: it should hold only the token")
    return token


def shown(url: str) -> str:
    """The URL as it may be printed: without a user and password in it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def folder_uid(title: str) -> str | None:
    """A stable uid for a folder we create, so that two ackscope installs name it alike."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40]
    return slug or None


def push_dashboards(url: str, token: str | None = None, folder: str = "ackscope",
                    boards: list[dict] | None = None, timeout: float = 10.0) -> tuple[str, list[Pushed]]:
    """Pushes the dashboards (default: the generated ones) into `folder`; returns the folder's uid and
    what happened to each dashboard. Raises PushError with the exit status to use."""
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise PushError(f"--url {shown(url)!r} is not an http(s) URL of a Grafana", 2)
    api = GrafanaApi.from_url(url, credential=token, timeout=timeout)
    where = shown(url)
    with _explained(where):
        _check_health(api, where)
        folder_id = _folder(api, folder)
        pushed = [_push_one(api, board, folder_id) for board in (load() if boards is None else boards)]
    return folder_id, pushed


def _check_health(api: GrafanaApi, where: str) -> None:
    """GET /api/health answers {"database": "ok", "version": ...} without credentials on every Grafana:
    anything else means the URL is not a Grafana (or not its root), said before any write is tried."""
    try:
        health = api.client.GET("/health")
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        health = None
    if not isinstance(health, dict) or "database" not in health:
        raise PushError(f"no Grafana API at {where} (GET /api/health did not answer like Grafana): "
                        "give Grafana's root URL, with its sub-path if it is served under one", EXIT_GRAFANA_ERROR)
    if health["database"] != "ok":
        raise PushError(f"Grafana at {where} is up but not healthy (database: {health['database']})",
                        EXIT_GRAFANA_ERROR)


def _folder(api: GrafanaApi, title: str) -> str:
    found = [hit for hit in api.search.search_dashboards(query=title, type_="dash-folder")
             if hit.get("title") == title]
    # a top-level folder of that title first: with nested folders, the same title may sit deeper too
    found.sort(key=lambda hit: bool(hit.get("folderUid")))
    if found:
        return found[0]["uid"]
    return api.folder.create_folder(title, uid=folder_uid(title))["uid"]


def _push_one(api: GrafanaApi, board: dict, folder: str) -> Pushed:
    uid = board["uid"]
    try:
        api.dashboard.get_dashboard(uid)
        action = "updated"
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        action = "created"
    # id null and the uid set: Grafana saves the dashboard that has this uid, whatever its numeric id
    # is on this instance; overwrite: our JSON wins over edits made in the UI (the dashboards are
    # read-only there, and Grafana keeps every version).
    saved = api.dashboard.update_dashboard({"dashboard": {**board, "id": None}, "folderUid": folder,
                                            "overwrite": True, "message": MESSAGE})
    return Pushed(uid=saved.get("uid", uid), title=board["title"], action=action,
                  version=int(saved.get("version", 0)), url=saved.get("url", ""))


class _explained:
    """Turns what grafana-client and niquests raise into one PushError saying what to do."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, PushError):
            return False
        if isinstance(exc, (GrafanaTimeoutError, niquests.exceptions.Timeout)):
            raise PushError(f"Grafana at {self.where} did not answer in time", EXIT_UNREACHABLE) from None
        if isinstance(exc, niquests.exceptions.RequestException) or (
                isinstance(exc, GrafanaException) and not exc.status_code):
            raise PushError(f"cannot reach Grafana at {self.where} ({type(exc).__name__}): check the URL and "
                            "that Grafana is running and reachable from here", EXIT_UNREACHABLE) from None
        if isinstance(exc, GrafanaException) and exc.status_code in (401, 403):
            what = ("rejected the credentials (401): check the token in --token-file"
                    if exc.status_code == 401 else
                    "refused the request (403): the token's service account needs the Editor role, "
                    "or dashboards:write and folders:create")
            raise PushError(f"Grafana at {self.where} {what}", EXIT_REJECTED) from None
        if isinstance(exc, GrafanaException):
            raise PushError(f"Grafana at {self.where} answered {exc.status_code}: {_message(exc)}",
                            EXIT_GRAFANA_ERROR) from None
        return False


def _message(exc: GrafanaException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("message"):
        return str(response["message"])
    return str(exc)
