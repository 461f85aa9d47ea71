"""A batch: many submissions graded into one output folder. :mod:`~grader.grading.batch.pipeline` is the
sequence every batch goes through (unpack submissions, plan the exercise runs, run them on slots, record and
report); around it, the parts it uses: reading submissions (``submission``), choosing slots (``gpus``), the order
of work and the slot pool (``scheduler``), Slurm arrays (``slurm``), committing results as they come
(``recorder``), per-run markers and resuming a stopped batch (``markers``, ``resume``), and the terminal's
progress (``progress``).
"""
