"""`ackscope dashboards push` against a local server that implements the Grafana HTTP API endpoints
it calls, as documented (tests/grafana_contract.py): Grafana itself cannot be installed here. The
push goes through the real command line and the real grafana-client over real HTTP."""

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from grafana_client import GrafanaApi
from grafana_client.client import GrafanaBadInputError, GrafanaClientError

from analyzer.cli import main
from dashboards.grafana.files import load
from dashboards.grafana.push import EXIT_GRAFANA_ERROR, EXIT_REJECTED, EXIT_UNREACHABLE, folder_uid, shown
from tests.grafana_contract import ContractGrafana

TOKEN = "glsa_contractTestToken_0123456789abcdef"
GENERATED = {board["uid"]: board for board in load()}


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "grafana.token"
    path.write_text(TOKEN + "\n")
    return str(path)


def push(capsys, url, *more):
    status = main(["dashboards", "push", "--url", url, *more])
    out, err = capsys.readouterr()
    assert TOKEN not in out + err, "the token must never be printed"
    return status, out, err


def dashboard_saves(state):
    return [r for r in state.requests if r.method == "POST" and r.path == "/api/dashboards/db"]


def test_first_push_creates_second_updates_in_place(capsys, token_file):
    with ContractGrafana(TOKEN) as grafana:
        status, out, err = push(capsys, grafana.url, "--token-file", token_file, "--folder", "AMQP traffic")
        assert (status, err) == (0, "")
        state = grafana.state
        assert [f["title"] for f in state.folders.values()] == ["AMQP traffic"]
        folder = next(iter(state.folders))
        assert folder == "amqp-traffic"
        assert set(state.dashboards) == set(GENERATED)
        first = {uid: (d["id"], d["version"], d["folderUid"]) for uid, d in state.dashboards.items()}
        assert all(version == 1 and in_folder == folder for _, version, in_folder in first.values())
        assert out.count("created ") == 3 and "updated " not in out

        status, out, err = push(capsys, grafana.url, "--token-file", token_file, "--folder", "AMQP traffic")
        assert (status, err) == (0, "")
        assert len(state.folders) == 1, "the folder is found again, not created twice"
        assert [r.path for r in state.requests if r.method == "POST"].count("/api/folders") == 1
        second = {uid: (d["id"], d["version"], d["folderUid"]) for uid, d in state.dashboards.items()}
        assert second == {uid: (i, v + 1, f) for uid, (i, v, f) in first.items()}, "same dashboards, next version"
        assert out.count("updated ") == 3 and "created " not in out

        for request in state.requests:
            if request.path != "/api/health":
                assert request.headers.get("Authorization") == f"Bearer {TOKEN}", request.path
        saves = dashboard_saves(state)
        assert len(saves) == 6
        for save in saves:
            assert save.body["overwrite"] is True and save.body["folderUid"] == folder
            assert save.body["dashboard"]["id"] is None
            uid = save.body["dashboard"]["uid"]
            assert {k: v for k, v in save.body["dashboard"].items() if k != "id"} == \
                {k: v for k, v in GENERATED[uid].items() if k != "id"}, "the generated JSON, unchanged"
        assert state.violations == []


def test_an_existing_folder_of_that_title_is_used(capsys, token_file):
    with ContractGrafana(TOKEN) as grafana:
        grafana.add_folder("made-by-hand", "ackscope")
        grafana.add_folder("other", "ackscope archive")
        status, out, _ = push(capsys, grafana.url, "--token-file", token_file)
        assert status == 0
        assert set(grafana.state.folders) == {"made-by-hand", "other"}
        assert {d["folderUid"] for d in grafana.state.dashboards.values()} == {"made-by-hand"}
        assert "folder uid made-by-hand" in out


def test_a_rejected_token_fails_clearly_without_printing_it(capsys, tmp_path):
    wrong = tmp_path / "wrong.token"
    wrong.write_text("glsa_notTheRightOne")
    with ContractGrafana(TOKEN) as grafana:
        status, out, err = push(capsys, grafana.url, "--token-file", str(wrong))
        assert status == EXIT_REJECTED
        assert "401" in err and "token" in err and "glsa_notTheRightOne" not in out + err
        assert grafana.state.dashboards == {} and grafana.state.folders == {}


def test_a_token_without_write_rights_fails_clearly(capsys, token_file):
    with ContractGrafana(TOKEN, can_write=False) as grafana:
        status, _, err = push(capsys, grafana.url, "--token-file", token_file)
        assert status == EXIT_REJECTED and "403" in err and "Editor" in err


def test_no_token_sends_no_credentials_and_is_told_why_it_failed(capsys):
    with ContractGrafana(TOKEN) as grafana:
        status, _, err = push(capsys, grafana.url)
        assert status == EXIT_REJECTED
        assert all("Authorization" not in r.headers for r in grafana.state.requests)


def test_an_unreachable_grafana_fails_clearly(capsys, token_file):
    with socket.socket() as probe:   # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status, _, err = push(capsys, f"http://127.0.0.1:{port}", "--token-file", token_file, "--timeout", "3")
    assert status == EXIT_UNREACHABLE
    assert f"cannot reach Grafana at http://127.0.0.1:{port}" in err


def test_a_grafana_error_is_reported_with_its_status(capsys, token_file):
    with ContractGrafana(TOKEN, fail_saves_with=500) as grafana:
        status, _, err = push(capsys, grafana.url, "--token-file", token_file)
        assert status == EXIT_GRAFANA_ERROR and "500" in err and "database is locked" in err


@pytest.mark.parametrize("content", ["", "two words\n"])
def test_a_bad_token_file_is_a_bad_argument(capsys, tmp_path, content):
    path = tmp_path / "token"
    path.write_text(content)
    status, _, err = push(capsys, "http://127.0.0.1:1", "--token-file", str(path))
    assert status == 2 and str(path) in err
    status, _, err = push(capsys, "http://127.0.0.1:1", "--token-file", str(tmp_path / "missing"))
    assert status == 2 and "No such file" in err


def test_urls_are_printed_without_credentials_and_folder_uids_are_slugs():
    assert shown("https://admin:s3cret@grafana.example:3000/grafana/?x=1") == "https://grafana.example:3000/grafana/"
    assert folder_uid("AMQP / RabbitMQ") == "amqp-rabbitmq"
    assert folder_uid("éé") is None


def test_the_stand_in_enforces_the_documented_contract():
    """The stand-in must refuse what Grafana refuses, or the push tests above prove nothing."""
    with ContractGrafana(TOKEN) as grafana:
        api = GrafanaApi.from_url(grafana.url, credential=TOKEN)
        board = {"uid": "x", "title": "X", "id": None}
        api.dashboard.update_dashboard({"dashboard": board, "overwrite": False})
        with pytest.raises(GrafanaBadInputError):   # same uid again without overwrite
            api.dashboard.update_dashboard({"dashboard": board, "overwrite": False})
        with pytest.raises(GrafanaClientError) as name_taken:
            api.dashboard.update_dashboard({"dashboard": {"uid": "y", "title": "X", "id": None}})
        assert name_taken.value.status_code == 412
        with pytest.raises(GrafanaBadInputError):
            api.dashboard.update_dashboard({"dashboard": board, "folderUid": "no-such-folder", "overwrite": True})
        with pytest.raises(GrafanaBadInputError):
            api.dashboard.update_dashboard({"board": board})
        with pytest.raises(GrafanaClientError) as uid_taken:
            api.folder.create_folder("F", uid="f")
            api.folder.create_folder("G", uid="f")
        assert uid_taken.value.status_code == 409
        assert len(grafana.state.violations) == 1


@pytest.mark.parametrize("status", [200, 404])
def test_a_url_that_is_not_grafana_fails_before_writing(capsys, token_file, status):
    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>not Grafana</html>"
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        status_code, _, err = push(capsys, f"http://127.0.0.1:{server.server_address[1]}", "--token-file", token_file)
    finally:
        server.shutdown()
        server.server_close()
    assert status_code == EXIT_GRAFANA_ERROR and "no Grafana API at" in err
