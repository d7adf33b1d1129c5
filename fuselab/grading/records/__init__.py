"""The class's records: the submissions read in (``intake``), the class list (``roster``), the term's course folder
(``term``), a graded submission (``results``), hand grading read back (``handgrading``), nbgrader's course,
gradebook and export (``nbgrader_run``), the reference runs kept for the term (``reference_cache``), and how each
record file is written (``whole``).
"""
