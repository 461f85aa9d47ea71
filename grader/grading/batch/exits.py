"""The exit statuses of ``grader grade`` and of ``grader grade-task`` (a Slurm array task, or one share of a split
batch), besides 0 (everything graded) and 2 (a usage error)."""

NEEDS_REGRADE = 3  # parts need a regrade: the grader failed on them
UNFINISHED = 4  # exercise runs were left ungraded (every slot failed, or the batch was cut short)
UNGRADABLE = 5  # a submission could not be read, or held no exercise module: named in the summary
