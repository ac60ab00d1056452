"""How a run's launches and in-process rollbacks took over from each other: restarts, superseded steps.

    restarts.py   how far each launch got and how the next took over: restarts, kills, overlaps
    rollbacks.py  steps that went back within an attempt: in-process restarts, superseded.parquet, their wasted time
"""
