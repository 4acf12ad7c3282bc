"""Code behind the CPU training study workflow.

Modules that run inside a backend environment (``harness``, ``models``, ``data``,
``sysinfo``, ``metrics``) need only the standard library and torch/torchvision.
Modules that run in the workflow's own environment (``study``, ``envs``,
``launch``, ``report``) may also use pandas, matplotlib, jsonschema and yaml.
"""

__all__: list[str] = []
