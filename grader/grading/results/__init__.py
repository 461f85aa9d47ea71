"""What grading produces and how it is read: the typed results (``results``), points and speed credit turned
into scores (``scoring``), the output folder's layout (``store``), each student's reports and the gradebook
(``reports``), the class report (``class_report``), and rebuilding every report from stored results
(``rebuild``).
"""
