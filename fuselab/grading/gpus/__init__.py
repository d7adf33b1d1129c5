"""Sharing the GPUs: workers per GPU (``schedule``) and a graded timing's lease of its GPU (``lease``: the grader's
side; ``fuselab/speed/lease.py`` is the timing's).
"""
