"""A term's operations as the instructor runs them (``grader serve`` subcommands) and as students and the instructor
see them in headless Chromium: an extension keeps one student's upload on time while another's is late (the
penalty policy), an override shows in the instructor's standings with its reason, a regrade supersedes a result,
a reissued token ends the old token's web session at once, and a revoked token no longer logs in."""

from __future__ import annotations

import re
import subprocess

import pytest

from . import serve_helpers as helpers

COURSE = """\
[serve]
late = "penalty"
penalty_per_day = 0.1
counts = "latest"

[serve.deadlines]
gelu = 2020-01-06T23:59:00
"""


def _cli(folder, *args: str) -> str:
    done = subprocess.run(helpers.grader_command("serve", *args, "--dir", str(folder)), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def term(tmp_path):
    folder = tmp_path / "serve-dir"
    course = tmp_path / "course.toml"
    course.write_text(COURSE)
    tokens = helpers.add_students(folder, "bob", "dave")
    running = helpers.start_server(folder, extra=["--course", str(course)])
    found = re.search(r"instructor token \(shown once; keep it private\): (\S+)", running.log.read_text())
    assert found, running.log.read_text()
    tokens["instructor"] = found.group(1)
    try:
        yield running, tokens, course
    finally:
        running.stop()


def test_the_terms_operations_show_on_the_pages(term, tmp_path):
    running, tokens, course = term
    folder = running.folder
    _cli(folder, "extend", "bob", "gelu", "2099-01-01", "--reason", "a medical note", "--course", str(course))
    browser = helpers.browser()
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def el(element_id: str):
        return helpers.element(browser, element_id)

    def text_of(element_id: str) -> str:
        return helpers.text_of(browser, element_id)

    def log_in(token: str) -> None:
        browser.delete_all_cookies()
        browser.get(running.url + "/")
        el("token").send_keys(token)
        el("login").click()

    def upload(name: str) -> None:
        el("file").send_keys(str(helpers.gelu_zip(tmp_path / f"{name}.zip")))
        el("upload").click()
        WebDriverWait(browser, 20).until(lambda b: re.search(r"/submissions/\d+$", b.current_url))
        WebDriverWait(browser, 180, poll_frequency=0.5, ignored_exceptions=(WebDriverException,)).until(
            lambda b: b.find_element(By.ID, "status").get_attribute("data-status") in ("done", "failed"))
        assert helpers.attribute_of(browser, "status", "data-status") == "done"

    try:
        # which submission counts is said to the student before they hand anything in
        log_in(tokens["bob"])
        assert "latest" in text_of("counts-rule")
        upload("bob")
        assert browser.find_elements(By.ID, "late") == []  # bob's extension: on time
        bobs_first = int(browser.current_url.rsplit("/", 1)[1])
        log_in(tokens["dave"])
        upload("dave")
        assert text_of("late") == "Handed in after the deadline of: gelu."
        _cli(folder, "override", "dave", "gelu", "5", "--reason", "partial credit by hand")
        _cli(folder, "regrade", "--student", "bob", "--reason", "a grader fix")

        log_in(tokens["instructor"])
        WebDriverWait(browser, 20).until(lambda b: b.current_url.endswith("/instructor"))
        dave = el("standings").find_element(By.XPATH, ".//tr[td[1][normalize-space()='dave']]")
        assert "partial credit by hand" in dave.find_element(By.CLASS_NAME, "overrides").text
        assert "gelu" in dave.find_element(By.CLASS_NAME, "late").text

        # the regrade: bob's first result superseded by the new one, shown on his page once graded
        log_in(tokens["bob"])
        WebDriverWait(browser, 20).until(lambda b: b.current_url.endswith("/me"))

        def superseded(b) -> bool:
            b.get(running.url + f"/submissions/{bobs_first}")
            return "superseded by #" in b.find_element(By.ID, "status").text

        WebDriverWait(browser, 180, poll_frequency=1.0, ignored_exceptions=(WebDriverException,)).until(superseded)

        # a reissued token: bob's open session ends at once, the old token is refused, the new one works
        new = _cli(folder, "roster", "reissue", "bob").strip().split("\t")[-1]
        browser.get(running.url + "/me")
        assert el("token")  # the login form: the old session no longer counts
        el("token").send_keys(tokens["bob"])
        el("login").click()
        assert "not valid" in text_of("login-error")
        log_in(new)
        WebDriverWait(browser, 20).until(lambda b: b.current_url.endswith("/me"))
        assert browser.find_elements(By.CSS_SELECTOR, "tr.submission")
        # a revoked token no longer logs in
        _cli(folder, "roster", "revoke", "dave")
        log_in(tokens["dave"])
        assert "not valid" in text_of("login-error")
    finally:
        browser.quit()
