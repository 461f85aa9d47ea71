"""Where student code runs and how the grader talks to it: the bubblewrap sandbox (``bwrap``), starting and
stopping processes with limits (``processes``; ``reaper`` finds what they leave behind), the typed messages and
the pipes between grader and worker (``protocol``, ``channel``), the worker's own main loop (``worker``, the
only module here that runs inside the sandbox), and the arbiter through which every process on one GPU shares it
(``gpu_arbiter``). Nothing here knows about scores or batches.
"""
