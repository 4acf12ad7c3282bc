"""The summary and its columns: what the report rule reads from the trials' records.

- :mod:`.results`: every column of ``summary.csv``, declared once (a ``Result`` each).
- :mod:`.records`: the records read (bounded, never raising) and flattened into one
  summary row per trial, with the noise marking.
- :mod:`.machine_results`: where another machine's results are read from (``report:
  machines:``); light on imports, since every Snakemake process computes the report
  rule's inputs.
"""
