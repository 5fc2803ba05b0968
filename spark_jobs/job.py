"""The job file spark-submit runs: `spark-submit spark_jobs/job.py --lake DIR ...` takes the options of
`ackscope analyze` (the CronJob's, spark-operator's and compose's entry).

Python runs it as a script, outside its package, so it only hands its arguments to the command;
the analysis imports nothing from here.
"""

import sys

from analyzer.cli import main

if __name__ == "__main__":
    sys.exit(main(["analyze", *sys.argv[1:]]))
