"""A team's fault package for faultlab: ``optimizer_exception``, an in-rank fault.

``faults`` is faultlab's side (the declaration, its parameters); ``actions`` is the rank's side
(what it does inside the rank, on faultlab's hooks API). The rank imports ``actions`` only, and
only when a plan names it; nothing here imports the other half.
"""
