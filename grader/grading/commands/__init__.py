"""The instructor's commands, each a thin shell over keyword-only functions: ``grade`` (a batch, or regrading
its errors), ``grade_task`` (one Slurm array task), ``verify`` (the reference solutions must earn full marks) and
``status`` (what a batch folder holds). They parse options and hand the work to :mod:`grader.grading.batch`.
"""
