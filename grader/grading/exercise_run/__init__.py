"""One exercise of one submission, graded: plan its checks (``plan``), run them in sandboxed workers on a slot
(``supervise``; ``slots`` says where), judge each reply in the grader (``judging``, against the batch's shared
float64 references in ``references``), and time its kernels in the trusted timer process (``timer_process``).
``runner`` ties these together and returns an :class:`~grader.grading.results.results.ExerciseResult`.
"""
