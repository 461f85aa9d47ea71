"""What a student uses to hand in to the course's grading server (``grader submit``, ``grader results``): the
standard library only, shipped in the student release. The server itself is staff-side (:mod:`grader.serve`)."""
