"""Analysis: figures and findings from recorded ranges (statistics, verdict, advice).

Pure functions of the data, live or read back from a trace; no printing
(the wording of the summary lives in :mod:`..report`).
"""
