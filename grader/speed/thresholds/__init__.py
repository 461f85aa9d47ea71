"""Speed thresholds per GPU model: ``grader/speed/thresholds/<slug>.toml``, written by ``grader calibrate``.

A file holds, for every (exercise, part, benchmark), the reference solution's and the baseline's
times measured side by side on that GPU, and the speed required of a student — *relative to the
baseline measured in the same run*, so that a slower or noisier machine moves both sides:

    ratio  = baseline_ms / student_ms          (how fast the student is, in baselines)
    credit = 1                                  if ratio >= full
           = (ratio - partial) / (full - partial) if partial < ratio < full
           = 0                                  if ratio <= partial

What a file holds is :mod:`.calibrated`, the files themselves :mod:`.gpu_files`, a course's speed curve
:mod:`.speed_curves`. The format, the GPU-name-to-file mapping and how to recalibrate are in README.md next to this
file.
"""
