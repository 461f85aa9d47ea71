"""``grader serve`` as students and the instructor use it: a real server in a subprocess (SQLite, grading gelu on
the CPU through the engine), driven with ``grader submit`` / ``grader results``, the API, and the web page in
headless Chromium. A student sees only their own submissions; the instructor's routes refuse students."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import urllib.parse

import pytest

from grader.handin import client

from . import serve_helpers as helpers


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve") / "serve-dir"
    # the roster through the command an instructor types: the token is printed once
    added = subprocess.run(helpers.grader_command("serve", "roster", "add", "alice", "--name", "Alice A.", "--dir",
                                                  str(folder)), capture_output=True, text=True, timeout=120)
    assert added.returncode == 0, added.stderr
    student, alice = added.stdout.strip().split("\t")
    assert student == "alice" and len(alice) >= 40
    tokens = {"alice": alice, **helpers.add_students(folder, "bob", "carol")}
    running = helpers.start_server(folder)
    found = re.search(r"instructor token \(shown once; keep it private\): (\S+)", running.log.read_text())
    assert found, running.log.read_text()
    tokens["instructor"] = found.group(1)
    try:
        yield running, tokens
    finally:
        running.stop()


@pytest.fixture(scope="module")
def alices_submission(server, tmp_path_factory):
    """alice hands in her assignments/ folder with `grader submit --wait` and gets the report."""
    running, tokens = server
    work = tmp_path_factory.mktemp("alice")
    (work / "assignments" / "gelu").mkdir(parents=True)
    shutil.copy(helpers.GELU, work / "assignments" / "gelu" / "gelu.py")
    (work / "token").write_text(tokens["alice"] + "\n")
    done = subprocess.run(helpers.grader_command("submit", "--server", running.url, "--token-file", str(work / "token"),
                                                 "--wait", "--wait-timeout", "120", str(work / "assignments")),
                          capture_output=True, text=True, timeout=180)
    return done


def test_a_student_submits_with_the_cli_and_gets_the_report(server, alices_submission):
    running, tokens = server
    done = alices_submission
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"submitted: #(\d+) queued", done.stdout), done.stdout
    assert "# Grade report: alice" in done.stdout
    assert "| gelu | 9.26 / 9.26 | graded |" in done.stdout  # the reference solution: full correctness marks
    assert "speed is measured on a GPU only" in done.stdout  # on a CPU the report says speed is not graded here
    listed = subprocess.run(helpers.grader_command("results", "--server", running.url, "--token", tokens["alice"]),
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "speed is graded on a GPU only" in listed.stdout
    assert re.search(r"#\d+ graded: 9\.26 / 9\.26", listed.stdout), listed.stdout


def _alices_id(alices_submission) -> int:
    return int(re.search(r"submitted: #(\d+)", alices_submission.stdout).group(1))


def test_a_student_gets_403_for_another_students_submission(server, alices_submission):
    running, tokens = server
    sid = _alices_id(alices_submission)
    guessed = [f"/api/submissions/{sid}", f"/submissions/{sid}", f"/submissions/{sid}/report.md",
               f"/submissions/{sid}/report.html", f"/api/submissions/{sid}/results.json"]
    for path in guessed:
        own, body = helpers.http(running.url + path, token=tokens["alice"])
        assert own == 200, (path, body[:200])  # the owner gets it: a 403 below is about ownership, not the route
        other, body = helpers.http(running.url + path, token=tokens["bob"])
        assert other == 403, (path, other, body[:200])
        assert b"alice" not in body and b"9.26" not in body
        assert helpers.http(running.url + path)[0] == 401  # nobody logged in
    status, body = helpers.http(running.url + "/api/submissions", token=tokens["bob"])
    assert status == 200 and json.loads(body)["submissions"] == []  # bob's list holds none of alice's
    status, body = helpers.http(running.url + "/api/submissions", token=tokens["alice"])
    assert [s["id"] for s in json.loads(body)["submissions"]] == [sid]


def test_the_instructors_routes_refuse_student_tokens(server, alices_submission):
    running, tokens = server
    routes = [("GET", "/instructor"), ("GET", "/instructor/class-report"), ("GET", "/instructor/grades.csv"),
              ("GET", "/api/instructor/students"), ("GET", "/api/instructor/roster"),
              ("POST", "/api/instructor/roster")]
    for method, path in routes:
        data = b'{"student": "mallory"}' if method == "POST" else None
        assert helpers.http(running.url + path, token=tokens["alice"], method=method, data=data)[0] == 403, path
        assert helpers.http(running.url + path, method=method, data=data)[0] == 401, path
    status, body = helpers.http(running.url + "/api/instructor/students", token=tokens["instructor"])
    assert status == 200
    assert sorted(s["student"] for s in json.loads(body)["students"]) == ["alice", "bob", "carol"]  # no mallory
    status, body = helpers.http(running.url + "/instructor/grades.csv", token=tokens["instructor"])
    assert status == 200 and re.search(rb"\nalice,9\.26,9\.26,9\.26,graded", body), body
    # the instructor may see any submission, and add a student through the API (the token is given once)
    sid = _alices_id(alices_submission)
    assert helpers.http(running.url + f"/api/submissions/{sid}", token=tokens["instructor"])[0] == 200
    status, body = helpers.http(running.url + "/api/instructor/roster", token=tokens["instructor"], method="POST",
                                data=b'{"student": "dave"}', headers={"Content-Type": "application/json"})
    assert status == 201
    dave = json.loads(body)["token"]
    assert helpers.http(running.url + "/api/submissions", token=dave)[0] == 200
    assert helpers.http(running.url + f"/api/submissions/{sid}", token=dave)[0] == 403


# ------------------------------------------------------------------------------------ the web page


def test_the_web_page_logs_in_uploads_and_shows_the_report_and_leaderboard(server, alices_submission, tmp_path):
    running, tokens = server
    browser = helpers.browser()
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def el(element_id: str):
        return helpers.element(browser, element_id)

    def text_of(element_id: str) -> str:
        return helpers.text_of(browser, element_id)

    try:
        browser.get(running.url + "/")
        el("token").send_keys("not-a-token")
        el("login").click()
        assert "not valid" in text_of("login-error")
        el("token").send_keys(tokens["carol"])
        el("login").click()
        WebDriverWait(browser, 20).until(lambda b: b.current_url.endswith("/me"))
        assert "speed is not" in text_of("device-note")
        assert el("no-submissions")
        el("file").send_keys(str(helpers.gelu_zip(tmp_path / "carol.zip")))
        el("upload").click()
        WebDriverWait(browser, 20).until(lambda b: re.search(r"/submissions/\d+$", b.current_url))
        # the page refreshes itself while the submission waits and is graded (a poll may land mid-reload)
        WebDriverWait(browser, 120, poll_frequency=0.5, ignored_exceptions=(WebDriverException,)).until(
            lambda b: b.find_element(By.ID, "status").get_attribute("data-status") in ("done", "failed"))
        assert helpers.attribute_of(browser, "status", "data-status") == "done"
        assert text_of("score") == "Score: 9.26 / 9.26"
        browser.switch_to.frame(el("report"))
        assert "Grade report: carol" in browser.find_element(By.TAG_NAME, "body").text
        browser.switch_to.default_content()
        browser.get(running.url + "/leaderboard")
        assert "Speed is graded on a GPU only" in text_of("no-times")
        browser.get(running.url + "/me")
        rows = browser.find_elements(By.CSS_SELECTOR, "tr.submission")
        assert [r.get_attribute("data-status") for r in rows] == ["done"]  # carol's own, none of alice's
        # a guessed URL of alice's submission, with carol's cookie
        browser.get(running.url + f"/submissions/{_alices_id(alices_submission)}")
        assert "is not yours" in text_of("error")
        browser.get(running.url + "/me")
        el("logout").click()
        WebDriverWait(browser, 20).until(lambda b: not b.current_url.endswith("/me"))  # the logout's redirect came
        browser.get(running.url + "/me")
        assert el("token")  # logged out: the login form again
    finally:
        browser.quit()


# ------------------------------------------------------------------------------ the session cookie's locks


def _raw(url: str, method: str, path: str, *, body: bytes = b"", headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    """One request, redirects not followed: (status, headers, body)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_the_session_cookie_changes_nothing_from_another_sites_page(server):
    """A browser sends the session cookie with any site's form (SameSite=Strict still lets a sibling subdomain
    through): every request that changes state with the cookie must carry this site's own Origin. A token (which no
    browser sends by itself) needs none; forms without a file are read only when small; the message a refused upload
    leaves on the student's page is the server's own, never a link's."""
    running, tokens = server
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    own, evil = {"Origin": running.url}, {"Origin": "https://evil.example.edu"}
    login = urllib.parse.urlencode({"token": tokens["bob"]}).encode()
    for origin in (evil, {"Origin": "null"}, {}):
        assert _raw(running.url, "POST", "/login", body=login, headers={**form, **origin})[0] == 403, origin
    huge = urllib.parse.urlencode({"token": "A" * (64 << 10)}).encode()  # the parser would read any length
    assert _raw(running.url, "POST", "/login", body=huge, headers={**form, **own})[0] == 413
    status, headers, _ = _raw(running.url, "POST", "/login", body=login, headers={**form, **own})
    assert status == 303 and "httponly" in headers["set-cookie"].lower()
    cookie = {"Cookie": headers["set-cookie"].split(";")[0]}

    body, content_type = client.multipart("bob.txt", b"not a submission")
    upload = {**cookie, "Content-Type": content_type}
    for path in ("/api/submissions", "/me/upload"):
        for origin in (evil, {"Origin": "null"}, {}):
            status, _, text = _raw(running.url, "POST", path, body=body, headers={**upload, **origin})
            assert status == 403 and b"cross-site" in text, (path, origin, status)
    status, headers, _ = _raw(running.url, "POST", "/me/leaderboard", body=b"show=1&display_name=Bob",
                              headers={**cookie, **form, **evil})
    assert status == 403
    assert _raw(running.url, "POST", "/api/instructor/roster", body=b'{"student": "mallory"}',
                headers={"Authorization": f"Bearer {tokens['instructor']}", "Content-Type": "text/plain"})[0] == 415
    # from the site's own page the refused upload comes back to /me with the server's signed message
    status, headers, _ = _raw(running.url, "POST", "/me/upload", body=body, headers={**upload, **own})
    assert status == 303 and headers["location"].startswith("/me?") and "sig=" in headers["location"]
    shown = _raw(running.url, "GET", headers["location"], headers=cookie)[2].decode()
    assert 'id="upload-error"' in shown and "bob.txt" in shown
    spoofed = "/me?" + urllib.parse.urlencode({"error": "Your token expired: mail it to evil@example.edu"})
    assert "evil@example.edu" not in _raw(running.url, "GET", spoofed, headers=cookie)[2].decode()
    status, text = helpers.http(running.url + "/api/submissions", token=tokens["bob"])
    assert status == 200 and json.loads(text)["submissions"] == []  # nothing was handed in as bob
