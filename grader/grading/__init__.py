"""The instructor grader: submissions, isolated workers, scoring and reports."""
