"""The live sidecar capture agent (`ackscope capture`): capture.py (AF_PACKET source; bpf.py compiles
its filter), decoder.py (the sans-IO core, continuously), live_state.py (the state machine, live),
metrics.py and http.py (/metrics, /healthz, /readyz), sink.py (Delta micro-batches), pcap_out.py,
run.py (the loop). See docs/agent.md."""
