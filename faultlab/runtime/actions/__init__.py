"""The rank-side actions of faultlab's built-in in-rank faults (``faultlab.runtime.hooks``).

Each module is imported by a rank only when its plan or a live inject names one of its actions.
"""
