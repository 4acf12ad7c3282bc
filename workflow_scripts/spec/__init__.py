"""What a study may hold, declared once: every experiment field (:mod:`.fields`) and
every top-level setting (:mod:`.settings`), each with its schema, default and help.

The floor the host side stands on: the config loader (``study``), the records and
summary columns (``summary``), the plan, the trials and the report all read these
declarations, and nothing here imports them back (``tests/test_layout.py``).
"""
