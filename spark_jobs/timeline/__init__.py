"""What the Spark side needs around the reference state machine (analyzer/timeline): the timeline
tables by name (tables.py), several tables through one Arrow function (wide.py), connections
carried from run to run (carried.py), and how steps are executed (plans.py).

The rules themselves live once, in analyzer/timeline; spark_jobs/connection_pass.py runs them over
every connection analysed whole.
"""
