"""A stand-in for Grafana's HTTP API, for the endpoints `ackscope dashboards push` calls, written from
Grafana's HTTP API documentation (Folder API, Dashboard API, Search API, Other: health), because
Grafana itself cannot be installed on these machines (not in Debian, PyPI or npm).

It keeps folders and dashboards in memory and answers as the documentation says, including its
errors: 401 without a valid token, 403 for a token without write rights, 400 for a body that breaks
the documented request contract (and records why, so a test can fail on it), 404 for an unknown uid,
409 for a folder uid taken, 412 name-exists / a 400 same-uid error when saving without overwrite.
What it cannot tell: anything Grafana does beyond these documented answers (rendering, schema
migration of the dashboard JSON, permissions within folders)."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

UID = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: dict
    body: object


@dataclass
class GrafanaState:
    token: str
    can_write: bool = True                  # False: a Viewer's token (403 on writes)
    fail_saves_with: int | None = None      # answer POST /api/dashboards/db with this status
    folders: dict = field(default_factory=dict)      # uid -> {"id", "uid", "title"}
    dashboards: dict = field(default_factory=dict)   # uid -> {"id", "version", "folderUid", "dashboard"}
    requests: list = field(default_factory=list)
    violations: list = field(default_factory=list)   # requests that broke the documented contract
    next_id: int = 1

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


class _Handler(BaseHTTPRequestHandler):
    state: GrafanaState   # set per server class

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def _handle(self, method: str):
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        request = Request(method, parts.path, parse_qs(parts.query), dict(self.headers), body)
        with self.server.lock:
            self.state.requests.append(request)
            status, answer = self._route(request)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, r: Request):
        if r.method == "GET" and r.path == "/api/health":   # documented as needing no authentication
            return 200, {"commit": "contract", "database": "ok", "version": "12.0.0"}
        if r.headers.get("Authorization") != f"Bearer {self.state.token}":
            return 401, {"message": "Unauthorized"} if "Authorization" not in r.headers else {"message": "invalid API key"}
        if r.method == "GET" and r.path == "/api/search":
            return self._search(r)
        if r.method == "POST" and r.path == "/api/folders":
            return self._create_folder(r)
        if r.method == "GET" and r.path.startswith("/api/dashboards/uid/"):
            return self._get_dashboard(r.path.rsplit("/", 1)[1])
        if r.method == "POST" and r.path == "/api/dashboards/db":
            return self._save_dashboard(r)
        return 404, {"message": "Not found"}

    def _violation(self, r: Request, why: str):
        self.state.violations.append(f"{r.method} {r.path}: {why}")
        return 400, {"message": why}

    def _search(self, r: Request):
        query = r.query.get("query", [""])[0].lower()
        kind = r.query.get("type", [None])[0]
        if kind not in (None, "dash-folder", "dash-db"):
            return self._violation(r, f"type must be dash-folder or dash-db, not {kind}")
        hits = []
        if kind in (None, "dash-folder"):
            hits += [{"id": f["id"], "uid": f["uid"], "title": f["title"], "type": "dash-folder",
                      "url": f"/dashboards/f/{f['uid']}/{slug(f['title'])}", "tags": [], "isStarred": False}
                     for f in self.state.folders.values() if query in f["title"].lower()]
        if kind in (None, "dash-db"):
            hits += [{"id": d["id"], "uid": uid, "title": d["dashboard"]["title"], "type": "dash-db",
                      "folderUid": d["folderUid"], "tags": d["dashboard"].get("tags", []), "isStarred": False}
                     for uid, d in self.state.dashboards.items() if query in d["dashboard"]["title"].lower()]
        return 200, hits

    def _create_folder(self, r: Request):
        if not self.state.can_write:
            return 403, {"message": "Access denied"}
        body = r.body
        if not isinstance(body, dict) or not isinstance(body.get("title"), str) or not body["title"].strip():
            return self._violation(r, "a folder needs a title")
        if set(body) - {"uid", "title", "parentUid", "description"}:
            return self._violation(r, f"unknown folder fields {sorted(set(body) - {'uid', 'title', 'parentUid'})}")
        uid = body.get("uid") or f"generated{self.state.next_id}"
        if not UID.match(uid):
            return self._violation(r, f"folder uid {uid!r}: at most 40 of [a-zA-Z0-9_-]")
        if uid in self.state.folders:
            return 409, {"message": "a folder with the same uid already exists"}
        if any(f["title"] == body["title"] for f in self.state.folders.values()):
            return 409, {"message": "a folder with the same name already exists"}
        folder = {"id": self.state.new_id(), "uid": uid, "title": body["title"]}
        self.state.folders[uid] = folder
        return 200, {**folder, "url": f"/dashboards/f/{uid}/{slug(folder['title'])}", "version": 1,
                     "hasAcl": False, "canSave": True, "canEdit": True, "canAdmin": True}

    def _get_dashboard(self, uid: str):
        stored = self.state.dashboards.get(uid)
        if stored is None:
            return 404, {"message": "Dashboard not found"}
        return 200, {"dashboard": {**stored["dashboard"], "id": stored["id"], "uid": uid, "version": stored["version"]},
                     "meta": {"folderUid": stored["folderUid"], "slug": slug(stored["dashboard"]["title"]),
                              "version": stored["version"], "canSave": True}}

    def _save_dashboard(self, r: Request):
        if not self.state.can_write:
            return 403, {"message": "Access denied"}
        if self.state.fail_saves_with:
            return self.state.fail_saves_with, {"message": "database is locked"}
        body = r.body
        if not isinstance(body, dict) or not isinstance(body.get("dashboard"), dict):
            return self._violation(r, "the body must be an object with a dashboard object")
        if set(body) - {"dashboard", "folderUid", "folderId", "overwrite", "message"}:
            return self._violation(r, f"unknown fields {sorted(set(body) - {'dashboard', 'folderUid', 'overwrite', 'message'})}")
        if "folderId" in body and "folderUid" in body:
            return self._violation(r, "define folderUid or folderId, not both")
        if not isinstance(body.get("overwrite", False), bool) or not isinstance(body.get("message", ""), str):
            return self._violation(r, "overwrite is a boolean and message a string")
        board = body["dashboard"]
        if not isinstance(board.get("title"), str) or not board["title"].strip():
            return self._violation(r, "a dashboard needs a title")
        uid = board.get("uid")
        if not isinstance(uid, str) or not UID.match(uid):
            return self._violation(r, f"dashboard uid {uid!r}: at most 40 of [a-zA-Z0-9_-]")
        folder = body.get("folderUid")
        if folder is not None and folder not in self.state.folders:
            return 400, {"message": "folder not found", "status": "not-found"}
        existing = self.state.dashboards.get(uid)
        overwrite = body.get("overwrite", False)
        if board.get("id") is not None and (existing is None or existing["id"] != board["id"]):
            return 404, {"message": "Dashboard not found", "status": "not-found"}
        same_title = [u for u, d in self.state.dashboards.items()
                      if u != uid and d["folderUid"] == folder and d["dashboard"]["title"] == board["title"]]
        if same_title and not overwrite:
            return 412, {"message": "A dashboard with the same name in the folder already exists", "status": "name-exists"}
        if existing is not None and not overwrite:
            if board.get("id") is None:
                return 400, {"message": "A dashboard with the same uid already exists"}
            if board.get("version") != existing["version"]:
                return 412, {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"}
        version = existing["version"] + 1 if existing else 1
        dashboard_id = existing["id"] if existing else self.state.new_id()
        stored = {k: v for k, v in board.items() if k not in ("id", "version")}
        self.state.dashboards[uid] = {"id": dashboard_id, "version": version, "folderUid": folder, "dashboard": stored}
        return 200, {"id": dashboard_id, "uid": uid, "url": f"/d/{uid}/{slug(board['title'])}", "status": "success",
                     "version": version, "slug": slug(board["title"]), "folderUid": folder}


class ContractGrafana:
    """`with ContractGrafana(token) as grafana:` serves on a free loopback port; grafana.url, .state."""

    def __init__(self, token: str, **options):
        self.state = GrafanaState(token=token, **options)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "ContractGrafana":
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def add_folder(self, uid: str, title: str) -> None:
        self.state.folders[uid] = {"id": self.state.new_id(), "uid": uid, "title": title}
