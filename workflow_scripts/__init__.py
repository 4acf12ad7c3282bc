"""Code behind the CPU training study workflow.

Modules that run inside a backend environment (``harness``, ``probe``, ``models``,
``data``, ``sysinfo``, ``metrics``, ``util``, and the ``backends`` and ``launchers``
packages) need only the standard library and torch/torchvision (the backends import
their own libraries inside their methods). Modules that run in the workflow's own
environment (``study``, ``envs``, ``images``, ``runtimes``, ``trial``,
``calibration``, ``records``, ``report``) may also use pandas, matplotlib,
jsonschema and yaml.
"""

__all__: list[str] = []
