"""What the Spark side needs around the reference state machine (analyzer/timeline), whose rules
live there once: the tables by name, several tables through one Arrow function, pieces of plans."""
