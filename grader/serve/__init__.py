"""``grader serve``: students submit during the term and get the grader's verdict.

A small web service over the grading engine (:mod:`grader.grading.commands.grade`): a roster of students with
tokens (:mod:`tokens`), a SQLite database that survives restarts (:mod:`db`), a fair queue (:mod:`queue`), worker
threads that grade one submission at a time each (:mod:`worker`, :mod:`backend`), the web pages and the JSON API
(:mod:`app`, :mod:`pages`), and the students' commands ``grader submit`` and ``grader results`` (:mod:`client`).
"""
