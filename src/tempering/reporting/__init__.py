"""What a run leaves for people: step records, samples, the terminal view and the HTML report.

``metrics.py`` writes ``metrics.jsonl`` (and prints the before/after table), ``sinks.py``
sends the same records to TensorBoard, MLflow or W&B, ``samples.py`` writes
``samples.jsonl``, ``live.py`` draws the terminal view and ``html.py`` (with ``domains.py`` for
the per-domain heat-maps, ``report.js`` and ``report.css``) the page ``temper report`` writes.

Not here: computing any number (the loop, the learner, the rewards and evaluation do);
everything here reads records and writes them down.
"""
