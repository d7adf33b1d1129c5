"""What a run writes for people: feedback pages (``feedback``), grades.csv and the class report (``report``), the LMS's
import files (``export``), formgrader for hand grading (``formgrader``), a submission's text as a terminal shows it
(``terminal``).
"""
