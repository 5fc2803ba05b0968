"""The traffic lab: real client libraries against the real RabbitMQ, recorded with dumpcap.

    python -m tests.lab list
    python -m tests.lab run [NAME... | all] --out DIR

Each scenario writes DIR/NAME.pcapng (its own connections only) and DIR/NAME.expected.json,
what a correct analysis must find (the format is in expectations.py). A scenario either
records its pathology, checked on the raw frames as tshark decodes them, or fails naming what
the capture did not show, after a few attempts; its last capture is then left as
DIR/NAME.failed.pcapng, without expectations.

To compare an analysis with a recording: `capture.read_lab_capture(DIR, NAME)` returns
tshark's reading of the capture, one record per AMQP frame, and the expectations.

Modules: scenarios/ (one per scenario, plus the helpers they share), lab.py (what a run gets:
names, declarations, the recording), recording.py (dumpcap), capture.py (tshark),
timeline.py and evidence.py (what the frames show of each finding kind), expectations.py,
runner.py.
"""
