"""The instructor grader, in wings that import only from the wings listed before them:

* :mod:`~grader.grading.isolation` — the sandbox, worker processes, their messages, and GPU sharing;
* :mod:`~grader.grading.config` (a module) — the course file and the settings of a run;
* :mod:`~grader.grading.results` — typed results, scoring, the output folder and every report;
* :mod:`~grader.grading.exercise_run` — one exercise of one submission: plan, supervise, judge, time;
* :mod:`~grader.grading.batch` — many submissions into one output folder: the pipeline, scheduling, Slurm, resume;
* :mod:`~grader.grading.commands` — ``grader grade``, ``verify``, ``status`` and the Slurm array task.

``docs/architecture.md`` draws the whole package.
"""
